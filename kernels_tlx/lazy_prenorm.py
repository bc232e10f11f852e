r"""Lazy Pre-Norm (RMSNorm or LayerNorm -> GEMM) in TLX for the H200 (sm_90): a warp-specialized TMA + wgmma GEMM
whose consumer warpgroups also read their rows of each shared-memory A tile to accumulate the per-row statistics
(sum of squares; for LayerNorm the shifted sum and sum of squares).

Math (see ``normfuse.techniques.lazy_prenorm``)::

    C = rmsnorm(A) @ (diag(gamma) B) = diag(rstd) (A @ B_folded),   rstd_i = rsqrt(sum_k A_ik^2 / K + eps)

One kernel source serves both public ops through the constexpr ``FUSE_RMSNORM``: ``matmul`` is exactly the
fused kernel minus the sum of squares and the epilogue row scale, so the time difference between the two is
the cost of the fused norm.

Kernel structure (per CTA; persistent over output tiles when ``TilingConfig.PERSISTENT``):

- **Producer** (the ``"default"`` task, 4 warps): for every K step of every tile it waits on ``empty[s]``,
  arms ``full[s]`` with the byte count of the whole stage (``mbarrier.arrive.expect_tx``) and issues one TMA
  load per consumer for its ``[BLOCK_M / NUM_CONSUMERS, BLOCK_K]`` slice of A plus one TMA load of the
  ``[BLOCK_K, BLOCK_N]`` B tile, all completing on ``full[s]``. Out-of-bounds parts of a box (M, N, K tails)
  are zero-filled by TMA and still count toward the transaction bytes. A consumer slice lying wholly below
  row M (M=1, M=257, ...) has its A row coordinate clamped to M-1 (it computes on real rows and skips its
  store). The compiler splits the 256-column B box into four 64-column TMA copies, some of which are wholly
  out of bounds at N tails (e.g. N=520), exactly as in any Triton kernel with such a descriptor.
- **Consumers** (``NUM_CONSUMERS`` replicated 4-warp tasks with ``setmaxnreg``): for every K step they wait
  on ``full[s]``, issue the wgmma on their A slice and the shared B tile, and, in the fused op, load their A
  slice from shared memory (``tlx.local_load``) and add its fp32 row sums of squares *while that wgmma is in
  flight*. ``async_dot_wait(1)`` then retires the *previous* wgmma, after which that previous stage is
  released (``barrier_arrive(empty[s_prev])``). After the last K step, ``async_dot_wait(0)`` and the last
  release; the epilogue computes ``rstd = rsqrt(ss / K + eps)``, scales the fp32 accumulator, casts it to
  the input dtype and writes it with a TMA store (out-of-bounds rows/columns are clipped). ``rstd`` makes a
  256-byte round trip through a per-consumer shared buffer: reading it back lets the compiler pick the
  accumulator's row layout; multiplying directly made it convert the whole 64x256 fp32 accumulator to the
  norm's layout through shared memory (64 ``ldmatrix`` in the PTX).

Barrier protocol (``NUM_STAGES`` ring slots, one global K-step counter ``it`` per task, identical sequences of
(tile, k) in every task; slot ``s = it % NUM_STAGES``, use ``u = it // NUM_STAGES``, parity ``u & 1``):

- ``full[s]``: arrive count 1 (the producer's ``arrive.expect_tx``) + the stage's TMA transaction bytes,
  ``(BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * itemsize`` (a TMA box always delivers its full byte count,
  zero-filled out of bounds). Consumers wait with parity ``u & 1``.
- ``empty[s]``: arrive count ``NUM_CONSUMERS``; each consumer warpgroup arrives once per use (TLX lowers
  ``barrier_arrive`` to a warpgroup ``bar.sync`` followed by one elected ``mbarrier.arrive``, so all of the
  warpgroup's shared-memory reads of the slot are done). The producer waits with parity ``(u & 1) ^ 1``:
  the first use of every slot passes immediately (the barrier's "previous phase" counts as complete).
- A slot is released only after (a) the consumer's wgmma that read it has retired (``async_dot_wait``) and
  (b) its sum-of-squares ``local_load`` has returned (program order + the ``bar.sync`` before the arrive).
  With ``async_dot_wait(1)`` a consumer holds at most two slots, so ``NUM_STAGES >= 2`` is required.

Tile schedule. Default: CTA ``p`` takes tiles ``p, p + G, p + 2G, ...`` (G = grid size) in the grouped
(``GROUP_M``) order, and every tile computes its own sum of squares -- ``cdiv(N, BLOCK_N)``-fold redundant
work. ``REUSE_RSTD`` ("reuse rstd across N", Meta's ``REUSE_RMSNORM_ACROSS_N``): the row-major (m-major)
tile order is cut into G contiguous chunks (sizes differ by at most 1), so a CTA walks the N-tiles of an
M-tile back to back. The consumers compute the sum of squares (the ``local_load`` + row sum, under a runtime
branch that is uniform over the CTA) and store rstd into their ``rstd_bufs`` slot only on the tile that
starts a run of one M-tile -- ``pid_n == 0`` or the CTA's first tile, since a chunk may begin inside an M-tile
-- and the following N-tiles of that M-tile read that stored rstd back (the slot is private to the consumer;
the warpgroup ``bar.sync`` around the store orders it against the earlier and later reads). The A tiles of
the current M-tile are re-read (from L2) for every N-tile, as before. Both tasks take their tile loop from the
same ``_tile_range`` / ``_tile_coords`` helpers, so the (tile, k) sequences -- and with them the barrier
phases below -- stay identical; the ring protocol itself is unchanged (a skipped ``local_load`` only removes
one of the two conditions for releasing a slot).

**Statistics off the consumers** (``TilingConfig.STATS_IN_PRODUCER`` / ``STATS_WARPGROUP``, fused ops only):
the consumers run the plain GEMM loop (no ``local_load`` in their wgmma windows) and the per-row statistics of
every tile are computed by the producer warpgroup (a flat loop that issues the TMA loads of K step ``j`` and then
reads the A slices of step ``j - (NUM_STAGES - 1)``, ``_producer_with_stats``) or by a fourth, 4-warp task
(``_stats_task_tile``; 16 warps cap every thread at 128 registers, so only BLOCK_N <= 128 compiles). Either reader
is one more arrival on ``empty[s]`` (arrive count NUM_CONSUMERS + 1); at the end of a tile it writes rstd (and
``d``) into buffer set ``t % 2`` and arrives on ``stats_full[t % 2]`` (count 1); each consumer waits on it before
its last ``wait_group 0`` and arrives on ``stats_empty[t % 2]`` (count NUM_CONSUMERS) after its last read, which
the writer waits for (parity ``((t // 2) & 1) ^ 1``) before reusing the set two tiles later. The GEMM of such a
config is the plain kernel.

**LayerNorm** (``lazy_layernorm_matmul``: constexpr ``LAYERNORM``; math in ``normfuse.techniques.lazy_prenorm``):
``C = rstd ⊙ (A @ B_folded) - (rstd * mean) ⊗ colsum + beta_b``. Same kernel, same ring and barrier protocol. Each
consumer loads its rows' shift ``c = A[:, 0]`` from global memory at the start of a tile (64 values, before its
first ``full`` wait) and accumulates, from the shared-memory A slice while the wgmma runs, the fp32 shifted sums
``S1 = sum (a - c)`` and ``S2 = sum (a - c)^2`` (the K padding masked unless ``EVEN_K``); REUSE_RSTD skips them
on the reused N-tiles exactly as for RMSNorm. The epilogue stores ``rstd`` and ``d = S1/K`` in the consumer's
shared buffers and then, by default (``TilingConfig.LN_EPILOGUE_MMA``), adds the rank-1 correction with one
more ``m64 k16`` wgmma: A from registers, ``[-c x3, -d1, -d1, -d2, s1, s1, s2, 0...]`` per row (input-dtype
splits of ``d`` and ``1/rstd``; ``-c`` is exact), B a ``[16, BLOCK_N]`` shared buffer per consumer holding the
input-dtype splits of the colsum / beta_b tile (loaded from global memory at the start of the tile, so that the
latency hides behind the K loop; written with ``local_store``, then ``fence.proxy.async`` and the warpgroup
barrier before the wgmma). That wgmma is queued behind the K loop's last one on the same accumulator, so the
statistics, ``A_ext`` and ``B_ext`` are formed while the last MMA runs and one ``wait_group 0`` retires both;
the epilogue then scales by ``rstd`` like the RMSNorm one. The alternative,
broadcasting the colsum / beta_b tile in registers (``LN_EPILOGUE_MMA=False``), needs each thread to hold the
values of all its accumulator columns (2 x 64 at BLOCK_N = 256): broadcast over the whole tile, the compiler
converted the fp32 accumulator through shared memory (64 ``ldmatrix``, 64 KB scratch: over the 227 KB limit); in
64-column chunks (what is shipped) it converts nothing but the vectors, and ptxas spills ~350 bytes per thread.
The extra-MMA epilogue needs ``NUM_CONSUMERS * 16 * (BLOCK_N + 64)`` more bytes of shared memory (20 KB at
BLOCK_N = 256), so at BLOCK_N = 256 with 3 stages only the EPILOGUE_SUBTILE configs fit (BLOCK_N = 128 fits with 4).

The fused sum of squares avoids Triton's software pipeliner entirely (``num_stages=1``; the ring is explicit),
so it is not exposed to the "one tile feeds both tl.dot and a row reduction" miscompile
(triton-lang/triton#6691, dsl-primer blocker 1).

**Idle SMs of the cluster form** (``TilingConfig.FILL_IDLE_SMS``, ``_run_filled``): a GPC holds only whole clusters,
so on the H200 a persistent c4 / c8 grid occupies 120 of the 132 SMs. With the option the cluster kernel takes the
first rows and lets a programmatic dependent grid start as soon as all its CTAs are resident
(``griddepcontrol.launch_dependents``); that grid is this module's REUSE_RSTD kernel on the last ``fill_rows`` rows,
one CTA per idle SM, writing its row block of the same output and reading nothing the cluster kernel writes.
Measured on the H200 (docs/results/lazy_prenorm.md, "The SMs the cluster grid leaves idle"): +21-26 points of
hidden_dsl at N = 1024 and +48-71 at N = 2048 for RMSNorm, +18-30 for LayerNorm at N = 1024.

Sources:

- PyTorch blog, "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels"
  (2026-07-10), https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
- Programmatic dependent launch: CUDA C++ Programming Guide, "Programmatic Dependent Launch and Synchronization",
  https://docs.nvidia.com/cuda/cuda-c-programming-guide/#programmatic-dependent-launch-and-synchronization
- TLX (fbtriton), https://github.com/facebookexperimental/triton -- structure follows the Hopper tutorials
  ``hopper_gemm_ws.py`` and ``hopper-persistent-gemm-ws-cooperative.py`` (producer + 2 replicated consumers,
  ``async_dot_wait(1)`` pipelining); the code here is written for this repo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from normfuse.techniques import lazy_prenorm as _spec
from normfuse.tiling import TilingConfigBase, no_overrides
from normfuse.validate import check_eps, check_forward_only

SMEM_LIMIT_BYTES = 232448  # per-block opt-in shared memory on H100/H200 (227 KB)
REGISTER_FILE = 65536  # 32-bit registers per SM (and per CTA at most)
H200_NUM_SMS = 132  # used for the persistent grid when compiling without a GPU
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
OPS = ("matmul", "lazy_rmsnorm_matmul")
LN_OP = "lazy_layernorm_matmul"
ALL_OPS = OPS + (LN_OP,)
_PRODUCER_WARPS = 4  # the "default" task (TMA producer) uses the kernel's num_warps
_MIN_PRODUCER_REGS = 24  # setmaxnreg lower bound


def ws_stage_errors(BLOCK_K: int, NUM_STAGES: int) -> list[str]:
    """Limits of the K step and of the TMA/mbarrier ring shared by the warp-specialized TMA + wgmma kernels here,
    in ``kernels_tlx.naive_fusion`` and in ``kernels_tlx.multi_cta``; one message per violated limit."""
    errors = []
    if not 16 <= BLOCK_K <= 128:
        errors.append(f"BLOCK_K={BLOCK_K} must be in [16, 128]")
    if not 2 <= NUM_STAGES <= 8:
        errors.append(f"NUM_STAGES={NUM_STAGES} must be in [2, 8] (async_dot_wait(1) holds 2 stages)")
    return errors


def tiles_per_cta_errors(TILES_PER_CTA: int, CLUSTER_SIZE: int, **flags: bool) -> list[str]:
    """Limits of ``kernels_tlx.multi_cta``'s TILES_PER_CTA option (two column tiles per CTA), shared by its
    TilingConfig and this module's cluster form (which builds that config only at the first call); ``flags``: the
    config's PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER values. One message per violated limit."""
    if TILES_PER_CTA not in (1, 2):
        return [f"TILES_PER_CTA={TILES_PER_CTA} must be 1 or 2 (more tiles per CTA are not implemented; at "
                "BLOCK_N = 256 two parked tiles would not fit beside the ring in 227 KB)"]
    if TILES_PER_CTA == 1:
        return []
    why = {"PINGPONG": "not implemented (the two-tile mainloop is cooperative)",
           "MULTICAST_A": "not implemented (the second pass over A reloads it per CTA)",
           "EPILOGUE_SUBTILE": "not implemented (the parked tile is stored whole)",
           "STORE_DEFER": "implied (the parked buffer is the staging buffer, its stores already deferred): "
                          "leave it False"}
    errors = [f"TILES_PER_CTA=2 with {k}=True: {v}" for k, v in why.items() if flags.get(k)]
    if CLUSTER_SIZE > 8:
        errors.append(f"TILES_PER_CTA=2 needs CLUSTER_SIZE <= 8, got {CLUSTER_SIZE}")
    return errors


def ln_rank1_mma_errors(LN_RANK1_MMA: bool, STORE_DEFER: bool) -> list[str]:
    """The STORE_DEFER requirement of ``kernels_tlx.multi_cta``'s LN_RANK1_MMA option, shared by its TilingConfig and
    this module's cluster form (which builds that config only at the first call)."""
    if LN_RANK1_MMA and not STORE_DEFER:
        return ["LN_RANK1_MMA=True needs STORE_DEFER=True (the rank-1 wgmma's A operand is staged in the deferred "
                "store's staging buffer; the compiler's own staging needs 4 KB more shared memory, which c4 has not "
                "got)"]
    return []


def stats_option_errors(STATS_ELEMENTWISE: bool, STATS_UNPACK_ASM: bool, STATS_IN_PRODUCER: bool) -> list[str]:
    """How ``kernels_tlx.multi_cta``'s statistic options combine (STATS_UNPACK_ASM widens the terms of
    STATS_ELEMENTWISE or STATS_IN_PRODUCER; the two place the statistic differently), shared by its TilingConfig and
    this module's cluster form (which builds that config only at the first call)."""
    errors = []
    if STATS_UNPACK_ASM and not (STATS_ELEMENTWISE or STATS_IN_PRODUCER):
        errors.append("STATS_UNPACK_ASM=True needs STATS_ELEMENTWISE=True or STATS_IN_PRODUCER=True (it widens the "
                      "statistic's terms)")
    if STATS_IN_PRODUCER and STATS_ELEMENTWISE:
        errors.append("STATS_IN_PRODUCER=True with STATS_ELEMENTWISE=True: not applicable (the consumers take no "
                      "statistic)")
    return errors


def ln_shift_errors(LN_SHIFT_SMEM: bool, LN_SHIFT_PREFETCH: bool) -> list[str]:
    """Where the Lazy LayerNorm cluster form's shift comes from: one option at most (shared as above)."""
    if LN_SHIFT_SMEM and LN_SHIFT_PREFETCH:
        return ["LN_SHIFT_SMEM and LN_SHIFT_PREFETCH are exclusive (where the shift comes from)"]
    return []


def consumer_register_errors(NUM_CONSUMERS: int, CONSUMER_REGS: int, STATS_REGS: int | None = None) -> list[str]:
    """``setmaxnreg`` limits of the consumer warpgroups and the register file they share with the 4-warp producer
    (for 1 or 2 consumers; other counts are rejected by the caller) and, when ``STATS_REGS`` is given, with a
    statistics warpgroup of 128 threads at ``STATS_REGS`` registers; one message per violated limit."""
    if CONSUMER_REGS % 8 or not 24 <= CONSUMER_REGS <= 256:
        return [f"CONSUMER_REGS={CONSUMER_REGS} must be a multiple of 8 in [24, 256] (setmaxnreg)"]
    if STATS_REGS is not None and (STATS_REGS % 8 or not 24 <= STATS_REGS <= 256):
        return [f"STATS_REGS={STATS_REGS} must be a multiple of 8 in [24, 256] (setmaxnreg)"]
    if NUM_CONSUMERS in (1, 2):
        used = NUM_CONSUMERS * 128 * CONSUMER_REGS + _PRODUCER_WARPS * 32 * _MIN_PRODUCER_REGS
        stats = "" if STATS_REGS is None else f" + statistics warpgroup 128 x {STATS_REGS}"
        used += 0 if STATS_REGS is None else 128 * STATS_REGS
        if used > REGISTER_FILE:
            return [f"register file: {NUM_CONSUMERS} consumers x 128 threads x {CONSUMER_REGS} "
                    f"regs{stats} + producer minimum = {used} > {REGISTER_FILE}"]
    return []


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tile sizes and pipeline shape of the TLX Lazy Pre-Norm / GEMM kernel.

    Fields:
        BLOCK_M, BLOCK_N, BLOCK_K: output tile [BLOCK_M, BLOCK_N] and K step (powers of 2).
        GROUP_M: grouped (L2-friendly) tile order: GROUP_M row-tiles are swept together along N.
        NUM_STAGES: depth of the shared-memory ring of (A, B) stages (>= 2: a consumer holds 2 with
            ``async_dot_wait(1)``).
        NUM_CONSUMERS: consumer warpgroups (1 or 2); each owns BLOCK_M // NUM_CONSUMERS = 64 rows, so
            BLOCK_M = 64 * NUM_CONSUMERS.
        PERSISTENT: grid = min(#SMs, #tiles) and each CTA loops over tiles (True), or one CTA per tile.
        EPILOGUE_SUBTILE: store the output tile as two [rows, BLOCK_N / 2] TMA stores, halving the
            epilogue staging buffer in shared memory (frees room for one more stage at BLOCK_N = 256).
        CONSUMER_REGS: ``setmaxnreg`` register count per consumer thread (multiple of 8); the producer gets
            what is left of the 64 K register file.
        REUSE_RSTD: "reuse rstd across N" (Meta's ``REUSE_RMSNORM_ACROSS_N``). Each CTA walks one contiguous
            chunk of the row-major (m-major) tile order, i.e. all N-tiles of an M-tile back to back, and the
            consumers compute the sum of squares only on the first tile of each M-tile run (``pid_n == 0``
            or the CTA's first tile), keeping rstd in their shared rstd buffer for the following N-tiles.
            Removes the ``cdiv(N, BLOCK_N)``-fold redundant norm work; GROUP_M is ignored. Needs PERSISTENT.
            Meant for a small, L2-resident B (K * N * itemsize of a few MB): at large N the concurrent CTAs
            sweep all of B instead of sharing B column-tiles. Also changes the GEMM's (``matmul``) tile order,
            so fused - gemm still isolates the norm cost. Default False (grouped order, norm on every tile).
        LN_EPILOGUE_MMA: only ``lazy_layernorm_matmul``: add the rank-1 correction ``-mean ⊗ colsum +
            (1/rstd) ⊗ beta_b`` to the accumulator with one extra k16 wgmma (register A, the split colsum /
            beta_b tile as B in a [16, BLOCK_N] shared buffer per consumer, 8 KB at BLOCK_N = 256) -- True, the
            default -- or broadcast the colsum / beta_b values to the accumulator in registers (False: every
            thread loads the 2 x BLOCK_N / 4 values of its accumulator columns per tile; at BLOCK_N = 256 that
            spills 336 bytes per thread in the epilogue).
        STATS_WARPGROUP: only the fused ops: one more 4-warp task, the *statistics warpgroup*, computes the
            per-row statistics (sum of squares; for LayerNorm the shifted sums) instead of the consumers. It
            waits on the same ``full[s]`` barrier as the consumers, reads the whole [BLOCK_M, BLOCK_K] A stage
            from shared memory, releases the slot (``empty[s]`` then counts NUM_CONSUMERS + 1 arrivals) and, at
            the end of each tile, writes rstd (and the LayerNorm ``d``) into one of two per-tile shared buffers
            and arrives on its ``stats_full`` mbarrier; the consumers (wgmma + epilogue only, like the GEMM) wait
            on it in the epilogue and release the buffer (``stats_empty``). The per-tile statistic is still
            recomputed for every N-tile, but off the consumers' critical path. The GEMM (``matmul``) of such a
            config has no statistics task. Needs REUSE_RSTD=False and BLOCK_N <= 128: with 16 warps ptxas
            compiles every thread for at most 65536 / 512 = 128 registers and refuses the m64n256 wgmma (C7602,
            needs >= 154), whatever the setmaxnreg values. Default False.
        STATS_IN_PRODUCER: only the fused ops: the same statistics and hand-off as STATS_WARPGROUP, computed by
            the producer warpgroup (12 warps, so BLOCK_N = 256 compiles): one flat loop over the CTA's K steps
            issues the TMA loads of step j and then takes the statistics of step j - (NUM_STAGES - 1) (see
            ``_producer_with_stats``). The producer's registers are what the consumers leave (TLX gives it
            about ``512 - NUM_CONSUMERS * CONSUMER_REGS - 8`` per thread; it needs ~64, ~80 for LayerNorm, so the
            shipped configs use CONSUMER_REGS = 200). Needs REUSE_RSTD=False; exclusive with STATS_WARPGROUP.
            With CLUSTER_SIZE > 1 (Lazy RMSNorm only): the cluster form's option of that name (the producer takes
            this CTA's 1/C share of the statistic steps; ``kernels_tlx.multi_cta``). Default False.
        STATS_REGS: ``setmaxnreg`` register count of the statistics warpgroup's threads (multiple of 8); it
            shares the 64 K register file with the consumers (CONSUMER_REGS) and the producer, so
            ``NUM_CONSUMERS * CONSUMER_REGS + STATS_REGS`` must leave the producer its minimum. Ignored unless
            STATS_WARPGROUP.
        A_FROM_REGS: only the fused ops: each consumer loads its [64, 64] A slice once from shared memory (ldmatrix)
            into the register layout of the wgmma's A operand, feeds the wgmma from registers and takes the
            statistics from the same registers (no second shared-memory read of A). Needs BLOCK_K = 64,
            REUSE_RSTD=False and no STATS_* option. The GEMM (``matmul``) of such a config is the plain one.
        CLUSTER_SIZE: 1 (this module's kernel), or 2, 4, 8: the *cluster form* -- the ops run
            ``kernels_tlx.multi_cta``'s kernel, a cluster of CLUSTER_SIZE CTAs along N covering the whole output row
            (so it serves only ``(C - 1) * BLOCK_N < N <= C * BLOCK_N``; other N raise ValueError), each CTA
            summing a^2 (LayerNorm: the shifted sums S1, S2) over 1/C of the K steps and the partial sums exchanged
            through DSMEM: the statistic is computed once per row. The LayerNorm op's epilogue there is the fp32
            ``acc * rstd - rstd * mean * colsum + beta_b`` per column quarter (``multi_cta.lazy_layernorm_matmul``;
            LN_EPILOGUE_MMA does not apply); ``matmul`` runs the same cluster schedule without the norm
            (``multi_cta.matmul_cluster``). GROUP_M is ignored; REUSE_RSTD, A_FROM_REGS, STATS_* and
            LN_EPILOGUE_MMA=False are not allowed with it.
        MULTICAST_A, STORE_DEFER: the cluster form's options of the same names (``kernels_tlx.multi_cta``: A
            multicast across the cluster; output TMA store drained under the next tile's mainloop). Need
            CLUSTER_SIZE > 1.
        TILES_PER_CTA: the cluster form's option of that name (two column tiles per CTA, the first parked in
            shared memory, so c2 covers N = 1024 and c4 N = 2048; each CTA sums a^2 over its 1 / (2 C) share of the
            K steps in each of its two passes over A): ``lazy_rmsnorm_matmul`` and ``matmul``; the LayerNorm op
            raises ValueError. Needs CLUSTER_SIZE > 1.
        STATS_ELEMENTWISE: the cluster form's option of that name (a^2, for LayerNorm the shifted terms and their
            squares, accumulated elementwise in registers across the K loop, reduced across threads once per tile):
            both fused ops (``matmul`` runs the GEMM without it). Needs CLUSTER_SIZE > 1.
        STATS_UNPACK_ASM: the cluster form's option of that name (with STATS_ELEMENTWISE, bf16: the statistic's
            bf16 -> fp32 widening as two integer instructions per packed pair). Needs CLUSTER_SIZE > 1.
        LN_RANK1_MMA: the cluster form's option of that name (``lazy_layernorm_matmul``: the rank-1 correction as
            one more k16 wgmma per tile, whose B operand, this rank's split colsum / beta_b, is built once per
            kernel; the cluster form's counterpart of LN_EPILOGUE_MMA, which it ignores). Needs CLUSTER_SIZE > 1
            and STORE_DEFER=True (its A operand is staged in the staging buffer); 16 * BLOCK_N * itemsize more
            shared memory, so c8 fits only with NUM_STAGES = 2 (measured far slower). ``matmul`` runs the GEMM
            without it.
        LN_SHIFT_PREFETCH: the cluster form's option of that name (``lazy_layernorm_matmul``: the next M-tile's
            per-row shift loaded during this tile's epilogue; measured slower). Needs CLUSTER_SIZE > 1.
        LN_SHIFT_SMEM: the cluster form's option of that name (``lazy_layernorm_matmul``: the per-row shift read
            from the M-tile's first A slice in shared memory, not loaded from global memory). Needs CLUSTER_SIZE > 1.
        FILL_IDLE_SMS: the fused ops of the cluster form: put the SMs its persistent grid leaves idle to work (on
            the H200 30 clusters of 4 or 15 of 8 are co-resident: 120 of 132 SMs). The last rows (a multiple of
            BLOCK_M) go to this module's one-CTA-per-tile kernel with REUSE_RSTD (``reuse_rstd`` /
            ``ln_reuse_rstd_subtile``), launched on the idle SMs' count of CTAs as a programmatic dependent grid of
            the cluster kernel, which lets it start once all its own CTAs are resident (``_run_filled``). The rows
            split in proportion to SMs x per-SM rate (FILL_RATE_PCT). Needs CLUSTER_SIZE > 1 and PERSISTENT;
            ``matmul`` runs the cluster GEMM without it. No idle SM or too few rows: the cluster kernel alone.
        FILL_RATE_PCT: with FILL_IDLE_SMS, the filler's throughput per SM in % of the cluster kernel's (the row
            split): 100 gives the idle SMs their SM-count share of the rows. Default 100.

    Construction validates every constraint and raises ValueError naming it (see ``from_dict``).
    """

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    GROUP_M: int = 8
    NUM_STAGES: int = 3
    NUM_CONSUMERS: int = 2
    PERSISTENT: bool = True
    EPILOGUE_SUBTILE: bool = False
    CONSUMER_REGS: int = 232
    REUSE_RSTD: bool = False
    LN_EPILOGUE_MMA: bool = True
    STATS_WARPGROUP: bool = False
    STATS_REGS: int = 56
    STATS_IN_PRODUCER: bool = False
    A_FROM_REGS: bool = False
    CLUSTER_SIZE: int = 1
    TILES_PER_CTA: int = 1
    MULTICAST_A: bool = False
    STORE_DEFER: bool = False
    STATS_ELEMENTWISE: bool = False
    STATS_UNPACK_ASM: bool = False
    LN_RANK1_MMA: bool = False
    LN_SHIFT_PREFETCH: bool = False
    LN_SHIFT_SMEM: bool = False
    FILL_IDLE_SMS: bool = False
    FILL_RATE_PCT: int = 100

    def __post_init__(self):
        errors = self.field_type_errors()
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_CONSUMERS"):
            if not _is_pow2(getattr(self, name)):
                errors.append(f"{name}={getattr(self, name)} must be a power of 2")
        if self.NUM_CONSUMERS not in (1, 2):
            errors.append(f"NUM_CONSUMERS={self.NUM_CONSUMERS} must be 1 or 2")
        elif self.BLOCK_M != 64 * self.NUM_CONSUMERS:
            # 64 rows = one m64 wgmma per warpgroup. 128 rows per warpgroup compiles, but the fused epilogue then
            # converts the whole accumulator through shared memory (seen in the TTGIR), so it is not offered.
            errors.append(f"BLOCK_M // NUM_CONSUMERS = {self.BLOCK_M}//{self.NUM_CONSUMERS} must be 64 "
                          "(one m64 wgmma row slice per consumer warpgroup)")
        if not 32 <= self.BLOCK_N <= 256:
            errors.append(f"BLOCK_N={self.BLOCK_N} must be in [32, 256] (wgmma N and TMA box limits)")
        errors += ws_stage_errors(self.BLOCK_K, self.NUM_STAGES)
        errors += consumer_register_errors(self.NUM_CONSUMERS, self.CONSUMER_REGS,
                                           self.STATS_REGS if self.STATS_WARPGROUP else None)
        if not errors and self.acc_regs_per_thread + 64 > self.CONSUMER_REGS:
            errors.append(f"accumulator registers: {self.rows_per_consumer}x{self.BLOCK_N} fp32 per warpgroup = "
                          f"{self.acc_regs_per_thread} regs/thread, needs CONSUMER_REGS >= "
                          f"{self.acc_regs_per_thread + 64} (64 for addresses, the A slice and the norm)")
        if self.REUSE_RSTD and not self.PERSISTENT:
            errors.append("REUSE_RSTD=True needs PERSISTENT=True (rstd is reused across the N-tiles one CTA walks)")
        for name in ("STATS_WARPGROUP", "STATS_IN_PRODUCER"):
            if getattr(self, name) and self.REUSE_RSTD:
                errors.append(f"{name}=True needs REUSE_RSTD=False (the statistic of every tile is computed off "
                              "the consumers' path; combining both is not implemented)")
        if self.A_FROM_REGS and (self.REUSE_RSTD or self.stats_off_consumers):
            errors.append("A_FROM_REGS=True needs REUSE_RSTD=False, STATS_WARPGROUP=False and STATS_IN_PRODUCER=False "
                          "(the consumers take the statistic of every tile from the wgmma's register operand)")
        if self.A_FROM_REGS and (self.rows_per_consumer != 64 or self.BLOCK_K != 64):
            errors.append(f"A_FROM_REGS=True needs a [64, 64] A slice per consumer warpgroup (got "
                          f"[{self.rows_per_consumer}, {self.BLOCK_K}]): the register layout is written for it")
        if self.CLUSTER_SIZE not in (1, 2, 4, 8):
            errors.append(f"CLUSTER_SIZE={self.CLUSTER_SIZE} must be 1, 2, 4 or 8 (portable cluster sizes)")
        elif self.CLUSTER_SIZE > 1:
            # (the multi_cta.TilingConfig's own checks run when cluster_config() builds it: at the first call;
            # building it here would import multi_cta, which imports this module, while the module loads)
            if self.REUSE_RSTD or self.STATS_WARPGROUP or self.A_FROM_REGS or not self.LN_EPILOGUE_MMA:
                set_ = [f"{k}=True" for k in ("REUSE_RSTD", "STATS_WARPGROUP", "A_FROM_REGS")
                        if getattr(self, k)] + ([] if self.LN_EPILOGUE_MMA else ["LN_EPILOGUE_MMA=False"])
                errors.append(f"{', '.join(set_)}: CLUSTER_SIZE > 1 (the cluster form) takes no REUSE_RSTD, "
                              "STATS_WARPGROUP, A_FROM_REGS or LN_EPILOGUE_MMA=False: its statistic is split across "
                              "the cluster instead (STATS_IN_PRODUCER: the cluster form's own option)")
            errors += stats_option_errors(self.STATS_ELEMENTWISE, self.STATS_UNPACK_ASM, self.STATS_IN_PRODUCER)
            errors += ln_rank1_mma_errors(self.LN_RANK1_MMA, self.STORE_DEFER)
        elif self.MULTICAST_A or self.STORE_DEFER or self.STATS_ELEMENTWISE or self.STATS_UNPACK_ASM or \
                self.LN_RANK1_MMA or self.LN_SHIFT_PREFETCH or self.LN_SHIFT_SMEM or self.TILES_PER_CTA != 1:
            flags = ("MULTICAST_A", "STORE_DEFER", "STATS_ELEMENTWISE", "STATS_UNPACK_ASM", "LN_RANK1_MMA",
                     "LN_SHIFT_PREFETCH", "LN_SHIFT_SMEM")
            set_ = [f"{k}={getattr(self, k)}" for k in flags if getattr(self, k)]
            set_ += [f"TILES_PER_CTA={self.TILES_PER_CTA}"] if self.TILES_PER_CTA != 1 else []
            errors.append(f"{', '.join(set_)}: MULTICAST_A / STORE_DEFER / STATS_ELEMENTWISE / STATS_UNPACK_ASM / "
                          "LN_RANK1_MMA / LN_SHIFT_PREFETCH / LN_SHIFT_SMEM / TILES_PER_CTA are options of the cluster "
                          "form: they need CLUSTER_SIZE > 1")
        errors += ln_shift_errors(self.LN_SHIFT_SMEM, self.LN_SHIFT_PREFETCH)
        if self.FILL_IDLE_SMS and (self.CLUSTER_SIZE == 1 or not self.PERSISTENT):
            errors.append("FILL_IDLE_SMS=True needs CLUSTER_SIZE > 1 and PERSISTENT=True (it fills the SMs the "
                          "persistent cluster grid leaves idle)")
        if isinstance(self.FILL_RATE_PCT, int) and not 1 <= self.FILL_RATE_PCT <= 400:
            errors.append(f"FILL_RATE_PCT={self.FILL_RATE_PCT} must be in 1 .. 400 (a per-SM rate in %)")
        elif self.FILL_RATE_PCT != 100 and not self.FILL_IDLE_SMS:
            errors.append(f"FILL_RATE_PCT={self.FILL_RATE_PCT} applies with FILL_IDLE_SMS=True only")
        if self.CLUSTER_SIZE > 1:  # (multi_cta's TilingConfig runs the same check, but is built only at the first call)
            errors += tiles_per_cta_errors(self.TILES_PER_CTA, self.CLUSTER_SIZE, MULTICAST_A=self.MULTICAST_A,
                                           STORE_DEFER=self.STORE_DEFER, EPILOGUE_SUBTILE=self.EPILOGUE_SUBTILE)
        if self.STATS_WARPGROUP and self.STATS_IN_PRODUCER:
            errors.append("STATS_WARPGROUP and STATS_IN_PRODUCER are exclusive (who computes the statistics)")
        if self.STATS_WARPGROUP and self.BLOCK_N > 128:
            # 16 warps = 512 threads: ptxas caps every task at 65536 / 512 = 128 registers (.maxnreg; setmaxnreg
            # does not raise the compile-time limit), and an m64n256 wgmma's 128 accumulators need >= 154
            errors.append(f"STATS_WARPGROUP=True needs BLOCK_N <= 128 (got {self.BLOCK_N}): with the 4 extra "
                          "warps every thread is compiled for at most 128 registers (use STATS_IN_PRODUCER)")
        if not errors and self.smem_bytes() > SMEM_LIMIT_BYTES:
            errors.append(f"shared memory: estimated {self.smem_bytes()} B > {SMEM_LIMIT_BYTES} B (227 KB) "
                          f"for NUM_STAGES={self.NUM_STAGES}, tile {self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}, "
                          f"EPILOGUE_SUBTILE={self.EPILOGUE_SUBTILE}")
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))

    # --- derived quantities -----------------------------------------------------------------------------
    def cluster_config(self):
        """CLUSTER_SIZE > 1: the equivalent ``kernels_tlx.multi_cta.TilingConfig`` (same tile, ring, registers)."""
        from kernels_tlx import multi_cta  # (multi_cta imports this module)

        return multi_cta.TilingConfig(
            BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, BLOCK_K=self.BLOCK_K, CLUSTER_SIZE=self.CLUSTER_SIZE,
            NUM_STAGES=self.NUM_STAGES, NUM_CONSUMERS=self.NUM_CONSUMERS, PERSISTENT=self.PERSISTENT,
            MULTICAST_A=self.MULTICAST_A, EPILOGUE_SUBTILE=self.EPILOGUE_SUBTILE, CONSUMER_REGS=self.CONSUMER_REGS,
            STORE_DEFER=self.STORE_DEFER, TILES_PER_CTA=self.TILES_PER_CTA, STATS_ELEMENTWISE=self.STATS_ELEMENTWISE,
            STATS_UNPACK_ASM=self.STATS_UNPACK_ASM, LN_RANK1_MMA=self.LN_RANK1_MMA,
            LN_SHIFT_PREFETCH=self.LN_SHIFT_PREFETCH, LN_SHIFT_SMEM=self.LN_SHIFT_SMEM,
            STATS_IN_PRODUCER=self.STATS_IN_PRODUCER)

    def supports(self, N: int) -> bool:
        """False only for the cluster form at an N its cluster does not exactly cover."""
        return self.CLUSTER_SIZE == 1 or self.cluster_config().supports(N)

    @property
    def rows_per_consumer(self) -> int:
        """Rows of the output tile owned by one consumer warpgroup (BLOCK_M // NUM_CONSUMERS)."""
        return self.BLOCK_M // self.NUM_CONSUMERS

    @property
    def acc_regs_per_thread(self) -> int:
        """fp32 accumulator registers per consumer thread (rows_per_consumer * BLOCK_N / 128 threads)."""
        return self.rows_per_consumer * self.BLOCK_N // 128

    @property
    def num_warps_total(self) -> int:
        """Warps per CTA of the fused ops: 4 (producer) + 4 per consumer (+ 4 for the STATS_WARPGROUP task;
        the GEMM has ``num_warps_gemm``)."""
        return self.num_warps_gemm + (4 if self.STATS_WARPGROUP else 0)

    @property
    def stats_off_consumers(self) -> bool:
        """The fused ops' statistics are computed outside the consumer warpgroups (STATS_WARPGROUP or
        STATS_IN_PRODUCER) and handed to them per tile through double-buffered shared memory."""
        return self.STATS_WARPGROUP or self.STATS_IN_PRODUCER

    @property
    def num_warps_gemm(self) -> int:
        """Warps per CTA of ``matmul``: 4 (producer) + 4 per consumer (never a statistics warpgroup)."""
        return _PRODUCER_WARPS + 4 * self.NUM_CONSUMERS

    def smem_bytes(self, itemsize: int = 2, layernorm: bool = False) -> int:
        """Estimated shared memory per CTA in bytes: the (A, B) ring, one epilogue staging tile per consumer
        (half a tile with EPILOGUE_SUBTILE), the rstd buffers, the mbarriers and 1 KB of alignment slack; with
        ``layernorm`` also the ``d`` buffers and (LN_EPILOGUE_MMA) the [16, BLOCK_N] B operands of the epilogue
        wgmma plus the conversion scratch of its [rows, 16] A operands. Checked against the compiler's ``metadata.shared`` in tests/tlx."""
        ring = self.NUM_STAGES * (self.BLOCK_M * self.BLOCK_K + self.BLOCK_K * self.BLOCK_N) * itemsize
        epilogue = self.BLOCK_M * (self.BLOCK_N // (2 if self.EPILOGUE_SUBTILE else 1)) * itemsize
        stat_bufs = 2 if self.stats_off_consumers else 1  # then double-buffered per tile (+ 4 mbarriers)
        misc = stat_bufs * self.BLOCK_M * 4 + 2 * self.NUM_STAGES * 8 + 1024
        if self.stats_off_consumers:
            misc += 4 * 8
        if layernorm:  # + the register A operand's trip through shared memory into the wgmma operand layout
            ext = self.NUM_CONSUMERS * 16 * (self.BLOCK_N + self.rows_per_consumer) * itemsize
            misc += stat_bufs * self.BLOCK_M * 4 + (ext if self.LN_EPILOGUE_MMA else 0)
        return ring + epilogue + misc


DEFAULT_CONFIG = TilingConfig()

# Every config we ship is compile-checked for sm_90 in tests/tlx and GPU-checked by `python -m
# kernels_tlx.lazy_prenorm`. "nonpersistent" runs each tile in its own CTA (isolates the cross-tile phase
# bookkeeping); "bn128_s4" halves the accumulator and deepens the ring; "s4_subtile" keeps BLOCK_N=256 with
# 4 stages by halving the epilogue staging buffer; "reuse_rstd*" walk all N-tiles of an M-tile in one CTA and
# compute the sum of squares once per M-tile (see TilingConfig.REUSE_RSTD).
SHIPPED_CONFIGS: dict[str, TilingConfig] = {
    "default": DEFAULT_CONFIG,
    "nonpersistent": TilingConfig(PERSISTENT=False),
    "bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4),
    "s4_subtile": TilingConfig(NUM_STAGES=4, EPILOGUE_SUBTILE=True),
    "reuse_rstd": TilingConfig(REUSE_RSTD=True),
    "reuse_rstd_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4, REUSE_RSTD=True),
    # the statistics off the consumers' path (the consumers then run the plain GEMM loop): in the producer
    # warpgroup (CONSUMER_REGS 200 leaves it 104 registers; the consumers use < 200), or in a 4th warpgroup, which
    # needs BLOCK_N <= 128 (16 warps: 128 registers per thread at compile time); see TilingConfig.STATS_*
    "stats_producer": TilingConfig(STATS_IN_PRODUCER=True, CONSUMER_REGS=200),
    "stats_producer_s4_subtile": TilingConfig(NUM_STAGES=4, EPILOGUE_SUBTILE=True, STATS_IN_PRODUCER=True,
                                              CONSUMER_REGS=200),
    "stats_warpgroup_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4, STATS_WARPGROUP=True, CONSUMER_REGS=192,
                                             STATS_REGS=56),
    # the A slice read from shared memory once, into the wgmma's register operand, and the statistic taken from
    # those registers (no second shared-memory pass over A; see TilingConfig.A_FROM_REGS)
    "a_regs": TilingConfig(A_FROM_REGS=True),
    "a_regs_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4, A_FROM_REGS=True),
    "a_regs_s4_subtile": TilingConfig(NUM_STAGES=4, EPILOGUE_SUBTILE=True, A_FROM_REGS=True),
    # the cluster form (kernels_tlx.multi_cta's kernel; TilingConfig.CLUSTER_SIZE): c2 serves N in (256, 512], c4
    # (768, 1024], c8 (1792, 2048]; the statistic split K-wise across the cluster, computed once per row
    "cluster_c2": TilingConfig(CLUSTER_SIZE=2),
    "cluster_c4": TilingConfig(CLUSTER_SIZE=4),
    "cluster_c8": TilingConfig(CLUSTER_SIZE=8),
    "cluster_c2_defer": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True),
    "cluster_c4_defer": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True),
    "cluster_c8_defer": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True),
    "cluster_c8_mcast": TilingConfig(CLUSTER_SIZE=8, MULTICAST_A=True),
    # two 256-wide column tiles per CTA (TilingConfig.TILES_PER_CTA): c2 serves N in (512, 1024], c4 (1536, 2048]
    "cluster_c2_t2": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2),
    "cluster_c4_t2": TilingConfig(CLUSTER_SIZE=4, TILES_PER_CTA=2),
    # twice the CTAs per row at half the width (BLOCK_N = 128, 4 stages): each CTA sums a^2 over 1/4 (N = 512) or
    # 1/8 (N = 1024) of K instead of 1/2 or 1/4, at the cost of a narrower GEMM tile
    "cluster_c4_bn128_defer": TilingConfig(CLUSTER_SIZE=4, BLOCK_N=128, NUM_STAGES=4, STORE_DEFER=True),
    "cluster_c8_bn128_defer": TilingConfig(CLUSTER_SIZE=8, BLOCK_N=128, NUM_STAGES=4, STORE_DEFER=True),
    # a^2 accumulated elementwise in registers, reduced across threads once per tile (TilingConfig.STATS_ELEMENTWISE)
    "cluster_c2_defer_elem": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True),
    "cluster_c4_defer_elem": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True),
    "cluster_c8_defer_elem": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True, STATS_ELEMENTWISE=True),
    "cluster_c2_t2_elem": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, STATS_ELEMENTWISE=True),
    # ... and widened from bf16 with two integer instructions per pair (TilingConfig.STATS_UNPACK_ASM)
    "cluster_c2_defer_elem_asm": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                              STATS_UNPACK_ASM=True),
    "cluster_c2_t2_elem_asm": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, STATS_ELEMENTWISE=True,
                                           STATS_UNPACK_ASM=True),
    # ... with the A tile TMA-multicast across the pair (each CTA loads 32 of a box's 64 rows: a sixth less L2 traffic
    # per stage); measured slower (experiment lazy_prenorm_mcast, docs/results/lazy_prenorm.md)
    "cluster_c2_defer_elem_asm_mcast": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                    STATS_UNPACK_ASM=True, MULTICAST_A=True),
    # the statistic in the producer warpgroup, off the wgmma warps (TilingConfig.STATS_IN_PRODUCER; CONSUMER_REGS
    # 208 leaves the producer 88 registers: setmaxnreg.dec in the PTX)
    "cluster_c2_defer_prod_asm": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_IN_PRODUCER=True,
                                              STATS_UNPACK_ASM=True, CONSUMER_REGS=208),
    "cluster_c4_defer_prod_asm": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_IN_PRODUCER=True,
                                              STATS_UNPACK_ASM=True, CONSUMER_REGS=208),
    "cluster_c2_t2_prod_asm": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, STATS_IN_PRODUCER=True,
                                           STATS_UNPACK_ASM=True, CONSUMER_REGS=208),
    # the SMs the c4 / c8 grid leaves idle (12 on the H200) run the last rows (TilingConfig.FILL_IDLE_SMS), split by
    # SM count (FILL_RATE_PCT 100) or with the filler at 80 % of a cluster SM's rate
    "cluster_c4_defer_elem_fill": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                               FILL_IDLE_SMS=True),
    "cluster_c4_defer_elem_fill80": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                 FILL_IDLE_SMS=True, FILL_RATE_PCT=80),
    "cluster_c8_defer_fill": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True, FILL_IDLE_SMS=True),
    # ... the filler's rate, swept (experiment lazy_prenorm_fill_rate)
    "cluster_c4_defer_elem_fill70": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                 FILL_IDLE_SMS=True, FILL_RATE_PCT=70),
    "cluster_c4_defer_elem_fill60": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                 FILL_IDLE_SMS=True, FILL_RATE_PCT=60),
    "cluster_c8_defer_fill80": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True, FILL_IDLE_SMS=True, FILL_RATE_PCT=80),
    "cluster_c8_defer_fill60": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True, FILL_IDLE_SMS=True, FILL_RATE_PCT=60),
}
# LayerNorm (``lazy_layernorm_matmul``): the two best RMSNorm tilings on the H200 (persistent 128x256x64, 3 stages,
# with and without REUSE_RSTD), with EPILOGUE_SUBTILE so that the extra-MMA epilogue's 20 KB fit, plus the
# register-broadcast epilogue on the REUSE_RSTD tiles (no subtile needed) to measure which epilogue wins.
SHIPPED_LN_CONFIGS: dict[str, TilingConfig] = {
    "ln_reuse_rstd_subtile": TilingConfig(REUSE_RSTD=True, EPILOGUE_SUBTILE=True),
    "ln_subtile": TilingConfig(EPILOGUE_SUBTILE=True),
    "ln_reuse_rstd_broadcast": TilingConfig(REUSE_RSTD=True, LN_EPILOGUE_MMA=False),
    # the statistics (shifted sums) off the consumers' path, as the RMSNorm "stats_*" configs
    "ln_stats_producer_subtile": TilingConfig(EPILOGUE_SUBTILE=True, STATS_IN_PRODUCER=True, CONSUMER_REGS=200),
    "ln_stats_warpgroup_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4, STATS_WARPGROUP=True, CONSUMER_REGS=192,
                                                STATS_REGS=56),
    # the shifted sums from the wgmma's register A operand, as the RMSNorm "a_regs*" configs
    "ln_a_regs_subtile": TilingConfig(EPILOGUE_SUBTILE=True, A_FROM_REGS=True),
    "ln_a_regs_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4, A_FROM_REGS=True),
    # the cluster form (TilingConfig.CLUSTER_SIZE; kernels_tlx.multi_cta.lazy_layernorm_matmul): c2 serves N in
    # (256, 512], c4 (768, 1024], c8 (1792, 2048]; the shifted sums split K-wise across the cluster, the epilogue in
    # fp32 (no extra MMA, so no EPILOGUE_SUBTILE needed: 217-230 KB of shared memory at BLOCK_N 256, 3 stages)
    "ln_cluster_c2": TilingConfig(CLUSTER_SIZE=2),
    "ln_cluster_c4": TilingConfig(CLUSTER_SIZE=4),
    "ln_cluster_c8": TilingConfig(CLUSTER_SIZE=8),
    "ln_cluster_c2_defer": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True),
    "ln_cluster_c4_defer": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True),
    "ln_cluster_c8_defer": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True),
    # the shifted terms and their squares accumulated elementwise in registers (TilingConfig.STATS_ELEMENTWISE)
    "ln_cluster_c2_defer_elem": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True),
    "ln_cluster_c4_defer_elem": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True),
    "ln_cluster_c8_defer_elem": TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True, STATS_ELEMENTWISE=True),
    "ln_cluster_c2_defer_elem_asm": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                 STATS_UNPACK_ASM=True),
    "ln_cluster_c4_defer_elem_asm": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                 STATS_UNPACK_ASM=True),
    # ... with the rank-1 correction as one more k16 wgmma per tile (TilingConfig.LN_RANK1_MMA)
    "ln_cluster_c2_defer_elem_asm_mma": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                     STATS_UNPACK_ASM=True, LN_RANK1_MMA=True),
    "ln_cluster_c4_defer_elem_asm_mma": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                     STATS_UNPACK_ASM=True, LN_RANK1_MMA=True),
    # c8 (N = 2048) with it fits only with a 2-stage ring
    "ln_cluster_c8_s2_defer_elem_asm_mma": TilingConfig(CLUSTER_SIZE=8, NUM_STAGES=2, STORE_DEFER=True,
                                                        STATS_ELEMENTWISE=True, STATS_UNPACK_ASM=True,
                                                        LN_RANK1_MMA=True),
    # ... and the next M-tile's per-row shift loaded during this tile's epilogue (TilingConfig.LN_SHIFT_PREFETCH)
    "ln_cluster_c2_defer_elem_asm_mma_pf": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                        STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                        LN_SHIFT_PREFETCH=True),
    "ln_cluster_c4_defer_elem_asm_mma_pf": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                        STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                        LN_SHIFT_PREFETCH=True),
    # ... with the idle SMs of the c4 grid filled (TilingConfig.FILL_IDLE_SMS)
    "ln_cluster_c4_defer_elem_asm_mma_fill": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                          STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                          FILL_IDLE_SMS=True),
    "ln_cluster_c4_defer_elem_asm_mma_fill80": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                            STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                            FILL_IDLE_SMS=True, FILL_RATE_PCT=80),
    "ln_cluster_c4_defer_elem_asm_mma_fill65": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                            STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                            FILL_IDLE_SMS=True, FILL_RATE_PCT=65),
    "ln_cluster_c4_defer_elem_asm_mma_fill50": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                            STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                            FILL_IDLE_SMS=True, FILL_RATE_PCT=50),
    "ln_cluster_c4_defer_elem_asm_mma_fill90": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                            STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                            FILL_IDLE_SMS=True, FILL_RATE_PCT=90),
    "ln_cluster_c4_defer_elem_asm_mma_fill85": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, STATS_ELEMENTWISE=True,
                                                            STATS_UNPACK_ASM=True, LN_RANK1_MMA=True,
                                                            FILL_IDLE_SMS=True, FILL_RATE_PCT=85),
    # ... or the shift read from the first A slice in shared memory (TilingConfig.LN_SHIFT_SMEM)
    "ln_cluster_c2_defer_elem_asm_mma_smemshift": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True,
                                                               STATS_ELEMENTWISE=True, STATS_UNPACK_ASM=True,
                                                               LN_RANK1_MMA=True, LN_SHIFT_SMEM=True),
    "ln_cluster_c4_defer_elem_asm_mma_smemshift": TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True,
                                                               STATS_ELEMENTWISE=True, STATS_UNPACK_ASM=True,
                                                               LN_RANK1_MMA=True, LN_SHIFT_SMEM=True),
}
# ``lazy_layernorm_matmul(config=None)``: DEFAULT_CONFIG's tile with a half-size epilogue staging buffer, since the
# LayerNorm epilogue's extra buffers do not fit beside DEFAULT_CONFIG's full one (235568 B > 232448 B).
DEFAULT_LN_CONFIG = SHIPPED_LN_CONFIGS["ln_subtile"]


# ------------------------------------------------------------------------------------------------------------
# Kernel
# ------------------------------------------------------------------------------------------------------------
# A_FROM_REGS: the register layout of the m64 k16 wgmma's A operand for one consumer warpgroup's [64, 64] A slice
# (PTX ISA, "Register fragments: wgmma .m64nNk16", A): warp w holds rows 16w..16w+15; lane 4g + t holds rows g and
# g + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9 of each 16-column k-chunk (flat offset row * 64 + col). A slice loaded
# in it feeds tlx.async_dot with no layout conversion (ldmatrix straight into the wgmma's operand registers), and a
# row sum over it stays inside each quad of lanes (2 shuffles per row).
_A_REGS_LAYOUT = tlx.layout(shape=((4, 8, 4), (2, 2, 2, 4)), stride=((2, 64, 1024), (1, 512, 8, 16)))


@triton.jit
def _tile_range(num_tiles, REUSE_RSTD: tl.constexpr):
    """This CTA's tile loop ``range(first, last, step)``; the producer and the consumers call it identically.

    Default: tiles ``pid, pid + G, pid + 2G, ...`` (G = grid size). REUSE_RSTD: the contiguous chunk
    ``[first, last)`` of ``num_tiles`` split into G near-equal parts (sizes differ by at most 1; every CTA gets
    at least one tile since G <= num_tiles), so that one CTA visits the N-tiles of an M-tile consecutively."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if REUSE_RSTD:
        per_cta = num_tiles // nprog
        extra = num_tiles % nprog  # the first `extra` CTAs take one more tile
        first = pid * per_cta + tl.minimum(pid, extra)
        last = first + per_cta + tl.where(pid < extra, 1, 0)
        step = 1
    else:
        first = pid
        last = num_tiles
        step = nprog
    return first, last, step


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr, REUSE_RSTD: tl.constexpr):
    """Tile id -> (pid_m, pid_n). Default: grouped order, GROUP_M row-tiles are swept together along N (A
    row-tiles and B stay in L2). REUSE_RSTD: row-major (m-major) order, all N-tiles of an M-tile in a row."""
    if REUSE_RSTD:
        pid_m = tile_id // num_pid_n
        pid_n = tile_id - pid_m * num_pid_n
    else:
        num_pid_in_group = GROUP_M * num_pid_n
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
        pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _starts_row_run(tile_id, first_tile, pid_n):
    """REUSE_RSTD: True on the tiles whose consumers compute the sum of squares and store rstd -- the first
    N-tile of an M-tile (pid_n == 0) and the CTA's first tile (its chunk may start inside an M-tile). Every other
    tile directly follows, in the same CTA, the tile (pid_m, pid_n - 1), whose rstd is still in rstd_bufs."""
    return (pid_n == 0) | (tile_id == first_tile)


@triton.jit
def _ln_tile_stats(a_tile, shift, off_k, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """LayerNorm: ``(sum y, sum y^2)`` per row of one shared-memory A slice, ``y = a - shift`` in fp32, the K
    padding (TMA zero fill) masked to 0 unless ``EVEN_K``."""
    y = tlx.local_load(a_tile).to(tl.float32) - shift[:, None]
    if not EVEN_K:
        y = tl.where(((off_k + tl.arange(0, BLOCK_K)) < K)[None, :], y, 0.0)
    return tl.sum(y, axis=1), tl.sum(y * y, axis=1)


@triton.jit
def _ln_store_scales(rstd_buf, d_buf, s1, s2, K, eps):
    """LayerNorm statistics from the shifted sums, into the consumer's shared buffers: ``d = s1/K`` (the mean is
    shift + d) and ``rstd = rsqrt(max(s2/K - d^2, 0) + eps)``."""
    d = s1 / K
    tlx.local_store(rstd_buf, tl.math.rsqrt(tl.maximum(s2 / K - d * d, 0.0) + eps))
    tlx.local_store(d_buf, d)


@triton.jit
def _split3(x, DT: tl.constexpr):
    """fp32 ``x`` as three ``DT`` parts, ``x ~= x1 + x2 + x3`` to about 24 bits for bf16 (each part rounds the
    remainder of the previous ones, which fp32 holds exactly)."""
    x1 = x.to(DT)
    r = x - x1.to(tl.float32)
    x2 = r.to(DT)
    x3 = (r - x2.to(tl.float32)).to(DT)
    return x1, x2, x3


@triton.jit
def _ln_a_ext(shift, d, rstd, DT: tl.constexpr):
    """The [rows, 16] register A operand of the rank-1 epilogue wgmma (columns: ``-shift`` x3, ``-d1, -d1, -d2``,
    ``s1, s1, s2``, zeros; ``d = d1 + d2``, ``1/rstd = s1 + s2``); see ``_ln_b_ext``."""
    d1, d2, _ = _split3(d, DT)
    s1, s2, _ = _split3(1.0 / rstd, DT)
    j = tl.arange(0, 16)[None, :]
    a = tl.where(j < 3, (-shift).to(DT)[:, None], tl.zeros([1, 16], DT))  # -shift: exact (an element of A)
    a = tl.where((j == 3) | (j == 4), (-d1)[:, None], a)
    a = tl.where(j == 5, (-d2)[:, None], a)
    a = tl.where((j == 6) | (j == 7), s1[:, None], a)
    a = tl.where(j == 8, s2[:, None], a)
    return a


@triton.jit
def _ln_b_ext(cs, bb, DT: tl.constexpr):
    """The [16, BLOCK_N] B operand of the rank-1 epilogue wgmma from the fp32 colsum / beta_b tile ``cs``, ``bb``
    [BLOCK_N]: rows ``cs1, cs2, cs3, cs1, cs2, cs1, bb1, bb2, bb1`` and zeros, their ``DT`` splits. With
    ``_ln_a_ext``: ``A_ext @ B_ext = -shift ⊗ colsum - d ⊗ colsum + (1/rstd) ⊗ beta_b`` (to ~24 bits in the shift
    term, whose cancellation against the accumulator is the large one; ~16 bits in the others)."""
    cs1, cs2, cs3 = _split3(cs, DT)
    bb1, bb2, _ = _split3(bb, DT)
    j = tl.arange(0, 16)[:, None]
    b = tl.where((j == 0) | (j == 3) | (j == 5), cs1[None, :], tl.zeros([16, 1], DT))
    b = tl.where((j == 1) | (j == 4), cs2[None, :], b)
    b = tl.where(j == 2, cs3[None, :], b)
    b = tl.where((j == 6) | (j == 8), bb1[None, :], b)
    b = tl.where(j == 7, bb2[None, :], b)
    return b


@triton.jit
def _ln_correct(acc, rm_rows, colsum_ptr, betab_ptr, off_n, N, WIDTH: tl.constexpr):
    """``acc - (rstd * mean) ⊗ colsum + beta_b`` on one [rows, WIDTH] column chunk starting at column ``off_n``."""
    cols = off_n + tl.arange(0, WIDTH)
    cs = tl.load(colsum_ptr + cols, mask=cols < N, other=0.0)
    bb = tl.load(betab_ptr + cols, mask=cols < N, other=0.0)
    return acc - rm_rows[:, None] * cs[None, :] + bb[None, :]


@triton.jit
def _ln_correct_halves(acc, rm_rows, colsum_ptr, betab_ptr, off_n, N, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """``_ln_correct`` on the two column halves of a [ROWS, WIDTH] chunk (a register-only split)."""
    lo, hi = tl.split(tl.permute(tl.reshape(acc, (ROWS, 2, WIDTH // 2)), (0, 2, 1)))
    lo = _ln_correct(lo, rm_rows, colsum_ptr, betab_ptr, off_n, N, WIDTH // 2)
    hi = _ln_correct(hi, rm_rows, colsum_ptr, betab_ptr, off_n + WIDTH // 2, N, WIDTH // 2)
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (ROWS, WIDTH))


@triton.jit
def _ln_epilogue(acc, rstd_rows, rm_rows, colsum_ptr, betab_ptr, off_n, N, BM_C: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """``rstd * acc - (rstd * mean) ⊗ colsum + beta_b`` on one consumer's [BM_C, BLOCK_N] accumulator, in column
    chunks of at most 64 (register-only splits, as for the EPILOGUE_SUBTILE store). Broadcasting whole-tile
    [BLOCK_N] vectors made the compiler convert the fp32 accumulator to the vectors' layout through shared memory
    (64 ``ldmatrix`` and 64 KB of scratch at BLOCK_N = 256); 128-wide halves still cost 64 ``ld.shared.v4`` per
    thread to convert the vectors; 64-wide chunks need no shared-memory round trip at all (sm_90 PTX)."""
    acc = acc * rstd_rows[:, None]
    if BLOCK_N > 128:
        lo, hi = tl.split(tl.permute(tl.reshape(acc, (BM_C, 2, BLOCK_N // 2)), (0, 2, 1)))
        lo = _ln_correct_halves(lo, rm_rows, colsum_ptr, betab_ptr, off_n, N, BM_C, BLOCK_N // 2)
        hi = _ln_correct_halves(hi, rm_rows, colsum_ptr, betab_ptr, off_n + BLOCK_N // 2, N, BM_C, BLOCK_N // 2)
        acc = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BM_C, BLOCK_N))
    elif BLOCK_N > 64:
        acc = _ln_correct_halves(acc, rm_rows, colsum_ptr, betab_ptr, off_n, N, BM_C, BLOCK_N)
    else:
        acc = _ln_correct(acc, rm_rows, colsum_ptr, betab_ptr, off_n, N, BLOCK_N)
    return acc


@triton.jit
def _stats_rows(a_bufs, s, c: tl.constexpr, shift, off_k, K, acc1, acc2, NUM_STAGES: tl.constexpr,
                BLOCK_K: tl.constexpr, LAYERNORM: tl.constexpr, EVEN_K: tl.constexpr):
    """STATS_WARPGROUP: add one ring slot's statistics of consumer ``c``'s A slice to ``(acc1, acc2)``: RMSNorm
    ``acc2 += sum a^2`` (``acc1`` unused); LayerNorm ``acc1 += sum (a - shift)``, ``acc2 += sum (a - shift)^2``."""
    a_tile = a_bufs[c * NUM_STAGES + s]
    if LAYERNORM:
        p1, p2 = _ln_tile_stats(a_tile, shift, off_k, K, BLOCK_K, EVEN_K)
        acc1 += p1
        acc2 += p2
    else:
        x = tlx.local_load(a_tile).to(tl.float32)
        acc2 += tl.sum(x * x, axis=1)
    return acc1, acc2


@triton.jit
def _stats_store(rstd_bufs, d_bufs, c: tl.constexpr, stat_set, acc1, acc2, K, eps, LAYERNORM: tl.constexpr):
    """STATS_WARPGROUP: consumer ``c``'s rows of the tile's statistics into buffer set ``stat_set``."""
    if LAYERNORM:
        _ln_store_scales(rstd_bufs[2 * c + stat_set], d_bufs[2 * c + stat_set], acc1, acc2, K, eps)
    else:
        tlx.local_store(rstd_bufs[2 * c + stat_set], tl.math.rsqrt(acc2 / K + eps))


@triton.jit
def _stats_task_tile(a_bufs, full_bars, empty_bars, rstd_bufs, d_bufs, stats_full, stats_empty, a_ptr, off_m, M,
                     K, eps, it, k_tiles, t_local, BM_C: tl.constexpr, BLOCK_K: tl.constexpr,
                     NUM_STAGES: tl.constexpr, NUM_CONSUMERS: tl.constexpr, LAYERNORM: tl.constexpr,
                     EVEN_K: tl.constexpr):
    """STATS_WARPGROUP: one output tile of the statistics warpgroup (4 warps, ``setmaxnreg`` STATS_REGS).

    For each of the tile's ``k_tiles`` ring slots (global K-step counter ``it``, as in the other tasks): wait on
    ``full[s]`` (parity ``(it // NUM_STAGES) & 1``), read every consumer's A slice from shared memory, add its
    fp32 row statistics, and release the slot at once (one of the ``NUM_CONSUMERS + 1`` arrivals of
    ``empty[s]``; the warpgroup ``bar.sync`` inside ``barrier_arrive`` orders it after all its shared loads).
    Then wait until buffer set ``t_local % 2`` is free (``stats_empty``, parity ``((t_local // 2) & 1) ^ 1``: the
    first two tiles pass at once), store rstd (LayerNorm: and ``d``) per consumer and arrive on ``stats_full``
    (mbarrier arrive = release, the consumers' wait = acquire). LayerNorm shifts: ``A[row, 0]`` of each consumer's
    rows from global memory, with the same clamped rows as the consumers (which load them too, for the
    epilogue). Rows past M get garbage statistics (zero-filled or clamped A slices) that no consumer stores."""
    acc1_0 = tl.zeros([BM_C], dtype=tl.float32)
    acc2_0 = tl.zeros([BM_C], dtype=tl.float32)
    acc1_1 = tl.zeros([BM_C], dtype=tl.float32)
    acc2_1 = tl.zeros([BM_C], dtype=tl.float32)
    shift0 = tl.zeros([BM_C], dtype=tl.float32)
    shift1 = tl.zeros([BM_C], dtype=tl.float32)
    if LAYERNORM:
        rows0 = tl.minimum(off_m, M - 1) + tl.arange(0, BM_C)
        shift0 = tl.load(a_ptr + rows0.to(tl.int64) * K, mask=rows0 < M, other=0.0).to(tl.float32)
        if NUM_CONSUMERS == 2:
            rows1 = tl.minimum(off_m + BM_C, M - 1) + tl.arange(0, BM_C)
            shift1 = tl.load(a_ptr + rows1.to(tl.int64) * K, mask=rows1 < M, other=0.0).to(tl.float32)
    for ki in range(0, k_tiles):
        s = (it + ki) % NUM_STAGES
        tlx.barrier_wait(full_bars[s], ((it + ki) // NUM_STAGES) & 1)
        acc1_0, acc2_0 = _stats_rows(a_bufs, s, 0, shift0, ki * BLOCK_K, K, acc1_0, acc2_0, NUM_STAGES, BLOCK_K,
                                     LAYERNORM, EVEN_K)
        if NUM_CONSUMERS == 2:
            acc1_1, acc2_1 = _stats_rows(a_bufs, s, 1, shift1, ki * BLOCK_K, K, acc1_1, acc2_1, NUM_STAGES,
                                         BLOCK_K, LAYERNORM, EVEN_K)
        tlx.barrier_arrive(empty_bars[s])
    stat_set = t_local % 2
    tlx.barrier_wait(stats_empty[stat_set], ((t_local // 2) & 1) ^ 1)
    _stats_store(rstd_bufs, d_bufs, 0, stat_set, acc1_0, acc2_0, K, eps, LAYERNORM)
    if NUM_CONSUMERS == 2:
        _stats_store(rstd_bufs, d_bufs, 1, stat_set, acc1_1, acc2_1, K, eps, LAYERNORM)
    tlx.barrier_arrive(stats_full[stat_set])


@triton.jit
def _widen_bf16(x):
    """STATS_UNPACK_ASM: a bf16 tensor to fp32 (exact), two integer ops per packed pair of the register layout: the
    low element is the word shifted up by 16 bits, the high one the word with its low 16 bits cleared."""
    w = tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x],
                                  dtype=tl.int32, is_pure=True, pack=2)
    return w.to(tl.float32, bitcast=True)


@triton.jit
def _col0(a_tile, UNPACK_ASM: tl.constexpr = False):
    """Column 0 of a shared-memory A slice as fp32 [rows] (the LayerNorm shift: the row's first element, 0 for
    TMA zero-filled rows past M), extracted from the register tile without a layout conversion (the row sum with
    every other column zeroed: exact). ``UNPACK_ASM``: bf16 widened by ``_widen_bf16`` (the cluster form's
    LN_SHIFT_SMEM with STATS_UNPACK_ASM)."""
    if UNPACK_ASM:
        x = _widen_bf16(tlx.local_load(a_tile))
    else:
        x = tlx.local_load(a_tile).to(tl.float32)
    col = tl.arange(0, x.shape[1])[None, :]
    return tl.sum(tl.where(col == 0, x, 0.0), axis=1)


@triton.jit
def _flat_steps(num_tiles, k_tiles):
    """STATS_IN_PRODUCER: the number of K steps of this CTA's tiles ``pid, pid + G, ...`` (pid < num_tiles)."""
    return tl.cdiv(num_tiles - tl.program_id(0), tl.num_programs(0)) * k_tiles


@triton.jit
def _flat_step(j, k_tiles, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """STATS_IN_PRODUCER: this CTA's K step ``j`` -> ``(t, ki, pid_m, pid_n)``: its ``t``-th tile (tile id
    ``pid + t * G``, grouped order as ``_tile_coords``) and K step ``ki`` within it; the same sequence as the
    consumers' nested (``_tile_range``, k) loops."""
    t = j // k_tiles
    ki = j - t * k_tiles
    pid_m, pid_n = _tile_coords(tl.program_id(0) + t * tl.num_programs(0), num_pid_m, num_pid_n, GROUP_M, False)
    return t, ki, pid_m, pid_n


@triton.jit
def _producer_with_stats(a_desc, b_desc, a_bufs, b_bufs, full_bars, empty_bars, rstd_bufs, d_bufs, stats_full,
                         stats_empty, M, K, eps, num_pid_m, num_pid_n, num_tiles, k_tiles, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         NUM_STAGES: tl.constexpr, NUM_CONSUMERS: tl.constexpr, STAGE_BYTES: tl.constexpr,
                         LAYERNORM: tl.constexpr, EVEN_K: tl.constexpr):
    """STATS_IN_PRODUCER: the producer warpgroup's loop, TMA loads *and* the per-row statistics.

    One flat loop over this CTA's K steps ``j = 0 .. n_tiles * k_tiles - 1`` (the same (tile, k) sequence as the
    consumers: grouped order, tiles ``pid, pid + G, ...``) plus ``LAG = NUM_STAGES - 1`` drain iterations.
    Iteration ``j`` first issues the loads of step ``j`` exactly as the plain producer does (wait ``empty``,
    ``expect_tx``, TMA), then takes the statistics of step ``js = j - LAG``: wait ``full`` of its slot, read every
    consumer's A slice from shared memory, add the fp32 row sums, release the slot (``empty`` counts
    ``NUM_CONSUMERS + 1``). Lagging by NUM_STAGES - 1 keeps NUM_STAGES - 1 loads in flight while the producer
    waits for data, and is deadlock-free: slot reuse at step ``j`` needs the statistics of step ``j - NUM_STAGES``,
    taken at iteration ``j - 1``. At the last K step of a tile the statistics go to buffer set ``t % 2`` and
    ``stats_full`` (the hand-off of ``_stats_task_tile``). LayerNorm shift: column 0 of the tile's first A slice
    (= ``A[row, 0]``, 0 past M, as the consumers load it from global memory)."""
    BM_C: tl.constexpr = BLOCK_M // NUM_CONSUMERS
    LAG: tl.constexpr = NUM_STAGES - 1
    total = _flat_steps(num_tiles, k_tiles)
    acc1_0 = tl.zeros([BM_C], dtype=tl.float32)
    acc2_0 = tl.zeros([BM_C], dtype=tl.float32)
    acc1_1 = tl.zeros([BM_C], dtype=tl.float32)
    acc2_1 = tl.zeros([BM_C], dtype=tl.float32)
    shift0 = tl.zeros([BM_C], dtype=tl.float32)
    shift1 = tl.zeros([BM_C], dtype=tl.float32)
    for j in range(0, total + LAG):
        if j < total:  # loads of step j
            _, ki, pid_m, pid_n = _flat_step(j, k_tiles, num_pid_m, num_pid_n, GROUP_M)
            s = j % NUM_STAGES
            tlx.barrier_wait(empty_bars[s], ((j // NUM_STAGES) & 1) ^ 1)  # first use of a slot passes at once
            tlx.barrier_expect_bytes(full_bars[s], STAGE_BYTES)
            for c in tl.static_range(NUM_CONSUMERS):
                a_row = tl.minimum(pid_m * BLOCK_M + c * BM_C, M - 1)  # clamped as in the plain producer
                tlx.async_descriptor_load(a_desc, a_bufs[c * NUM_STAGES + s], [a_row, ki * BLOCK_K], full_bars[s])
            tlx.async_descriptor_load(b_desc, b_bufs[s], [ki * BLOCK_K, pid_n * BLOCK_N], full_bars[s])
        js = j - LAG
        if js >= 0:  # statistics of step js
            ts, ks, _, _ = _flat_step(js, k_tiles, num_pid_m, num_pid_n, GROUP_M)
            ss = js % NUM_STAGES
            tlx.barrier_wait(full_bars[ss], (js // NUM_STAGES) & 1)
            if LAYERNORM:
                if ks == 0:
                    shift0 = _col0(a_bufs[ss])
                    if NUM_CONSUMERS == 2:
                        shift1 = _col0(a_bufs[NUM_STAGES + ss])
            acc1_0, acc2_0 = _stats_rows(a_bufs, ss, 0, shift0, ks * BLOCK_K, K, acc1_0, acc2_0, NUM_STAGES, BLOCK_K,
                                         LAYERNORM, EVEN_K)
            if NUM_CONSUMERS == 2:
                acc1_1, acc2_1 = _stats_rows(a_bufs, ss, 1, shift1, ks * BLOCK_K, K, acc1_1, acc2_1, NUM_STAGES,
                                             BLOCK_K, LAYERNORM, EVEN_K)
            tlx.barrier_arrive(empty_bars[ss])
            if ks == k_tiles - 1:  # the tile's statistics are complete: hand them to the consumers
                stat_set = ts % 2
                tlx.barrier_wait(stats_empty[stat_set], ((ts // 2) & 1) ^ 1)
                _stats_store(rstd_bufs, d_bufs, 0, stat_set, acc1_0, acc2_0, K, eps, LAYERNORM)
                if NUM_CONSUMERS == 2:
                    _stats_store(rstd_bufs, d_bufs, 1, stat_set, acc1_1, acc2_1, K, eps, LAYERNORM)
                tlx.barrier_arrive(stats_full[stat_set])
                acc1_0 = tl.zeros([BM_C], dtype=tl.float32)
                acc2_0 = tl.zeros([BM_C], dtype=tl.float32)
                acc1_1 = tl.zeros([BM_C], dtype=tl.float32)
                acc2_1 = tl.zeros([BM_C], dtype=tl.float32)


@triton.jit
def _lazy_prenorm_ws_kernel(
    a_desc,  # TMA descriptor of A [M, K], block [BLOCK_M // NUM_CONSUMERS, BLOCK_K]
    b_desc,  # TMA descriptor of B [K, N], block [BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of C [M, N], block [BLOCK_M // NUM_CONSUMERS, BLOCK_N (// 2 if EPILOGUE_SUBTILE)]
    M,
    N,
    K,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    NUM_CONSUMERS: tl.constexpr,
    CONSUMER_REGS: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    REUSE_RSTD: tl.constexpr,
    FUSE_RMSNORM: tl.constexpr,
    a_ptr=None,  # LAYERNORM: A [M, K] itself, for the per-row shift A[:, 0]
    colsum_ptr=None,  # LAYERNORM: fp32 [N] column sums of B_folded
    betab_ptr=None,  # LAYERNORM: fp32 [N] beta @ B
    LAYERNORM: tl.constexpr = False,  # with FUSE_RMSNORM: LayerNorm statistics and the rank-1 epilogue
    EVEN_K: tl.constexpr = True,  # K % BLOCK_K == 0: no K-padding mask on the LayerNorm statistics
    LN_EPILOGUE_MMA: tl.constexpr = True,  # LAYERNORM: rank-1 epilogue by an extra wgmma (else: broadcast)
    STATS_WARPGROUP: tl.constexpr = False,  # with FUSE_RMSNORM: the statistics in their own 4-warp task
    STATS_REGS: tl.constexpr = 56,  # STATS_WARPGROUP: setmaxnreg of that task
    STATS_IN_PRODUCER: tl.constexpr = False,  # with FUSE_RMSNORM: the statistics in the producer warpgroup
    A_FROM_REGS: tl.constexpr = False,  # with FUSE_RMSNORM: A slice -> registers once, feeding wgmma and the stats
    PDL_WAIT_END: tl.constexpr = False,  # FILL_IDLE_SMS filler: exit only after the primary (cluster) grid completes
):
    BM_C: tl.constexpr = BLOCK_M // NUM_CONSUMERS  # rows per consumer warpgroup
    STAGE_BYTES: tl.constexpr = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * tlx.size_of(tlx.dtype_of(a_desc))
    # the statistics are computed outside the consumers: by their own warpgroup, or by the producer warpgroup
    STATS_TASK: tl.constexpr = FUSE_RMSNORM and (STATS_WARPGROUP or STATS_IN_PRODUCER)
    PRODUCER_STATS: tl.constexpr = FUSE_RMSNORM and STATS_IN_PRODUCER
    # STATS_TASK: the statistics of tile t go to buffer set t % 2 (consumer c's rows: rstd_bufs[2 * c + t % 2])
    STAT_SETS: tl.constexpr = 2 if STATS_TASK else 1

    # Ring: consumer c's A slice of slot s lives in a_bufs[c * NUM_STAGES + s]; B of slot s in b_bufs[s].
    a_bufs = tlx.local_alloc((BM_C, BLOCK_K), tlx.dtype_of(a_desc), NUM_STAGES * NUM_CONSUMERS)
    b_bufs = tlx.local_alloc((BLOCK_K, BLOCK_N), tlx.dtype_of(b_desc), NUM_STAGES)
    full_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=1)
    # a slot is released by every consumer warpgroup (and by the statistics warpgroup, which reads it too)
    empty_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=NUM_CONSUMERS + (1 if STATS_TASK else 0))
    # Per-consumer rstd staging: a shared-memory round trip lets the compiler read rstd back directly in the
    # accumulator's row layout (otherwise it converts the whole fp32 accumulator to the norm's layout).
    rstd_bufs = tlx.local_alloc((BM_C, ), tl.float32, NUM_CONSUMERS * STAT_SETS)
    if STATS_TASK:
        # stats_full[j]: the statistics warpgroup wrote buffer set j (arrive count 1); stats_empty[j]: every
        # consumer has read its rows of set j (arrive count NUM_CONSUMERS)
        stats_full = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
        stats_empty = tlx.alloc_barriers(num_barriers=2, arrive_count=NUM_CONSUMERS)
    if LAYERNORM:  # d = mean - shift, the same way; and the B operand of the rank-1 epilogue wgmma
        d_bufs = tlx.local_alloc((BM_C, ), tl.float32, NUM_CONSUMERS * STAT_SETS)
        if LN_EPILOGUE_MMA:
            bext_bufs = tlx.local_alloc((16, BLOCK_N), tlx.dtype_of(b_desc), NUM_CONSUMERS)

    with tlx.async_tasks():
        # ---------------------------------------------------------------- producer: TMA loads
        with tlx.async_task("default"):
            num_pid_m = tl.cdiv(M, BLOCK_M)
            num_pid_n = tl.cdiv(N, BLOCK_N)
            num_tiles = num_pid_m * num_pid_n
            k_tiles = tl.cdiv(K, BLOCK_K)
            if PRODUCER_STATS:
                _producer_with_stats(a_desc, b_desc, a_bufs, b_bufs, full_bars, empty_bars, rstd_bufs,
                                     d_bufs if LAYERNORM else None, stats_full, stats_empty, M, K, eps, num_pid_m,
                                     num_pid_n, num_tiles, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES,
                                     NUM_CONSUMERS, STAGE_BYTES, LAYERNORM, EVEN_K)
            else:
                it = 0
                first_tile, last_tile, tile_step = _tile_range(num_tiles, REUSE_RSTD)
                for tile_id in range(first_tile, last_tile, tile_step):
                    pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M, REUSE_RSTD)
                    off_m = pid_m * BLOCK_M
                    off_n = pid_n * BLOCK_N
                    for ki in range(0, k_tiles):
                        s = it % NUM_STAGES
                        phase = (it // NUM_STAGES) & 1
                        tlx.barrier_wait(empty_bars[s], phase ^ 1)  # first use of a slot passes at once
                        tlx.barrier_expect_bytes(full_bars[s], STAGE_BYTES)
                        off_k = ki * BLOCK_K
                        for c in tl.static_range(NUM_CONSUMERS):
                            # Clamp so that no A box lies wholly below row M: a consumer whose rows are all out of
                            # bounds then computes on real rows and skips its store (see the epilogue).
                            a_row = tl.minimum(off_m + c * BM_C, M - 1)
                            tlx.async_descriptor_load(a_desc, a_bufs[c * NUM_STAGES + s], [a_row, off_k],
                                                      full_bars[s])
                        tlx.async_descriptor_load(b_desc, b_bufs[s], [off_k, off_n], full_bars[s])
                        it += 1
            if PDL_WAIT_END:
                # the filler of FILL_IDLE_SMS (a programmatic dependent grid): its CTAs exit only once the cluster
                # grid has completed and flushed, so that whatever the stream runs next sees both row blocks
                gdc_wait()

        # ---------------------------------------------------------------- consumers: wgmma (+ sum of squares)
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            num_pid_m = tl.cdiv(M, BLOCK_M)
            num_pid_n = tl.cdiv(N, BLOCK_N)
            num_tiles = num_pid_m * num_pid_n
            k_tiles = tl.cdiv(K, BLOCK_K)
            it = 0
            t_local = 0  # STATS_TASK: tiles done by this CTA (the statistics buffer set and its phase)
            # same (tile, k) sequence as the producer: the barrier phases depend on it
            first_tile, last_tile, tile_step = _tile_range(num_tiles, REUSE_RSTD)
            for tile_id in range(first_tile, last_tile, tile_step):
                pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M, REUSE_RSTD)
                if REUSE_RSTD:
                    # warp-uniform: every thread of both consumers takes the same branches below
                    new_row = _starts_row_run(tile_id, first_tile, pid_n)
                off_cm = pid_m * BLOCK_M + cid * BM_C
                off_n = pid_n * BLOCK_N
                acc = tl.zeros([BM_C, BLOCK_N], dtype=tl.float32)
                ss = tl.zeros([BM_C], dtype=tl.float32)
                if LAYERNORM:
                    # per-row shift = the first element of each row of this consumer's A slice (the slice starts at
                    # the producer's clamped row; rows past M read 0, matching TMA's zero fill)
                    srows = tl.minimum(off_cm, M - 1) + tl.arange(0, BM_C)
                    shift = tl.load(a_ptr + srows.to(tl.int64) * K, mask=srows < M, other=0.0).to(tl.float32)
                    s1 = tl.zeros([BM_C], dtype=tl.float32)
                    if LN_EPILOGUE_MMA:  # the epilogue's colsum / beta_b tile, loaded now: its latency hides
                        vcols = off_n + tl.arange(0, BLOCK_N)  # behind the K loop (2 + 2 registers a thread)
                        cs_t = tl.load(colsum_ptr + vcols, mask=vcols < N, other=0.0)
                        bb_t = tl.load(betab_ptr + vcols, mask=vcols < N, other=0.0)
                s_prev = 0
                for ki in range(0, k_tiles):
                    s = it % NUM_STAGES
                    phase = (it // NUM_STAGES) & 1
                    tlx.barrier_wait(full_bars[s], phase)
                    a_tile = a_bufs[cid * NUM_STAGES + s]
                    if A_FROM_REGS:
                        # One shared-memory read of the A slice (ldmatrix) serves the wgmma, as its register A
                        # operand, and the statistics. (The pins are inline: a pinned value cannot be passed to a
                        # jit helper.) K padding: TMA zero fill, masked for LayerNorm unless EVEN_K.
                        a_reg = tlx.require_layout(tlx.local_load(a_tile), _A_REGS_LAYOUT)
                        acc = tlx.async_dot(a_reg, b_bufs[s], acc)
                        y = a_reg.to(tl.float32)
                        if LAYERNORM:
                            y -= tlx.require_layout(tl.broadcast_to(shift[:, None], (BM_C, BLOCK_K)), _A_REGS_LAYOUT)
                            if not EVEN_K:
                                cols = tl.broadcast_to((ki * BLOCK_K + tl.arange(0, BLOCK_K))[None, :], (BM_C, BLOCK_K))
                                y = tl.where(tlx.require_layout(cols, _A_REGS_LAYOUT) < K, y, 0.0)
                            s1 += tl.sum(y, axis=1)
                        ss += tl.sum(y * y, axis=1)
                    else:
                        acc = tlx.async_dot(a_tile, b_bufs[s], acc)
                    if FUSE_RMSNORM and not STATS_TASK and not A_FROM_REGS:
                        # Runs while the wgmma above is in flight; TMA zero-fills out-of-bounds K columns.
                        if LAYERNORM:  # shifted sums of y = a - shift (K padding masked: it would add -shift)
                            if REUSE_RSTD:
                                if new_row:  # later N-tiles of this M-tile reuse the stored rstd, rstd * mean
                                    p1, p2 = _ln_tile_stats(a_tile, shift, ki * BLOCK_K, K, BLOCK_K, EVEN_K)
                                    s1 += p1
                                    ss += p2
                            else:
                                p1, p2 = _ln_tile_stats(a_tile, shift, ki * BLOCK_K, K, BLOCK_K, EVEN_K)
                                s1 += p1
                                ss += p2
                        elif REUSE_RSTD:
                            if new_row:  # later N-tiles of this M-tile reuse the stored rstd
                                x = tlx.local_load(a_tile).to(tl.float32)
                                ss += tl.sum(x * x, axis=1)
                        else:
                            x = tlx.local_load(a_tile).to(tl.float32)
                            ss += tl.sum(x * x, axis=1)
                    acc = tlx.async_dot_wait(1, acc)  # the previous wgmma has retired: release its slot
                    if ki > 0:
                        tlx.barrier_arrive(empty_bars[s_prev])
                    s_prev = s
                    it += 1
                if STATS_TASK:
                    # (the K loop's last wgmma may still be in flight) this tile's statistics, written by the
                    # statistics warpgroup; released after the epilogue's last read of them (stats_empty below)
                    stat_set = t_local % 2
                    tlx.barrier_wait(stats_full[stat_set], (t_local // 2) & 1)
                    rstd_buf = rstd_bufs[2 * cid + stat_set]
                    if LAYERNORM:
                        d_buf = d_bufs[2 * cid + stat_set]
                if LAYERNORM:
                    # (the K loop's last wgmma may still be in flight: the statistics and the epilogue operands are
                    # formed meanwhile)
                    if STATS_TASK:
                        pass  # rstd_buf, d_buf: this tile's set, filled by the statistics warpgroup
                    elif REUSE_RSTD:
                        rstd_buf = rstd_bufs[cid]  # private to this consumer; with REUSE_RSTD they outlive the tile
                        d_buf = d_bufs[cid]
                        if new_row:  # else: this M-tile's values, stored by this consumer at an earlier tile
                            _ln_store_scales(rstd_buf, d_buf, s1, ss, K, eps)
                    else:
                        rstd_buf = rstd_bufs[cid]
                        d_buf = d_bufs[cid]
                        _ln_store_scales(rstd_buf, d_buf, s1, ss, K, eps)
                    if LN_EPILOGUE_MMA:
                        # acc += A_ext @ B_ext = -mean ⊗ colsum + (1/rstd) ⊗ beta_b: one m64 k16 wgmma, A from
                        # registers, B (the split colsum / beta_b tile) through this consumer's shared buffer,
                        # queued behind the last K-step wgmma (the same accumulator chain as the K loop)
                        dt: tl.constexpr = tlx.dtype_of(b_desc)
                        bext_buf = bext_bufs[cid]  # its previous reader, the last tile's epilogue wgmma, has retired
                        a_ext = _ln_a_ext(shift, tlx.local_load(d_buf), tlx.local_load(rstd_buf), dt)
                        tlx.local_store(bext_buf, _ln_b_ext(cs_t, bb_t, dt))
                        tlx.fence("async_shared")  # generic-proxy stores -> the wgmma's async-proxy reads
                        acc = tlx.async_dot(a_ext, bext_buf, acc)
                acc = tlx.async_dot_wait(0, acc)
                tlx.barrier_arrive(empty_bars[s_prev])  # k_tiles >= 1 always (K >= 8)

                if LAYERNORM:
                    if LN_EPILOGUE_MMA:
                        acc = acc * tlx.local_load(rstd_buf)[:, None]
                    else:
                        rstd_rows = tlx.local_load(rstd_buf)
                        rm_rows = rstd_rows * (shift + tlx.local_load(d_buf))
                        acc = _ln_epilogue(acc, rstd_rows, rm_rows, colsum_ptr, betab_ptr, off_n, N, BM_C, BLOCK_N)
                elif STATS_TASK:
                    acc = acc * tlx.local_load(rstd_buf)[:, None]
                elif FUSE_RMSNORM:
                    rstd_buf = rstd_bufs[cid]  # private to this consumer; with REUSE_RSTD it outlives the tile
                    if REUSE_RSTD:
                        if new_row:  # else: rstd of this M-tile, stored by this consumer at an earlier tile
                            tlx.local_store(rstd_buf, tl.math.rsqrt(ss / K + eps))
                    else:
                        tlx.local_store(rstd_buf, tl.math.rsqrt(ss / K + eps))
                    rstd_rows = tlx.local_load(rstd_buf)
                    acc = acc * rstd_rows[:, None]
                if STATS_TASK:
                    # the statistics of this tile have been read (into registers): the set may be rewritten
                    tlx.barrier_arrive(stats_empty[stat_set])
                    t_local += 1
                if off_cm < M:  # rows past M (the last row-tile) are clipped by TMA; wholly-OOB slices skip it
                    if EPILOGUE_SUBTILE:
                        acc3 = tl.permute(tl.reshape(acc, (BM_C, 2, BLOCK_N // 2)), (0, 2, 1))
                        acc_lo, acc_hi = tl.split(acc3)
                        c_desc.store([off_cm, off_n], acc_lo.to(tlx.dtype_of(c_desc)))
                        c_desc.store([off_cm, off_n + BLOCK_N // 2], acc_hi.to(tlx.dtype_of(c_desc)))
                    else:
                        c_desc.store([off_cm, off_n], acc.to(tlx.dtype_of(c_desc)))

        # ---------------------------------------------------------------- statistics warpgroup (STATS_WARPGROUP)
        if STATS_TASK and not PRODUCER_STATS:
            with tlx.async_task(num_warps=4, registers=STATS_REGS):
                num_pid_m = tl.cdiv(M, BLOCK_M)
                num_pid_n = tl.cdiv(N, BLOCK_N)
                num_tiles = num_pid_m * num_pid_n
                k_tiles = tl.cdiv(K, BLOCK_K)
                it = 0
                t_local = 0
                # same (tile, k) sequence as the producer and the consumers
                first_tile, last_tile, tile_step = _tile_range(num_tiles, REUSE_RSTD)
                for tile_id in range(first_tile, last_tile, tile_step):
                    pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M, REUSE_RSTD)
                    _stats_task_tile(a_bufs, full_bars, empty_bars, rstd_bufs, d_bufs if LAYERNORM else None,
                                     stats_full, stats_empty, a_ptr, pid_m * BLOCK_M, M, K, eps, it, k_tiles,
                                     t_local, BM_C, BLOCK_K, NUM_STAGES, NUM_CONSUMERS, LAYERNORM, EVEN_K)
                    it += k_tiles
                    t_local += 1


# ------------------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------------------
_NUM_SMS_CACHE: dict = {}


def _num_sms(device: torch.device) -> int:
    key = (device.type, device.index)
    if key not in _NUM_SMS_CACHE:
        _NUM_SMS_CACHE[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _NUM_SMS_CACHE[key]


def _validate(a, b, eps, fuse: bool, *, need_cuda: bool) -> tuple[int, int, int]:
    """Shared input checks of the public functions; returns (M, N, K). Raises TypeError/ValueError."""
    if fuse:
        eps = check_eps(eps)
    M, N, K = _spec.check_inputs(a, b, eps if fuse else None)  # the contract, 16-byte aligned a and b included
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"the TLX kernel supports bf16 and fp16 inputs, got {a.dtype} "
                        "(fp32 would need tf32 wgmma with K-major B)")
    if need_cuda and a.device.type != "cuda":
        raise ValueError(f"inputs must be CUDA tensors, got device {a.device}")
    return M, N, K


def _validate_ln(a, b, colsum, beta_b, eps, cfg: TilingConfig, *, need_cuda: bool) -> tuple[int, int, int]:
    """``_validate`` for the LayerNorm op, plus its fp32 ``[N]`` vectors and the config's shared memory with
    the extra rstd * mean buffers. Raises TypeError/ValueError."""
    _, N, _ = _spec.check_inputs(a, b, check_eps(eps))
    _spec.check_layernorm_vectors(colsum, beta_b, N, a.device)  # before the device check: a bad vector is named first
    M, N, K = _validate(a, b, eps, True, need_cuda=need_cuda)
    if cfg.smem_bytes(a.element_size(), layernorm=True) > SMEM_LIMIT_BYTES:
        raise ValueError(f"shared memory: estimated {cfg.smem_bytes(a.element_size(), layernorm=True)} B > "
                         f"{SMEM_LIMIT_BYTES} B for {LN_OP} (its d buffers add BLOCK_M * 4 B, and with "
                         f"LN_EPILOGUE_MMA the epilogue wgmma's B operands NUM_CONSUMERS * 16 * BLOCK_N elements)")
    return M, N, K


def _launch_args(a, b, c, eps, fuse: bool, cfg: TilingConfig, num_sms: int, ln_vectors=None):
    """Descriptors, grid and launch keywords. ``ln_vectors``: ``(colsum, beta_b)`` for the LayerNorm op (with
    ``fuse``), else None (the RMSNorm kernel and the GEMM keep their launch arguments)."""
    M, K = a.shape
    N = b.shape[1]
    bm_c = cfg.rows_per_consumer
    bn_store = cfg.BLOCK_N // 2 if cfg.EPILOGUE_SUBTILE else cfg.BLOCK_N
    a_desc = TensorDescriptor.from_tensor(a, [bm_c, cfg.BLOCK_K])
    b_desc = TensorDescriptor.from_tensor(b, [cfg.BLOCK_K, cfg.BLOCK_N])
    c_desc = TensorDescriptor.from_tensor(c, [bm_c, bn_store])
    num_tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    grid = (min(num_sms, num_tiles), ) if cfg.PERSISTENT else (num_tiles, )
    args = (a_desc, b_desc, c_desc, M, N, K, float(eps) if eps is not None else 1e-6)
    kwargs = dict(
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        BLOCK_K=cfg.BLOCK_K,
        GROUP_M=cfg.GROUP_M,
        NUM_STAGES=cfg.NUM_STAGES,
        NUM_CONSUMERS=cfg.NUM_CONSUMERS,
        CONSUMER_REGS=cfg.CONSUMER_REGS,
        EPILOGUE_SUBTILE=cfg.EPILOGUE_SUBTILE,
        REUSE_RSTD=cfg.REUSE_RSTD,
        FUSE_RMSNORM=fuse,
        num_warps=_PRODUCER_WARPS,  # the default (producer) task; consumers add 4 warps each
        num_stages=1,  # no compiler pipelining: the ring above is explicit
    )
    if ln_vectors is not None:
        colsum, beta_b = ln_vectors
        kwargs.update(a_ptr=a, colsum_ptr=colsum, betab_ptr=beta_b, LAYERNORM=True, EVEN_K=K % cfg.BLOCK_K == 0,
                      LN_EPILOGUE_MMA=cfg.LN_EPILOGUE_MMA)
    if fuse and cfg.STATS_WARPGROUP:  # (the GEMM of such a config is the plain one: no statistics task)
        kwargs.update(STATS_WARPGROUP=True, STATS_REGS=cfg.STATS_REGS)
    if fuse and cfg.STATS_IN_PRODUCER:  # (likewise: the GEMM's producer only loads)
        kwargs.update(STATS_IN_PRODUCER=True)
    if fuse and cfg.A_FROM_REGS:  # (the GEMM of such a config is the plain shared-memory-operand one)
        kwargs.update(A_FROM_REGS=True)
    return args, grid, kwargs


def _run(a, b, eps, fuse: bool, config, ln_vectors=None) -> torch.Tensor:
    cfg = TilingConfig.from_dict(config)
    if cfg.CLUSTER_SIZE > 1:  # the cluster form: kernels_tlx.multi_cta's kernel (TilingConfig.CLUSTER_SIZE)
        from kernels_tlx import multi_cta

        if fuse and cfg.FILL_IDLE_SMS:
            return _run_filled(a, b, eps, cfg, ln_vectors)
        if ln_vectors is not None:  # (validated there: the fp32 vectors, and shared memory by block_n)
            return multi_cta.lazy_layernorm_matmul(a, b, *ln_vectors, eps=eps, config=cfg.cluster_config())
        if fuse:
            return multi_cta.lazy_rmsnorm_matmul(a, b, eps=eps, config=cfg.cluster_config())
        return multi_cta.matmul_cluster(a, b, config=cfg.cluster_config())
    if ln_vectors is not None:
        M, N, K = _validate_ln(a, b, *ln_vectors, eps, cfg, need_cuda=True)
    else:
        M, N, K = _validate(a, b, eps, fuse, need_cuda=True)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    args, grid, kwargs = _launch_args(a, b, c, eps, fuse, cfg, _num_sms(a.device), ln_vectors)
    _lazy_prenorm_ws_kernel[grid](*args, **kwargs)
    return c


def fill_rows(M: int, busy_sms: int, idle_sms: int, rate_pct: int, block_m: int) -> int:
    """FILL_IDLE_SMS: the rows for the idle-SM filler, ``M * idle * rate_pct / (busy * 100 + idle * rate_pct)``
    rounded down to a multiple of ``block_m`` (0 without idle SMs)."""
    if idle_sms <= 0 or busy_sms <= 0:
        return 0
    share = idle_sms * rate_pct / (busy_sms * 100 + idle_sms * rate_pct)
    return int(M * share) // block_m * block_m


def _run_filled(a, b, eps, cfg: TilingConfig, ln_vectors):
    """FILL_IDLE_SMS (``TilingConfig``): the cluster kernel on the first rows, with ``griddepcontrol.
    launch_dependents`` at its start (``PDL_TRIGGER``), and the REUSE_RSTD one-CTA-per-tile kernel on the last
    ``fill_rows`` rows as its programmatic dependent grid (``launch_pdl``: it starts once every cluster CTA is
    resident, so it takes the SMs the clusters leave, and needs none of their output), on as many CTAs as SMs are
    idle; both write row blocks of one output. The filler's producer ends with ``griddepcontrol.wait``
    (``PDL_WAIT_END``), so the filler completes only after the cluster grid: the stream's next work sees the whole
    output. Same validation and errors as the cluster kernel alone."""
    from kernels_tlx import multi_cta as km

    mcfg = cfg.cluster_config()
    norm = "lazy_layer" if ln_vectors is not None else "lazy_rms"
    if ln_vectors is not None:  # (forward-only: checked by the public op; the vectors as multi_cta's op checks them)
        km._validate_lazy_ln(a, b, *ln_vectors, eps)
    # the whole op validated and prepared as without the option (errors as there; its y is the output); the
    # occupancy from its build
    (M, N, K), _, (y, _, _), args, kwargs = km._prepare(a, b, None, None, eps, norm, mcfg, need_cuda=True,
                                                        ln_vectors=ln_vectors)
    avail = km._pdl_primary_clusters(args, kwargs, mcfg.CLUSTER_SIZE, a.device)
    busy = avail * mcfg.CLUSTER_SIZE
    idle = _num_sms(a.device) - busy
    m_fill = fill_rows(M, busy, idle, cfg.FILL_RATE_PCT, cfg.BLOCK_M)
    m_c = M - m_fill
    if m_fill > 0:
        (m_c, _, _), _, _, args, kwargs = km._prepare(a[:m_c], b, None, None, eps, norm, mcfg, need_cuda=True,
                                                      ln_vectors=ln_vectors, out=y[:m_c])
        kwargs["PDL_TRIGGER"] = True
    with torch.cuda.device(a.device):
        km._multi_cta_norm_kernel[km._grid(mcfg, m_c, avail)](*args, **kwargs)
        if m_fill > 0:
            fill_cfg = SHIPPED_LN_CONFIGS["ln_reuse_rstd_subtile"] if ln_vectors is not None else \
                SHIPPED_CONFIGS["reuse_rstd"]
            f_args, f_grid, f_kwargs = _launch_args(a[m_c:], b, y[m_c:], eps, True, fill_cfg, idle, ln_vectors)
            _lazy_prenorm_ws_kernel[f_grid](*f_args, launch_pdl=True, PDL_WAIT_END=True, **f_kwargs)
    return y


def matmul(a: torch.Tensor, b: torch.Tensor, *, config=None) -> torch.Tensor:
    """``C = a @ b`` with the warp-specialized TLX kernel (the fused kernel with the norm compiled out).

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA.
        b: ``[K, N]`` same dtype and device, row-major contiguous. K and N multiples of 8 (16-byte TMA rows).
        config: ``TilingConfig``, a dict of overrides, or None for ``DEFAULT_CONFIG``.

    Returns:
        ``C [M, N]`` in ``a.dtype`` (fp32 accumulation).

    Raises:
        TypeError: non-tensors, mixed dtypes, or a dtype other than bf16/fp16.
        ValueError: wrong ranks, mismatched K, non-contiguous or misaligned inputs, non-CUDA tensors, or an
            invalid config.

    Sources: TLX Hopper GEMM tutorials, https://github.com/facebookexperimental/triton
    """
    check_forward_only("lazy_prenorm.matmul", a=a, b=b)
    return _run(a, b, None, False, config)


def lazy_rmsnorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, *, eps: float = 1e-6, config=None) -> torch.Tensor:
    """Lazy Pre-Norm: ``C = rsqrt(mean(a^2, -1) + eps)[:, None] * (a @ b_folded)`` in one kernel.

    Equals ``(rmsnorm(a) * gamma) @ b`` when ``b_folded = diag(gamma) @ b``
    (``normfuse.techniques.lazy_prenorm.fold_gamma``). The per-row sum of squares is accumulated in fp32 by the
    consumer warpgroups from the shared-memory A tiles while their wgmma runs; ``rstd`` scales the fp32
    accumulator in the epilogue, so the normalized activation never exists in memory.

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA (K multiple of 8).
        b_folded: ``[K, N]`` same dtype and device, row-major contiguous (N multiple of 8).
        eps: added to the mean square inside the rsqrt (finite, > 0). Default 1e-6 (Meta's TLX kernel;
            the blog's pseudocode uses 1e-5).
        config: ``TilingConfig``, a dict of overrides, or None for ``DEFAULT_CONFIG``.

    Returns:
        ``C [M, N]`` in ``a.dtype``.

    Raises:
        TypeError: non-tensors, mixed dtypes, or a dtype other than bf16/fp16.
        NotImplementedError: an input requires grad with grad mode on (forward only).
        ValueError: wrong ranks, mismatched K, non-contiguous or misaligned inputs, eps not a finite number > 0
            (None too), non-CUDA tensors; ``normfuse.tiling.ConfigError`` for an invalid config.

    Sources: PyTorch blog "Towards Free Normalization",
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    TLX, https://github.com/facebookexperimental/triton
    """
    check_forward_only("lazy_prenorm.lazy_rmsnorm_matmul", a=a, b_folded=b_folded)
    return _run(a, b_folded, eps, True, config)


def lazy_layernorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor, *,
                          eps: float = 1e-5, config=None) -> torch.Tensor:
    """Lazy Pre-Norm for LayerNorm: ``C = rstd ⊙ (a @ b_folded) - (rstd * mean) ⊗ colsum + beta_b`` in one kernel.

    Equals ``(LN(a) * gamma + beta) @ b`` when ``b_folded = diag(gamma) @ b``, ``colsum = b_folded.float().sum(0)``
    and ``beta_b = beta @ b`` in fp32 (``normfuse.techniques.lazy_prenorm.fold_gamma`` / ``layernorm_vectors``,
    computed once outside timing). The consumer warpgroups accumulate, from the shared-memory A tiles while their
    wgmma runs, the fp32 shifted sums ``S1 = sum (a - c)`` and ``S2 = sum (a - c)^2`` per row, ``c = a[:, 0]``
    (loaded from global memory at the start of each tile); the epilogue forms ``mean = c + S1/K``,
    ``rstd = rsqrt(max(S2/K - (S1/K)^2, 0) + eps)``, stages ``rstd`` and ``rstd * mean`` through the consumer's
    shared buffers (as the RMSNorm kernel does with rstd) and applies the rank-1 correction with the ``colsum`` /
    ``beta_b`` tiles. REUSE_RSTD configs compute the statistics once per M-tile run, as for RMSNorm.

    Numerics: within the flash-attention tolerance for rows whose |mean| is at most 100 standard deviations, the
    documented limit of the rank-1 form (``normfuse.techniques.lazy_prenorm``; at ~1000 std the epilogue's
    cancellation exceeds it in bf16).

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA (K multiple of 8).
        b_folded: ``[K, N]`` same dtype and device, row-major contiguous (N multiple of 8).
        colsum, beta_b: fp32 ``[N]``, contiguous, on the same device.
        eps: added to the variance inside the rsqrt (finite, > 0). Default 1e-5 (``torch.nn.LayerNorm``'s).
        config: ``TilingConfig``, a dict of overrides of ``TilingConfig``'s fields, or None (or ``{}``) for
            ``DEFAULT_LN_CONFIG``.

    Returns:
        ``C [M, N]`` in ``a.dtype``.

    Raises:
        TypeError: non-tensors, mixed dtypes, a dtype other than bf16/fp16, or non-fp32 ``colsum``/``beta_b``.
        ValueError: as ``lazy_rmsnorm_matmul``, plus a wrong shape, layout or device of ``colsum``/``beta_b``
            and a config whose shared memory with the two statistic buffers exceeds 227 KB.

    Sources: the PyTorch blog "Towards Free Normalization" (RMSNorm form; the LayerNorm extension is ours, docs
    techniques.md section 5),
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    shifted one-pass variance: Chan, Golub & LeVeque, "Algorithms for computing the sample variance" (1983);
    TLX, https://github.com/facebookexperimental/triton
    """
    check_forward_only("lazy_prenorm.lazy_layernorm_matmul", a=a, b_folded=b_folded, colsum=colsum, beta_b=beta_b)
    return _run(a, b_folded, eps, True, DEFAULT_LN_CONFIG if no_overrides(config) else config, (colsum, beta_b))


def _ptx_extras(ptx: str) -> dict:
    """Extra PTX facts: shared loads issued between a wgmma commit and the next wgmma wait (the sum of
    squares overlapping the MMA), wgmma commits directly followed by a predicated branch (REUSE_RSTD skipping
    the sum of squares), ``wait_group`` counts, setmaxnreg values, ``ldmatrix`` (layout conversions)."""
    in_flight = 0
    pending = False
    branch_after_commit = 0
    after_commit = False
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith("//") or s.startswith(".loc") or re.match(r"^\$L__tmp\d+:$", s):
            continue  # comments, debug line info and debug labels
        if after_commit and re.match(r"^@!?%p\d+ bra", s):
            branch_after_commit += 1
        after_commit = False
        if s.startswith("wgmma.commit_group"):
            pending = True
            after_commit = True
        elif s.startswith("wgmma.wait_group"):
            pending = False
        elif pending and s.startswith("ld.shared"):
            in_flight += 1
    return {
        "ld_shared_v4": len(re.findall(r"\bld\.shared\.v4\.", ptx)),
        "ld_shared_during_wgmma": in_flight,
        "branch_after_wgmma_commit": branch_after_commit,
        "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)),
        "wgmma_wait_0": len(re.findall(r"wgmma\.wait_group\.sync\.aligned 0;", ptx)),
        "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        "mbarrier_arrive_expect_tx": ptx.count("mbarrier.arrive.expect_tx"),
        # > 0 would mean a register-layout conversion through shared memory (e.g. of the fp32 accumulator)
        "ldmatrix": ptx.count("ldmatrix"),
    }


def _compile_ws(op: str, a: torch.Tensor, b: torch.Tensor, colsum=None, beta_b=None, *, eps: float,
                cfg: TilingConfig):
    """``compile_sm90``'s compile of the one-CTA-per-tile kernel (``cfg.CLUSTER_SIZE == 1``): inputs validated as
    there, never launched; returns ``(CompiledKernel, grid)`` (the compile-only tests read its PTX and ptxas
    statistics)."""
    if cfg.CLUSTER_SIZE > 1:
        raise ValueError("_compile_ws compiles the one-CTA-per-tile kernel; the cluster form is multi_cta's")
    fuse = op != "matmul"
    ln_vectors = None
    if op == LN_OP:
        if isinstance(b, torch.Tensor) and b.dim() == 2:
            n = b.shape[1]
            colsum = torch.empty(n, dtype=torch.float32, device=a.device) if colsum is None else colsum
            beta_b = torch.empty(n, dtype=torch.float32, device=a.device) if beta_b is None else beta_b
        ln_vectors = (colsum, beta_b)
        M, N, K = _validate_ln(a, b, colsum, beta_b, eps, cfg, need_cuda=False)
    else:
        M, N, K = _validate(a, b, eps, fuse, need_cuda=False)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    num_sms = _num_sms(a.device) if a.device.type == "cuda" else H200_NUM_SMS
    args, grid, kwargs = _launch_args(a, b, c, eps, fuse, cfg, num_sms, ln_vectors)
    return _lazy_prenorm_ws_kernel.warmup(*args, grid=grid, **kwargs), grid


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor | None = None,
                 beta_b: torch.Tensor | None = None, *, eps: float = 1e-6, config=None) -> dict:
    """Compile ``op`` for sm_90 without a GPU and summarize the result (never launches).

    The caller must already have run ``normfuse.compile_only.install(90)`` in this process (the fake driver is
    process-global). ``a [M, K]`` and ``b [K, N]`` are CPU tensors (only shapes, dtype and 16-byte alignment
    matter; they are never read); the output is allocated with ``torch.empty`` (untouched).

    Args:
        op: ``"matmul"``, ``"lazy_rmsnorm_matmul"`` or ``"lazy_layernorm_matmul"`` (``ALL_OPS``).
        a, b: CPU (or CUDA) bf16/fp16 tensors, validated like the real ops.
        colsum, beta_b: the LayerNorm op's fp32 ``[N]`` vectors; None allocates empty ones.
        eps: as in ``lazy_rmsnorm_matmul`` (ignored for ``matmul``).
        config: ``TilingConfig``, dict or None.

    Returns:
        ``normfuse.compile_only.summarize(compiled)`` (ptx_markers, shared_bytes, num_warps, smem_ok,
        cluster_dims) plus ``ptx_extra`` (see ``_ptx_extras``), ``grid``, ``config`` and
        ``smem_estimate``.

    Raises:
        ValueError: unknown ``op``, invalid inputs or config; TypeError: bad dtypes.
    """
    from normfuse.compile_only import summarize

    if op not in ALL_OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(ALL_OPS)}")
    cfg = TilingConfig.from_dict(config)
    if cfg.CLUSTER_SIZE > 1:  # the cluster form: its fused kernels are kernels_tlx.multi_cta's
        from kernels_tlx import multi_cta

        if op == "matmul":  # its GEMM: the same cluster schedule without the norm (multi_cta.matmul_cluster)
            return multi_cta.compile_sm90("matmul_cluster", a, b, config=cfg.cluster_config())
        if op == LN_OP:
            return multi_cta.compile_sm90(op, a, b, eps=eps, config=cfg.cluster_config(), colsum=colsum,
                                          beta_b=beta_b)
        return multi_cta.compile_sm90(op, a, b, eps=eps, config=cfg.cluster_config())
    compiled, grid = _compile_ws(op, a, b, colsum, beta_b, eps=eps, cfg=cfg)
    out = summarize(compiled)
    out["ptx_extra"] = _ptx_extras(compiled.asm["ptx"])
    out["grid"] = list(grid)
    out["config"] = cfg.to_dict()
    out["smem_estimate"] = cfg.smem_bytes(a.element_size(), layernorm=op == LN_OP)
    return out


# ------------------------------------------------------------------------------------------------------------
# GPU self-check: python -m kernels_tlx.lazy_prenorm [--quick] [--variant rmsnorm|layernorm|both] [--config NAME]
# ------------------------------------------------------------------------------------------------------------
_CHECK_SHAPES = [  # (M, N, K): a block-aligned shape first, then partial/empty tiles, then the blog shape
    (4096, 4096, 4096),  # REUSE_RSTD: chunks of 3-4 (BLOCK_N=256) or 7-8 tiles, most starting inside an M-tile
    (1000, 1000, 1000),  # partial M, N and K tiles
    (257, 520, 1000),  # last row-tile: consumer 0 partly in bounds, consumer 1's A box entirely out of bounds
    (1000, 264, 72),  # K = 1 full + 1 partial K step
    (129, 264, 8),  # K < BLOCK_K: a single, mostly zero-filled K step
    (1, 1000, 1000),  # M = 1 (specialized by Triton); consumer 1 entirely out of bounds
    # REUSE_RSTD with every tail: 140 M-tiles (the last one holds 1 row: consumer 1 wholly out of bounds) x 4 or
    # 8 N-tiles (the last one partial), K tail; the CTA owning the last M-tile walks all of its N-tiles on one
    # rstd, and other chunks start inside an M-tile (checked on CPU in tests/tlx)
    (17793, 1000, 1000),
    (262144, 1024, 1024),  # blog benchmark shape, persistent loop of 62 tiles per CTA
]
# the cluster form (CLUSTER_SIZE > 1) serves one N range per cluster size; these give c2 / c4 / c8 (BLOCK_N 256)
# partial last column slices, M = 1, partial M-tiles, K < BLOCK_K and K tails; _CHECK_SHAPES add N = 1000 for c4
# (c4 at N = 776: the last rank owns 8 columns, K < BLOCK_K; c8 at M = 1 with a K tail)
_CLUSTER_CHECK_SHAPES = [(1, 488, 1000), (129, 488, 8), (1000, 512, 72), (17793, 2024, 1000), (257, 2048, 520),
                         (1000, 1800, 8), (129, 776, 8), (1, 1800, 72), (129, 968, 8),
                         (257, 600, 520)]  # TILES_PER_CTA c2: rank 1 owns 88 columns, its second tile none
_BENCH_SHAPES = [(262144, 1024, 1024), (8192, 8192, 8192)]
# LayerNorm: mean-shifted inputs (the one-pass statistics and the epilogue's cancellation), (M, N, K, mean_shift);
# each config runs those it supports (the cluster form: c4 the N = 1000 / 1024 ones), the cluster form also
# _LN_CLUSTER_SHIFT_CASES (c2: N = 488, c8: N = 2024; K tails, a last M-tile of 1 row)
_LN_SHIFT_CASES = [(4096, 1024, 1024, 10.0), (1000, 1000, 1000, 100.0), (17793, 1000, 1000, 10.0)]
_LN_CLUSTER_SHIFT_CASES = [(1000, 488, 1000, 100.0), (17793, 488, 520, 10.0), (4096, 2024, 1000, 100.0),
                           (17793, 2024, 520, 10.0)]
_DEVICE = "cuda"  # the CPU dry-run test of _self_check swaps in "cpu" and fake kernels


def _served_shapes(cfg: TilingConfig, shapes: list, cluster_shapes: list) -> list:
    """The check cases (``(M, N, K, ...)`` tuples) of ``shapes`` that ``cfg`` serves; for the cluster form (one N
    range) ``cluster_shapes`` are appended. Used by the self-check and the GPU tests (tests/tlx)."""
    return [c for c in shapes + (cluster_shapes if cfg.CLUSTER_SIZE > 1 else []) if cfg.supports(c[1])]
_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def _self_check(argv=None) -> int:
    """Check every shipped config (both ops; ``SHIPPED_CONFIGS`` for RMSNorm, ``SHIPPED_LN_CONFIGS`` for LayerNorm)
    against the fp32 reference at ``_CHECK_SHAPES`` (LayerNorm also at the mean-shifted ``_LN_SHIFT_CASES``), then
    time them.

    A hung launch (barrier deadlock) aborts the process after ``--hang-timeout`` seconds with a traceback
    (faulthandler), so the last ``[run ]`` line names the culprit. Output buffers are NaN-poisoned first, so a
    kernel that skips a tile cannot pass on a stale result of the previous launch.
    """
    import argparse
    import faulthandler
    import sys
    import time

    all_names = sorted(SHIPPED_CONFIGS) + sorted(SHIPPED_LN_CONFIGS)
    p = argparse.ArgumentParser(description="GPU correctness + speed check of the TLX Lazy Pre-Norm kernels")
    p.add_argument("--config", action="append", choices=all_names,
                   help="config(s) to check, repeatable (default: all shipped of the variant(s), 'default' first)")
    p.add_argument("--variant", choices=("rmsnorm", "layernorm", "both"), default="both",
                   help="which fused op: lazy_rmsnorm_matmul, lazy_layernorm_matmul or both (default)")
    p.add_argument("--quick", action="store_true", help="skip the 262144x1024x1024 check and all timing")
    p.add_argument("--no-bench", action="store_true", help="correctness only")
    p.add_argument("--hang-timeout", type=float, default=90.0,
                   help="seconds before a hung launch aborts the process with a traceback")
    p.add_argument("--eps", type=float, default=None, help="default: 1e-6 (RMSNorm), 1e-5 (LayerNorm)")
    args = p.parse_args(argv)
    variants = ("rmsnorm", "layernorm") if args.variant == "both" else (args.variant,)
    shipped = {"rmsnorm": SHIPPED_CONFIGS, "layernorm": SHIPPED_LN_CONFIGS}
    runs = []  # (variant, config name) in order
    for v in variants:
        names = [n for n in (args.config or shipped[v]) if n in shipped[v]]
        runs += [(v, n) for n in names]
    if not runs:
        p.error(f"no config of {args.variant} selected (RMSNorm: {sorted(SHIPPED_CONFIGS)}, "
                f"LayerNorm: {sorted(SHIPPED_LN_CONFIGS)})")
    shapes = [s for s in _CHECK_SHAPES if not (args.quick and s[0] >= 262144)]
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

    cache: dict = {}

    def case(variant, M, N, K, shift=0.0):
        eps = args.eps if args.eps is not None else _EPS[variant]
        key = (variant, M, N, K, shift)
        if key not in cache:
            inp = _spec.make_inputs(M, N, K, dtype="bf16", device=_DEVICE, seed=0, variant=variant, mean_shift=shift)
            ref_m, same_m = _spec.references("gemm", inp, eps)  # fp32 a @ b_folded, and torch's bf16 result
            ref_f, same_f = _spec.references("fused", inp, eps, variant)
            cache[key] = (inp, ref_m, _spec.tolerance(ref_m, same_m), ref_f, _spec.tolerance(ref_f, same_f), eps)
        return cache[key]

    def fused_call(variant, inp, eps, cfg):
        a, bf = inp["a"], inp["b_folded"]
        if variant == "layernorm":
            return lambda: lazy_layernorm_matmul(a, bf, inp["colsum"], inp["beta_b"], eps=eps, config=cfg)
        return lambda: lazy_rmsnorm_matmul(a, bf, eps=eps, config=cfg)

    failures = []
    for variant, name in runs:
        cfg = shipped[variant][name]
        fused_op = "lazy_layernorm_matmul" if variant == "layernorm" else "lazy_rmsnorm_matmul"
        cases = [(M, N, K, 0.0) for (M, N, K) in _served_shapes(cfg, shapes, _CLUSTER_CHECK_SHAPES)]
        if variant == "layernorm":
            cases += _served_shapes(cfg, _LN_SHIFT_CASES, _LN_CLUSTER_SHIFT_CASES)
        for (M, N, K, shift) in cases:
            inp, ref_m, tol_m, ref_f, tol_f, eps = case(variant, M, N, K, shift)
            a, bf = inp["a"], inp["b_folded"]
            ops = [(fused_op, fused_call(variant, inp, eps, cfg), ref_f, tol_f)]
            if variant == "rmsnorm" or shift == 0.0:  # the GEMM does not depend on the variant or the shift
                ops.insert(0, ("matmul", lambda: matmul(a, bf, config=cfg), ref_m, tol_m))
            for op, fn, ref, tol in ops:
                torch.full((M, N), float("nan"), dtype=a.dtype, device=_DEVICE)  # poison the allocator's block
                label = f"M={M} N={N} K={K}" + (f" shift={shift:g}" if shift else "")
                print(f"[run ] {name:23s} {op:22s} {label} ...", end=" ", flush=True)
                t0 = time.perf_counter()
                out = guarded(fn)
                res = _spec.compare(out, ref, tol)
                del out
                if not res["ok"]:
                    failures.append(f"{name} {op} {M}x{N}x{K}" + (f" shift={shift:g}" if shift else ""))
                print(f"{'ok  ' if res['ok'] else 'FAIL'} max_abs={res['max_abs_err']:.3e} tol={tol:.3e} "
                      f"rel={res['rel_err']:.2e} ({time.perf_counter() - t0:.1f}s)", flush=True)
    cache.clear()
    torch.cuda.empty_cache()

    if not (args.quick or args.no_bench):
        from triton.testing import do_bench

        for (M, N, K) in _BENCH_SHAPES:
            for variant in variants:
                names = [n for v, n in runs if v == variant]
                if not names:
                    continue
                eps = args.eps if args.eps is not None else _EPS[variant]
                inp = _spec.make_inputs(M, N, K, dtype="bf16", device=_DEVICE, seed=0, variant=variant)
                a, bf = inp["a"], inp["b_folded"]
                flop = 2.0 * M * N * K
                print(f"--- timing {variant} M={M} N={N} K={K} bf16 (do_bench median, L2 flushed; "
                      f"TFLOP/s = 2MNK/t) ---", flush=True)

                def bench(label, fn, norm_only=False):
                    guarded(fn)
                    ms = guarded(lambda: do_bench(fn, return_mode="median"))
                    rate = (f"{2 * M * K * a.element_size() / ms / 1e6:7.1f} GB/s (read A + write A)" if norm_only
                            else f"{flop / ms / 1e9:7.1f} TFLOP/s")
                    print(f"{label:40s} {ms * 1e3:9.1f} us  {rate}", flush=True)
                    return ms

                bench("cublas a@b", lambda: a @ bf)
                if variant == "layernorm":
                    t_norm = bench("torch eager layernorm (no GEMM)",
                                   lambda: torch.nn.functional.layer_norm(a, (K,), None, None, eps), norm_only=True)
                else:
                    t_norm = bench("torch eager rmsnorm (no GEMM)", lambda: _spec.rmsnorm(a, eps), norm_only=True)
                for name in names:
                    cfg = shipped[variant][name]
                    if not cfg.supports(N):  # the cluster form serves one N range (TilingConfig.CLUSTER_SIZE)
                        print(f"{'':40s} [{name}] does not serve N={N}: not timed", flush=True)
                        continue
                    t_g = bench(f"tlx matmul [{name}]", lambda: matmul(a, bf, config=cfg))
                    t_f = bench(f"tlx fused  [{name}]", fused_call(variant, inp, eps, cfg))
                    print(f"{'':40s} fused - gemm = {(t_f - t_g) * 1e3:.1f} us "
                          f"({100 * (t_f - t_g) / t_g:+.1f}% of the GEMM; "
                          f"{100 * (1 - (t_f - t_g) / t_norm):.0f}% of the eager norm's time hidden)", flush=True)
                del inp, a, bf
                torch.cuda.empty_cache()

    print("ALL OK" if not failures else f"{len(failures)} FAILURE(S): " + "; ".join(failures), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(_self_check())
