r"""Lazy Pre-Norm (RMSNorm or LayerNorm -> GEMM): the technique's math, inputs, reference, cost model and tolerance.

Math, variant ``"rmsnorm"`` (BLOG section 2)::

    C = (rmsnorm(A, eps) * gamma) @ B
      = diag(rstd) @ (A @ (diag(gamma) @ B))        rstd_i = rsqrt(mean_k A_ik^2 + eps)

RMSNorm is a pure row scale, so it commutes with the GEMM: fold gamma into B once (``b_folded``, outside any
timed region), accumulate the per-row sum of squares of A in fp32 while the K-loop streams A for the MMA, and
scale the fp32 accumulator by ``rstd`` in the epilogue. The normalized activation is never written to memory.

Variant ``"layernorm"`` (our extension; the BLOG says the trick "does not work with LayerNorm", techniques.md §5).
With ``W' = diag(gamma) B`` (``b_folded``), ``s = colsum(W')`` and ``b' = beta @ B`` (both fp32 ``[N]``,
precomputed once outside timing by ``layernorm_vectors``)::

    C = (LN(A, eps) * gamma + beta) @ B
      = diag(rstd) (A - mean 1^T) W' + 1 b'
      = rstd ⊙ (A @ W')  -  (rstd * mean) ⊗ s  +  b'          mean_i = mean_k A_ik,  rstd_i = rsqrt(var_i + eps)

so LayerNorm becomes the same GEMM plus a rank-1 epilogue correction. The kernels accumulate the per-row
statistics in fp32 in the K loop, in shifted form (the "shifted data" one-pass algorithm, Chan, Golub & LeVeque,
"Algorithms for computing the sample variance", 1983): with the per-row shift ``c_i = A_i0`` (the row's first
element), ``S1 = sum_k (A_ik - c_i)`` and ``S2 = sum_k (A_ik - c_i)^2`` (padding columns masked to 0), then
``d = S1/K``, ``mean = c + d``, ``var = max(S2/K - d^2, 0)``. The shift removes the catastrophic cancellation
of the naive one-pass ``E[a^2] - E[a]^2`` when |mean| >> std (its fp32 relative error grows like (mean/std)^2;
the shifted form's like ((mean - c)/std)^2 = O(1)). What the shift cannot remove is the cancellation in the
epilogue: ``acc = A @ W'`` still carries the ``mean * s`` component, so the output's absolute error grows
roughly like ``eps_fp32 * |mean| * |s| * rstd`` (measured in ``experiments/lazy_ln_cancellation.py``).

**Documented limit of the LayerNorm variant: rows whose |mean| is at most 100 standard deviations.** Within it
the fused kernels meet the flash-attention tolerance (the emulation at ``mean_shift=100``: err/tol 0.44 in bf16,
0.22 in fp16, 0.10 in fp32; the GPU tests check ``mean_shift`` 10 and 100); at 1000 std the bf16 output error is
about 3-4x the tolerance (fp32 epilogue cancellation above), so inputs with larger row means need the
standalone LayerNorm (or the post-norm techniques, whose statistics come from the centred accumulator and have
no such limit). ``mean_shift`` here is added to every element of A, whose rows have std 0.25..4 (plus a per-row
mean of one std), so ``mean_shift=100`` puts |mean| at 25..400 std.

Source: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(the blog used eps = 1e-5; our default is 1e-6, as in Meta's TLX kernel, and it is configurable).

Shapes and dtypes: ``a [M, K]``, ``gamma [K]`` (and ``beta [K]`` for LayerNorm), ``b [K, N]``, all bf16
(fp16/fp32 accepted: the CPU interpreter runs fp16/fp32 because its bf16 dot is wrong); ``colsum``/``beta_b``
fp32 ``[N]``. Output ``c [M, N]`` in the input dtype.
Constraints: 2-D, row-major contiguous, one dtype, K and N multiples of 8 (16-byte rows for TMA), 16-byte aligned
data pointers (TMA bases: a view with a storage offset is rejected), M >= 1 (``check_inputs``, shared by the
naive-fusion and Multi-CTA specs).
"""

from __future__ import annotations

import math

import torch

from normfuse.validate import check_aligned, check_eps

NAME = "lazy_prenorm"
VARIANTS = ("rmsnorm", "layernorm")
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
    K, non-contiguous inputs, K/N not multiples of 8, data pointers not 16-byte aligned (a view with a storage
    offset: every DSL feeds a and b to TMA descriptors, so all three reject it alike, before anything is
    compiled or launched), tensors on different devices, or an ``eps`` that is given but not a finite
    number > 0 (``eps=None``: not checked here; the fused wrappers require it through
    ``normfuse.validate.check_eps``).
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
    if eps is not None:
        check_eps(eps)
    M, K = a.shape
    N = b.shape[1]
    check_shape(M, N, K)
    check_aligned(a, "a")
    check_aligned(b, "b")
    return M, N, K


def check_variant(variant: str | None) -> str:
    """``variant`` ('rmsnorm', 'layernorm'; None means 'rmsnorm'), else ValueError listing the choices."""
    if variant is None:
        return "rmsnorm"
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} for lazy_prenorm; choices: {', '.join(VARIANTS)}")
    return variant


def make_inputs(M: int, N: int, K: int, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0,
                variant: str | None = "rmsnorm", mean_shift: float = 0.0) -> dict:
    """Seeded random inputs for one shape, generated on ``device``: ``a [M,K]``, ``gamma [K]``, ``b [K,N]`` and
    ``b_folded = gamma * b`` (folded once here, outside any timed region). For ``variant="layernorm"`` also
    ``beta [K]`` and the fp32 ``[N]`` epilogue vectors ``colsum``, ``beta_b`` (``layernorm_vectors``).

    Rows of ``a`` have different scales (0.25..4) so that a wrong or missing rstd is visible; ``gamma`` is
    1 + 0.1 N(0,1); ``b`` is N(0, 1/K) so that outputs are O(1). Never zeros. ``mean_shift`` (default 0.0) is
    added to every element of ``a`` (before the cast to ``dtype``) to stress the one-pass LayerNorm statistics.
    For LayerNorm, every row also gets its own mean, N(0,1) times its scale (drawn after everything else), so
    that a kernel that drops the mean correction fails the check even at ``mean_shift=0``; ``beta`` is
    0.1 N(0,1). The rmsnorm inputs are the same bit for bit as before the LayerNorm variant existed.
    """
    check_shape(M, N, K)
    variant = check_variant(variant)
    if isinstance(mean_shift, bool) or not isinstance(mean_shift, (int, float)) or not math.isfinite(mean_shift):
        raise ValueError(f"mean_shift must be a finite number, got {mean_shift!r}")
    dt = torch_dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    row_scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    a = randn(M, K) * row_scale
    gamma = (1 + 0.1 * randn(K)).to(dt)
    b = (randn(K, N) / math.sqrt(K)).to(dt)
    out = {"gamma": gamma, "b": b, "b_folded": fold_gamma(gamma, b)}
    if variant == "layernorm":
        beta = (0.1 * randn(K)).to(dt)
        a = a + randn(M, 1) * row_scale  # per-row means: the rank-1 mean correction must be right
        out["beta"] = beta
        out["colsum"], out["beta_b"] = layernorm_vectors(out["b_folded"], beta, b)
    if mean_shift:
        a = a + float(mean_shift)
    return {"a": a.to(dt), **out}


def fold_gamma(gamma: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``diag(gamma) @ b`` computed in fp32 and rounded once to b's dtype (done once, outside timing)."""
    return (gamma.float()[:, None] * b.float()).to(b.dtype)


def layernorm_vectors(b_folded: torch.Tensor, beta: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LayerNorm epilogue vectors, fp32 ``[N]``, computed once outside timing (like ``b_folded``):
    ``colsum = sum_k b_folded[k, :]`` -- of the *rounded* ``b_folded`` that the kernel multiplies with, so that
    ``mean * colsum`` cancels the mean component of ``A @ b_folded`` up to fp32 rounding -- and
    ``beta_b = beta @ b`` (fp32 products and sums of the input-dtype values)."""
    colsum = b_folded.float().sum(0)
    beta_b = (beta.float()[:, None] * b.float()).sum(0)
    return colsum.contiguous(), beta_b.contiguous()


def layernorm_stats(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 two-pass ``(mean, rstd)`` per row of ``a [M, K]`` (biased variance): the reference statistics."""
    af = a.float()
    mean = af.mean(-1)
    var = (af - mean[:, None]).pow(2).mean(-1)
    return mean, torch.rsqrt(var + eps)


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


def reference(inputs: dict, eps: float, variant: str | None = "rmsnorm") -> torch.Tensor:
    """fp32 reference (true fp32 matmul, TF32 off); returns fp32 ``[M, N]``. 'rmsnorm':
    ``(rmsnorm(a, eps) * gamma) @ b``; 'layernorm': ``(LN(a, eps) * gamma + beta) @ b`` with two-pass fp32
    statistics, i.e. ``LN(a)·γ @ b + β @ b``."""
    variant = check_variant(variant)
    a, gamma, b = inputs["a"], inputs["gamma"], inputs["b"]
    if variant == "layernorm":
        mean, rs = layernorm_stats(a, eps)
        y = (a.float() - mean[:, None]) * rs[:, None] * gamma.float() + inputs["beta"].float()
    else:
        y = a.float() * rstd(a, eps)[:, None] * gamma.float()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return y @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def unfused_torch(inputs: dict, eps: float, variant: str | None = "rmsnorm") -> torch.Tensor:
    """The same computation in the input dtype, the way an unfused PyTorch model does it:
    ``rmsnorm(a) * gamma`` (or ``F.layer_norm(a, (K,), gamma, beta)``) rounded to the dtype, then ``@ b``.
    Its error sets the tolerance."""
    variant = check_variant(variant)
    a, gamma, b = inputs["a"], inputs["gamma"], inputs["b"]
    if variant == "layernorm":
        return torch.nn.functional.layer_norm(a, (a.shape[-1],), gamma, inputs["beta"], eps) @ b
    return rmsnorm(a, eps, gamma) @ b


def layernorm_stats_onepass(a: torch.Tensor, eps: float, *, block_k: int = 64,
                            shift: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused kernels' one-pass LayerNorm statistics, emulated in torch: per row, fp32 sums accumulated one K
    tile of ``block_k`` columns at a time, shifted by the row's first element ``c`` when ``shift`` (what the kernels
    do) or not (the naive ``E[a^2] - E[a]^2``, for comparison). Returns fp32 ``(mean, rstd, d, c)`` ``[M]`` with
    ``d = mean - c``."""
    af = a.float()
    M, K = af.shape
    c = af[:, 0] if shift else torch.zeros(M, dtype=torch.float32, device=a.device)
    s1 = torch.zeros(M, dtype=torch.float32, device=a.device)
    s2 = torch.zeros(M, dtype=torch.float32, device=a.device)
    for k0 in range(0, K, block_k):
        y = af[:, k0:k0 + block_k] - c[:, None]
        s1 += y.sum(-1)
        s2 += (y * y).sum(-1)
    d = s1 / K
    rs = torch.rsqrt(torch.clamp(s2 / K - d * d, min=0.0) + eps)
    return c + d, rs, d, c


def split3(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``x`` as three ``dtype`` parts whose fp32 sum is ``x`` to ~24 bits (bf16): each part rounds the
    remainder of the previous ones. The kernels' ``_split3``."""
    x1 = x.to(dtype)
    r = x - x1.float()
    x2 = r.to(dtype)
    return x1, x2, (r - x2.float()).to(dtype)


def layernorm_ext_operands(c, d, rstd, colsum, beta_b, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands of the kernels' rank-1 epilogue MMA (``_ln_a_ext`` / ``_ln_b_ext``): ``A_ext [M, 16]`` with
    columns ``-c, -c, -c, -d1, -d1, -d2, s1, s1, s2, 0...`` and ``B_ext [16, N]`` with rows ``cs1, cs2, cs3, cs1, cs2,
    cs1, bb1, bb2, bb1, 0...`` (``dtype`` splits of d, s = 1/rstd, colsum, beta_b), so that
    ``A_ext @ B_ext ~= -(c + d) ⊗ colsum + (1/rstd) ⊗ beta_b``."""
    M, N = c.shape[0], colsum.shape[0]
    d1, d2, _ = split3(d, dtype)
    s1, s2, _ = split3(1.0 / rstd, dtype)
    cs1, cs2, cs3 = split3(colsum.float(), dtype)
    bb1, bb2, _ = split3(beta_b.float(), dtype)
    a_ext = torch.zeros(M, 16, dtype=dtype, device=c.device)
    b_ext = torch.zeros(16, N, dtype=dtype, device=c.device)
    for j, (col, row) in enumerate([(-c.to(dtype), cs1), (-c.to(dtype), cs2), (-c.to(dtype), cs3), (-d1, cs1),
                                    (-d1, cs2), (-d2, cs1), (s1, bb1), (s1, bb2), (s2, bb1)]):
        a_ext[:, j] = col
        b_ext[j] = row
    return a_ext, b_ext


def lazy_layernorm_emulated(a: torch.Tensor, b_folded: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor,
                            eps: float, *, block_k: int = 64, shift: bool = True, epilogue: str = "fp32") -> torch.Tensor:
    """The fused LayerNorm kernels' arithmetic, emulated in torch (returns fp32 ``[M, N]``, before the output cast):
    fp32 accumulator ``a @ b_folded`` (products of the input-dtype values, fp32 sums), the one-pass statistics of
    ``layernorm_stats_onepass`` (``shift`` as there), and the epilogue: ``"fp32"`` (the broadcast epilogue,
    ``rstd * acc - rstd * mean * colsum + beta_b`` in fp32) or ``"mma"`` (the extra-MMA epilogue:
    ``rstd * (acc + A_ext @ B_ext)`` with the input-dtype splits of ``layernorm_ext_operands``). Used by
    ``experiments/lazy_ln_cancellation.py`` and the tests to measure the one-pass cancellation without a GPU."""
    if epilogue not in ("fp32", "mma"):
        raise ValueError(f"epilogue must be 'fp32' or 'mma', got {epilogue!r}")
    mean, rs, d, c = layernorm_stats_onepass(a, eps, block_k=block_k, shift=shift)
    acc = a.float() @ b_folded.float()
    if epilogue == "mma":
        a_ext, b_ext = layernorm_ext_operands(c, d, rs, colsum, beta_b, a.dtype)
        return (acc + a_ext.float() @ b_ext.float()) * rs[:, None]
    return acc * rs[:, None] - (rs * mean)[:, None] * colsum.float()[None, :] + beta_b.float()[None, :]


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


def references(impl: str, inputs: dict, eps: float, variant: str | None = "rmsnorm") -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 reference, same-dtype PyTorch result) for what ``impl`` computes on ``inputs``:
    'fused' -> (rmsnorm(a)·gamma) @ b or (LN(a)·gamma + beta) @ b; 'gemm'/'cublas' -> a @ b_folded;
    'torch_compile_norm' -> rmsnorm(a) or LN(a) (no affine: gamma and beta are folded into the GEMM on both the
    fused and the unfused path)."""
    variant = check_variant(variant)
    a, bf = inputs["a"], inputs["b_folded"]
    if impl == "fused":
        return reference(inputs, eps, variant), unfused_torch(inputs, eps, variant)
    if impl in ("gemm", "cublas"):
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            ref = a.float() @ bf.float()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        return ref, a @ bf
    if impl in NORM_IMPLS:
        if variant == "layernorm":
            mean, rs = layernorm_stats(a, eps)
            return ((a.float() - mean[:, None]) * rs[:, None],
                    torch.nn.functional.layer_norm(a, (a.shape[-1],), None, None, eps))
        return a.float() * rstd(a, eps)[:, None], rmsnorm(a, eps)
    raise ValueError(f"unknown impl {impl!r}; choices: {', '.join(IMPLS)}")


# --- how the worker calls each implementation ----------------------------------------------------------------
BASELINES = ("cublas", "torch_compile_norm")
KERNEL_FUNCTIONS = {"fused": "lazy_rmsnorm_matmul", "gemm": "matmul"}
LAYERNORM_FUSED_FUNCTION = "lazy_layernorm_matmul"


def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """Name of the function implementing ``impl`` in every ``kernels_<dsl>/lazy_prenorm.py``: 'fused' is
    ``lazy_rmsnorm_matmul`` (variant 'rmsnorm' or None) or ``lazy_layernorm_matmul``; 'gemm' is ``matmul``."""
    if impl not in KERNEL_FUNCTIONS:
        raise ValueError(f"unknown impl {impl!r} for lazy_prenorm; choices: {', '.join(KERNEL_FUNCTIONS)}")
    if impl == "fused" and check_variant(variant) == "layernorm":
        return LAYERNORM_FUSED_FUNCTION
    return KERNEL_FUNCTIONS[impl]


def compile_inputs(M: int, N: int, K: int, dtype: str) -> tuple:
    """Uninitialized CPU tensors with the kernel's argument shapes, for the sm_90 compile-only check (the
    LayerNorm kernels' ``compile_sm90`` allocates the fp32 ``[N]`` epilogue vectors itself when not given)."""
    dt = torch_dtype(dtype)
    return torch.empty(M, K, dtype=dt), torch.empty(K, N, dtype=dt)


def check_layernorm_vectors(colsum, beta_b, N: int, device) -> None:
    """Validate the LayerNorm epilogue vectors: fp32 tensors of shape ``[N]``, contiguous, on ``device``.
    Raises TypeError (not a tensor, not fp32) or ValueError (shape, contiguity, device), naming the argument."""
    for name, v in (("colsum", colsum), ("beta_b", beta_b)):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (fp32 [N]), got {type(v).__name__}")
        if v.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (fp32 epilogue vector), got {v.dtype}")
        if v.shape != (N,):
            raise ValueError(f"{name} must have shape [N] = [{N}], got {tuple(v.shape)}")
        if not v.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if v.device != device:
            raise ValueError(f"{name} is on {v.device}, a and b on {device}")


def check(impl: str, out: torch.Tensor, inputs: dict, eps: float, variant: str | None = None) -> dict:
    """Errors of ``out`` against the fp32 reference of ``impl``, with the flash-attention tolerance."""
    ref, same = references(impl, inputs, eps, variant)
    return compare(out, ref, tolerance(ref, same))


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable running a DSL kernel on ``inputs``: ``matmul(a, b_folded)`` for 'gemm',
    ``lazy_rmsnorm_matmul(a, b_folded, eps)`` or ``lazy_layernorm_matmul(a, b_folded, colsum, beta_b, eps)`` for
    'fused' (gamma was folded, and colsum / beta_b computed, once in ``make_inputs``)."""
    a, bf = inputs["a"], inputs["b_folded"]
    if impl == "gemm":
        return lambda: kernel(a, bf, config=config)
    if impl == "fused":
        if check_variant(variant) == "layernorm":
            cs, bb = inputs["colsum"], inputs["beta_b"]
            return lambda: kernel(a, bf, cs, bb, eps=eps, config=config)
        return lambda: kernel(a, bf, eps=eps, config=config)
    raise ValueError(f"unknown kernel impl {impl!r}; choices: fused, gemm")


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """Zero-argument callables for the unfused baselines: 'cublas' (``torch.matmul``, the GEMM of the unfused
    pair) and 'torch_compile_norm' (RMSNorm, or LayerNorm via ``F.layer_norm``, without affine, compiled by
    Inductor for this one shape: a dynamo reset, then ``dynamic=False``; one function reused across shapes turns
    dynamic and runs 1.5-2.5x slower). The blog's "% hidden" is relative to this norm."""
    variant = check_variant(variant)
    a, bf = inputs["a"], inputs["b_folded"]
    if impl == "cublas":
        return lambda: torch.matmul(a, bf)
    if impl == "torch_compile_norm":
        torch._dynamo.reset()

        def rmsnorm_no_affine(x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

        def layernorm_no_affine(x):
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), None, None, eps)

        fn = layernorm_no_affine if variant == "layernorm" else rmsnorm_no_affine
        compiled = torch.compile(fn, dynamic=False)
        return lambda: compiled(a)
    raise ValueError(f"unknown baseline {impl!r}; choices: cublas, torch_compile_norm")


# --- the blog's B200 numbers (chart 5, RMSNorm, TLX, B200 @ 750 W, M = 262144), % of norm latency hidden -------
# The naive-fusion form of pre-norm (the "prologue": rstd of the tile's rows over all of K, then the GEMM)
# is the tile-schedule `prepass` tiling of this technique (every (m, n) tile first loops over K for its rows' rstd,
# then runs the GEMM; the row-block schedules compute rstd once per row block and are Lazy Pre-Norm proper). Reports
# draw its best row beside the Lazy Pre-Norm results. A regular expression over config names:
NAIVE_CONFIG_MARKER = r"^(?!.*rowblock).*-prepass$"
NAIVE_LABEL = "naive fusion (per-tile rstd prologue)"
BLOG_VARIANT = "rmsnorm"  # the blog measured RMSNorm only: no blog column next to the LayerNorm variant
BLOG_HIDDEN_B200 = {
    (512, 512): 83.93, (512, 1024): 68.14, (512, 2048): 55.81,
    (1024, 512): 83.98, (1024, 1024): 73.62, (1024, 2048): 41.49,
    (2048, 512): 98.01, (2048, 1024): 89.13, (2048, 2048): 65.29,
}  # keys are (K, N)
