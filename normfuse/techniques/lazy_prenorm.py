r"""Lazy Pre-Norm (RMSNorm -> GEMM): the technique's math, inputs, reference, cost model and tolerance.

Math (BLOG section 2)::

    C = (rmsnorm(A, eps) * gamma) @ B
      = diag(rstd) @ (A @ (diag(gamma) @ B))        rstd_i = rsqrt(mean_k A_ik^2 + eps)

RMSNorm is a pure row scale, so it commutes with the GEMM: fold gamma into B once (``b_folded``, outside any
timed region), accumulate the per-row sum of squares of A in fp32 while the K-loop streams A for the MMA, and
scale the fp32 accumulator by ``rstd`` in the epilogue. The normalized activation is never written to memory.

Source: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(the blog used eps = 1e-5; our default is 1e-6, as in Meta's TLX kernel, and it is configurable).

Shapes and dtypes: ``a [M, K]``, ``gamma [K]``, ``b [K, N]``, all bf16 (fp16/fp32 accepted: the CPU
interpreter runs fp16/fp32 because its bf16 dot is wrong). Output ``c [M, N]`` in the input dtype.
Constraints: 2-D, row-major contiguous, one dtype, K and N multiples of 8 (16-byte rows for TMA), M >= 1.
"""

from __future__ import annotations

import math

import torch

NAME = "lazy_prenorm"
VARIANTS = ("rmsnorm",)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ALIGN = 8  # elements: 16-byte rows for bf16 TMA descriptors


def torch_dtype(name: str) -> torch.dtype:
    """Map a dtype name ('bf16', 'fp16', 'fp32') to a torch dtype; ValueError lists the choices."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choices: {', '.join(DTYPES)}") from None


def check_shape(M: int, N: int, K: int) -> None:
    """Raise ValueError unless M >= 1 and K, N are positive multiples of 8 (16-byte bf16 rows for TMA)."""
    for name, v in (("M", M), ("N", N), ("K", K)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    for name, v in (("K", K), ("N", N)):
        if v % ALIGN:
            raise ValueError(f"{name}={v} must be a multiple of {ALIGN} (16-byte rows for TMA descriptors)")


def check_inputs(a: torch.Tensor, b: torch.Tensor, eps: float | None = None) -> tuple[int, int, int]:
    """Validate the kernel inputs ``a [M, K]`` and ``b [K, N]``; return (M, N, K).

    Raises TypeError for non-tensors, mixed or unsupported dtypes, and ValueError for wrong ranks, mismatched
    K, non-contiguous inputs, misaligned K/N, tensors on different devices or ``eps <= 0``.
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("a and b must be torch.Tensor")
    if a.dtype not in DTYPES.values() or b.dtype != a.dtype:
        raise TypeError(f"a and b must share one dtype of bf16/fp16/fp32, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D, got a.dim()={a.dim()}, b.dim()={b.dim()}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} (need a[M,K] @ b[K,N])")
    if a.device != b.device:
        raise ValueError(f"a and b are on different devices ({a.device}, {b.device})")
    if not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError("a and b must be row-major contiguous (call .contiguous())")
    if eps is not None and not (isinstance(eps, (int, float)) and eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    M, K = a.shape
    N = b.shape[1]
    check_shape(M, N, K)
    return M, N, K


def make_inputs(M: int, N: int, K: int, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0) -> dict:
    """Seeded random inputs for one shape, generated on ``device``: ``a [M,K]``, ``gamma [K]``, ``b [K,N]`` and
    ``b_folded = gamma * b`` (folded once here, outside any timed region).

    Rows of ``a`` have different scales (0.25..4) so that a wrong or missing rstd is visible; ``gamma`` is
    1 + 0.1 N(0,1); ``b`` is N(0, 1/K) so that outputs are O(1). Never zeros.
    """
    check_shape(M, N, K)
    dt = torch_dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    row_scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    a = (randn(M, K) * row_scale).to(dt)
    gamma = (1 + 0.1 * randn(K)).to(dt)
    b = (randn(K, N) / math.sqrt(K)).to(dt)
    return {"a": a, "gamma": gamma, "b": b, "b_folded": fold_gamma(gamma, b)}


def fold_gamma(gamma: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``diag(gamma) @ b`` computed in fp32 and rounded once to b's dtype (done once, outside timing)."""
    return (gamma.float()[:, None] * b.float()).to(b.dtype)


def rstd(a: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 ``rsqrt(mean(a^2, -1) + eps)`` per row of ``a [M, K]``; returns ``[M]`` fp32."""
    af = a.float()
    return torch.rsqrt(af.pow(2).mean(-1) + eps)


def rmsnorm(a: torch.Tensor, eps: float, gamma: torch.Tensor | None = None) -> torch.Tensor:
    """Standalone RMSNorm ``a * rstd (* gamma)`` in fp32 statistics, returned in a's dtype (the unfused norm)."""
    y = a.float() * rstd(a, eps)[:, None]
    if gamma is not None:
        y = y * gamma.float()
    return y.to(a.dtype)


def reference(inputs: dict, eps: float) -> torch.Tensor:
    """fp32 reference ``(rmsnorm(a, eps) * gamma) @ b`` (true fp32 matmul, TF32 off); returns fp32 ``[M, N]``."""
    a, gamma, b = inputs["a"], inputs["gamma"], inputs["b"]
    y = a.float() * rstd(a, eps)[:, None] * gamma.float()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return y @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def unfused_torch(inputs: dict, eps: float) -> torch.Tensor:
    """The same computation in the input dtype, the way an unfused PyTorch model does it:
    ``rmsnorm(a) * gamma`` rounded to the dtype, then ``@ b``. Its error sets the tolerance."""
    a, gamma, b = inputs["a"], inputs["gamma"], inputs["b"]
    return rmsnorm(a, eps, gamma) @ b


def tolerance(ref: torch.Tensor, same_dtype_out: torch.Tensor, atol_rel: float = 1e-3) -> float:
    """flash-attention's rule: a kernel passes when ``max|out - ref| <= 2 * max|torch_same_dtype - ref| + atol``,
    with ``atol = atol_rel * max|ref|``. Returns the threshold (same units as the output)."""
    err_torch = (same_dtype_out.float() - ref).abs().max().item()
    return 2.0 * err_torch + atol_rel * ref.abs().max().item()


def compare(out: torch.Tensor, ref: torch.Tensor, tol: float) -> dict:
    """Errors of ``out`` against the fp32 ``ref``: max_abs_err, rel_err (Frobenius), tol, ok (NaN never passes)."""
    diff = (out.float() - ref).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    rel = (diff.norm() / ref.norm().clamp_min(1e-30)).item() if diff.numel() else 0.0
    finite = bool(torch.isfinite(out.float()).all().item())
    return {"max_abs_err": max_abs, "rel_err": rel, "tol": tol, "ok": finite and max_abs <= tol}


# --- cost model ---------------------------------------------------------------------------------------------
def flops(impl: str, M: int, N: int, K: int) -> float:
    """Useful floating-point operations of ``impl`` ('fused', 'gemm', 'norm'): 2MNK for the GEMMs (the sum
    of squares, 2MK, is counted too for 'fused'), 3MK for the norm."""
    if impl in ("fused",):
        return 2.0 * M * N * K + 2.0 * M * K
    if impl in ("gemm", "cublas"):
        return 2.0 * M * N * K
    if impl in ("norm", "torch_compile_norm"):
        return 3.0 * M * K
    raise ValueError(f"unknown impl {impl!r}")


def bytes_moved(impl: str, M: int, N: int, K: int, itemsize: int = 2) -> float:
    """The fewest bytes ``impl`` must move through device memory (each input read once, each output written
    once): GEMM/fused ``(MK + KN + MN)·itemsize``; norm ``2·MK·itemsize`` (read A, write the normalized A)."""
    if impl in ("fused", "gemm", "cublas"):
        return float(M * K + K * N + M * N) * itemsize
    if impl in ("norm", "torch_compile_norm"):
        return 2.0 * M * K * itemsize
    raise ValueError(f"unknown impl {impl!r}")


# --- what each implementation computes, for the correctness check --------------------------------------------
IMPLS = ("fused", "gemm", "cublas", "torch_compile_norm")
NORM_IMPLS = ("torch_compile_norm",)


def references(impl: str, inputs: dict, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 reference, same-dtype PyTorch result) for what ``impl`` computes on ``inputs``:
    'fused' -> (rmsnorm(a)·gamma) @ b; 'gemm'/'cublas' -> a @ b_folded; 'torch_compile_norm' -> rmsnorm(a)
    (no affine: gamma is folded into b on both the fused and the unfused path)."""
    a, bf = inputs["a"], inputs["b_folded"]
    if impl == "fused":
        return reference(inputs, eps), unfused_torch(inputs, eps)
    if impl in ("gemm", "cublas"):
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            ref = a.float() @ bf.float()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        return ref, a @ bf
    if impl in NORM_IMPLS:
        return a.float() * rstd(a, eps)[:, None], rmsnorm(a, eps)
    raise ValueError(f"unknown impl {impl!r}; choices: {', '.join(IMPLS)}")


# --- how the worker calls each implementation ----------------------------------------------------------------
BASELINES = ("cublas", "torch_compile_norm")
KERNEL_FUNCTIONS = {"fused": "lazy_rmsnorm_matmul", "gemm": "matmul"}


def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """Name of the function implementing ``impl`` in every ``kernels_<dsl>/lazy_prenorm.py``."""
    if impl not in KERNEL_FUNCTIONS:
        raise ValueError(f"unknown impl {impl!r} for lazy_prenorm; choices: {', '.join(KERNEL_FUNCTIONS)}")
    return KERNEL_FUNCTIONS[impl]


def compile_inputs(M: int, N: int, K: int, dtype: str) -> tuple:
    """Uninitialized CPU tensors with the kernel's argument shapes, for the sm_90 compile-only check."""
    dt = torch_dtype(dtype)
    return torch.empty(M, K, dtype=dt), torch.empty(K, N, dtype=dt)


def check(impl: str, out: torch.Tensor, inputs: dict, eps: float, variant: str | None = None) -> dict:
    """Errors of ``out`` against the fp32 reference of ``impl``, with the flash-attention tolerance."""
    ref, same = references(impl, inputs, eps)
    return compare(out, ref, tolerance(ref, same))


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable running a DSL kernel on ``inputs``: ``matmul(a, b_folded)`` for 'gemm',
    ``lazy_rmsnorm_matmul(a, b_folded, eps)`` for 'fused' (gamma was folded once, in ``make_inputs``)."""
    a, bf = inputs["a"], inputs["b_folded"]
    if impl == "gemm":
        return lambda: kernel(a, bf, config=config)
    if impl == "fused":
        return lambda: kernel(a, bf, eps=eps, config=config)
    raise ValueError(f"unknown kernel impl {impl!r}; choices: fused, gemm")


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """Zero-argument callables for the unfused baselines: 'cublas' (``torch.matmul``, the GEMM of the unfused
    pair) and 'torch_compile_norm' (RMSNorm without affine, compiled by Inductor for this one shape: a dynamo
    reset, then ``dynamic=False``; one function reused across shapes turns dynamic and runs 1.5-2.5x slower).
    The blog's "% hidden" is relative to this norm."""
    a, bf = inputs["a"], inputs["b_folded"]
    if impl == "cublas":
        return lambda: torch.matmul(a, bf)
    if impl == "torch_compile_norm":
        torch._dynamo.reset()

        def rmsnorm_no_affine(x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

        compiled = torch.compile(rmsnorm_no_affine, dynamic=False)
        return lambda: compiled(a)
    raise ValueError(f"unknown baseline {impl!r}; choices: cublas, torch_compile_norm")


# --- the blog's B200 numbers (chart 5, RMSNorm, TLX, B200 @ 750 W, M = 262144), % of norm latency hidden -------
BLOG_HIDDEN_B200 = {
    (512, 512): 83.93, (512, 1024): 68.14, (512, 2048): 55.81,
    (1024, 512): 83.98, (1024, 1024): 73.62, (1024, 2048): 41.49,
    (2048, 512): 98.01, (2048, 1024): 89.13, (2048, 2048): 65.29,
}  # keys are (K, N)
