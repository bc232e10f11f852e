r"""FlashNormAttention ``gdpa`` (the blog's module) in TLX (fbtriton 3.7.4, Hopper sm_90): LayerNorm prologue,
GELU-gated attention without softmax, residual, RMSNorm and a second residual in ONE kernel: warp-specialized,
one CTA per Q tile (default), or a cluster of H CTAs, one per head, exchanging partial sums through DSMEM
(``CLUSTER=True``).

Math (spec: ``normfuse.techniques.fna``), per token t of sequence b::

    ln_q = LayerNorm(q[t]) over H*D;  g_h = gelu_tanh(ln_q_h @ k[b,:,h]^T) @ v[b,:,h];  r = g + ln_q
    out[t] = RMSNorm(r) over H*D + q[t]

Design: one CTA per (Q tile of ``BLOCK_M = 64`` tokens, sequence), owning ALL H heads (the single-CTA variant of
the blog's design; the norms reduce CTA-locally), warp-specialized as in TLX's Hopper flash-attention tutorial:

* producer (``"default"`` task): for each head h, TMA-loads ``K_h, V_h [Lkv, D]`` (2-D descriptors over ``k, v``
  viewed as ``[B*Lkv, H*D]``, box ``[Lkv, D]`` at ``[b*Lkv, h*D]``) into a ``NUM_BUFFERS``-deep shared-memory
  ring (full/empty mbarriers), so the next head's K/V arrive while this head computes;
* consumer (one warpgroup, ``registers=`` setmaxnreg): LayerNorm statistics over the H*D features from q (masked
  pointer loads: a jagged tile's rows past its sequence are not TMA-addressable without a per-sequence
  descriptor), then per head ``S = ln_q_h @ K_h^T`` (wgmma, A from registers, ``local_trans`` of the K buffer),
  GELU in fp32, ``g_h = P @ V_h`` (wgmma), ``r_h = g_h + ln_q_h``, the per-token sum of r^2 in registers; r_h is
  staged in the output (input dtype), the consumer warpgroup syncs on a named barrier (the producer never joins it)
  and writes ``r_h * rstd + q_h``.

Tiles that start past their sequence's end do nothing in either task (the same condition in both, so no barrier
is left waiting). Per-token statistics: a NaN/Inf in one sequence never reaches another. Not done in this
single-CTA kernel: the blog's ping-pong of two consumer warpgroups, q preloaded into registers across tiles, and
initializing the P@V accumulator with ln_q (TLX's ``async_dot(..., acc=)`` could, but ln_q is needed again in
fp32 for the sum of squares anyway).

**Cluster version** (``TilingConfig(CLUSTER=True, NUM_BUFFERS=1)``; the blog's design: "the heads of one Q tile
must cooperate: a cluster of H CTAs exchanging partial sums through distributed shared memory"). Grid
``(cdiv(max_len, 64) * H, B)`` launched with ``ctas_per_cga=(H, 1, 1)``: cluster ``(pid_m, b)`` owns Q tile
pid_m of sequence b and its CTA of rank h (``cluster_cta_rank``) owns head h. One 4-warp warpgroup per CTA, no
warp specialization (a CTA handles one tile and one head: the only loads worth overlapping are K_h/V_h, issued by
TMA first and in flight during step 1's statistics and exchange). Per CTA:

1. LayerNorm over H*D: per-token partials of its head's D features, ``(sum, centred sum of squares)`` in fp32,
   pushed to every peer (``async_remote_shmem_store`` = ``st.async.shared::cluster.mbarrier::complete_tx`` into
   ``mapa`` of the peer's slot, completing on the peer's receive mbarrier, armed with ``(H - 1) * 2 * 64 * 4``
   bytes), then merged in rank order with Chan's formula (``mean = sum_r s_r / HD``, ``M2 = sum_r (M2_r + D
   (s_r / D - mean)^2)``): every CTA adds the same fp32 values in the same order, so all H CTAs hold bitwise
   identical statistics (and there is no ``E[x^2] - mean^2`` cancellation); it normalizes its own head slice.
2. ``g_h = gelu_tanh(ln_q_h @ K_h^T) @ V_h`` (TMA K_h/V_h, wgmma with A from registers, as above).
3. ``r_h = g_h + ln_q_h``; per-token partial ``sum r_h^2`` exchanged the same way (a second receive barrier);
   ``out_h = r_h * rstd + q_h``. q_h is re-read (L2) and ln_q_h recomputed (same fp32 operations, same values)
   rather than kept live across the dots: that costs 64 registers per thread (ptxas spilled 80 B/thread).

Protocol: all barriers are initialized and armed, then ``fence.mbarrier_init.release.cluster`` +
``barrier.cluster`` before any remote store; each slot and each receive barrier is used once (one Q tile per
cluster, phase 0), so no buffer reuse needs guarding; every CTA waits for all H - 1 peers' bytes in both
exchanges and ends with a ``barrier.cluster`` (no CTA leaves while a peer may still store into it). The per-row
partial vectors are replicated across threads; the compiler predicates ``st.async`` to one owner per row
(``tid % 16 == 0`` for the 8 rows each such thread owns; the tests check that every ``st.async`` is predicated
and the armed byte counts), so the bytes match the armed counts. All CTAs of a cluster share (pid_m, b), so they
take the same early exit for tiles past their sequence's end (no CTA waits for a peer that left). Cluster sizes:
H in 2..8 (``CLUSTER_HEADS``; 8 is Hopper's portable limit, H = 1 needs no cluster), other H raise ValueError
(``TilingConfig.check_heads``; the spec admits only H in 2..8 today, this guards the kernel if that grows).
Non-power-of-two sizes (H = 3) are legal on Hopper -- CUDA requires only <= 8 CTAs (portable) and a grid
divisible by the cluster shape -- and compile to ``.reqnctapercluster 3, 1, 1``; a GPU run has not confirmed it.

Cost and expectation: H CTAs per Q tile (H x the CTAs, each with one head's K/V: 64 KiB of smem at D = Lkv = 128;
per-CTA K/V traffic is 1/H of the single-CTA kernel's, the total the same), q_h read twice, two cluster round
trips of ``64 x 4`` bytes per peer and statistic, two cluster barriers per tile. What it buys: the single-CTA
kernel holds all H heads in one warpgroup and on the H200 runs at 255 registers with 36 / 196 / 380 B of spill
stores per thread at H = 2 / 3 / 4 and a 3x per-token slowdown from H = 3 to H = 4; a cluster CTA holds one head
whatever H is: 206-218 registers, no spills at H = 2 / 3 / 4 (``ptxas -v``, D = Lkv = 128), ~92 KB of smem,
so 2 CTAs per SM (registers). Expected: per-token time about flat in H and below the single-CTA kernel's at
H = 3 / 4; at H = 2 the single-CTA kernel may win (small spills, no exchange or cluster barriers). Not done in
the cluster version: several Q tiles per cluster reusing K_h/V_h (a persistent walk over a sequence's tiles),
BLOCK_M = 128 per cluster, warp specialization.

CPU: TLX has no interpreter; ``compile_sm90`` compiles for sm_90a with a fake driver (tests assert wgmma, TMA,
mbarrier and setmaxnreg in the PTX; for the cluster version the cluster shape, ``mapa``, predicated ``st.async``,
``barrier.cluster``, ``fence.mbarrier_init``, the armed byte counts and, with ``ptxas -v``, no spills).

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(FlashNormAttention); TLX Hopper FA tutorial ``triton/language/extra/tlx/tutorials/hopper_fa_ws.py`` (the
producer/consumer structure); ``kernels_tlx.multi_cta`` (the DSMEM exchange and Chan's merge); Chan, Golub,
LeVeque (1979), pairwise variance update. Written here. Status: compile-only on CPU; GPU numerics open.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.tools.tensor_descriptor import TensorDescriptor

from normfuse.techniques import fna as spec
from normfuse.tiling import TilingConfigBase
from normfuse.validate import MAX_GRID_YZ, aligned, check_eps, check_forward_only, chunks

FUNCTIONS = ("gdpa",)
BLOCK_M = 64  # one consumer warpgroup: wgmma m64
LKV_MIN = 32  # smallest Lkv the kernels take (wgmma N of S = ln_q K^T); the wrapper pads Lkv = 16 up to it
CLUSTER_HEADS = (2, 3, 4, 5, 6, 7, 8)  # H with CLUSTER=True: clusters of 2..8 CTAs (Hopper's portable limit)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """``NUM_BUFFERS`` K/V ring depth (1..3, each slot holds K_h and V_h: ``2 * Lkv * D * 2`` bytes),
    ``CONSUMER_REGS`` (setmaxnreg of the consumer warpgroup: 152..240, multiple of 8), ``CLUSTER`` (False: one CTA
    per Q tile over all H heads; True: a cluster of H CTAs per Q tile, one head each, the norms' per-token partial
    sums exchanged through DSMEM -- see the module docstring). ``CLUSTER=True`` holds one head per CTA, so it needs
    ``NUM_BUFFERS=1`` (one K/V slot); it has no warp specialization (one 4-warp warpgroup, up to 255 registers per
    thread), so ``CONSUMER_REGS`` is not used there. Which H a cluster can serve: ``check_heads``."""

    NUM_BUFFERS: int = 2
    CONSUMER_REGS: int = 232
    CLUSTER: bool = False

    def __post_init__(self):
        errors = self.field_type_errors()
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))
        if not 1 <= self.NUM_BUFFERS <= 3:
            raise ValueError(f"NUM_BUFFERS must be in 1..3, got {self.NUM_BUFFERS}")
        if self.CONSUMER_REGS % 8 or not 152 <= self.CONSUMER_REGS <= 240:
            raise ValueError(f"CONSUMER_REGS must be a multiple of 8 in [152, 240], got {self.CONSUMER_REGS}")
        if self.CLUSTER and self.NUM_BUFFERS != 1:
            raise ValueError(f"CLUSTER=True holds one head per CTA (one K/V slot): NUM_BUFFERS must be 1, got "
                             f"{self.NUM_BUFFERS}")

    def check_heads(self, H: int) -> None:
        """ValueError naming the limit if this config cannot serve H heads: with CLUSTER=True a cluster of H CTAs
        is launched, so H must be in ``CLUSTER_HEADS`` (2..8: Hopper's portable cluster-size limit is 8; H = 1
        needs no cluster). Any H the spec accepts serves the single-CTA kernel."""
        if self.CLUSTER and H not in CLUSTER_HEADS:
            raise ValueError(f"CLUSTER=True launches a cluster of H CTAs (one per head); H = {H} is not supported: "
                             f"H must be in {CLUSTER_HEADS[0]}..{CLUSTER_HEADS[-1]} (8 = Hopper's portable "
                             "cluster-size limit; H = 1 needs no cluster: use CLUSTER=False)")


@triton.jit
def _gelu_tanh(x):
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def _fna_gdpa_tlx_kernel(q_ptr, k_desc, v_desc, off_ptr, out_ptr, eps,
                         H: tl.constexpr, D: tl.constexpr, LKV: tl.constexpr, BLOCK_M: tl.constexpr,
                         NUM_BUFFERS: tl.constexpr, CONSUMER_REGS: tl.constexpr):
    dt: tl.constexpr = tlx.dtype_of(k_desc)
    k_bufs = tlx.local_alloc((LKV, D), dt, NUM_BUFFERS)
    v_bufs = tlx.local_alloc((LKV, D), dt, NUM_BUFFERS)
    fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
    empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    start = tl.load(off_ptr + b).to(tl.int64)
    length = tl.load(off_ptr + b + 1).to(tl.int64) - start
    m0 = pid_m * BLOCK_M
    HD: tl.constexpr = H * D
    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: K_h, V_h by TMA, one ring slot per head
            if m0 < length:
                for h in tl.static_range(H):
                    buf = h % NUM_BUFFERS
                    ph = (h // NUM_BUFFERS) & 1
                    tlx.barrier_wait(empties[buf], ph ^ 1)  # first pass through the ring falls through
                    tlx.barrier_expect_bytes(fulls[buf], 2 * LKV * D * tlx.size_of(dt))
                    tlx.async_descriptor_load(k_desc, k_bufs[buf], [b * LKV, h * D], fulls[buf])
                    tlx.async_descriptor_load(v_desc, v_bufs[buf], [b * LKV, h * D], fulls[buf])
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS):  # consumer warpgroup
            if m0 < length:
                rows = m0 + tl.arange(0, BLOCK_M)
                rmask = rows < length
                tok = start + rows
                d = tl.arange(0, D)
                q_rows = q_ptr + tok[:, None] * HD + d[None, :]
                o_rows = out_ptr + tok[:, None] * HD + d[None, :]
                s1 = tl.zeros([BLOCK_M], dtype=tl.float32)
                for h in tl.static_range(H):
                    s1 += tl.sum(tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32), axis=1)
                mean = s1 / HD
                s2 = tl.zeros([BLOCK_M], dtype=tl.float32)
                for h in tl.static_range(H):
                    x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32) - mean[:, None]
                    s2 += tl.sum(x * x, axis=1)
                rstd_ln = tl.math.rsqrt(s2 / HD + eps)
                ss = tl.zeros([BLOCK_M], dtype=tl.float32)
                for h in tl.static_range(H):
                    buf = h % NUM_BUFFERS
                    ph = (h // NUM_BUFFERS) & 1
                    x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
                    ln = (x - mean[:, None]) * rstd_ln[:, None]
                    tlx.barrier_wait(fulls[buf], ph)
                    s = tlx.async_dot(ln.to(dt), tlx.local_trans(k_bufs[buf]))
                    s = tlx.async_dot_wait(0, s)
                    p = _gelu_tanh(s).to(dt)
                    g = tlx.async_dot(p, v_bufs[buf])
                    g = tlx.async_dot_wait(0, g)
                    tlx.barrier_arrive(empties[buf], 1)
                    r = g + ln
                    ss += tl.sum(r * r, axis=1)
                    tl.store(o_rows + h * D, r.to(dt), mask=rmask[:, None])
                rstd_rms = tl.math.rsqrt(ss / HD + eps)
                tlx.named_barrier_wait(9, 128)  # consumer warpgroup only: r_h stores visible before re-loading
                for h in tl.static_range(H):
                    r = tl.load(o_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
                    x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
                    tl.store(o_rows + h * D, (r * rstd_rms[:, None] + x).to(dt), mask=rmask[:, None])


@triton.jit
def _fna_gdpa_cluster_kernel(q_ptr, k_desc, v_desc, off_ptr, out_ptr, eps,
                             H: tl.constexpr, D: tl.constexpr, LKV: tl.constexpr, BLOCK_M: tl.constexpr):
    """Grid ``(cdiv(max_len, BLOCK_M) * H, B)``, clusters ``(H, 1, 1)``: cluster (pid_m, b) owns Q tile pid_m of
    sequence b, its CTA of rank h (``cluster_cta_rank``) owns head h. See the module docstring."""
    dt: tl.constexpr = tlx.dtype_of(k_desc)
    HD: tl.constexpr = H * D
    k_buf = tlx.local_alloc((LKV, D), dt, 1)
    v_buf = tlx.local_alloc((LKV, D), dt, 1)
    kv_bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    # slot r receives rank r's per-token partial: [0, H) sum of q_h, [H, 2H) centred sum of squares of q_h,
    # [2H, 3H) sum of r_h^2. Each slot and each receive barrier is used once (one Q tile per cluster).
    slots = tlx.local_alloc((BLOCK_M, ), tl.float32, 3 * H)
    recv = tlx.alloc_barriers(num_barriers=2, arrive_count=1)  # [0]: LayerNorm partials, [1]: RMSNorm partials
    pid_m = tl.program_id(0) // H
    b = tl.program_id(1)
    start = tl.load(off_ptr + b).to(tl.int64)
    length = tl.load(off_ptr + b + 1).to(tl.int64) - start
    m0 = pid_m * BLOCK_M
    # Every CTA of a cluster has the same (pid_m, b), hence takes the same early-exit decision: no CTA waits for
    # bytes or a cluster barrier from a peer that left.
    if m0 < length:
        h = tlx.cluster_cta_rank()
        # K_h, V_h by TMA: in flight during the LayerNorm statistics and their exchange
        tlx.barrier_expect_bytes(kv_bar[0], 2 * LKV * D * tlx.size_of(dt))
        tlx.async_descriptor_load(k_desc, k_buf[0], [b * LKV, h * D], kv_bar[0])
        tlx.async_descriptor_load(v_desc, v_buf[0], [b * LKV, h * D], kv_bar[0])
        # arm both receive barriers (their only arrival; each phase completes when the H - 1 peers' bytes landed)
        tlx.barrier_expect_bytes(recv[0], 2 * BLOCK_M * 4 * (H - 1))
        tlx.barrier_expect_bytes(recv[1], BLOCK_M * 4 * (H - 1))
        tlx.fence_mbarrier_init_cluster()
        tlx.cluster_barrier()  # every CTA's barriers initialized and armed before any remote store
        rows = m0 + tl.arange(0, BLOCK_M)
        rmask = rows < length
        tok = start + rows
        d = tl.arange(0, D)
        # per-row base offsets only: a [BLOCK_M, D] tensor of 64-bit pointers kept live across the dots would
        # cost 2 registers per element (ptxas spills)
        q_row = tok * HD + h * D
        # (1) LayerNorm over H*D: per-token (sum, centred M2) of this head's D features, exchanged, merged in rank
        # order with Chan's formula (every CTA adds the same fp32 values in the same order: bitwise identical)
        x = tl.load(q_ptr + q_row[:, None] + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
        s_h = tl.sum(x, axis=1)
        xc = x - (s_h / D)[:, None]
        m2_h = tl.sum(xc * xc, axis=1)
        tlx.local_store(slots[h], s_h)
        tlx.local_store(slots[H + h], m2_h)
        for p in tl.static_range(H):
            if p != h:
                tlx.async_remote_shmem_store(dst=slots[h], src=s_h, remote_cta_rank=p, barrier=recv[0])
                tlx.async_remote_shmem_store(dst=slots[H + h], src=m2_h, remote_cta_rank=p, barrier=recv[0])
        tlx.barrier_wait(recv[0], 0)
        total = tl.zeros([BLOCK_M], dtype=tl.float32)
        for r in tl.static_range(H):
            total += tlx.local_load(slots[r])
        mean = total / HD
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for r in tl.static_range(H):
            dm = tlx.local_load(slots[r]) / D - mean
            m2 += tlx.local_load(slots[H + r]) + D * dm * dm
        rstd_ln = tl.math.rsqrt(m2 / HD + eps)
        ln = (x - mean[:, None]) * rstd_ln[:, None]
        # (2) this head's gated attention: S = ln_q_h K_h^T, P = gelu_tanh(S), g_h = P V_h (wgmma)
        tlx.barrier_wait(kv_bar[0], 0)
        s = tlx.async_dot(ln.to(dt), tlx.local_trans(k_buf[0]))
        s = tlx.async_dot_wait(0, s)
        p_att = _gelu_tanh(s).to(dt)
        g = tlx.async_dot(p_att, v_buf[0])
        g = tlx.async_dot_wait(0, g)
        # (3) residual, RMSNorm over H*D (per-token sum of r_h^2 exchanged the same way), second residual. q_h is
        # re-read (L2 hit) and ln_q_h recomputed (same fp32 operations: the same values): keeping ln_q_h live
        # across both dots costs 64 registers per thread and makes ptxas spill.
        x = tl.load(q_ptr + q_row[:, None] + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
        r_h = g + (x - mean[:, None]) * rstd_ln[:, None]
        ss_h = tl.sum(r_h * r_h, axis=1)
        tlx.local_store(slots[2 * H + h], ss_h)
        for p in tl.static_range(H):
            if p != h:
                tlx.async_remote_shmem_store(dst=slots[2 * H + h], src=ss_h, remote_cta_rank=p, barrier=recv[1])
        tlx.barrier_wait(recv[1], 0)
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for r in tl.static_range(H):
            ss += tlx.local_load(slots[2 * H + r])
        rstd_rms = tl.math.rsqrt(ss / HD + eps)
        tl.store(out_ptr + q_row[:, None] + d[None, :], (r_h * rstd_rms[:, None] + x).to(dt), mask=rmask[:, None])
        # exit rendezvous: no CTA leaves while a peer may still store into its shared memory
        tlx.cluster_barrier()


def _prepare(q, k, v, q_offsets, max_len, eps, config):
    """Validate; return ``(out, kernel, launches, meta)`` with ``launches`` a list of ``(args, grid)``: one per
    slice of at most ``MAX_GRID_YZ`` = 65535 sequences (grid axis y; the slices share q and out, whose token
    offsets come from q_offsets, and get descriptors over their own K/V rows).

    K/V reach the kernel through TMA, so a 16-byte-misaligned k or v (a view with a storage offset) is copied to
    aligned memory first (``normfuse.validate.aligned``), and Lkv = 16 is padded with zero rows to ``LKV_MIN`` =
    32, the smallest N of the S = ln_q K^T wgmma (``async_dot`` needs N >= 32): the padded score columns are
    exactly 0, gelu_tanh(0) = 0, and the zero V rows add nothing, so the result is that of Lkv = 16."""
    check_forward_only("fna.gdpa", q=q, k=k, v=v)
    eps = check_eps(eps)
    cfg = TilingConfig.from_dict(config)
    total_q, B, H, D, Lkv = spec.check_inputs(q, k, v, q_offsets, max_len, eps)
    if q.dtype == torch.float32:
        raise TypeError("the TLX gdpa kernel takes bf16/fp16 (wgmma operands), got float32")
    if D & (D - 1) or not 32 <= D <= 128 or Lkv & (Lkv - 1) or Lkv > 256:
        raise ValueError(f"D = {D} must be a power of two in [32, 128] and Lkv = {Lkv} a power of two <= 256 "
                         "(wgmma N >= 32, TMA boxes, one warpgroup's registers)")
    cfg.check_heads(H)
    k, v = aligned(k), aligned(v)
    if Lkv < LKV_MIN:  # zero rows: score columns exactly 0, gelu_tanh(0) = 0, zero V rows (docstring above)
        pad = k.new_zeros(B, LKV_MIN - Lkv, H, D)
        k, v, Lkv = torch.cat([k, pad], 1), torch.cat([v, pad], 1), LKV_MIN
    smem = (1 if cfg.CLUSTER else cfg.NUM_BUFFERS) * 2 * Lkv * D * q.element_size()
    if smem > 200 * 1024:
        raise ValueError(f"the K/V ring needs {smem} B of shared memory (> 200 KiB); use fewer NUM_BUFFERS")
    out = torch.empty_like(q)
    n_m = triton.cdiv(max_len, BLOCK_M)
    launches = []
    for b0, b1 in chunks(B, MAX_GRID_YZ):
        k_desc = TensorDescriptor.from_tensor(k[b0:b1].view((b1 - b0) * Lkv, H * D), [Lkv, D])
        v_desc = TensorDescriptor.from_tensor(v[b0:b1].view((b1 - b0) * Lkv, H * D), [Lkv, D])
        offsets = q_offsets if (b0, b1) == (0, B) else q_offsets[b0:b1 + 1]
        grid = (n_m * H, b1 - b0) if cfg.CLUSTER else (n_m, b1 - b0)
        launches.append(((q, k_desc, v_desc, offsets, out, eps), grid))
    if cfg.CLUSTER:
        meta = dict(H=H, D=D, LKV=Lkv, BLOCK_M=BLOCK_M, num_warps=4, num_stages=1, ctas_per_cga=(H, 1, 1))
        return out, _fna_gdpa_cluster_kernel, launches, meta
    meta = dict(H=H, D=D, LKV=Lkv, BLOCK_M=BLOCK_M, NUM_BUFFERS=cfg.NUM_BUFFERS, CONSUMER_REGS=cfg.CONSUMER_REGS,
                num_warps=4, num_stages=1)
    return out, _fna_gdpa_tlx_kernel, launches, meta


def gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, max_len: int, *,
         eps: float = 1e-5, config=None) -> torch.Tensor:
    """FlashNormAttention forward: ``RMSNorm(gdpa(LayerNorm(q)) + LayerNorm(q)) + q`` (norms over H*D, no affine).

    ``q [total_q, H, D]`` jagged with ``q_offsets [B+1]`` (int32/int64; lengths in [0, max_len]), ``k, v
    [B, Lkv, H, D]``, bf16/fp16 CUDA tensors; D and Lkv as ``normfuse.techniques.fna.check_inputs`` (powers of
    two; D 32..128, Lkv 16..128: Lkv = 16 is padded to 32 with zero rows). Any B (one launch per 65535
    sequences), any size (64-bit token offsets), any alignment (misaligned k/v are copied for TMA). ``config``: a
    ``TilingConfig``, a dict of its fields or None; ``CLUSTER=True`` runs a cluster of H CTAs per Q tile (H in
    ``CLUSTER_HEADS`` = 2..8). Returns ``out`` like q. Raises NotImplementedError when autograd would record
    through it (forward only), TypeError/ValueError for invalid inputs, ``eps`` (None included) or config
    (ValueError for CLUSTER=True with H outside 2..8)."""
    out, kernel, launches, meta = _prepare(q, k, v, q_offsets, max_len, eps, config)
    if out.numel():
        for args, grid in launches:
            kernel[grid](*args, **meta)
    return out


def compile_sm90(op: str, q, k, v, q_offsets, max_len, *, eps: float = 1e-5, config=None) -> dict:
    """Compile ``op`` ('gdpa') for sm_90a without launching (``normfuse.compile_only.install(90)`` must have run);
    return ``normfuse.compile_only.summarize`` (PTX markers: wgmma, cp.async.bulk.tensor, mbarrier, setmaxnreg)."""
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, q, k, v, q_offsets, max_len, eps=eps, config=config))


def compile_sm90_kernel(op, q, k, v, q_offsets, max_len, *, eps: float = 1e-5, config=None):
    """As ``compile_sm90`` but returns Triton's ``CompiledKernel``."""
    if op not in FUNCTIONS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(FUNCTIONS)}")
    _, kernel, launches, meta = _prepare(q, k, v, q_offsets, max_len, eps, config)
    args, grid = launches[0]
    return kernel.warmup(*args, grid=grid, **meta)
