r"""Standalone RMSNorm and LayerNorm (forward) over the last dimension: the denominators of every "% hidden"
figure, and the first thing a reader compares across DSLs.

Math (fp32 statistics, output in the input dtype)::

    RMSNorm:   rstd = rsqrt(mean(x^2) + eps);                   y = x * rstd (* weight)
    LayerNorm: mean = mean(x); var = mean((x - mean)^2) (biased); rstd = rsqrt(var + eps)
               y = (x - mean) * rstd (* weight + bias)

Kernels return ``y`` plus the fp32 statistics ``rstd [M]`` (and ``mean [M]`` for LayerNorm), as the fused
kernels' backward passes need them. Shapes: ``x [M, N]`` (any M >= 1, any N >= 1: kernels mask the row tail),
``weight``/``bias`` ``[N]`` of x's dtype, or None. Dtypes: bf16 on the GPU; fp16/fp32 too (the CPU interpreter
runs fp16/fp32). Any data pointer for x (plain loads; ``check_inputs`` is every DSL's contract).

Status: kernels are CPU-checked (interpreter / ref mode / sm_90 compile); GPU measurements are open work.
Source of the comparison numbers: torch.compile (the blog's reference norm), QuACK's memory-bound kernels
(https://github.com/Dao-AILab/quack/blob/main/media/2025-07-10-membound-sol.md).
"""

from __future__ import annotations

import torch

from normfuse.techniques.lazy_prenorm import DTYPES, compare, torch_dtype  # noqa: F401  (shared helpers)
from normfuse.validate import check_affine, check_eps

NAME = "norms"
VARIANTS = ("rmsnorm", "layernorm")
IMPLS = ("norm",)
NORM_IMPLS = ("torch_compile_norm", "torch_eager_norm", "liger_norm")
# kernel function name per variant in kernels_<dsl>/norms.py
KERNEL_FUNCTIONS = {"rmsnorm": "rms_norm", "layernorm": "layer_norm"}
# judged by the speed ratio to torch.compile's kernel for the same shape (>= 1: at least as fast; issue 13's target:
# never slower beyond the measurement interval, i.e. not "missed")
PRIMARY_METRIC = "compile_ratio"
TARGETS = {"compile_ratio": 1.0}


def check_shape(M: int, N: int, K=None) -> None:
    """Raise ValueError unless M and N are positive integers (K is not used by this technique)."""
    for name, v in (("M", M), ("N", N)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def check_inputs(x: torch.Tensor, weight=None, bias=None, eps=None) -> tuple[int, int]:
    """Validate ``x [M, N]`` and the optional affine ``weight``/``bias`` ``[N]``; return (M, N). The one contract
    of every DSL's ``rms_norm`` / ``layer_norm`` (each wrapper calls it before anything is compiled or launched).

    ``x``: bf16/fp16/fp32, 2-D, row-major contiguous (any data pointer: the kernels use plain loads, and Triton's
    launch specialization only vectorizes 16-byte accesses when the pointer is 16-byte aligned). ``weight`` /
    ``bias``: None or a contiguous ``[N]`` tensor of x's dtype on x's device (``normfuse.validate.check_affine``).
    ``eps``: checked when given (a finite number > 0; None means "not given", and the wrappers require it).

    Raises TypeError for non-tensors, unsupported dtypes and an affine vector of another dtype, ValueError for a
    wrong rank, non-contiguous ``x``, M or N < 1, affine vectors of the wrong shape, device or layout, and a bad
    ``eps``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES.values():
        raise TypeError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, N], got {x.dim()}-D")
    if not x.is_contiguous():
        raise ValueError("x must be row-major contiguous (call .contiguous())")
    M, N = x.shape
    check_shape(M, N)
    check_affine("weight", weight, N, x)
    check_affine("bias", bias, N, x)
    if eps is not None:
        check_eps(eps)
    return M, N


def make_inputs(M: int, N: int, K=None, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0,
                affine: bool = False, mean_shift: float = 0.0) -> dict:
    """Seeded random ``x [M, N]`` (rows scaled 0.25..4, plus ``mean_shift`` to stress one-pass variance),
    and with ``affine`` a ``weight`` 1 + 0.1 N(0,1) and ``bias`` 0.1 N(0,1). Never zeros."""
    check_shape(M, N)
    dt = torch_dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    x = (torch.randn(M, N, generator=g, device=device) * scale + mean_shift).to(dt)
    out = {"x": x, "weight": None, "bias": None}
    if affine:
        out["weight"] = (1 + 0.1 * torch.randn(N, generator=g, device=device)).to(dt)
        out["bias"] = (0.1 * torch.randn(N, generator=g, device=device)).to(dt)
    return out


def reference(variant: str, inputs: dict, eps: float) -> dict:
    """fp32 reference: {'y': fp32 [M, N], 'rstd': [M], 'mean': [M] (LayerNorm only)}."""
    x = inputs["x"].float()
    w, b = inputs.get("weight"), inputs.get("bias")
    if variant == "rmsnorm":
        rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
        y = x * rstd[:, None]
        out = {"rstd": rstd}
    elif variant == "layernorm":
        mean = x.mean(-1)
        rstd = torch.rsqrt((x - mean[:, None]).pow(2).mean(-1) + eps)
        y = (x - mean[:, None]) * rstd[:, None]
        out = {"mean": mean, "rstd": rstd}
    else:
        raise ValueError(f"unknown variant {variant!r}; choices: {', '.join(VARIANTS)}")
    if w is not None:
        y = y * w.float()
    if b is not None and variant == "layernorm":
        y = y + b.float()
    return {"y": y, **out}


def same_dtype(variant: str, inputs: dict, eps: float) -> torch.Tensor:
    """The output as PyTorch computes it in the input dtype (fp32 statistics, then rounded); sets the tolerance."""
    x, w, b = inputs["x"], inputs.get("weight"), inputs.get("bias")
    if variant == "rmsnorm":
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def tolerance(ref_y: torch.Tensor, same_y: torch.Tensor, atol_rel: float = 1e-3) -> float:
    """flash-attention's rule, as in ``lazy_prenorm.tolerance``: 2·max|same-dtype − ref| + atol_rel·max|ref|."""
    err = (same_y.float() - ref_y).abs().max().item() if ref_y.numel() else 0.0
    return 2.0 * err + atol_rel * (ref_y.abs().max().item() if ref_y.numel() else 0.0)


def flops(impl: str, M: int, N: int, K=None) -> float:
    """About 4 operations per element (square/subtract, accumulate, scale, cast); memory-bound anyway."""
    return 4.0 * M * N


def bytes_moved(impl: str, M: int, N: int, K=None, itemsize: int = 2) -> float:
    """The fewest bytes: read x, write y (the fp32 statistics, 4-8 bytes a row, are ignored)."""
    return 2.0 * M * N * itemsize


def add_metrics(df):
    """Technique metric of a run or of one paired round (``normfuse.metrics.add_technique_metrics`` calls it):
    ``compile_ratio = T_torch_compile_norm / T`` (a ratio; > 1 = faster than torch.compile's kernel for the same
    shape, variant, M, N and dtype) for every timed row of a shape that has a torch.compile row. Returns a copy of
    the pandas DataFrame with that column."""
    import numpy as np
    import pandas as pd

    df = df.copy()
    df["compile_ratio"] = np.nan
    t = pd.to_numeric(df["p50_ms"], errors="coerce") if "p50_ms" in df else pd.Series(np.nan, index=df.index)
    ok = (df["status"] == "ok") & df["technique"].eq(NAME) & t.notna()
    keys = [df[c] for c in ("variant", "M", "N", "dtype")]
    t_ref = t.where(ok & (df["impl"] == "torch_compile_norm")).groupby(keys, dropna=False).transform("min")
    df.loc[ok, "compile_ratio"] = (t_ref / t)[ok]
    return df


# --- how the worker calls each implementation ----------------------------------------------------------------
BASELINES = NORM_IMPLS


def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """``rms_norm`` or ``layer_norm`` in every ``kernels_<dsl>/norms.py``."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r} for norms; choices: {', '.join(IMPLS)}")
    if variant not in KERNEL_FUNCTIONS:
        raise ValueError(f"unknown variant {variant!r}; choices: {', '.join(VARIANTS)}")
    return KERNEL_FUNCTIONS[variant]


def compile_inputs(M: int, N: int, K, dtype: str) -> tuple:
    """An uninitialized CPU ``x [M, N]`` for the sm_90 compile-only check."""
    return (torch.empty(M, N, dtype=torch_dtype(dtype)),)


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable running a DSL norm kernel (returns ``(y, rstd)`` or ``(y, mean, rstd)``)."""
    x, w, b = inputs["x"], inputs.get("weight"), inputs.get("bias")
    if variant == "rmsnorm":
        return lambda: kernel(x, w, eps=eps, config=config)
    return lambda: kernel(x, w, b, eps=eps, config=config)


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """Zero-argument callables for the baselines:

    * 'torch_eager_norm' — ``F.rms_norm`` / ``F.layer_norm``;
    * 'torch_compile_norm' — the same compiled by Inductor for this one shape (``dynamic=False`` after a dynamo
      reset);
    * 'liger_norm' — Liger-Kernel's Triton forward (https://github.com/linkedin/Liger-Kernel,
      ``liger_kernel.ops.{rms_norm,layer_norm}``; returns y only). Liger's LayerNorm requires an affine, so without
      one it gets weight = 1 and bias = 0 (2N extra bytes read per row block: negligible). Raises
      NotImplementedError (recorded as ``unsupported``) where liger-kernel is not installed."""
    if impl not in BASELINES:
        raise ValueError(f"unknown baseline {impl!r}; choices: {', '.join(BASELINES)}")
    x, w, b = inputs["x"], inputs.get("weight"), inputs.get("bias")
    N = x.shape[-1]
    if impl == "liger_norm":
        return _liger(variant, x, w, b, eps)
    if variant == "rmsnorm":
        def fn(x):
            return torch.nn.functional.rms_norm(x, (N,), w, eps)
    else:
        def fn(x):
            return torch.nn.functional.layer_norm(x, (N,), w, b, eps)
    if impl == "torch_compile_norm":
        torch._dynamo.reset()
        fn = torch.compile(fn, dynamic=False)
    return lambda: fn(x)


def _liger(variant: str, x: torch.Tensor, w, b, eps: float):
    try:
        from liger_kernel.ops.layer_norm import layer_norm_forward
        from liger_kernel.ops.rms_norm import rms_norm_forward
    except ImportError as e:
        raise NotImplementedError(f"liger-kernel is not installed ({e})") from None
    if variant == "rmsnorm":
        return lambda: rms_norm_forward(x, w, eps, 0.0, "llama", None)[0]
    w = w if w is not None else torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    b = b if b is not None else torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device)
    return lambda: layer_norm_forward(x, w, b, eps)[0]


def check(impl: str, out, inputs: dict, eps: float, variant: str | None = None,
          chunk_elems: int = 1 << 27) -> dict:
    """Errors of ``y`` against the fp32 reference (flash-attention tolerance); the kernels' fp32 statistics must
    match the reference to 1e-3 (rstd: relative; mean: relative to max(|mean|, row std), i.e. its effect on y),
    else the check fails. ``out`` is ``y`` or
    ``(y, [mean,] rstd)``.

    Rows are independent, so the reference is computed in row chunks of at most ``chunk_elems`` elements: a
    262144 x 32768 bf16 input (17 GB) would otherwise need ~100 GB of fp32 temporaries. The result is the same
    as one whole-tensor comparison (max errors, Frobenius norms and the tolerance are merged over chunks)."""
    x, w, b = inputs["x"], inputs.get("weight"), inputs.get("bias")
    y, stats = (out, ()) if isinstance(out, torch.Tensor) else (out[0], tuple(out[1:]))
    names = ("rstd",) if variant == "rmsnorm" else ("mean", "rstd")
    M, N = x.shape
    rows = max(1, chunk_elems // max(N, 1))
    max_abs = same_err = ref_max = 0.0
    diff_sq = ref_sq = 0.0
    finite = True
    stat_err = {n: 0.0 for n in names[:len(stats)]}
    stat_finite = True
    for r0 in range(0, M, rows):
        sl = slice(r0, min(M, r0 + rows))
        part = {"x": x[sl], "weight": w, "bias": b}
        ref = reference(variant, part, eps)
        yc = y[sl].float()
        d = (yc - ref["y"]).abs()
        m = d.max().item()
        max_abs = m if (m != m or max_abs != max_abs) else max(max_abs, m)  # a NaN anywhere stays NaN
        diff_sq += d.double().pow(2).sum().item()
        ref_sq += ref["y"].double().pow(2).sum().item()
        ref_max = max(ref_max, ref["y"].abs().max().item())
        same_err = max(same_err, (same_dtype(variant, part, eps).float() - ref["y"]).abs().max().item())
        finite = finite and bool(torch.isfinite(yc).all().item())
        for name, got in zip(names, stats):
            want, g = ref[name], got[sl].float()
            # rstd: relative error. mean: error in units of the row's standard deviation (1/rstd), which is what
            # it does to y = (x - mean) * rstd; relative to a near-zero mean it would be ill-conditioned.
            scale = want.abs() if name == "rstd" else torch.maximum(want.abs(), 1.0 / ref["rstd"])
            err = ((g - want).abs() / scale.clamp_min(1e-30)).nan_to_num(0.0).max().item()
            stat_err[name] = max(stat_err[name], err)
            stat_finite = stat_finite and bool((torch.isfinite(g) == torch.isfinite(want)).all().item())
        del ref, yc, d
    tol = 2.0 * same_err + 1e-3 * ref_max
    rel = (diff_sq ** 0.5) / max(ref_sq ** 0.5, 1e-30)
    res = {"max_abs_err": max_abs, "rel_err": rel, "tol": tol, "ok": finite and max_abs <= tol}
    for name, err in stat_err.items():
        res[f"{name}_rel_err"] = err
        res["ok"] = res["ok"] and stat_finite and err <= 1e-3
    return res
