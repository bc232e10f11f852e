"""Tests of ``kernels_triton.norms`` (standalone RMSNorm / LayerNorm forward) on a CPU-only machine.

1. Semantics under ``TRITON_INTERPRET=1`` (fp32/fp16; whole-row, looped and persistent variants; with and
   without affine) against ``normfuse.techniques.norms.reference`` with ``norms.tolerance``: M=1, N=1000, N=4095,
   tiny N=8, large |x|, mean-shifted LayerNorm (with a negative control showing E[x^2]-mean^2 would fail), a NaN in
   one row staying in that row. One subprocess (the flag must be set before triton is imported), shared by the
   tests through a module fixture.
2. Compile-only for sm_90 (fake driver, subprocess): shared memory within the H100/H200 limit, the resolved
   num_warps, and 16-byte global accesses (``ld.global...v4.b32`` / ``st.global.v4.b32``) whenever N allows them.
3. Config validation and bad-input errors (in-process: raised before any launch).

Nothing here measures bandwidth: the H200 targets (>= 90% of copy bandwidth) need the GPU sweep.
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

from kernels_triton import norms as kn  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402
from kernels_triton.norms import DEFAULT_CONFIG, PROPOSED_TILINGS, TilingConfig, launch_params  # noqa: E402





# --------------------------------------------------------------------------------------------------------
# 1. interpreter semantics
# --------------------------------------------------------------------------------------------------------
_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import norms as T
from kernels_triton import norms as kn
from kernels_triton.norms import rms_norm, layer_norm, launch_params

kn._DEFAULT_NUM_SMS = 1  # off-GPU SM count: makes the persistent grid smaller than the tile count (loop runs)
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def run(variant, inp, eps, cfg):
    if variant == "rmsnorm":
        y, rstd = rms_norm(inp["x"], inp["weight"], eps=eps, config=cfg)
        return {"y": y, "rstd": rstd}
    y, mean, rstd = layer_norm(inp["x"], inp["weight"], inp["bias"], eps=eps, config=cfg)
    return {"y": y, "mean": mean, "rstd": rstd}


def check(variant, inp, eps, cfg, rows=None):
    # y against the fp32 reference with the spec's tolerance; fp32 statistics to 1e-4 relative
    out = run(variant, inp, eps, cfg)
    x = inp["x"]
    assert out["y"].dtype == x.dtype and out["y"].shape == x.shape
    assert all(out[k].dtype == torch.float32 and out[k].shape == (x.shape[0],) for k in out if k != "y")
    sel = slice(None) if rows is None else rows
    sub = {**inp, "x": x[sel]}
    ref = T.reference(variant, sub, eps)
    tol = T.tolerance(ref["y"], T.same_dtype(variant, sub, eps))
    r = T.compare(out["y"][sel], ref["y"], tol)
    xmax = x[sel].float().abs().max().item()
    stats_ok = bool(torch.allclose(out["rstd"][sel], ref["rstd"], rtol=1e-4, atol=0))
    if "mean" in out:
        stats_ok &= bool(torch.allclose(out["mean"][sel], ref["mean"], rtol=1e-4, atol=1e-6 * xmax))
    p = launch_params(*x.shape, x.dtype, cfg, num_sms=kn._DEFAULT_NUM_SMS)
    return out, dict(variant=variant, shape=list(x.shape), dtype=str(x.dtype).split(".")[-1], cfg=cfg,
                     looped=p["LOOPED"], rows=p["ROWS"], programs=p["grid"][0], tiles=p["n_tiles"],
                     stats_ok=stats_ok, **r)


LOOP = {"BLOCK_N": 256}
# (label, M, N, config): M=1; several rows per program with a partial last tile; odd N (scalar accesses);
# tiny N; the looped kernel with a tail chunk, with an odd N, with one chunk only; a persistent grid that loops.
CASES = [
    ("M=1", 1, 1000, {}),
    ("rows", 37, 1000, {}),
    ("N=4095", 5, 4095, {}),
    ("tiny", 67, 8, {}),
    ("tiny-M1", 1, 8, {}),
    ("looped", 9, 1000, LOOP),
    ("looped-odd", 6, 4095, {"BLOCK_N": 1024, "ROWS": 4}),
    ("looped-1chunk+tail", 3, 300, LOOP),
    ("persistent", 203, 1000, {"PERSISTENT": True, "ROWS": 2}),
    ("persistent-looped", 50, 1000, {"PERSISTENT": True, "ROWS": 2, "BLOCK_N": 256}),
    ("reread", 9, 1000, {"REREAD": True}),  # the two-pass kernel over one whole-row chunk (Inductor's shape)
    ("reread-rows", 21, 512, {"REREAD": True, "ROWS": 4, "num_warps": 1}),
]
results = {"basic": [], "large": [], "shift": [], "nan": [], "eps": []}
for dtype in ("fp32", "fp16"):
    for label, M, N, cfg in CASES:
        for affine in (False, True):
            inp = T.make_inputs(M, N, dtype=dtype, affine=affine, seed=M + N)
            for variant in ("rmsnorm", "layernorm"):
                _, r = check(variant, inp, EPS[variant], cfg)
                results["basic"].append(dict(label=label, affine=affine, **r))

    # large |x|: fp32 x*1e4; fp16 x*1e3 (x*1e4 would overflow fp16; x^2 already overflows fp16 beyond 256)
    scale = 1e4 if dtype == "fp32" else 1e3
    for cfg in ({}, LOOP):
        for affine in (False, True):
            inp = T.make_inputs(7, 1000, dtype="fp32", affine=affine, seed=3)
            inp = {k: (v.to(T.torch_dtype(dtype)) if v is not None else None) for k, v in inp.items()}
            inp["x"] = (inp["x"].float() * scale).to(T.torch_dtype(dtype))
            assert torch.isfinite(inp["x"]).all()
            for variant in ("rmsnorm", "layernorm"):
                _, r = check(variant, inp, EPS[variant], cfg)
                results["large"].append(dict(scale=scale, affine=affine, **r))

    # mean-shifted LayerNorm (x + 10): the two-pass / Chan statistics keep the error within the tolerance
    for cfg in ({}, LOOP, {"BLOCK_N": 16}):
        for affine in (False, True):
            inp = T.make_inputs(11, 1000, dtype=dtype, affine=affine, seed=5, mean_shift=10.0)
            _, r = check("layernorm", inp, EPS["layernorm"], cfg)
            results["shift"].append(dict(shift=10.0, affine=affine, **r))

# fp32, x + 1000: the kernels still pass; the one-pass E[x^2] - mean^2 (fp32) must FAIL the same check
inp = T.make_inputs(11, 1000, dtype="fp32", seed=6, mean_shift=1000.0)
ref = T.reference("layernorm", inp, 1e-5)
tol = T.tolerance(ref["y"], T.same_dtype("layernorm", inp, 1e-5))
for cfg in ({}, LOOP):
    _, r = check("layernorm", inp, 1e-5, cfg)
    results["shift"].append(dict(shift=1000.0, affine=False, **r))
x = inp["x"]
m = x.mean(-1, keepdim=True)
one_pass = (x - m) * torch.rsqrt((x * x).mean(-1, keepdim=True) - m * m + 1e-5)
negative_control_ok = T.compare(one_pass, ref["y"], tol)["ok"]

# NaN in one row (row 2): that row's y and statistics are NaN, every other row finite and correct. M=5 fits in
# one program (ROWS auto = 8), so the NaN row shares its tile with the others.
for dtype in ("fp32", "fp16"):
    for cfg in ({}, LOOP, {"ROWS": 2, "PERSISTENT": True}):
        for variant in ("rmsnorm", "layernorm"):
            inp = T.make_inputs(5, 1000, dtype=dtype, affine=True, seed=9)
            inp["x"][2, 17] = float("nan")
            others = [0, 1, 3, 4]
            out, r = check(variant, inp, EPS[variant], cfg, rows=others)
            nan_row = bool(torch.isnan(out["y"][2]).all()) and all(bool(torch.isnan(out[k][2])) for k in out if k != "y")
            others_finite = bool(torch.isfinite(out["y"][others]).all()) and all(
                bool(torch.isfinite(out[k][others]).all()) for k in out if k != "y")
            results["nan"].append(dict(nan_row_all_nan=nan_row, others_finite=others_finite, **r))

# eps is honoured (0.5 changes the answer visibly)
inp = T.make_inputs(9, 1000, dtype="fp32", seed=4)
for cfg in ({}, LOOP):
    for variant in ("rmsnorm", "layernorm"):
        _, r = check(variant, inp, 0.5, cfg)
        results["eps"].append(r)
print(json.dumps(dict(results=results, negative_control_ok=negative_control_ok)))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1"})


def _bad(rows):
    return [r for r in rows if not (r["ok"] and r["stats_ok"])]


def test_interpreter_basic(interp):
    rows = interp["results"]["basic"]
    assert not _bad(rows), json.dumps(_bad(rows), indent=1)
    assert len(rows) == 2 * 12 * 2 * 2  # dtypes x CASES x affine x variants
    # the cases exercise what they claim: looped, several rows per program, a persistent grid that loops
    by = {r["label"]: r for r in rows}
    assert by["looped"]["looped"] and by["looped-odd"]["looped"] and not by["rows"]["looped"]
    assert by["reread"]["looped"] and by["reread-rows"]["looped"] and by["reread-rows"]["rows"] == 4
    assert by["rows"]["rows"] > 1 and by["tiny"]["rows"] > 1
    assert by["persistent"]["programs"] < by["persistent"]["tiles"]
    assert by["persistent-looped"]["programs"] < by["persistent-looped"]["tiles"]


def test_interpreter_large_values(interp):
    rows = interp["results"]["large"]
    assert len(rows) == 2 * 2 * 2 * 2 and not _bad(rows), json.dumps(_bad(rows), indent=1)


def test_interpreter_mean_shift(interp):
    rows = interp["results"]["shift"]
    assert len(rows) == 2 * 3 * 2 + 2 and not _bad(rows), json.dumps(_bad(rows), indent=1)
    assert interp["negative_control_ok"] is False, "the shift check cannot tell one-pass variance from two-pass"


def test_interpreter_nan_stays_in_its_row(interp):
    rows = interp["results"]["nan"]
    assert len(rows) == 2 * 3 * 2
    bad = [r for r in rows if not (r["ok"] and r["stats_ok"] and r["nan_row_all_nan"] and r["others_finite"])]
    assert not bad, json.dumps(bad, indent=1)


def test_interpreter_eps(interp):
    rows = interp["results"]["eps"]
    assert len(rows) == 4 and not _bad(rows), json.dumps(_bad(rows), indent=1)


# --------------------------------------------------------------------------------------------------------
# 2. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, re, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton.norms import compile_sm90, compile_sm90_kernel, launch_params, PROPOSED_TILINGS

LD16 = re.compile(r"ld\.global(?:\.[A-Za-z0-9_:]+)*\.v4\.(?:b32|f32|u32)")
ST16 = re.compile(r"st\.global(?:\.[A-Za-z0-9_:]+)*\.v4\.(?:b32|f32|u32)")
CASES = [  # (M, N, dtype, config)
    (262144, 1024, torch.bfloat16, None),
    (262144, 1000, torch.bfloat16, None),  # N % 8 == 0 but not % 16: still 16-byte accesses (ALIGN hint)
    (262144, 512, torch.float32, None),
    (262144, 4095, torch.bfloat16, None),  # odd N: scalar accesses expected
    (4096, 32768, torch.bfloat16, None),  # whole row, 32 warps
    (4096, 32768, torch.bfloat16, {"BLOCK_N": 8192}),  # looped
    (262144, 1024, torch.bfloat16, {"PERSISTENT": True}),
    (1, 8, torch.bfloat16, None),
]
out = []
for op in ("rms_norm", "layer_norm"):
    for M, N, dt, cfg in CASES:
        for affine in (False, True):
            x = torch.empty(M, N, dtype=dt)
            k = compile_sm90_kernel(op, x, config=cfg, affine=affine)
            ptx = k.asm["ptx"]
            s = compile_sm90(op, x, config=cfg, affine=affine)  # the summary API itself (cached compile)
            p = launch_params(M, N, dt, cfg)
            out.append(dict(op=op, M=M, N=N, dtype=str(dt).split(".")[-1], cfg=cfg, affine=affine, summary=s,
                            expect_vec=(N * x.element_size()) % 16 == 0 and p["BLOCK_N"] * x.element_size() >= 16 * 32,
                            num_warps=p["num_warps"], ld16=len(LD16.findall(ptx)), st16=len(ST16.findall(ptx))))
# every proposed tiling compiles across the sweep's N range
tilings = []
for entry in PROPOSED_TILINGS:
    cfg = {k: v for k, v in entry.items() if k != "name"}
    for N in (512, 4096, 32768):
        s = compile_sm90("layer_norm", torch.empty(262144, N, dtype=torch.bfloat16), config=cfg, affine=True)
        tilings.append(dict(name=entry["name"], N=N, summary=s))
print(json.dumps(dict(cases=out, tilings=tilings)))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(_COMPILE_SCRIPT)


def test_compile_sm90_smem_and_warps(compiled):
    from normfuse.compile_only import SMEM_LIMIT_BYTES

    for r in compiled["cases"] + compiled["tilings"]:
        s = r["summary"]
        assert s["shared_bytes"] <= SMEM_LIMIT_BYTES and s["smem_ok"], r
    for r in compiled["cases"]:
        assert r["summary"]["num_warps"] == r["num_warps"], r
    assert len(compiled["tilings"]) == 3 * len(PROPOSED_TILINGS)


def test_compile_sm90_16_byte_accesses(compiled):
    vec = [r for r in compiled["cases"] if r["expect_vec"]]
    assert {(r["N"], r["dtype"]) for r in vec} >= {(1024, "bfloat16"), (1000, "bfloat16"), (512, "float32"),
                                                    (32768, "bfloat16")}
    bad = [r for r in vec if not (r["ld16"] > 0 and r["st16"] > 0)]
    assert not bad, json.dumps(bad, indent=1)
    # odd N cannot be vectorized (the alignment is unknown): recorded, not a failure of the kernel
    odd = [r for r in compiled["cases"] if r["N"] == 4095]
    assert odd and all(r["ld16"] == 0 for r in odd)


# --------------------------------------------------------------------------------------------------------
# 3. config and input validation
# --------------------------------------------------------------------------------------------------------
def test_config_validation():
    assert TilingConfig.from_dict(None) == DEFAULT_CONFIG
    assert TilingConfig.from_dict(DEFAULT_CONFIG) is DEFAULT_CONFIG
    c = TilingConfig.from_dict({"BLOCK_N": 1024, "ROWS": 4, "num_warps": 8, "PERSISTENT": True})
    assert TilingConfig.from_dict(c.to_dict()) == c
    for bad in ({"BLOCK_N": 1000}, {"BLOCK_N": 8}, {"BLOCK_N": 1 << 17}, {"ROWS": 3}, {"ROWS": 0},
                {"num_warps": 64}, {"num_warps": 6}, {"TILE_BYTES": 100}, {"TILE_BYTES": None},
                {"THREAD_ELEMS": 3}, {"BLOCK_N": 1024.0}, {"ROWS": True}, {"PERSISTENT": 1}):
        with pytest.raises(ValueError):
            TilingConfig.from_dict(bad)
    with pytest.raises(ValueError, match="power of 2"):
        TilingConfig(BLOCK_N=1000)
    with pytest.raises(ValueError, match="valid keys"):
        TilingConfig.from_dict({"BLOCK_M": 64})
    with pytest.raises(TypeError):
        TilingConfig.from_dict([("BLOCK_N", 1024)])
    for entry in PROPOSED_TILINGS:  # the proposed sweep list is valid (the sweep pops "name")
        TilingConfig.from_dict({k: v for k, v in entry.items() if k != "name"})
    assert 3 <= len(PROPOSED_TILINGS) <= 6


def test_launch_params_rules():
    bf16 = torch.bfloat16
    p = launch_params(262144, 1024, bf16)  # whole row, 16 KiB per program, 32 elements per thread
    assert (p["BLOCK_N"], p["ROWS"], p["num_warps"], p["LOOPED"], p["ALIGN"]) == (1024, 8, 8, False, 16)
    p = launch_params(262144, 1000, bf16)
    assert (p["BLOCK_N"], p["ALIGN"], p["LOOPED"]) == (1024, 8, False)
    p = launch_params(4096, 32768, bf16)
    assert (p["BLOCK_N"], p["ROWS"], p["num_warps"], p["LOOPED"]) == (32768, 1, 32, False)
    p = launch_params(4096, 32768, bf16, {"BLOCK_N": 8192})
    assert (p["BLOCK_N"], p["LOOPED"]) == (8192, True)
    assert launch_params(4096, 4096, bf16, {"BLOCK_N": 8192})["BLOCK_N"] == 4096  # clamped: whole row
    assert launch_params(4096, 1 << 17, bf16)["LOOPED"]  # None beyond 64K: looped
    p = launch_params(4096, 8192, bf16, {"REREAD": True, "ROWS": 1, "THREAD_ELEMS": 16})  # Inductor's N = 8192 shape
    assert p["LOOPED"] and p["BLOCK_N"] == 8192 and p["num_warps"] == 16 and p["ROWS"] == 1
    with pytest.raises(ValueError, match="REREAD must be a bool"):
        TilingConfig(REREAD=1)
    assert launch_params(3, 1000, bf16)["ROWS"] == 4  # at most next_pow2(M)
    assert launch_params(4095, 4095, bf16)["ALIGN"] == 1
    p = launch_params(262144, 1024, bf16, {"PERSISTENT": True}, num_sms=132)
    assert p["grid"][0] == 132 * 4 < p["n_tiles"]
    assert launch_params(262144, 1024, bf16, {"THREAD_ELEMS": 16})["num_warps"] == 16


def _inputs(dtype=torch.float16, M=4, N=64):
    x = torch.randn(M, N).to(dtype)
    return x, torch.ones(N, dtype=dtype), torch.zeros(N, dtype=dtype)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_bad_inputs(op, monkeypatch):
    # normfuse.testing.assert_rejects_bad_inputs targets GEMM signatures fn(a, b); the norm checks are here
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fn = getattr(kn, op)
    x, w, b = _inputs()
    extra = {"bias": b} if op == "layer_norm" else {}
    with pytest.raises(TypeError):
        fn(x.numpy())
    with pytest.raises(TypeError):
        fn(x.to(torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        fn(x[None])
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(4, 128).half()[:, ::2])
    with pytest.raises(ValueError, match="shape"):
        fn(x, torch.ones(63, dtype=x.dtype))
    with pytest.raises(TypeError):
        fn(x, w.to(torch.int32))
    with pytest.raises(TypeError):
        fn(x, w.tolist())
    if op == "layer_norm":
        with pytest.raises(ValueError, match="shape"):
            fn(x, w, torch.zeros(65, dtype=x.dtype))
    for eps in (0.0, -1.0, float("nan"), float("inf"), True, "1e-5"):
        with pytest.raises(ValueError, match="eps"):
            fn(x, w, eps=eps, **extra)
    with pytest.raises(ValueError, match="power of 2"):
        fn(x, w, config={"BLOCK_N": 100}, **extra)
    with pytest.raises(ValueError, match="valid keys"):
        fn(x, w, config={"BLOCK": 128}, **extra)
    with pytest.raises(TypeError):
        fn(x, w, config=42, **extra)
    with pytest.raises(ValueError, match="CUDA"):  # valid CPU inputs, but not under the interpreter
        fn(x, w, **extra)


def test_compile_sm90_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        kn.compile_sm90("group_norm", torch.empty(4, 64, dtype=torch.bfloat16))
