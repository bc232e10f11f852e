r"""Multi-CTA Norm Fusion: post-norm ``Y = norm(A @ B)`` (RMSNorm or LayerNorm over the rows of the GEMM output)
as a GEMM epilogue: the technique's math, inputs, reference, cost model and tolerance.

Math (BLOG section 3; fp32 statistics, output in the input dtype)::

    C = A @ B                                            A [M, K], B [K, N], fp32 accumulation
    RMSNorm:   rstd_i = rsqrt(sum_j C_ij^2 / N + eps);                     Y = C * rstd (* weight)
    LayerNorm: mean_i = sum_j C_ij / N; var_i = sum_j (C_ij - mean_i)^2 / N (biased)
               rstd_i = rsqrt(var_i + eps);                                 Y = (C - mean) * rstd (* weight + bias)

The statistics need a whole output row, but a GEMM tiles N across CTAs. The technique (BLOG, after QuACK): a
thread-block cluster of CTAs shares one M-tile and splits N; each CTA reduces its fp32 accumulator slice to
per-row partials, the partials are exchanged through distributed shared memory, and every CTA normalizes its own
slice in the epilogue. The normalized output is written once; the un-normalized C never reaches memory. The DSLs
without user-visible DSMEM (Triton, Helion) implement the best alternative they can express (see their modules).

Kernels return ``(y, rstd)`` (RMSNorm) or ``(y, mean, rstd)`` (LayerNorm) with fp32 ``[M]`` statistics, as the
backward pass needs them. The unfused pair it is measured against: the same DSL's GEMM (``gemm``: the Lazy
Pre-Norm module's plain ``matmul``) or cuBLAS, plus the torch.compile norm of the bf16 ``[M, N]`` GEMM output.

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(Meta's code: https://github.com/facebookresearch/ads_model_kernel_library/tree/main/multi_cta_norm_fusion);
QuACK's cluster reductions, https://github.com/Dao-AILab/quack/blob/main/media/2025-07-10-membound-sol.md .

Shapes and dtypes: ``a [M, K]``, ``b [K, N]``, ``weight``/``bias`` ``[N]`` in a's dtype or None; bf16 on the GPU
(fp16/fp32 accepted: the CPU interpreter runs fp16/fp32). Constraints: 2-D, row-major contiguous, one dtype, K and N
multiples of 8 (16-byte rows for TMA), 16-byte aligned data pointers, M >= 1 (``check_inputs``: every DSL's contract).
"""

from __future__ import annotations

import math

import torch

from normfuse.techniques import norms as _norms
from normfuse.techniques.lazy_prenorm import DTYPES, check_shape, compare, tolerance, torch_dtype  # noqa: F401
from normfuse.techniques.lazy_prenorm import check_inputs as _check_gemm_inputs
from normfuse.techniques.naive_fusion import _fp32_matmul, gemm_output  # noqa: F401  (same post-norm GEMM math)
from normfuse.validate import check_affine

NAME = "multi_cta"
VARIANTS = ("rmsnorm", "layernorm")
IMPLS = ("fused", "gemm")
NORM_IMPLS = _norms.NORM_IMPLS  # torch.compile (the "% hidden" reference), torch eager, Liger: the norms' baselines
BASELINES = ("cublas",) + NORM_IMPLS
# function name per variant of the fused op in every kernels_<dsl>/multi_cta.py; 'gemm' is `matmul` everywhere
KERNEL_FUNCTIONS = {"rmsnorm": "matmul_rmsnorm", "layernorm": "matmul_layernorm"}
STATS = {"rmsnorm": ("rstd",), "layernorm": ("mean", "rstd")}
STAT_RTOL = 1e-3  # fp32 statistics vs the fp32 reference


def _check_variant(variant) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choices: {', '.join(VARIANTS)}")
    return variant


def check_inputs(a: torch.Tensor, b: torch.Tensor, weight=None, bias=None, eps=None) -> tuple[int, int, int]:
    """Validate ``a [M, K]``, ``b [K, N]`` and the optional affine ``weight``/``bias`` ``[N]``; return (M, N, K).
    The one contract of every DSL's ``matmul_rmsnorm`` / ``matmul_layernorm``: the rules of
    ``normfuse.techniques.lazy_prenorm.check_inputs`` for ``a``/``b`` (one dtype of bf16/fp16/fp32, 2-D, row-major
    contiguous, 16-byte aligned, same device, K and N multiples of 8, M >= 1, eps finite > 0 when given) and
    ``normfuse.validate.check_affine`` for the affine vectors (contiguous ``[N]`` of a's dtype on a's device).

    Raises TypeError for non-tensors and mixed or unsupported dtypes (the affine vectors must have a's dtype), and
    ValueError for wrong ranks, mismatched K, non-contiguous or misaligned inputs, K or N not a multiple of 8,
    affine vectors of the wrong shape, device or layout, tensors on different devices, or a bad ``eps``.
    """
    M, N, K = _check_gemm_inputs(a, b, eps)
    check_affine("weight", weight, N, a, "a")
    check_affine("bias", bias, N, a, "a")
    return M, N, K


def make_inputs(M: int, N: int, K: int, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0,
                affine: bool = False, mean_shift: float = 0.0) -> dict:
    """Seeded random inputs for one shape, generated on ``device``: ``a [M, K]``, ``b [K, N]``, and ``weight``,
    ``bias`` ``[N]`` (None unless ``affine``).

    Rows of ``a`` have different scales (0.25..4), so a missing or wrong normalization is visible; ``b`` is
    N(0, 1/K) so that the outputs are O(row scale). ``mean_shift`` (default 0) adds ``mean_shift * g_k / sqrt(K)``
    to every column of row k of ``b`` (g ~ N(0, 1)), which shifts row i of ``a @ b`` by about ``mean_shift``
    times its spread: it stresses LayerNorm's variance (E[x^2] - mean^2 would cancel). ``weight`` is
    1 + 0.1 N(0,1), ``bias`` 0.1 N(0,1). Never zeros.
    """
    check_shape(M, N, K)
    dt = torch_dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    row_scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    a = (randn(M, K) * row_scale).to(dt)
    b = randn(K, N) / math.sqrt(K)
    if mean_shift:
        b = b + mean_shift * randn(K, 1) / math.sqrt(K)
    out = {"a": a, "b": b.to(dt), "weight": None, "bias": None}
    if affine:
        out["weight"] = (1 + 0.1 * randn(N)).to(dt)
        out["bias"] = (0.1 * randn(N)).to(dt)
    return out


def norm_reference(variant: str, x: torch.Tensor, eps: float, weight=None, bias=None) -> dict:
    """fp32 ``variant`` norm of the rows of ``x [M, N]`` (any dtype, upcast): {'y', 'rstd'[, 'mean']} in fp32;
    the standalone norms' reference (``normfuse.techniques.norms.reference``: two-pass LayerNorm)."""
    return _norms.reference(_check_variant(variant), {"x": x, "weight": weight, "bias": bias}, eps)


def reference(variant: str, inputs: dict, eps: float) -> dict:
    """fp32 reference of the fused op: ``norm(a @ b)`` with a true fp32 GEMM (TF32 off) and fp32 statistics;
    {'y': fp32 [M, N], 'rstd': [M], 'mean': [M] (LayerNorm)}."""
    c = _fp32_matmul(inputs["a"], inputs["b"])
    return norm_reference(variant, c, eps, inputs.get("weight"), inputs.get("bias"))


def same_dtype(variant: str, inputs: dict, eps: float) -> torch.Tensor:
    """The unfused PyTorch computation in the input dtype: ``C = a @ b`` rounded to the dtype, then
    ``F.rms_norm`` / ``F.layer_norm`` (fp32 statistics inside, output rounded). Its error sets the tolerance."""
    _check_variant(variant)
    a, b, w, bias = inputs["a"], inputs["b"], inputs.get("weight"), inputs.get("bias")
    c = a @ b
    return _torch_norm(variant, c, w, bias, eps)


def _torch_norm(variant: str, x: torch.Tensor, w, bias, eps: float) -> torch.Tensor:
    return _norms.same_dtype(variant, {"x": x, "weight": w, "bias": bias}, eps)


def check_stats(variant: str, stats: tuple, ref: dict) -> dict:
    """Compare the kernel's fp32 statistics with the reference: ``rstd`` to ``STAT_RTOL`` relative; ``mean`` to
    ``STAT_RTOL * (|mean| + std)`` absolute (a row mean near 0 has no meaningful relative error; ``std = 1/rstd``
    is the row's own scale). Returns {'<name>_rel_err': worst error in those units, 'stats_ok': bool}; a
    non-finite statistic must be non-finite in the reference too."""
    out, ok = {}, True
    for name, got in zip(STATS[_check_variant(variant)], stats):
        want = ref[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != torch.float32:
            return {**out, f"{name}_rel_err": float("inf"), "stats_ok": False}
        got = got.float()
        finite_ok = bool((torch.isfinite(got) == torch.isfinite(want)).all().item())
        if name == "rstd":
            scale = want.abs()
        else:
            scale = want.abs() + 1.0 / ref["rstd"].abs().clamp_min(1e-30)
        err = ((got - want).abs() / scale.clamp_min(1e-30)).nan_to_num(0.0, posinf=0.0).max().item() \
            if want.numel() else 0.0
        out[f"{name}_rel_err"] = err
        ok = ok and finite_ok and err <= STAT_RTOL
    out["stats_ok"] = ok
    return out


# --- cost model ---------------------------------------------------------------------------------------------
def flops(impl: str, M: int, N: int, K: int) -> float:
    """Useful floating-point operations: 2MNK for the GEMMs; the fused op adds ~5MN for the norm (statistics,
    scale, affine); the standalone norm ~5MN."""
    if impl in ("gemm", "cublas"):
        return 2.0 * M * N * K
    if impl == "fused":
        return 2.0 * M * N * K + 5.0 * M * N
    if impl in NORM_IMPLS:
        return 5.0 * M * N
    raise ValueError(f"unknown impl {impl!r}")


def bytes_moved(impl: str, M: int, N: int, K: int, itemsize: int = 2) -> float:
    """The fewest bytes ``impl`` must move through device memory (each input read once, each output written
    once): GEMM and fused ``(MK + KN + MN)·itemsize`` (+ 8M for the fp32 statistics, fused); the standalone norm
    ``2·MN·itemsize`` (read C, write Y). The unfused pair therefore moves ``2·MN·itemsize`` more than the fused
    kernel: the round trip of C."""
    if impl in ("gemm", "cublas"):
        return float(M * K + K * N + M * N) * itemsize
    if impl == "fused":
        return float(M * K + K * N + M * N) * itemsize + 8.0 * M
    if impl in NORM_IMPLS:
        return 2.0 * M * N * itemsize
    raise ValueError(f"unknown impl {impl!r}")


# --- how the worker calls each implementation ----------------------------------------------------------------
def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """``matmul_rmsnorm`` / ``matmul_layernorm`` (impl 'fused') or ``matmul`` (impl 'gemm') in every
    ``kernels_<dsl>/multi_cta.py``."""
    if impl == "gemm":
        return "matmul"
    if impl == "fused":
        return KERNEL_FUNCTIONS[_check_variant(variant)]
    raise ValueError(f"unknown impl {impl!r} for multi_cta; choices: {', '.join(IMPLS)}")


def compile_inputs(M: int, N: int, K: int, dtype: str) -> tuple:
    """Uninitialized CPU tensors with the kernel's argument shapes, for the sm_90 compile-only check."""
    dt = torch_dtype(dtype)
    return torch.empty(M, K, dtype=dt), torch.empty(K, N, dtype=dt)


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable running a DSL kernel: ``matmul(a, b)`` for 'gemm'; ``matmul_rmsnorm(a, b, weight,
    eps=)`` / ``matmul_layernorm(a, b, weight, bias, eps=)`` for 'fused'."""
    a, b, w, bias = inputs["a"], inputs["b"], inputs.get("weight"), inputs.get("bias")
    if impl == "gemm":
        return lambda: kernel(a, b, config=config)
    if impl != "fused":
        raise ValueError(f"unknown kernel impl {impl!r}; choices: fused, gemm")
    if _check_variant(variant) == "rmsnorm":
        return lambda: kernel(a, b, w, eps=eps, config=config)
    return lambda: kernel(a, b, w, bias, eps=eps, config=config)


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """Zero-argument callables for the unfused baselines: 'cublas' (``torch.matmul(a, b)``, the GEMM of the
    unfused pair) and 'torch_compile_norm' (the variant's norm, with the same affine, of the precomputed bf16
    GEMM output ``[M, N]``, compiled by Inductor for this one shape: a dynamo reset, then ``dynamic=False``).
    The blog's "% hidden" is relative to this norm."""
    a, b = inputs["a"], inputs["b"]
    if impl == "cublas":
        return lambda: torch.matmul(a, b)
    if impl in NORM_IMPLS:  # the standalone norms' baselines, on the precomputed GEMM output
        return _norms.baseline(impl, {"x": gemm_output(inputs), "weight": inputs.get("weight"),
                                      "bias": inputs.get("bias")}, eps, _check_variant(variant))
    raise ValueError(f"unknown baseline {impl!r}; choices: {', '.join(BASELINES)}")


def check(impl: str, out, inputs: dict, eps: float, variant: str | None = None) -> dict:
    """Errors of ``out`` against the fp32 reference of ``impl``, with the flash-attention tolerance
    (``lazy_prenorm.tolerance``: 2x the same-dtype PyTorch error + 1e-3 max|ref|):

    * 'fused': ``out = (y, rstd)`` or ``(y, mean, rstd)``; y against ``reference``, the statistics through
      ``check_stats`` (a failure there fails the check);
    * 'gemm' / 'cublas': ``a @ b`` against the fp32 GEMM;
    * 'torch_compile_norm': y against the fp32 norm of the bf16 GEMM output it was given.
    """
    if impl in ("gemm", "cublas"):
        ref = _fp32_matmul(inputs["a"], inputs["b"])
        return compare(out, ref, tolerance(ref, inputs["a"] @ inputs["b"]))
    variant = _check_variant(variant)
    w, bias = inputs.get("weight"), inputs.get("bias")
    if impl in NORM_IMPLS:
        c = gemm_output(inputs)
        ref = norm_reference(variant, c, eps, w, bias)
        y = out if isinstance(out, torch.Tensor) else out[0]
        return compare(y, ref["y"], tolerance(ref["y"], _torch_norm(variant, c, w, bias, eps)))
    if impl != "fused":
        raise ValueError(f"unknown impl {impl!r}; choices: {', '.join(IMPLS + BASELINES)}")
    if isinstance(out, torch.Tensor) or len(out) != 1 + len(STATS[variant]):
        raise ValueError(f"the fused {variant} kernel must return (y, {', '.join(STATS[variant])})")
    ref = reference(variant, inputs, eps)
    res = compare(out[0], ref["y"], tolerance(ref["y"], same_dtype(variant, inputs, eps)))
    st = check_stats(variant, tuple(out[1:]), ref)
    res.update({k: v for k, v in st.items() if k != "stats_ok"})
    res["ok"] = res["ok"] and st["stats_ok"]
    return res


# --- the blog's B200 numbers (chart 8, forward, TLX, B200 @ 750 W, M = 262144), % of norm latency hidden -------
BLOG_HIDDEN_B200 = {  # variant -> {(K, N): %}
    "rmsnorm": {
        (512, 512): 62.06, (512, 1024): 69.25, (512, 2048): 48.28,
        (1024, 512): 53.90, (1024, 1024): 49.47, (1024, 2048): 58.65,
        (2048, 512): 50.83, (2048, 1024): 71.95, (2048, 2048): 57.87,
    },
    "layernorm": {
        (512, 512): 52.53, (512, 1024): 90.49, (512, 2048): 50.03,
        (1024, 512): 60.95, (1024, 1024): 91.61, (1024, 2048): 56.51,
        (2048, 512): 73.13, (2048, 1024): 91.42, (2048, 2048): 58.92,
    },
}
