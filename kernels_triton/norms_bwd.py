r"""RMSNorm / LayerNorm backward in upstream Triton (also runs under fbtriton 3.7.4 and the CPU interpreter): the
backward kernel shared by every autograd drop-in of ``normfuse.nn``.

Math (per row of ``x [M, N]``, fp32; ``xhat`` the normalized row before the affine, ``g = dy * weight``)::

    RMSNorm:   xhat = x * rstd                 dx = rstd * (g - xhat * mean(g * xhat))
    LayerNorm: xhat = (x - mean) * rstd        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    both:      dweight = sum_rows(dy * xhat)   dbias = sum_rows(dy)

``x`` is either the raw input (with the saved ``rstd`` and, for LayerNorm, ``mean``) or, with ``normalized=True``,
``xhat`` itself (a fused forward that wrote the normalized row, e.g. GEMM -> norm with the affine left to the
consumer); ``rstd`` is needed in both cases. The Lazy Pre-Norm and MXNorm drop-ins use the raw-input form with the
rstd they recompute (RMSNorm) or the estimate rho of MXNorm (the paper's straight-through estimator: the RMSNorm
gradient with rstd := rho).

Kernel: one program per ``rows_per_program`` consecutive rows (grid ``min(M, 4 * SMs)`` on the GPU), the whole row
in registers (``BLOCK_N = next_pow2(N)``, N <= ``MAX_N``), one pass over ``dy`` and ``x`` per row; the affine
gradients are accumulated per program in fp32 registers and written as ``[programs, N]`` partials that the host
sums with ``torch.sum`` (a fixed order: deterministic, no float atomics), the structure of the Triton LayerNorm
tutorial's backward with the lock-free partial buffer of Liger-Kernel's RMSNorm backward.

Why Triton: the backward kernels are plain row reductions (no MMA, no TMA, no cross-CTA exchange), which Triton
expresses directly; it is the one DSL that runs in both environments (upstream triton 3.6 and fbtriton 3.7.4, so
the TLX forwards use it too) and in the CPU interpreter (``TRITON_INTERPRET=1``, fp16/fp32: tests), and Helion's
reference mode would only re-run PyTorch.

Sources: Triton tutorial 05 (layer-norm backward), https://triton-lang.org/main/getting-started/tutorials/05-layer-norm.html ;
Liger-Kernel's RMSNorm backward (per-program dW partials), https://github.com/linkedin/Liger-Kernel ; the gradient
formulas are the standard ones (e.g. Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019). Code written
for this repo.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from kernels_triton.lazy_prenorm import _fix_interpreter_scalar_index
from normfuse.techniques.lazy_prenorm import DTYPES

__all__ = ["MAX_N", "rms_norm_bwd", "layer_norm_bwd", "launch_params", "compile_sm90_kernel"]

MAX_N = 16384  # widest row held in registers (16 warps x 32 threads x 32 fp32 values per tensor; the affine
# form spills a few hundred bytes at 16384 -- correct, slower -- and none up to 8192 on sm_90)
_PROGRAMS_PER_SM = 4
_DEFAULT_NUM_SMS = 132  # H100 / H200; used off-GPU (interpreter) only to size the grid


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if _interpreting():
    _fix_interpreter_scalar_index()


@triton.jit
def _norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, M, N, rows_per_program,
                     IS_RMS: tl.constexpr, NORMALIZED: tl.constexpr, HAS_W: tl.constexpr, HAS_DB: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    row0 = pid.to(tl.int64) * rows_per_program
    n_rows = tl.minimum(rows_per_program, M - row0)
    for i in tl.range(0, n_rows):
        row = row0 + i
        off = row * N
        dy = tl.load(dy_ptr + off + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + off + cols, mask=col_ok, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if NORMALIZED:
            xhat = x
        elif IS_RMS:
            xhat = x * rstd
        else:
            xhat = (x - tl.load(mean_ptr + row)) * rstd
        xhat = tl.where(col_ok, xhat, 0.0)
        if HAS_W:
            g = dy * w
        else:
            g = dy
        c1 = tl.sum(g * xhat, axis=0) / N
        if IS_RMS:
            dx = (g - xhat * c1) * rstd
        else:
            c2 = tl.sum(g, axis=0) / N
            dx = (g - c2 - xhat * c1) * rstd
        tl.store(dx_ptr + off + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_ok)
        dw += dy * xhat
        db += dy
    part = pid.to(tl.int64) * N + cols
    if HAS_W:
        tl.store(dw_ptr + part, dw, mask=col_ok)
        if HAS_DB:
            tl.store(db_ptr + part, db, mask=col_ok)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_NUM_SMS


def launch_params(M: int, N: int, device: torch.device | str = "cuda", *, num_sms: int | None = None) -> dict:
    """Grid and meta-parameters for ``x [M, N]``: ``BLOCK_N = next_pow2(N)`` (>= 16), ``num_warps`` (4 up to 1024
    columns, 8 up to 4096, else 16), ``programs = min(M, 4 * num_sms)``, ``rows_per_program = cdiv(M, programs)``.
    Raises ValueError for M or N < 1 and N > ``MAX_N``."""
    if M < 1 or N < 1:
        raise ValueError(f"M and N must be >= 1, got M={M}, N={N}")
    if N > MAX_N:
        raise ValueError(f"N = {N} exceeds MAX_N = {MAX_N}: the norm backward keeps one row in registers")
    sms = num_sms if num_sms is not None else _num_sms(torch.device(device))
    programs = min(M, _PROGRAMS_PER_SM * sms)
    rows = triton.cdiv(M, programs)
    programs = triton.cdiv(M, rows)
    block_n = max(16, triton.next_power_of_2(N))
    num_warps = 4 if block_n <= 1024 else 8 if block_n <= 4096 else 16
    return {"BLOCK_N": block_n, "num_warps": num_warps, "programs": programs, "rows_per_program": rows}


def _check(dy, x, rstd, mean, weight, normalized: bool, is_rms: bool, launch: bool = True) -> tuple[int, int]:
    for name, t in (("dy", dy), ("x", x), ("rstd", rstd)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in DTYPES.values() or dy.dtype not in DTYPES.values():
        raise TypeError(f"x and dy must be bf16, fp16 or fp32, got {x.dtype} and {dy.dtype}")
    if x.dim() != 2 or dy.shape != x.shape:
        raise ValueError(f"x must be 2-D [M, N] and dy of the same shape, got {tuple(x.shape)} and {tuple(dy.shape)}")
    if not (x.is_contiguous() and dy.is_contiguous()):
        raise ValueError("x and dy must be row-major contiguous (call .contiguous())")
    M, N = x.shape
    stats = [("rstd", rstd)] + ([("mean", mean)] if not is_rms and not normalized else [])
    for name, t in stats:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.shape != (M,) or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous fp32 tensor of shape [M] = [{M}]")
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError("weight must be a torch.Tensor or None")
        if weight.shape != (N,) or not weight.is_contiguous():
            raise ValueError(f"weight must be contiguous with shape [N] = [{N}], got {tuple(weight.shape)}")
    devices = {t.device for t in (dy, x, rstd, mean, weight) if isinstance(t, torch.Tensor)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if launch and x.device.type != "cuda" and not _interpreting():
        raise ValueError(f"inputs must be CUDA tensors (got device {x.device}); CPU tensors run only under "
                         "TRITON_INTERPRET=1")
    return M, N


def _prepare(dy, x, rstd, mean, weight, *, is_rms: bool, normalized: bool, bias_grad: bool, launch: bool = True,
             num_sms: int | None = None):
    """Validate, allocate dx and the partial buffers; return (grid, args, meta, (dx, dw_part, db_part))."""
    M, N = _check(dy, x, rstd, mean, weight, normalized, is_rms, launch=launch)
    p = launch_params(M, N, x.device, num_sms=num_sms)
    dx = torch.empty_like(dy)
    has_w = weight is not None
    shape = (p["programs"], N) if has_w else (1,)
    dw_part = torch.empty(shape, dtype=torch.float32, device=x.device)
    db_part = torch.empty(shape if bias_grad and has_w else (1,), dtype=torch.float32, device=x.device)
    args = (dy, x, weight if has_w else x, mean if mean is not None else rstd, rstd, dx, dw_part, db_part, M, N,
            p["rows_per_program"])
    meta = dict(IS_RMS=is_rms, NORMALIZED=normalized, HAS_W=has_w, HAS_DB=bias_grad and has_w, BLOCK_N=p["BLOCK_N"],
                num_warps=p["num_warps"], num_stages=1)
    return (p["programs"],), args, meta, (dx, dw_part, db_part)


def _launch(dy, x, rstd, mean, weight, *, is_rms: bool, normalized: bool, bias_grad: bool):
    grid, args, meta, (dx, dw_part, db_part) = _prepare(dy, x, rstd, mean, weight, is_rms=is_rms,
                                                        normalized=normalized, bias_grad=bias_grad)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _norm_bwd_kernel[grid](*args, **meta)
    dw = dw_part.sum(0).to(weight.dtype) if weight is not None else None
    db = db_part.sum(0).to(weight.dtype) if bias_grad and weight is not None else None
    return dx, dw, db


def compile_sm90_kernel(op: str, x: torch.Tensor, *, affine: bool = True, normalized: bool = False):
    """Compile the backward of ``op`` ("rms_norm" or "layer_norm"; LayerNorm with a bias gradient when ``affine``)
    for sm_90 without launching it and return Triton's ``CompiledKernel``. ``x [M, N]``: a CPU tensor of the real
    shape and dtype (never read). Needs ``normfuse.compile_only.install(90)`` in this process and no
    ``TRITON_INTERPRET``. ValueError for an unknown op or a bad shape; RuntimeError under the interpreter."""
    if op not in ("rms_norm", "layer_norm"):
        raise ValueError(f"unknown op {op!r}; choices: rms_norm, layer_norm")
    if _interpreting():
        raise RuntimeError("compile_sm90_kernel cannot run under TRITON_INTERPRET=1")
    M, N = x.shape
    stat = torch.empty(M, dtype=torch.float32)
    w = torch.empty(N, dtype=x.dtype) if affine else None
    is_rms = op == "rms_norm"
    grid, args, meta, _ = _prepare(torch.empty_like(x), x, stat, None if is_rms or normalized else stat, w,
                                   is_rms=is_rms, normalized=normalized, bias_grad=affine and not is_rms,
                                   launch=False, num_sms=_DEFAULT_NUM_SMS)
    return _norm_bwd_kernel.warmup(*args, grid=grid, **meta)


def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None = None, *,
                 normalized: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Backward of ``y = x * rstd (* weight)`` over the last dim: returns ``(dx [M, N] in dy.dtype, dweight [N] in
    weight.dtype or None)``.

    ``dy``, ``x``: ``[M, N]`` row-major contiguous bf16/fp16/fp32 (CUDA; CPU only under ``TRITON_INTERPRET=1``),
    N <= ``MAX_N``; ``x`` is the raw input, or ``xhat = x * rstd`` with ``normalized=True``. ``rstd``: fp32 ``[M]``
    (the forward's ``rsqrt(mean(x^2) + eps)``, or any positive per-row scale such as MXNorm's estimate).
    ``weight``: ``[N]`` or None (then no dweight). Math: module docstring; fp32 throughout, one rounding of dx.

    Raises TypeError for non-tensors and dtypes, ValueError for shapes, layouts, devices and N > ``MAX_N``.
    """
    dx, dw, _ = _launch(dy, x, rstd, None, weight, is_rms=True, normalized=normalized, bias_grad=False)
    return dx, dw


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor | None, rstd: torch.Tensor,
                   weight: torch.Tensor | None = None, *, bias: bool = False, normalized: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Backward of ``y = (x - mean) * rstd (* weight + bias)`` over the last dim: returns ``(dx [M, N] in
    dy.dtype, dweight [N] or None, dbias [N] or None)`` (dweight / dbias in weight's dtype; ``bias=True`` asks for
    dbias, which needs a ``weight``: pass ones for a bias-only affine).

    ``mean``, ``rstd``: the forward's fp32 ``[M]`` statistics (``mean`` may be None with ``normalized=True``, when
    ``x`` is already ``xhat``). Other arguments and errors as ``rms_norm_bwd``.
    """
    if bias and weight is None:
        raise ValueError("layer_norm_bwd(bias=True) needs a weight (pass torch.ones(N) for a bias-only affine)")
    return _launch(dy, x, rstd, mean, weight, is_rms=False, normalized=normalized, bias_grad=bias)
