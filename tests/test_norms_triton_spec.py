"""Tests of the Inductor-codegen options of ``kernels_triton.norms`` (issue 13 v2): ``SPECIALIZE`` (M, N as
compile-time constants, mask-free tiles when the shape divides them, int32 offsets when they fit), ``EVICT`` (the
L2 eviction hint of the last read of x) and ``STATS`` (False: y only, as the torch.compile baseline).

1. Interpreter (``TRITON_INTERPRET=1``, fp32/fp16, with and without affine): every option combination on shapes that
   divide the tile (mask-free path) and shapes that do not (masked path kept), whole-row, looped (with and without a
   tail chunk), re-read and persistent kernels; y and the statistics against the fp32 reference; specialized output
   bit-identical to the unspecialized kernel's (same arithmetic); ``STATS=False`` returns ``(y,)``.
2. Compile-only for sm_90: at Inductor's shapes the specialized kernels have no predicated global loads/stores, no
   ``createpolicy`` with ``EVICT=none``, only 16-byte accesses of x / y, no statistics store with ``STATS=False``, and
   fewer PTX instructions than the unspecialized kernel; every YAML entry using the new options compiles.
3. Config validation and ``launch_params`` rules of the new fields.

v3 options: ``CONST_EPS`` (eps compiled in: bit-identical, exactly one PTX instruction less, Inductor's count),
``MAXNREG`` (``.maxnreg`` in the PTX, ptxas keeps to it) and ``LN_STATS="shifted"`` (one-pass shifted sums in the
looped LayerNorm: correct against the reference also for rows shifted by 1000 standard deviations, 32 registers at
262144 x 32768 where the two-pass re-read kernel needs more, i.e. two 1024-thread programs per SM).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_triton.norms import TilingConfig, launch_params  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import norms as T
from kernels_triton import norms as kn

kn._DEFAULT_NUM_SMS = 1
EPS = 1e-5
OPTS = [  # (label, options added to the base config)
    ("spec", {"SPECIALIZE": True}),
    ("spec-nostats-noevict", {"SPECIALIZE": True, "STATS": False, "EVICT": "none"}),
    ("evict-last", {"EVICT": "last"}),
    ("nostats", {"STATS": False}),
    ("spec-eps", {"SPECIALIZE": True, "CONST_EPS": True, "STATS": False}),
    ("eps-maxnreg", {"CONST_EPS": True, "MAXNREG": 32}),  # the interpreter ignores maxnreg
    ("lean", {"LEAN_ARGS": True}),  # None for what the kernel never reads (w / b without affine, n_tiles)
    ("spec-eps-lean", {"SPECIALIZE": True, "CONST_EPS": True, "STATS": False, "LEAN_ARGS": True}),
]
SHIFT_OPTS = [("shifted", {"LN_STATS": "shifted"}),
              ("spec-shifted", {"LN_STATS": "shifted", "SPECIALIZE": True, "CONST_EPS": True})]
BASES = [  # (label, M, N, base config): mask-free and masked shapes of each kernel
    ("row-even", 64, 512, {"TILE_BYTES": 2048, "num_warps": 1}),
    ("row-even-1024", 8, 1024, {"ROWS": 4, "num_warps": 4}),
    ("row-tailM", 37, 512, {"ROWS": 4}),
    ("row-oddN", 9, 1000, {}),
    ("looped-even", 6, 1024, {"BLOCK_N": 256, "ROWS": 2}),
    ("looped-tail", 7, 1000, {"BLOCK_N": 256}),
    ("reread-even", 4, 2048, {"ROWS": 1, "REREAD": True}),
    ("reread-odd", 5, 4095, {"ROWS": 1, "REREAD": True}),
    ("persistent", 50, 512, {"PERSISTENT": True, "ROWS": 2}),
]
rows = []
for dtype in ("fp32", "fp16"):
    for blabel, M, N, base in BASES:
        for affine in (False, True):
            inp = T.make_inputs(M, N, dtype=dtype, affine=affine, seed=M + N, mean_shift=3.0)
            for variant in ("rmsnorm", "layernorm"):
                def call(cfg):
                    if variant == "rmsnorm":
                        return kn.rms_norm(inp["x"], inp["weight"], eps=EPS, config=cfg)
                    return kn.layer_norm(inp["x"], inp["weight"], inp["bias"], eps=EPS, config=cfg)
                plain = call(base)
                for olabel, opts in OPTS:
                    cfg = {**base, **opts}
                    out = call(cfg)
                    r = T.check("norm", out, inp, EPS, variant=variant)
                    p = kn.launch_params(M, N, inp["x"].dtype, cfg, num_sms=1)
                    n_out = 1 if opts.get("STATS") is False else (2 if variant == "rmsnorm" else 3)
                    rows.append(dict(base=blabel, opts=olabel, dtype=dtype, affine=affine, variant=variant,
                                     ok=bool(r["ok"]), n_out=len(out), want_n_out=n_out,
                                     same_y=bool(torch.equal(out[0], plain[0])),
                                     same_stats=all(bool(torch.equal(a, b)) for a, b in zip(out[1:], plain[1:])),
                                     even_m=p["EVEN_M"], even_n=p["EVEN_N"], idx64=p["IDX64"], looped=p["LOOPED"]))
# LN_STATS shifted: other arithmetic (not bit-identical for the looped LayerNorm), checked against the reference,
# also with rows shifted by 1000 (E[x^2] - mean^2 would lose the variance there)
shift_rows = []
for blabel, M, N, base in BASES:
    for mean_shift in (3.0, 1000.0):
        inp = T.make_inputs(M, N, dtype="fp32", affine=True, seed=M + N, mean_shift=mean_shift)
        for variant in ("rmsnorm", "layernorm"):
            for olabel, opts in SHIFT_OPTS:
                cfg = {**base, **opts}
                if variant == "rmsnorm":
                    out, plain = (kn.rms_norm(inp["x"], inp["weight"], eps=EPS, config=c) for c in (cfg, base))
                else:
                    out, plain = (kn.layer_norm(inp["x"], inp["weight"], inp["bias"], eps=EPS, config=c)
                                  for c in (cfg, base))
                r = T.check("norm", out, inp, EPS, variant=variant)
                shift_rows.append(dict(base=blabel, opts=olabel, variant=variant, shift=mean_shift, ok=bool(r["ok"]),
                                       same_y=bool(torch.equal(out[0], plain[0])),
                                       looped=kn.launch_params(M, N, inp["x"].dtype, cfg, num_sms=1)["LOOPED"]))
eps_errors = []
for bad_eps in (1e-300, 1e39):
    try:
        kn.rms_norm(torch.ones(2, 16), eps=bad_eps, config={"CONST_EPS": True})
    except ValueError as e:
        eps_errors.append(str(e))
print(json.dumps(dict(rows=rows, shift=shift_rows, eps_errors=eps_errors)))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1"})


def test_interpreter_shifted_ln_stats(interp):
    rows = interp["shift"]
    assert len(rows) == 9 * 2 * 2 * 2
    bad = [r for r in rows if not r["ok"]]
    assert not bad, json.dumps(bad[:10], indent=1)
    # RMSNorm and the whole-row kernels ignore LN_STATS (bit-identical); the looped LayerNorm takes the new path
    assert all(r["same_y"] for r in rows if r["variant"] == "rmsnorm" or not r["looped"])
    assert any(not r["same_y"] for r in rows if r["variant"] == "layernorm" and r["looped"])
    assert len(interp["eps_errors"]) == 2 and all("CONST_EPS" in e for e in interp["eps_errors"])


def test_interpreter_options_correct_and_identical(interp):
    interp = interp["rows"]
    assert len(interp) == 2 * 9 * 2 * 2 * 8
    bad = [r for r in interp if not (r["ok"] and r["same_y"] and r["same_stats"] and r["n_out"] == r["want_n_out"])]
    assert not bad, json.dumps(bad[:10], indent=1)
    # the cases reach both paths: mask-free (both EVEN) and masked, whole-row and looped, int32 offsets
    spec = [r for r in interp if r["opts"] == "spec"]
    by = {r["base"]: r for r in spec}
    assert by["row-even"]["even_m"] and by["row-even"]["even_n"] and not by["row-even"]["idx64"]
    assert by["looped-even"]["even_n"] and by["looped-even"]["looped"]
    assert by["reread-even"]["even_n"] and by["reread-even"]["looped"]
    assert not by["row-tailM"]["even_m"] and by["row-tailM"]["even_n"]
    assert not by["row-oddN"]["even_n"] and not by["looped-tail"]["even_n"] and not by["reread-odd"]["even_n"]
    assert not any(r["even_m"] or r["even_n"] or not r["idx64"] for r in interp if r["opts"] in ("evict-last", "nostats"))


_COMPILE_SCRIPT = r"""
import json, re, torch, yaml
from normfuse import compile_only
compile_only.install(90)
from kernels_triton.norms import compile_sm90_kernel

def count(ptx):
    body = ptx[ptx.index("{", ptx.index(".entry")):].split(".section", 1)[0]
    ins = [l.strip() for l in body.splitlines() if l.strip().endswith(";") and not l.strip().startswith((".", "//"))]
    g = [l for l in ins if "ld.global" in l or "st.global" in l]
    return dict(instr=len(ins), createpolicy=sum("createpolicy" in l for l in ins),
                pred_ldst=sum(l.startswith("@") for l in g),
                ld=sum("ld.global" in l for l in g), ld16=sum("ld.global" in l and ".v4." in l for l in g),
                st=sum("st.global" in l for l in g), st16=sum("st.global" in l and ".v4." in l for l in g))

PER_W1 = {"TILE_BYTES": 2048, "num_warps": 1}
SPEC = {"SPECIALIZE": True, "EVICT": "none", "STATS": False}
CASES = [  # (label, M, N, config)
    ("per-w1", 262144, 512, PER_W1), ("per-w1-spec", 262144, 512, {**PER_W1, **SPEC}),
    ("per-w1-spec-stats", 262144, 512, {**PER_W1, "SPECIALIZE": True, "EVICT": "none"}),
    ("per-w1", 4096, 1024, PER_W1), ("per-w1-spec", 4096, 1024, {**PER_W1, **SPEC}),
    ("reread-16ept", 262144, 8192, {"ROWS": 1, "THREAD_ELEMS": 16, "REREAD": True}),
    ("reread-16ept-spec", 262144, 8192, {"ROWS": 1, "THREAD_ELEMS": 16, "REREAD": True, "SPECIALIZE": True,
                                         "STATS": False}),
    ("loop-2048-spec", 262144, 16384, {"BLOCK_N": 2048, "ROWS": 1, "num_warps": 16, "SPECIALIZE": True,
                                       "STATS": False}),
    ("reread-16ept-spec", 262144, 32768, {"ROWS": 1, "THREAD_ELEMS": 16, "REREAD": True, "SPECIALIZE": True,
                                          "STATS": False}),
]
EPS_C = {"CONST_EPS": True}
SHIFT = {"ROWS": 1, "THREAD_ELEMS": 16, "REREAD": True, "SPECIALIZE": True, "STATS": False, "LN_STATS": "shifted"}
CASES += [
    ("per-w1-spec-eps", 262144, 512, {**PER_W1, **SPEC, **EPS_C}),
    ("per-w1-spec-eps", 4096, 1024, {**PER_W1, **SPEC, **EPS_C}),
    ("reread-16ept-spec-eps", 262144, 8192, {"ROWS": 1, "THREAD_ELEMS": 16, "REREAD": True, "SPECIALIZE": True,
                                             "STATS": False, **EPS_C}),
    ("reread-16ept-spec-shift", 262144, 32768, {**SHIFT, **EPS_C}),
    ("loop-2048-spec-shift", 262144, 16384, {"BLOCK_N": 2048, "ROWS": 1, "num_warps": 16, "SPECIALIZE": True,
                                             "STATS": False, "LN_STATS": "shifted", **EPS_C}),
    ("reread-16ept-spec-nreg32", 262144, 32768, {"ROWS": 1, "THREAD_ELEMS": 16, "REREAD": True, "SPECIALIZE": True,
                                                 "STATS": False, "MAXNREG": 32}),
]

def ptxas(k):
    import re
    from normfuse.codestats import ptxas_log
    rc, log = ptxas_log(k.asm["ptx"])
    assert rc == 0, log
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return dict(regs=int(re.search(r"Used (\d+) registers", log).group(1)),
                spill=int(spill.group(1)) + int(spill.group(2)))

out = []
for op in ("rms_norm", "layer_norm"):
    for label, M, N, cfg in CASES:
        k = compile_sm90_kernel(op, torch.empty(M, N, dtype=torch.bfloat16), config=cfg)
        regs = ptxas(k) if N == 32768 or label.endswith("shift") else {}
        out.append(dict(op=op, label=label, M=M, N=N, maxnreg=".maxnreg 32" in k.asm["ptx"], **regs,
                        **count(k.asm["ptx"])))
# every shipped Triton entry with the new options compiles at the narrow and wide benchmark N (affine too)
entries = [e for e in yaml.safe_load(open("configs/tiling/norms_h200.yaml"))["triton"]
           if {"SPECIALIZE", "EVICT", "STATS"} & set(e)]
yaml_rows = []
for e in entries:
    cfg = {k: v for k, v in e.items() if k != "name"}
    for N in (512, 8192, 32768):
        k = compile_sm90_kernel("layer_norm", torch.empty(262144, N, dtype=torch.bfloat16), config=cfg, affine=True)
        yaml_rows.append(dict(name=e["name"], N=N, shared=int(k.metadata.shared)))
print(json.dumps(dict(cases=out, yaml=yaml_rows)))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(_COMPILE_SCRIPT)


def _case(compiled, op, label, N):
    return next(r for r in compiled["cases"] if r["op"] == op and r["label"] == label and r["N"] == N)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_compile_spec_matches_inductor_codegen(compiled, op):
    for N in (512, 1024):
        plain, spec = _case(compiled, op, "per-w1", N), _case(compiled, op, "per-w1-spec", N)
        # the unspecialized kernel keeps its hint and masks (unchanged behaviour)
        assert plain["createpolicy"] > 0 and plain["pred_ldst"] > 0, plain
        # Inductor's persistent-reduction kernel: no cache policy, no predicates, 16-byte x/y only, no rstd/mean
        assert spec["createpolicy"] == 0 and spec["pred_ldst"] == 0, spec
        assert spec["ld"] == spec["ld16"] > 0 and spec["st"] == spec["st16"] > 0, spec
        assert spec["instr"] < plain["instr"], (spec, plain)
    stats = _case(compiled, op, "per-w1-spec-stats", 512)
    n_stats = 1 if op == "rms_norm" else 2
    assert stats["st"] == stats["st16"] + n_stats and stats["createpolicy"] == 0, stats
    # looped / re-read kernels: statistics pass evict_last + re-read evict_first (as Inductor), no predicates
    for label, N in (("reread-16ept-spec", 8192), ("loop-2048-spec", 16384), ("reread-16ept-spec", 32768)):
        r = _case(compiled, op, label, N)
        assert r["pred_ldst"] == 0 and r["createpolicy"] > 0, r
    r, p = _case(compiled, op, "reread-16ept-spec", 8192), _case(compiled, op, "reread-16ept", 8192)
    assert r["ld16"] == r["ld"] and r["instr"] < p["instr"], (r, p)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_compile_const_eps_is_inductors_ptx(compiled, op):
    # eps compiled in removes the one instruction our PTX had beyond Inductor's (its parameter load)
    for label, N in (("per-w1-spec", 512), ("per-w1-spec", 1024), ("reread-16ept-spec", 8192)):
        spec, eps = _case(compiled, op, label, N), _case(compiled, op, label + "-eps", N)
        assert eps["instr"] == spec["instr"] - 1, (eps, spec)
        assert eps["pred_ldst"] == 0 and eps["ld"] == eps["ld16"], eps
    inductor = {"rms_norm": 209, "layer_norm": 293}[op]  # results/inductor_norms/20261201_h200, 262144 x 512
    assert _case(compiled, op, "per-w1-spec-eps", 512)["instr"] == inductor


def test_compile_registers_ln_32768(compiled):
    twopass = _case(compiled, "layer_norm", "reread-16ept-spec", 32768)
    shifted = _case(compiled, "layer_norm", "reread-16ept-spec-shift", 32768)
    # two 1024-thread programs per SM need <= 32 registers: the shifted one-pass statistics fit, the two-pass do not
    assert twopass["regs"] > 32 and shifted["regs"] <= 32 and shifted["spill"] == 0, (twopass, shifted)
    assert shifted["pred_ldst"] == 0 and shifted["ld"] == shifted["ld16"] + 1, shifted  # + the shift x[row, 0]
    loop = _case(compiled, "layer_norm", "loop-2048-spec-shift", 16384)
    assert loop["regs"] <= 32 and loop["spill"] == 0 and loop["pred_ldst"] == 0, loop
    # MAXNREG reaches ptxas (.maxnreg): the two-pass kernel is held to 32 registers, at the price of spills
    capped = _case(compiled, "layer_norm", "reread-16ept-spec-nreg32", 32768)
    assert capped["maxnreg"] and capped["regs"] <= 32 and not twopass["maxnreg"], capped
    # RMSNorm at 32768 already fits in 32 (Inductor's kernel shape)
    assert _case(compiled, "rms_norm", "reread-16ept-spec", 32768)["regs"] <= 32


def test_compile_yaml_entries(compiled):
    from normfuse.compile_only import SMEM_LIMIT_BYTES

    names = {r["name"] for r in compiled["yaml"]}
    assert {"per-w1-spec", "per-w1-spec-stats", "reread-16ept-spec", "loop-2048-r1-w16-spec", "per-w1-spec-eps",
            "r4-w4-spec-eps", "reread-16ept-spec-shift", "loop-2048-r1-w16-spec-shift"} <= names
    assert all(r["shared"] <= SMEM_LIMIT_BYTES for r in compiled["yaml"])


def test_config_validation_new_fields():
    assert TilingConfig().EVICT == "first" and TilingConfig().STATS and not TilingConfig().SPECIALIZE
    for bad in ({"EVICT": "evict_first"}, {"EVICT": None}, {"EVICT": 1}, {"SPECIALIZE": 1}, {"STATS": "no"}):
        with pytest.raises(ValueError):
            TilingConfig.from_dict(bad)
    c = TilingConfig.from_dict({"EVICT": "none", "SPECIALIZE": True, "STATS": False})
    assert TilingConfig.from_dict(c.to_dict()) == c
    assert not TilingConfig().CONST_EPS and TilingConfig().LN_STATS == "twopass" and TilingConfig().MAXNREG is None
    for bad in ({"CONST_EPS": 1}, {"LN_STATS": "welford"}, {"LN_STATS": None}, {"MAXNREG": 12}, {"MAXNREG": 33},
                {"MAXNREG": 256}, {"MAXNREG": True}, {"MAXNREG": 32.0}):
        with pytest.raises(ValueError):
            TilingConfig.from_dict(bad)
    c = TilingConfig.from_dict({"CONST_EPS": True, "LN_STATS": "shifted", "MAXNREG": 32})
    assert TilingConfig.from_dict(c.to_dict()) == c


def test_launch_params_new_fields():
    bf16 = torch.bfloat16
    p = launch_params(262144, 512, bf16, {"TILE_BYTES": 2048, "num_warps": 1})  # unspecialized: as before
    assert (p["EVEN_M"], p["EVEN_N"], p["IDX64"], p["EVICT"], p["STATS"]) == (False, False, True, "evict_first", True)
    p = launch_params(262144, 512, bf16, {"TILE_BYTES": 2048, "num_warps": 1, "SPECIALIZE": True, "EVICT": "none"})
    assert (p["ROWS"], p["EVEN_M"], p["EVEN_N"], p["IDX64"], p["EVICT"]) == (2, True, True, False, "")
    assert launch_params(262144, 32768, bf16, {"SPECIALIZE": True})["IDX64"]  # 2^33 elements: int64 offsets
    assert not launch_params(65536, 32767, bf16, {"SPECIALIZE": True})["IDX64"]  # < 2^31 with the row padding
    assert launch_params(65536, 32768, bf16, {"SPECIALIZE": True})["IDX64"]  # exactly 2^31: int64
    p = launch_params(37, 1000, bf16, {"SPECIALIZE": True, "ROWS": 4})
    assert not p["EVEN_M"] and not p["EVEN_N"]
    p = launch_params(64, 16384, bf16, {"SPECIALIZE": True, "BLOCK_N": 2048})
    assert p["LOOPED"] and p["EVEN_N"]
    assert not launch_params(64, 16392, bf16, {"SPECIALIZE": True, "BLOCK_N": 2048})["EVEN_N"]
    assert launch_params(4, 8192, bf16, {"EVICT": "last"})["EVICT"] == "evict_last"
    p = launch_params(4, 8192, bf16, {"CONST_EPS": True, "LN_STATS": "shifted", "MAXNREG": 32})
    assert (p["CONST_EPS"], p["SHIFTED"], p["MAXNREG"]) == (True, True, 32)
    p = launch_params(4, 8192, bf16, None)
    assert (p["CONST_EPS"], p["SHIFTED"], p["MAXNREG"]) == (False, False, None)
