r"""FlashNormAttention, LLM variant, in upstream Triton (3.6, Hopper sm_90): per-head RMSNorm of Q and K (learned
γ, Qwen3 / OLMo2 style) fused into a FlashAttention-2 forward (online softmax, fp32 state, causal or not, GQA),
with an optional per-head RMSNorm of the output. Math and cost model: ``normfuse/techniques/fna_llm.py``.

Three ways to normalize K (``TilingConfig.K_NORM``), all inside the public ``qknorm_attention`` call:

* ``"prepass"`` (default), the algebraic form
  ``<rmsnorm(q_i)·γq, rmsnorm(k_j)·γk> = rstd_q,i · rstd_k,j · Σ_d (q_i,d γq_d γk_d) k_j,d``:
  a pre-pass kernel (``_k_rstd_kernel``, ``RSTD_BLOCK_ROWS`` K rows per program) reads K once and writes
  ``rstd_k = 1 / sqrt(mean_d(k²) + eps)`` in fp32, ``[B, Hkv, S]`` (4 bytes per key, not a normalized copy of K:
  ~1/64 of K's bytes at D = 128 bf16); the attention kernel normalizes the Q tile with ``γq·γk`` folded in, feeds
  the *raw* K tile to ``tl.dot`` and multiplies the score columns by ``rstd_k[n] · log2(e)/sqrt(D)`` (a separate
  ``[BLOCK_N]`` fp32 load per K tile) before the mask and the online softmax;
* ``"inloop"`` (the previous code path): every K tile ``[BLOCK_N, D]`` of the KV loop is normalized in fp32 as it
  streams in (row sum of squares, ``* rstd * k_weight``), rounded to the input dtype and fed to ``tl.dot``: redone
  by each of the ``cdiv(S, BLOCK_M)`` Q tiles that stream it;
* ``"materialize"``: a pre-pass kernel (``_k_norm_kernel``) writes the normalized copy
  ``k_n = RMSNorm(k)·γk`` in the input dtype, ``[B, Hkv, S, D]``, and the attention kernel normalizes only the Q
  tile (``γq``) and streams ``k_n`` exactly like ``attention``: the KV loop does no K work at all. Cost: one extra
  write and read of K (``2·B·Hkv·S·D`` elements), which an inference engine pays anyway when it writes the
  normalized K into its KV cache (the K norm then lives in the cache-write kernel, not in attention).

``attention`` (no norms) ignores ``K_NORM``.

Kernel (one program per (Q tile, batch x query head); grid ``(cdiv(S, BLOCK_M), B * Hq)``, one launch per
``batch_slices`` slice of at most 65535 (batch, head) pairs, the grid's y limit):

* the Q tile ``[BLOCK_M, D]`` is loaded once, normalized in fp32 (``rsqrt(mean(q²) + eps) * q_weight``, times
  ``k_weight`` for prepass) and rounded to the input dtype: once per Q tile; the scores get ``log2(e) / sqrt(D)``
  in fp32 (softmax in base 2);
* the K tile feeds the dot: raw (prepass; the rstd_k vector is its own load, so no loaded tile feeds both a dot
  and a reduction: dsl-primer §0 blocker 1 cannot apply), the pre-normalized k_n (materialize: the loop is the
  plain attention loop) or normalized in the loop (inloop: the loaded tile feeds the
  reduction and the *normalized copy* feeds the dot, the pattern of the Helion QK-norm attention that is correct
  on the H200 at ``num_stages=3``; the GPU check ``normfuse.gpu_checks`` verifies every shipped config);
* loads: masked pointer loads, or (``TilingConfig.TMA``) device-side TMA descriptors ``[S, D]`` per (batch,
  head), whose out-of-range rows read as zeros; the rstd_k vector is a masked pointer load (``other=0``: masked
  columns score 0 before the ``-inf`` mask), pipelined by the compiler (cp.async) like the K/V tiles;
* the KV loop is split in two: full blocks below the diagonal (causal) or below ``S // BLOCK_N * BLOCK_N`` are
  processed without masks, the rest with the causal / sequence-end mask (FlashAttention tutorial's two stages);
* epilogue: ``acc / l``, optional output RMSNorm with ``o_weight`` in fp32, masked store.

``attention`` is the same kernel without any norm (the "same DSL without norms" baseline).

What Triton could express: the prepass and materialize forms need nothing beyond a second plain kernel (and, for
prepass, a column scale); the K tile then goes straight from its (TMA or cp.async) shared-memory buffer to wgmma as
in plain attention. What it could not: sharing a *normalized* K tile across the CTAs of one launch (hence the
pre-pass, one extra read of K for prepass, one extra read and write for materialize; prepass:
~0.1% (S = 16384, non-causal) to ~1% (S = 4096, causal) of the attention time at B = 8, Hq = 32); warp
specialization or an explicit ping-pong of the two softmax/GEMM phases on Hopper (left to the compiler's
pipeliner; TLX has it).

Numerics: norm statistics (rstd_q, rstd_k), softmax max/sum and the accumulator in fp32. Prepass rounds
``q·rstd_q·γq·γk`` once and never rounds a normalized K (inloop rounds both normalized operands); both are within the
flash-attention tolerance. One program reads one (batch, head), a pre-pass row reads one K row, and masked loads
read zeros past the sequence end, so a NaN/Inf in one batch element cannot reach another. Causal mask
top-left aligned (query i sees keys 0..i). Interpreter (``TRITON_INTERPRET=1``): fp16/fp32 only (bf16 ``tl.dot``
is wrong there, dsl-primer blocker 5); fp32 uses ``input_precision="ieee"``.

Sources: FlashAttention-2 (https://arxiv.org/abs/2307.08691); Triton's fused-attention tutorial
(https://triton-lang.org/main/getting-started/tutorials/06-fused-attention.html); the PyTorch blog "Towards
Free Normalization: Fusing Normalization into GEMM and Attention Kernels" (FlashNormAttention; and its Lazy
Pre-Norm, the per-row rstd factored out of a GEMM and applied to its output, which the prepass form applies to
the columns of QKᵀ), https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
FlashNorm (deferred RMS normalization, γ folded into the other operand), https://arxiv.org/abs/2407.09577 .
Code written for this repo.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from kernels_triton.lazy_prenorm import _fix_interpreter_scalar_index
from normfuse.scratch import scratch_like
from normfuse.techniques.fna_llm import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import MAX_GRID_YZ, aligned, check_eps, check_forward_only, chunks

LOG2E = 1.4426950408889634
K_NORM_MODES = ("prepass", "inloop", "materialize")
RSTD_BLOCK_ROWS = 64  # K rows per program of the K pre-pass (rstd_k or k_n)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if _interpreting():
    _fix_interpreter_scalar_index()  # triton#9171 under numpy >= 2.4 (see kernels_triton/lazy_prenorm.py)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """``BLOCK_M`` query rows x ``BLOCK_N`` keys per step (powers of 2, 16..256), ``num_warps``, ``num_stages``;
    ``TMA``: load Q/K/V through device-side tensor descriptors per (batch, head) (Hopper TMA, zero fill past S)
    instead of masked pointer loads. ``K_NORM``: ``"prepass"`` (a pre-pass kernel computes ``rstd_k``; the KV loop
    feeds the raw K tile to the dot and scales the score columns), ``"inloop"`` (every K tile is normalized in
    the KV loop) or ``"materialize"`` (a pre-pass kernel writes the normalized K; the KV loop is plain attention);
    ignored by ``attention`` (no norms)."""

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 8
    num_stages: int = 2
    TMA: bool = False
    K_NORM: str = "prepass"

    def __post_init__(self):
        for name in ("BLOCK_M", "BLOCK_N"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v > 256 or v & (v - 1):
                raise ValueError(f"{name} must be a power of 2 in [16, 256], got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages must be in 1..6, got {self.num_stages!r}")
        if not isinstance(self.TMA, bool):
            raise ValueError(f"TMA must be a bool, got {self.TMA!r}")
        if self.K_NORM not in K_NORM_MODES:
            raise ValueError(f"K_NORM must be one of {', '.join(K_NORM_MODES)}, got {self.K_NORM!r}")


@triton.jit
def _k_rstd_kernel(K, RSTD, R, eps, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr):
    """Pre-pass: ``rstd[r] = 1 / sqrt(mean_d(k[r, d]²) + eps)`` in fp32 for the ``R = B * Hkv * S`` rows of K."""
    offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(K + offs_r[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_r[:, None] < R, other=0.0)
    kf = k.to(tl.float32)
    tl.store(RSTD + offs_r, 1.0 / tl.sqrt(tl.sum(kf * kf, 1) / HEAD_DIM + eps), mask=offs_r < R)


@triton.jit
def _k_norm_kernel(K, KW, KN, R, eps, QW, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                   FOLD_QW: tl.constexpr = False, PDL_TRIGGER: tl.constexpr = False):
    """Pre-pass (``K_NORM = "materialize"``): ``k_n[r] = k[r] * rstd[r] * k_weight`` rounded to K's dtype, rstd in
    fp32, for the ``R = B * Hkv * S`` rows of K; ``FOLD_QW``: times ``q_weight`` too (the weight product in fp32;
    the TLX ``LAZY_Q`` kernel then never scales Q's columns); ``PDL_TRIGGER``: first lets the next grid (the TLX
    attention kernel, launched as a programmatic dependent, ``PDL``) start, which waits for this grid before it
    reads k_n."""
    if PDL_TRIGGER:
        gdc_launch_dependents()
    _k_norm_rows(K, KW, KN, QW, tl.program_id(0), R, eps, HEAD_DIM, BLOCK_R, FOLD_QW)


@triton.jit
def _k_norm_rows(K, KW, KN, QW, blk, R, eps, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                 FOLD_QW: tl.constexpr):
    """Rows ``[blk · BLOCK_R, (blk + 1) · BLOCK_R)`` of K (of R): ``k_n = (k · rstd_k · γk [· γq])`` rounded to
    k_n's dtype, rstd_k and the weight product in fp32 (the body of ``_k_norm_kernel``, also run inside the TLX
    attention kernel by ``GRID_PREPASS``). The weights are loaded after the K rows, so that the rows' loads go out
    first (the pre-pass is latency-bound at short sequences). With the same ``BLOCK_R`` and 4 warps the compiler
    gives both callers the same layouts, hence the same k_n bit for bit."""
    offs_r = blk.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, HEAD_DIM)
    off = offs_r[:, None] * HEAD_DIM + offs_d[None, :]
    kf = tl.load(K + off, mask=offs_r[:, None] < R, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(kf * kf, 1) / HEAD_DIM + eps)
    kw = tl.load(KW + offs_d).to(tl.float32)
    if FOLD_QW:
        kw = kw * tl.load(QW + offs_d).to(tl.float32)
    tl.store(KN + off, (kf * rstd[:, None] * kw[None, :]).to(KN.dtype.element_ty), mask=offs_r[:, None] < R)


@triton.jit
def _kv_steps(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, kw, rstd_base, offs_m, offs_d, S, eps, qk_scale,
              lo, hi, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
              K_INLOOP: tl.constexpr, K_PREPASS: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr):
    """KV blocks [lo, hi): S = q kᵀ (K normalized first if K_INLOOP; columns scaled by the pre-pass rstd_k if
    K_PREPASS), online softmax, acc += p v."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if K_PREPASS:  # rstd_k of this tile's keys (fp32): a separate BLOCK_N-vector load, never part of the K tile
            if MASK:
                rstd_k = tl.load(rstd_base + offs_n, mask=offs_n < S, other=0.0)
            else:
                rstd_k = tl.load(rstd_base + offs_n)
        kv_off = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        if TMA:  # rows past S read as zeros (the descriptor is [S, D] of this (batch, KV head))
            k = desc_k.load([start_n, 0])
        elif MASK:
            k = tl.load(k_base + kv_off, mask=offs_n[:, None] < S, other=0.0)
        else:
            k = tl.load(k_base + kv_off)
        if K_INLOOP:  # once per K tile load, in fp32; the normalized copy (not the raw load) feeds the dot
            kf = k.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(kf * kf, 1) / HEAD_DIM + eps)
            k = (kf * rstd[:, None] * kw[None, :]).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # K_PREPASS: the raw K tile feeds only the dot
        if K_PREPASS:  # column scale rstd_k[n] · log2(e)/sqrt(D), before the mask (masked columns: rstd_k = 0)
            qk = qk * (rstd_k * qk_scale)[None, :]
        if MASK:
            valid = offs_n[None, :] < S
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        if K_PREPASS:
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_ij[:, None])
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if TMA:
            v = desc_v.load([start_n, 0])
        elif MASK:
            v = tl.load(v_base + kv_off, mask=offs_n[:, None] < S, other=0.0)
        else:
            v = tl.load(v_base + kv_off)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _fna_llm_fwd(Q, K, V, O, QW, KW, OW, RSTD_K, S, HQ, GROUP, eps, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 NORM_QK: tl.constexpr, K_PREPASS: tl.constexpr, NORM_O: tl.constexpr, PRECISION: tl.constexpr,
                 TMA: tl.constexpr, K_NORMED: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    hkv = b * (HQ // GROUP) + h // GROUP
    q_base = Q + bh.to(tl.int64) * S * HEAD_DIM
    k_base = K + hkv.to(tl.int64) * S * HEAD_DIM
    v_base = V + hkv.to(tl.int64) * S * HEAD_DIM
    o_base = O + bh.to(tl.int64) * S * HEAD_DIM
    rstd_base = RSTD_K + hkv.to(tl.int64) * S  # [B * Hkv, S] fp32 (K_PREPASS only)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if TMA:  # device-side descriptors per (batch, head): [S, D], out-of-range rows read as zeros
        desc_k = tl.make_tensor_descriptor(k_base, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(v_base, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_q = tl.make_tensor_descriptor(q_base, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        q = desc_q.load([pid_m * BLOCK_M, 0])
    else:
        desc_k = k_base  # unused
        desc_v = v_base
        q = tl.load(q_base + q_off, mask=offs_m[:, None] < S, other=0.0)
    qf = q.to(tl.float32)
    if NORM_QK:  # once per Q tile
        qw = tl.load(QW + offs_d).to(tl.float32)
        kw = tl.load(KW + offs_d).to(tl.float32)
        if K_PREPASS:  # γk folded into Q: q_n·k_n = rstd_k · Σ_d (q_n,d γk_d) k_d
            qw = qw * kw
        qf = qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) / HEAD_DIM + eps))[:, None] * qw[None, :]
    else:
        kw = tl.zeros([HEAD_DIM], dtype=tl.float32)
    q = qf.to(q.dtype)  # rounded like the unfused path; the scale log2(e)/sqrt(D) is applied to S in fp32
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    full_end = (S // BLOCK_N) * BLOCK_N  # blocks below this need no sequence-end mask
    if CAUSAL:
        hi = (pid_m + 1) * BLOCK_M
        if hi > S:
            hi = S
        mid = (pid_m * BLOCK_M // BLOCK_N) * BLOCK_N  # below the diagonal: no mask
        if mid > full_end:
            mid = full_end
    else:
        hi = S
        mid = full_end
    K_INLOOP: tl.constexpr = NORM_QK and not K_PREPASS and not K_NORMED  # K_NORMED: K holds k_n (materialize)
    acc, l_i, m_i = _kv_steps(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, kw, rstd_base, offs_m, offs_d, S, eps,
                              qk_scale, 0, mid, HEAD_DIM, BLOCK_N, CAUSAL, False, K_INLOOP, K_PREPASS, PRECISION, TMA)
    acc, l_i, m_i = _kv_steps(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, kw, rstd_base, offs_m, offs_d, S, eps,
                              qk_scale, mid, hi, HEAD_DIM, BLOCK_N, CAUSAL, True, K_INLOOP, K_PREPASS, PRECISION, TMA)
    acc = acc / l_i[:, None]
    if NORM_O:
        ow = tl.load(OW + offs_d).to(tl.float32)
        acc = acc * (1.0 / tl.sqrt(tl.sum(acc * acc, 1) / HEAD_DIM + eps))[:, None] * ow[None, :]
    tl.store(o_base + q_off, acc.to(O.dtype.element_ty), mask=offs_m[:, None] < S)


def k_prepass(k: torch.Tensor, k_weight, eps: float, k_norm, fold_q_weight=None):
    """The K pre-pass launch of ``K_NORM = k_norm`` (plain Triton, also used by ``kernels_tlx.fna_llm``): returns
    ``(pre, rstd_k, k_n)`` with ``pre = (kernel, args, grid, launch kwargs)`` to run before the attention kernel,
    ``rstd_k`` a fresh fp32 ``[B * Hkv * S]`` buffer for ``"prepass"`` (``_k_rstd_kernel``) and ``k_n`` a fresh
    ``[B, Hkv, S, D]`` tensor like ``k`` for ``"materialize"`` (``_k_norm_kernel``), the other two None; all three
    None for ``"inloop"`` or ``k_norm=None`` (attention without norms). ``k`` contiguous ``[B, Hkv, S, D]``.
    ``fold_q_weight`` (a ``[D]`` q_weight, materialize only; ValueError otherwise): k_n carries γq as well (TLX
    ``LAZY_Q``)."""
    if fold_q_weight is not None and k_norm != "materialize":
        raise ValueError(f"fold_q_weight needs k_norm='materialize' (γq is folded into the normalized K), got "
                         f"{k_norm!r}")
    if k_norm not in ("prepass", "materialize"):
        return None, None, None
    B, Hkv, S, D = k.shape
    R = B * Hkv * S
    grid = (triton.cdiv(R, RSTD_BLOCK_ROWS), 1, 1)
    kw = dict(HEAD_DIM=D, BLOCK_R=RSTD_BLOCK_ROWS, num_warps=4, num_stages=1)
    if k_norm == "prepass":  # one fp32 value per K row, not a normalized copy of K
        rstd_k = scratch_like(k, (R,), torch.float32)
        return (_k_rstd_kernel, (k, rstd_k, R, float(eps)), grid, kw), rstd_k, None
    k_n = scratch_like(k)
    fold = fold_q_weight is not None
    kw["FOLD_QW"] = fold
    args = (k, k_weight, k_n, R, float(eps), fold_q_weight if fold else k_weight)
    return (_k_norm_kernel, args, grid, kw), None, k_n


def batch_slices(B: int, Hq: int) -> list[tuple[int, int]]:
    """Batch ranges ``[b0, b1)`` of one launch each: at most ``MAX_GRID_YZ`` = 65535 (batch, query head) pairs
    per launch (grid axis y, the CUDA limit); ``[(0, B)]`` whenever B * Hq fits. ValueError when Hq alone exceeds
    it. Shared with ``kernels_tlx.fna_llm``."""
    if Hq > MAX_GRID_YZ:
        raise ValueError(f"Hq = {Hq} query heads exceed the grid's y limit {MAX_GRID_YZ}")
    return chunks(B, MAX_GRID_YZ // Hq)


def plan_launches(q, k, v, q_weight, k_weight, o_weight, eps: float, k_norm, norms: bool, BLOCK_M: int,
                  fold_qw: bool = False):
    """The host side shared by the Triton and TLX attention wrappers (same kernel argument order): the output
    ``o``, the K pre-pass (``k_prepass`` with ``k_norm``, None without norms) and one ``(args, grid)`` launch per
    ``batch_slices`` slice — the tensors themselves for the usual single launch, views of q, k, v, o and rstd_k
    otherwise. Returns ``(o, launches, pre, prepass, materialize)``; materialize: the kernel reads the normalized
    K (γ_K included; ``fold_qw`` with ``norms``: γq too, ``k_prepass(fold_q_weight=q_weight)``) written by the
    pre-pass instead of K."""
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    o = torch.empty_like(q)
    dummy = q  # never read when the matching flag is off
    pre, rstd_k, k_n = k_prepass(k, k_weight, eps, k_norm if norms else None,
                                 q_weight if (norms and fold_qw) else None)
    prepass, materialize = rstd_k is not None, k_n is not None
    k = k_n if materialize else k
    launches = []
    for b0, b1 in batch_slices(B, Hq):
        whole = (b0, b1) == (0, B)
        qs, ks, vs, os_ = (t if whole else t[b0:b1] for t in (q, k, v, o))
        rstd = rstd_k if whole or not prepass else rstd_k[b0 * Hkv * S:b1 * Hkv * S]
        args = (qs, ks, vs, os_, q_weight if norms else dummy, k_weight if norms else dummy,
                o_weight if o_weight is not None else dummy, rstd if prepass else dummy, S, Hq, Hq // Hkv,
                float(eps), LOG2E / math.sqrt(D))
        launches.append((args, (triton.cdiv(S, BLOCK_M), (b1 - b0) * Hq, 1)))
    return o, launches, pre, prepass, materialize


def _prepare(q, k, v, q_weight, k_weight, o_weight, causal, eps, config, norms: bool, launch: bool = True):
    """Validate and build (o, launches, constexpr kwargs, pre-pass): ``launches`` a list of ``(args, grid)``, one
    per ``batch_slices`` slice (views of q, k, v, o and rstd_k), pre-pass None or (kernel, args, grid, kwargs):
    ``_k_rstd_kernel`` (``norms`` and ``K_NORM = "prepass"``) or ``_k_norm_kernel`` (``"materialize"``; the
    attention args then read its output ``k_n``); ``attention`` ignores K_NORM. With ``TMA`` a 16-byte-misaligned
    q, k or v is copied to aligned memory first (the descriptors need aligned bases)."""
    check_forward_only("fna_llm.qknorm_attention" if norms else "fna_llm.attention", q=q, k=k, v=v,
                       q_weight=q_weight, k_weight=k_weight, o_weight=o_weight)
    if norms:
        eps = check_eps(eps)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if norms and (q_weight is None or k_weight is None):
        raise ValueError("qknorm_attention needs q_weight and k_weight [D]")
    B, Hq, Hkv, S, D = check_inputs(q, k, v, q_weight, k_weight, o_weight, eps)
    cfg = TilingConfig.from_dict(config)
    if launch and q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"inputs must be CUDA tensors (got {q.device}); CPU tensors run only under TRITON_INTERPRET=1")
    if cfg.TMA:
        q, k, v = aligned(q), aligned(k), aligned(v)
    o, launches, pre, prepass, materialize = plan_launches(q, k, v, q_weight, k_weight, o_weight, eps, cfg.K_NORM,
                                                           norms, cfg.BLOCK_M)
    kw = dict(HEAD_DIM=D, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, CAUSAL=causal, NORM_QK=norms,
              K_PREPASS=prepass, NORM_O=o_weight is not None,
              PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
              TMA=cfg.TMA, K_NORMED=materialize, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.TMA and launch:
        triton.set_allocator(_alloc_fn)  # scratch for the device-side descriptors
    return o, launches, kw, pre


def _alloc_fn(size: int, align: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cpu" if _interpreting() else "cuda")


def qknorm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, *, causal: bool, eps: float = 1e-6, o_weight=None,
                     config=None) -> torch.Tensor:
    """``softmax(RMSNorm(q)·γq (RMSNorm(k)·γk)ᵀ / sqrt(D) [causal]) v`` [then RMSNorm(·)·γo]: one attention
    kernel, preceded by a pre-pass kernel: rstd_k (fp32 ``[B, Hkv, S]`` scratch) when ``K_NORM = "prepass"``, the
    normalized K copy (``[B, Hkv, S, D]`` in q's dtype) when ``"materialize"``; none for ``"inloop"``.

    q ``[B, Hq, S, D]``, k, v ``[B, Hkv, S, D]`` (Hq a multiple of Hkv; D in {16..256}, powers of 2), weights
    ``[D]``, all one dtype (bf16 on the GPU; fp16/fp32 under the interpreter), contiguous. Returns o ``[B, Hq,
    S, D]`` in q's dtype. ``config``: ``TilingConfig`` or mapping. Any B·Hq (one launch per slice of at most
    65535 (batch, head) pairs: ``batch_slices``), any size (64-bit per-head bases), any alignment (``TMA``
    configs copy a 16-byte-misaligned q, k or v first). Raises NotImplementedError when autograd would record
    through it (forward only), TypeError / ValueError for bad inputs (``normfuse.techniques.fna_llm.check_inputs``),
    ``eps`` (None included) or config (e.g. ``K_NORM`` not in ``K_NORM_MODES``), ValueError for CPU tensors
    outside the interpreter.
    """
    o, launches, kw, pre = _prepare(q, k, v, q_weight, k_weight, o_weight, causal, eps, config, True)
    if pre is not None:  # K_NORM = prepass / materialize: first (same stream, so ordered before the attention)
        pre_kernel, pre_args, pre_grid, pre_kw = pre
        pre_kernel[pre_grid](*pre_args, **pre_kw)
    for args, grid in launches:
        _fna_llm_fwd[grid](*args, **kw)
    return o


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, config=None) -> torch.Tensor:
    """The same flash attention without any norm: ``softmax(q kᵀ / sqrt(D) [causal]) v`` (shapes, dtypes and
    errors as ``qknorm_attention``; ``K_NORM`` is validated and ignored)."""
    o, launches, kw, _ = _prepare(q, k, v, None, None, None, causal, 1e-6, config, False)
    for args, grid in launches:
        _fna_llm_fwd[grid](*args, **kw)
    return o


def compile_sm90(op: str, q, k, v, q_weight=None, k_weight=None, *, eps: float = 1e-6, config=None,
                 causal: bool = True, o_norm: bool = False) -> dict:
    """Compile ``op`` ('qknorm_attention' or 'attention') for sm_90 without launching (needs
    ``normfuse.compile_only.install(90)``, no ``TRITON_INTERPRET``); CPU tensors, never read. Returns
    ``normfuse.compile_only.summarize`` of the attention kernel, plus ``k_rstd`` (the pre-pass's summary) for
    'qknorm_attention' with ``K_NORM = "prepass"``, ``k_norm`` (the normalized-K pre-pass) with ``"materialize"``."""
    from normfuse.compile_only import summarize

    if op not in ("qknorm_attention", "attention"):
        raise ValueError(f"unknown op {op!r}; choices: qknorm_attention, attention")
    if _interpreting():
        raise RuntimeError("compile_sm90 cannot run under TRITON_INTERPRET=1")
    norms = op == "qknorm_attention"
    D = q.shape[-1]
    if norms:
        q_weight = q_weight if q_weight is not None else torch.empty(D, dtype=q.dtype)
        k_weight = k_weight if k_weight is not None else torch.empty(D, dtype=q.dtype)
    ow = torch.empty(D, dtype=q.dtype) if (o_norm and norms) else None
    _, launches, kw, pre = _prepare(q, k, v, q_weight, k_weight, ow, causal, eps, config, norms, launch=False)
    args, grid = launches[0]
    out = summarize(_fna_llm_fwd.warmup(*args, grid=grid, **kw))
    if pre is not None:  # the pre-pass: "k_rstd" (prepass) or "k_norm" (materialize)
        pre_kernel, pre_args, pre_grid, pre_kw = pre
        key = "k_rstd" if pre_kernel is _k_rstd_kernel else "k_norm"
        out[key] = summarize(pre_kernel.warmup(*pre_args, grid=pre_grid, **pre_kw))
    return out


if __name__ == "__main__":  # GPU self-check: every shipped config at a few odd shapes
    from normfuse.gpu_checks import check_all

    fails = check_all("triton", "fna_llm")
    print("\n".join(fails) or "fna_llm triton: all shipped configs correct")
