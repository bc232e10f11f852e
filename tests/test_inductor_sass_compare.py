"""``tools/inductor_sass_compare``: Inductor's captured norm kernels against ours in sm_90a SASS, compile-only on the
CPU.

1. One cell end to end (RMSNorm 262144 x 1024, in a subprocess: the compile-only driver is process-wide): Inductor's
   captured kernel and our ``per-w1-spec`` / ``per-w1-spec-eps`` / ``per-w1-spec-eps-lean`` compile, the Inductor compile reproduces the
   the norms page's PTX count (184), the SASS has instructions and 16-byte LDG / STG entries, ``per-w1-spec-eps`` is
   identical to Inductor's SASS, ``-lean`` also in its parameter layout (``same_cubin``), ``per-w1-spec`` (runtime
   eps: one ``LDC``) is found different, and the report
   renders its tables.
2. The SASS parser's control-word decoding, the loads-in-flight count, access widths and occupancy on fixed text.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from normfuse.testing import run_python_json  # noqa: E402
from tools import inductor_sass_compare as isc  # noqa: E402

_CELL_SCRIPT = r"""
import json
from tools import inductor_sass_compare as isc

c = isc.compare_cell("rms_norm", 1024)
md = isc.render_markdown([c], "test")
out = dict(kernels=[dict(label=k["label"], regs=k["stats"]["regs"], sass_instr=k["stats"]["sass_instr"],
                         body=k["sass_instr_body"], ptx=k["ptx"]["ptx_instr"], ops=k["ops"], ldg=k["mem"]["LDG"],
                         stg=k["mem"]["STG"], in_flight=k["ldg_in_flight"], launch=k["launch"],
                         occ=k["occupancy"], params=k["cubin_attrs"].get("KPARAM_INFO"))
                    for k in c["kernels"]],
           diffs={l: dict(same_code=d["same_code"], same_opcodes=d["same_opcodes"], same_cubin=d["same_cubin"],
                          delta=d["opcode_delta"],
                          udiff=d["udiff"]) for l, d in c["diffs"].items()},
           md="LDG.E.128" in md and "## Verdict" in md and "identical" in md)
print(json.dumps(out))
"""


def test_compare_cell_rms_1024():
    r = run_python_json(_CELL_SCRIPT, timeout=600)
    by = {k["label"]: k for k in r["kernels"]}
    assert list(by) == ["inductor", "per-w1-spec", "per-w1-spec-eps", "per-w1-spec-eps-lean"]
    for k in by.values():
        assert k["regs"] > 0 and k["sass_instr"] > 0 and k["body"] > 0, k
        # one warp, one row of 1024 bf16 per program: 4 x 16-byte loads and stores per thread, all in flight
        assert k["ops"].get("LDG.E.128") == 4 and k["ldg"] == {"n": 4, "bytes": 64, "widths": {"16": 4},
                                                                "predicated": 0}, k
        assert k["stg"]["n"] == 4 and k["stg"]["bytes"] == 64 and k["in_flight"] == 4, k
        assert k["launch"]["rows"] == 1 and k["launch"]["warps"] == 1 and k["launch"]["programs"] == 262144, k
    ind = by["inductor"]
    assert ind["ptx"] == 184  # docs/results/norms.md: Inductor's PTX instruction count at RMS 262144 x 1024
    assert by["per-w1-spec-eps"]["ptx"] == 184 and by["per-w1-spec"]["ptx"] == 185
    assert int(ind["params"]) < int(by["per-w1-spec-eps"]["params"])  # x, y, xnumel, r0_numel + 2 scratch
    assert r["diffs"]["per-w1-spec-eps"]["same_code"] and r["diffs"]["per-w1-spec-eps"]["udiff"] == []
    # LEAN_ARGS drops the unused arguments: Inductor's parameter block, so the whole cubin matches (not without it)
    assert r["diffs"]["per-w1-spec-eps-lean"]["same_cubin"] and not r["diffs"]["per-w1-spec-eps"]["same_cubin"]
    assert by["per-w1-spec-eps-lean"]["params"] == ind["params"]
    # the runtime eps is a constant-bank load where Inductor folds the immediate: the comparison must see it
    spec = r["diffs"]["per-w1-spec"]
    assert not spec["same_code"] and not spec["same_opcodes"] and spec["delta"].get("LDC") == 1, spec
    assert any(line.startswith("+LDC") for line in spec["udiff"]), spec["udiff"]
    assert r["md"]


# cuobjdump's layout: instruction, then the upper 64 bits on the next line (control word = bits 105-127)
_SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                           /* 0x00000a00ff017b82 */
                                                                                    /* 0x000fe20000000800 */
        /*00b0*/                   LDG.E.128 R20, desc[UR4][R20.64] ;               /* 0x0000000414147981 */
                                                                                    /* 0x000ea2000c1e1d00 */
        /*0110*/                   LDG.E.128 R12, desc[UR4][R2.64+0x200] ;          /* 0x00020004020c7981 */
                                                                                    /* 0x000ee8000c1e1d00 */
        /*00a0*/                   IMAD.WIDE R20, R19, 0x2, R20 ;                   /* 0x0000000213147825 */
                                                                                    /* 0x002fcc00078e0214 */
        /*0120*/               @P0 STG.E.U16 desc[UR4][R2.64], R4 ;                 /* 0x0000000402007986 */
                                                                                    /* 0x004fe2000c101504 */
        /*0bf0*/                   EXIT ;                                           /* 0x000000000000794d */
                                                                                    /* 0x000fea0003800000 */
"""


def test_parse_sass_control_words():
    ins = isc.parse_sass(_SASS)
    assert [x["op"] for x in ins] == ["LDC", "LDG.E.128", "LDG.E.128", "IMAD.WIDE", "STG.E.U16", "EXIT"]
    ldc, ldg = ins[0], ins[1]
    assert (ldc["stall"], ldc["wbar"], ldc["rbar"], ldc["wait"]) == (1, 7, 7, 0)  # no scoreboard
    assert (ldg["stall"], ldg["wbar"], ldg["rbar"]) == (1, 2, 7)  # the load sets scoreboard 2
    assert ins[2]["wbar"] == 3 and ins[3]["wait"] == 0b10 and ins[4]["wait"] == 0b100  # waits on SB1, then SB2
    assert ins[4]["pred"] == "@P0" and isc.norm_opcode_line(ins[4]) == "@P STG.E.U16"
    assert isc.loads_in_flight(ins) == 2  # both loads issued before the first wait on SB2
    assert [isc.access_width(o) for o in ("LDG.E.128", "LDG.E.64", "LDG.E", "STG.E.U16", "LDG.E.EF.128")] == \
        [16, 8, 4, 2, 16]


def test_occupancy_limits():
    assert isc.occupancy(51, 1, 0) == {"ctas_sm": 32, "warps_sm": 32, "limit": "ctas"}  # 32 CTAs/SM bind 1-warp CTAs
    assert isc.occupancy(32, 4, 0)["warps_sm"] == 64
    assert isc.occupancy(128, 4, 0) == {"ctas_sm": 4, "warps_sm": 16, "limit": "regs"}
