r"""FlashNormAttention ``gdpa`` (the blog's module) in upstream Triton (3.6.0, Hopper sm_90): LayerNorm prologue,
GELU-gated attention without softmax, residual, RMSNorm and a second residual in ONE kernel.

Math (spec: ``normfuse.techniques.fna``; fp32 statistics and accumulators), per token t of sequence b::

    ln_q = LayerNorm(q[t])  over H*D;  g_h = gelu_tanh(ln_q_h @ k[b,:,h]^T) @ v[b,:,h];  r = g + ln_q
    out[t] = RMSNorm(r) over H*D + q[t]

Design (what Triton can express): one program owns ``BLOCK_M`` tokens of one sequence and ALL H heads, so both
norms' reductions over H*D are program-local — no cluster, no DSMEM (Triton has no user-visible DSMEM):

* grid ``(cdiv(max_len, BLOCK_M), B)`` (one launch per 65535 sequences, the grid's y limit); a program whose tile
  starts past its sequence's length exits at once (jagged batch, no padding work beyond the last partial tile;
  zero-length sequences launch empty programs);
* pass 1, LayerNorm statistics: loop over heads loading ``q_h [BLOCK_M, D]``: the mean, then the centred sum of
  squares (two passes over L1/L2-resident q: no ``E[x^2] - mean^2`` cancellation);
* pass 2, per head (``tl.static_range(H)``: unrolled, so Triton's software pipeliner never sees a loaded tile
  feeding both ``tl.dot`` and a row reduction, dsl-primer §0): ``ln_q_h`` recomputed from q and the statistics,
  ``S = ln_q_h @ k_h^T`` (``[BLOCK_M, Lkv]``, all of Lkv at once: the short-KV kernel, K/V never tiled), GELU in
  fp32, ``g_h = P @ v_h`` with fp32 accumulation, ``r_h = g_h + ln_q_h``; the per-token sum of ``r_h^2`` stays in
  registers; ``r_h`` is staged in the output buffer (input dtype: Triton cannot keep H register tiles in a loop or
  address shared memory, and the torch module rounds r to the same dtype);
* pass 3, after a CTA barrier (the same threads re-read what the CTA wrote): ``out_h = r_h * rstd + q_h``.

Head-loop formulations (``TilingConfig.head_loop`` / ``ln_stats``; the defaults compile the kernel above unchanged):
``_fna_gdpa_heads_kernel`` with ``head_loop="range"`` runs the three head loops as real loops (``tl.range``,
``num_stages=1``: not pipelined, dsl-primer §0) and ``ln_stats="onepass"`` folds the heads' (mean, M2) into the
LayerNorm statistics with Chan's pairwise update (q read 3 times instead of 4). Why: on the H200 (results/fna_blog/
20261130_h200) the unrolled kernel costs ~2.2x more per head at H = 4 than at H = 2/3. Compile facts (sm_90a,
``tools/fna_regs.py``): the fully unrolled straight-line code is 86 / 129 / 170 KiB of SASS at H = 2/3/4 and LLVM
merges the identical q loads of the two statistics passes (all H q slices stay live: spills 348/404/568 B at
bm64-w4); with ``range`` loops the code is ~50 KiB (bm64-w4) / ~35 KiB (bm64-w8, no spills) at any H. Hypothesis
(untested until the GPU): the cliff is instruction-cache thrashing once the code exceeds ~128 KiB (every
kernel that fell off measured >= 156 KiB, every one that did not <= 131 KiB), with spills a secondary cost.

Not expressible in Triton, hence not done: the blog's cluster of H CTAs exchanging partial sums via DSMEM, warp
specialization (load / MMA / activation / norm partitions), keeping r in shared memory, initializing the P@V
accumulator with ln_q (Triton's ``acc=`` does this, but ln_q is then needed again in fp32 for the residual anyway,
so it is added after the dot).

Rows past a sequence's length are masked (loads give 0, stores are skipped); all statistics are per token, so a
NaN/Inf in one sequence (or token) cannot reach another. Interpreter (``TRITON_INTERPRET=1``): fp16/fp32 (bf16
dot is wrong there); GELU is written with ``tl.exp`` (``tanh(u) = 2 sigmoid(2u) - 1``), ``rsqrt`` is
``tl.math.rsqrt``.

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(FlashNormAttention). Written from scratch here. Status: CPU-checked (interpreter fp16/fp32, sm_90 compile-only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from normfuse.techniques import fna as spec
from normfuse.tiling import TilingConfigBase
from normfuse.validate import MAX_GRID_YZ, check_eps, check_forward_only, chunks

FUNCTIONS = ("gdpa",)
HEAD_LOOPS = ("static", "range")
LN_STATS = ("twopass", "onepass")


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """``BLOCK_M`` tokens per program (power of two, 16..128), ``num_warps`` (4 or 8), ``num_stages`` (passed to
    the compiler; the head loops are unrolled or ``num_stages=1`` loops, so it does not pipeline them),
    ``head_loop`` ('static': ``tl.static_range``, unrolled; 'range': ``tl.range`` loops, one copy of the body),
    ``ln_stats`` ('twopass': mean then centred sum of squares; 'onepass': per-head mean/M2 combined, Chan et al.)."""

    BLOCK_M: int = 64
    num_warps: int = 4
    num_stages: int = 1
    head_loop: str = "static"
    ln_stats: str = "twopass"

    def __post_init__(self):
        if self.head_loop not in HEAD_LOOPS:
            raise ValueError(f"head_loop must be one of {HEAD_LOOPS}, got {self.head_loop!r}")
        if self.ln_stats not in LN_STATS:
            raise ValueError(f"ln_stats must be one of {LN_STATS}, got {self.ln_stats!r}")

        if self.BLOCK_M not in (16, 32, 64, 128):
            raise ValueError(f"BLOCK_M must be one of 16, 32, 64, 128, got {self.BLOCK_M}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps must be 4 or 8, got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"num_stages must be in 1..4, got {self.num_stages}")


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u), u = 0.7978845608 (x + 0.044715 x^3)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def _head_chan(q_rows, h, rmask, mean, m2, D: tl.constexpr):
    """Fold head h's ``[BLOCK_M, D]`` slice into the running per-token (mean, M2) of heads 0..h-1 (Chan, Golub,
    LeVeque's pairwise update; the slice itself is centred on its own mean: no E[x^2] - mean^2 cancellation)."""
    x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
    mh = tl.sum(x, axis=1) / D
    xc = x - mh[:, None]
    n_prev = h * D * 1.0
    frac = D / (n_prev + D)
    delta = mh - mean
    return mean + delta * frac, m2 + tl.sum(xc * xc, axis=1) + delta * delta * (n_prev * frac)


@triton.jit
def _head_gdpa(q_rows, o_rows, k_ptr, v_ptr, kv_base, h, rmask, mean, rstd_ln,
               D: tl.constexpr, LKV: tl.constexpr, HD: tl.constexpr, FP32: tl.constexpr):
    """Head h: ``r_h = gelu_tanh(ln_h @ k_h^T) @ v_h + ln_h`` staged in ``out`` (its dtype); returns sum(r_h^2)."""
    d = tl.arange(0, D)
    n = tl.arange(0, LKV)
    x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
    ln = (x - mean[:, None]) * rstd_ln[:, None]
    kt = tl.load(k_ptr + kv_base + n[None, :] * HD + h * D + d[:, None])      # [D, LKV] = k_h^T
    vh = tl.load(v_ptr + kv_base + n[:, None] * HD + h * D + d[None, :])      # [LKV, D]
    if FP32:
        s = tl.dot(ln, kt, input_precision="ieee")
        g = tl.dot(_gelu_tanh(s), vh, input_precision="ieee")
    else:
        s = tl.dot(ln.to(kt.dtype), kt)
        g = tl.dot(_gelu_tanh(s).to(vh.dtype), vh)
    r = g + ln
    tl.store(o_rows + h * D, r.to(o_rows.dtype.element_ty), mask=rmask[:, None])
    return tl.sum(r * r, axis=1)


@triton.jit
def _head_rms(q_rows, o_rows, h, rmask, rstd_rms, D: tl.constexpr):
    r = tl.load(o_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
    x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(o_rows + h * D, (r * rstd_rms[:, None] + x).to(o_rows.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _fna_gdpa_kernel(q_ptr, k_ptr, v_ptr, off_ptr, out_ptr, eps,
                     H: tl.constexpr, D: tl.constexpr, LKV: tl.constexpr, BLOCK_M: tl.constexpr,
                     FP32: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    start = tl.load(off_ptr + b).to(tl.int64)
    length = tl.load(off_ptr + b + 1).to(tl.int64) - start
    m0 = pid_m * BLOCK_M
    if m0 < length:
        rows = m0 + tl.arange(0, BLOCK_M)
        rmask = rows < length
        tok = start + rows
        d = tl.arange(0, D)
        n = tl.arange(0, LKV)
        HD: tl.constexpr = H * D
        q_rows = q_ptr + tok[:, None] * HD + d[None, :]
        o_rows = out_ptr + tok[:, None] * HD + d[None, :]
        kv_base = b.to(tl.int64) * (LKV * HD)
        # pass 1: LayerNorm statistics over H*D (two-pass)
        s1 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for h in tl.static_range(H):
            s1 += tl.sum(tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32), axis=1)
        mean = s1 / HD
        s2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for h in tl.static_range(H):
            x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32) - mean[:, None]
            s2 += tl.sum(x * x, axis=1)
        rstd_ln = tl.math.rsqrt(s2 / HD + eps)
        # pass 2: per head GDPA + residual 1; sum of r^2 in registers, r staged in out
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for h in tl.static_range(H):
            x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
            ln = (x - mean[:, None]) * rstd_ln[:, None]
            kt = tl.load(k_ptr + kv_base + n[None, :] * HD + h * D + d[:, None])      # [D, LKV] = k_h^T
            vh = tl.load(v_ptr + kv_base + n[:, None] * HD + h * D + d[None, :])      # [LKV, D]
            if FP32:
                s = tl.dot(ln, kt, input_precision="ieee")
                g = tl.dot(_gelu_tanh(s), vh, input_precision="ieee")
            else:
                s = tl.dot(ln.to(kt.dtype), kt)
                g = tl.dot(_gelu_tanh(s).to(vh.dtype), vh)
            r = g + ln
            ss += tl.sum(r * r, axis=1)
            tl.store(o_rows + h * D, r.to(out_ptr.dtype.element_ty), mask=rmask[:, None])
        rstd_rms = tl.math.rsqrt(ss / HD + eps)
        tl.debug_barrier()  # r_h written by other threads of this CTA must be visible before pass 3
        # pass 3: RMSNorm + residual 2
        for h in tl.static_range(H):
            r = tl.load(o_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
            x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32)
            tl.store(o_rows + h * D, (r * rstd_rms[:, None] + x).to(out_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _fna_gdpa_heads_kernel(q_ptr, k_ptr, v_ptr, off_ptr, out_ptr, eps,
                           H: tl.constexpr, D: tl.constexpr, LKV: tl.constexpr, BLOCK_M: tl.constexpr,
                           FP32: tl.constexpr, HEAD_LOOP: tl.constexpr, LN_STATS: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    start = tl.load(off_ptr + b).to(tl.int64)
    length = tl.load(off_ptr + b + 1).to(tl.int64) - start
    m0 = pid_m * BLOCK_M
    if m0 < length:
        rows = m0 + tl.arange(0, BLOCK_M)
        rmask = rows < length
        tok = start + rows
        d = tl.arange(0, D)
        HD: tl.constexpr = H * D
        q_rows = q_ptr + tok[:, None] * HD + d[None, :]
        o_rows = out_ptr + tok[:, None] * HD + d[None, :]
        kv_base = b.to(tl.int64) * (LKV * HD)
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        if LN_STATS == "onepass":  # LayerNorm statistics in one pass, head slices folded in one at a time
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            s2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            if HEAD_LOOP == "static":
                for h in tl.static_range(H):
                    mean, s2 = _head_chan(q_rows, h, rmask, mean, s2, D)
            else:
                for h in tl.range(0, H, num_stages=1):
                    mean, s2 = _head_chan(q_rows, h, rmask, mean, s2, D)
        else:  # two passes over q (range loops only: the static two-pass form is _fna_gdpa_kernel)
            s1 = tl.zeros([BLOCK_M], dtype=tl.float32)
            for h in tl.range(0, H, num_stages=1):
                s1 += tl.sum(tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32), axis=1)
            mean = s1 / HD
            s2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            for h in tl.range(0, H, num_stages=1):
                x = tl.load(q_rows + h * D, mask=rmask[:, None], other=0.0).to(tl.float32) - mean[:, None]
                s2 += tl.sum(x * x, axis=1)
        rstd_ln = tl.math.rsqrt(s2 / HD + eps)
        # per head GDPA + residual 1 (sum of r^2 in registers, r staged in out), then RMSNorm + residual 2
        if HEAD_LOOP == "static":
            for h in tl.static_range(H):
                ss += _head_gdpa(q_rows, o_rows, k_ptr, v_ptr, kv_base, h, rmask, mean, rstd_ln, D, LKV, HD, FP32)
            rstd_rms = tl.math.rsqrt(ss / HD + eps)
            tl.debug_barrier()  # r_h written by other threads of this CTA must be visible before it is re-read
            for h in tl.static_range(H):
                _head_rms(q_rows, o_rows, h, rmask, rstd_rms, D)
        else:  # real loops: one copy of the body; num_stages=1, no software pipelining (dsl-primer §0)
            for h in tl.range(0, H, num_stages=1):
                ss += _head_gdpa(q_rows, o_rows, k_ptr, v_ptr, kv_base, h, rmask, mean, rstd_ln, D, LKV, HD, FP32)
            rstd_rms = tl.math.rsqrt(ss / HD + eps)
            tl.debug_barrier()
            for h in tl.range(0, H, num_stages=1):
                _head_rms(q_rows, o_rows, h, rmask, rstd_rms, D)


def _prepare(q, k, v, q_offsets, max_len, eps, config):
    """Validate; return ``(kernel, out, launches, meta)`` with ``launches`` a list of ``(args, grid)``: one per
    slice of at most ``MAX_GRID_YZ`` = 65535 sequences (grid axis y; the slices share q and out, whose token
    offsets come from q_offsets, and read their own k, v and offsets)."""
    check_forward_only("fna.gdpa", q=q, k=k, v=v)
    eps = check_eps(eps)
    cfg = TilingConfig.from_dict(config)
    total_q, B, H, D, Lkv = spec.check_inputs(q, k, v, q_offsets, max_len, eps)
    if cfg.BLOCK_M * Lkv > 128 * 128 * (cfg.num_warps // 4) * 2:
        raise ValueError(f"BLOCK_M * Lkv = {cfg.BLOCK_M * Lkv} is too large a score tile for {cfg.num_warps} warps")
    out = torch.empty_like(q)
    n_m = triton.cdiv(max_len, cfg.BLOCK_M)
    launches = [((q, k, v, q_offsets, out, eps) if (b0, b1) == (0, B) else
                 (q, k[b0:b1], v[b0:b1], q_offsets[b0:b1 + 1], out, eps), (n_m, b1 - b0))
                for b0, b1 in chunks(B, MAX_GRID_YZ)]
    meta = dict(H=H, D=D, LKV=Lkv, BLOCK_M=cfg.BLOCK_M, FP32=q.dtype == torch.float32,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    kernel = _fna_gdpa_kernel  # the original formulation: shipped configs compile exactly as measured
    if cfg.head_loop != "static" or cfg.ln_stats != "twopass":
        kernel = _fna_gdpa_heads_kernel
        meta.update(HEAD_LOOP=cfg.head_loop, LN_STATS=cfg.ln_stats)
    return kernel, out, launches, meta


def gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, max_len: int, *,
         eps: float = 1e-5, config=None) -> torch.Tensor:
    """FlashNormAttention forward: ``RMSNorm(gdpa(LayerNorm(q)) + LayerNorm(q)) + q`` (norms over H*D, no affine).

    ``q [total_q, H, D]`` jagged with ``q_offsets [B+1]`` (int32/int64; lengths in [0, max_len]), ``k, v
    [B, Lkv, H, D]``; bf16/fp16 (fp32 in the interpreter); D, Lkv as ``normfuse.techniques.fna.check_inputs``
    (powers of two; D 32..128, Lkv 16..128). Any B (one launch per 65535 sequences), any size (64-bit token
    offsets), any alignment (pointer loads). Returns ``out`` like q.
    Raises NotImplementedError when autograd would record through it (forward only), TypeError/ValueError for
    invalid inputs, ``eps`` (None included) or a config that cannot serve them (see
    ``normfuse.techniques.fna.check_inputs`` and ``TilingConfig``)."""
    kernel, out, launches, meta = _prepare(q, k, v, q_offsets, max_len, eps, config)
    for args, grid in launches:
        if out.numel() and grid[0] and grid[1]:
            kernel[grid](*args, **meta)
    return out


def compile_sm90(op: str, q, k, v, q_offsets, max_len, *, eps: float = 1e-5, config=None) -> dict:
    """Compile ``op`` ('gdpa') for sm_90 without launching (``normfuse.compile_only.install(90)`` must have run;
    not under the interpreter); return ``normfuse.compile_only.summarize`` (PTX markers: wgmma, ...)."""
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, q, k, v, q_offsets, max_len, eps=eps, config=config))


def compile_sm90_kernel(op, q, k, v, q_offsets, max_len, *, eps: float = 1e-5, config=None):
    """As ``compile_sm90`` but returns Triton's ``CompiledKernel``."""
    if op not in FUNCTIONS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(FUNCTIONS)}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_sm90 cannot run under TRITON_INTERPRET=1")
    kernel, _, launches, meta = _prepare(q, k, v, q_offsets, max_len, eps, config)
    args, grid = launches[0]
    return kernel.warmup(*args, grid=grid, **meta)
