r"""Helion kernels for MXNorm and RMSNorm fused with the MXFP8 cast (one pass over each row).

``rmsnorm_mxfp8(x, *, eps, scale_mode, config)`` and ``mxnorm_mxfp8(x, *, p, eps, scale_mode, config)`` return
``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8, rstd [T] fp32)``. Math and check:
``normfuse/techniques/mxnorm.py`` (McLean et al., "MXNorm: Reusing MXFP block scales for efficient tensor
normalisation", arXiv 2603.13180, https://arxiv.org/abs/2603.13180); cast rules: ``normfuse/mxfp8.py``
(torchao 0.18 ``to_mx``, FLOOR and RCEIL). Kernel shape after ``shared/examples/helion_rms_mxfp8.py`` (our own).

**Kernel structure.** One Helion kernel body for all six (op, p, scale mode) combinations, specialized by three
``hl.constexpr`` arguments (``mode``: 0 = RMSNorm, 1/2 = MXNorm p; ``rceil``; ``blocked``), so each combination is
its own generated Triton kernel with no runtime branches. Grid loop ``for tile_m in hl.tile(m)`` (``BLOCK_M`` rows
per program), the whole row in registers as ``[BLOCK_M, D/32, 32]`` MX blocks:

* D/32 a power of two (the benchmark D): ``x[tile_m, :]`` with ``n = hl.specialize(D)``, reshaped in registers;
* any other multiple of 32 (``blocked``): the host passes the free view ``x.view(T, D/32, 32)`` and the kernel loads
  ``x[tile_m, :, :]``; Helion pads the block dimension to ``next_pow2(D/32)`` and masks the padding (loads give 0,
  the sums and maxima ignore it, stores skip it). Reshaping the 2-D row does not work there: Helion pads the row to
  ``next_pow2(D)`` elements, and ``reshape([BLOCK_M, D/32, 32])`` of that fails tracing (``shape '[u0, 33, 32]'
  is invalid``, D = 1056). The power-of-two path is kept because its generated code is the original one (the 3-D
  load needs more registers at D = 4096: 127 vs 80 for r4-w8, sm_90 compile-only).

* block maxima as an integer ``torch.amax`` over the sign-cleared fp32 bits (``.view(torch.int32) & 0x7FFFFFFF``;
  Helion lowers it to its NaN-propagating max), so a NaN block gets scale 255 like ``torch.amax`` in torchao;
* RMSNorm: ``sum(x^2)`` over the row, ``y = x * rstd``, then a second block max over |y|;
  MXNorm: block max of |x|, the ``D/32``-element p-sum, ``rstd``, and the scale bits from ``rstd * m`` (the exact
  absmax of y) with no second reduction;
* E8M0 bytes and the element multiplier from integer exponent arithmetic (``normfuse.mxfp8``), the element cast
  ``.to(torch.float8_e4m3fn)``, which Helion/Inductor lower to ``cvt.rn.satfinite.e4m3x2.f32`` on sm_90 (it
  saturates like torchao's clamp; in ref mode torch >= 2.12's eager cast saturates too).

Limits: the row lives in registers (``reduction_loops`` must be ``(None,)``: a looped reduction over the reshaped
``[D/32, 32]`` row is not offered), D a multiple of 32; a non-power-of-two D/32 holds ``padded_width(D)`` elements
per row (the register limit ``MAX_ELEMS_PER_THREAD`` is applied to that). Unlike the Triton and TLX kernels there is no software
E4M3 cast: the CPU mode is Helion's eager ref mode, where torch's own cast is exact.

**Execution modes** (as ``kernels_helion/norms.py``): GPU (``compile_config`` of ``TilingConfig.to_helion()``,
cached per shape/dtype/op/config), CPU ref mode (``HELION_INTERPRET=1`` before ``import helion``; config validated
then ignored), compile-only (``compile_sm90``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from kernels_helion.lazy_prenorm import _as_on_h200, _live_args, ptxas_usage  # shared host-side helpers
from kernels_helion.norms import TilingConfig as _NormTiling
from normfuse.mxfp8 import check_scale_mode
from normfuse.techniques.mxnorm import BLOCK, check_inputs, mx_constant
from normfuse.validate import check_eps, check_forward_only, is_aligned

__all__ = ["TilingConfig", "DEFAULT_CONFIG", "H200_CANDIDATES", "OPS", "rmsnorm_mxfp8", "mxnorm_mxfp8",
           "compile_sm90", "compile_sm90_kernel", "ptxas_usage", "triton_code", "ref_mode", "default_config",
           "padded_width"]

OPS = ("rmsnorm_mxfp8", "mxnorm_mxfp8")


@helion.kernel(static_shapes=True, autotune_effort="none")
def _mx_cast_kernel(x: torch.Tensor, eps: float, mx_const: float, mode: hl.constexpr, rceil: hl.constexpr,
                    blocked: hl.constexpr) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # x: [T, D] when D/32 is a power of two (blocked=False: the row is loaded whole and reshaped to [D/32, 32] in
    # registers), else the host's free view [T, D/32, 32] (blocked=True: a 3-D load; reshaping a 2-D row fails
    # Helion's tracing there, as the row's block is padded to next_pow2(D) elements). q has x's shape.
    if blocked:
        m, kb, blk = x.size()
        kb = hl.specialize(kb)
        n = kb * hl.specialize(blk)
    else:
        m, n = x.size()
        n = hl.specialize(n)
        kb = n // 32
    q = torch.empty(x.size(), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty([m, kb], dtype=torch.uint8, device=x.device)
    rstd_out = torch.empty([m], dtype=torch.float32, device=x.device)
    for tile_m in hl.tile(m):
        if blocked:
            xb = x[tile_m, :, :].to(torch.float32)
        else:
            xb = x[tile_m, :].to(torch.float32).reshape([tile_m, kb, 32])
        if mode == 0:  # RMSNorm: row sum of squares, then the block maxima of y
            ss = torch.sum(torch.sum(xb * xb, dim=-1), dim=-1)
            rstd = torch.rsqrt(ss / n + eps)
            yb = xb * rstd[:, None, None]
            a = torch.amax(yb.view(torch.int32) & 0x7FFFFFFF, dim=-1)
        else:  # MXNorm: block maxima of x, the D/32-element p-sum, the scale bits from rstd * m
            mx = torch.amax(xb.view(torch.int32) & 0x7FFFFFFF, dim=-1).view(torch.float32)
            if mode == 1:
                g = torch.sum(mx, dim=-1) * mx_const
                ms = g * g
            else:
                ms = torch.sum(mx * mx, dim=-1) * mx_const
            rstd = torch.rsqrt(ms + eps)
            yb = xb * rstd[:, None, None]
            a = (mx * rstd[:, None]).view(torch.int32) & 0x7FFFFFFF
        e = a >> 23
        if rceil:  # ceil(log2(fl(amax / 448))) + 127 from the bits of amax (normfuse.mxfp8.rceil_from_amax_bits)
            s = torch.clamp(e - 8 + ((a & 0x7FFFFF) > 0x600000).to(torch.int32), 0, 254)
            s = torch.where(a == 0x04600001, 0, s)
            s = torch.where(a == 0x7F800000, 254, s)
            s = torch.where(a > 0x7F800000, 255, s)
            mult = ((254 - torch.clamp(s, 1, 253)) << 23).view(torch.float32)
            mult = torch.where(s == 0, 1.0, mult)
            mult = torch.where(s == 254, 2.0 ** -127, mult)
            mult = torch.where(s == 255, float("nan"), mult)
        else:  # FLOOR: floor(log2(amax)) - 8 + 127; Inf -> 247, NaN -> 255
            s = torch.clamp(e - 8, min=0)
            s = torch.where(a > 0x7F800000, 255, s)
            mult = ((254 - torch.clamp(s, min=1)) << 23).view(torch.float32)
            mult = torch.where(s == 255, 0.0, mult)
        qv = (yb * mult[:, :, None]).to(torch.float8_e4m3fn)
        if blocked:
            q[tile_m, :, :] = qv
        else:
            q[tile_m, :] = qv.reshape([tile_m, n])
        scales[tile_m, :] = s.to(torch.uint8)
        rstd_out[tile_m] = rstd
    return q, scales, rstd_out


@dataclass(frozen=True)
class TilingConfig(_NormTiling):
    """``kernels_helion.norms.TilingConfig`` (block_sizes ``(BLOCK_M,)``, num_warps, num_stages, indexing, pid_type,
    num_sm_multiplier, maxnreg; same validation) with ``reduction_loops`` fixed to ``(None,)``: the row, reshaped
    to ``[D/32, 32]`` blocks, stays in registers. ValueError names the violated constraint."""

    def __post_init__(self):
        super().__post_init__()
        if self.reduction_loops != (None,):
            raise ValueError(f"reduction_loops must be (None,) for the MXFP8 kernels (whole row in registers), "
                             f"got {self.reduction_loops!r}")

    def to_helion(self) -> helion.Config:
        """The ``helion.Config`` without ``reduction_loops`` (Helion offers that knob for this kernel only at some
        D, and its default, None, is the whole row)."""
        cfg = dict(super().to_helion())
        cfg.pop("reduction_loops", None)
        return helion.Config(**cfg)


DEFAULT_CONFIG = TilingConfig(block_sizes=(2,), num_warps=8)


def padded_width(D: int) -> int:
    """Elements of a row that the kernel holds in registers: ``D`` rounded up to ``32 * next_pow2(D / 32)`` (Triton
    blocks are powers of two; the padding is masked). Equal to D for the benchmark D (powers of two)."""
    kb = max(1, D // BLOCK)
    return BLOCK * (1 << (kb - 1).bit_length())


def default_config(D: int) -> TilingConfig:
    """The config used when ``config=None``: about 32 elements of the (padded, ``padded_width``) row per thread,
    8 warps up to 8192 (BLOCK_M = 4, 4, 2, 1 for 1K, 2K, 4K, 8K) and one row on 16 warps beyond (32 warps past
    32K)."""
    Dp = padded_width(D)
    if Dp > 8192:
        return TilingConfig(block_sizes=(1,), num_warps=32 if Dp > 32768 else 16)
    rows = max(1, min(4, 8192 // Dp))
    return TilingConfig(block_sizes=(1 << (rows.bit_length() - 1),), num_warps=8)  # a power of two

# H200 candidates for T in {1K .. 128K} x D in {1K .. 16K} (bf16); untimed. Elements of x per thread =
# BLOCK_M * D / (32 * num_warps), at most MAX_ELEMS_PER_THREAD = 64 (a config that would exceed it reports
# 'unsupported' at that D). Registers from sm_90 compile-only (ptxas -v, no spills; resident programs per SM):
H200_CANDIDATES = {
    # D <= 4096: 4 rows per program, 16-64 elements/thread: 32 regs (8/SM) at D=1K, 80 (3/SM) at 4K
    "r4-w8": dict(block_sizes=(4,), num_warps=8),
    # the example's config (dsl-primer B.8: 3.1 TB/s for RMSNorm + RCEIL at 8192 x 4096), D <= 8192: 48 regs at 4K
    "r2-w8": dict(block_sizes=(2,), num_warps=8),
    # wide rows: one row per program, 16 warps: 64 regs (2/SM) at D = 16K; 2 elements/thread at D = 1K (slow)
    "r1-w16": dict(block_sizes=(1,), num_warps=16),
    # persistent: 4 x 132 programs walk 2-row tiles (no launch tail at T = 128K), D <= 8192
    "persist-r2-w8-x4": dict(block_sizes=(2,), num_warps=8, pid_type="persistent_interleaved", num_sm_multiplier=4),
}

_COMPILED: dict = {}


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_mx_cast_kernel.settings)


def _args(op: str, x, p, eps, scale_mode) -> tuple:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    check_forward_only(f"mxnorm.{op}", x=x)
    eps = check_eps(eps)
    if op == "mxnorm_mxfp8" and p is None:
        raise ValueError("mxnorm_mxfp8 needs p (1 or 2)")
    _, D = check_inputs(x, eps, p, scale_mode)
    mode = 0 if op == "rmsnorm_mxfp8" else int(p)
    const = mx_constant(int(p), D) if mode else 0.0
    blocked = not _is_pow2(D // BLOCK)
    if blocked:  # a free view (x is contiguous: check_inputs); the kernel's 3-D input
        x = x.view(x.shape[0], D // BLOCK, BLOCK)
    return (x, float(eps), const, mode, check_scale_mode(scale_mode) == "rceil", blocked)


def _is_pow2(v: int) -> bool:
    return v >= 1 and (v & (v - 1)) == 0


MAX_ELEMS_PER_THREAD = 64  # fp32 elements of x per thread; beyond it ptxas spills at D = 16384 (r4-w8: 255 regs)


def _config(config, D: int) -> TilingConfig:
    """The validated config for rows of D; ValueError (the sweep's 'unsupported') when a thread would hold more
    than ``MAX_ELEMS_PER_THREAD`` elements of x (``BLOCK_M * padded_width(D) / (32 * num_warps)``)."""
    cfg = TilingConfig.from_dict(config) if config is not None else default_config(D)
    Dp = padded_width(D)
    per_thread = cfg.block_sizes[0] * Dp // (32 * cfg.num_warps)
    if per_thread > MAX_ELEMS_PER_THREAD:
        pad = "" if Dp == D else f" (D padded to {Dp}: 32 x next_pow2(D/32))"
        raise ValueError(f"config cannot serve D={D}: BLOCK_M * D / (32 * num_warps) = {per_thread} elements per "
                         f"thread{pad} > {MAX_ELEMS_PER_THREAD} (registers; use fewer rows or more warps)")
    return cfg


def _run(op: str, x, p, eps, scale_mode, config):
    args = _args(op, x, p, eps, scale_mode)
    cfg = _config(config, x.shape[1])
    if ref_mode():
        return _unblock(*_mx_cast_kernel(*args))  # eager PyTorch on whole tensors: the config does not apply
    if x.device.type != "cuda":
        raise ValueError(f"{op} needs CUDA tensors (got {x.device}); on CPU set HELION_INTERPRET=1 before "
                         "importing helion (ref mode), or use compile_sm90 for a compile-only check")
    # alignment in the key: Helion chooses TMA (indexing="tensor_descriptor") only for a 16-byte aligned base
    ck = (x.shape, x.dtype, x.device, args[1:], cfg, is_aligned(x))
    fn = _COMPILED.get(ck)
    if fn is None:
        bound = _mx_cast_kernel.bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(cfg.to_helion())
        _COMPILED[ck] = fn
    return _unblock(*fn(*args))


def _unblock(q, scales, rstd):
    """The kernel's ``q`` (``[T, D/32, 32]`` for the blocked input) as ``[T, D]`` (a view)."""
    return q.view(q.shape[0], -1), scales, rstd


def rmsnorm_mxfp8(x: torch.Tensor, *, eps: float = 1e-6, scale_mode: str = "floor",
                  config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm (no affine) fused with the MXFP8 cast, one pass: ``rstd = rsqrt(mean(x^2) + eps)``,
    ``(data, scales) = MXFP8(x * rstd)``.

    ``x [T, D]``: 2-D row-major contiguous bf16/fp16/fp32 (CUDA, or CPU in ref mode); T >= 1, D a multiple of 32.
    ``eps`` > 0; ``scale_mode`` "floor" | "rceil"; ``config``: ``TilingConfig``, a mapping, or None
    (``default_config(D)``). Returns ``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8, rstd [T] fp32)``.
    Any number of elements (Helion picks 64-bit indexing past 2^31) and any alignment. Raises
    NotImplementedError when autograd would record through it (forward only), TypeError/ValueError via
    ``normfuse.techniques.mxnorm.check_inputs`` (dtype, rank, contiguity, D % 32, D > 65536, eps (None included),
    scale mode), ValueError for a bad config and for non-CUDA tensors outside ref mode.
    """
    return _run("rmsnorm_mxfp8", x, None, eps, scale_mode, config)


def mxnorm_mxfp8(x: torch.Tensor, *, p: int = 2, eps: float = 1e-6, scale_mode: str = "floor",
                 config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXNorm fused with the MXFP8 cast, one pass: block absmaxes ``m`` of x, ``rstd = rsqrt(ms + eps)`` with
    ``ms = (sum m / (K c1))^2`` (p = 1) or ``sum m^2 / (K c2^2)`` (p = 2), scales from ``rstd * m``. ``p`` in {1, 2};
    the rest (inputs, returns, errors) as ``rmsnorm_mxfp8``. Source: McLean et al., arXiv 2603.13180."""
    return _run("mxnorm_mxfp8", x, p, eps, scale_mode, config)


def _bound(op: str, x, p, eps, scale_mode, config):
    args = _args(op, x, p, eps, scale_mode)
    cfg = _config(config, x.shape[1])
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    return _mx_cast_kernel.bind(args), cfg.to_helion(), args


def _codegen_env(x: torch.Tensor):
    return _as_on_h200() if x.device.type == "cpu" else contextlib.nullcontext()


def triton_code(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, p: int = 2,
                scale_mode: str = "floor") -> str:
    """The Triton source Helion generates for ``op`` at ``config`` for the shape/dtype of ``x`` (CPU tensors are
    fine; nothing is compiled). Raises like ``compile_sm90``."""
    bound, hcfg, args = _bound(op, x, p if op == "mxnorm_mxfp8" else None, eps, scale_mode, config)
    with _live_args(bound, args), _codegen_env(x):
        return bound.to_triton_code(hcfg)


def compile_sm90_kernel(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, p: int = 2,
                        scale_mode: str = "floor"):
    """Like ``compile_sm90`` but returns Triton's ``CompiledKernel`` (``.asm["ptx"]``, ``.metadata``, ...)."""
    from normfuse.compile_only import WarmupLauncher

    bound, hcfg, args = _bound(op, x, p if op == "mxnorm_mxfp8" else None, eps, scale_mode, config)
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(x):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError(f"{op}: Helion's host code did not launch a kernel; nothing was compiled")
    return launcher.last


def compile_sm90(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, p: int = 2,
                 scale_mode: str = "floor") -> dict:
    """Compile ``op`` ("rmsnorm_mxfp8" or "mxnorm_mxfp8") for sm_90 without launching it (the caller must have run
    ``normfuse.compile_only.install(90)``); ``x [T, D]`` a CPU tensor (only shape and dtype matter). Returns
    ``normfuse.compile_only.summarize(...)``. Raises ValueError/TypeError for bad inputs or config, RuntimeError in
    ref mode, and Helion/Triton's errors on a compile failure. Compilation only: never a correctness signal."""
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, x, eps=eps, config=config, p=p, scale_mode=scale_mode))
