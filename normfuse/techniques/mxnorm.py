r"""MXNorm: RMSNorm whose RMS is estimated from the MXFP8 block absmaxes, fused with the MXFP8 cast; and the
baseline it replaces, RMSNorm followed by the MXFP8 cast, as one single-pass kernel.

Source: McLean, Prince, Payot, Balança, Luschi, "MXNorm: Reusing MXFP block scales for efficient tensor
normalisation", arXiv 2603.13180 (2026), https://arxiv.org/abs/2603.13180 (details through third-party notes, see
``shared/docs/techniques.md`` section 8). MXFP8 rules: ``normfuse.mxfp8`` (torchao 0.18 ``to_mx`` semantics).

Math, for ``x [T, D]`` (D a multiple of B = 32, K = D / B blocks per row), everything in fp32::

    rmsnorm_cast:  rstd_t = rsqrt(sum_d x_td^2 / D + eps)
    mxnorm_p{p}:   m_tk   = max_{d in block k} |x_td|                 (block absmax of the *input*)
                   p = 1: g_t = sum_k m_tk / (K c(1, B)),   ms_t = g_t^2
                   p = 2: ms_t = sum_k m_tk^2 / (K c(2, B)^2)
                   rstd_t = rsqrt(ms_t + eps)                          (= c / G_t^(p) when eps = 0)
    both:          y = x * rstd (one fp32 multiply);  (data, scales) = MXFP8 cast of y (FLOOR or RCEIL)

``c(p, B)`` = ``normfuse.mxfp8.correction_constant`` (c(1, 32) = 2.347079, c(2, 32) = 2.389457), the Gaussian
limit of G / RMS (the paper's Theorem 1). eps sits where RMSNorm has it (the estimate replaces mean(x^2)); the
paper's placement is not confirmed. gamma is not applied: MXNormLinear folds it into the next weight.
In MXNorm the block absmax of ``y`` is ``rstd * m_tk`` exactly (an fp32 multiply by a positive number is monotone),
so the kernels derive the E8M0 scales from the input absmaxes with no second reduction; ``rmsnorm_cast`` must
reduce |y| per block after the row's sum of squares.

Kernels (same names in ``kernels_{triton,helion,tlx}/mxnorm.py``)::

    rmsnorm_mxfp8(x, *, eps, scale_mode="floor", config=None) -> (data, scales, rstd)
    mxnorm_mxfp8(x, *, p, eps, scale_mode="floor", config=None) -> (data, scales, rstd)

``data [T, D]`` float8_e4m3fn, ``scales [T, D/32]`` uint8 (E8M0 bytes), ``rstd [T]`` fp32 (the backward pass needs
it; the paper caches X and rho). One pass over each row; bytes: read ``T D itemsize``, write ``T D`` + ``T D / 32``
+ ``4 T``.

Check (``check``): the kernel's rstd against the fp32 reference (relative 1e-5, and the same NaN / zero pattern),
then the cast of ``x * rstd_kernel`` by ``normfuse.mxfp8.quantize``: scales bit-exact, data within one E4M3 code
(expected: identical). Using the kernel's own rstd makes the bit-exact scale check fair: a 1-ulp difference of rstd
(reduction order) would otherwise flip a scale whenever a block's amax sits next to a power of two.
"""

from __future__ import annotations

import math
import struct

import torch

from normfuse import mxfp8
from normfuse.techniques.lazy_prenorm import DTYPES, torch_dtype  # noqa: F401  (shared helpers)
from normfuse.validate import check_eps

NAME = "mxnorm"
VARIANTS = ("rmsnorm_cast", "mxnorm_p1", "mxnorm_p2")
IMPLS = ("norm_cast",)
BLOCK = mxfp8.BLOCK_SIZE
P_OF = {"mxnorm_p1": 1, "mxnorm_p2": 2}
KERNEL_FUNCTIONS = {"rmsnorm_cast": "rmsnorm_mxfp8", "mxnorm_p1": "mxnorm_mxfp8", "mxnorm_p2": "mxnorm_mxfp8"}
DISTRIBUTIONS = ("gaussian", "student_t", "outlier_channels")
RSTD_RTOL = 1e-5
MAX_D = 65536  # the whole row stays in registers in every DSL (no looped variant)


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choices: {', '.join(VARIANTS)}")
    return variant


def check_shape(M: int, N: int, K=None) -> None:
    """Raise ValueError unless M >= 1 and N is a positive multiple of 32 (the MX block); K is unused."""
    for name, v in (("M", M), ("N", N)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if N % BLOCK:
        raise ValueError(f"N (D) = {N} must be a multiple of the MX block size {BLOCK}")


def check_inputs(x: torch.Tensor, eps=None, p=None, scale_mode=None) -> tuple[int, int]:
    """Validate a kernel's ``x [T, D]`` (and ``eps``, ``p``, ``scale_mode`` when given); return (T, D).

    The contract every DSL's ``rmsnorm_mxfp8`` / ``mxnorm_mxfp8`` validates before compiling and serves with its
    default config (a call is accepted or rejected the same way in Triton, Helion and TLX): bf16/fp16/fp32, T >= 1,
    D a multiple of 32 up to ``MAX_D`` = 65536, row-major contiguous, any number of elements (64-bit offsets),
    any 16-byte misalignment (the TLX bulk-copy kernel copies such a view first).

    TypeError: not a tensor, dtype not bf16/fp16/fp32. ValueError: not 2-D, not contiguous, D not a multiple of
    32 or above 65536, T or D zero, eps not a finite number > 0, p not 1 or 2, unknown scale mode."""
    if not isinstance(x, torch.Tensor):
        raise TypeError("x must be a torch.Tensor")
    if x.dtype not in DTYPES.values():
        raise TypeError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, D], got {x.dim()}-D")
    if not x.is_contiguous():
        raise ValueError("x must be row-major contiguous (call .contiguous())")
    T, D = x.shape
    check_shape(T, D)
    if D > MAX_D:
        raise ValueError(f"D = {D} > {MAX_D}: the whole row must fit in registers (no looped variant)")
    if eps is not None:
        check_eps(eps)
    if p is not None and (isinstance(p, bool) or p not in (1, 2)):
        raise ValueError(f"p must be 1 or 2 (mean or RMS of the block absmaxes), got {p!r}")
    if scale_mode is not None:
        mxfp8.check_scale_mode(scale_mode)
    return T, D


def mx_constant(p: int, D: int) -> float:
    """The fp32 constant the kernels multiply the block-absmax sum by: ``1 / (K c(1))`` for p = 1 (then squared),
    ``1 / (K c(2)^2)`` for p = 2, with K = D / 32 (fp64, rounded once to fp32)."""
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p!r}")
    K = D // BLOCK
    c = mxfp8.correction_constant(p, BLOCK)
    v = 1.0 / (K * c) if p == 1 else 1.0 / (K * c * c)
    return struct.unpack("f", struct.pack("f", v))[0]


# ------------------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------------------
def sample_rows(T: int, D: int, distribution: str = "gaussian", *, generator=None, device="cpu",
                df: float = 3.0, outlier_channels: int = 8, outlier_scale: float = 20.0) -> torch.Tensor:
    """fp32 ``[T, D]`` rows for the accuracy study and the benchmarks: "gaussian" N(0, 1); "student_t" with ``df``
    degrees of freedom (heavy tails; ``df = 3`` has finite variance); "outlier_channels": N(0, 1) with
    ``outlier_channels`` fixed columns (the same in every row, as in LLM activations) scaled by ``outlier_scale``."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; choices: {', '.join(DISTRIBUTIONS)}")
    g = generator
    if distribution == "student_t":
        if not df >= 2:
            raise ValueError(f"df must be >= 2 for the Student-t sampler, got {df!r}")
        z = torch.randn(T, D, generator=g, device=device)
        chi2 = 2.0 * _gamma(df / 2, (T, D), g, device)  # chi^2_df = 2 Gamma(df / 2, 1)
        return z / torch.sqrt(chi2 / df)
    x = torch.randn(T, D, generator=g, device=device)
    if distribution == "outlier_channels":
        cols = torch.randperm(D, generator=torch.Generator().manual_seed(1234))[:outlier_channels].to(device)
        x[:, cols] *= outlier_scale
    return x


def _gamma(shape: float, size, g, device) -> torch.Tensor:
    """Gamma(shape, 1) samples from ``g`` (Marsaglia-Tsang, shape >= 1; seeded, unlike torch.distributions)."""
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = torch.empty(size, device=device)
    todo = torch.ones(size, dtype=torch.bool, device=device)
    while todo.any():
        z = torch.randn(size, generator=g, device=device)
        u = torch.rand(size, generator=g, device=device)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-30)) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp_min(1e-30)))
        take = ok & todo
        out[take] = (d * v)[take]
        todo &= ~ok
    return out


def make_inputs(M: int, N: int, K=None, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0,
                scale_mode: str = "floor", distribution: str = "gaussian", specials: bool = True) -> dict:
    """Seeded ``x [M, N]`` (rows of ``distribution`` scaled by 2^U(-2, 2)); never all zeros. With ``specials`` and
    M >= 8, rows 1-6 carry the corner cases: row 1 a zero block (and a -0 block), row 2 one NaN, row 3 one +Inf,
    row 4 values near the dtype's smallest normal (subnormals), row 5 all zeros, row 6 values near max/8 (x^2
    overflows fp32 for bf16/fp32). Returns ``{"x", "scale_mode"}``."""
    check_shape(M, N)
    mode = mxfp8.check_scale_mode(scale_mode)
    dt = torch_dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    x = sample_rows(M, N, distribution, generator=g, device=device) * scale
    if specials and M >= 8:
        fi = torch.finfo(dt)
        x[1, :BLOCK] = 0.0
        if N >= 2 * BLOCK:
            x[1, BLOCK:2 * BLOCK] = -0.0
        x[2, 5] = float("nan")
        x[3, N - 1] = float("inf")
        x[4] = x[4] / x[4].abs().max() * fi.tiny * 4  # mostly subnormal in x's dtype
        x[5] = 0.0
        x[6] = x[6] / x[6].abs().max() * fi.max / 8
    return {"x": x.to(dt), "scale_mode": mode}


# ------------------------------------------------------------------------------------------------------------
# reference
# ------------------------------------------------------------------------------------------------------------
def reference_rstd(variant: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 ``rstd [T]`` of ``variant`` on ``x [T, D]``: the row sum in fp64 rounded to fp32, then the kernels' fp32
    steps (so overflow to Inf and underflow to 0 happen where they happen in the kernels)."""
    check_variant(variant)
    T, D = x.shape
    check_shape(T, D)
    xf = x.float()
    if variant == "rmsnorm_cast":
        ss = xf.double().pow(2).sum(-1).float()
        return torch.rsqrt(ss / D + eps)
    p = P_OF[variant]
    m = mxfp8.block_amax(xf, BLOCK)
    const = torch.tensor(mx_constant(p, D), dtype=torch.float32)
    if p == 1:
        g = m.double().sum(-1).float() * const
        ms = g * g
    else:
        ms = m.double().pow(2).sum(-1).float() * const
    return torch.rsqrt(ms + eps)


def reference(variant: str, inputs: dict, eps: float, rstd: torch.Tensor | None = None) -> dict:
    """``{"rstd", "y", "data", "scales"}``: fp32 rstd (``reference_rstd``, or the given ``rstd``), ``y = x * rstd``
    (fp32) and its MXFP8 cast ``(data float8_e4m3fn, scales uint8)`` in ``inputs["scale_mode"]``."""
    x = inputs["x"]
    r = reference_rstd(variant, x, eps) if rstd is None else rstd.float()
    y = x.float() * r[:, None]
    data, scales = mxfp8.quantize(y, inputs.get("scale_mode", "floor"))
    return {"rstd": r, "y": y, "data": data, "scales": scales}


def torch_rmsnorm_cast(x: torch.Tensor, eps: float, scale_mode: str = "floor"):
    """RMSNorm (fp32 statistics, no affine) then the MXFP8 cast, in PyTorch ops (torch.compile-able): the
    paper's baseline. Returns ``(data, scales, rstd)`` like the kernels."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    data, scales = mxfp8.quantize(xf * rstd[:, None], scale_mode)
    return data, scales, rstd


def torch_mxnorm_cast(x: torch.Tensor, p: int, eps: float, scale_mode: str = "floor"):
    """MXNorm (block absmaxes of x, p-mean, correction constant) then the MXFP8 cast, in PyTorch ops: what the
    paper measured with torch.compile. Returns ``(data, scales, rstd)``."""
    xf = x.float()
    m = mxfp8.block_amax(xf, BLOCK)
    const = mx_constant(p, x.shape[-1])
    if p == 1:
        g = m.sum(-1) * const
        ms = g * g
    else:
        ms = (m * m).sum(-1) * const
    rstd = torch.rsqrt(ms + eps)
    data, scales = mxfp8.quantize(xf * rstd[:, None], scale_mode)
    return data, scales, rstd


# ------------------------------------------------------------------------------------------------------------
# check, cost model
# ------------------------------------------------------------------------------------------------------------
def check(impl: str, out, inputs: dict, eps: float, variant: str | None = None) -> dict:
    """Check ``out = (data, scales, rstd)`` of ``variant`` (module docstring). Returns ``ok`` plus the worker's
    fields in this technique's units: ``max_abs_err`` = the largest E4M3 code distance to the reference (NaN vs
    number counts as 2^20), ``tol`` = 1 (code), ``rel_err`` = ``rstd_rel_err`` = the largest relative rstd error,
    ``scale_mismatch_rel_err`` = the fraction of scale bytes that differ (must be 0)."""
    check_variant(variant)
    data, scales, rstd = out
    x = inputs["x"]
    T, D = x.shape
    shapes_ok = (tuple(data.shape) == (T, D) and tuple(scales.shape) == (T, D // BLOCK) and tuple(rstd.shape) == (T,)
                 and data.dtype in (torch.float8_e4m3fn, torch.uint8) and scales.dtype == torch.uint8
                 and rstd.dtype == torch.float32)
    if not shapes_ok:
        return {"ok": False, "max_abs_err": float("inf"), "rel_err": float("inf"), "tol": 1.0,
                "error": f"bad outputs: data {tuple(data.shape)} {data.dtype}, scales {tuple(scales.shape)} "
                         f"{scales.dtype}, rstd {tuple(rstd.shape)} {rstd.dtype}"}
    want = reference_rstd(variant, x, eps).to(rstd.device)
    got = rstd.float()
    same_pattern = bool(torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(got == 0, want == 0)
                        and torch.equal(torch.isinf(got), torch.isinf(want)))
    fin = torch.isfinite(want) & (want != 0)
    rel = ((got - want).abs() / want.abs())[fin]
    rstd_err = rel.max().item() if rel.numel() else 0.0
    ref = reference(variant, inputs, eps, rstd=got)
    s_bad = (scales != ref["scales"].to(scales.device))
    dist = mxfp8.code_distance(data.view(torch.uint8), ref["data"].to(data.device).view(torch.uint8))
    max_dist = float(dist.max().item()) if dist.numel() else 0.0
    frac = s_bad.float().mean().item() if s_bad.numel() else 0.0
    ok = same_pattern and rstd_err <= RSTD_RTOL and frac == 0.0 and max_dist <= 1
    return {"ok": ok, "max_abs_err": max_dist, "rel_err": rstd_err, "tol": 1.0, "rstd_rel_err": rstd_err,
            "scale_mismatch_rel_err": frac, "code_mismatches": int((dist > 0).sum().item()),
            "rstd_pattern_ok": same_pattern}


def flops(impl: str, M: int, N: int, K=None) -> float:
    """About 4 operations per element (square or abs/max, scale, cast); memory-bound anyway."""
    return 4.0 * M * N


def bytes_moved(impl: str, M: int, N: int, K=None, itemsize: int = 2) -> float:
    """The fewest bytes: read x (``M N itemsize``), write the E4M3 data (``M N``), the scales (``M N / 32``) and
    rstd (``4 M``). The same for every variant and baseline."""
    return float(M * N * itemsize + M * N + M * N // BLOCK + 4 * M)


# ------------------------------------------------------------------------------------------------------------
# how the worker calls each implementation
# ------------------------------------------------------------------------------------------------------------
BASELINES = ("torch_compile_rmsnorm_cast", "torch_compile_mxnorm_cast")
_BASELINE_VARIANTS = {"torch_compile_rmsnorm_cast": ("rmsnorm_cast",),
                      "torch_compile_mxnorm_cast": ("mxnorm_p1", "mxnorm_p2")}


def baseline_applies(impl: str, variant: str | None) -> bool:
    """Whether the sweep should run baseline ``impl`` for ``variant``: the torch.compile RMSNorm + cast with the
    ``rmsnorm_cast`` points, the torch.compile MXNorm + cast with the ``mxnorm_p{1,2}`` points (each measured once
    per shape; cross-variant speedups come from ``normfuse.techniques.mxnorm.speedups``)."""
    return variant in _BASELINE_VARIANTS.get(impl, ())


def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """``rmsnorm_mxfp8`` (variant rmsnorm_cast) or ``mxnorm_mxfp8`` (mxnorm_p1/p2) in every kernels_<dsl>/mxnorm.py."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r} for mxnorm; choices: {', '.join(IMPLS)}")
    return KERNEL_FUNCTIONS[check_variant(variant)]


def compile_inputs(M: int, N: int, K, dtype: str) -> tuple:
    """An uninitialized CPU ``x [M, N]`` for the sm_90 compile-only check."""
    return (torch.empty(M, N, dtype=torch_dtype(dtype)),)


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable running a DSL kernel: ``rmsnorm_mxfp8(x, eps=, scale_mode=, config=)`` or
    ``mxnorm_mxfp8(x, p=, eps=, scale_mode=, config=)``; returns ``(data, scales, rstd)``."""
    x, mode = inputs["x"], inputs.get("scale_mode", "floor")
    if check_variant(variant) == "rmsnorm_cast":
        return lambda: kernel(x, eps=eps, scale_mode=mode, config=config)
    p = P_OF[variant]
    return lambda: kernel(x, p=p, eps=eps, scale_mode=mode, config=config)


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """'torch_compile_rmsnorm_cast' (``torch_rmsnorm_cast``) or 'torch_compile_mxnorm_cast' (``torch_mxnorm_cast``
    with the variant's p), compiled by Inductor for this one shape (dynamo reset, ``dynamic=False``). ValueError
    for a baseline that does not belong to ``variant`` (``baseline_applies``)."""
    if impl not in BASELINES:
        raise ValueError(f"unknown baseline {impl!r}; choices: {', '.join(BASELINES)}")
    if not baseline_applies(impl, variant):
        raise ValueError(f"baseline {impl!r} is measured with variant(s) {_BASELINE_VARIANTS[impl]}, not {variant!r}")
    x, mode = inputs["x"], inputs.get("scale_mode", "floor")
    if impl == "torch_compile_rmsnorm_cast":
        def fn(x):
            return torch_rmsnorm_cast(x, eps, mode)
    else:
        p = P_OF[variant]
        mx_constant(p, x.shape[-1])  # fills the c(p, B) cache outside the traced function (no graph break)

        def fn(x):
            return torch_mxnorm_cast(x, p, eps, mode)
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False)
    return lambda: compiled(x)


def speedups(df):
    """Cross-variant table of a run (pandas DataFrame of results rows with ``gbps``/``p50_ms``): per (M, N) the best
    p50 of each DSL's ``rmsnorm_cast`` and ``mxnorm_p1/p2`` kernels and of both torch.compile baselines, the speedup
    of each MXNorm kernel over torch.compile RMSNorm + cast (the paper's comparison) and over the same DSL's
    single-pass RMSNorm + cast, and the GB/s. Returns a DataFrame (empty if nothing was timed)."""
    import pandas as pd

    ok = df[(df["status"] == "ok") & df["p50_ms"].notna()]
    if ok.empty:
        return pd.DataFrame()
    ok = ok.assign(who=[(r.impl if r.dsl == "torch" else f"{r.dsl}/{r.variant}") for r in ok.itertuples()])
    best = ok.groupby(["M", "N", "who"])["p50_ms"].min().unstack("who")
    out = pd.DataFrame(index=best.index)
    base = best.get("torch_compile_rmsnorm_cast")
    for col in best.columns:
        out[f"{col} us"] = best[col] * 1e3
    for col in best.columns:
        if "/mxnorm" in col:
            dsl = col.split("/")[0]
            if base is not None:
                out[f"{col} vs tc_rms_cast"] = base / best[col]
            if f"{dsl}/rmsnorm_cast" in best.columns:
                out[f"{col} vs {dsl}/rmsnorm_cast"] = best[f"{dsl}/rmsnorm_cast"] / best[col]
    return out.reset_index()
