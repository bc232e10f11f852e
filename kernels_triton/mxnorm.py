r"""MXNorm and RMSNorm fused with the MXFP8 cast, in upstream Triton (3.6.0) for Hopper (sm_90): one pass over each
row, x read once from HBM, E4M3 data + E8M0 scales + fp32 rstd written once.

Math and the check: ``normfuse.techniques.mxnorm`` (McLean et al., "MXNorm: Reusing MXFP block scales for
efficient tensor normalisation", arXiv 2603.13180, https://arxiv.org/abs/2603.13180); cast rules:
``normfuse.mxfp8`` (torchao 0.18 ``to_mx``, FLOOR and RCEIL).

Two entry points with the same names in ``kernels_{triton,helion,tlx}/mxnorm.py``:

* ``rmsnorm_mxfp8(x, *, eps, scale_mode, config)``: the single-pass baseline a careful engineer writes without
  MXNorm: ``ss = sum(x^2)`` over the row, ``rstd = rsqrt(ss / D + eps)``, ``y = x * rstd``, then a *second*
  reduction per 32-block: ``amax = max |y|``, the E8M0 scale, ``y * 2^-e`` cast to E4M3.
* ``mxnorm_mxfp8(x, *, p, eps, scale_mode, config)``: one block reduction of the *input*,
  ``m_k = max |x|`` per 32-block, then a K = D/32-element row sum (``sum m_k`` for p = 1, ``sum m_k^2`` for p = 2)
  gives ``rstd``; the scale of block k follows from ``rstd * m_k`` (the exact absmax of y, as multiplying by a
  positive fp32 is monotone), so there is no reduction over y.

Both return ``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8, rstd [T] fp32)``.

Kernel structure. One program handles ``ROWS`` whole rows as a 3-D register tile ``[ROWS, BLOCK_K, 32]``
(``BLOCK_K = next_pow2(D / 32)`` blocks, masked past D), loaded straight in that shape (16-byte vector loads:
D is a multiple of 32, which the kernel makes visible to Triton's alignment analysis by taking ``D / 32`` as the
argument), so the per-block reductions are a thread-local max over its 8 elements plus two warp shuffles. Block
maxima are taken on the sign-cleared fp32 bit patterns as int32 (``tl.max`` on floats drops NaN; NaN bits order
above Inf, so an integer max propagates NaN like ``torch.amax``). The E8M0 byte and the element multiplier
``2^-e`` come from integer exponent arithmetic (``normfuse.mxfp8``; no ``log2``, no division, no sm_100
``cvt.rp.ue8m0x2``), the element cast is ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89+), which saturates like torchao's
clamp. ``SOFT_CAST`` replaces that cast by integer/fp32-add code (``normfuse.mxfp8.e4m3_rne_codes``): it is
forced on under ``TRITON_INTERPRET=1`` (the interpreter's fp32 -> fp8 casts are wrong: no rounding into the
exponent, no subnormals, no saturation, dsl-primer section C.5), so the CPU tests check every output bit; on the
GPU it is a config option (slower: ~12 more integer ops per element).

``ROWS``/``num_warps`` adapt to D like ``kernels_triton.norms`` (``TILE_BYTES`` of x per program, about
``THREAD_ELEMS`` elements per thread); ``PERSISTENT`` loops a grid of ``#SMs x (32 // num_warps)`` programs over the
row tiles. The whole row stays in registers (D up to 65536); there is no looped variant (the sweep's D <= 16384).

Status: CPU-checked (interpreter with the software cast, bit-exact; sm_90 compile-only with PTX checks); the
hardware-cast bits and all speeds need the GPU (``normfuse.gpu_checks``, experiment ``mxnorm_kernels``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels_triton.lazy_prenorm import _fix_interpreter_scalar_index, _interpreting
from normfuse.mxfp8 import check_scale_mode
from normfuse.techniques.mxnorm import BLOCK, check_inputs, mx_constant
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

__all__ = ["OPS", "TilingConfig", "DEFAULT_CONFIG", "PROPOSED_TILINGS", "launch_params", "rmsnorm_mxfp8",
           "mxnorm_mxfp8", "compile_sm90", "compile_sm90_kernel"]

OPS = ("rmsnorm_mxfp8", "mxnorm_mxfp8")
_MAX_D = 65536
_MAX_ROWS = 256
_DEFAULT_NUM_SMS = 132  # H100 SXM / H200 (used off-GPU)

if _interpreting():
    _fix_interpreter_scalar_index()


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tiling of both kernels.

    * ``ROWS`` (power of 2 in [1, 256] or None): rows per program. None: ``TILE_BYTES // (D_pad * itemsize)``
      rounded down to a power of 2, clamped to [1, min(256, next_pow2(T))].
    * ``TILE_BYTES`` (power of 2 in [1024, 1 MiB]): bytes of x per program when ``ROWS`` is None.
    * ``THREAD_ELEMS`` (power of 2 in [4, 128]): elements per thread when ``num_warps`` is None:
      ``num_warps = clamp(next_pow2(ROWS * D_pad / (32 * THREAD_ELEMS)), 4, 32)``.
    * ``num_warps`` (power of 2 in [1, 32] or None).
    * ``PERSISTENT`` (bool): grid of ``min(#tiles, #SMs * max(1, 32 // num_warps))`` programs looping over tiles.
    * ``SOFT_CAST`` (bool or None): integer E4M3 cast instead of ``cvt.rn.satfinite.e4m3x2``; None = only under
      the interpreter (where it is forced on anyway).

    ``D_pad = 32 * next_pow2(D / 32)``. ValueError names the violated constraint.
    """

    ROWS: int | None = None
    TILE_BYTES: int = 16384
    THREAD_ELEMS: int = 32
    num_warps: int | None = None
    PERSISTENT: bool = False
    SOFT_CAST: bool | None = None

    def __post_init__(self):
        for name, lo, hi in (("ROWS", 1, _MAX_ROWS), ("TILE_BYTES", 1024, 1 << 20), ("THREAD_ELEMS", 4, 128),
                             ("num_warps", 1, 32)):
            v = getattr(self, name)
            if v is None and name in ("ROWS", "num_warps"):
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"TilingConfig.{name} must be an int, got {v!r}")
            if not (_is_pow2(v) and lo <= v <= hi):
                raise ValueError(f"TilingConfig.{name}={v} must be a power of 2 in [{lo}, {hi}]")
        if not isinstance(self.PERSISTENT, bool):
            raise ValueError(f"TilingConfig.PERSISTENT must be a bool, got {self.PERSISTENT!r}")
        if self.SOFT_CAST is not None and not isinstance(self.SOFT_CAST, bool):
            raise ValueError(f"TilingConfig.SOFT_CAST must be a bool or None, got {self.SOFT_CAST!r}")


DEFAULT_CONFIG = TilingConfig()

# Proposed H200 tilings for T in {1K .. 128K} x D in {1K .. 16K} (bf16); every entry serves every D. Unmeasured.
PROPOSED_TILINGS = [
    {"name": "row-auto"},  # 16 KiB of x per program, ~32 elements/thread: D=1K -> 8 rows x 8 warps, 16K -> 1 x 16
    {"name": "row-auto-32k", "TILE_BYTES": 32768},  # twice the bytes in flight per program (more rows for D <= 8K)
    {"name": "row-auto-16ept", "THREAD_ELEMS": 16},  # twice the warps: fewer registers/thread, more latency hiding
    {"name": "row-auto-persistent", "PERSISTENT": True},  # no launch tail at T = 128K
]


# --------------------------------------------------------------------------------------------------------
# device code
# --------------------------------------------------------------------------------------------------------
@triton.jit
def _e8m0(a_bits, RCEIL: tl.constexpr):
    """E8M0 byte (int32) of block maxima given as sign-cleared fp32 bits (int32), see normfuse.mxfp8."""
    e = a_bits >> 23
    if RCEIL:
        s = e - 8 + ((a_bits & 0x7FFFFF) > 0x600000).to(tl.int32)
        s = tl.minimum(tl.maximum(s, 0), 254)
        s = tl.where(a_bits == 0x04600001, 0, s)  # amax / 448 rounds down to the subnormal 2^-127
        s = tl.where(a_bits == 0x7F800000, 254, s)  # Inf
    else:
        s = tl.maximum(e - 8, 0)  # Inf -> 247 (torchao FLOOR)
    return tl.where(a_bits > 0x7F800000, 255, s)  # NaN


@triton.jit
def _multiplier(s, RCEIL: tl.constexpr):
    """fp32 factor applied to y before the E4M3 cast, for E8M0 bytes ``s`` (int32): normfuse.mxfp8.data_multiplier."""
    if RCEIL:
        m = ((254 - tl.minimum(tl.maximum(s, 1), 253)) << 23).to(tl.float32, bitcast=True)
        m = tl.where(s == 0, 1.0, m)
        m = tl.where(s == 254, (s * 0 + 0x00400000).to(tl.float32, bitcast=True), m)  # 2^-127 (subnormal)
        m = tl.where(s == 255, float("nan"), m)
    else:
        m = ((254 - tl.maximum(s, 1)) << 23).to(tl.float32, bitcast=True)
        m = tl.where(s == 255, 0.0, m)  # torchao divides by inf: finite -> 0, Inf/NaN -> NaN
    return m


@triton.jit
def _soft_e4m3(v):
    """Saturating round-to-nearest-even fp32 -> E4M3 codes (uint8) with integer ops and fp32 adds only
    (normfuse.mxfp8.e4m3_rne_codes)."""
    b = v.to(tl.int32, bitcast=True)
    ab = b & 0x7FFFFFFF
    nan = ab > 0x7F800000
    ab = tl.minimum(ab, 0x43E00000)  # |v| <= 448 (Inf -> 448)
    normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - 960  # round the mantissa to 3 bits, rebias 127 -> 7
    a = ab.to(tl.float32, bitcast=True)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # rint(|v| * 2^9) below 2^-6
    code = tl.where(ab < 0x3C800000, sub, normal)
    code = tl.where(nan, 0x7F, code)
    code = code | ((b >> 24) & 0x80)
    return code.to(tl.uint8)


@triton.jit
def _tile(x_ptr, q_ptr, s_ptr, rstd_ptr, tile, M, KB, N, eps, mx_const,
          BLOCK_K: tl.constexpr, ROWS: tl.constexpr, MODE: tl.constexpr, RCEIL: tl.constexpr,
          SOFT_CAST: tl.constexpr):
    rows = tile * ROWS + tl.arange(0, ROWS)
    kk = tl.arange(0, BLOCK_K)
    jj = tl.arange(0, 32)
    row_ok = rows < M
    blk_ok = row_ok[:, None] & (kk < KB)[None, :]  # [ROWS, BLOCK_K]
    mask = blk_ok[:, :, None]
    offs = rows.to(tl.int64)[:, None, None] * N + (kk * 32)[None, :, None] + jj[None, None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if MODE == 0:  # RMSNorm: row sum of squares, then the block maxima of y
        ss = tl.sum(tl.sum(x * x, axis=2), axis=1)
        rstd = tl.math.rsqrt(ss / N + eps)
        y = x * rstd[:, None, None]
        a_bits = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
    else:  # MXNorm: block maxima of x, a K-element row sum, the block maxima of y from rstd * m
        m = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)
        if MODE == 1:
            g = tl.sum(m, axis=1) * mx_const
            ms = g * g
        else:
            ms = tl.sum(m * m, axis=1) * mx_const
        rstd = tl.math.rsqrt(ms + eps)
        y = x * rstd[:, None, None]
        a_bits = (m * rstd[:, None]).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    s = _e8m0(a_bits, RCEIL)
    q = y * _multiplier(s, RCEIL)[:, :, None]
    if SOFT_CAST:
        q8 = _soft_e4m3(q).to(tl.float8e4nv, bitcast=True)
    else:
        q8 = q.to(tl.float8e4nv)  # cvt.rn.satfinite.e4m3x2.f32
    tl.store(q_ptr + offs, q8, mask=mask)
    s_offs = rows.to(tl.int64)[:, None] * KB + kk[None, :]
    tl.store(s_ptr + s_offs, s.to(tl.uint8), mask=blk_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _mx_cast_kernel(x_ptr, q_ptr, s_ptr, rstd_ptr, M, KB, eps, mx_const, n_tiles,
                    BLOCK_K: tl.constexpr, ROWS: tl.constexpr, MODE: tl.constexpr, RCEIL: tl.constexpr,
                    SOFT_CAST: tl.constexpr, PERSISTENT: tl.constexpr):
    N = KB * 32  # D % 32 == 0 is now visible to the alignment analysis (16-byte vectors)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            _tile(x_ptr, q_ptr, s_ptr, rstd_ptr, tile, M, KB, N, eps, mx_const, BLOCK_K, ROWS, MODE, RCEIL,
                  SOFT_CAST)
    else:
        _tile(x_ptr, q_ptr, s_ptr, rstd_ptr, tl.program_id(0), M, KB, N, eps, mx_const, BLOCK_K, ROWS, MODE, RCEIL,
              SOFT_CAST)


# --------------------------------------------------------------------------------------------------------
# host code
# --------------------------------------------------------------------------------------------------------
def _as_config(config) -> TilingConfig:
    if config is None or isinstance(config, TilingConfig):
        return config or DEFAULT_CONFIG
    if isinstance(config, Mapping):
        return TilingConfig.from_dict(config)
    raise TypeError(f"config must be a dict, a TilingConfig or None, got {type(config).__name__}")


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def launch_params(M: int, D: int, dtype: torch.dtype, config=None, *, num_sms: int = _DEFAULT_NUM_SMS) -> dict:
    """Resolve ``config`` for ``x [M, D]`` of ``dtype``: ``BLOCK_K``, ``ROWS``, ``num_warps``, ``PERSISTENT``,
    ``SOFT_CAST``, ``n_tiles``, ``grid`` (host arithmetic only). ValueError for D not a multiple of 32 or > 65536."""
    cfg = _as_config(config)
    if D % BLOCK or D < BLOCK:
        raise ValueError(f"D = {D} must be a positive multiple of the MX block size {BLOCK}")
    if D > _MAX_D:
        raise ValueError(f"D = {D} > {_MAX_D}: the whole row must fit in registers (no looped variant)")
    itemsize = torch.empty((), dtype=dtype).element_size()
    block_k = triton.next_power_of_2(D // BLOCK)
    d_pad = block_k * BLOCK
    if cfg.ROWS is None:
        rows = max(1, cfg.TILE_BYTES // (d_pad * itemsize))
        rows = min(1 << (rows.bit_length() - 1), triton.next_power_of_2(M), _MAX_ROWS)
    else:
        rows = cfg.ROWS
    if cfg.num_warps is None:
        num_warps = min(32, max(4, triton.next_power_of_2(triton.cdiv(rows * d_pad, 32 * cfg.THREAD_ELEMS))))
    else:
        num_warps = cfg.num_warps
    n_tiles = triton.cdiv(M, rows)
    programs = min(n_tiles, num_sms * max(1, 32 // num_warps)) if cfg.PERSISTENT else n_tiles
    soft = _interpreting() or bool(cfg.SOFT_CAST)
    return dict(BLOCK_K=block_k, ROWS=rows, num_warps=num_warps, PERSISTENT=cfg.PERSISTENT, SOFT_CAST=soft,
                n_tiles=n_tiles, grid=(programs,))


def _prepare(op, x, p, eps, scale_mode, config, *, launch: bool):
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    check_forward_only(f"mxnorm.{op}", x=x)
    eps = check_eps(eps)
    if op == "mxnorm_mxfp8" and p is None:
        raise ValueError("mxnorm_mxfp8 needs p (1 or 2)")
    M, D = check_inputs(x, eps, p, scale_mode)
    mode = check_scale_mode(scale_mode)
    cfg = _as_config(config)
    if launch and x.device.type != "cuda" and not _interpreting():
        raise ValueError(f"inputs must be CUDA tensors (got device {x.device}); CPU tensors run only under "
                         "TRITON_INTERPRET=1")
    prm = launch_params(M, D, x.dtype, cfg, num_sms=_num_sms(x.device.index or 0) if x.is_cuda else _DEFAULT_NUM_SMS)
    data = torch.empty(M, D, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(M, D // BLOCK, dtype=torch.uint8, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    mode_id = 0 if op == "rmsnorm_mxfp8" else int(p)
    const = mx_constant(int(p), D) if mode_id else 0.0
    meta = dict(BLOCK_K=prm["BLOCK_K"], ROWS=prm["ROWS"], MODE=mode_id, RCEIL=mode == "rceil",
                SOFT_CAST=prm["SOFT_CAST"], PERSISTENT=prm["PERSISTENT"], num_warps=prm["num_warps"], num_stages=1)
    args = (x, data, scales, rstd, M, D // BLOCK, float(eps), const, prm["n_tiles"])
    return args, prm["grid"], meta, (data, scales, rstd)


def _launch(op, x, p, eps, scale_mode, config):
    args, grid, meta, outs = _prepare(op, x, p, eps, scale_mode, config, launch=True)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _mx_cast_kernel[grid](*args, **meta)
    return outs


def rmsnorm_mxfp8(x: torch.Tensor, *, eps: float = 1e-6, scale_mode: str = "floor",
                  config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm (no affine) fused with the MXFP8 cast, single pass: ``rstd = rsqrt(mean(x^2) + eps)``, ``y = x * rstd``,
    ``(data, scales) = MXFP8(y)``.

    ``x [T, D]``: row-major contiguous bf16/fp16/fp32 on a CUDA device (CPU tensors only under
    ``TRITON_INTERPRET=1``); any T >= 1, D a multiple of 32 (<= 65536). ``eps`` finite > 0. ``scale_mode``:
    "floor" (OCP, torchao's default) or "rceil". ``config``: dict, ``TilingConfig`` or None.

    Any number of elements (64-bit offsets) and any alignment (pointer loads).

    Returns ``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8 E8M0, rstd [T] fp32)``.
    Raises NotImplementedError when autograd would record through it (forward only), TypeError (dtype,
    non-tensor, config type) and ValueError (rank, contiguity, D % 32, D > 65536, eps (None included),
    scale_mode, config values, CPU tensors outside the interpreter). Source: module docstring.
    """
    return _launch("rmsnorm_mxfp8", x, None, eps, scale_mode, config)


def mxnorm_mxfp8(x: torch.Tensor, *, p: int = 2, eps: float = 1e-6, scale_mode: str = "floor",
                 config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXNorm fused with the MXFP8 cast, single pass: block absmaxes ``m`` of x, ``rstd = rsqrt(ms + eps)`` with
    ``ms = (sum m / (K c1))^2`` (p = 1) or ``sum m^2 / (K c2^2)`` (p = 2), scales from ``rstd * m``, data
    ``E4M3(x * rstd * 2^-e)``. ``p`` in {1, 2}; the rest as ``rmsnorm_mxfp8``.

    Returns ``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8, rstd [T] fp32)``. Raises as ``rmsnorm_mxfp8``,
    plus ValueError for p not in {1, 2}. Source: McLean et al., arXiv 2603.13180.
    """
    return _launch("mxnorm_mxfp8", x, p, eps, scale_mode, config)


def compile_sm90(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, p: int = 2,
                 scale_mode: str = "floor") -> dict:
    """Compile ``op`` ("rmsnorm_mxfp8" or "mxnorm_mxfp8") for sm_90 without launching; return
    ``normfuse.compile_only.summarize`` of it. Needs ``normfuse.compile_only.install(90)`` in this process and no
    ``TRITON_INTERPRET``. ``x [T, D]``: a CPU tensor of the real shape and dtype (never read)."""
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, x, eps=eps, config=config, p=p, scale_mode=scale_mode))


def compile_sm90_kernel(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, p: int = 2,
                        scale_mode: str = "floor"):
    """As ``compile_sm90`` but returns Triton's ``CompiledKernel`` (``.asm["ptx"]``, ``.metadata``)."""
    if _interpreting():
        raise RuntimeError("compile_sm90 cannot run under TRITON_INTERPRET=1")
    args, grid, meta, _ = _prepare(op, x, p if op == "mxnorm_mxfp8" else None, eps, scale_mode, config,
                                   launch=False)
    return _mx_cast_kernel.warmup(*args, grid=grid, **meta)


# --------------------------------------------------------------------------------------------------------
# test hook: the device helpers on given values (interpreter or GPU)
# --------------------------------------------------------------------------------------------------------
@triton.jit
def _helpers_kernel(a_ptr, v_ptr, s_ptr, m_ptr, c_ptr, n, RCEIL: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    a = tl.load(a_ptr + i, mask=ok, other=0.0)
    s = _e8m0(a.to(tl.int32, bitcast=True) & 0x7FFFFFFF, RCEIL)
    tl.store(s_ptr + i, s, mask=ok)
    tl.store(m_ptr + i, _multiplier(s, RCEIL), mask=ok)
    v = tl.load(v_ptr + i, mask=ok, other=0.0)
    tl.store(c_ptr + i, _soft_e4m3(v), mask=ok)


def device_helpers(amax: torch.Tensor, v: torch.Tensor, scale_mode: str = "floor"):
    """Run the kernels' device helpers elementwise (for tests): E8M0 bytes (int32) and multipliers (fp32) of the
    fp32 block maxima ``amax [n]``, and the software E4M3 codes (uint8) of the fp32 values ``v [n]``."""
    mode = check_scale_mode(scale_mode)
    a, v = amax.float().contiguous(), v.float().contiguous()
    if a.shape != v.shape or a.dim() != 1:
        raise ValueError("amax and v must be 1-D of the same length")
    n = a.numel()
    s = torch.empty(n, dtype=torch.int32, device=a.device)
    m = torch.empty(n, dtype=torch.float32, device=a.device)
    c = torch.empty(n, dtype=torch.uint8, device=a.device)
    _helpers_kernel[(triton.cdiv(n, 1024),)](a, v, s, m, c, n, RCEIL=mode == "rceil", BLOCK=1024)
    return s, m, c
