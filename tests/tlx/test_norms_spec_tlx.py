"""Tests of the Inductor-codegen options of ``kernels_tlx.norms`` (issue 13 v3; TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_norms_spec_tlx.py``): ``SPECIALIZE`` (M, N compile-time constants,
predicates only where the shape does not divide the tile, int32 offsets when they fit), ``STATS=False`` (y only) and
``CONST_EPS`` (eps compiled in), on the plain kernel (``_norm_rows_spec_kernel``; the unspecialized kernel is unchanged).

1. Interpreter (``TRITON_INTERPRET=1``: the plain kernel uses no TLX op, so fbtriton's interpreter runs it on CPU
   tensors, fp32/fp16, with and without affine): the specialized kernel's y and statistics are bit-identical to the
   unspecialized kernel's, on shapes that divide the tile (mask-free) and shapes that do not (masked), and pass the
   fp32 reference; ``STATS=False`` allocates and returns no statistics.
2. Compile-only for sm_90: at the benchmark shapes no predicated global load/store, no statistics store with
   ``STATS=False``, fewer PTX instructions than the plain kernel, no spills; ragged shapes keep their predicates;
   every TLX YAML entry with the new options compiles.
3. Validation: the options are bools, plain kernel only (a cluster config with them raises ValueError).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx.norms import TilingConfig, spec_params  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import norms as T
from kernels_tlx import norms as kn

EPS = 1e-5
OPTS = [("spec", {"SPECIALIZE": True}), ("spec-nostats-eps", {"SPECIALIZE": True, "STATS": False, "CONST_EPS": True}),
        ("nostats", {"STATS": False}), ("eps", {"CONST_EPS": True})]
BASES = [("even-512", 8, 512, {"ROWS": 4, "num_warps": 4}), ("even-1024", 4, 1024, {"ROWS": 2, "num_warps": 1}),
         ("tailM", 9, 512, {"ROWS": 4, "num_warps": 4}), ("oddN", 6, 1000, {"ROWS": 2, "num_warps": 2})]
rows = []
for dtype in ("fp32", "fp16"):
    for blabel, M, N, base in BASES:
        for affine in (False, True):
            inp = T.make_inputs(M, N, dtype=dtype, affine=affine, seed=M + N, mean_shift=3.0)
            for op, variant in (("rms_norm", "rmsnorm"), ("layer_norm", "layernorm")):
                def call(cfg):
                    y, mean, rstd = kn._launch(op, inp["x"], inp["weight"], inp["bias"], EPS,
                                               kn.TilingConfig.from_dict(cfg), need_cuda=False)[:3]
                    return tuple(t for t in (y, mean, rstd) if t is not None)
                plain = call(base)
                for olabel, opts in OPTS:
                    cfg = {**base, **opts}
                    out = call(cfg)
                    r = T.check("norm", out, inp, EPS, variant=variant)
                    n_out = 1 if opts.get("STATS") is False else (2 if variant == "rmsnorm" else 3)
                    rows.append(dict(base=blabel, opts=olabel, dtype=dtype, affine=affine, variant=variant,
                                     ok=bool(r["ok"]), n_out=len(out), want_n_out=n_out,
                                     same_y=bool(torch.equal(out[0], plain[0])),
                                     same_stats=all(bool(torch.equal(a, b)) for a, b in zip(out[1:], plain[1:])),
                                     **kn.spec_params(M, N, cfg)))
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1"})


def test_interpreter_spec_identical_and_correct(interp):
    assert len(interp) == 2 * 4 * 2 * 2 * 4
    bad = [r for r in interp if not (r["ok"] and r["same_y"] and r["same_stats"] and r["n_out"] == r["want_n_out"])]
    assert not bad, json.dumps(bad[:10], indent=1)
    by = {r["base"]: r for r in interp if r["opts"] == "spec"}
    assert by["even-512"]["EVEN_M"] and by["even-512"]["EVEN_N"] and not by["even-512"]["IDX64"]
    assert not by["tailM"]["EVEN_M"] and by["tailM"]["EVEN_N"]
    assert by["oddN"]["EVEN_M"] and not by["oddN"]["EVEN_N"]
    assert all(r["IDX64"] and not r["EVEN_M"] for r in interp if r["opts"] in ("nostats", "eps"))


_COMPILE_SCRIPT = r"""
import json, torch, yaml
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import norms
from normfuse.codestats import ptxas_info

def count(ptx):
    body = ptx[ptx.index("{", ptx.index(".entry")):].split(".section", 1)[0]
    ins = [l.strip() for l in body.splitlines() if l.strip().endswith(";") and not l.strip().startswith((".", "//"))]
    g = [l for l in ins if "ld.global" in l or "st.global" in l]
    return dict(instr=len(ins), pred_ldst=sum(l.startswith("@") for l in g), st=sum("st.global" in l for l in g),
                st16=sum("st.global" in l and ".v4." in l for l in g), ld=sum("ld.global" in l for l in g),
                ld16=sum("ld.global" in l and ".v4." in l for l in g))

PLAIN = {"ROWS": 4, "num_warps": 4}
SPEC = {**PLAIN, "SPECIALIZE": True, "STATS": False, "CONST_EPS": True}
out = []
for op in norms.OPS:
    for M, N in ((4096, 512), (4096, 1024), (262144, 1024), (37, 1000)):
        for label, cfg in (("plain", PLAIN), ("spec", SPEC)):
            ck = norms._launch(op, torch.empty(M, N, dtype=torch.bfloat16), None, None, 1e-6,
                               norms.TilingConfig.from_dict(cfg), need_cuda=False, compile_only=True)[3]
            out.append(dict(op=op, M=M, N=N, label=label, **count(ck.asm["ptx"]), **ptxas_info(ck.asm["ptx"])))
entries = [e for e in yaml.safe_load(open("configs/tiling/norms_h200.yaml"))["tlx"] if "SPECIALIZE" in e]
yaml_rows = []
for e in entries:
    cfg = {k: v for k, v in e.items() if k != "name"}
    for N in (512, 1024):
        r = norms.compile_sm90("layer_norm", torch.empty(262144, N, dtype=torch.bfloat16), config=cfg, affine=True)
        yaml_rows.append(dict(name=e["name"], N=N, smem_ok=r["smem_ok"], spills=r["ptxas"]["spill_stores"]))
print(json.dumps(dict(cases=out, yaml=yaml_rows)))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(_COMPILE_SCRIPT)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_compile_spec_ptx(compiled, op):
    case = {(r["M"], r["N"], r["label"]): r for r in compiled["cases"] if r["op"] == op}
    for M, N in ((4096, 512), (4096, 1024), (262144, 1024)):
        plain, spec = case[(M, N, "plain")], case[(M, N, "spec")]
        assert plain["pred_ldst"] > 0 and spec["pred_ldst"] == 0, (plain, spec)
        assert spec["ld"] == spec["ld16"] > 0 and spec["st"] == spec["st16"] > 0, spec  # y only, 16-byte
        assert plain["st"] == plain["st16"] + (1 if op == "rms_norm" else 2), plain  # + rstd (and mean) stores
        assert spec["instr"] < plain["instr"] and spec["spill_stores"] == 0, (spec, plain)
    ragged = case[(37, 1000, "spec")]
    assert ragged["pred_ldst"] > 0, ragged  # masks kept where the shape does not divide the tile


def test_compile_yaml_entries(compiled):
    names = {r["name"] for r in compiled["yaml"]}
    assert {"rows4_w4_spec", "rows2_w1_spec"} <= names
    assert all(r["smem_ok"] and r["spills"] == 0 for r in compiled["yaml"]), compiled["yaml"]


def test_config_validation_spec_options():
    c = TilingConfig()
    assert not c.SPECIALIZE and c.STATS and not c.CONST_EPS
    for bad in ({"SPECIALIZE": 1}, {"STATS": "no"}, {"CONST_EPS": None}, {"CLUSTER_SIZE": 2, "SPECIALIZE": True},
                {"CLUSTER_SIZE": 4, "STATS": False}, {"CLUSTER_SIZE": 2, "CONST_EPS": True}):
        with pytest.raises(ValueError):
            TilingConfig.from_dict(bad)
    c = TilingConfig.from_dict({"ROWS": 4, "num_warps": 4, "SPECIALIZE": True, "STATS": False, "CONST_EPS": True})
    assert TilingConfig.from_dict(c.to_dict()) == c
    assert spec_params(4096, 512, c) == dict(EVEN_M=True, EVEN_N=True, IDX64=False)
    assert spec_params(4097, 1000, c) == dict(EVEN_M=False, EVEN_N=False, IDX64=False)
    assert spec_params(262144, 16384, {"SPECIALIZE": True, "num_warps": 16})["IDX64"]  # 2^32 elements
    assert spec_params(4096, 512, {"ROWS": 4, "num_warps": 4}) == dict(EVEN_M=False, EVEN_N=False, IDX64=True)
