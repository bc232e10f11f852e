r"""Naive fusion (post-norm GEMM with a full-N epilogue) in TLX for the H200 (sm_90): ``y = norm(a @ b)`` from a
warp-specialized, persistent TMA + wgmma GEMM whose CTA owns complete output rows.

Math (fp32 statistics of the fp32 accumulator, output in the input dtype)::

    c = a @ b                                                   (fp32 accumulator, never rounded)
    LayerNorm: mean = sum(c) / N; var = sum((c - mean)^2) / N;  y = (c - mean) * rsqrt(var + eps) (* w + bias)
    RMSNorm:   rstd = rsqrt(sum(c^2) / N + eps);                y = c * rstd (* w)

LayerNorm is two-pass on the resident accumulator (mean first, then the centred sum of squares), never
``E[c^2] - mean^2``. The statistics come from the unrounded fp32 row, so the result is slightly *more* accurate
than the unfused pair (which rounds ``c`` to bf16 before normalizing).

Kernel structure (``_naive_fusion_ws_kernel``; one CTA per SM, persistent over row tiles of ``BLOCK_M`` rows):

- The tile is ``BLOCK_M`` complete rows (64 or 128) by all of N. Its fp32 accumulator lives in the registers of
  ``NUM_CONSUMERS = (BLOCK_M / 64) * N_SPLIT`` consumer warpgroups: warpgroup ``cid`` owns rows
  ``[rg * 64, rg * 64 + 64)`` (``rg = cid // N_SPLIT``, one m64 wgmma) and columns ``[cs * WG_N, cs * WG_N + WG_N)``
  (``cs = cid % N_SPLIT``), a ``64 x WG_N`` fp32 accumulator = ``WG_N / 2`` registers per thread.
  ``WG_N = min(WG_BLOCK_N, next_pow2(N))`` (at least 32, the wgmma N minimum in TLX) and
  ``N_SPLIT = cdiv(N, WG_N)``. Example: N = 512 with ``WG_BLOCK_N = 256`` is two warpgroups of 128 accumulator
  registers each sharing the same 64 rows; one warpgroup would need 256 (impossible: 255 is the hardware
  maximum and addresses, statistics and the output need some too).
- **Producer** (the ``"default"`` task, 4 warps): with ``B_RESIDENT`` it first loads all of B (``K_TILES`` x
  ``N_SPLIT`` TMA boxes of ``[BLOCK_K, WG_N]``) once into shared memory, completing on ``b_bar``; then, for every
  row tile of this CTA and every K step, it waits on ``empty[s]``, arms ``full[s]`` with the stage's bytes and
  issues one TMA load of ``[64, BLOCK_K]`` per row group (plus, without ``B_RESIDENT``, the ``N_SPLIT`` B boxes
  of this K step). K is small here (64-256: 1-4 K steps), so the ring of ``NUM_STAGES`` K steps mostly runs
  *across tiles*: the next tiles' A is in flight while the consumers run this tile's epilogue.
- **Consumers** (``NUM_CONSUMERS`` replicated 4-warp tasks with ``setmaxnreg``): per K step, wait ``full[s]``,
  issue the wgmma of their A rows with their B columns, ``async_dot_wait(1)`` and release the previous slot
  (``empty[s]`` counts ``NUM_CONSUMERS`` arrivals). Then the epilogue on the resident accumulator:

  * row partial sums of their column slice (``tl.sum(acc, 1)``), then, if ``N_SPLIT > 1``, the **exchange**
    (``_row_allreduce``): each warpgroup stores its ``[64]`` fp32 partial into its own slot of a shared buffer,
    the ``N_SPLIT`` warpgroups of the row group meet at a hardware named barrier (``bar.sync 8 + rg,
    128 * N_SPLIT``: all their shared stores are then visible to all of them), and every warpgroup adds all
    ``N_SPLIT`` slots in slot order, so all of them hold bit-identical totals;
  * LayerNorm: ``mean = total / N``, the centred slice (padding columns >= N forced to 0), a second exchange of
    the centred sums of squares, ``rstd``; RMSNorm: one exchange of the sums of squares;
  * optional affine (``weight``/``bias`` loaded per tile, L1/L2-resident; with ``EPILOGUE_SUBTILE`` one half of
    the slice at a time, which keeps 4-warpgroup configs free of spills), cast, TMA store of ``[64, WG_N]``
    (two ``[64, WG_N / 2]`` stores with ``EPILOGUE_SUBTILE``; rows >= M and columns >= N are clipped by TMA, and
    a box lying wholly past row M or column N is skipped); the ``cs == 0`` warpgroup of each row group stores
    ``mean``/``rstd`` (masked rows).

Exchange buffer protocol (no mbarriers; shared slots ``red[2 * NUM_CONSUMERS]`` of ``[64]`` fp32): exchange
number ``e`` (a per-warpgroup running count, identical in the warpgroups of a row group since they walk the same
tiles) uses the slot bank ``e % 2``. Write-after-read safety: a warpgroup overwrites bank ``e % 2`` at exchange
``e + 2`` only after passing the named barrier of exchange ``e + 1``, which every warpgroup of its row group
reaches only after reading bank ``e % 2`` at exchange ``e``. Read-after-write: ``bar.sync`` orders the
participating threads' shared-memory accesses. Row groups use distinct barrier ids (8, 9) and slots; ids 0-6 are
used by the compiler's warp specialization (the consumers' own ``bar.sync`` s, the partition handshakes).

Barrier protocol of the ring (as in ``kernels_tlx.lazy_prenorm``; slot ``s = it % NUM_STAGES``, parity
``(it // NUM_STAGES) & 1``, one global K-step counter ``it`` per task, identical sequences in every task):
``full[s]`` = 1 arrival (the producer's ``arrive.expect_tx``) + the stage's TMA bytes (a box always delivers its
full byte count, zero-filled out of bounds); ``empty[s]`` = ``NUM_CONSUMERS`` arrivals; the producer waits with
parity ``^ 1`` (a slot's first use passes). ``b_bar`` is armed once with all of B's bytes and waited on with
parity 0 by every consumer before its first tile (it is never re-armed). A row group lying wholly below row M
(M = 1, M = 65, ...) has its A row coordinate clamped to M - 1: it computes on real rows and skips its stores.

Limits (each raises ValueError naming it; the sweep records ``unsupported``): ``N <= MAX_N = 512`` -- the
``64 x N`` fp32 accumulator of one row group is ``N / 2`` registers per thread of one warpgroup, split over at
most ``MAX_CONSUMERS = 4`` warpgroups that share the 64 K-register file, with ``REG_HEADROOM`` registers per
thread left for the epilogue (see ``TilingConfig.plan``; at 4 warpgroups ``EPILOGUE_SUBTILE`` is required);
the shared memory of the A ring + B (resident or streamed) + the epilogue staging within 227 KB; K and N
multiples of 8 (16-byte TMA rows).

Why this shape of kernel: the blog's "naive fusion" (Helion ``matmul_layernorm``) is a non-persistent GEMM
with ``BLOCK_N = N``. On Hopper the accumulator lives in registers (no TMEM), which caps N near 512; at the
blog's small K (64-256) each tile is 1-4 K steps, so the data movement of A and y (and B, which is tiny) is the
cost. Persistence keeps several tiles' A loads in flight behind the epilogue, ``B_RESIDENT`` loads B once per
CTA instead of once per tile, and the TMA store of y runs asynchronously.

DSL limitations met: TLX's ``async_dot`` needs N >= 32 per wgmma, so N <= 32 computes a 32-column tile
(the contract's "at least 16" becomes 32); the epilogue's TMA store goes through the compiler's own staging
buffer and waits for the shared-memory read (``cp.async.bulk.wait_group.read 0``) before the next tile, so the
stores of consecutive tiles do not overlap the next epilogue's shared writes (they do overlap the next tile's
loads and MMAs). No numerics run on CPU (TLX has no interpreter): the epilogue math helpers are checked with
the Triton interpreter in tests/tlx, the kernel is compile-checked for sm_90, and ``python -m
kernels_tlx.naive_fusion`` is the GPU correctness test.

Status: CPU-checked (sm_90 compile with PTX/ptxas checks for every shipped config, interpreter check of the
epilogue math) and checked and measured on the H200 (the GPU self-check in ``make test-gpu``;
results/naive_fusion_blog/).

``matmul`` is ``kernels_tlx.lazy_prenorm.matmul`` (the same DSL's tiled WS GEMM, T_gemm_dsl); its TilingConfig
applies to tiling entries with ``impls: [gemm]``. ``_gemm_full_n`` (self-check only) is this kernel with the norm
compiled out, to separate the cost of the full-N GEMM shape from the cost of the norm.

Sources: PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels"
(2026-07-10), https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
("naive fusion"); Helion ``examples/matmul_layernorm.py``; TLX (fbtriton 3.7.4) Hopper tutorials
``hopper-persistent-gemm-ws-cooperative.py`` and ``hopper_fa_ws_pipelined_pingpong.py`` (named barriers),
https://github.com/facebookexperimental/triton. Code written for this repo.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels_tlx.lazy_prenorm import matmul  # noqa: F401  (re-export: the same DSL's GEMM, T_gemm_dsl)
from kernels_tlx import lazy_prenorm as _lp
from normfuse.techniques import naive_fusion as _nf_spec
from normfuse.tiling import TilingConfigBase, no_overrides
from normfuse.validate import check_eps, check_forward_only

SMEM_LIMIT_BYTES, REGISTER_FILE = _lp.SMEM_LIMIT_BYTES, _lp.REGISTER_FILE  # 227 KB opt-in smem, 64 K registers
H200_NUM_SMS = 132  # persistent grid when compiling without a GPU
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
OPS = ("matmul_layernorm", "matmul_rmsnorm", "matmul")
MAX_N = 512  # the largest N any config serves (64 x N fp32 accumulator of a row group in registers)
MAX_CONSUMERS = 4  # consumer warpgroups per CTA: 4 + 16 warps; more would leave < 96 registers per thread
MIN_WG_N = 32  # TLX async_dot: wgmma N >= 32
# setmaxnreg per consumer thread by number of consumer warpgroups; the 4-warp producer gets what is left of the
# 64 K register file (fbtriton gives it 40 with 2 consumers, 32 with 4). 112 is the most 4 consumers get: asking
# for 120 made the compiler drop setmaxnreg altogether (96 registers for everyone, spills).
CONSUMER_REGS = {1: 240, 2: 232, 3: 152, 4: 112}
REG_HEADROOM = 48  # registers per consumer thread beyond the accumulator (addresses, statistics, output)
_PRODUCER_WARPS = _lp._PRODUCER_WARPS
_NAMED_BAR_BASE = tl.constexpr(8)  # hardware named barriers 8, 9 (one per row group); 0-6 belong to the compiler
_NORM_CODE = {"none": 0, "rmsnorm": 1, "layernorm": 2}


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class Plan:
    """What one TilingConfig does at one (N, K): derived sizes, checked against every limit."""

    WG_N: int  # accumulator columns per consumer warpgroup (power of 2, >= 32)
    N_SPLIT: int  # warpgroups sharing the same 64 rows (the N split)
    ROW_GROUPS: int  # BLOCK_M // 64
    NUM_CONSUMERS: int  # ROW_GROUPS * N_SPLIT
    K_TILES: int  # cdiv(K, BLOCK_K)
    CONSUMER_REGS: int  # setmaxnreg of each consumer thread
    ACC_REGS: int  # fp32 accumulator registers per consumer thread (WG_N / 2)
    STORE_N: int  # columns per TMA store of y (WG_N, or WG_N / 2 with EPILOGUE_SUBTILE)
    B_BUFS: int  # [BLOCK_K, WG_N] B buffers in shared memory
    SMEM_BYTES: int  # estimate (upper bound) of the shared memory per CTA

    @property
    def BLOCK_N(self) -> int:
        """Padded N of the tile: N_SPLIT * WG_N >= N."""
        return self.N_SPLIT * self.WG_N

    @property
    def num_warps_total(self) -> int:
        return _PRODUCER_WARPS + 4 * self.NUM_CONSUMERS


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tiling of the TLX naive-fusion kernel (the N-dependent sizes come from ``plan(N, K)``).

    Fields:
        BLOCK_M: rows per tile, 64 or 128 (1 or 2 row groups of 64 rows, one m64 wgmma each).
        WG_BLOCK_N: the most accumulator columns one consumer warpgroup holds (power of 2 in [32, 256]); N is
            split over ``cdiv(N, WG_BLOCK_N)`` warpgroups sharing the same rows (row statistics exchanged through
            shared memory). 256 -> 128 accumulator registers per thread; 128 -> 64.
        BLOCK_K: K step of the A ring (power of 2 in [16, 128]).
        NUM_STAGES: K steps in flight in the A ring (>= 2: a consumer holds two with ``async_dot_wait(1)``).
            With K = 128 and BLOCK_K = 64, 4 stages = 2 whole tiles ahead.
        B_RESIDENT: load all of B (K x N) into shared memory once per CTA (needs it to fit next to the ring);
            otherwise stream ``[BLOCK_K, N]`` of B with every K step (any K).
        EPILOGUE_SUBTILE: store y as two ``[64, WG_N / 2]`` TMA boxes per warpgroup, halving the epilogue staging
            buffer in shared memory (ignored when WG_N < 64).
        PERSISTENT: grid = min(#SMs, #tiles) CTAs looping over row tiles (True), or one CTA per tile.

    Construction checks the N-independent constraints; ``plan(N, K)`` the rest. Both raise ValueError naming
    the violated constraint.
    """

    BLOCK_M: int = 128
    WG_BLOCK_N: int = 256
    BLOCK_K: int = 64
    NUM_STAGES: int = 4
    B_RESIDENT: bool = True
    EPILOGUE_SUBTILE: bool = True
    PERSISTENT: bool = True

    def __post_init__(self):
        errors = self.field_type_errors()
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))
        for name in ("BLOCK_M", "WG_BLOCK_N", "BLOCK_K"):
            if not _is_pow2(getattr(self, name)):
                errors.append(f"{name}={getattr(self, name)} must be a power of 2")
        if self.BLOCK_M not in (64, 128):
            errors.append(f"BLOCK_M={self.BLOCK_M} must be 64 or 128 (1 or 2 row groups of one m64 wgmma)")
        if not MIN_WG_N <= self.WG_BLOCK_N <= 256:
            errors.append(f"WG_BLOCK_N={self.WG_BLOCK_N} must be in [{MIN_WG_N}, 256] (wgmma N and TMA box limits)")
        errors += _lp.ws_stage_errors(self.BLOCK_K, self.NUM_STAGES)
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))

    def plan(self, N: int, K: int, itemsize: int = 2) -> Plan:
        """Derived sizes at (N, K); ValueError naming the limit if this config cannot serve the shape."""
        if N > MAX_N:
            raise ValueError(f"N={N} exceeds the naive-fusion limit MAX_N={MAX_N} of the TLX kernel: the 64 x N fp32 "
                             f"accumulator of complete rows ({64 * N * 4 // 1024} KB, {N // 2} registers per thread of "
                             f"one warpgroup) does not fit the register file even split over {MAX_CONSUMERS} "
                             "consumer warpgroups (use Lazy Pre-Norm or Multi-CTA fusion for larger N)")
        wg_n = min(self.WG_BLOCK_N, max(MIN_WG_N, triton.next_power_of_2(N)))
        n_split = triton.cdiv(N, wg_n)
        rg = self.BLOCK_M // 64
        nc = rg * n_split
        if nc > MAX_CONSUMERS:
            raise ValueError(f"N={N} exceeds this config's limit: BLOCK_M={self.BLOCK_M} needs {rg} row group(s) x "
                             f"N_SPLIT=cdiv(N, WG_BLOCK_N={self.WG_BLOCK_N})={n_split} = {nc} consumer warpgroups > "
                             f"MAX_CONSUMERS={MAX_CONSUMERS} (max N here: {self.max_n()})")
        regs = CONSUMER_REGS[nc]
        acc = wg_n // 2
        if acc + REG_HEADROOM > regs:
            raise ValueError(f"N={N} exceeds this config's register limit: {nc} consumer warpgroups get "
                             f"{regs} registers per thread (64 K register file), a 64x{wg_n} fp32 accumulator needs "
                             f"{acc} + {REG_HEADROOM} headroom (max N here: {self.max_n()})")
        k_tiles = triton.cdiv(K, self.BLOCK_K)
        store_n = wg_n // 2 if (self.EPILOGUE_SUBTILE and wg_n >= 64) else wg_n
        if nc == MAX_CONSUMERS and store_n == wg_n:
            # the whole-slice affine holds weight and bias (WG_N / 4 fp32 registers each) next to the accumulator:
            # ptxas spills at 112 registers; EPILOGUE_SUBTILE applies them one half at a time
            raise ValueError(f"N={N} exceeds this config's register limit without EPILOGUE_SUBTILE: {nc} consumer "
                             f"warpgroups get {regs} registers per thread, too few for the 64x{wg_n} accumulator "
                             "plus a whole-slice affine epilogue (set EPILOGUE_SUBTILE=True)")
        b_bufs = (k_tiles if self.B_RESIDENT else self.NUM_STAGES) * n_split
        ring = self.NUM_STAGES * self.BLOCK_M * self.BLOCK_K * itemsize
        b_bytes = b_bufs * self.BLOCK_K * wg_n * itemsize
        staging = nc * 64 * store_n * itemsize
        misc = (2 * nc * 64 * 4 if n_split > 1 else 0) + (2 * self.NUM_STAGES + 1) * 8 + 1024
        smem = ring + b_bytes + staging + misc
        if smem > SMEM_LIMIT_BYTES:
            what = (f"B resident ({k_tiles * self.BLOCK_K}x{n_split * wg_n}: {b_bytes} B)" if self.B_RESIDENT
                    else f"B streamed ({self.NUM_STAGES} x {self.BLOCK_K}x{n_split * wg_n}: {b_bytes} B)")
            raise ValueError(f"shared memory at N={N}, K={K}: estimated {smem} B > {SMEM_LIMIT_BYTES} B (227 KB): "
                             f"A ring {ring} B + {what} + epilogue staging {staging} B "
                             f"(try B_RESIDENT=False, fewer NUM_STAGES, EPILOGUE_SUBTILE or a smaller BLOCK_K)")
        return Plan(WG_N=wg_n, N_SPLIT=n_split, ROW_GROUPS=rg, NUM_CONSUMERS=nc, K_TILES=k_tiles,
                    CONSUMER_REGS=regs, ACC_REGS=acc, STORE_N=store_n, B_BUFS=b_bufs, SMEM_BYTES=smem)

    def max_n(self) -> int:
        """The largest N the register limits allow (shared memory may further limit it at a given K)."""
        best = 0
        rg = self.BLOCK_M // 64
        for n_split in range(1, MAX_CONSUMERS // rg + 1):
            if self.WG_BLOCK_N // 2 + REG_HEADROOM <= CONSUMER_REGS[rg * n_split]:
                best = n_split * self.WG_BLOCK_N
        return min(best, MAX_N)

    def supports(self, N: int, K: int) -> bool:
        """True if ``plan(N, K)`` succeeds."""
        try:
            self.plan(N, K)
            return True
        except ValueError:
            return False


DEFAULT_CONFIG = TilingConfig()

# The proposed configs (ranked on the H200 by `python -m kernels_tlx.naive_fusion` and the sweep), every one
# compile-checked for sm_90 in tests/tlx at the shapes it serves:
# - "default": 128-row tiles, B resident, 4 K steps in flight; N <= 256 (2 warpgroups of 64 x <=256).
# - "m64_res": 64-row tiles (more, smaller tiles; the only way to N = 512 with resident B: one row group split
#   over 2 warpgroups of 64 x 256); 6 K steps in flight.
# - "m64_wg128": 64-row tiles, N split every 128 columns (up to 4 warpgroups x 64 registers of accumulator):
#   N = 256 -> 2 warpgroups, N = 512 -> 4, so every N pays the exchange but with the lowest register pressure.
# - "m64_stream": B streamed with every K step (serves every grid cell incl. K = 256, N = 512, and any K).
# - "m128_wg128_s3": "default" with N split every 128 columns: at N = 256 four warpgroups (16 warps) share the
#   epilogue of a 128-row tile (2 row groups x 2 column halves, named barriers 8 and 9); 3 stages to fit K = 256.
#   Same kernel as "default" (minus a stage) for N <= 128.
SHIPPED_CONFIGS: dict[str, TilingConfig] = {
    "default": DEFAULT_CONFIG,
    "m64_res": TilingConfig(BLOCK_M=64, NUM_STAGES=6),
    "m64_wg128": TilingConfig(BLOCK_M=64, WG_BLOCK_N=128, NUM_STAGES=6),
    "m64_stream": TilingConfig(BLOCK_M=64, BLOCK_K=32, NUM_STAGES=4, B_RESIDENT=False),
    "m128_wg128_s3": TilingConfig(WG_BLOCK_N=128, NUM_STAGES=3),
}
# config=None where DEFAULT_CONFIG's resident B does not fit (large K, e.g. the 4096-wide projections of a model):
# streamed B serves any K (``default_config``)
DEFAULT_FALLBACKS = (SHIPPED_CONFIGS["m64_stream"],)



# ------------------------------------------------------------------------------------------------------------
# Epilogue math (plain tl; run by the Triton interpreter in tests/tlx) and the cross-warpgroup exchange
# ------------------------------------------------------------------------------------------------------------
@triton.jit
def _rstd(total_sq, N, eps):
    """rsqrt(sum of squares / N + eps) per row (fp32)."""
    return tl.math.rsqrt(total_sq / N + eps)


@triton.jit
def _centre(acc, total, N, col_ok, EVEN_N: tl.constexpr):
    """LayerNorm pass 2 input: (acc - mean) with padding columns (>= N) forced to 0, and the mean."""
    mean = total / N
    xc = acc - mean[:, None]
    if not EVEN_N:
        xc = tl.where(col_ok[None, :], xc, 0.0)
    return xc, mean


@triton.jit
def _affine(y, w_ptr, bias_ptr, cols, col_ok, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """y * weight[cols] + bias[cols] (fp32), each optional."""
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _row_allreduce(part, red, ex, RG: tl.constexpr, CS: tl.constexpr, N_SPLIT: tl.constexpr,
                   NUM_CONSUMERS: tl.constexpr):
    """Sum of the [64] fp32 row partials of the N_SPLIT warpgroups of row group RG (module docstring, "Exchange
    buffer protocol"). ``ex`` is this warpgroup's running exchange count (selects the slot bank)."""
    if N_SPLIT == 1:
        return part
    else:
        base = (ex % 2) * NUM_CONSUMERS + RG * N_SPLIT
        tlx.local_store(red[base + CS], part)
        tlx.named_barrier_wait(_NAMED_BAR_BASE + RG, 128 * N_SPLIT)  # bar.sync: all partials stored and visible
        total = tlx.local_load(red[base])
        for j in tl.static_range(1, N_SPLIT):  # slot order: bit-identical totals in every warpgroup
            total += tlx.local_load(red[base + j])
        return total


# ------------------------------------------------------------------------------------------------------------
# Kernel
# ------------------------------------------------------------------------------------------------------------
@triton.jit
def _naive_fusion_ws_kernel(
    a_desc,  # A [M, K], block [64, BLOCK_K]
    b_desc,  # B [K, N], block [BLOCK_K, WG_N]
    y_desc,  # y [M, N], block [64, STORE_N]
    w_ptr,  # weight [N] or a dummy (HAS_W False)
    bias_ptr,  # bias [N] or a dummy (HAS_B False)
    mean_ptr,  # mean [M] fp32 (LayerNorm) or a dummy
    rstd_ptr,  # rstd [M] fp32 or a dummy (NORM 0)
    M,
    N,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WG_N: tl.constexpr,
    N_SPLIT: tl.constexpr,
    K_TILES: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    B_RESIDENT: tl.constexpr,
    B_BUFS: tl.constexpr,
    STORE_N: tl.constexpr,
    CONSUMER_REGS: tl.constexpr,
    NORM: tl.constexpr,  # 0 = none (GEMM only), 1 = RMSNorm, 2 = LayerNorm
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    EVEN_N: tl.constexpr,  # N == N_SPLIT * WG_N: no padding columns
):
    ROW_GROUPS: tl.constexpr = BLOCK_M // 64
    NUM_CONSUMERS: tl.constexpr = ROW_GROUPS * N_SPLIT
    DT: tl.constexpr = tlx.dtype_of(a_desc)
    A_STEP_BYTES: tl.constexpr = BLOCK_M * BLOCK_K * tlx.size_of(DT)
    B_STEP_BYTES: tl.constexpr = BLOCK_K * WG_N * N_SPLIT * tlx.size_of(DT)

    # A ring: row group g's slice of slot s in a_bufs[g * NUM_STAGES + s]. B: split j of K step ki in
    # b_bufs[j * K_TILES + ki] (resident) or of slot s in b_bufs[j * NUM_STAGES + s] (streamed).
    a_bufs = tlx.local_alloc((64, BLOCK_K), DT, NUM_STAGES * ROW_GROUPS)
    b_bufs = tlx.local_alloc((BLOCK_K, WG_N), DT, B_BUFS)
    full_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=1)
    empty_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=NUM_CONSUMERS)
    b_bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    if N_SPLIT > 1:
        red = tlx.local_alloc((64, ), tl.float32, 2 * NUM_CONSUMERS)  # two banks of one [64] slot per warpgroup
    else:
        red = a_bufs  # unused

    with tlx.async_tasks():
        # ---------------------------------------------------------------- producer: TMA loads
        with tlx.async_task("default"):
            if B_RESIDENT:
                tlx.barrier_expect_bytes(b_bar[0], K_TILES * B_STEP_BYTES)
                for ki in range(K_TILES):
                    for j in tl.static_range(N_SPLIT):
                        tlx.async_descriptor_load(b_desc, b_bufs[j * K_TILES + ki], [ki * BLOCK_K, j * WG_N],
                                                  b_bar[0])
            num_tiles = tl.cdiv(M, BLOCK_M)
            it = 0
            for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
                off_m = tile * BLOCK_M
                for ki in range(K_TILES):
                    s = it % NUM_STAGES
                    phase = (it // NUM_STAGES) & 1
                    tlx.barrier_wait(empty_bars[s], phase ^ 1)  # first use of a slot passes at once
                    if B_RESIDENT:
                        tlx.barrier_expect_bytes(full_bars[s], A_STEP_BYTES)
                    else:
                        tlx.barrier_expect_bytes(full_bars[s], A_STEP_BYTES + B_STEP_BYTES)
                    for g in tl.static_range(ROW_GROUPS):
                        # no A box wholly below row M: such a row group computes on real rows, stores nothing
                        a_row = tl.minimum(off_m + g * 64, M - 1)
                        tlx.async_descriptor_load(a_desc, a_bufs[g * NUM_STAGES + s], [a_row, ki * BLOCK_K],
                                                  full_bars[s])
                    if not B_RESIDENT:
                        for j in tl.static_range(N_SPLIT):
                            tlx.async_descriptor_load(b_desc, b_bufs[j * NUM_STAGES + s], [ki * BLOCK_K, j * WG_N],
                                                      full_bars[s])
                    it += 1

        # ---------------------------------------------------------------- consumers: wgmma + norm epilogue
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            RG: tl.constexpr = cid // N_SPLIT  # row group (64 rows)
            CS: tl.constexpr = cid % N_SPLIT  # column slice (WG_N columns)
            cols = CS * WG_N + tl.arange(0, WG_N)
            col_ok = cols < N
            if B_RESIDENT:
                tlx.barrier_wait(b_bar[0], 0)  # all of B landed (single use, never re-armed)
            num_tiles = tl.cdiv(M, BLOCK_M)
            it = 0
            ex = 0  # exchanges done (slot bank = ex % 2)
            for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
                off_m = tile * BLOCK_M + RG * 64
                acc = tl.zeros([64, WG_N], dtype=tl.float32)
                s_prev = 0
                for ki in range(K_TILES):
                    s = it % NUM_STAGES
                    phase = (it // NUM_STAGES) & 1
                    tlx.barrier_wait(full_bars[s], phase)
                    if B_RESIDENT:
                        b_tile = b_bufs[CS * K_TILES + ki]
                    else:
                        b_tile = b_bufs[CS * NUM_STAGES + s]
                    acc = tlx.async_dot(a_bufs[RG * NUM_STAGES + s], b_tile, acc)
                    acc = tlx.async_dot_wait(1, acc)  # the previous wgmma retired: release its slot
                    if ki > 0:
                        tlx.barrier_arrive(empty_bars[s_prev])
                    s_prev = s
                    it += 1
                acc = tlx.async_dot_wait(0, acc)
                tlx.barrier_arrive(empty_bars[s_prev])  # K_TILES >= 1

                rows = off_m + tl.arange(0, 64)
                row_ok = rows < M
                if NORM == 1:  # RMSNorm: one exchange
                    ss = _row_allreduce(tl.sum(acc * acc, axis=1), red, ex, RG, CS, N_SPLIT, NUM_CONSUMERS)
                    ex += 1
                    rstd = _rstd(ss, N, eps)
                    y = acc * rstd[:, None]
                    if CS == 0:
                        tl.store(rstd_ptr + rows, rstd, mask=row_ok)
                elif NORM == 2:  # LayerNorm: two passes on the resident accumulator, two exchanges
                    total = _row_allreduce(tl.sum(acc, axis=1), red, ex, RG, CS, N_SPLIT, NUM_CONSUMERS)
                    xc, mean = _centre(acc, total, N, col_ok, EVEN_N)
                    m2 = _row_allreduce(tl.sum(xc * xc, axis=1), red, ex + 1, RG, CS, N_SPLIT, NUM_CONSUMERS)
                    ex += 2
                    rstd = _rstd(m2, N, eps)
                    y = xc * rstd[:, None]
                    if CS == 0:
                        tl.store(mean_ptr + rows, mean, mask=row_ok)
                        tl.store(rstd_ptr + rows, rstd, mask=row_ok)
                else:
                    y = acc
                if off_m < M:  # rows >= M (and columns >= N) are clipped by TMA; wholly-OOB row groups skip
                    if STORE_N < WG_N:
                        # two [64, WG_N / 2] halves; the affine is applied per half (fewer live registers)
                        y3 = tl.permute(tl.reshape(y, (64, 2, WG_N // 2)), (0, 2, 1))
                        y_lo, y_hi = tl.split(y3)
                        c_lo = CS * WG_N + tl.arange(0, WG_N // 2)
                        y_lo = _affine(y_lo, w_ptr, bias_ptr, c_lo, c_lo < N, HAS_W, HAS_B)
                        y_desc.store([off_m, CS * WG_N], y_lo.to(DT))
                        if CS * WG_N + WG_N // 2 < N:  # else the upper half lies wholly in the padding
                            c_hi = c_lo + WG_N // 2
                            y_hi = _affine(y_hi, w_ptr, bias_ptr, c_hi, c_hi < N, HAS_W, HAS_B)
                            y_desc.store([off_m, CS * WG_N + WG_N // 2], y_hi.to(DT))
                    else:
                        y = _affine(y, w_ptr, bias_ptr, cols, col_ok, HAS_W, HAS_B)
                        y_desc.store([off_m, CS * WG_N], y.to(DT))


# ------------------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------------------
def _num_sms(device: torch.device) -> int:
    return _lp._num_sms(device)


def _validate(a, b, weight, bias, eps, norm: str) -> tuple[int, int, int]:
    """The technique's contract (``normfuse.techniques.naive_fusion.check_inputs``: dtypes, shapes, 16-byte
    aligned a and b for the TMA descriptors, affine vectors of a's dtype) plus this kernel's dtypes; returns
    (M, N, K). TypeError/ValueError naming the problem."""
    if norm != "none":
        eps = check_eps(eps)
    M, N, K = _nf_spec.check_inputs(a, b, weight, bias, eps if norm != "none" else None)
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"the TLX kernel supports bf16 and fp16 inputs, got {a.dtype} "
                        "(fp32 would need tf32 wgmma with K-major B)")
    return M, N, K


def _prepare(a, b, weight, bias, eps, norm: str, config, *, need_cuda: bool, num_sms: int | None = None):
    """Validate, plan, allocate outputs; returns (kernel args, grid, constexpr kwargs, y, mean, rstd, plan)."""
    if norm not in _NORM_CODE:
        raise ValueError(f"unknown norm {norm!r}; choices: {', '.join(_NORM_CODE)}")
    cfg = None if no_overrides(config) else TilingConfig.from_dict(config)
    M, N, K = _validate(a, b, weight, bias, eps, norm)
    cfg = cfg or default_config(N, K)
    p = cfg.plan(N, K, a.element_size())  # before the device check: the message names the limit on any device
    if need_cuda and a.device.type != "cuda":
        raise ValueError(f"inputs must be CUDA tensors, got device {a.device}")
    dev = a.device
    y = torch.empty((M, N), dtype=a.dtype, device=dev)
    rstd = torch.empty(M, dtype=torch.float32, device=dev) if norm != "none" else None
    mean = torch.empty(M, dtype=torch.float32, device=dev) if norm == "layernorm" else None
    a_desc = TensorDescriptor.from_tensor(a, [64, cfg.BLOCK_K])
    b_desc = TensorDescriptor.from_tensor(b, [cfg.BLOCK_K, p.WG_N])
    y_desc = TensorDescriptor.from_tensor(y, [64, p.STORE_N])
    num_tiles = triton.cdiv(M, cfg.BLOCK_M)
    if num_sms is None:
        num_sms = _num_sms(dev) if dev.type == "cuda" else H200_NUM_SMS
    grid = (min(num_sms, num_tiles), ) if cfg.PERSISTENT else (num_tiles, )
    stat = rstd if rstd is not None else y
    args = (a_desc, b_desc, y_desc, weight if weight is not None else y, bias if bias is not None else y,
            mean if mean is not None else stat, stat, M, N, float(eps) if norm != "none" else 1.0)
    kwargs = dict(
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_K=cfg.BLOCK_K,
        WG_N=p.WG_N,
        N_SPLIT=p.N_SPLIT,
        K_TILES=p.K_TILES,
        NUM_STAGES=cfg.NUM_STAGES,
        B_RESIDENT=cfg.B_RESIDENT,
        B_BUFS=p.B_BUFS,
        STORE_N=p.STORE_N,
        CONSUMER_REGS=p.CONSUMER_REGS,
        NORM=_NORM_CODE[norm],
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        EVEN_N=N == p.BLOCK_N,
        num_warps=_PRODUCER_WARPS,  # the default (producer) task; consumers add 4 warps each
        num_stages=1,  # no compiler pipelining: the ring is explicit
    )
    return args, grid, kwargs, y, mean, rstd, p


def default_config(N: int, K: int) -> TilingConfig:
    """The config used when none is given: ``DEFAULT_CONFIG`` (B resident) where its plan fits ``(N, K)``, else
    the first of ``DEFAULT_FALLBACKS`` that does (B streamed: any K), else ``DEFAULT_CONFIG`` (whose plan then
    raises the ValueError naming the limit)."""
    for cfg in (DEFAULT_CONFIG, *DEFAULT_FALLBACKS):
        if cfg.supports(N, K):
            return cfg
    return DEFAULT_CONFIG


def _run(a, b, weight, bias, eps, norm: str, config):
    args, grid, kwargs, y, mean, rstd, _ = _prepare(a, b, weight, bias, eps, norm, config, need_cuda=True)
    _naive_fusion_ws_kernel[grid](*args, **kwargs)
    return y, mean, rstd


def matmul_layernorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, eps: float = 1e-5,
                     config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Naive fusion, LayerNorm: ``y = layer_norm(a @ b) (* weight + bias)`` in one kernel, statistics of the fp32
    accumulator (two-pass: mean, then the centred sum of squares; biased variance).

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA, 16-byte aligned; any M >= 1, K multiple of 8.
        b: ``[K, N]`` same dtype and device, row-major contiguous; N multiple of 8, N <= ``MAX_N`` (512) and
            within the config's limits (``TilingConfig.plan``).
        weight, bias: contiguous ``[N]`` of a's dtype on a's device (read as fp32), or None.
        eps: added to the variance inside the rsqrt (finite, > 0).
        config: ``TilingConfig``, a dict of overrides, or None (or ``{}``) for ``default_config(N, K)``:
            ``DEFAULT_CONFIG`` where its resident B fits, else B streamed.

    Returns:
        ``(y [M, N] a.dtype, mean [M] fp32, rstd [M] fp32)``.

    Raises:
        NotImplementedError: an input requires grad with grad mode on (forward only).
        TypeError: non-tensors, mixed dtypes, a dtype other than bf16/fp16, a weight/bias of another dtype than a.
        ValueError: wrong ranks, mismatched K, non-contiguous or misaligned inputs, K or N not a multiple of 8,
            weight/bias not ``[N]``, eps not a finite number > 0 (None too), non-CUDA tensors, or an N/K the
            config cannot serve (N > MAX_N, registers, shared memory -- the message names the limit);
            ``normfuse.tiling.ConfigError`` for an invalid config. y may exceed 2^31 elements (TMA coordinates).

    Source: PyTorch blog "Towards Free Normalization" (naive fusion),
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
    """
    check_forward_only("naive_fusion.matmul_layernorm", a=a, b=b, weight=weight, bias=bias)
    y, mean, rstd = _run(a, b, weight, bias, eps, "layernorm", config)
    return y, mean, rstd


def matmul_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
                   config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive fusion, RMSNorm: ``y = rms_norm(a @ b) (* weight)`` in one kernel, ``rstd`` of the fp32 accumulator.

    Args, dtypes and errors as in ``matmul_layernorm`` (no bias).

    Returns:
        ``(y [M, N] a.dtype, rstd [M] fp32)``.
    """
    check_forward_only("naive_fusion.matmul_rmsnorm", a=a, b=b, weight=weight)
    y, _, rstd = _run(a, b, weight, None, eps, "rmsnorm", config)
    return y, rstd


def _gemm_full_n(a: torch.Tensor, b: torch.Tensor, *, config=None) -> torch.Tensor:
    """``a @ b`` by the naive-fusion kernel with the norm compiled out (self-check/benchmark only): the cost of
    the full-N GEMM shape itself, to separate from the cost of the norm epilogue."""
    y, _, _ = _run(a, b, None, None, None, "none", config)
    return y


def _ptx_extras(ptx: str) -> dict:
    """PTX facts the tests assert on: named barriers by (id, count), setmaxnreg values, wgmma waits, TMA store
    waits, ldmatrix (accumulator layout conversions through shared memory)."""
    named = {}
    for bid, cnt in re.findall(r"\bbar\.sync\s+(\d+),\s*(\d+);", ptx):
        named[f"{bid},{cnt}"] = named.get(f"{bid},{cnt}", 0) + 1
    return {
        "bar_sync": named,
        "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)),
        "wgmma_wait_0": len(re.findall(r"wgmma\.wait_group\.sync\.aligned 0;", ptx)),
        "mbarrier_arrive_expect_tx": ptx.count("mbarrier.arrive.expect_tx"),
        "tma_store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "ldmatrix": ptx.count("ldmatrix"),
        "st_global": len(re.findall(r"\bst\.global", ptx)),
    }


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, *, eps: float = 1e-5, config=None, affine: bool = False,
                 ptxas: bool = False) -> dict:
    """Compile ``op`` for sm_90 without a GPU and summarize the result (never launches).

    The caller must already have run ``normfuse.compile_only.install(90)`` in this process. ``a [M, K]``, ``b
    [K, N]`` (and ``weight``/``bias`` ``[N]``) are CPU tensors (only shapes, dtypes and alignment matter).

    Args:
        op: ``"matmul_layernorm"``, ``"matmul_rmsnorm"``, ``"matmul"`` (delegated to
            ``kernels_tlx.lazy_prenorm.compile_sm90``: its TilingConfig applies) or ``"_gemm_full_n"``.
        eps: as in the ops. config: ``TilingConfig``, dict or None.
        affine: also pass a weight (and, for LayerNorm, a bias) if none is given.
        ptxas: also run ``ptxas -v`` (registers, spill bytes) on the PTX.

    Returns:
        ``normfuse.compile_only.summarize(compiled)`` plus ``ptx_extra`` (``_ptx_extras``),
        ``convert_layout_2d`` (2-D register layout conversions in the TTGIR: an accumulator round trip through
        shared memory), ``grid``, ``config``, ``plan`` (the derived sizes) and ``smem_estimate`` (and ``ptxas``).

    Raises:
        ValueError: unknown op, invalid inputs, config or unsupported shape; TypeError: bad dtypes.
    """
    from normfuse.compile_only import summarize

    if op == "matmul":
        return _lp.compile_sm90("matmul", a, b, eps=eps, config=config)
    norms = {"matmul_layernorm": "layernorm", "matmul_rmsnorm": "rmsnorm", "_gemm_full_n": "none"}
    if op not in norms:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS + ('_gemm_full_n', ))}")
    norm = norms[op]
    if affine and isinstance(b, torch.Tensor) and b.dim() == 2:
        if weight is None and norm != "none":
            weight = torch.empty(b.shape[1], dtype=b.dtype)
        if bias is None and norm == "layernorm":
            bias = torch.empty(b.shape[1], dtype=b.dtype)
    if norm != "layernorm":
        bias = None
    if norm == "none":
        weight = None
    args, grid, kwargs, _, _, _, p = _prepare(a, b, weight, bias, eps, norm, config, need_cuda=False)
    compiled = _naive_fusion_ws_kernel.warmup(*args, grid=grid, **kwargs)
    ptx = compiled.asm["ptx"]
    out = summarize(compiled)
    out["ptx_extra"] = _ptx_extras(ptx)
    # layout conversions of 2-D register tensors (the accumulator); 1-D ones (statistics, weight) are cheap
    out["convert_layout_2d"] = len(re.findall(r"ttg\.convert_layout %\S+ : tensor<\d+x\d+", compiled.asm["ttgir"]))
    out["grid"] = list(grid)
    out["config"] = TilingConfig.from_dict(config).to_dict()
    out["plan"] = dataclasses.asdict(p)
    out["smem_estimate"] = p.SMEM_BYTES
    if ptxas:
        from normfuse.codestats import ptxas_info

        out["ptxas"] = ptxas_info(ptx)
    return out


# ------------------------------------------------------------------------------------------------------------
# GPU self-check: python -m kernels_tlx.naive_fusion [--quick] [--no-bench] [--config NAME ...]
# ------------------------------------------------------------------------------------------------------------
_CHECK_SHAPES = [  # (M, N, K)
    (1, 64, 64),  # M = 1: one tile, row group 1 wholly out of bounds (128-row configs)
    (257, 128, 72),  # M tail (257 = 2 * 128 + 1), K tail (72 = 64 + 8)
    (1000, 256, 256),  # 4 K steps, N = 256 (one warpgroup of 256, or a split of 2 x 128)
    (3001, 200, 64),  # padding columns inside one warpgroup (N = 200 in a 256 tile): masked centring
    (4099, 320, 128),  # N split with padding (2 x 256 or 3 x 128 warpgroups), M tail
    (17793, 512, 128),  # N = 512 (2 x 256 or 4 x 128), > 132 tiles: persistent loop, exchange banks alternate
    (5000, 24, 8),  # N < 32 (a 32-column tile), K = 8 < BLOCK_K (one zero-filled K step)
    (262144, 128, 128),  # the blog's M
]
_BENCH_KN = [(64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128), (256, 256), (64, 512),
             (128, 512), (256, 512)]
_BENCH_M = 262144
_DEVICE = "cuda"  # the CPU dry-run test of _self_check swaps in "cpu", fake kernels and an identity _compile_norm


def _compile_norm(fn):
    """The blog's norm baseline: torch.compile for one shape (dynamic=False after a dynamo reset)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _make_case(M, N, K, seed, affine, device):
    """Inputs (a bf16 [M, K] with rows scaled 0.25..4, b bf16 [K, N] ~ N(0.02, 1/K): rows of a @ b have a
    non-zero mean, so a one-pass variance or a missing centring shows), optional affine, fp32 references of
    c = a @ b and of both norms, and the torch same-dtype results that set the tolerance."""
    g = torch.Generator(device=device).manual_seed(seed)
    scale = torch.exp2(torch.rand(M, 1, generator=g, device=device) * 4 - 2)
    a = (torch.randn(M, K, generator=g, device=device) * scale).to(torch.bfloat16)
    b = (torch.randn(K, N, generator=g, device=device) / math.sqrt(K) + 0.02).to(torch.bfloat16)
    w = bias = None
    if affine:
        w = (1 + 0.1 * torch.randn(N, generator=g, device=device)).to(torch.bfloat16)
        bias = (0.1 * torch.randn(N, generator=g, device=device)).to(torch.bfloat16)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        c = a.float() @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    c16 = a @ b  # the unfused pair's bf16 GEMM output
    F = torch.nn.functional
    mean = c.mean(-1)
    xc = c - mean[:, None]
    var = xc.pow(2).mean(-1)
    ref = {
        "layernorm": {"y": F.layer_norm(c, (N, ), w.float() if affine else None, bias.float() if affine else None,
                                        1e-5), "mean": mean, "rstd": torch.rsqrt(var + 1e-5), "sd": var.sqrt()},
        "rmsnorm": {"y": F.rms_norm(c, (N, ), w.float() if affine else None, 1e-6),
                    "rstd": torch.rsqrt(c.pow(2).mean(-1) + 1e-6)},
    }
    same = {"layernorm": F.layer_norm(c16, (N, ), w, bias, 1e-5), "rmsnorm": F.rms_norm(c16, (N, ), w, 1e-6)}
    return {"a": a, "b": b, "w": w, "bias": bias, "ref": ref, "same": same}


def _check_out(variant, out, case) -> tuple[bool, str]:
    ref = case["ref"][variant]
    y = out[0]
    tol = 2.0 * (case["same"][variant].float() - ref["y"]).abs().max().item() + 1e-3 * ref["y"].abs().max().item()
    err = (y.float() - ref["y"]).abs().max().item()
    ok = bool(torch.isfinite(y).all().item()) and err <= tol
    rstd = out[-1]
    r_err = ((rstd - ref["rstd"]).abs() / ref["rstd"].abs()).max().item()
    ok = ok and r_err <= 1e-3
    msg = f"max_abs={err:.3e} tol={tol:.3e} rstd_rel={r_err:.1e}"
    if variant == "layernorm":  # mean error relative to the row's spread (a mean near 0 has no relative scale)
        m_err = ((out[1] - ref["mean"]).abs() / (ref["mean"].abs() + ref["sd"])).max().item()
        ok = ok and m_err <= 1e-3
        msg += f" mean_err={m_err:.1e}"
    return ok, msg


def _self_check(argv=None) -> int:
    """Every shipped config x both norms x affine on/off against the fp32 reference at ``_CHECK_SHAPES`` (shapes a
    config cannot serve are reported as ``skip``), the GEMM-only variant of the kernel, then (unless ``--quick``
    or ``--no-bench``) timing at M = 262144 over the blog's (K, N) grid: cuBLAS, torch.compile LayerNorm, the
    TLX tiled GEMM (``matmul``), this kernel without and with the norm, and the blog's "% hidden".

    A hung launch (barrier deadlock) aborts after ``--hang-timeout`` s with a traceback naming the last ``[run ]``
    line. Outputs are NaN-poisoned first (a skipped tile cannot pass on a stale result). ``--quick``: no M =
    262144 check and no timing; ``--bench-only``: timing only; ``--config NAME`` (repeatable): a subset."""
    import argparse
    import faulthandler
    import sys
    import time

    p = argparse.ArgumentParser(description="GPU correctness + speed check of the TLX naive-fusion kernel")
    p.add_argument("--config", action="append", choices=sorted(SHIPPED_CONFIGS),
                   help="config(s) to check, repeatable (default: all shipped)")
    p.add_argument("--quick", action="store_true", help="skip M=262144 checks and all timing")
    p.add_argument("--no-bench", action="store_true", help="correctness only")
    p.add_argument("--bench-only", action="store_true", help="timing only (after a passing --quick run)")
    p.add_argument("--hang-timeout", type=float, default=90.0,
                   help="seconds before a hung launch aborts the process with a traceback")
    args = p.parse_args(argv)
    names = args.config or list(SHIPPED_CONFIGS)
    shapes = [] if args.bench_only else [s for s in _CHECK_SHAPES if not (args.quick and s[0] >= 262144)]
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"{_num_sms(torch.device(_DEVICE))} SMs", flush=True)

    def guarded(fn):
        faulthandler.dump_traceback_later(args.hang_timeout, exit=True, file=sys.__stderr__)
        try:
            out = fn()
            torch.cuda.synchronize()
            return out
        finally:
            faulthandler.cancel_dump_traceback_later()

    failures = []
    for si, (M, N, K) in enumerate(shapes):
        for affine in (False, True):
            case = _make_case(M, N, K, seed=si * 2 + affine, affine=affine, device=_DEVICE)
            a, b, w, bias = case["a"], case["b"], case["w"], case["bias"]
            for name in names:
                cfg = SHIPPED_CONFIGS[name]
                if not cfg.supports(N, K):
                    print(f"[skip] {name:13s} M={M} N={N} K={K}: {_reason(cfg, N, K)}", flush=True)
                    continue
                for variant in ("layernorm", "rmsnorm"):
                    fn = ((lambda: matmul_layernorm(a, b, w, bias, eps=1e-5, config=cfg)) if variant == "layernorm"
                          else (lambda: matmul_rmsnorm(a, b, w, eps=1e-6, config=cfg)))
                    torch.full((M, N), float("nan"), dtype=a.dtype, device=_DEVICE)  # poison the allocator's block
                    print(f"[run ] {name:13s} {variant:9s} M={M} N={N} K={K} affine={affine:d} ...", end=" ",
                          flush=True)
                    t0 = time.perf_counter()
                    out = guarded(fn)
                    ok, msg = _check_out(variant, out, case)
                    if not ok:
                        failures.append(f"{name} {variant} {M}x{N}x{K} affine={affine}")
                    print(f"{'ok  ' if ok else 'FAIL'} {msg} ({time.perf_counter() - t0:.1f}s)", flush=True)
                    del out
                if not affine:  # the same kernel without the norm (the benchmark's full-N GEMM)
                    print(f"[run ] {name:13s} {'gemm':9s} M={M} N={N} K={K} ...", end=" ", flush=True)
                    out = guarded(lambda: _gemm_full_n(a, b, config=cfg))
                    ref = a.float() @ b.float()
                    tol = 2.0 * (a @ b).float().sub(ref).abs().max().item() + 1e-3 * ref.abs().max().item()
                    err = (out.float() - ref).abs().max().item()
                    ok = err <= tol and bool(torch.isfinite(out).all().item())
                    if not ok:
                        failures.append(f"{name} gemm {M}x{N}x{K}")
                    print(f"{'ok  ' if ok else 'FAIL'} max_abs={err:.3e} tol={tol:.3e}", flush=True)
                    del out, ref
            case = a = b = w = bias = None  # free the GPU memory before the next shape
    torch.cuda.empty_cache()

    if not (args.quick or args.no_bench):
        from triton.testing import do_bench

        F = torch.nn.functional
        M = _BENCH_M
        print(f"--- timing M={M} bf16 LayerNorm without affine (do_bench median, L2 flushed); hidden = "
              "(T_gemm_tlx + T_norm - T_fused) / T_norm, T_gemm_tlx = best TLX tiled GEMM ---", flush=True)

        def bench(fn):
            guarded(fn)
            return guarded(lambda: do_bench(fn, return_mode="median"))

        gemm_cfgs = {"lp_bn64_s4": {"BLOCK_N": 64, "NUM_STAGES": 4}, "lp_bn128_s4": {"BLOCK_N": 128, "NUM_STAGES": 4},
                     "lp_default": {}}
        for (K, N) in _BENCH_KN:
            g = torch.Generator(device=_DEVICE).manual_seed(K + N)
            a = torch.randn(M, K, generator=g, device=_DEVICE).to(torch.bfloat16)
            b = (torch.randn(K, N, generator=g, device=_DEVICE) / math.sqrt(K)).to(torch.bfloat16)
            c16 = a @ b
            ln = _compile_norm(lambda x: F.layer_norm(x, (N, ), None, None, 1e-5))
            t_cublas = bench(lambda: a @ b)
            t_norm = bench(lambda: ln(c16))
            t_gemm = min(bench(lambda: matmul(a, b, config=c)) for c in gemm_cfgs.values())
            line = (f"K={K:3d} N={N:3d}  cublas {t_cublas * 1e3:6.1f}  compile_ln {t_norm * 1e3:6.1f}  "
                    f"tlx_gemm {t_gemm * 1e3:6.1f} us |")
            for name in names:
                cfg = SHIPPED_CONFIGS[name]
                if not cfg.supports(N, K):
                    line += f" {name} -"
                    continue
                t_full = bench(lambda: _gemm_full_n(a, b, config=cfg))
                t_f = bench(lambda: matmul_layernorm(a, b, eps=1e-5, config=cfg))
                hidden = 100 * (t_gemm + t_norm - t_f) / t_norm
                line += f" {name} gemmN {t_full * 1e3:6.1f} fused {t_f * 1e3:6.1f} ({hidden:+.0f}%)"
            print(line, flush=True)
            a = b = c16 = None
            torch.cuda.empty_cache()

    print("ALL OK" if not failures else f"{len(failures)} FAILURE(S): " + "; ".join(failures), flush=True)
    return 1 if failures else 0


def _reason(cfg: TilingConfig, N: int, K: int) -> str:
    try:
        cfg.plan(N, K)
        return ""
    except ValueError as e:
        return str(e)[:120]


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(_self_check())
