"""Tests of ``kernels_triton.multi_cta`` (post-norm GEMM + RMSNorm/LayerNorm) on a CPU-only machine.

1. Semantics under ``TRITON_INTERPRET=1`` (fp32 and fp16; the interpreter's bf16 dot is wrong) against the
   spec's fp32 reference and tolerance (``normfuse.techniques.multi_cta.check``: y within the flash-attention
   tolerance, mean/rstd to 1e-3): both exchanges (``last_cta``: the last-arriving CTA of an M-tile normalizes it;
   ``two_kernels``) and the full-row kernel (N <= BLOCK_N), with and without affine, M = 1, partial M/N/K tiles,
   several N-tiles, GROUP_M > 1; bitwise-identical repeats; LayerNorm on rows whose mean is 1000x their spread
   (with a negative control: the one-pass E[x^2] - mean^2 fails the same check); a NaN in one row of A stays in
   that row. One subprocess (the flag must be set before triton is imported).
2. Compile-only for sm_90 (fake driver, subprocess): wgmma + TMA in every mode; exactly one
   ``atom.global.gpu.acq_rel.add`` and L2 (``.cg``) loads in ``last_cta``; no atomics in the other modes; the
   second kernel for ``two_kernels``; shared memory within 227 KB.
3. Config validation and bad-input errors (in-process).
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

from kernels_triton import multi_cta as km  # noqa: E402
from kernels_triton.multi_cta import DEFAULT_CONFIG, TilingConfig  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

SMALL = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}

_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import multi_cta as T
from kernels_triton import multi_cta as km

SMALL = json.loads(os.environ["SMALL_CFG"])
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def run(variant, inp, eps, cfg):
    a, b, w, bias = inp["a"], inp["b"], inp["weight"], inp["bias"]
    if variant == "rmsnorm":
        return km.matmul_rmsnorm(a, b, w, eps=eps, config=cfg)
    return km.matmul_layernorm(a, b, w, bias, eps=eps, config=cfg)


def check(variant, inp, eps, cfg, label):
    out = run(variant, inp, eps, cfg)
    again = run(variant, inp, eps, cfg)
    r = T.check("fused", out, inp, eps, variant)
    M, N = inp["a"].shape[0], inp["b"].shape[1]
    return dict(label=label, variant=variant, dtype=str(inp["a"].dtype).split(".")[-1], M=M, N=N,
                mode=km.TilingConfig.from_dict(cfg).mode(N), ok=r["ok"], err=r["max_abs_err"], tol=r["tol"],
                deterministic=all(torch.equal(x, y) for x, y in zip(out, again)),
                shapes_ok=out[0].shape == (M, N) and out[0].dtype == inp["a"].dtype
                and all(s.shape == (M,) and s.dtype == torch.float32 for s in out[1:]))


# (label, M, N, K, config overrides): one row; partial M/N/K tiles with several N-tiles; N a multiple of the
# tile; one tile spans N (full row); row-grouped tile order
CASES = [
    ("M=1", 1, 200, 72, {}),
    ("ragged", 37, 200, 40, {}),
    ("aligned", 64, 128, 64, {}),
    ("full-row", 70, 48, 24, {}),
    ("group-m", 100, 136, 32, {"GROUP_M": 2}),
]
rows = []
for dtype in ("fp32", "fp16"):
    for label, M, N, K, over in CASES:
        for exchange in ("last_cta", "two_kernels"):
            if exchange == "two_kernels" and (dtype == "fp16" or label == "full-row"):
                continue  # the same code as last_cta's normalization pass: fp32 and the multi-tile cases suffice
            cfg = {**SMALL, **over, "exchange": exchange}
            for affine in (False, True):
                for variant in ("rmsnorm", "layernorm"):
                    inp = T.make_inputs(M, N, K, dtype=dtype, seed=M + N + K, affine=affine,
                                        mean_shift=8.0 if variant == "layernorm" else 0.0)
                    rows.append(check(variant, inp, EPS[variant], cfg, label))

# LayerNorm with row means 1000x the spread (fp32): Chan's merge passes; the one-pass E[x^2] - mean^2 fails
shift = []
inp = T.make_inputs(33, 200, 64, dtype="fp32", seed=11, mean_shift=1000.0)
for exchange in ("last_cta", "two_kernels"):
    shift.append(check("layernorm", inp, 1e-5, {**SMALL, "exchange": exchange}, "shift1000"))
shift.append(check("layernorm", inp, 1e-5, {**SMALL, "BLOCK_N": 256}, "shift1000-full-row"))
c = inp["a"].float() @ inp["b"].float()
m = c.mean(-1)
rstd_one_pass = torch.rsqrt((c * c).mean(-1) - m * m + 1e-5)
ref = T.reference("layernorm", inp, 1e-5)
y_one_pass = (c - m[:, None]) * rstd_one_pass[:, None]
negative = T.check("fused", (y_one_pass, m, rstd_one_pass), inp, 1e-5, "layernorm")["ok"]

# a NaN in row 3 of A: row 3 of y and its statistics are NaN, the other rows are finite and correct
nan = []
for exchange in ("last_cta", "two_kernels"):
    for variant in ("rmsnorm", "layernorm"):
        inp = T.make_inputs(40, 200, 32, dtype="fp32", seed=5)
        inp["a"][3, 7] = float("nan")
        out = run(variant, inp, EPS[variant], {**SMALL, "exchange": exchange})
        others = [i for i in range(40) if i != 3]
        sub = {**inp, "a": inp["a"][others]}
        r = T.check("fused", tuple(t[others] for t in out), sub, EPS[variant], variant)
        nan.append(dict(exchange=exchange, variant=variant, others_ok=r["ok"],
                        nan_row=bool(torch.isnan(out[0][3]).all()) and all(bool(torch.isnan(s[3])) for s in out[1:])))
print(json.dumps(dict(rows=rows, shift=shift, negative_ok=negative, nan=nan)))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1", "SMALL_CFG": json.dumps(SMALL)}, timeout=900)


def test_interpreter_semantics(interp):
    rows = interp["rows"]
    bad = [r for r in rows if not (r["ok"] and r["deterministic"] and r["shapes_ok"])]
    assert not bad, json.dumps(bad, indent=1)
    assert {r["mode"] for r in rows} == {"last_cta", "two_kernels", "full_row"}
    assert {r["dtype"] for r in rows} == {"float32", "float16"}
    # the multi-tile cases really span several N-tiles (the exchange is exercised)
    assert all(r["N"] > SMALL["BLOCK_N"] for r in rows if r["mode"] != "full_row")
    assert len(rows) == (5 * 2 - 1 + 5) * 2 * 2


def test_interpreter_mean_shift_and_negative_control(interp):
    assert all(r["ok"] for r in interp["shift"]), json.dumps(interp["shift"], indent=1)
    assert interp["negative_ok"] is False, "the check cannot tell the one-pass variance from Chan's merge"


def test_interpreter_nan_stays_in_its_row(interp):
    bad = [r for r in interp["nan"] if not (r["others_ok"] and r["nan_row"])]
    assert len(interp["nan"]) == 4 and not bad, json.dumps(interp["nan"], indent=1)


# --------------------------------------------------------------------------------------------------------
# 2. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton import multi_cta as km
out = {}
for N, exchange in ((1024, "last_cta"), (1024, "two_kernels"), (256, "last_cta")):
    a = torch.empty(4096, 1024, dtype=torch.bfloat16)
    b = torch.empty(1024, N, dtype=torch.bfloat16)
    for op in ("matmul_rmsnorm", "matmul_layernorm"):
        out[f"{op}/{N}/{exchange}"] = km.compile_sm90(op, a, b, config={"exchange": exchange}, affine=True)
out["matmul"] = km.compile_sm90("matmul", torch.empty(512, 512, dtype=torch.bfloat16),
                                torch.empty(512, 512, dtype=torch.bfloat16))
print(json.dumps(out))
"""


def test_compile_sm90():
    res = run_python_json(_COMPILE_SCRIPT, timeout=600)
    for key, r in res.items():
        assert r["smem_ok"] and r["ptx_markers"]["wgmma"] > 0 and r["ptx_markers"]["tma_load"] > 0, key
        if key == "matmul":
            continue
        op, N, exchange = key.split("/")
        mode = "full_row" if N == "256" else exchange
        assert r["mode"] == mode, key
        assert r["atomics"] == (1 if mode == "last_cta" else 0), (key, r["atomics"])
        assert (r["cg_loads"] > 0) == (mode == "last_cta"), (key, r["cg_loads"])
        assert (r["norm_pass"] is not None) == (mode == "two_kernels"), key


# --------------------------------------------------------------------------------------------------------
# 3. config and input validation
# --------------------------------------------------------------------------------------------------------
def test_config():
    assert DEFAULT_CONFIG == TilingConfig.from_dict(None) == TilingConfig.from_dict({})
    assert TilingConfig.from_dict(DEFAULT_CONFIG.to_dict()) == DEFAULT_CONFIG
    assert DEFAULT_CONFIG.mode(256) == "full_row" and DEFAULT_CONFIG.mode(264) == "last_cta"
    assert TilingConfig(exchange="two_kernels").mode(4096) == "two_kernels"
    for bad, match in (({"BLOCK_N": 512}, "power of 2 in"), ({"BLOCK_M": 48}, "power of 2"),
                       ({"GROUP_M": 0}, "GROUP_M"), ({"num_warps": 3}, "num_warps"), ({"num_stages": 0}, "num_stages"),
                       ({"exchange": "dsmem"}, "exchange"), ({"BLOCK_K": 8}, "power of 2 in"),
                       ({"exchang": "last_cta"}, "unknown")):
        with pytest.raises(ValueError, match=match):
            TilingConfig.from_dict(bad)
    assert km.matmul is km._lp.matmul  # the 'gemm' impl is the Lazy Pre-Norm module's GEMM


@pytest.mark.parametrize("variant", ["rmsnorm", "layernorm"])
def test_bad_inputs(variant):
    fn = km.matmul_rmsnorm if variant == "rmsnorm" else km.matmul_layernorm
    a, b = torch.randn(16, 16).half(), torch.randn(16, 32).half()
    with pytest.raises(TypeError):
        fn(a, b.float())
    with pytest.raises(TypeError):
        fn(a.int(), b.int())
    with pytest.raises(ValueError, match="2-D"):
        fn(a[None], b)
    with pytest.raises(ValueError, match="inner dimensions"):
        fn(a, torch.randn(24, 32).half())
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(32, 16).half()[::2], b)
    with pytest.raises(ValueError, match="multiple of 8"):
        fn(a, torch.randn(16, 20).half())
    with pytest.raises(ValueError, match="weight"):
        fn(a, b, torch.ones(16).half())
    with pytest.raises(TypeError, match="weight"):
        fn(a, b, torch.ones(32))
    with pytest.raises(ValueError, match="eps"):
        fn(a, b, eps=-1.0)
    with pytest.raises(ValueError, match="eps"):
        fn(a, b, eps=True)
    with pytest.raises(ValueError, match="power of 2"):
        fn(a, b, config={"BLOCK_N": 100})
    flat = torch.randn(16 * 16 + 1).half()
    with pytest.raises(ValueError, match="16-byte aligned"):  # checked before any launch (here: no device)
        km._prepare(flat[1:].view(16, 16), b, None, None, 1e-6, variant == "rmsnorm", None, launch=False)
    with pytest.raises(ValueError, match="CUDA"):
        fn(a, b)  # CPU tensors outside the interpreter
