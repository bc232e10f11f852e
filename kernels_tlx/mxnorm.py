r"""MXNorm and RMSNorm fused with the MXFP8 cast in TLX (fbtriton 3.7.4) for the H200 (sm_90): one pass over each
row, with a persistent, hand-pipelined variant that streams row tiles through shared memory with 1-D bulk copies
(``cp.async.bulk``, global -> smem on an mbarrier ring, and smem -> global for the E4M3 data).

Math and check: ``normfuse.techniques.mxnorm`` (McLean et al., "MXNorm: Reusing MXFP block scales for efficient
tensor normalisation", arXiv 2603.13180, https://arxiv.org/abs/2603.13180); cast rules ``normfuse.mxfp8``
(torchao 0.18 ``to_mx``, FLOOR and RCEIL). Entry points as in ``kernels_{triton,helion}/mxnorm.py``:
``rmsnorm_mxfp8(x, *, eps, scale_mode, config)`` and ``mxnorm_mxfp8(x, *, p, eps, scale_mode, config)`` ->
``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8, rstd [T] fp32)``.

What TLX can and cannot do here (sm_90). TLX's own MXFP8 helpers (``tlx.mxfp8_utils``: ``_fused_amax_to_e8m0``
with ``cvt.rp.satfinite.ue8m0x2.f32``, ``mul.f32x2``) are sm_100 instructions and cannot be used on Hopper; the
E8M0 scales come from integer exponent arithmetic (``normfuse.mxfp8``; the same code as the Triton kernel) and the
elements from ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89+), or optionally a software cast (``SOFT_CAST``). What TLX adds
on Hopper is explicit data movement, used by the pipelined kernel.

Two kernels, picked by ``TilingConfig.STAGES``:

* ``STAGES == 0`` - plain (``_plain_kernel``): one program per ``ROWS``-row tile (or a persistent loop over tiles),
  x loaded as a masked ``[ROWS, D/32, 32]`` register tile. Plain Triton code compiled by fbtriton: the same-DSL
  baseline of the pipelined kernel; serves every D that is a multiple of 32 and every T.
* ``STAGES >= 2`` - pipelined (``_bulk_kernel``): a persistent grid; each program walks the full ``ROWS``-row tiles
  ``pid, pid + nprog, ...``. The rows of a tile are contiguous in memory (``ROWS * D`` elements), so one
  ``cp.async.bulk.shared::cta.global`` per tile fills a 1-D smem stage; ``STAGES`` stages form a ring with one
  mbarrier each (``barrier_expect_bytes`` = the tile's bytes, so the phase completes when the copy landed). Per tile:
  wait on the stage's barrier (phase ``(i // STAGES) & 1``), ``local_load`` through ``local_reshape`` to
  ``[ROWS * D/32, 32]`` (one 32-block per row of the view; no data movement), CTA barrier (every warp has read the
  stage; also orders the previous output store, below), re-arm the stage and issue the copy of tile
  ``i + STAGES`` into it, then compute. The E4M3 tile goes to one of two smem output buffers (``local_store``,
  ``fence.proxy.async``, CTA barrier) and leaves with one ``cp.async.bulk.global.shared::cta`` store (bulk group);
  before a buffer is rewritten, ``cp.async.bulk.wait_group.read 1`` (thread 0, which issued the stores) and the
  CTA barrier above guarantee the store issued two tiles earlier has read it. The program waits for all its stores
  before exiting. Scales and rstd (1/32 and 4/D of the bytes) use plain stores. The rows past the last full tile
  (``T % ROWS``) are done by the last program with the plain masked tile code. Needs ``ROWS * D`` a power of two
  (D a power of two) and the stages within 227 KB of shared memory; otherwise ValueError (the sweep's
  'unsupported').

The block and row reductions follow the Triton kernel: block maxima as an integer max over the sign-cleared fp32
bits (NaN-propagating), MXNorm scales from ``rstd * m`` (no reduction over y), RMSNorm's second block max over |y|.

Checks: ``tests/tlx/test_mxnorm_tlx.py`` compiles every shipped config for sm_90 on CPU (TLX has no interpreter)
and checks the PTX: the bulk copies in both directions, ``mbarrier.arrive.expect_tx`` with the tile's bytes,
``mbarrier.try_wait.parity``, ``fence.proxy.async``, the bulk-group commit/wait, ``cvt.rn.satfinite.e4m3x2``, no
spills. On the GPU: the H200 self-check ``python -m kernels_tlx.mxnorm [--quick]`` (PYTHONPATH=<fbtriton>,
TRITON_PTXAS_PATH as in dsl-primer A.1) and ``normfuse.gpu_checks`` (both pass; measured in results/mxnorm_kernels/).

Sources: TLX (fbtriton 3.7.4) ``async_load(bulk=True)`` / ``async_store`` / mbarrier API,
https://github.com/facebookexperimental/triton; the MXFP8 cast of ``shared/examples/triton_mxfp8_cast.py``.
Code written for this repo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from normfuse.codestats import ptxas_info
from normfuse.mxfp8 import check_scale_mode
from normfuse.techniques import mxnorm as _spec
from normfuse.tiling import TilingConfigBase
from normfuse.validate import aligned, check_eps, check_forward_only

SMEM_LIMIT_BYTES = 232448  # per-block opt-in shared memory on H100/H200 (227 KB)
SMEM_PER_SM_BYTES = 233472  # 228 KB per SM (1 KB of it reserved per resident CTA)
OPS = ("rmsnorm_mxfp8", "mxnorm_mxfp8")
BLOCK = _spec.BLOCK
_DEFAULT_NUM_SMS = 132
_MAX_D = 65536
MAX_ELEMS_PER_THREAD = 64  # fp32 elements of x per thread (registers)


def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tiling of the TLX MXFP8 kernels.

    Fields:
        ROWS: rows per tile (power of 2 in [1, 256]) or None: ``TILE_BYTES // (D * itemsize)`` rounded down to a
            power of 2, at least 1 (at most next_pow2(T) for the plain kernel).
        TILE_BYTES: bytes of x per tile when ROWS is None (power of 2 in [1024, 65536]).
        STAGES: 0 = plain kernel; 2..8 = pipelined bulk-copy kernel with that many input stages.
        CTAS_PER_SM: pipelined grid = min(#full tiles, #SMs * min(CTAS_PER_SM, CTAs that fit in 228 KB of shared
            memory)); plain persistent grid = #SMs * CTAS_PER_SM * max(1, 16 // num_warps) (1..8).
        PERSISTENT: plain kernel only: a persistent grid (#SMs * CTAS_PER_SM programs) instead of one per tile.
        num_warps: warps per CTA (power of 2, 1..32), or None: ``clamp(ROWS * D / (32 * 32), 4, 16)``, 32 where
            16 would leave a thread more than 64 elements (D > 32768).
        SOFT_CAST: integer E4M3 cast instead of ``cvt.rn.satfinite.e4m3x2.f32``.

    Construction validates the D-independent constraints, ``resolve(T, D, itemsize)`` the rest; both raise
    ValueError naming the constraint.
    """

    ROWS: int | None = None
    TILE_BYTES: int = 16384
    STAGES: int = 0
    CTAS_PER_SM: int = 1
    PERSISTENT: bool = False
    num_warps: int | None = None
    SOFT_CAST: bool = False

    def __post_init__(self):
        errors = []
        if self.ROWS is not None and not (_is_pow2(self.ROWS) and self.ROWS <= 256):
            errors.append(f"ROWS={self.ROWS!r} must be a power of 2 in [1, 256] or None")
        if not (_is_pow2(self.TILE_BYTES) and 1024 <= self.TILE_BYTES <= 65536):
            errors.append(f"TILE_BYTES={self.TILE_BYTES!r} must be a power of 2 in [1024, 65536]")
        if not (isinstance(self.STAGES, int) and not isinstance(self.STAGES, bool)
                and (self.STAGES == 0 or 2 <= self.STAGES <= 8)):
            errors.append(f"STAGES={self.STAGES!r} must be 0 (plain kernel) or in [2, 8]")
        if not (isinstance(self.CTAS_PER_SM, int) and not isinstance(self.CTAS_PER_SM, bool)
                and 1 <= self.CTAS_PER_SM <= 8):
            errors.append(f"CTAS_PER_SM={self.CTAS_PER_SM!r} must be an integer in [1, 8]")
        if not isinstance(self.PERSISTENT, bool):
            errors.append(f"PERSISTENT={self.PERSISTENT!r} must be a bool")
        if self.PERSISTENT and self.STAGES:
            errors.append("PERSISTENT applies to the plain kernel (STAGES=0); the pipelined kernel is always "
                          "persistent")
        if self.num_warps is not None and not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            errors.append(f"num_warps={self.num_warps!r} must be a power of 2 in [1, 32] or None")
        if not isinstance(self.SOFT_CAST, bool):
            errors.append(f"SOFT_CAST={self.SOFT_CAST!r} must be a bool")
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))

    def resolve(self, T: int, D: int, itemsize: int) -> dict:
        """Launch parameters for ``x [T, D]``: ROWS, BLOCK_K (= next_pow2(D/32)), num_warps, smem bytes. ValueError
        when this config cannot serve D (D not a multiple of 32 or > 65536; pipelined: D not a power of two,
        shared memory over 227 KB; registers: more than 64 elements of x per thread)."""
        if D % BLOCK or D < BLOCK or D > _MAX_D:
            raise ValueError(f"D = {D} must be a multiple of the MX block size {BLOCK} in [32, {_MAX_D}]")
        block_k = triton.next_power_of_2(D // BLOCK)
        d_pad = block_k * BLOCK
        if self.ROWS is not None:
            rows = self.ROWS
        else:
            rows = max(1, self.TILE_BYTES // (d_pad * itemsize))
            rows = 1 << (rows.bit_length() - 1)
            if not self.STAGES:
                rows = min(rows, triton.next_power_of_2(T))
        warps = self.num_warps or min(16, max(4, triton.next_power_of_2(rows * d_pad // (32 * 32))))
        if self.num_warps is None and rows * d_pad // (32 * warps) > MAX_ELEMS_PER_THREAD:
            warps = 32  # D > 32768 at ROWS = 1: 32 warps keep <= 64 elements per thread (D up to 65536)
        per_thread = rows * d_pad // (32 * warps)
        if per_thread > MAX_ELEMS_PER_THREAD:
            raise ValueError(f"config cannot serve D={D}: ROWS * D / (32 * num_warps) = {per_thread} elements of x "
                             f"per thread > {MAX_ELEMS_PER_THREAD} (registers; use fewer ROWS or more warps)")
        smem = 0
        if self.STAGES:
            if d_pad != D:
                raise ValueError(f"the pipelined kernel (STAGES={self.STAGES}) needs D a power of two (one bulk copy "
                                 f"of ROWS * D contiguous elements per tile), got D = {D}; use STAGES=0")
            tile = rows * D
            smem = self.STAGES * tile * itemsize + 2 * tile + 8 * self.STAGES
            if smem > SMEM_LIMIT_BYTES:
                raise ValueError(f"config cannot serve D={D}: {self.STAGES} stages x {tile * itemsize} B + 2 x {tile} "
                                 f"B output buffers = {smem} B of shared memory > {SMEM_LIMIT_BYTES}")
        return dict(ROWS=rows, BLOCK_K=block_k, num_warps=warps, smem=smem)


DEFAULT_CONFIG = TilingConfig()

# Proposed H200 tilings for T in {1K .. 128K} x D in {1K .. 16K}, bf16 (unmeasured; rank on the GPU with
# `python -m kernels_tlx.mxnorm`). Pipelined stage sizes: 16 KB of x per stage (ROWS = 8 at D = 1K, 1 at 8K);
# D = 16K needs 32 KB per row (ROWS = 1).
SHIPPED_CONFIGS = {
    "plain": DEFAULT_CONFIG,  # one program per ~16 KB row tile, like the Triton kernel
    "bulk3": TilingConfig(STAGES=3, CTAS_PER_SM=2),  # 3 x 16-32 KB in flight per CTA, 2 CTAs/SM
    "bulk4_32k": TilingConfig(STAGES=4, TILE_BYTES=32768, CTAS_PER_SM=1),  # 4 x 32 KB in flight, 1 CTA/SM, 16 warps
}


# ------------------------------------------------------------------------------------------------------------
# device helpers (same integer rules as kernels_triton/mxnorm.py; see normfuse/mxfp8.py)
# ------------------------------------------------------------------------------------------------------------
@triton.jit
def _e8m0(a_bits, RCEIL: tl.constexpr):
    e = a_bits >> 23
    if RCEIL:
        s = e - 8 + ((a_bits & 0x7FFFFF) > 0x600000).to(tl.int32)
        s = tl.minimum(tl.maximum(s, 0), 254)
        s = tl.where(a_bits == 0x04600001, 0, s)
        s = tl.where(a_bits == 0x7F800000, 254, s)
    else:
        s = tl.maximum(e - 8, 0)
    return tl.where(a_bits > 0x7F800000, 255, s)


@triton.jit
def _multiplier(s, RCEIL: tl.constexpr):
    if RCEIL:
        m = ((254 - tl.minimum(tl.maximum(s, 1), 253)) << 23).to(tl.float32, bitcast=True)
        m = tl.where(s == 0, 1.0, m)
        m = tl.where(s == 254, (s * 0 + 0x00400000).to(tl.float32, bitcast=True), m)
        m = tl.where(s == 255, float("nan"), m)
    else:
        m = ((254 - tl.maximum(s, 1)) << 23).to(tl.float32, bitcast=True)
        m = tl.where(s == 255, 0.0, m)
    return m


@triton.jit
def _to_e4m3(v, SOFT_CAST: tl.constexpr):
    if SOFT_CAST:
        b = v.to(tl.int32, bitcast=True)
        ab = b & 0x7FFFFFFF
        nan = ab > 0x7F800000
        ab = tl.minimum(ab, 0x43E00000)
        normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - 960
        a = ab.to(tl.float32, bitcast=True)
        sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
        code = tl.where(ab < 0x3C800000, sub, normal)
        code = tl.where(nan, 0x7F, code) | ((b >> 24) & 0x80)
        return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    return v.to(tl.float8e4nv)  # cvt.rn.satfinite.e4m3x2.f32


@triton.jit
def _plain_tile(x_ptr, q_ptr, s_ptr, rstd_ptr, tile, M, KB, N, eps, mx_const, BLOCK_K: tl.constexpr,
                ROWS: tl.constexpr, MODE: tl.constexpr, RCEIL: tl.constexpr, SOFT_CAST: tl.constexpr):
    """ROWS rows as a masked [ROWS, BLOCK_K, 32] register tile (the Triton kernel's tile code)."""
    rows = tile * ROWS + tl.arange(0, ROWS)
    kk = tl.arange(0, BLOCK_K)
    jj = tl.arange(0, 32)
    row_ok = rows < M
    blk_ok = row_ok[:, None] & (kk < KB)[None, :]
    mask = blk_ok[:, :, None]
    offs = rows.to(tl.int64)[:, None, None] * N + (kk * 32)[None, :, None] + jj[None, None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if MODE == 0:
        rstd = tl.math.rsqrt(tl.sum(tl.sum(x * x, axis=2), axis=1) / N + eps)
        y = x * rstd[:, None, None]
        a_bits = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
    else:
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
    q = _to_e4m3(y * _multiplier(s, RCEIL)[:, :, None], SOFT_CAST)
    tl.store(q_ptr + offs, q, mask=mask)
    tl.store(s_ptr + rows.to(tl.int64)[:, None] * KB + kk[None, :], s.to(tl.uint8), mask=blk_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _plain_kernel(x_ptr, q_ptr, s_ptr, rstd_ptr, M, KB, eps, mx_const, n_tiles, BLOCK_K: tl.constexpr,
                  ROWS: tl.constexpr, MODE: tl.constexpr, RCEIL: tl.constexpr, SOFT_CAST: tl.constexpr,
                  PERSISTENT: tl.constexpr):
    N = KB * 32
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            _plain_tile(x_ptr, q_ptr, s_ptr, rstd_ptr, tile, M, KB, N, eps, mx_const, BLOCK_K, ROWS, MODE, RCEIL,
                        SOFT_CAST)
    else:
        _plain_tile(x_ptr, q_ptr, s_ptr, rstd_ptr, tl.program_id(0), M, KB, N, eps, mx_const, BLOCK_K, ROWS, MODE,
                    RCEIL, SOFT_CAST)


@triton.jit
def _blocks_math(x, eps, mx_const, ROWS: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr,
                 RCEIL: tl.constexpr, SOFT_CAST: tl.constexpr):
    """The pipelined kernel's math on a tile viewed as ``[ROWS * KB, 32]`` fp32 (one 32-block per row): returns the
    E4M3 tile (same shape), the E8M0 bytes ``[ROWS * KB]`` (int32) and rstd ``[ROWS]``. Pure ``tl`` code, so the
    Triton interpreter can run it (``_blocks_math_kernel``)."""
    NB: tl.constexpr = ROWS * KB
    if MODE == 0:
        ss = tl.sum(tl.reshape(tl.sum(x * x, axis=1), [ROWS, KB]), axis=1)
        rstd = tl.math.rsqrt(ss / D + eps)
        rb = tl.reshape(tl.broadcast_to(rstd[:, None], [ROWS, KB]), [NB])
        y = x * rb[:, None]
        a_bits = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    else:
        m = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1).to(tl.float32, bitcast=True)  # [NB]
        m2 = tl.reshape(m, [ROWS, KB])
        if MODE == 1:
            g = tl.sum(m2, axis=1) * mx_const
            ms = g * g
        else:
            ms = tl.sum(m2 * m2, axis=1) * mx_const
        rstd = tl.math.rsqrt(ms + eps)
        rb = tl.reshape(tl.broadcast_to(rstd[:, None], [ROWS, KB]), [NB])
        y = x * rb[:, None]
        a_bits = (m * rb).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    s = _e8m0(a_bits, RCEIL)
    q = _to_e4m3(y * _multiplier(s, RCEIL)[:, None], SOFT_CAST)
    return q, s, rstd


@triton.jit
def _blocks_math_kernel(x_ptr, q_ptr, s_ptr, rstd_ptr, eps, mx_const, ROWS: tl.constexpr, KB: tl.constexpr,
                        D: tl.constexpr, MODE: tl.constexpr, RCEIL: tl.constexpr, SOFT_CAST: tl.constexpr):
    """Test hook: ``_blocks_math`` on the full tile ``program_id`` loaded with ``tl.load`` instead of a bulk copy,
    stored like the pipelined kernel (interpreter-runnable: no TLX op)."""
    t = tl.program_id(0)
    NB: tl.constexpr = ROWS * KB
    bb = tl.arange(0, NB)
    jj = tl.arange(0, 32)
    offs = t.to(tl.int64) * (ROWS * D) + bb[:, None] * 32 + jj[None, :]
    x = tl.load(x_ptr + offs).to(tl.float32)
    q, s, rstd = _blocks_math(x, eps, mx_const, ROWS, KB, D, MODE, RCEIL, SOFT_CAST)
    tl.store(q_ptr + offs, q)
    tl.store(s_ptr + t.to(tl.int64) * NB + bb, s.to(tl.uint8))
    tl.store(rstd_ptr + t * ROWS + tl.arange(0, ROWS), rstd)


@triton.jit
def _bulk_kernel(x_ptr, q_ptr, s_ptr, rstd_ptr, M, eps, mx_const, n_full, D: tl.constexpr, ROWS: tl.constexpr,
                 STAGES: tl.constexpr, MODE: tl.constexpr, RCEIL: tl.constexpr, SOFT_CAST: tl.constexpr):
    """Persistent; program pid handles the full tiles pid, pid + nprog, ... (module docstring)."""
    KB: tl.constexpr = D // 32
    NB: tl.constexpr = ROWS * KB  # 32-blocks per tile
    TILE: tl.constexpr = ROWS * D  # elements per tile (contiguous in x)
    TILE_BYTES: tl.constexpr = TILE * (x_ptr.dtype.element_ty.primitive_bitwidth // 8)
    in_bufs = tlx.local_alloc((TILE, ), x_ptr.dtype.element_ty, STAGES)
    out_bufs = tlx.local_alloc((TILE, ), tl.float8e4nv, 2)
    full = tlx.alloc_barriers(num_barriers=STAGES, arrive_count=1)
    tl.debug_barrier()  # the mbarrier inits (one thread) are visible to every warp before anyone waits on them
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    my_tiles = tl.cdiv(n_full - pid, nprog)
    for j in tl.static_range(STAGES):  # prologue: fill the ring
        if j < my_tiles:
            t0 = pid + j * nprog
            tlx.barrier_expect_bytes(full[j], TILE_BYTES)
            tlx.async_load(x_ptr + t0.to(tl.int64) * TILE, in_bufs[j], bulk=True, barrier=full[j])
    bb = tl.arange(0, NB)
    jj = tl.arange(0, 32)
    for i in range(0, my_tiles):
        st = i % STAGES
        t = pid + i * nprog
        tlx.barrier_wait(full[st], (i // STAGES) & 1)
        x = tlx.local_load(tlx.local_reshape(in_bufs[st], [NB, 32])).to(tl.float32)  # one 32-block per row
        tlx.async_descriptor_store_wait(1)  # (thread 0) the store issued 2 tiles ago has read its buffer
        tl.debug_barrier()  # every warp read stage st; every warp may now rewrite that output buffer
        if i + STAGES < my_tiles:  # refill stage st with the tile STAGES ahead
            tlx.barrier_expect_bytes(full[st], TILE_BYTES)
            tlx.async_load(x_ptr + (t + STAGES * nprog).to(tl.int64) * TILE, in_bufs[st], bulk=True,
                           barrier=full[st])
        q, s, rstd = _blocks_math(x, eps, mx_const, ROWS, KB, D, MODE, RCEIL, SOFT_CAST)
        ob = out_bufs[i % 2]
        tlx.local_store(tlx.local_reshape(ob, [NB, 32]), q)
        tlx.fence("async_shared")  # generic-proxy smem writes -> visible to the bulk copy (async proxy)
        tl.debug_barrier()
        tlx.async_store(q_ptr + t.to(tl.int64) * TILE, ob, TILE)
        tl.store(s_ptr + t.to(tl.int64) * NB + bb, s.to(tl.uint8))
        tl.store(rstd_ptr + t * ROWS + tl.arange(0, ROWS), rstd)
    tlx.async_descriptor_store_wait(0)  # smem must outlive the bulk stores that read it
    if pid == nprog - 1:  # rows past the last full tile: plain masked code
        if n_full * ROWS < M:
            _plain_tile(x_ptr, q_ptr, s_ptr, rstd_ptr, n_full, M, KB, D, eps, mx_const, KB, ROWS, MODE, RCEIL,
                        SOFT_CAST)


# ------------------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------------------
def _as_config(config) -> TilingConfig:
    if config is None or isinstance(config, TilingConfig):
        return config or DEFAULT_CONFIG
    if isinstance(config, Mapping):
        return TilingConfig.from_dict(config)
    raise TypeError(f"config must be a dict, a TilingConfig or None, got {type(config).__name__}")


def _num_sms(x: torch.Tensor) -> int:
    if x.is_cuda:
        return torch.cuda.get_device_properties(x.device).multi_processor_count
    return _DEFAULT_NUM_SMS


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _launch(op, x, p, eps, scale_mode, config, *, need_cuda: bool, compile_only: bool = False):
    """Validate, allocate, launch (or ``warmup`` for compile-only). Returns (outputs, compiled-or-None, params).
    Under ``TRITON_INTERPRET=1`` (CPU tensors allowed) only the plain kernel runs, with the software E4M3 cast."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    check_forward_only(f"mxnorm.{op}", x=x)
    eps = check_eps(eps)
    if op == "mxnorm_mxfp8" and p is None:
        raise ValueError("mxnorm_mxfp8 needs p (1 or 2)")
    M, D = _spec.check_inputs(x, eps, p, scale_mode)
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    mode = check_scale_mode(scale_mode)
    cfg = _as_config(config)
    prm = cfg.resolve(M, D, x.element_size())
    interp = _interpreting() and not compile_only
    if interp:
        if cfg.STAGES:
            raise ValueError("the pipelined kernel (STAGES > 0) uses TLX ops, which TRITON_INTERPRET cannot run; "
                             "test its math with emulate_pipelined")
        cfg = TilingConfig.from_dict(dict(cfg.to_dict(), SOFT_CAST=True))  # the interpreter's fp8 casts are wrong
    elif need_cuda and x.device.type != "cuda":
        raise ValueError(f"inputs must be CUDA tensors, got device {x.device}")
    data = torch.empty(M, D, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(M, D // BLOCK, dtype=torch.uint8, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    mode_id = 0 if op == "rmsnorm_mxfp8" else int(p)
    const = _spec.mx_constant(int(p), D) if mode_id else 0.0
    rows = prm["ROWS"]
    common = dict(ROWS=rows, MODE=mode_id, RCEIL=mode == "rceil", SOFT_CAST=cfg.SOFT_CAST,
                  num_warps=prm["num_warps"], num_stages=1)
    if cfg.STAGES:
        x = aligned(x)  # cp.async.bulk needs 16-byte aligned addresses: a misaligned view is copied first
        n_full = M // rows
        fit = max(1, (SMEM_PER_SM_BYTES - 1024) // (prm["smem"] + 1024))  # CTAs per SM that shared memory allows
        grid = (max(1, min(n_full, _num_sms(x) * min(cfg.CTAS_PER_SM, fit))), )
        kernel, args = _bulk_kernel, (x, data, scales, rstd, M, float(eps), const, n_full)
        kw = dict(common, D=D, STAGES=cfg.STAGES)
    else:
        n_tiles = triton.cdiv(M, rows)
        grid = (min(n_tiles, _num_sms(x) * cfg.CTAS_PER_SM * max(1, 16 // prm["num_warps"])) if cfg.PERSISTENT
                else n_tiles, )
        kernel, args = _plain_kernel, (x, data, scales, rstd, M, D // BLOCK, float(eps), const, n_tiles)
        kw = dict(common, BLOCK_K=prm["BLOCK_K"], PERSISTENT=cfg.PERSISTENT)
    if compile_only:
        return (data, scales, rstd), kernel.warmup(*args, grid=grid, **kw), dict(prm, grid=list(grid))
    kernel[grid](*args, **kw)
    return (data, scales, rstd), None, dict(prm, grid=list(grid))


def rmsnorm_mxfp8(x: torch.Tensor, *, eps: float = 1e-6, scale_mode: str = "floor",
                  config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm (no affine) fused with the MXFP8 cast, one pass: ``rstd = rsqrt(mean(x^2) + eps)``,
    ``(data, scales) = MXFP8(x * rstd)``.

    Args:
        x: ``[T, D]`` bf16/fp16/fp32, row-major contiguous, CUDA; T >= 1, D a multiple of 32 (a power of two for
            the pipelined configs).
        eps: finite, > 0. scale_mode: "floor" (OCP) or "rceil".
        config: ``TilingConfig``, a dict of overrides, or None (``DEFAULT_CONFIG``, the plain kernel).

    Returns:
        ``(data [T, D] float8_e4m3fn, scales [T, D/32] uint8 E8M0, rstd [T] fp32)``.

    Any number of elements (64-bit offsets) and any alignment: the pipelined kernel copies a 16-byte-misaligned
    x (a view with a storage offset) to aligned memory first (``cp.async.bulk`` needs aligned addresses).

    Raises:
        NotImplementedError: autograd would record through it (forward only).
        TypeError: non-tensor x, unsupported dtype, config of the wrong type.
        ValueError: rank, contiguity, D % 32, D > 65536, eps (None included), scale_mode, non-CUDA tensors,
            invalid config or one that cannot serve D (``TilingConfig.resolve``).
    """
    return _launch("rmsnorm_mxfp8", x, None, eps, scale_mode, config, need_cuda=not _interpreting())[0]


def mxnorm_mxfp8(x: torch.Tensor, *, p: int = 2, eps: float = 1e-6, scale_mode: str = "floor",
                 config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXNorm fused with the MXFP8 cast, one pass: block absmaxes ``m`` of x, ``rstd = rsqrt(ms + eps)`` with
    ``ms = (sum m / (K c1))^2`` (p = 1) or ``sum m^2 / (K c2^2)`` (p = 2), scales from ``rstd * m``. ``p`` in
    {1, 2}; everything else as ``rmsnorm_mxfp8``. Source: McLean et al., arXiv 2603.13180."""
    return _launch("mxnorm_mxfp8", x, p, eps, scale_mode, config, need_cuda=not _interpreting())[0]


def compile_sm90(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, p: int = 2,
                 scale_mode: str = "floor") -> dict:
    """Compile ``op`` ("rmsnorm_mxfp8" or "mxnorm_mxfp8") for sm_90 without a GPU (never launches); the caller must
    have run ``normfuse.compile_only.install(90)``. ``x [T, D]``: a CPU tensor of the real shape/dtype (never read).

    Returns ``normfuse.compile_only.summarize(...)`` plus ``ptx_extra`` (counts of the bulk copies in each direction,
    expect_tx, try_wait, fence.proxy.async, bulk-group commit/wait, bar.sync, the E4M3 cvt), ``ptxas``
    (registers, spill bytes) and the resolved parameters. Raises like the ops (minus the CUDA check)."""
    from normfuse.compile_only import summarize

    _, ck, prm = _launch(op, x, p if op == "mxnorm_mxfp8" else None, eps, scale_mode, config, need_cuda=False,
                         compile_only=True)
    ptx = ck.asm["ptx"]
    out = summarize(ck)
    out["ptx_extra"] = {
        "bulk_load": ptx.count("cp.async.bulk.shared::cta.global") + ptx.count("cp.async.bulk.shared::cluster.global"),
        "bulk_store": ptx.count("cp.async.bulk.global.shared::cta"),
        "expect_tx": ptx.count("mbarrier.arrive.expect_tx"),
        "try_wait": ptx.count("mbarrier.try_wait"),
        "fence_proxy_async": ptx.count("fence.proxy.async"),
        "bulk_commit": ptx.count("cp.async.bulk.commit_group"),
        "bulk_wait": ptx.count("cp.async.bulk.wait_group"),
        "bar_sync": ptx.count("bar.sync"),
        "cvt_e4m3": ptx.count("cvt.rn.satfinite.e4m3x2.f32"),
    }
    out["ptxas"] = ptxas_info(ptx)
    out["params"] = prm
    out["config"] = _as_config(config).to_dict()
    return out


def emulate_pipelined(op: str, x: torch.Tensor, *, p: int | None = None, eps: float = 1e-6,
                      scale_mode: str = "floor", config=None):
    """Test hook (runs under ``TRITON_INTERPRET=1`` on CPU tensors, or on a GPU): what the pipelined kernel of
    ``config`` computes, with its data movement replaced: ``_blocks_math`` (the same device function) on each full
    ``ROWS``-row tile loaded with ``tl.load``, and the plain tile code on the remaining rows, exactly as the last
    program does. Returns ``(data, scales, rstd)``. Raises like the ops, and ValueError unless ``config.STAGES``."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    eps = check_eps(eps)
    M, D = _spec.check_inputs(x, eps, p, scale_mode)
    cfg = _as_config(config)
    if not cfg.STAGES:
        raise ValueError("emulate_pipelined needs a pipelined config (STAGES > 0)")
    prm = cfg.resolve(M, D, x.element_size())
    rows, kb = prm["ROWS"], D // BLOCK
    mode_id = 0 if op == "rmsnorm_mxfp8" else int(p)
    const = _spec.mx_constant(int(p), D) if mode_id else 0.0
    rceil = check_scale_mode(scale_mode) == "rceil"
    soft = cfg.SOFT_CAST or _interpreting()
    data = torch.empty(M, D, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(M, kb, dtype=torch.uint8, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    n_full = M // rows
    if n_full:
        _blocks_math_kernel[(n_full, )](x, data, scales, rstd, float(eps), const, ROWS=rows, KB=kb, D=D, MODE=mode_id,
                                        RCEIL=rceil, SOFT_CAST=soft, num_warps=prm["num_warps"])
    if n_full * rows < M:
        r0 = n_full * rows
        _plain_kernel[(1, )](x[r0:], data[r0:], scales[r0:], rstd[r0:], M - r0, kb, float(eps), const, 1,
                             BLOCK_K=kb, ROWS=rows, MODE=mode_id, RCEIL=rceil, SOFT_CAST=soft, PERSISTENT=False,
                             num_warps=prm["num_warps"])
    return data, scales, rstd


# ------------------------------------------------------------------------------------------------------------
# GPU self-check: python -m kernels_tlx.mxnorm [--quick] [--no-bench] [--config NAME ...]
# ------------------------------------------------------------------------------------------------------------
_CHECK_SHAPES = [(1, 32), (7, 1024), (257, 1056), (4096, 4096), (1000, 16384), (4099, 2048)]
_BENCH_T = (1024, 4096, 16384, 65536, 131072)
_BENCH_D = (1024, 2048, 4096, 8192, 16384)


def _self_check(argv=None) -> int:
    """Every shipped config x op x p x scale mode against ``normfuse.techniques.mxnorm.check`` (rstd to 1e-5, scales
    bit-exact, data within one code) at the shapes above (T = 1, tail rows after the last full tile, ragged D where
    the config serves it, the corner-case rows), both E4M3 casts agreeing, then GB/s (bytes of
    ``mxnorm.bytes_moved``) against torch.compile RMSNorm + FLOOR cast at T x D of the mxnorm_kernels sweep.
    A hung launch (barrier deadlock) aborts after ``--hang-timeout`` s with a traceback."""
    import argparse
    import faulthandler
    import sys

    ap = argparse.ArgumentParser(description="GPU correctness + speed check of the TLX MXFP8 kernels")
    ap.add_argument("--config", action="append", choices=sorted(SHIPPED_CONFIGS))
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--quick", action="store_true", help="benchmark only T in {4096, 16384} x D in {1024, 4096, 16384}")
    ap.add_argument("--hang-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    names = args.config or list(SHIPPED_CONFIGS)
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)

    def guarded(fn):
        faulthandler.dump_traceback_later(args.hang_timeout, exit=True, file=sys.__stderr__)
        try:
            out = fn()
            torch.cuda.synchronize()
            return out
        finally:
            faulthandler.cancel_dump_traceback_later()

    def call(variant, x, mode, cfg):
        if variant == "rmsnorm_cast":
            return rmsnorm_mxfp8(x, eps=1e-6, scale_mode=mode, config=cfg)
        return mxnorm_mxfp8(x, p=_spec.P_OF[variant], eps=1e-6, scale_mode=mode, config=cfg)

    failures = []
    for M, D in _CHECK_SHAPES:
        for mode in ("floor", "rceil"):
            inp = _spec.make_inputs(M, D, dtype="bf16", device="cuda", seed=M + D, scale_mode=mode)
            for variant in _spec.VARIANTS:
                for name in names:
                    cfg = SHIPPED_CONFIGS[name]
                    try:
                        cfg.resolve(M, D, 2)
                    except ValueError:
                        continue
                    print(f"[run ] {name:10s} {variant:12s} {mode:5s} T={M:5d} D={D:5d} ...", end=" ", flush=True)
                    out = guarded(lambda: call(variant, inp["x"], mode, cfg))
                    r = _spec.check("norm_cast", out, inp, 1e-6, variant)
                    soft = guarded(lambda: call(variant, inp["x"], mode, dict(cfg.to_dict(), SOFT_CAST=True)))
                    same = torch.equal(out[1], soft[1]) and int(
                        (out[0].view(torch.uint8) != soft[0].view(torch.uint8)).sum()) <= int(
                        torch.isnan(out[0].float()).sum())  # NaN codes may differ in sign only
                    ok = r["ok"] and same
                    if not ok:
                        failures.append(f"{name} {variant} {mode} {M}x{D}")
                    print(f"{'ok  ' if ok else 'FAIL'} codes={r['code_mismatches']} maxdist={r['max_abs_err']:.0f} "
                          f"scales_bad={r['scale_mismatch_rel_err']:.1e} rstd_rel={r['rstd_rel_err']:.1e} "
                          f"soft==hw {same}", flush=True)
            del inp

    if not args.no_bench:
        from triton.testing import do_bench

        Ts = (4096, 16384) if args.quick else _BENCH_T
        Ds = (1024, 4096, 16384) if args.quick else _BENCH_D
        print("--- timing bf16 FLOOR, do_bench median; GB/s = mxnorm.bytes_moved / t ---", flush=True)
        for M in Ts:
            for D in Ds:
                x = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
                nbytes = _spec.bytes_moved("norm_cast", M, D)
                torch._dynamo.reset()
                tc = torch.compile(lambda x: _spec.torch_rmsnorm_cast(x, 1e-6, "floor"), dynamic=False)
                guarded(lambda: tc(x))
                line = [f"T={M:6d} D={D:5d} tc_rms_cast {nbytes / guarded(lambda: do_bench(lambda: tc(x), return_mode='median')) / 1e6:6.0f}"]
                for name in names:
                    cfg = SHIPPED_CONFIGS[name]
                    try:
                        cfg.resolve(M, D, 2)
                    except ValueError:
                        continue
                    for variant in ("rmsnorm_cast", "mxnorm_p2"):
                        fn = (lambda: call(variant, x, "floor", cfg))
                        guarded(fn)
                        ms = guarded(lambda: do_bench(fn, return_mode="median"))
                        line.append(f"{name}/{variant} {nbytes / ms / 1e6:6.0f}")
                print("  ".join(line) + "  GB/s", flush=True)
                del x
                torch.cuda.empty_cache()

    print("ALL OK" if not failures else f"{len(failures)} FAILURE(S): " + "; ".join(failures), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(_self_check())
