r"""FlashNormAttention, LLM variant, in TLX (fbtriton 3.7.4) for the H200 (sm_90a): per-head RMSNorm of Q and K
(learned γ, Qwen3 / OLMo2 style) fused into a warp-specialized FlashAttention-2 forward (TMA + mbarriers + wgmma,
online softmax in fp32, causal or not, GQA), with an optional per-head RMSNorm of the output. Math and cost model:
``normfuse/techniques/fna_llm.py``.

Kernel (``_fna_llm_ws_kernel``; one CTA per (Q tile of ``BLOCK_M`` rows, batch x query head); one launch per
``kernels_triton.fna_llm.batch_slices`` slice of at most 65535 (batch, head) pairs), after the
Hopper FA tutorials shipped with fbtriton (``tlx/tutorials/hopper_fa_ws*.py``):

* **Producer** (``"default"`` task, 4 warps): builds per-(batch, head) device-side TMA descriptors ``[S, D]`` (rows
  past S read as zeros, so no other sequence is ever touched), loads the two Q halves (``BLOCK_M / 2`` rows each)
  once, then streams K and V tiles ``[BLOCK_N, D]`` through a ring of ``NUM_BUFFERS`` shared-memory buffers
  (``k_fulls`` / ``k_empties``, ``v_fulls`` / ``v_empties`` mbarriers). Causal: only the KV tiles up to the Q
  tile's diagonal are loaded.
* **Consumers** (2 replicated warpgroups, ``setmaxnreg`` 232 registers, 64 query rows each):
  - Q is normalized once: the warpgroup reads its Q half from shared memory, computes
    ``q' = q * rsqrt(mean(q²) + eps) * q_weight * k_weight`` in fp32 (the K weight is folded into Q:
    ``q_n · k_n = Σ_d (q_n,d γk_d) k_d · rstd_k``; ``K_NORM = "materialize"``: ``q_weight`` only), rounds it and
    keeps it in registers as the wgmma A operand (``PIPELINE``: in shared memory, see below);
  - per KV tile: issue ``S = q' @ kᵀ`` on the *raw* K tile (wgmma, B straight from the TMA-loaded shared-memory
    buffer), get the K rows' ``rstd_k = rsqrt(mean(k²) + eps)`` (see ``K_NORM`` below), then ``S *= rstd_k ·
    log2(e)/sqrt(D)`` (a column scale), causal / sequence-end mask only on the tiles that need it, online softmax,
    ``acc += p @ v`` (wgmma, A from registers); ``K_NORM = "materialize"``: the K tiles are already normalized,
    so ``S *= log2(e)/sqrt(D)`` exactly as in the plain ``attention``;
  - ``PINGPONG``: the two warpgroups take turns issuing their QKᵀ wgmma (named barriers 9 / 10, as the
    ping-pong tutorial), so one group's softmax overlaps the other's tensor-core work;
  - ``PIPELINE`` (FlashAttention-3's intra-warpgroup overlap, after ``hopper_fa_ws_pipelined_pingpong.py``): the
    first tile's QKᵀ is peeled; step j issues the QKᵀ wgmma of tile j, then the PV wgmma of tile j-1 (P kept in
    the input dtype, 32 registers per thread), waits for the QKᵀ only (``async_dot_wait(1)``) and runs the softmax
    of tile j while the PV still runs, then waits for it and rescales ``acc``; the PV of the last tile follows the
    loop. The QKᵀ A operand is read from shared memory (SS wgmma; the fused op first writes its normalized Q over
    the raw tile, behind a proxy fence and warpgroup barriers ``Q_READY_BARRIER + cid``), which frees Q's 32
    registers per thread for the second tile in flight (no spills in the loop at 232 registers); the softmax folds
    the scale into one FMA (``exp2(s · scale - m)``; m kept in the scaled log2 domain), so its rounding differs
    from the non-pipelined loop's by an ulp. ``PINGPONG_PV`` (with ``PIPELINE`` and ``PINGPONG``): the ordered region
    covers both GEMM issues of a step (FA3's order: one warpgroup's QKᵀ + PV back to back while the other runs
    its softmax), not only the QKᵀ (the tutorial's). ``K_NORM = "inloop"`` is not pipelined (ValueError);
  - ``WARP_ARRIVE``: the K / V ``empty`` barriers count every consumer thread (``alloc_warp_barrier``), so a
    release is a per-thread arrive after the thread's own wgmma wait, without the warpgroup ``bar.sync`` that the
    elected-thread arrive needs;
  - ``LAZY_Q`` (with ``PIPELINE`` and ``K_NORM = "materialize"``): Lazy Pre-Norm on the rows of QKᵀ,
    ``rmsnorm(q)·γq · k_nᵀ = rstd_q ⊙ (q · (γq ⊙ k_n)ᵀ)``: the wgmma reads the raw, TMA-loaded Q tile (no
    normalize-and-store, no proxy fence, no ``Q_READY_BARRIER``), the K pre-pass folds γq into k_n, and each
    warpgroup reads its Q tile once more from shared memory (``Q_ROWS_LAYOUT``: the row sums land in the wgmma
    accumulator's row layout) for ``rstd_q · log2(e)/sqrt(D)``, the per-row scale of the softmax's FMA (one FMA per
    score, as before). Where it is computed matters with ``PINGPONG``: computed while the tile's first QKᵀ runs,
    the ping-pong kernels lost 13-32 % against normalize-and-store at S >= 4096 (persistent: non-causal only) —
    read as a shift of the two warpgroups' phase, not profiled —; computed before the first QKᵀ, the persistent
    ping-pong form is the fastest fused kernel in 10 of the 20 fna_llm cells; so ``LAZY_Q_EARLY = PINGPONG``
    (``tools/fna_llm_lazyq_probe.py``, results/fna_llm_lazyq/). ``RSTD_Q_PRODUCER`` (persistent only) moves the
    sums of squares to the producer warpgroup, which writes rstd_q to shared memory once the Q tile has landed
    (``RSTD_ROWS_LAYOUT`` reads it back in the accumulator's row layout): the consumers' tile prologue was most of
    the fused kernel's extra time over its own attention (``tools/fna_llm_breakdown_probe.py --ablations``);
  - epilogue: ``acc / l``, optional output RMSNorm, masked pointer store.
* **Order** (``LPT``, causal only): the CTA index is remapped so that the heaviest Q tiles (the last ones, with
  the longest KV prefix) of every (batch, head) of the launch are dispatched first (longest-processing-time first,
  for the tail of the grid); non-causal launches keep the natural order (Q tiles of one head next to each other,
  sharing K/V in L2).
* **Persistent grid** (``PERSISTENT``): one launch of min(#SMs, work tiles) CTAs for any B·Hq (no batch slices);
  CTA p walks the work tiles (Q tile, batch x head) p, p + G, p + 2G, ... of one static order (causal: heaviest
  first, the ``LPT`` order, always; non-causal: the Q tiles of one head next to each other). The producer builds
  three descriptors over the whole tensors once (``[B·Hq or B·Hkv, S, D]``, block ``[1, rows, D]``: TMA clips
  each dimension, so rows past S read as zeros and never the next head's; no descriptor is rebuilt while loads
  through it are in flight) and loads each tile's Q into one of two Q buffers (``q_fulls`` / ``q_empties`` per
  buffer and warpgroup, phases from the CTA's tile counter), so the next tile's Q and its first K/V tiles land
  while the consumers still run this tile's last steps and epilogue; the K/V ring's counters run on across tiles,
  and the ping-pong turn too (bootstrapped once). A consumer warpgroup releases its Q buffer once its last QKᵀ is
  done; the output store stays the masked pointer store. Shared memory: two Q buffers + the ring (192 KiB at
  D = 128, BLOCK_N = 128, NUM_BUFFERS = 2; ValueError when it exceeds 227 KiB). K_NORM = "inloop" not supported.

The K norm (``TilingConfig.K_NORM``; the math ``<rmsnorm(q_i)·γq, rmsnorm(k_j)·γk> = rstd_q,i · rstd_k,j ·
Σ_d (q_i,d γq_d γk_d) k_j,d`` is the same for the first two):

The pre-pass kernels are plain Triton row kernels (no TLX extension needed), shared with the Triton implementation:
``kernels_triton.fna_llm.k_prepass`` builds their launch.

* ``"prepass"`` (default): a pre-pass kernel (``_k_rstd_kernel``, inside the public ``qknorm_attention`` call;
  ``RSTD_BLOCK_ROWS`` K rows per program) reads K once and writes
  ``rstd_k`` in fp32, ``[B, Hkv, S]`` (4 bytes per key, not a normalized copy of K); each consumer loads the
  tile's ``[BLOCK_N]`` rstd_k vector with a masked pointer load issued at the top of the iteration, before the
  K-full / ping-pong waits, so its (L2) latency hides behind them and the QKᵀ wgmma (``PIPELINE``: issued after
  the two GEMMs of the step, so that it holds no registers across their issue). The consumers never read the
  K tile into registers (the wgmma reads it from shared memory);
* ``"inloop"`` (the previous code path): while the QKᵀ wgmma runs, each consumer warpgroup computes rstd_k from
  the K tile in shared memory in 32-column slices (``local_load``, fp32 sum of squares): once per K/V tile load
  per warpgroup, repeated by both warpgroups and by every Q tile, and competing with the wgmma for shared-memory
  bandwidth;
* ``"materialize"``: a pre-pass kernel (``_k_norm_kernel``, also inside the ``qknorm_attention`` call,
  ``RSTD_BLOCK_ROWS`` K rows per program, fp32 statistics; ``GRID_PREPASS``: the same rows written by the persistent
  attention kernel itself before a grid barrier) writes the normalized copy ``k_n = (k · rstd_k ·
  k_weight).to(k.dtype)``, ``[B, Hkv, S, D]`` (a scratch tensor), and the attention kernel streams ``k_n`` through
  TMA exactly like the plain ``attention``: no K work at all in the KV loop (no rstd load, no column scale), only
  the Q tile is normalized (``q_weight`` only). Cost: one extra write and read of K, ``2·B·Hkv·S·D·2`` bytes
  (bf16/fp16) — what an inference engine does anyway when it writes the normalized K into its KV cache (there
  the pre-pass is the KV-cache write, paid once per token, not per attention call).

``attention`` (no norms) ignores ``K_NORM``. Rounding differs slightly from the unfused path (prepass / inloop: K
is never rounded after normalization and Q carries γk; materialize rounds k_n to the input dtype like the unfused
path), within the flash-attention tolerance.

What TLX could express: all three forms; the prepass form keeps the FA3-style pipeline of the plain attention (TMA
→ shared memory → wgmma) and adds one ``[BLOCK_N]`` fp32 load and a column scale per tile; the materialize form's
KV loop is the plain attention's. What it could not (or
this module does not): a normalized K tile shared by the CTAs of one launch (hence the pre-pass, one extra read
of K: ~0.1-1% of the attention time at the benchmark shapes); ``BLOCK_N = 176`` (FA3's
non-causal hdim-128 tile: Triton tensors are powers of two); a TMA load of the rstd_k vector by the producer (a
1-D descriptor needs 16-byte aligned row strides, i.e. S padded to a multiple of 4).
fp16/bf16 only (wgmma); nothing TLX runs on the CPU, so the CPU check is the sm_90a compile (wgmma, TMA, mbarrier,
setmaxnreg).

Sources: FlashAttention-2 (https://arxiv.org/abs/2307.08691), FlashAttention-3 ping-pong scheduling
(https://arxiv.org/abs/2407.08608); fbtriton TLX Hopper FA tutorials; the PyTorch blog "Towards Free
Normalization: Fusing Normalization into GEMM and Attention Kernels" (FlashNormAttention; and its Lazy Pre-Norm,
the per-row rstd factored out of a GEMM and applied to its output, applied here to the columns of QKᵀ),
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
FlashNorm (deferred RMS normalization, γ folded into the other operand), https://arxiv.org/abs/2407.09577 .
Code written for this repo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import gdc_wait

from kernels_triton.fna_llm import (RSTD_BLOCK_ROWS, _k_norm_kernel, _k_norm_rows, _k_rstd_kernel,  # noqa: F401
                                    batch_slices, k_prepass, plan_launches)
from normfuse.scratch import scratch_like
from normfuse.techniques.fna_llm import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import aligned, check_eps, check_forward_only

NUM_MMA_GROUPS = 2  # consumer warpgroups, 64 query rows each
CONSUMER_REGS = 232
# named barriers: 9 / 10 the ping-pong pair; Q_READY_BARRIER + cid (PIPELINE with norms) one consumer warpgroup's
# "normalized Q stored" barrier (the compiler takes 0-3 for its own CTA / partition barriers)
Q_READY_BARRIER = tl.constexpr(11)
K_READY_BARRIER = tl.constexpr(13)  # K_NORM_ / K_RSTD_PRODUCER: the producer warpgroup's 128 threads, after stores
GRID_PREPASS_ROWS = tl.constexpr(RSTD_BLOCK_ROWS)  # GRID_PREPASS: K rows per block, as the pre-pass kernel
K_NORM_MODES = ("prepass", "inloop", "materialize")
# LAZY_Q: register layout of a [64, 32] slice of one warpgroup's Q tile (flat offset row·32 + col) in which every
# thread holds the rows it holds in the m64 wgmma accumulator (warp w: rows 16w..16w+15; lane l: rows l//4 and
# l//4 + 8, column pairs 2·(l%4) + 8j), so the row sums of squares land in the accumulator's row layout without a
# shared-memory round trip (otherwise the compiler moves the whole softmax to the load's layout)
Q_ROWS_LAYOUT = tl.constexpr(tlx.layout(shape=((4, 8, 4), (2, 2, 4)), stride=((2, 32, 512), (1, 256, 8))))
# RSTD_Q_PRODUCER: rstd_q stored as a [64, 8] block (each row's value in all eight columns) and read in the m64
# accumulator's own layout restricted to 8 columns (Q_ROWS_LAYOUT's pattern); the max over a row is the value, in
# the accumulator's row layout. Loaded as 1-D, [64, 1] or [64, 4] (a layout that is not the accumulator's), the
# compiler moved the whole softmax to the loaded layout (seen in the TTGIR of a CPU compile)
RSTD_Q_COLS = tl.constexpr(8)  # the block's columns: the layout's column bits (2 per lane quad x 4 quads) span 8
RSTD_ROWS_LAYOUT = tl.constexpr(tlx.layout(shape=((4, 8, 4), (2, 2)), stride=((2, 8, 128), (1, 64))))
RSTD_Q_CHUNK = tl.constexpr(16)  # columns per shared-memory read of the producer's sums (40 registers per thread)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """``BLOCK_M`` (128: two consumer warpgroups of 64 rows), ``BLOCK_N`` (64 or 128 keys per step),
    ``NUM_BUFFERS`` (K/V ring depth, 2-4), ``PINGPONG`` (ordered QKᵀ issue between the two warpgroups),
    ``K_NORM`` (``"prepass"``: a pre-pass kernel computes ``rstd_k`` and the consumers load it as a ``[BLOCK_N]``
    vector; ``"inloop"``: the consumers compute ``rstd_k`` from the K tile in shared memory; ``"materialize"``: a
    pre-pass kernel writes the normalized K copy ``k_n`` and the KV loop is the plain attention's; ignored by
    ``attention``), the FlashAttention-3 options (module docstring; all off by default): ``PIPELINE``
    (intra-warpgroup overlap of the softmax with the next QKᵀ and the previous PV; not with ``"inloop"``),
    ``PINGPONG_PV`` (needs ``PIPELINE`` and ``PINGPONG``: the ordered region covers the PV issue too), ``LPT``
    (causal: heaviest Q tiles dispatched first), ``WARP_ARRIVE`` (per-thread K/V buffer releases),
    ``PERSISTENT`` (a grid of min(#SMs, work tiles) CTAs, each walking a static list of (Q tile, batch x head)
    work tiles with the next tile's Q prefetched into a second Q buffer; causal: heaviest first, so ``LPT`` is
    implied; K_NORM prepass or materialize), ``LAZY_Q`` (with ``PIPELINE`` and ``K_NORM = "materialize"``: Q's
    rstd applied to the rows of S, γq folded into k_n, instead of normalizing the Q tile in shared memory; computed
    before the tile's first QKᵀ with ``PINGPONG``, while it runs without; ``attention`` ignores it),
    ``RSTD_Q_PRODUCER`` (with ``LAZY_Q`` and ``PERSISTENT``: the producer warpgroup, idle between its TMA issues,
    computes each Q tile's rstd_q once the tile has landed and hands it to the consumers through shared memory, so
    their tile prologue is one 64-value read instead of the sums of squares), ``PDL``
    (``K_NORM = "materialize"``: the fused op launches the attention kernel as a programmatic dependent of the K
    pre-pass, which triggers it at once; the producer waits for the pre-pass before its first K load),
    ``K_NORM_PRODUCER`` (with ``RSTD_Q_PRODUCER``, not ``PDL``: no pre-pass kernel; the producer warpgroup scales
    each landed K tile by its rows' rstd_k in shared memory (``(k · rstd_k)`` in K's dtype) before it releases the
    tile to the consumers, and folds γq·γk into each Q tile after taking its rstd_q; the consumers' KV loop stays
    the materialize form's, and one pass over K per launch becomes shared-memory work for every (Q tile, K tile)
    pair), ``K_RSTD_PRODUCER`` (with ``RSTD_Q_PRODUCER``, not ``PDL`` or ``K_NORM_PRODUCER``: no pre-pass kernel
    either; the consumers' QKᵀ reads the raw K tile as soon as it lands, the producer computes the tile's rstd_k
    meanwhile and hands it over through a per-CTA global scratch vector, and the softmax scales S's columns by it,
    one multiply per score; the producer normalizes each Q tile in place, q·rstd_q·γq·γk, so LAZY_Q's row scale is
    off). Both keep ``K_NORM = "materialize"`` and ``LAZY_Q`` only because ``RSTD_Q_PRODUCER`` needs them: no K
    pre-pass runs. Negative results (docs/results/fna.md), GPU-tested only at BLOCK_N = 128, NUM_BUFFERS = 2.
    ``GRID_PREPASS`` (with ``PERSISTENT`` and ``K_NORM = "materialize"``, not ``PDL`` / ``K_NORM_PRODUCER`` /
    ``K_RSTD_PRODUCER``): the materialize pre-pass runs inside the attention kernel, a cooperative launch: before
    the warp-specialized region the producer warpgroup of every CTA writes its share of k_n (``RSTD_BLOCK_ROWS``-row
    blocks p, p + G, ...; the pre-pass kernel's own arithmetic, so k_n is bitwise the same), the CTAs meet at a grid
    barrier (``_grid_barrier``), then attend: one launch instead of two, no launch gap or tail between them.
    Neutral to negative (0.975-1.025x the two-kernel op's time, > 1 slower; docs/results/fna.md). Launches on one
    device must not overlap in time (the barrier's state is one buffer per device, ``_grid_sync_state``).
    Raises ValueError naming the violated constraint."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    NUM_BUFFERS: int = 2
    PINGPONG: bool = True
    K_NORM: str = "prepass"
    PIPELINE: bool = False
    PINGPONG_PV: bool = False
    LPT: bool = False
    WARP_ARRIVE: bool = False
    PERSISTENT: bool = False
    LAZY_Q: bool = False
    RSTD_Q_PRODUCER: bool = False
    PDL: bool = False
    K_NORM_PRODUCER: bool = False
    K_RSTD_PRODUCER: bool = False
    GRID_PREPASS: bool = False

    def __post_init__(self):
        if self.BLOCK_M != 128:
            raise ValueError(f"BLOCK_M must be 128 (two consumer warpgroups of 64 rows), got {self.BLOCK_M!r}")
        if self.BLOCK_N not in (64, 128):
            raise ValueError(f"BLOCK_N must be 64 or 128, got {self.BLOCK_N!r}")
        if self.NUM_BUFFERS not in (2, 3, 4):
            raise ValueError(f"NUM_BUFFERS must be 2, 3 or 4, got {self.NUM_BUFFERS!r}")
        if not isinstance(self.PINGPONG, bool):
            raise ValueError(f"PINGPONG must be a bool, got {self.PINGPONG!r}")
        if self.K_NORM not in K_NORM_MODES:
            raise ValueError(f"K_NORM must be one of {', '.join(K_NORM_MODES)}, got {self.K_NORM!r}")
        for name in ("PIPELINE", "PINGPONG_PV", "LPT", "WARP_ARRIVE", "PERSISTENT", "LAZY_Q", "RSTD_Q_PRODUCER",
                     "PDL", "K_NORM_PRODUCER", "K_RSTD_PRODUCER", "GRID_PREPASS"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.PINGPONG_PV and not (self.PIPELINE and self.PINGPONG):
            raise ValueError("PINGPONG_PV needs PIPELINE and PINGPONG (it widens the ping-pong region of the "
                             "pipelined loop to the PV issue)")
        if self.PIPELINE and self.K_NORM == "inloop":
            raise ValueError("PIPELINE supports K_NORM prepass or materialize, not inloop (the in-loop K norm stays "
                             "on the non-pipelined path)")
        if self.PERSISTENT and self.K_NORM == "inloop":
            raise ValueError("PERSISTENT supports K_NORM prepass or materialize, not inloop (the in-loop K norm stays "
                             "on the one-tile-per-CTA grid)")
        if self.PDL and self.K_NORM != "materialize":
            raise ValueError("PDL needs K_NORM materialize (only the producer's K loads read the pre-pass's output "
                             "and wait for it; prepass's rstd_k is read by the consumers)")
        if self.LAZY_Q and not (self.PIPELINE and self.K_NORM == "materialize"):
            raise ValueError("LAZY_Q needs PIPELINE and K_NORM materialize (γq is folded into the materialized k_n; "
                             "the row scale lives in the pipelined loop's softmax)")
        if self.RSTD_Q_PRODUCER and not (self.LAZY_Q and self.PERSISTENT):
            raise ValueError("RSTD_Q_PRODUCER needs LAZY_Q and PERSISTENT (the producer computes the next tile's "
                             "rstd_q while the consumers finish this one; one tile per CTA would delay its K loads)")
        if self.K_NORM_PRODUCER and not self.RSTD_Q_PRODUCER:
            raise ValueError("K_NORM_PRODUCER needs RSTD_Q_PRODUCER (the producer computes rstd_q from the raw Q tile "
                             "before it folds γq·γk into it), which needs LAZY_Q, PERSISTENT, PIPELINE and K_NORM "
                             "materialize")
        if self.K_NORM_PRODUCER and self.PDL:
            raise ValueError("K_NORM_PRODUCER excludes PDL (there is no K pre-pass to wait for)")
        if self.K_RSTD_PRODUCER and not self.RSTD_Q_PRODUCER:
            raise ValueError("K_RSTD_PRODUCER needs RSTD_Q_PRODUCER (the producer's Q tile work, here normalizing it "
                             "in place), which needs LAZY_Q, PERSISTENT, PIPELINE and K_NORM materialize")
        if self.K_RSTD_PRODUCER and self.PDL:
            raise ValueError("K_RSTD_PRODUCER excludes PDL (there is no K pre-pass to wait for)")
        if self.K_RSTD_PRODUCER and self.K_NORM_PRODUCER:
            raise ValueError("K_RSTD_PRODUCER excludes K_NORM_PRODUCER (K stays raw; the softmax scales S's columns)")
        if self.GRID_PREPASS and not (self.PERSISTENT and self.K_NORM == "materialize"):
            raise ValueError("GRID_PREPASS needs PERSISTENT and K_NORM materialize (the persistent grid's CTAs write "
                             "k_n themselves and meet at a grid barrier, so all of them must be resident at once)")
        if self.GRID_PREPASS and (self.PDL or self.K_NORM_PRODUCER or self.K_RSTD_PRODUCER):
            raise ValueError("GRID_PREPASS excludes PDL, K_NORM_PRODUCER and K_RSTD_PRODUCER (there is no pre-pass "
                             "kernel to wait for, and K is normalized once, before the attention)")


@triton.jit
def _turn_wait(cid: tl.constexpr):
    """PINGPONG: wait until it is consumer warpgroup ``cid``'s turn to issue its wgmma (named barrier 9 for group 0,
    10 for group 1; 256 threads: both groups take part in each)."""
    if cid == 0:
        tlx.named_barrier_wait(9, 256)
    else:
        tlx.named_barrier_wait(10, 256)


@triton.jit
def _turn_pass(cid: tl.constexpr):
    """PINGPONG: hand the turn to the other consumer warpgroup."""
    if cid == 0:
        tlx.named_barrier_arrive(10, 256)
    else:
        tlx.named_barrier_arrive(9, 256)


@triton.jit
def _mask_tile(qk, offs_m, offs_n, start_n, row0, S, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """``qk`` with the columns past S (and, causal, the keys after each query row) set to -inf — only on the tiles
    that need it (the sequence-end tile and, causal, the tiles crossing the Q tile's diagonal at ``row0``)."""
    need_mask = start_n + BLOCK_N > S
    if CAUSAL:
        need_mask = need_mask | (start_n + BLOCK_N > row0 + 1)
    if need_mask:
        valid = offs_n[None, :] < S
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk, float("-inf"))
    return qk


@triton.jit
def _softmax_tile(qk, m_i, l_i, col_scale, qk_scale, offs_m, offs_n, start_n, row0, S,
                  BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, COL_SCALE: tl.constexpr):
    """Online-softmax step of the pipelined loop on one ``[BLOCK_M_SPLIT, BLOCK_N]`` fp32 score tile ``qk``:
    column scale (``COL_SCALE``: ``rstd_k · log2(e)/sqrt(D)`` per key) or the scalar ``qk_scale`` folded into the
    exponent's FMA (``exp2(qk · qk_scale - m)``, m in the scaled log2 domain), causal / sequence-end mask only when
    the tile needs it. Returns ``(p fp32, m_new, l_new, alpha)``; the caller rescales its accumulator by alpha."""
    if COL_SCALE:
        qk = qk * col_scale[None, :]  # before the mask (masked columns: rstd_k = 0)
    qk = _mask_tile(qk, offs_m, offs_n, start_n, row0, S, BLOCK_N, CAUSAL)
    if COL_SCALE:
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
    else:  # qk_scale > 0, so max(qk) · qk_scale = max(qk · qk_scale); one FMA per score
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, m_ij, l_i, alpha


@triton.jit
def _rows_rstd(tile, r0, eps, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """rstd of rows ``r0 .. r0 + ROWS`` of a shared-memory tile (fp32, ``[ROWS]``), for the producer warpgroup: the
    squares summed elementwise over ``[ROWS, RSTD_Q_CHUNK]`` slices (its 40 registers), one cross-thread sum."""
    ssm = tl.zeros([ROWS, RSTD_Q_CHUNK], dtype=tl.float32)
    for d0 in tl.static_range(0, HEAD_DIM, RSTD_Q_CHUNK):
        kc = tlx.local_load(tlx.local_slice(tile, [r0, d0], [ROWS, RSTD_Q_CHUNK])).to(tl.float32)
        ssm += kc * kc
    return 1.0 / tl.sqrt(tl.sum(ssm, 1) / HEAD_DIM + eps)


@triton.jit
def _k_scale_in_place(k_tiles, k_landed, k_fulls, kstat_bufs, c, eps, dtype: tl.constexpr,
                      NUM_BUFFERS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                      PROBE_KPROD: tl.constexpr):
    """``K_NORM_PRODUCER``, in the producer warpgroup: once the ring's ``c``-th K tile has landed, scale its rows by
    rstd_k in place (``k · rstd_k`` in K's dtype; γq·γk are in the Q tile) and release it to the consumers
    (``k_fulls``). ``[ROWS, RSTD_Q_CHUNK]`` slices like the producer's rstd_q (its 40 registers); the squares summed
    elementwise, one cross-thread sum per row block; rows past S land as zeros and stay 0. ``PROBE_KPROD = 1``
    (timing ablation, tools/fna_llm_breakdown_probe.py --kprod): rstd_k only, to the scratch ``kstat_bufs``."""
    buf = c % NUM_BUFFERS
    tlx.barrier_wait(k_landed[buf], (c // NUM_BUFFERS) & 1)
    for r0 in tl.static_range(0, BLOCK_N, ROWS):
        rstd_k = _rows_rstd(k_tiles[buf], r0, eps, HEAD_DIM, ROWS)
        if PROBE_KPROD == 1:
            tlx.local_store(kstat_bufs[r0 // ROWS], tl.broadcast_to(rstd_k[:, None], [ROWS, RSTD_Q_COLS]))
        else:
            for d0 in tl.static_range(0, HEAD_DIM, RSTD_Q_CHUNK):
                kslice = tlx.local_slice(k_tiles[buf], [r0, d0], [ROWS, RSTD_Q_CHUNK])
                tlx.local_store(kslice, (tlx.local_load(kslice).to(tl.float32) * rstd_k[:, None]).to(dtype))
    tlx.fence("async_shared")  # generic-proxy stores -> the consumers' wgmma (async proxy)
    tlx.named_barrier_wait(K_READY_BARRIER, 128)  # every producer thread's rows are stored
    tlx.barrier_arrive(k_fulls[buf], 1)


@triton.jit
def _k_rstd_to_scratch(k_tiles, k_fulls, kstat_fulls, kstat, c, eps, NUM_BUFFERS: tl.constexpr,
                       HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """``K_RSTD_PRODUCER``, in the producer warpgroup: once the ring's ``c``-th K tile has landed (the consumers'
    QKᵀ reads it meanwhile), its rows' rstd_k to the CTA's global scratch ``kstat`` (``[NUM_BUFFERS, BLOCK_N]``
    fp32: the consumers' plain load of it takes the accumulator's column layout, which a pinned shared-memory read
    did not) and ``kstat_fulls`` arrived (release; the consumers' wait acquires). Sums of squares elementwise over
    ``[ROWS, RSTD_Q_CHUNK]`` slices; rows past S land as zeros (their rstd_k, 1/sqrt(eps), scales zero scores that
    are masked anyway)."""
    buf = c % NUM_BUFFERS
    tlx.barrier_wait(k_fulls[buf], (c // NUM_BUFFERS) & 1)
    for r0 in tl.static_range(0, BLOCK_N, ROWS):
        tl.store(kstat + buf * BLOCK_N + r0 + tl.arange(0, ROWS), _rows_rstd(k_tiles[buf], r0, eps, HEAD_DIM, ROWS))
    tlx.named_barrier_wait(K_READY_BARRIER, 128)  # every producer thread's values are stored
    tlx.barrier_arrive(kstat_fulls[buf], 1)


@triton.jit
def _k_rstd_from_scratch(kstat_fulls, kstat, c, qk_scale, NUM_BUFFERS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``K_RSTD_PRODUCER``, in a consumer: the ring's ``c``-th K tile's rstd_k as ``_k_rstd_to_scratch`` left it
    (wait on ``kstat_fulls``, then a ``.cg`` load past L1), times ``qk_scale``: the softmax's column scale,
    ``[BLOCK_N]`` fp32 (a plain load, so the compiler gives it the accumulator's column layout)."""
    buf = c % NUM_BUFFERS
    tlx.barrier_wait(kstat_fulls[buf], (c // NUM_BUFFERS) & 1)
    return tl.load(kstat + buf * BLOCK_N + tl.arange(0, BLOCK_N), cache_modifier=".cg") * qk_scale


@triton.jit
def _proxy_fence_global():
    """``fence.proxy.async.global``: order this thread's generic-proxy global accesses with the async proxy's (TMA)."""
    tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _grid_barrier(SYNC):
    """Grid-wide barrier of a cooperative launch (every CTA resident), run by one warpgroup per CTA and by every CTA
    exactly once (a CTA that skips it deadlocks the others): the CTA's global stores so far are visible to every CTA
    after it (then also to their TMA loads). ``SYNC``: int32 ``[count, gen]`` in global memory, zero before the
    first launch and left so after each: one thread per CTA reads ``gen``, arrives on ``count`` (acq_rel; the CTA
    barrier before it makes the release cover all of the warpgroup's stores, PTX memory model's causality order);
    the last arrival resets ``count`` and bumps ``gen`` (release), the others spin until ``gen`` moves (acquire).
    The generation survives CUDA-graph replays. A generation-counting barrier like CUDA cooperative groups'
    ``grid.sync()`` (``cooperative_groups/details/sync.h``), which packs both into one word."""
    _proxy_fence_global()  # the k_n stores, before TMA loads on other SMs read them
    tl.debug_barrier()  # every thread's stores precede the elected thread's release
    gen = tl.atomic_add(SYNC + 1, 0, sem="relaxed", scope="gpu")
    arrived = tl.atomic_add(SYNC, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) - 1:
        tl.atomic_xchg(SYNC, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(SYNC + 1, 1, sem="release", scope="gpu")
    else:
        cur = tl.atomic_add(SYNC + 1, 0, sem="acquire", scope="gpu")
        while cur == gen:
            cur = tl.atomic_add(SYNC + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    _proxy_fence_global()  # the acquired k_n, before this CTA's TMA loads of it


@triton.jit
def _persistent_tile(tile, num_m, BH, S, GROUP, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """``PERSISTENT``: work tile index (0 .. num_m·BH - 1, one order every CTA agrees on) -> ``(start_m, bh, hkv,
    hi)``: causal: heaviest Q tiles first across all (batch, head) of the launch (``tile // BH`` counts down from
    the last Q tile, the longest KV prefix); non-causal: the Q tiles of one head next to each other (sharing K/V in
    L2). ``hi``: end of the tile's KV range (keys)."""
    if CAUSAL:
        start_m = num_m - 1 - tile // BH
        bh = tile % BH
        hi = tl.minimum((start_m + 1) * BLOCK_M, S)
    else:
        start_m = tile % num_m
        bh = tile // num_m
        hi = S
    return start_m, bh, bh // GROUP, hi  # bh = b·Hq + h -> b·Hkv + h // GROUP (Hq = Hkv·GROUP)


@triton.jit
def _fna_llm_ws_kernel(Q, K, V, O, QW, KW, OW, RSTD_K, S, HQ, GROUP, eps, qk_scale, BH,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       NUM_BUFFERS: tl.constexpr, NUM_MMA_GROUPS: tl.constexpr, CAUSAL: tl.constexpr,
                       NORM_QK: tl.constexpr, K_PREPASS: tl.constexpr, NORM_O: tl.constexpr,
                       PINGPONG: tl.constexpr, CONSUMER_REGS: tl.constexpr, K_MATERIALIZED: tl.constexpr,
                       PIPELINE: tl.constexpr = False, PINGPONG_PV: tl.constexpr = False,
                       LPT: tl.constexpr = False, WARP_ARRIVE: tl.constexpr = False,
                       PERSISTENT: tl.constexpr = False, LAZY_Q: tl.constexpr = False,
                       LAZY_Q_EARLY: tl.constexpr = False, PDL: tl.constexpr = False,
                       PROBE_RSTD_Q: tl.constexpr = 0, RSTD_Q_PRODUCER: tl.constexpr = False,
                       K_NORM_PRODUCER: tl.constexpr = False, PROBE_KPROD: tl.constexpr = 0,
                       K_RSTD_PRODUCER: tl.constexpr = False, GRID_PREPASS: tl.constexpr = False, SYNC=None):
    # K_MATERIALIZED: K is the pre-pass's normalized copy k_n (γk included): Q gets γq only, no column scale;
    # K_NORM_PRODUCER (with K_MATERIALIZED): K is raw; the producer scales each landed K tile by rstd_k in place
    # BH: (batch, query head) pairs of the launch (PERSISTENT: all B·Hq; the grid is min(#SMs, Q tiles · BH))
    # GRID_PREPASS: RSTD_K holds the raw K, K the k_n this grid writes first; SYNC the grid barrier's int32 [2]
    BLOCK_M_SPLIT: tl.constexpr = BLOCK_M // NUM_MMA_GROUPS
    # scale S's columns by rstd_k (prepass, inloop, K_RSTD_PRODUCER)
    COL_SCALE: tl.constexpr = NORM_QK and not K_MATERIALIZED
    D_CHUNK: tl.constexpr = 32
    NUM_Q_BUFFERS: tl.constexpr = 2 if PERSISTENT else 1  # PERSISTENT: the next tile's Q loads during this tile
    dtype = Q.dtype.element_ty
    if PERSISTENT:  # CTA p walks the work tiles p, p + G, p + 2G, ... (G = grid size)
        num_m = tl.cdiv(S, BLOCK_M)
        first_tile = tl.program_id(0)
        n_iter = tl.cdiv(num_m * BH - first_tile, tl.num_programs(0))
    else:  # one work tile per CTA: the tile loops below are a static range of one (no loop in the IR)
        if LPT and CAUSAL:  # heaviest Q tiles (the last ones: the longest KV prefix) first, across all (batch, head)
            num_m = tl.num_programs(0)
            num_bh = tl.num_programs(1)
            lin = tl.program_id(1).to(tl.int64) * num_m + tl.program_id(0)  # the order in which CTAs are dispatched
            start_m = (num_m - 1 - lin // num_bh).to(tl.int32)
            bh = (lin % num_bh).to(tl.int32)
        else:
            start_m = tl.program_id(0)
            bh = tl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        hkv = b * (HQ // GROUP) + h // GROUP
        q_off = bh.to(tl.int64) * S * HEAD_DIM
        kv_off = hkv.to(tl.int64) * S * HEAD_DIM
        rstd_base = RSTD_K + hkv.to(tl.int64) * S  # [B * Hkv, S] fp32 (K_PREPASS only)
        if CAUSAL:
            hi = (start_m + 1) * BLOCK_M
            if hi > S:
                hi = S
        else:
            hi = S

    q_tiles = tlx.local_alloc((BLOCK_M_SPLIT, HEAD_DIM), dtype, NUM_MMA_GROUPS * NUM_Q_BUFFERS)
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS)
    q_fulls = tlx.alloc_barriers(num_barriers=NUM_MMA_GROUPS * NUM_Q_BUFFERS, arrive_count=1)
    if PERSISTENT:  # Q buffer (q buffer, warpgroup) released by its consumer warpgroup once its last QKᵀ is done
        q_empties = tlx.alloc_barriers(num_barriers=NUM_MMA_GROUPS * NUM_Q_BUFFERS, arrive_count=1)
    if RSTD_Q_PRODUCER:  # rstd_q of each Q buffer, written by the producer (guarded by q_empties like the buffer)
        rstd_bufs = tlx.local_alloc((BLOCK_M_SPLIT, RSTD_Q_COLS), tl.float32, NUM_MMA_GROUPS * NUM_Q_BUFFERS)
        rstd_fulls = tlx.alloc_barriers(num_barriers=NUM_MMA_GROUPS * NUM_Q_BUFFERS, arrive_count=1)
    # empties: WARP_ARRIVE: every consumer thread arrives on its own (no warpgroup bar.sync before each release);
    # otherwise one elected thread per consumer warpgroup arrives, after a warpgroup barrier
    if WARP_ARRIVE:
        k_empties = tlx.alloc_warp_barrier(num_barriers=NUM_BUFFERS, num_warps=4, num_arrivals=NUM_MMA_GROUPS)
    else:
        k_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=NUM_MMA_GROUPS)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
    if K_NORM_PRODUCER:  # the raw K tile's TMA completion, seen by the producer only (k_fulls: the normalized tile)
        k_landed = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
        kstat_bufs = k_tiles  # PROBE_KPROD only: a scratch block for the rstd_k it computes and drops
        if PROBE_KPROD == 1:
            kstat_bufs = tlx.local_alloc((BLOCK_M_SPLIT, RSTD_Q_COLS), tl.float32, BLOCK_N // BLOCK_M_SPLIT)
    if K_RSTD_PRODUCER:  # rstd_k of each K buffer, from the producer, in the CTA's slice of the scratch passed in
        # RSTD_K's slot (reused once the consumers release the buffer)
        kstat = RSTD_K + tl.program_id(0).to(tl.int64) * (NUM_BUFFERS * BLOCK_N)
        kstat_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
    if WARP_ARRIVE:
        v_empties = tlx.alloc_warp_barrier(num_barriers=NUM_BUFFERS, num_warps=4, num_arrivals=NUM_MMA_GROUPS)
    else:
        v_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=NUM_MMA_GROUPS)
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
    if GRID_PREPASS:  # the producer warpgroup of every CTA (code before the warp-specialized region runs there)
        K_RAW = RSTD_K  # the raw K (in rstd_k's argument slot); K is the k_n written here
        R = (BH // GROUP).to(tl.int64) * S  # K's rows, B·Hkv·S
        for blk in range(tl.program_id(0), tl.cdiv(R, GRID_PREPASS_ROWS), tl.num_programs(0)):
            # LAZY_Q: γq folded into k_n, as the pre-pass kernel does
            _k_norm_rows(K_RAW, KW, K, QW, blk, R, eps, HEAD_DIM, GRID_PREPASS_ROWS, LAZY_Q)
        _grid_barrier(SYNC)  # every CTA, exactly once

    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA loads
            if PERSISTENT:  # descriptors over the whole tensors, built once per CTA: [B·Hq or B·Hkv, S, D], block
                # [1, rows, D]; TMA clips every dimension, so rows past S read as zeros, never the next head's
                desc_q = tl.make_tensor_descriptor(Q, shape=[BH, S, HEAD_DIM], strides=[S * HEAD_DIM, HEAD_DIM, 1],
                                                   block_shape=[1, BLOCK_M_SPLIT, HEAD_DIM])
                desc_k = tl.make_tensor_descriptor(K, shape=[BH // GROUP, S, HEAD_DIM],
                                                   strides=[S * HEAD_DIM, HEAD_DIM, 1],
                                                   block_shape=[1, BLOCK_N, HEAD_DIM])
                desc_v = tl.make_tensor_descriptor(V, shape=[BH // GROUP, S, HEAD_DIM],
                                                   strides=[S * HEAD_DIM, HEAD_DIM, 1],
                                                   block_shape=[1, BLOCK_N, HEAD_DIM])
                tile = first_tile
            kv_phase = 0  # the K/V ring's counters run on across the work tiles (never reset per tile)
            cnt = 0
            for it in (tl.range if PERSISTENT else tl.static_range)(0, n_iter if PERSISTENT else 1):
                if PERSISTENT:
                    start_m, bh, hkv, hi = _persistent_tile(tile, num_m, BH, S, GROUP, BLOCK_M, CAUSAL)
                    q_phase = ((it // NUM_Q_BUFFERS) & 1) ^ 1  # the first use of a Q buffer passes at once
                    for cid in tl.static_range(0, NUM_MMA_GROUPS):
                        qi = (it % NUM_Q_BUFFERS) * NUM_MMA_GROUPS + cid
                        tlx.barrier_wait(q_empties[qi], q_phase)
                        tlx.barrier_expect_bytes(q_fulls[qi], 2 * BLOCK_M_SPLIT * HEAD_DIM)
                        tlx.async_descriptor_load(desc_q, q_tiles[qi],
                                                  [bh, start_m * BLOCK_M + cid * BLOCK_M_SPLIT, 0], q_fulls[qi])
                    if RSTD_Q_PRODUCER:  # issued ~2 KV steps before the consumers finish the previous tile: the load
                        # and these sums run while they do, before this tile's first K/V load (the ring is full)
                        for cid in tl.static_range(0, NUM_MMA_GROUPS):
                            qi = (it % NUM_Q_BUFFERS) * NUM_MMA_GROUPS + cid
                            tlx.barrier_wait(q_fulls[qi], (it // NUM_Q_BUFFERS) & 1)
                            ss = tl.zeros([BLOCK_M_SPLIT], dtype=tl.float32)
                            for d0 in tl.static_range(0, HEAD_DIM, RSTD_Q_CHUNK):
                                qslice = tlx.local_slice(q_tiles[qi], [0, d0], [BLOCK_M_SPLIT, RSTD_Q_CHUNK])
                                qc = tlx.local_load(qslice).to(tl.float32)
                                ss += tl.sum(qc * qc, 1)
                                if K_NORM_PRODUCER:  # γq·γk folded into the Q tile, once per tile: the K tiles
                                    # get rstd_k only (the weights in the per-K-tile scale spilled the producer's
                                    # registers: 392-436 bytes in a CPU compile)
                                    offs_w = d0 + tl.arange(0, RSTD_Q_CHUNK)
                                    w = tl.load(KW + offs_w).to(tl.float32) * tl.load(QW + offs_w).to(tl.float32)
                                    tlx.local_store(qslice, (qc * w[None, :]).to(dtype))
                            rstd_q = 1.0 / tl.sqrt(ss / HEAD_DIM + eps)
                            if K_RSTD_PRODUCER:  # Q normalized in place, q·rstd_q·γq·γk: the consumers' softmax
                                # then has one anchor layout, the columns' (with a row one too, the compiler
                                # computed the softmax twice, in both layouts)
                                for d0 in tl.static_range(0, HEAD_DIM, RSTD_Q_CHUNK):
                                    qslice = tlx.local_slice(q_tiles[qi], [0, d0], [BLOCK_M_SPLIT, RSTD_Q_CHUNK])
                                    offs_w = d0 + tl.arange(0, RSTD_Q_CHUNK)
                                    w = tl.load(KW + offs_w).to(tl.float32) * tl.load(QW + offs_w).to(tl.float32)
                                    qc = tlx.local_load(qslice).to(tl.float32)
                                    tlx.local_store(qslice, (qc * rstd_q[:, None] * w[None, :]).to(dtype))
                            if K_NORM_PRODUCER or K_RSTD_PRODUCER:  # the rewritten Q tile is read by the wgmma
                                tlx.fence("async_shared")
                                tlx.named_barrier_wait(K_READY_BARRIER, 128)
                            if not K_RSTD_PRODUCER:
                                tlx.local_store(rstd_bufs[qi],
                                                tl.broadcast_to(rstd_q[:, None], [BLOCK_M_SPLIT, RSTD_Q_COLS]))
                            tlx.barrier_arrive(rstd_fulls[qi], 1)
                    tile += tl.num_programs(0)
                else:  # per-(batch, head) descriptors [S, D]
                    desc_q = tl.make_tensor_descriptor(Q + q_off, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                                       block_shape=[BLOCK_M_SPLIT, HEAD_DIM])
                    desc_k = tl.make_tensor_descriptor(K + kv_off, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                                       block_shape=[BLOCK_N, HEAD_DIM])
                    desc_v = tl.make_tensor_descriptor(V + kv_off, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                                       block_shape=[BLOCK_N, HEAD_DIM])
                    for cid in tl.static_range(0, NUM_MMA_GROUPS):
                        tlx.barrier_expect_bytes(q_fulls[cid], 2 * BLOCK_M_SPLIT * HEAD_DIM)
                        tlx.async_descriptor_load(desc_q, q_tiles[cid], [start_m * BLOCK_M + cid * BLOCK_M_SPLIT, 0],
                                                  q_fulls[cid])
                if PDL:  # programmatic dependent launch: the K pre-pass (the previous grid) has written k_n before
                    gdc_wait()  # the first K load (Q, V and the CTA's setup above overlap its tail)
                for start_n in tl.range(0, hi, BLOCK_N):
                    buf = cnt % NUM_BUFFERS
                    kv_phase = kv_phase ^ (buf == 0)
                    tlx.barrier_wait(k_empties[buf], kv_phase)
                    if K_NORM_PRODUCER:
                        tlx.barrier_expect_bytes(k_landed[buf], 2 * BLOCK_N * HEAD_DIM)
                        tlx.async_descriptor_load(desc_k, k_tiles[buf], [hkv, start_n, 0], k_landed[buf])
                        if start_n > 0:  # the previous K tile, while this one lands; before this tile's V load,
                            # whose buffer the consumers free only after the previous tile's QKᵀ (2 buffers)
                            _k_scale_in_place(k_tiles, k_landed, k_fulls, kstat_bufs, cnt - 1, eps, dtype,
                                              NUM_BUFFERS, HEAD_DIM, BLOCK_N, BLOCK_M_SPLIT, PROBE_KPROD)
                    elif PERSISTENT:
                        tlx.barrier_expect_bytes(k_fulls[buf], 2 * BLOCK_N * HEAD_DIM)
                        tlx.async_descriptor_load(desc_k, k_tiles[buf], [hkv, start_n, 0], k_fulls[buf])
                        if K_RSTD_PRODUCER and start_n > 0:  # the previous tile's rstd_k, before this tile's V
                            # load (whose buffer the consumers free only after the previous tile's softmax)
                            _k_rstd_to_scratch(k_tiles, k_fulls, kstat_fulls, kstat, cnt - 1, eps, NUM_BUFFERS,
                                               HEAD_DIM, BLOCK_N, BLOCK_M_SPLIT)
                    else:
                        tlx.barrier_expect_bytes(k_fulls[buf], 2 * BLOCK_N * HEAD_DIM)
                        tlx.async_descriptor_load(desc_k, k_tiles[buf], [start_n, 0], k_fulls[buf])
                    tlx.barrier_wait(v_empties[buf], kv_phase)
                    tlx.barrier_expect_bytes(v_fulls[buf], 2 * BLOCK_N * HEAD_DIM)
                    if PERSISTENT:
                        tlx.async_descriptor_load(desc_v, v_tiles[buf], [hkv, start_n, 0], v_fulls[buf])
                    else:
                        tlx.async_descriptor_load(desc_v, v_tiles[buf], [start_n, 0], v_fulls[buf])
                    cnt += 1
                if K_NORM_PRODUCER:  # the work tile's last K tile
                    _k_scale_in_place(k_tiles, k_landed, k_fulls, kstat_bufs, cnt - 1, eps, dtype, NUM_BUFFERS,
                                      HEAD_DIM, BLOCK_N, BLOCK_M_SPLIT, PROBE_KPROD)
                if K_RSTD_PRODUCER:
                    _k_rstd_to_scratch(k_tiles, k_fulls, kstat_fulls, kstat, cnt - 1, eps, NUM_BUFFERS, HEAD_DIM,
                                       BLOCK_N, BLOCK_M_SPLIT)

        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_MMA_GROUPS):  # consumers
            cid: tl.constexpr = tlx.async_task_replica_id()
            offs_d = tl.arange(0, HEAD_DIM)
            if PERSISTENT:
                tile = first_tile
                if PINGPONG:  # once: the turn then passes on across the work tiles (same KV steps in both groups)
                    if cid == 1:
                        tlx.named_barrier_arrive(9, 256)
            kv_phase = 1  # K/V ring counters: running across the work tiles, like the producer's
            cnt = 0
            for it in (tl.range if PERSISTENT else tl.static_range)(0, n_iter if PERSISTENT else 1):
                if PERSISTENT:
                    start_m, bh, hkv, hi = _persistent_tile(tile, num_m, BH, S, GROUP, BLOCK_M, CAUSAL)
                    qi = (it % NUM_Q_BUFFERS) * NUM_MMA_GROUPS + cid
                    q_phase = (it // NUM_Q_BUFFERS) & 1
                    rstd_base = RSTD_K + hkv.to(tl.int64) * S  # [B * Hkv, S] fp32 (K_PREPASS only)
                else:
                    qi = cid
                    q_phase = 0
                row0 = start_m * BLOCK_M + cid * BLOCK_M_SPLIT
                offs_m = row0 + tl.arange(0, BLOCK_M_SPLIT)
                if PROBE_RSTD_Q == 2:  # timing ablation (tools/fna_llm_breakdown_probe.py): rstd_q [B·Hq, S] fp32
                    # read from global memory (passed in RSTD_K's slot) instead of computed from the Q tile
                    rstd_q = tl.load(RSTD_K + bh.to(tl.int64) * S + offs_m, mask=offs_m < S, other=1.0)
                tlx.barrier_wait(q_fulls[qi], q_phase)
                if PIPELINE and (LAZY_Q or not NORM_QK or K_RSTD_PRODUCER):  # the QKᵀ A operand straight from
                    # the TMA-loaded buffer (SS wgmma); LAZY_Q: the raw Q, its rstd scales S's rows; K_RSTD_PRODUCER:
                    # normalized in place by the producer
                    q = q_tiles[qi]
                else:
                    qf = tlx.local_load(q_tiles[qi]).to(tl.float32)
                    if K_MATERIALIZED:  # once per Q tile; K arrives normalized (k_n, γk included): γq only
                        qw = tl.load(QW + offs_d).to(tl.float32)
                        qf = qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) / HEAD_DIM + eps))[:, None] * qw[None, :]
                    elif NORM_QK:  # once per Q tile; k_weight folded into Q (the K rows' rstd scales S's columns)
                        qw = tl.load(QW + offs_d).to(tl.float32)
                        kw = tl.load(KW + offs_d).to(tl.float32)
                        qf = qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) / HEAD_DIM + eps))[:, None] * (qw * kw)[None, :]
                    q = qf.to(dtype)
                    if PIPELINE:  # normalized Q written back over the raw tile: the wgmma reads it from shared
                        # memory (frees its 32 registers per thread for the pipeline); the warpgroup barriers: every
                        # thread has read the raw tile before any overwrites it, and every thread's rows are stored
                        # before the wgmma
                        tlx.named_barrier_wait(Q_READY_BARRIER + cid, 128)
                        tlx.local_store(q_tiles[qi], q)
                        tlx.fence("async_shared")  # generic-proxy stores -> async-proxy (wgmma) reads
                        tlx.named_barrier_wait(Q_READY_BARRIER + cid, 128)
                        q = q_tiles[qi]
                m_i = tl.full([BLOCK_M_SPLIT], float("-inf"), dtype=tl.float32)
                l_i = tl.zeros([BLOCK_M_SPLIT], dtype=tl.float32)
                acc = tl.zeros([BLOCK_M_SPLIT, HEAD_DIM], dtype=tl.float32)
                if PINGPONG and not PERSISTENT:
                    if cid == 1:
                        tlx.named_barrier_arrive(9, 256)
                if PIPELINE:  # FA3 intra-warpgroup overlap: QKᵀ of tile j+1 and PV of tile j in flight during softmax
                    # tile 0: QKᵀ only (its PV is issued in the next iteration, or after the loop)
                    offs_n = tl.arange(0, BLOCK_N)
                    if K_PREPASS:
                        rstd_k = tl.load(rstd_base + offs_n, mask=offs_n < S, other=0.0)
                    s_scale = qk_scale
                    if K_RSTD_PRODUCER:  # the producer has normalized the Q tile
                        tlx.barrier_wait(rstd_fulls[qi], q_phase)
                    elif RSTD_Q_PRODUCER:  # rstd_q from the producer: one read, in the accumulator's row layout
                        tlx.barrier_wait(rstd_fulls[qi], q_phase)
                        s_scale = tl.max(tlx.local_load(rstd_bufs[qi], layout=RSTD_ROWS_LAYOUT), 1) * qk_scale
                    elif LAZY_Q and PROBE_RSTD_Q == 1:  # timing ablation: no rstd_q at all (a per-row scale of 1; the
                        # kernel then computes plain attention of q against k_n)
                        s_scale = tl.full([BLOCK_M_SPLIT], 1.0, tl.float32) * qk_scale
                    elif LAZY_Q and PROBE_RSTD_Q == 2:
                        s_scale = rstd_q * qk_scale
                    elif LAZY_Q and LAZY_Q_EARLY:  # Lazy Pre-Norm on QKᵀ's rows: rstd_q from the Q tile in shared
                        # memory (32-column slices, fp32; γq is in k_n). LAZY_Q_EARLY (= PINGPONG): before the tile's first
                        # QKᵀ, outside the ping-pong turn (computed while the first QKᵀ runs, the ping-pong kernels
                        # lost 13-32 % at S >= 4096; tools/fna_llm_lazyq_probe.py)
                        ss = tl.zeros([BLOCK_M_SPLIT], dtype=tl.float32)
                        for d0 in tl.static_range(0, HEAD_DIM, D_CHUNK):
                            qc = tlx.local_load(tlx.local_slice(q_tiles[qi], [0, d0], [BLOCK_M_SPLIT, D_CHUNK]),
                                                layout=Q_ROWS_LAYOUT)
                            qc = qc.to(tl.float32)
                            ss += tl.sum(qc * qc, 1)
                        s_scale = qk_scale / tl.sqrt(ss / HEAD_DIM + eps)
                    buf = cnt % NUM_BUFFERS
                    tlx.barrier_wait(k_fulls[buf], (cnt // NUM_BUFFERS) & 1)
                    if PINGPONG:
                        _turn_wait(cid)
                    qk = tlx.async_dot(q, tlx.local_trans(k_tiles[buf]))
                    if PINGPONG:
                        _turn_pass(cid)
                    col_scale = qk_scale
                    if K_PREPASS:
                        col_scale = rstd_k * qk_scale
                    if LAZY_Q and not LAZY_Q_EARLY and PROBE_RSTD_Q == 0 and not RSTD_Q_PRODUCER:  # cooperative:
                        # while the first QKᵀ wgmma reads the same tile (the block above, repeated: a jit helper can
                        # neither take nor return a tensor of a pinned tlx.layout - the call's signature carries no
                        # layout - so it stays inline)
                        ss = tl.zeros([BLOCK_M_SPLIT], dtype=tl.float32)
                        for d0 in tl.static_range(0, HEAD_DIM, D_CHUNK):
                            qc = tlx.local_load(tlx.local_slice(q_tiles[qi], [0, d0], [BLOCK_M_SPLIT, D_CHUNK]),
                                                layout=Q_ROWS_LAYOUT)
                            qc = qc.to(tl.float32)
                            ss += tl.sum(qc * qc, 1)
                        s_scale = qk_scale / tl.sqrt(ss / HEAD_DIM + eps)
                    qk = tlx.async_dot_wait(0, qk)
                    if K_RSTD_PRODUCER:  # this tile's rstd_k, read before the K buffer (and its block) is released
                        col_scale = _k_rstd_from_scratch(kstat_fulls, kstat, cnt, qk_scale, NUM_BUFFERS, BLOCK_N)
                    tlx.barrier_arrive(k_empties[buf], 1)
                    if LAZY_Q:  # inline: s_scale carries the pinned row layout, which a jit call cannot take
                        qk = _mask_tile(qk, offs_m, offs_n, 0, row0, S, BLOCK_N, CAUSAL)
                        m_i = tl.max(qk, 1) * s_scale
                        p = tl.math.exp2(qk * s_scale[:, None] - m_i[:, None])
                        l_i = tl.sum(p, 1)
                    else:
                        p, m_i, l_i, alpha = _softmax_tile(qk, m_i, l_i, col_scale, qk_scale, offs_m, offs_n, 0, row0,
                                                           S, BLOCK_N, CAUSAL, COL_SCALE)  # acc = 0: no rescale
                    p = p.to(dtype)  # the loop carries P in the input dtype (32 registers per thread, not 64)
                    cnt += 1
                    for start_n in tl.range(BLOCK_N, hi, BLOCK_N):
                        buf = cnt % NUM_BUFFERS
                        phase = (cnt // NUM_BUFFERS) & 1
                        pbuf = (cnt - 1) % NUM_BUFFERS  # the previous tile's V buffer
                        pphase = ((cnt - 1) // NUM_BUFFERS) & 1
                        offs_n = start_n + tl.arange(0, BLOCK_N)
                        tlx.barrier_wait(k_fulls[buf], phase)
                        if PINGPONG:
                            _turn_wait(cid)
                        qk = tlx.async_dot(q, tlx.local_trans(k_tiles[buf]))
                        if PINGPONG and not PINGPONG_PV:
                            _turn_pass(cid)
                        tlx.barrier_wait(v_fulls[pbuf], pphase)
                        acc = tlx.async_dot(p, v_tiles[pbuf], acc)
                        if PINGPONG_PV:  # FA3: both GEMMs of this step issued inside the ordered region
                            _turn_pass(cid)
                        if K_PREPASS:  # issued after both GEMMs: its latency hides behind them (and it holds no
                            # registers across the issue)
                            col_scale = tl.load(rstd_base + offs_n, mask=offs_n < S, other=0.0) * qk_scale
                        qk = tlx.async_dot_wait(1, qk)  # this tile's QKᵀ done; the previous PV may still run
                        if K_RSTD_PRODUCER:
                            col_scale = _k_rstd_from_scratch(kstat_fulls, kstat, cnt, qk_scale, NUM_BUFFERS, BLOCK_N)
                        tlx.barrier_arrive(k_empties[buf], 1)
                        if LAZY_Q:  # _softmax_tile with the per-row scale, inline (see the first tile)
                            qk = _mask_tile(qk, offs_m, offs_n, start_n, row0, S, BLOCK_N, CAUSAL)
                            m_ij = tl.maximum(m_i, tl.max(qk, 1) * s_scale)
                            p_new = tl.math.exp2(qk * s_scale[:, None] - m_ij[:, None])
                            alpha = tl.math.exp2(m_i - m_ij)
                            l_i = l_i * alpha + tl.sum(p_new, 1)
                            m_i = m_ij
                        else:
                            p_new, m_i, l_i, alpha = _softmax_tile(qk, m_i, l_i, col_scale, qk_scale, offs_m, offs_n,
                                                                   start_n, row0, S, BLOCK_N, CAUSAL, COL_SCALE)
                        acc = tlx.async_dot_wait(0, acc)
                        tlx.barrier_arrive(v_empties[pbuf], 1)
                        acc = acc * alpha[:, None]
                        p = p_new.to(dtype)  # after the PV wait: the previous P's registers are free again
                        cnt += 1
                    if PERSISTENT:  # every QKᵀ of this work tile is done: the producer may refill this Q buffer
                        tlx.barrier_arrive(q_empties[qi], 1)
                    pbuf = (cnt - 1) % NUM_BUFFERS  # the last tile's PV
                    tlx.barrier_wait(v_fulls[pbuf], ((cnt - 1) // NUM_BUFFERS) & 1)
                    acc = tlx.async_dot(p, v_tiles[pbuf], acc)
                    acc = tlx.async_dot_wait(0, acc)
                    tlx.barrier_arrive(v_empties[pbuf], 1)
                else:
                    for start_n in tl.range(0, hi, BLOCK_N):
                        buf = cnt % NUM_BUFFERS
                        kv_phase = kv_phase ^ (buf == 0)
                        offs_n = start_n + tl.arange(0, BLOCK_N)
                        if K_PREPASS:  # rstd_k of this tile's keys, issued first so that its latency hides behind
                            # the waits
                            rstd_k = tl.load(rstd_base + offs_n, mask=offs_n < S, other=0.0)
                        tlx.barrier_wait(k_fulls[buf], kv_phase)
                        if PINGPONG:
                            _turn_wait(cid)
                        qk = tlx.async_dot(q, tlx.local_trans(k_tiles[buf]))
                        if PINGPONG:
                            _turn_pass(cid)
                        if K_PREPASS:
                            col_scale = rstd_k * qk_scale
                        elif COL_SCALE:  # "inloop": rstd of the K rows, from shared memory, while the wgmma runs
                            ss = tl.zeros([BLOCK_N], dtype=tl.float32)
                            for d0 in tl.static_range(0, HEAD_DIM, D_CHUNK):
                                kc = tlx.local_load(tlx.local_slice(k_tiles[buf], [0, d0], [BLOCK_N, D_CHUNK]))
                                kc = kc.to(tl.float32)
                                ss += tl.sum(kc * kc, 1)
                            col_scale = qk_scale / tl.sqrt(ss / HEAD_DIM + eps)
                        qk = tlx.async_dot_wait(0, qk)
                        tlx.barrier_arrive(k_empties[buf], 1)
                        if COL_SCALE:
                            qk = qk * col_scale[None, :]  # before the mask (masked columns: rstd_k = 0)
                        else:  # attention, or K_NORM = "materialize" (k_n already normalized)
                            qk = qk * qk_scale
                        qk = _mask_tile(qk, offs_m, offs_n, start_n, row0, S, BLOCK_N, CAUSAL)
                        m_ij = tl.maximum(m_i, tl.max(qk, 1))
                        p = tl.math.exp2(qk - m_ij[:, None])
                        alpha = tl.math.exp2(m_i - m_ij)
                        l_i = l_i * alpha + tl.sum(p, 1)
                        acc = acc * alpha[:, None]
                        m_i = m_ij
                        tlx.barrier_wait(v_fulls[buf], kv_phase)
                        acc = tlx.async_dot(p.to(dtype), v_tiles[buf], acc)
                        acc = tlx.async_dot_wait(0, acc)
                        tlx.barrier_arrive(v_empties[buf], 1)
                        cnt += 1
                    if PERSISTENT:  # Q (registers) no longer read from its buffer
                        tlx.barrier_arrive(q_empties[qi], 1)
                if PERSISTENT:  # the output rows, recomputed from the tile index (fewer registers live in the KV loop)
                    start_m, bh, hkv, hi = _persistent_tile(tile, num_m, BH, S, GROUP, BLOCK_M, CAUSAL)
                    q_off = bh.to(tl.int64) * S * HEAD_DIM
                    offs_m = start_m * BLOCK_M + cid * BLOCK_M_SPLIT + tl.arange(0, BLOCK_M_SPLIT)
                    tile += tl.num_programs(0)
                acc = acc / l_i[:, None]
                if NORM_O:
                    ow = tl.load(OW + offs_d).to(tl.float32)
                    acc = acc * (1.0 / tl.sqrt(tl.sum(acc * acc, 1) / HEAD_DIM + eps))[:, None] * ow[None, :]
                o_ptrs = O + q_off + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
                tl.store(o_ptrs, acc.to(dtype), mask=offs_m[:, None] < S)


H200_NUM_SMS = 132  # the persistent grid's size when compiling without a GPU (compile_sm90)
SMEM_LIMIT_BYTES = 227 * 1024  # dynamic shared memory per CTA on sm_90


def _num_sms(device) -> int:
    """Streaming multiprocessors of ``device`` (the persistent grid's size); the H200's 132 off the GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return H200_NUM_SMS


def _persistent_launch(launches, q, k, v, o, pre, prepass, materialize, cfg, num_sms):
    """The single ``(args, grid)`` launch of ``PERSISTENT``: the whole q, K (or the pre-pass's k_n), v, o and
    rstd_k (no batch slices: the grid is ``min(num_sms, cdiv(S, BLOCK_M) · B · Hq)``, never near the 65535 limit
    of axis y), with ``BH = B · Hq`` as the last argument. ``launches``: ``plan_launches``' slices (their scalar
    arguments are reused); ``pre``: ``k_prepass``' ``(kernel, args, grid, kw)``, whose args hold rstd_k
    (``(k, rstd_k, R, eps)``) or k_n (``(k, k_weight, k_n, R, eps)``)."""
    B, Hq, S, _ = q.shape
    args = launches[0][0]
    k_full = pre[1][2] if materialize else k
    rstd = pre[1][1] if prepass else args[7]
    tiles = triton.cdiv(S, cfg.BLOCK_M) * B * Hq
    if tiles >= 2 ** 31:
        raise ValueError(f"PERSISTENT: {tiles} work tiles exceed the kernel's 32-bit tile index")
    return (q, k_full, v, o) + tuple(args[4:7]) + (rstd,) + tuple(args[8:]) + (B * Hq,), (min(num_sms, tiles), 1, 1)


_GRID_SYNC: dict = {}


def _grid_sync_state(device) -> torch.Tensor:
    """``GRID_PREPASS``'s barrier state on ``device``: int32 ``[count, gen]``, zeroed once per process and device
    and reused by every launch (the barrier leaves it ready for the next one). Launches that share it must not
    overlap in time (two grids small enough to run side by side, on two streams, would mix their arrivals): one
    stream per device. Raises RuntimeError when the state does not exist yet and the current stream is capturing a
    CUDA graph (the zero fill would only be recorded, not run)."""
    key = str(device)
    if key not in _GRID_SYNC:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("GRID_PREPASS: call the op once outside CUDA-graph capture first (its grid barrier's "
                               "state is allocated and zeroed then)")
        _GRID_SYNC[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return _GRID_SYNC[key]


def _alloc_fn(size: int, align: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _prepare(q, k, v, q_weight, k_weight, o_weight, causal, eps, config, norms: bool, need_cuda: bool = True):
    """Validate and build ``(o, launches, constexpr kwargs, pre-pass)``: ``launches`` a list of ``(args, grid)``,
    one per ``kernels_triton.fna_llm.batch_slices`` slice (at most 65535 (batch, head) pairs on grid axis y).
    Q, K and V are loaded by TMA, so a 16-byte-misaligned q, k or v (a view with a storage offset) is copied to
    aligned memory first (``normfuse.validate.aligned``)."""
    check_forward_only("fna_llm.qknorm_attention" if norms else "fna_llm.attention", q=q, k=k, v=v,
                       q_weight=q_weight, k_weight=k_weight, o_weight=o_weight)
    if norms:
        eps = check_eps(eps)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if norms and (q_weight is None or k_weight is None):
        raise ValueError("qknorm_attention needs q_weight and k_weight [D]")
    B, Hq, Hkv, S, D = check_inputs(q, k, v, q_weight, k_weight, o_weight, eps)
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"the TLX kernel takes bf16/fp16 (wgmma), got {q.dtype}")
    if D not in (64, 128):
        raise ValueError(f"the TLX kernel supports head dim 64 or 128 (register budget), got D={D}")
    cfg = TilingConfig.from_dict(config)
    if need_cuda and q.device.type != "cuda":
        raise ValueError(f"inputs must be CUDA tensors (got {q.device}); TLX has no CPU mode (use compile_sm90)")
    q, k, v = aligned(q), aligned(k), aligned(v)
    k_producer = (cfg.K_NORM_PRODUCER or cfg.K_RSTD_PRODUCER) and norms  # K's norm in the kernel: no pre-pass
    o, launches, pre, prepass, materialize = plan_launches(q, k, v, q_weight, k_weight, o_weight, eps,
                                                           None if k_producer else cfg.K_NORM, norms, cfg.BLOCK_M,
                                                           fold_qw=cfg.LAZY_Q and not k_producer)
    pdl = cfg.PDL and materialize  # norms with K_NORM = materialize: the only case with a pre-pass writing k_n
    grid_prepass = cfg.GRID_PREPASS and materialize  # (GRID_PREPASS implies PERSISTENT)
    if pdl:  # the pre-pass lets the attention kernel (a programmatic dependent) launch at once
        pre = pre[:3] + ({**pre[3], "PDL_TRIGGER": True},)
    if cfg.PERSISTENT:
        # shared memory: 2 Q buffers (this tile's and the next one's) + the K/V ring, bf16/fp16
        smem = 2 * cfg.BLOCK_M * D * 2 + 2 * cfg.NUM_BUFFERS * cfg.BLOCK_N * D * 2
        if smem > SMEM_LIMIT_BYTES:
            raise ValueError(f"PERSISTENT with BLOCK_N={cfg.BLOCK_N}, NUM_BUFFERS={cfg.NUM_BUFFERS}, D={D} needs "
                             f"{smem // 1024} KiB of shared memory (two Q buffers + the K/V ring), more than the "
                             f"{SMEM_LIMIT_BYTES // 1024} KiB of one CTA: use fewer NUM_BUFFERS")
        launches = [_persistent_launch(launches, q, k, v, o, pre, prepass, materialize, cfg, _num_sms(q.device))]
        if k_producer and cfg.K_RSTD_PRODUCER:  # the producer's rstd_k scratch, NUM_BUFFERS x BLOCK_N fp32 per CTA,
            (args, grid), = launches  # in rstd_k's argument slot
            scratch = scratch_like(q, (grid[0] * cfg.NUM_BUFFERS * cfg.BLOCK_N,), torch.float32)
            launches = [(args[:7] + (scratch,) + args[8:], grid)]
        if grid_prepass:  # the kernel writes k_n itself (from the raw k, in rstd_k's argument slot): no pre-pass
            (args, grid), = launches
            launches, pre = [(args[:7] + (k,) + args[8:], grid)], None
    else:
        launches = [(args + (grid[1],), grid) for args, grid in launches]  # BH: the slice's (batch, head) pairs
    kw = dict(HEAD_DIM=D, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, NUM_BUFFERS=cfg.NUM_BUFFERS,
              NUM_MMA_GROUPS=NUM_MMA_GROUPS, CAUSAL=causal, NORM_QK=norms, K_PREPASS=prepass,
              NORM_O=o_weight is not None, PINGPONG=cfg.PINGPONG, CONSUMER_REGS=CONSUMER_REGS,
              K_MATERIALIZED=materialize or (k_producer and cfg.K_NORM_PRODUCER),
              K_NORM_PRODUCER=k_producer and cfg.K_NORM_PRODUCER, K_RSTD_PRODUCER=k_producer and cfg.K_RSTD_PRODUCER,
              PIPELINE=cfg.PIPELINE,
              PINGPONG_PV=cfg.PINGPONG_PV, LPT=cfg.LPT,
              WARP_ARRIVE=cfg.WARP_ARRIVE, PERSISTENT=cfg.PERSISTENT,
              LAZY_Q=cfg.LAZY_Q and norms and not cfg.K_RSTD_PRODUCER,
              LAZY_Q_EARLY=cfg.PINGPONG, RSTD_Q_PRODUCER=cfg.RSTD_Q_PRODUCER and norms, PDL=pdl, launch_pdl=pdl,
              GRID_PREPASS=grid_prepass, num_warps=4, num_stages=1)
    if grid_prepass:
        kw.update(SYNC=_grid_sync_state(q.device), launch_cooperative_grid=True)
    return o, launches, kw, pre


def _launch(launches, kw, pre) -> None:
    """Run ``_prepare``'s plan: the K pre-pass first when there is one (``K_NORM = "prepass"`` / ``"materialize"``:
    rstd_k or k_n; same stream, so ordered), then the attention kernel's launches with the constexprs ``kw``."""
    if pre is not None:
        pre_kernel, pre_args, pre_grid, pre_kw = pre
        pre_kernel[pre_grid](*pre_args, **pre_kw)
    triton.set_allocator(_alloc_fn)  # device-side TMA descriptors
    for args, grid in launches:
        _fna_llm_ws_kernel[grid](*args, **kw)


def qknorm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, *, causal: bool, eps: float = 1e-6, o_weight=None,
                     config=None) -> torch.Tensor:
    """``softmax(RMSNorm(q)·γq (RMSNorm(k)·γk)ᵀ / sqrt(D) [causal]) v`` [then RMSNorm(·)·γo] in one
    warp-specialized kernel, preceded (in this call) by a pre-pass kernel over K when ``K_NORM = "prepass"``
    (``_k_rstd_kernel``: rstd_k, fp32 ``[B, Hkv, S]`` scratch) or ``"materialize"`` (``_k_norm_kernel``: the
    normalized copy ``k_n = (k · rstd_k · γk).to(k.dtype)``, ``[B, Hkv, S, D]`` scratch, which the attention
    kernel then streams instead of k; one extra write + read of K, ``2·B·Hkv·S·D·2`` bytes, as an inference engine
    pays anyway when it writes the normalized K into its KV cache); with ``K_NORM_PRODUCER`` or ``K_RSTD_PRODUCER``
    there is no pre-pass (the kernel's producer normalizes each K tile, or computes its rstd_k; ``TilingConfig``);
    with ``GRID_PREPASS`` the attention kernel writes k_n itself, a cooperative launch behind a grid barrier whose
    state is one buffer per device: such calls on one device must not overlap in time (one stream), and the first
    one must run outside CUDA-graph capture (RuntimeError otherwise).

    q ``[B, Hq, S, D]``, k, v ``[B, Hkv, S, D]`` (Hq a multiple of Hkv, D in {64, 128}), weights ``[D]``, one
    dtype (bf16/fp16), contiguous CUDA tensors. Any B·Hq (one launch per slice of at most 65535 (batch, head)
    pairs), any size (64-bit per-head bases), any alignment (a 16-byte-misaligned q, k or v is copied for TMA).
    Returns o ``[B, Hq, S, D]``. Raises NotImplementedError when autograd would record through it (forward only),
    TypeError / ValueError for bad inputs (``normfuse.techniques.fna_llm.check_inputs`` plus the dtype / D limits
    above, which match the spec's CUDA contract), ``eps`` (None included) or config (e.g. ``K_NORM`` not prepass /
    inloop / materialize), ValueError for CPU tensors.
    """
    o, launches, kw, pre = _prepare(q, k, v, q_weight, k_weight, o_weight, causal, eps, config, True)
    _launch(launches, kw, pre)
    return o


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, config=None) -> torch.Tensor:
    """The same warp-specialized kernel without norms: ``softmax(q kᵀ / sqrt(D) [causal]) v`` (``K_NORM`` is
    validated and ignored)."""
    o, launches, kw, pre = _prepare(q, k, v, None, None, None, causal, 1e-6, config, False)
    _launch(launches, kw, pre)
    return o


def compile_sm90(op: str, q, k, v, q_weight=None, k_weight=None, *, eps: float = 1e-6, config=None,
                 causal: bool = True, o_norm: bool = False) -> dict:
    """Compile ``op`` ('qknorm_attention' / 'attention') for sm_90a without a GPU (needs
    ``normfuse.compile_only.install(90)``; CPU tensors, never read). Returns ``normfuse.compile_only.summarize``
    (ptx_markers: wgmma, tma_load, mbarrier, setmaxnreg, ...) plus ``pingpong_barriers`` (``bar.sync`` /
    ``bar.arrive`` on named barriers 9 / 10), ``tensormap_create`` (device-side descriptors), ``global_loads``
    (``tt.load`` ops in the TTGIR: the weight vectors and, for ``K_NORM = "prepass"``, the rstd_k vector; the
    TMA loads are not counted), ``grid``, and for 'qknorm_attention' with ``K_NORM = "prepass"`` or
    ``"materialize"`` ``k_rstd`` (the pre-pass kernel's summary: ``_k_rstd_kernel`` or ``_k_norm_kernel``) and
    ``k_prepass`` (its name); neither with ``GRID_PREPASS`` (no pre-pass kernel)."""
    from normfuse.compile_only import summarize

    if op not in ("qknorm_attention", "attention"):
        raise ValueError(f"unknown op {op!r}; choices: qknorm_attention, attention")
    norms = op == "qknorm_attention"
    D = q.shape[-1]
    if norms:
        q_weight = q_weight if q_weight is not None else torch.empty(D, dtype=q.dtype)
        k_weight = k_weight if k_weight is not None else torch.empty(D, dtype=q.dtype)
    ow = torch.empty(D, dtype=q.dtype) if (o_norm and norms) else None
    _, launches, kw, pre = _prepare(q, k, v, q_weight, k_weight, ow, causal, eps, config, norms, need_cuda=False)
    args, grid = launches[0]
    compiled = _fna_llm_ws_kernel.warmup(*args, grid=grid, **kw)
    ptx = compiled.asm["ptx"]
    out = summarize(compiled)
    out["pingpong_barriers"] = len(re.findall(r"\bbar\.(?:sync|arrive)\s+(?:9|10),", ptx))  # named barriers 9 / 10
    out["tensormap_create"] = "tensormap.replace" in ptx  # device-side TMA descriptors
    out["global_loads"] = len(re.findall(r"\btt\.load\b", compiled.asm["ttgir"]))
    out["grid"] = grid
    if pre is not None:
        pre_kernel, pre_args, pre_grid, pre_kw = pre
        out["k_rstd"] = summarize(pre_kernel.warmup(*pre_args, grid=pre_grid, **pre_kw))
        out["k_prepass"] = pre_kernel.fn.__name__
    return out


if __name__ == "__main__":  # GPU self-check: every shipped config at a few odd shapes
    from normfuse.gpu_checks import check_all

    fails = check_all("tlx", "fna_llm")
    print("\n".join(fails) or "fna_llm tlx: all shipped configs correct")
