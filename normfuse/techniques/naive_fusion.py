r"""Naive fusion (post-norm GEMM with a full-N epilogue): the technique's math, inputs, references, cost model,
tolerance and baselines.

Math (fp32 statistics over the last dim N of the fp32 GEMM accumulator, output in the input dtype)::

    acc = a @ b                                                     a [M, K], b [K, N]
    LayerNorm (variant "layernorm"): mean = mean(acc); var = mean((acc - mean)^2); rstd = rsqrt(var + eps)
                                     y = (acc - mean) * rstd (* weight + bias)
    RMSNorm   (variant "rmsnorm"):   rstd = rsqrt(mean(acc^2) + eps);  y = acc * rstd (* weight)

The GEMM tile spans the whole N, so the epilogue sees complete rows and normalizes them before anything is
written: the unfused pair's round trip of C [M, N] through memory disappears. It only works for small N (the
accumulator of whole rows must fit in registers / shared memory); kernels raise ValueError beyond their limit and
the sweep records ``unsupported``. Kernels return ``(y, mean, rstd)`` (LayerNorm) or ``(y, rstd)`` (RMSNorm), the
statistics fp32 ``[M]``.

The unfused baseline is the GEMM (``cublas`` = ``torch.matmul``, or the same DSL's ``gemm``) followed by the norm
of its ``[M, N]`` output compiled by Inductor for that one shape (``torch_compile_norm``, the blog's reference
norm), so ``normfuse.metrics`` applies unchanged: ``hidden_dsl = (T_gemm_dsl + T_norm - T_fused) / T_norm``.

Source: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(section "Naive fusion"; chart 3: LayerNorm without affine, bf16, Helion, B200 @ 750 W, M = 262144); Helion's
``examples/matmul_layernorm.py``. Shapes and dtypes: ``a [M, K]``, ``b [K, N]`` row-major contiguous, one dtype
(bf16 on the GPU; fp16/fp32 for the CPU interpreter), K and N multiples of 8 (16-byte TMA rows), 16-byte aligned
data pointers, M >= 1; ``weight``/``bias`` ``[N]`` contiguous in a's dtype, or None (``check_inputs``).
"""

from __future__ import annotations

import math

import torch

from normfuse.techniques import norms as _norms
from normfuse.techniques.lazy_prenorm import DTYPES, check_shape, compare, tolerance, torch_dtype
from normfuse.techniques.lazy_prenorm import check_inputs as _check_gemm_inputs
from normfuse.validate import check_affine

__all__ = ["NAME", "VARIANTS", "IMPLS", "BASELINES", "NORM_IMPLS", "BLOG_HIDDEN_B200", "check_shape", "check_inputs",
           "make_inputs", "gemm_output", "reference", "same_dtype", "tolerance", "compare", "check", "flops",
           "bytes_moved", "kernel_function_name", "compile_inputs", "kernel_call", "baseline", "torch_dtype"]

NAME = "naive_fusion"
VARIANTS = ("layernorm", "rmsnorm")
IMPLS = ("fused", "gemm")  # the DSL kernels: fused = matmul_<variant>, gemm = the same DSL's plain GEMM
NORM_IMPLS = _norms.NORM_IMPLS  # torch.compile (the "% hidden" reference), torch eager, Liger: the norms' baselines
BASELINES = ("cublas",) + NORM_IMPLS
KERNEL_FUNCTIONS = {("fused", "layernorm"): "matmul_layernorm", ("fused", "rmsnorm"): "matmul_rmsnorm",
                    ("gemm", "layernorm"): "matmul", ("gemm", "rmsnorm"): "matmul"}
STATS_RTOL = 1e-3  # fp32 statistics: rstd relative error; mean error in units of the row's std (|dmean| * rstd)


def _check_variant(variant) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choices: {', '.join(VARIANTS)}")
    return variant


def check_inputs(a: torch.Tensor, b: torch.Tensor, weight=None, bias=None, eps=None) -> tuple[int, int, int]:
    """Validate ``a [M, K]``, ``b [K, N]`` (``lazy_prenorm.check_inputs``: one dtype of bf16/fp16/fp32, 2-D,
    contiguous, 16-byte aligned, same device, K and N multiples of 8, eps finite > 0 when given) and the optional
    affine ``weight``/``bias`` ``[N]`` (contiguous, a's dtype, a's device: ``normfuse.validate.check_affine``);
    return (M, N, K). The one contract of every DSL's ``matmul_layernorm`` / ``matmul_rmsnorm``; TypeError /
    ValueError name the violated constraint."""
    M, N, K = _check_gemm_inputs(a, b, eps)
    check_affine("weight", weight, N, a, "a")
    check_affine("bias", bias, N, a, "a")
    return M, N, K


def make_inputs(M: int, N: int, K: int, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0,
                affine: bool = False, mean_shift: float = 0.0) -> dict:
    """Seeded random inputs generated on ``device``: ``a [M, K]`` (rows scaled 0.25..4, so a wrong or missing rstd
    is visible), ``b [K, N]`` ~ N(0, 1/K) (outputs O(1)), and with ``affine`` ``weight`` 1 + 0.1 N(0,1) and ``bias``
    0.1 N(0,1) ``[N]`` (else None). ``mean_shift`` s != 0 adds ``s * row_scale`` to every output of a row (column 0
    of ``a`` is set to the row scale and row 0 of ``b`` to s), so |mean| ~ s * std: it stresses the LayerNorm
    variance (``E[x^2] - mean^2`` would cancel). Returns {"a", "b", "weight", "bias"}. Never zeros."""
    check_shape(M, N, K)
    dt = torch_dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    row_scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    a = torch.randn(M, K, generator=g, device=device) * row_scale
    b = torch.randn(K, N, generator=g, device=device) / math.sqrt(K)
    if mean_shift:
        a[:, 0] = row_scale[:, 0]
        b[0, :] = mean_shift
    out = {"a": a.to(dt), "b": b.to(dt), "weight": None, "bias": None}
    if affine:
        out["weight"] = (1 + 0.1 * torch.randn(N, generator=g, device=device)).to(dt)
        out["bias"] = (0.1 * torch.randn(N, generator=g, device=device)).to(dt)
    return out


def _fp32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference GEMM ``a @ b`` as fp32 ``[M, N]``: accumulated in fp64 (the products of bf16/fp16/fp32 values
    are exact there) and rounded once to fp32. An fp32 GEMM as the reference would carry rounding errors of the
    size the checks look for: at rows whose mean is 1000 std, K fp32 additions on top of the mean move the
    reference mean by ~1e-4 std, a tenth of the statistics' tolerance."""
    return (a.double() @ b.double()).float()


def gemm_output(inputs: dict) -> torch.Tensor:
    """``C = a @ b`` in the input dtype (the unfused GEMM's output, the norm baseline's input), computed once per
    ``inputs`` and cached in it under ``"c"`` (outside any timed region)."""
    if inputs.get("c") is None:
        inputs["c"] = inputs["a"] @ inputs["b"]
    return inputs["c"]


def reference(variant: str, inputs: dict, eps: float) -> dict:
    """fp32 reference of the fused kernel: the norm of the fp32 GEMM (TF32 off) of ``a`` and ``b``.
    Returns {'y': fp32 [M, N], 'rstd': fp32 [M], 'mean': fp32 [M] (LayerNorm only)}."""
    _check_variant(variant)
    acc = _fp32_matmul(inputs["a"], inputs["b"])
    return _norms.reference(variant, {"x": acc, "weight": inputs.get("weight"), "bias": inputs.get("bias")}, eps)


def same_dtype(variant: str, inputs: dict, eps: float) -> torch.Tensor:
    """The unfused computation in the input dtype, as a PyTorch model does it: ``C = a @ b`` rounded to the dtype,
    then ``F.layer_norm`` / ``F.rms_norm``. Its error against ``reference`` sets the tolerance."""
    _check_variant(variant)
    c = gemm_output(inputs)
    return _norms.same_dtype(variant, {"x": c, "weight": inputs.get("weight"), "bias": inputs.get("bias")}, eps)


def _stats_errors(variant: str, stats: tuple, ref: dict, same_mean: torch.Tensor | None = None) -> dict:
    """Errors of the kernel's fp32 statistics: rstd relative; mean in units of the row's std (|dmean| * rstd,
    which is what reaches y; a relative error would blow up for rows whose mean is near 0).

    With ``same_mean`` (the mean of the unfused same-dtype GEMM output, ``gemm_output``) the mean is judged by the
    same 3-way rule as y (flash-attention's: kernel vs fp32 reference within 2x the same-dtype path's error plus a
    small atol): a row passes when ``|dmean| <= STATS_RTOL * std + 2 * |same_mean - ref_mean|``, and
    ``mean_rel_err`` is ``|dmean| / (std + 2 * |same_mean - ref_mean| / STATS_RTOL)`` (<= STATS_RTOL passes; the
    plain ``|dmean| * rstd`` where the same-dtype mean is exact). Without it, at rows whose mean is ~1000 std, the
    bound would ask the fp32 mean of an fp32 GEMM for ~8 ulps of |mean|."""
    names = ("rstd",) if variant == "rmsnorm" else ("mean", "rstd")
    if len(stats) != len(names):  # a kernel bug, recorded as 'incorrect'
        return {"stats_error": f"{variant} kernels return (y, {', '.join(names)}); got {1 + len(stats)} tensors",
                "stats_ok": False}
    out, finite_ok = {}, True
    for name, got in zip(names, stats):
        want = ref[name]
        got = got.float()
        if name == "rstd":
            err = (got - want).abs() / want.abs().clamp_min(1e-30)
        else:
            std = 1.0 / ref["rstd"]
            slack = 0.0 if same_mean is None else 2.0 * (same_mean.float() - want).abs() / STATS_RTOL
            err = (got - want).abs() / (std + slack).clamp_min(1e-30)
        finite_ok &= bool((torch.isfinite(got) == torch.isfinite(want)).all().item())
        out[f"{name}_rel_err"] = err.nan_to_num(0.0).max().item() if err.numel() else 0.0
    out["stats_ok"] = finite_ok and all(v <= STATS_RTOL for v in out.values())
    return out


def check(impl: str, out, inputs: dict, eps: float, variant: str | None = None) -> dict:
    """Errors of ``out`` against the fp32 reference of ``impl`` with the flash-attention tolerance
    (``lazy_prenorm.tolerance``: 2 x the same-dtype PyTorch error + 1e-3 max|ref|):

    * 'fused': ``y`` against ``reference`` (norm of the fp32 GEMM), tolerance from the unfused same-dtype path;
      the kernel's fp32 statistics must match too (rstd to 1e-3 relative; the mean to 1e-3 of the row's std plus
      twice the error of the same-dtype path's mean: ``_stats_errors``).
    * 'gemm' / 'cublas': ``a @ b`` against the fp32 GEMM.
    * 'torch_compile_norm': the norm of the same-dtype ``C`` against its fp32 norm (``norms.check``).
    """
    if impl == "fused":
        variant = _check_variant(variant)
        ref = reference(variant, inputs, eps)
        if isinstance(out, torch.Tensor):  # a kernel bug (statistics missing), recorded as 'incorrect'
            out = (out,)
        res = compare(out[0], ref["y"], tolerance(ref["y"], same_dtype(variant, inputs, eps)))
        same_mean = gemm_output(inputs).float().mean(-1) if variant == "layernorm" else None
        st = _stats_errors(variant, tuple(out[1:]), ref, same_mean)
        res.update({k: v for k, v in st.items() if k != "stats_ok"})
        res["ok"] = res["ok"] and st["stats_ok"]
        return res
    if impl in ("gemm", "cublas"):
        ref = _fp32_matmul(inputs["a"], inputs["b"])
        return compare(out, ref, tolerance(ref, gemm_output(inputs)))
    if impl in NORM_IMPLS:
        variant = _check_variant(variant)
        x = {"x": gemm_output(inputs), "weight": inputs.get("weight"), "bias": inputs.get("bias")}
        return _norms.check("norm", out, x, eps, variant)
    raise ValueError(f"unknown impl {impl!r}; choices: {', '.join(IMPLS + BASELINES)}")


# --- cost model ---------------------------------------------------------------------------------------------
def flops(impl: str, M: int, N: int, K: int) -> float:
    """Useful floating-point operations: 2MNK for the GEMMs, plus ~4MN for the norm epilogue of 'fused'
    (reduce, centre/scale, affine); the standalone norm ~4MN (memory-bound anyway)."""
    if impl == "fused":
        return 2.0 * M * N * K + 4.0 * M * N
    if impl in ("gemm", "cublas"):
        return 2.0 * M * N * K
    if impl in NORM_IMPLS:
        return 4.0 * M * N
    raise ValueError(f"unknown impl {impl!r}")


def bytes_moved(impl: str, M: int, N: int, K: int, itemsize: int = 2) -> float:
    """The fewest bytes through device memory (inputs read once, outputs written once; the fp32 statistics,
    4-8 bytes a row, are left out): GEMM and fused ``(MK + KN + MN)·itemsize``; the norm ``2·MN·itemsize`` (read C,
    write y). The unfused pair moves ``2·MN·itemsize`` more than the fused kernel."""
    if impl in ("fused", "gemm", "cublas"):
        return float(M * K + K * N + M * N) * itemsize
    if impl in NORM_IMPLS:
        return 2.0 * M * N * itemsize
    raise ValueError(f"unknown impl {impl!r}")


# --- how the worker calls each implementation ----------------------------------------------------------------
def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """``matmul_layernorm`` / ``matmul_rmsnorm`` ('fused', by variant) or ``matmul`` ('gemm') in every
    ``kernels_<dsl>/naive_fusion.py``."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r} for naive_fusion; choices: {', '.join(IMPLS)}")
    return KERNEL_FUNCTIONS[(impl, _check_variant(variant))]


def compile_inputs(M: int, N: int, K: int, dtype: str) -> tuple:
    """Uninitialized CPU ``a [M, K]`` and ``b [K, N]`` for the sm_90 compile-only check."""
    dt = torch_dtype(dtype)
    return torch.empty(M, K, dtype=dt), torch.empty(K, N, dtype=dt)


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable running a DSL kernel: ``matmul(a, b)`` for 'gemm',
    ``matmul_layernorm(a, b, weight, bias, eps=)`` / ``matmul_rmsnorm(a, b, weight, eps=)`` for 'fused'."""
    a, b, w, bias = inputs["a"], inputs["b"], inputs.get("weight"), inputs.get("bias")
    if impl == "gemm":
        return lambda: kernel(a, b, config=config)
    if impl != "fused":
        raise ValueError(f"unknown kernel impl {impl!r}; choices: {', '.join(IMPLS)}")
    if _check_variant(variant) == "layernorm":
        return lambda: kernel(a, b, w, bias, eps=eps, config=config)
    return lambda: kernel(a, b, w, eps=eps, config=config)


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """Zero-argument callables for the unfused pair: 'cublas' (``torch.matmul(a, b)``) and 'torch_compile_norm'
    (``F.layer_norm`` / ``F.rms_norm`` of ``C = a @ b``, C computed once here, outside timing; compiled by Inductor
    for this one shape: a dynamo reset, then ``dynamic=False``, as one function reused across shapes turns
    dynamic and slow). The blog's "% hidden" is relative to this norm."""
    a, b = inputs["a"], inputs["b"]
    if impl == "cublas":
        return lambda: torch.matmul(a, b)
    if impl not in NORM_IMPLS:
        raise ValueError(f"unknown baseline {impl!r}; choices: {', '.join(BASELINES)}")
    variant = _check_variant(variant)
    return _norms.baseline(impl, {"x": gemm_output(inputs), "weight": inputs.get("weight"),
                                  "bias": inputs.get("bias")}, eps, variant)


# --- the blog's B200 numbers (chart 3: LayerNorm without affine, bf16, Helion, B200 @ 750 W, M = 262144) -------
BLOG_HIDDEN_B200 = {
    (64, 64): 25.63, (64, 128): 28.11, (128, 64): 17.24, (128, 128): 32.20,
    (128, 256): -2.46, (256, 128): -2.90, (256, 256): -64.38,
}  # keys are (K, N), values % of LayerNorm latency hidden
# Plots show hidden_best (against min(cuBLAS, the DSL's GEMM) + torch.compile norm): at K, N <= 512 the DSLs'
# tiled GEMMs reach only 60-100 % of cuBLAS, and hidden_dsl (against the DSL's own GEMM) then exceeds 100 %.
PRIMARY_METRIC = "hidden_best"
BLOG_VARIANT = "layernorm"  # the variant the blog's numbers are for (plots compare only that variant with them)
BLOG_LABEL = "blog, B200 @ 750 W (Helion)"
