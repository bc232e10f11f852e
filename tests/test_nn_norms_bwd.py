"""Tests of ``kernels_triton/norms_bwd.py`` (the RMSNorm / LayerNorm backward kernel of every ``normfuse.nn``
drop-in) and of the PyTorch reference mode of ``normfuse.nn.norm_ops``, on a CPU-only machine.

1. Interpreter (``TRITON_INTERPRET=1``, one subprocess shared through a module fixture), fp32 and fp16: dx, dweight
   and dbias against torch autograd on fp64 inputs by the flash-attention rule (the same-dtype torch autograd error
   sets the tolerance), for RMSNorm and LayerNorm, from the raw input and from the normalized row, with and without
   weight, at M = 1, N = 8 (a row shorter than the 16-wide tile), N = 1000 (masked tail), a mean-shifted LayerNorm
   input, and 150 rows (19 rows per program: the SM count is set to 2 off the GPU, 8 programs); the PyTorch reference of
   ``norm_ops`` against the kernel; a negative control (a 1 % wrong rstd fails the rule); a NaN row stays in its row.
2. Compile-only for sm_90 (fake driver, subprocess): RMSNorm / LayerNorm, raw input with affine gradients and the
   normalized form without, N from 128 to 16384 in bf16: no ptxas spills up to N = 8192 (16384 with the affine
   partials spills a few hundred bytes: correct, slower), the expected warps, 16-byte-or-wider loads once N allows.
3. In-process: bad inputs raise TypeError / ValueError naming the constraint; ``launch_params`` sizes the grid.
"""

from __future__ import annotations

import pytest
import torch

from kernels_triton import norms_bwd as nb
from normfuse.testing import run_python_json

_SCRIPT = r"""
import json
import torch
from kernels_triton import norms_bwd
from kernels_triton.norms_bwd import rms_norm_bwd, layer_norm_bwd
from normfuse.nn.norm_ops import reference_norm_bwd
from normfuse.techniques.lazy_prenorm import compare, tolerance

def case(is_rms, dtype, M, N, normalized, affine, shift=0.0, rstd_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g, dtype=torch.float64) * torch.exp2(torch.rand(M, 1, generator=g) * 4 - 2) + shift
    w = (1 + 0.2 * torch.randn(N, generator=g, dtype=torch.float64)) if affine else None
    b = 0.1 * torch.randn(N, generator=g, dtype=torch.float64) if affine and not is_rms else None
    dy = torch.randn(M, N, generator=g, dtype=torch.float64)
    eps = 1e-6 if is_rms else 1e-5

    def torch_grads(dt):
        xr = x.to(dt).requires_grad_()
        wr = w.to(dt).requires_grad_() if w is not None else None
        br = b.to(dt).requires_grad_() if b is not None else None
        y = (torch.nn.functional.rms_norm(xr, (N,), wr, eps) if is_rms
             else torch.nn.functional.layer_norm(xr, (N,), wr, br, eps))
        leaves = [t for t in (xr, wr, br) if t is not None]
        return torch.autograd.grad(y, leaves, dy.to(dt))

    ref, same = torch_grads(torch.float64), torch_grads(dtype)
    mean = x.mean(-1)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps) if is_rms else torch.rsqrt(x.var(-1, unbiased=False) + eps)
    rstd = (rstd * rstd_scale).float()
    xin = (x * rstd.double()[:, None] if is_rms else (x - mean[:, None]) * rstd.double()[:, None]) if normalized else x
    xin, dyd, wd = xin.to(dtype), dy.to(dtype), (w.to(dtype) if w is not None else None)
    if is_rms:
        dx, dw = rms_norm_bwd(dyd, xin, rstd, wd, normalized=normalized)
        got = [dx] + ([dw] if w is not None else [])
    else:
        dx, dw, db = layer_norm_bwd(dyd, xin, None if normalized else mean.float(), rstd, wd, bias=b is not None,
                                    normalized=normalized)
        got = [dx] + ([dw] if w is not None else []) + ([db] if b is not None else [])
    res = [compare(o, r, tolerance(r, s)) for o, r, s in zip(got, ref, same)]
    rx, rw, rb = reference_norm_bwd(dyd, xin, None if normalized else mean.float(), rstd, wd, is_rms=is_rms,
                                    normalized=normalized, bias=b is not None)
    ref_mode = [rx] + ([rw] if w is not None else []) + ([rb] if b is not None else [])
    agree = max((o.double() - q.double()).abs().max().item() / max(q.double().abs().max().item(), 1e-30)
                for o, q in zip(got, ref_mode))
    return {"ok": all(r["ok"] for r in res), "worst": max(r["max_abs_err"] / r["tol"] for r in res),
            "dtypes_ok": all(o.dtype == dtype for o in got), "ref_mode_rel": agree}

norms_bwd._DEFAULT_NUM_SMS = 2  # off-GPU grid: 8 programs, so 150 rows give 19 rows per program (the row loop)
out = {}
for dtype in (torch.float32, torch.float16):
    dn = str(dtype).split(".")[-1]
    for is_rms in (True, False):
        nn = "rms" if is_rms else "ln"
        for M, N in ((1, 8), (37, 1000), (150, 64)):
            for normalized in (False, True):
                for affine in (True, False):
                    key = f"{nn}-{dn}-{M}x{N}-{'xhat' if normalized else 'x'}-{'affine' if affine else 'plain'}"
                    out[key] = case(is_rms, dtype, M, N, normalized, affine)
        out[f"{nn}-{dn}-shifted"] = case(is_rms, dtype, 33, 256, False, True, shift=50.0 if not is_rms else 0.0)
    out[f"neg-rstd-{dn}"] = case(True, dtype, 37, 1000, False, True, rstd_scale=1.01)

# a NaN in one row stays in its row (dx); dweight is a column sum, so it is NaN in every column
x = torch.randn(9, 128, dtype=torch.float32); x[4, 7] = float("nan")
rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
dx, dw = rms_norm_bwd(torch.randn(9, 128), x, rstd, torch.ones(128))
rows = torch.isnan(dx).any(-1)
out["nan_row"] = {"nan_rows": rows.nonzero().flatten().tolist()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=900)


def test_backward_matches_fp64_autograd(interp):
    cases = {k: v for k, v in interp.items() if not k.startswith(("neg", "nan"))}
    assert len(cases) == 2 * 2 * (3 * 2 * 2 + 1)
    bad = {k: v for k, v in cases.items() if not (v["ok"] and v["dtypes_ok"])}
    assert not bad, bad


def test_reference_mode_matches_kernel(interp):
    # the PyTorch reference used on the CPU outside the interpreter computes what the kernel computes
    for k, v in interp.items():
        if k.startswith(("neg", "nan")):
            continue
        limit = 1e-5 if "float32" in k else 2e-3
        assert v["ref_mode_rel"] <= limit, (k, v)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_negative_control_fails(interp, dtype):
    # a 1 % error in rstd must not pass the tolerance: the rule can fail
    assert not interp[f"neg-rstd-{dtype}"]["ok"]


def test_nan_stays_in_its_row(interp):
    assert interp["nan_row"]["nan_rows"] == [4]


# --------------------------------------------------------------------------------------------------------------
# compile-only for sm_90
# --------------------------------------------------------------------------------------------------------------
_COMPILE = r"""
import json, re, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton import norms_bwd as nb
from normfuse.codestats import ptxas_info

def spills(ptx):
    return ptxas_info(ptx, timeout_s=120)["spill_stores"]

out = {}
for N in (128, 1000, 4096, 8192, 16384):
    for op in ("rms_norm", "layer_norm"):
        for affine in (True, False):
            ck = nb.compile_sm90_kernel(op, torch.empty(8192, N, dtype=torch.bfloat16), affine=affine,
                                        normalized=not affine)
            ptx = ck.asm["ptx"]
            out[f"{op}/{N}/{affine}"] = dict(spills=spills(ptx), warps=int(ck.metadata.num_warps),
                                             ld_vec=len(re.findall(r"ld\.global[^\n]*\.v[24]\.", ptx)))
print(json.dumps(out))
"""


def test_compile_sm90():
    r = run_python_json(_COMPILE, timeout=900)
    assert len(r) == 5 * 2 * 2
    for key, v in r.items():
        op, N, affine = key.split("/")
        N = int(N)
        if N <= 8192 or affine == "False":
            assert v["spills"] == 0, (key, v)
        else:  # 16 warps cap a thread at 128 registers: the affine partials spill a little at N = 16384
            assert (v["spills"] or 0) <= 512, (key, v)
        assert v["warps"] == (4 if N <= 1024 else 8 if N <= 4096 else 16), (key, v)
        if N >= 4096:  # multiples of 8 columns and >= 2 per thread: vector loads
            assert v["ld_vec"] > 0, (key, v)
    with pytest.raises(ValueError, match="unknown op"):
        nb.compile_sm90_kernel("group_norm", torch.empty(4, 64))


# --------------------------------------------------------------------------------------------------------------
# in-process: validation (raised before any launch)
# --------------------------------------------------------------------------------------------------------------
def _args(M=4, N=16, dtype=torch.float16):
    return torch.randn(M, N).to(dtype), torch.randn(M, N).to(dtype), torch.ones(M), torch.ones(N).to(dtype)


def test_bad_inputs_raise():
    dy, x, rstd, w = _args()
    with pytest.raises(TypeError, match="torch.Tensor"):
        nb.rms_norm_bwd(dy.numpy(), x, rstd)
    with pytest.raises(TypeError, match="bf16, fp16 or fp32"):
        nb.rms_norm_bwd(dy.int(), x, rstd)
    with pytest.raises(ValueError, match="same shape"):
        nb.rms_norm_bwd(dy[:, :8], x, rstd)
    with pytest.raises(ValueError, match="contiguous"):
        nb.rms_norm_bwd(torch.randn(16, 8).half().t(), torch.randn(16, 8).half().t(), rstd)
    with pytest.raises(ValueError, match="rstd must be a contiguous fp32"):
        nb.rms_norm_bwd(dy, x, rstd.half())
    with pytest.raises(ValueError, match="mean must be"):
        nb.layer_norm_bwd(dy, x, None, rstd)
    with pytest.raises(ValueError, match="weight must be contiguous with shape"):
        nb.rms_norm_bwd(dy, x, rstd, w[:8])
    with pytest.raises(ValueError, match="needs a weight"):
        nb.layer_norm_bwd(dy, x, rstd, rstd, None, bias=True)
    with pytest.raises(ValueError, match="CUDA"):  # CPU tensors outside the interpreter
        nb.rms_norm_bwd(dy, x, rstd, w)


def test_launch_params():
    p = nb.launch_params(600, 1000, num_sms=132)
    assert p["BLOCK_N"] == 1024 and p["num_warps"] == 4
    assert p["programs"] * p["rows_per_program"] >= 600 and (p["programs"] - 1) * p["rows_per_program"] < 600
    assert nb.launch_params(10**6, 4096, num_sms=132)["programs"] <= 4 * 132
    assert nb.launch_params(8, 16384, num_sms=132)["num_warps"] == 16
    with pytest.raises(ValueError, match="MAX_N"):
        nb.launch_params(8, nb.MAX_N + 1)
    with pytest.raises(ValueError, match=">= 1"):
        nb.launch_params(0, 16)
