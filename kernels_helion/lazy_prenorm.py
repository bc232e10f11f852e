r"""Helion kernels for the Lazy Pre-Norm technique (RMSNorm or LayerNorm -> GEMM) and the plain GEMM it is compared
against.

``lazy_rmsnorm_matmul(a, b_folded)`` computes ``C = rsqrt(mean(a^2, -1) + eps)[:, None] * (a @ b_folded)``:
gamma has been folded into ``b_folded`` beforehand (``normfuse.techniques.lazy_prenorm.fold_gamma``); the kernel
accumulates the fp32 per-row sum of squares of ``a`` in the same K loop that feeds the MMA, and scales the fp32
accumulator by ``rstd`` in the epilogue. ``matmul(a, b)`` is the same kernel without the statistic, the GEMM
baseline. Math and tolerance: ``normfuse/techniques/lazy_prenorm.py``.

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
the kernel structure follows Helion's examples (``matmul.py``, ``matmul_layernorm.py``),
https://github.com/pytorch/helion/tree/main/examples . The code here is our own.

**The sum-of-squares formulation** (``TilingConfig.sumsq``). Triton's software pipeliner miscompiles a loop in
which *one* loaded tile feeds both ``tl.dot`` and a row reduction once ``num_stages >= 2..3`` (DSL primer,
blocker 1; triton-lang/triton#6691). Three formulations are offered so the GPU run can time them and record which
ones stay correct when pipelined:

* ``"shared_tile"`` -- the naive form: ``x = a[tile_m, tile_k]`` feeds both ``torch.addmm`` and ``sum(x*x)``.
  Known correct only with ``num_stages=1``. The sm_90 TTGIR (triton 3.6, compile-only) shows the likely cause:
  the A tile's TMA ring gets ``num_stages - 1`` shared-memory slots while B's gets ``num_stages`` (the plain
  GEMM gives both ``num_stages``); the wgmma is async with one group left in flight
  (``warp_group_dot_wait {pendings = 1}``) and the TMA for iteration ``i + num_stages - 1`` is issued into the
  slot that the still-running wgmma of iteration ``i`` reads: a write-after-read race on A. (Inference from
  the IR; the GPU run decides.)
* ``"reload"`` -- the A tile is loaded a second time for the statistic (``a[tile_m, tile_k]`` written twice in
  the loop body), and the two loads are kept *different ops* so that Triton's CSE cannot merge them back into one
  (it does merge identical ones: the TTGIR then equals ``"shared_tile"``). Two handles do that: the statistic's
  load has its own ``indexing`` entry (``sumsq_indexing``, default ``"pointer"``, so with TMA operands the dot
  reads a descriptor load and the statistic a ``tl.load``), and its own cache-eviction hint
  (``sumsq_eviction``, default ``"first"`` for reload), which also keeps two *pointer* loads apart -- needed
  because Helion silently falls back from ``tensor_descriptor`` to ``pointer`` when a TMA box would exceed the
  tensor (e.g. M < BLOCK_M). Descriptor loads drop the hint, so both loads as ``tensor_descriptor`` is rejected.
  With TMA operands the TTGIR keeps A's ring at ``num_stages`` slots, exactly as in the plain GEMM, and the
  statistic comes from a plain, unpipelined register load (``tt.load``; an L2 hit, since TMA fetched the same
  bytes a few iterations earlier) whose latency overlaps the in-flight wgmma. Costs that second read of A.
* ``"prepass"`` -- a separate device loop over K before the MMA loop accumulates the statistic; the MMA loop is
  then a plain GEMM loop (same TTGIR ring as the GEMM). No loop contains both a dot and a reduction, so the
  pipeliner bug has nothing to hit. Costs a second, unpipelined pass over the A row block per output tile
  (``sumsq_block_k`` sets its K step; ``sumsq_eviction`` defaults to ``"last"`` here, so the MMA loop's TMA
  loads find A in L2).
* ``"rowblock"`` -- the grid tiles **M only** (``for tile_m in hl.tile(m)``, one program per BLOCK_M row block).
  A dot-free device loop over K computes the fp32 sum of squares of the row block *once*, ``rstd`` is computed
  once, and then a device loop over the N tiles (``for tile_n in hl.tile(n)``) holds the MMA K loop and the
  epilogue (scale by ``rstd``, store). Against ``"prepass"``/``"reload"`` this removes the ``N / BLOCK_N``-fold
  redundant statistic (4x at N=1024, BLOCK_N=256) and reads A from HBM once: the statistic loop pulls the row
  block into L2 (``sumsq_eviction`` defaults to ``"last"``) and the MMA loops of all N tiles re-read it from
  there. No loop holds both a dot and a reduction, so the pipeliner bug has nothing to hit. Helion config
  order: ``block_sizes = [BLOCK_M, sumsq_block_k or BLOCK_K, BLOCK_N, BLOCK_K]``, no ``l2_groupings`` (1-D
  grid), device loops ``(k_sumsq, n, k)``. What the sm_90 TTGIR (triton 3.6, compile-only) shows:

  - the inner K loop is pipelined exactly like the GEMM's (``num_stages``-deep TMA rings for A and B, async
    wgmma with one group in flight);
  - ``range_flattens`` on the ``n`` loop makes Triton fuse the N and K loops into one pipelined loop whose
    epilogue sits in an ``scf.if``: the TMA loads of the next N tile are in flight during the epilogue of the
    current one (the structure of Triton's persistent-matmul tutorial, here over the N tiles of a row block).
    It does not fuse under a persistent ``pid_type`` (the persistent M loop then holds two loops);
  - the statistic loop is *not* software-pipelined when any operand uses TMA: in the TTGIR, Triton pipelines
    this dot-free loop only when its ``tl.range`` carries its own ``num_stages``, and Helion 1.5 drops
    ``range_num_stages`` as soon as a tensor descriptor is used. Each iteration is therefore one HBM round
    trip; a large ``sumsq_block_k`` (256: 4 round trips of 64 KiB at K=1024, no spills, 155 registers) keeps
    it short. With ``indexing="pointer"`` everywhere, ``range_num_stages`` on ``k_sumsq`` does pipeline it
    (cp.async ring);
  - one program per row block runs the statistic phase serially before its first MMA. With BLOCK_M x BLOCK_N
    = 128x128, ``num_stages=3`` and ``epilogue_subtile=2`` a program needs 114712 B of shared memory and ~90
    registers, so two programs share an SM and one's statistic phase overlaps the other's MMAs.

**LayerNorm** (``lazy_layernorm_matmul``; math in ``normfuse.techniques.lazy_prenorm``):
``C = rstd ⊙ (A @ b_folded) - (rstd * mean) ⊗ colsum + beta_b``, written as three more kernels that mirror
``"reload"``, ``"prepass"`` and ``"rowblock"`` (``"shared_tile"`` is not offered: ValueError; it is the form the
pipeliner miscompiles). Per row they accumulate the shifted sums ``s1 = sum (a - c)``, ``s2 = sum (a - c)^2``
with ``c = a[:, 0]`` (one extra load per row block, memory op ``a_shift``), so ``d = s1/K``, ``mean = c + d``,
``var = max(s2/K - d^2, 0)``. The epilogue broadcasts the colsum / beta_b tile (memory ops ``colsum``,
``beta_b``; the shift and both vectors always use ``"pointer"`` indexing). Finding (helion 1.5.0, generated code,
checked by the Triton-interpreter test): Helion masks a reduction's input over a partial tile only when it cannot
prove the masked lanes are zero, and it treats ``a_tile - shift[:, None]`` (zero-filled load minus a broadcast
row vector) as still zero there, so without an explicit ``torch.where(tile_k.index < k, y, 0)`` the K padding
adds ``-shift`` per padded column to ``s1`` (wrong results at K % BLOCK_K != 0). The kernels mask explicitly.
Register cost of the broadcast epilogue (ptxas, bf16, K=N=1024): rowblock 128x256 flattened 182 registers (RMSNorm
155); 128x128 flattened 212 (RMSNorm 90, so 1 program per SM instead of 2), 128x128 nested 99 (2 per SM).

Dots run with ``dot_precision="ieee"``: no effect on bf16/fp16 (wgmma either way), but fp32 inputs get a true
fp32 FMA dot instead of TF32 (slow; fp32 is for correctness checks against the fp32 reference, not benchmarks).

**Execution modes.**

* GPU: kernels are ``@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")``
  without a pinned config; a call binds the arguments, compiles ``TilingConfig.to_helion(op)`` with ``BoundKernel.compile_config`` and
  caches the compiled callable per (op, formulation, shape, dtype, device, config), so a repeated (timed) call
  costs one dict lookup plus Helion's host wrapper (allocation of ``c`` and the launch).
* CPU ref mode (``HELION_INTERPRET=1`` in the environment *before* ``import helion``): the kernel body runs as
  eager PyTorch on whole tensors; ``config`` is validated but otherwise **ignored** (no tiling, no Triton).
  ``normfuse.helion_compat`` supplies the CPU ``aten::mm.dtype`` that this needs.
* compile-only (``compile_sm90``): under ``normfuse.compile_only.install(90)``, CPU tensors are bound, the
  Triton code is generated and compiled for sm_90 with a launcher that never launches; ``ptxas_usage`` reads
  registers/spills of the result with Triton's ptxas.
* Triton interpreter (``TRITON_INTERPRET=1``, tests only): the generated Triton runs tile by tile on CPU, which
  checks the tiling and edge masks that ref mode skips. fp32 only (the interpreter's bf16 dot is wrong) and
  ``libdevice.rsqrt`` has to be mapped to ``tl.math.rsqrt`` first (``tests/test_kernels_helion.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from normfuse.techniques.lazy_prenorm import check_inputs, check_layernorm_vectors
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only, numel_needs_int64

__all__ = [
    "TilingConfig",
    "DEFAULT_CONFIG",
    "H200_CANDIDATES",
    "OPS",
    "SUMSQ_VARIANTS",
    "matmul",
    "lazy_rmsnorm_matmul",
    "lazy_layernorm_matmul",
    "compile_sm90",
    "compile_sm90_kernel",
    "ptxas_usage",
    "triton_code",
    "ref_mode",
]

OPS = ("matmul", "lazy_rmsnorm_matmul")
LN_OP = "lazy_layernorm_matmul"
ALL_OPS = OPS + (LN_OP,)
SUMSQ_VARIANTS = ("shared_tile", "reload", "prepass", "rowblock")
# The LayerNorm op reuses every formulation except the naive "shared_tile" (miscompiled by the pipeliner at
# num_stages > 1 on the H200 for RMSNorm; correct only at num_stages=1, where it is the slowest config).
LN_SUMSQ_VARIANTS = ("reload", "prepass", "rowblock")
INDEXING = ("pointer", "tensor_descriptor", "block_ptr")
EVICTION = ("auto", "", "first", "last")
PID_TYPES = ("flat", "xyz", "persistent_blocked", "persistent_interleaved")
H200_NUM_SMS = 132

# Memory ops of each kernel in Helion's program order: a per-op `indexing` tuple lists one strategy per entry.
MEMORY_OPS = {
    ("matmul", None): ("a", "b", "out"),
    ("lazy_rmsnorm_matmul", "shared_tile"): ("a", "b", "out"),
    ("lazy_rmsnorm_matmul", "reload"): ("a", "b", "a_sumsq", "out"),
    ("lazy_rmsnorm_matmul", "prepass"): ("a_sumsq", "a", "b", "out"),
    ("lazy_rmsnorm_matmul", "rowblock"): ("a_sumsq", "a", "b", "out"),
    # LayerNorm: the per-row shift a[:, 0] first, the epilogue vectors before the store (all three "pointer")
    (LN_OP, "reload"): ("a_shift", "a", "b", "a_sumsq", "colsum", "beta_b", "out"),
    (LN_OP, "prepass"): ("a_shift", "a_sumsq", "a", "b", "colsum", "beta_b", "out"),
    (LN_OP, "rowblock"): ("a_shift", "a_sumsq", "a", "b", "colsum", "beta_b", "out"),
}
LN_POINTER_OPS = ("a_shift", "colsum", "beta_b")  # always pointer loads (1-element / 1-D fp32 boxes)
# Device loops (`tl.range`s) of each kernel, in program order: range_* tuples hold one entry per loop. Helion's
# own range_* lists have one more entry in front, for the grid (tile) loop, which exists only under a persistent
# pid_type; `TilingConfig.to_helion` fills it from `persistent_flatten`.
DEVICE_LOOPS = {
    ("matmul", None): ("k",),
    ("lazy_rmsnorm_matmul", "shared_tile"): ("k",),
    ("lazy_rmsnorm_matmul", "reload"): ("k",),
    ("lazy_rmsnorm_matmul", "prepass"): ("k_sumsq", "k"),
    ("lazy_rmsnorm_matmul", "rowblock"): ("k_sumsq", "n", "k"),
    (LN_OP, "reload"): ("k",),
    (LN_OP, "prepass"): ("k_sumsq", "k"),
    (LN_OP, "rowblock"): ("k_sumsq", "n", "k"),
}
# Kernels whose grid loop tiles M only (no l2_groupings entry in their Helion config).
ROW_GRID = frozenset({("lazy_rmsnorm_matmul", "rowblock"), (LN_OP, "rowblock")})


# ------------------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------------------
@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _matmul_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        out[tile_m, tile_n] = acc.to(out.dtype)
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_shared_tile_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            x = a[tile_m, tile_k]  # one load feeds both the statistic and the MMA
            xf = x.to(torch.float32)
            ss = ss + torch.sum(xf * xf, dim=-1)
            acc = torch.addmm(acc, x, b[tile_k, tile_n])
        rstd = torch.rsqrt(ss / k + eps)
        out[tile_m, tile_n] = (acc * rstd[:, None]).to(out.dtype)
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_reload_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])  # memory ops 0 (a), 1 (b)
            xs = a[tile_m, tile_k].to(torch.float32)  # memory op 2: a second, independent load of the A tile
            ss = ss + torch.sum(xs * xs, dim=-1)
        rstd = torch.rsqrt(ss / k + eps)
        out[tile_m, tile_n] = (acc * rstd[:, None]).to(out.dtype)
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_prepass_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for tile_ks in hl.tile(k):
            xs = a[tile_m, tile_ks].to(torch.float32)  # loop 0: statistic only, no dot in this loop
            ss = ss + torch.sum(xs * xs, dim=-1)
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):  # loop 1: plain GEMM loop
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        rstd = torch.rsqrt(ss / k + eps)
        out[tile_m, tile_n] = (acc * rstd[:, None]).to(out.dtype)
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_rowblock_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m in hl.tile(m):  # grid: one program per row block
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for tile_ks in hl.tile(k):  # loop k_sumsq: the statistic, once per row block, no dot in this loop
            xs = a[tile_m, tile_ks].to(torch.float32)  # memory op 0 (a_sumsq)
            ss = ss + torch.sum(xs * xs, dim=-1)
        rstd = torch.rsqrt(ss / k + eps)
        for tile_n in hl.tile(n):  # loop n: every N tile of the row block reuses rstd
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):  # loop k: plain GEMM loop (memory ops 1 (a), 2 (b))
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            out[tile_m, tile_n] = (acc * rstd[:, None]).to(out.dtype)  # memory op 3 (out)
    return out


# --- LayerNorm (lazy_layernorm_matmul): the same three formulations with shifted one-pass statistics ----------
# Per row: shift = a[:, 0] (fp32), s1 = sum(a - shift), s2 = sum((a - shift)^2) over K, the K padding masked
# explicitly (Helion does not re-mask `tile - shift`, see the module docstring). Epilogue:
# out = rstd * acc - (rstd * mean) * colsum + beta_b.
@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_ln_reload_kernel(a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor,
                           eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        shift = a[tile_m, 0].to(torch.float32)  # memory op 0 (a_shift)
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        s1 = hl.zeros([tile_m], dtype=torch.float32)
        s2 = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])  # memory ops 1 (a), 2 (b)
            y = a[tile_m, tile_k].to(torch.float32) - shift[:, None]  # memory op 3: a second load of the A tile
            y = torch.where((tile_k.index < k)[None, :], y, 0.0)  # K padding: 0, not -shift (module docstring)
            s1 = s1 + torch.sum(y, dim=-1)
            s2 = s2 + torch.sum(y * y, dim=-1)
        d = s1 / k
        rstd = torch.rsqrt(torch.clamp(s2 / k - d * d, min=0.0) + eps)
        rm = rstd * (shift + d)
        cs = colsum[tile_n]  # memory op 4
        bb = beta_b[tile_n]  # memory op 5
        out[tile_m, tile_n] = (acc * rstd[:, None] - rm[:, None] * cs[None, :] + bb[None, :]).to(out.dtype)
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_ln_prepass_kernel(a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor,
                            eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        shift = a[tile_m, 0].to(torch.float32)  # memory op 0 (a_shift)
        s1 = hl.zeros([tile_m], dtype=torch.float32)
        s2 = hl.zeros([tile_m], dtype=torch.float32)
        for tile_ks in hl.tile(k):  # loop 0: statistics only, no dot in this loop
            y = a[tile_m, tile_ks].to(torch.float32) - shift[:, None]  # memory op 1 (a_sumsq)
            y = torch.where((tile_ks.index < k)[None, :], y, 0.0)  # K padding: 0, not -shift (module docstring)
            s1 = s1 + torch.sum(y, dim=-1)
            s2 = s2 + torch.sum(y * y, dim=-1)
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):  # loop 1: plain GEMM loop
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        d = s1 / k
        rstd = torch.rsqrt(torch.clamp(s2 / k - d * d, min=0.0) + eps)
        rm = rstd * (shift + d)
        cs = colsum[tile_n]
        bb = beta_b[tile_n]
        out[tile_m, tile_n] = (acc * rstd[:, None] - rm[:, None] * cs[None, :] + bb[None, :]).to(out.dtype)
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _lazy_ln_rowblock_kernel(a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor,
                             eps: float) -> torch.Tensor:
    m, k = a.size()
    _, n = b.size()
    out = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m in hl.tile(m):  # grid: one program per row block
        shift = a[tile_m, 0].to(torch.float32)  # memory op 0 (a_shift)
        s1 = hl.zeros([tile_m], dtype=torch.float32)
        s2 = hl.zeros([tile_m], dtype=torch.float32)
        for tile_ks in hl.tile(k):  # loop k_sumsq: the statistics, once per row block, no dot in this loop
            y = a[tile_m, tile_ks].to(torch.float32) - shift[:, None]  # memory op 1 (a_sumsq)
            y = torch.where((tile_ks.index < k)[None, :], y, 0.0)  # K padding: 0, not -shift (module docstring)
            s1 = s1 + torch.sum(y, dim=-1)
            s2 = s2 + torch.sum(y * y, dim=-1)
        d = s1 / k
        rstd = torch.rsqrt(torch.clamp(s2 / k - d * d, min=0.0) + eps)
        rm = rstd * (shift + d)
        for tile_n in hl.tile(n):  # loop n: every N tile of the row block reuses rstd and rstd * mean
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):  # loop k: plain GEMM loop (memory ops 2 (a), 3 (b))
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            cs = colsum[tile_n]  # memory op 4
            bb = beta_b[tile_n]  # memory op 5
            out[tile_m, tile_n] = (acc * rstd[:, None] - rm[:, None] * cs[None, :] + bb[None, :]).to(out.dtype)
    return out


_KERNELS = {
    ("matmul", None): _matmul_kernel,
    ("lazy_rmsnorm_matmul", "shared_tile"): _lazy_shared_tile_kernel,
    ("lazy_rmsnorm_matmul", "reload"): _lazy_reload_kernel,
    ("lazy_rmsnorm_matmul", "prepass"): _lazy_prepass_kernel,
    ("lazy_rmsnorm_matmul", "rowblock"): _lazy_rowblock_kernel,
    (LN_OP, "reload"): _lazy_ln_reload_kernel,
    (LN_OP, "prepass"): _lazy_ln_prepass_kernel,
    (LN_OP, "rowblock"): _lazy_ln_rowblock_kernel,
}


# ------------------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------------------
def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and (v & (v - 1)) == 0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_tuple(name: str, v, elem_ok, what: str):
    """None, or a non-empty tuple/list whose entries all satisfy ``elem_ok``; returns None or a tuple."""
    if v is None:
        return None
    if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or len(v) == 0:
        raise ValueError(f"{name} must be None or a non-empty tuple ({what}), got {v!r}")
    if not all(elem_ok(x) for x in v):
        raise ValueError(f"{name} entries must be {what}, got {v!r}")
    return tuple(v)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """A typed, validated subset of ``helion.Config`` for these kernels (hashable: used as a cache key).

    Fields (Helion names unless noted):

    * ``block_sizes`` ``(BLOCK_M, BLOCK_N, BLOCK_K)``: powers of two in [16, 512] (``tl.dot`` needs >= 16).
    * ``num_warps`` (power of two, 1..32), ``num_stages`` (1..8): kernel-level; ``num_stages`` is the software
      pipelining depth of the K loop(s). Helion 1.5 drops ``range_num_stages`` as soon as any load/store uses a
      (device-side) tensor descriptor (its "misaligned address" guard), so with TMA ``num_stages`` is the knob
      that counts.
    * ``indexing``: ``"pointer" | "tensor_descriptor" | "block_ptr"`` for every load/store, or a tuple: 3 entries
      mean ``(a, b, out)`` for every op (the extra sum-of-squares load of ``sumsq="reload"/"prepass"/"rowblock"``
      then uses ``sumsq_indexing``); 4 entries (not ``"shared_tile"``) follow Helion's program order of the fused
      kernel, ``MEMORY_OPS[("lazy_rmsnorm_matmul", sumsq)]``; ``matmul`` takes the a/b/out entries.
    * ``pid_type``: ``"flat" | "xyz" | "persistent_blocked" | "persistent_interleaved"``; ``l2_groupings``:
      ``(G,)`` with G a power of two (grouped launch order for L2 reuse of B; ignored by ``"rowblock"``, whose
      grid tiles M only).
    * ``sumsq`` (ours, ignored by ``matmul``): ``"shared_tile" | "reload" | "prepass" | "rowblock"``, see the
      module docstring. Default ``"reload"`` (as in the Triton folder): the formulation meant to stay correct
      when only ``num_stages`` is raised.
    * ``sumsq_indexing`` (ours): indexing of the separate sum-of-squares load of ``"reload"``/``"prepass"``/
      ``"rowblock"`` when ``indexing`` is one string or a 3-tuple; ``"auto"`` (default) means ``"pointer"``.
    * ``sumsq_eviction`` (ours): L2 eviction hint of that load, ``"" | "first" | "last"`` (Helion's
      ``load_eviction_policies`` entry); ``"auto"`` (default): ``"first"`` for ``"reload"`` (this CTA's last
      touch of those bytes), ``"last"`` for ``"prepass"``/``"rowblock"`` (the MMA loop re-reads them). For
      ``"reload"`` the two A loads must differ in indexing strategy or eviction hint, and must not both be
      ``"tensor_descriptor"`` (descriptor loads ignore the hint); otherwise ValueError: Triton's CSE would merge
      them back into one load, i.e. ``"shared_tile"`` (seen in the TTGIR: A then gets ``num_stages - 1`` smem
      slots).
    * ``sumsq_block_k`` (ours, ``"prepass"``/``"rowblock"`` only): K block of the statistic loop; None means
      ``BLOCK_K``. That loop is not software-pipelined under TMA indexing, so larger is better for
      ``"rowblock"`` (256 recommended; 512 still compiles without spills but takes ~240 registers).
    * ``range_num_stages``, ``range_unroll_factors``, ``range_multi_buffers``, ``range_flattens``,
      ``range_warp_specializes``: None or one entry per device loop of the fused kernel (``DEVICE_LOOPS``: 1
      loop; 2 for ``"prepass"``: statistic loop, MMA loop; 3 for ``"rowblock"``: statistic loop, N loop, MMA
      loop; ``matmul`` takes the MMA-loop entry); a 1-tuple is applied to every loop. ``to_helion`` puts
      Helion's extra leading entry for the grid loop in front (see ``persistent_flatten``). Helion 1.5 drops
      ``range_num_stages`` and, with ``num_stages > 1``, ``range_unroll_factors`` when any operand uses a tensor
      descriptor. ``range_flattens=(None, True, None)`` with ``"rowblock"`` fuses its N and K loops. Helion 1.5
      offers ``range_warp_specializes`` only on compute capability >= 10.0: on sm_90 (H100/H200) any value
      makes Helion raise ``InvalidConfig`` ("Too many values ... expected 0").
    * ``persistent_flatten`` (ours): ``flatten=`` of the persistent tile loop (Helion's leading ``range_flattens``
      entry), only with a persistent ``pid_type``. ``True`` makes Triton fuse the tile loop with the K loop into
      one software-pipelined loop, as in Triton's persistent-matmul tutorial: the next tile's TMA loads are in
      flight while this tile's epilogue runs. Fuses only when the tile loop holds a single loop (``matmul``,
      ``"shared_tile"``, ``"reload"``); a no-op for ``"prepass"`` and ``"rowblock"``.
    * ``num_sm_multiplier``, ``maxnreg`` (persistent kernels only; Helion rejects ``maxnreg`` with ``"flat"``),
      ``epilogue_subtile`` (split the epilogue store into 2/4 pieces, which shrinks its shared-memory staging
      buffer accordingly): None means Helion's default. (Helion 1.5.0's ``host_tensor_descriptors`` is
      rejected by its Triton backend, so it is not offered.)

    Raises ValueError naming the violated constraint when a value is invalid.
    """

    block_sizes: tuple = (128, 256, 64)
    num_warps: int = 8
    num_stages: int = 1
    indexing: str | tuple = "tensor_descriptor"
    pid_type: str = "flat"
    l2_groupings: tuple = (8,)
    sumsq: str = "reload"
    sumsq_indexing: str = "auto"
    sumsq_eviction: str = "auto"
    sumsq_block_k: int | None = None
    range_num_stages: tuple | None = None
    range_unroll_factors: tuple | None = None
    range_multi_buffers: tuple | None = None
    range_flattens: tuple | None = None
    range_warp_specializes: tuple | None = None
    num_sm_multiplier: int | None = None
    maxnreg: int | None = None
    epilogue_subtile: int | None = None
    persistent_flatten: bool | None = None

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        bs = self.block_sizes
        if isinstance(bs, (str, bytes)) or not isinstance(bs, (tuple, list)) or len(bs) != 3:
            raise ValueError(f"block_sizes must be (BLOCK_M, BLOCK_N, BLOCK_K), 3 entries, got {bs!r}")
        if not all(_is_pow2(x) and 16 <= x <= 512 for x in bs):
            raise ValueError(f"block_sizes entries must be powers of two in [16, 512] (tl.dot needs >= 16), got {bs!r}")
        put("block_sizes", tuple(bs))
        if not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"num_warps must be a power of two in [1, 32], got {self.num_warps!r}")
        if not (_is_int(self.num_stages) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an integer in [1, 8], got {self.num_stages!r}")
        ix = self.indexing
        if isinstance(ix, str):
            if ix not in INDEXING:
                raise ValueError(f"indexing must be one of {INDEXING} or a tuple of them, got {ix!r}")
        else:
            put("indexing", _opt_tuple("indexing", ix, lambda x: x in INDEXING, f"one of {INDEXING}"))
            if self.indexing is None:
                raise ValueError(f"indexing must be one of {INDEXING} or a tuple of them, got None")
        if self.pid_type not in PID_TYPES:
            raise ValueError(f"pid_type must be one of {PID_TYPES}, got {self.pid_type!r}")
        lg = _opt_tuple("l2_groupings", self.l2_groupings, _is_pow2, "powers of two >= 1")
        if lg is None or len(lg) != 1:
            raise ValueError(f"l2_groupings must be a 1-tuple (G,) with G a power of two, got {self.l2_groupings!r}")
        put("l2_groupings", lg)
        if self.sumsq not in SUMSQ_VARIANTS:
            raise ValueError(f"sumsq must be one of {SUMSQ_VARIANTS}, got {self.sumsq!r}")
        if self.sumsq_indexing != "auto" and self.sumsq_indexing not in INDEXING:
            raise ValueError(f"sumsq_indexing must be 'auto' or one of {INDEXING}, got {self.sumsq_indexing!r}")
        if self.sumsq_eviction not in EVICTION:
            raise ValueError(f"sumsq_eviction must be one of {EVICTION}, got {self.sumsq_eviction!r}")
        if self.sumsq_block_k is not None and not (_is_pow2(self.sumsq_block_k) and 16 <= self.sumsq_block_k <= 512):
            raise ValueError(f"sumsq_block_k must be None or a power of two in [16, 512], got {self.sumsq_block_k!r}")
        put("range_num_stages", _opt_tuple("range_num_stages", self.range_num_stages,
                                           lambda x: _is_int(x) and 0 <= x <= 8, "integers in [0, 8] (0 = default)"))
        put("range_unroll_factors", _opt_tuple("range_unroll_factors", self.range_unroll_factors,
                                               lambda x: _is_int(x) and 0 <= x <= 8, "integers in [0, 8] (0 = none)"))
        for name in ("range_multi_buffers", "range_flattens", "range_warp_specializes"):
            put(name, _opt_tuple(name, getattr(self, name), lambda x: x is None or isinstance(x, bool), "None/True/False"))
        if self.num_sm_multiplier is not None and not (_is_int(self.num_sm_multiplier) and 1 <= self.num_sm_multiplier <= 128):
            raise ValueError(f"num_sm_multiplier must be None or an integer in [1, 128], got {self.num_sm_multiplier!r}")
        if self.maxnreg is not None and not (_is_int(self.maxnreg) and 1 <= self.maxnreg <= 256):
            raise ValueError(f"maxnreg must be None or an integer in [1, 256], got {self.maxnreg!r}")
        if self.epilogue_subtile is not None and not (_is_pow2(self.epilogue_subtile) and self.epilogue_subtile >= 2):
            raise ValueError(f"epilogue_subtile must be None or a power of two >= 2, got {self.epilogue_subtile!r}")
        persistent = self.pid_type.startswith("persistent")
        if self.maxnreg is not None and not persistent:
            raise ValueError(f"maxnreg needs a persistent pid_type (Helion 1.5 rejects it with {self.pid_type!r})")
        if self.persistent_flatten is not None:
            if not isinstance(self.persistent_flatten, bool):
                raise ValueError(f"persistent_flatten must be None, True or False, got {self.persistent_flatten!r}")
            if not persistent:
                raise ValueError(f"persistent_flatten needs a persistent pid_type (with {self.pid_type!r} there is no "
                                 "tile loop to flatten)")
        for op in OPS:  # cross-field checks (tuple lengths, the reload CSE hazard) raise here, not at launch
            self.to_helion(op)
        if self.sumsq in LN_SUMSQ_VARIANTS:
            self.to_helion(LN_OP)

    def kernel_key(self, op: str) -> tuple:
        """``(op, formulation)``: which kernel ``op`` runs under this config (``sumsq`` only matters for the
        fused ops). ValueError for an unknown op, and for ``sumsq="shared_tile"`` with the LayerNorm op (not
        offered: ``LN_SUMSQ_VARIANTS``)."""
        if op not in ALL_OPS:
            raise ValueError(f"unknown op {op!r}; choices: {', '.join(ALL_OPS)}")
        if op == LN_OP and self.sumsq not in LN_SUMSQ_VARIANTS:
            raise ValueError(f"sumsq={self.sumsq!r} is not offered for {LN_OP} (choices: "
                             f"{', '.join(LN_SUMSQ_VARIANTS)}): the naive shared-tile loop is miscompiled by "
                             "Triton's pipeliner at num_stages > 1 (triton#6691)")
        return (op, None) if op == "matmul" else (op, self.sumsq)

    def to_helion(self, op: str = "lazy_rmsnorm_matmul") -> helion.Config:
        """The ``helion.Config`` for the kernel that ``op`` runs under this config (default: the fused op, with
        the ``sumsq`` formulation). Expands ``indexing``/``range_*`` to Helion's per-memory-op/per-loop lists.
        Raises ValueError for an unknown op or a tuple of the wrong length (construction already checked both
        ops, so a constructed config never raises here)."""
        key = self.kernel_key(op)
        mem_ops, loops = MEMORY_OPS[key], DEVICE_LOOPS[key]
        bm, bn, bk = self.block_sizes
        sbk = self.sumsq_block_k or bk
        if key[1] == "prepass":  # Helion's order: grid (m, n), then the loops' K blocks
            block_sizes = [bm, bn, sbk, bk]
        elif key[1] == "rowblock":  # grid m, loop k_sumsq, loop n, loop k
            block_sizes = [bm, sbk, bn, bk]
        else:
            block_sizes = [bm, bn, bk]
        kw: dict = {
            "block_sizes": block_sizes,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "pid_type": self.pid_type,
        }
        if key not in ROW_GRID:
            kw["l2_groupings"] = list(self.l2_groupings)
        fused = ("lazy_rmsnorm_matmul", self.sumsq)  # tuples are read against the fused kernel's op/loop lists
        ix = self.indexing
        if isinstance(ix, str) or len(ix) == 3:
            a_ix, b_ix, out_ix = (ix, ix, ix) if isinstance(ix, str) else ix
            s_ix = "pointer" if self.sumsq_indexing == "auto" else self.sumsq_indexing
            by_name = {"a": a_ix, "b": b_ix, "out": out_ix, "a_sumsq": s_ix}
        elif len(ix) == len(MEMORY_OPS[fused]):
            by_name = dict(zip(MEMORY_OPS[fused], ix))
        else:
            raise ValueError(f"indexing tuple has {len(ix)} entries; need 3 (a, b, out) or, for sumsq={self.sumsq!r}, "
                             f"{len(MEMORY_OPS[fused])} in Helion's program order {MEMORY_OPS[fused]}")
        by_name.update({name: "pointer" for name in LN_POINTER_OPS})  # LayerNorm's extra loads
        evict = self.sumsq_eviction
        if evict == "auto":
            evict = "first" if self.sumsq == "reload" else "last"
        if key[1] == "reload":
            a_ix, s_ix = by_name["a"], by_name["a_sumsq"]
            if (a_ix == s_ix == "tensor_descriptor") or (a_ix == s_ix and evict == ""):
                raise ValueError(
                    f"sumsq='reload' needs the dot's A load and the sum-of-squares load to differ (both are "
                    f"{a_ix!r} with eviction hint {evict!r}; descriptor loads ignore the hint): Triton's CSE would "
                    "merge them into one load, i.e. sumsq='shared_tile'. Use sumsq_indexing='pointer' and/or "
                    "sumsq_eviction='first'/'last'")
        if "a_sumsq" in mem_ops:
            loads = [m for m in mem_ops if m != "out"]
            kw["load_eviction_policies"] = [evict if m == "a_sumsq" else "" for m in loads]
        resolved = [by_name[m] for m in mem_ops]
        kw["indexing"] = resolved[0] if len(set(resolved)) == 1 else resolved
        # Helion's range_* lists hold one entry per `tl.range` *candidate*: first the grid (tile) loop, which only
        # becomes a loop under a persistent pid_type, then the device loops in program order. (Passing only the
        # device-loop entries would shift them all by one: the first one would land on the grid loop.)
        grid_default = {"range_num_stages": 0, "range_unroll_factors": 0}
        for name in ("range_num_stages", "range_unroll_factors", "range_multi_buffers", "range_flattens",
                     "range_warp_specializes"):
            v = getattr(self, name)
            grid = self.persistent_flatten if name == "range_flattens" else None
            if v is None and grid is None:
                continue
            dflt = grid_default.get(name)
            if v is None:
                by_loop = {}
            else:
                if len(v) == 1:
                    v = v * len(DEVICE_LOOPS[fused])
                if len(v) != len(DEVICE_LOOPS[fused]):
                    raise ValueError(f"{name} has {len(v)} entries; sumsq={self.sumsq!r} has "
                                     f"{len(DEVICE_LOOPS[fused])} device loop(s) {DEVICE_LOOPS[fused]} "
                                     "(a 1-tuple applies to all)")
                by_loop = dict(zip(DEVICE_LOOPS[fused], v))
            kw[name] = [dflt if grid is None else grid] + [by_loop.get(lp, dflt) for lp in loops]
        for name in ("num_sm_multiplier", "maxnreg", "epilogue_subtile"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return helion.Config(**kw)


DEFAULT_CONFIG = TilingConfig()

# Candidates for the H200 sweep (configs/tiling/lazy_prenorm_h200.yaml), chosen from the sm_90 compile-only output
# (triton 3.6, M=262144, K=N=1024, bf16); untimed. Each entry is timed for both ops (the GEMM reads block sizes,
# stages, pid_type, persistent_flatten, epilogue_subtile; the fused op also the sumsq fields). Numbers per entry:
# shared bytes / registers per thread (ptxas -v, no spills) / resident programs per SM, GEMM then fused.
H200_CANDIDATES = {
    # GEMM: persistent + flattened tile/K loop (Triton persistent-matmul tutorial structure), 4-deep TMA ring; the
    # 128x128 epilogue subtiles keep it under 227 KiB. 229408 B / 154 regs / 1 (fused: 229408 / 155 / 1).
    "persist-flat-128x256x64-s4-sub2": dict(
        block_sizes=(128, 256, 64), num_warps=8, num_stages=4, indexing="tensor_descriptor",
        pid_type="persistent_interleaved", persistent_flatten=True, epilogue_subtile=2, l2_groupings=(8,),
        sumsq="rowblock", sumsq_block_k=256),
    # fused: rowblock, N and K loops flattened, 1 program per SM. GEMM (flat): 196640 / 154 / 1;
    # fused: 229408 / 155 / 1.
    "rowblock-flatn-128x256x64-s4-sub2": dict(
        block_sizes=(128, 256, 64), num_warps=8, num_stages=4, indexing="tensor_descriptor",
        epilogue_subtile=2, l2_groupings=(8,), sumsq="rowblock", sumsq_block_k=256,
        range_flattens=(None, True, None)),
    # fused: rowblock with 2 programs per SM, so one's statistic phase overlaps the other's MMAs.
    # GEMM (flat): 98328 / 90 / 2; fused: 114712 / 90 / 2.
    "rowblock-flatn-128x128x64-s3-sub2": dict(
        block_sizes=(128, 128, 64), num_warps=8, num_stages=3, indexing="tensor_descriptor",
        epilogue_subtile=2, l2_groupings=(8,), sumsq="rowblock", sumsq_block_k=256,
        range_flattens=(None, True, None)),
    # GEMM: persistent + flattened with 2 programs per SM (num_sm_multiplier=2): 114712 / 90 / 2 (fused: the
    # persistent rowblock, 114712 / 90 / 2).
    "persist-flat-128x128x64-s3-sub2-x2": dict(
        block_sizes=(128, 128, 64), num_warps=8, num_stages=3, indexing="tensor_descriptor",
        pid_type="persistent_interleaved", persistent_flatten=True, num_sm_multiplier=2, epilogue_subtile=2,
        l2_groupings=(8,), sumsq="rowblock", sumsq_block_k=256),
}


# ------------------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------------------
_COMPILED: dict = {}  # (kernel key, M, N, K, dtype, device, TilingConfig) -> compiled Helion host function


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_matmul_kernel.settings)


def _as_config(config) -> TilingConfig:
    return TilingConfig.from_dict(config)


_check_eps = check_eps  # the shared check (normfuse.validate); the name is imported by kernels_helion.fna


_INT64_TWINS: dict = {}  # id(kernel) -> (kernel, its index_dtype=int64 twin)


def _indexed_kernel(kernel, *numels: int):
    """``kernel`` itself, or its twin compiled with ``index_dtype=torch.int64`` when a tensor of one of
    ``numels`` elements (the inputs, and the outputs the kernel allocates) has element offsets beyond int32.

    Helion picks int64 indexing by itself only from the sizes of the *input* tensors; an output larger than every
    input (``y [M, N]`` of a GEMM with K < N, e.g. 262144 x 8200 from K = 64) then fails in code generation with
    ``IndexOffsetOutOfRangeForInt32``. The twin has the same body and settings (``helion.kernel(fn,
    settings=...)``), so the benchmarked shapes keep their int32 kernel and its speed."""
    if not numel_needs_int64(*numels):
        return kernel
    hit = _INT64_TWINS.get(id(kernel))
    if hit is None:
        twin = helion.kernel(kernel.fn, settings=dataclasses.replace(kernel.settings, index_dtype=torch.int64))
        hit = _INT64_TWINS[id(kernel)] = (kernel, twin)
    return hit[1]


def _kernel_args(op: str, a, b, eps, vectors=(None, None), *, fill_vectors: bool = False):
    """Validate the inputs of ``op``; return ``((M, N, K), args)`` with ``args`` in the kernel's order:
    ``(a, b)``, ``(a, b, eps)`` or, for the LayerNorm op, ``(a, b, colsum, beta_b, eps)``. ``fill_vectors``:
    missing LayerNorm vectors become empty fp32 ``[N]`` tensors (code generation / compile-only)."""
    if op == "matmul":
        return check_inputs(a, b, None), (a, b)
    M, N, K = check_inputs(a, b, eps)
    if op != LN_OP:
        return (M, N, K), (a, b, eps)
    colsum, beta_b = vectors
    if fill_vectors:
        colsum = torch.empty(N, dtype=torch.float32, device=a.device) if colsum is None else colsum
        beta_b = torch.empty(N, dtype=torch.float32, device=a.device) if beta_b is None else beta_b
    check_layernorm_vectors(colsum, beta_b, N, a.device)
    return (M, N, K), (a, b, colsum, beta_b, eps)


def _run(op: str, a: torch.Tensor, b: torch.Tensor, eps: float | None, config, vectors=(None, None)) -> torch.Tensor:
    (M, N, K), args = _kernel_args(op, a, b, eps, vectors)
    cfg = _as_config(config)
    key = cfg.kernel_key(op)
    kernel = _indexed_kernel(_KERNELS[key], a.numel(), b.numel(), M * N)
    if ref_mode():
        return kernel(*args)  # eager PyTorch on whole tensors: the config does not apply
    if a.device.type != "cuda":
        raise ValueError(f"{op} needs CUDA tensors (got {a.device}); on CPU set HELION_INTERPRET=1 before "
                         "importing helion (ref mode), or use compile_sm90 for a compile-only check")
    ck = (key, M, N, K, a.dtype, a.device, cfg)
    fn = _COMPILED.get(ck)
    if fn is None:
        bound = kernel.bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(cfg.to_helion(op))
        _COMPILED[ck] = fn
    return fn(*args)  # a and b are 16-byte aligned (check_inputs): TMA descriptors are legal whenever configured


def matmul(a: torch.Tensor, b: torch.Tensor, *, config=None) -> torch.Tensor:
    """Plain GEMM ``C[M, N] = a[M, K] @ b[K, N]`` (fp32 accumulation), returned in ``a.dtype``: the baseline.

    ``a``, ``b``: 2-D row-major contiguous CUDA tensors of one dtype (bf16/fp16/fp32; fp32 dots use tf32),
    K and N multiples of 8, M >= 1 (any M, K, N: edge tiles are masked / zero-filled by TMA).
    ``config``: ``TilingConfig``, a mapping for ``TilingConfig.from_dict``, or None (``DEFAULT_CONFIG``); under
    ref mode (``HELION_INTERPRET=1``) it is validated and then ignored, and CPU tensors are accepted.
    The first call per (shape, dtype, device, config) compiles; later calls reuse the compiled function.

    Raises NotImplementedError for inputs that require grad with grad mode on (forward only), TypeError/ValueError
    from ``normfuse.techniques.lazy_prenorm.check_inputs`` for bad inputs (16-byte aligned base pointers
    included), ``normfuse.tiling.ConfigError`` (a ValueError) for an invalid config, ValueError for non-CUDA
    tensors outside ref mode. Outputs past 2^31 elements get the int64-indexing twin (``_indexed_kernel``).

    Sources: Helion examples (matmul), https://github.com/pytorch/helion/tree/main/examples ; the PyTorch blog
    "Towards Free Normalization", https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
    """
    check_forward_only("lazy_prenorm.matmul", a=a, b=b)
    return _run("matmul", a, b, None, config)


def lazy_rmsnorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, *, eps: float = 1e-6, config=None) -> torch.Tensor:
    """Fused Lazy Pre-Norm GEMM: ``C = rsqrt(mean(a^2, -1) + eps)[:, None] * (a @ b_folded)``, in ``a.dtype``.

    ``a [M, K]``: the un-normalized activation; ``b_folded [K, N]``: ``diag(gamma) @ b``, folded once outside
    any timed region (``normfuse.techniques.lazy_prenorm.fold_gamma``). Both 2-D row-major contiguous, one dtype
    (bf16/fp16/fp32), K and N multiples of 8, M >= 1. The per-row sum of squares and the accumulator are fp32;
    ``rstd`` is applied to the fp32 accumulator before the one rounding to ``a.dtype``. ``eps`` > 0 is a runtime
    argument (no recompile per eps).
    ``config``: as for ``matmul``; ``config.sumsq`` picks the formulation (``"shared_tile"``, ``"reload"``,
    ``"prepass"``, ``"rowblock"``). With ``"shared_tile"`` only ``num_stages=1`` is known to be correct on GPU
    (Triton pipeliner bug, triton-lang/triton#6691): check every benchmarked config against ``reference``. Under
    ref mode the config is validated and ignored.

    Raises as ``matmul``, plus ValueError naming eps for an ``eps`` that is not a finite number > 0 (None too).

    Source: PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels",
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    Helion examples, https://github.com/pytorch/helion/tree/main/examples
    """
    check_forward_only("lazy_prenorm.lazy_rmsnorm_matmul", a=a, b_folded=b_folded)
    return _run("lazy_rmsnorm_matmul", a, b_folded, check_eps(eps), config)


def lazy_layernorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor, *,
                          eps: float = 1e-5, config=None) -> torch.Tensor:
    """Fused Lazy Pre-Norm for LayerNorm: ``C = rstd ⊙ (a @ b_folded) - (rstd * mean) ⊗ colsum + beta_b``, in
    ``a.dtype``. Equals ``(LN(a) * gamma + beta) @ b`` for ``b_folded = diag(gamma) @ b``,
    ``colsum = b_folded.float().sum(0)``, ``beta_b = beta @ b`` (fp32; ``normfuse.techniques.lazy_prenorm``'s
    ``fold_gamma`` / ``layernorm_vectors``, computed once outside timing).

    Numerics: within the flash-attention tolerance for rows whose |mean| is at most 100 standard deviations, the
    documented limit of the rank-1 form (``normfuse.techniques.lazy_prenorm``; at ~1000 std the epilogue's
    cancellation exceeds it in bf16).

    Statistics: per row, fp32 shifted sums ``S1 = sum (a - c)``, ``S2 = sum (a - c)^2`` with ``c = a[:, 0]``
    (shifted one-pass variance), taken by the ``config.sumsq`` formulation (``"reload"``, ``"prepass"``,
    ``"rowblock"``; ``"shared_tile"`` raises ValueError for this op); ``mean = c + S1/K``,
    ``var = max(S2/K - (S1/K)^2, 0)``, ``rstd = rsqrt(var + eps)``. The shift, ``colsum`` and ``beta_b`` are
    pointer loads whatever ``config.indexing`` says.

    ``a [M, K]``, ``b_folded [K, N]``: as in ``lazy_rmsnorm_matmul``. ``colsum``, ``beta_b``: fp32 ``[N]``,
    contiguous, on ``a``'s device. ``eps`` > 0 (default 1e-5, ``torch.nn.LayerNorm``'s). ``config`` as for
    ``matmul``; under ref mode it is validated and ignored.

    Raises TypeError/ValueError as ``lazy_rmsnorm_matmul``, plus TypeError for non-tensor or non-fp32 vectors and
    ValueError for their shape, layout or device, and for ``sumsq="shared_tile"``.

    Source: the PyTorch blog "Towards Free Normalization" (the RMSNorm form; the LayerNorm extension is ours,
    docs techniques.md section 5),
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    shifted one-pass variance: Chan, Golub & LeVeque, "Algorithms for computing the sample variance" (1983).
    """
    check_forward_only("lazy_prenorm.lazy_layernorm_matmul", a=a, b_folded=b_folded, colsum=colsum, beta_b=beta_b)
    return _run(LN_OP, a, b_folded, check_eps(eps), config, (colsum, beta_b))


@contextlib.contextmanager
def _live_args(bound, args: tuple):
    """Generate code against *these* arguments.

    ``kernel.bind`` returns the cached BoundKernel of the first call with this shape, and Helion's code generation
    re-reads that first call's tensors through weak references (e.g. to prove the 16-byte base alignment that TMA
    needs). Once those tensors are freed, a later ``compile_config``/``to_triton_code`` of a *new* config on a CPU
    device silently falls back from ``tensor_descriptor`` to ``pointer`` loads (seen with helion 1.5.0; on CUDA an
    alignment snapshot taken at bind time covers it). Publishing the current arguments avoids that.
    """
    env = getattr(bound, "env", None)
    use = getattr(env, "use_runtime_arg_values", None)
    if use is None:  # other Helion versions: nothing to do
        yield
        return
    with use(dict(zip(bound.kernel.signature.parameters, args))):
        yield


H200_REGS_PER_SM = 65536


@contextlib.contextmanager
def _as_on_h200(n_sms: int = H200_NUM_SMS):
    """Code generation for CPU tensors as it happens on the H200: ``helion.runtime.get_num_sm`` returns ``n_sms``
    (it asserts for CPU devices; persistent pid_types call it), and Helion's ``maxnreg`` handling is on (Helion
    enables it only when ``torch.cuda.is_available()``; off, it silently drops ``maxnreg`` and skips its own
    "maxnreg needs a persistent pid_type" check, so compile-only would not see what the GPU run sees)."""
    import helion.runtime as hr
    import helion._compat as hc

    try:
        import helion.autotuner.config_spec as hcs
    except ImportError:  # other Helion versions
        hcs = None
    patches = [(hr, "get_num_sm", lambda *a, **k: n_sms)]
    if hasattr(hc, "_supports_maxnreg"):
        patches.append((hc, "_supports_maxnreg", lambda: True))
    if hcs is not None and hasattr(hcs, "_regs_per_block"):
        patches.append((hcs, "_regs_per_block", lambda: H200_REGS_PER_SM))
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    try:
        for mod, name, value in patches:
            setattr(mod, name, value)
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def _codegen_env(a: torch.Tensor):
    return _as_on_h200() if a.device.type == "cpu" else contextlib.nullcontext()


def _bound(op: str, a: torch.Tensor, b: torch.Tensor, eps: float, config, vectors=(None, None)):
    if op not in ALL_OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(ALL_OPS)}")
    (M, N, _), args = _kernel_args(op, a, b, check_eps(eps) if op != "matmul" else None, vectors,
                                   fill_vectors=True)
    cfg = _as_config(config)
    key = cfg.kernel_key(op)
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    return _indexed_kernel(_KERNELS[key], a.numel(), b.numel(), M * N).bind(args), cfg.to_helion(op), args


def triton_code(op: str, a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor | None = None,
                beta_b: torch.Tensor | None = None, *, eps: float = 1e-6, config=None) -> str:
    """The Triton source Helion generates for ``op`` at ``config`` for the shapes/dtypes of ``a``, ``b`` (CPU
    tensors are fine; nothing is compiled; the LayerNorm vectors default to empty fp32 ``[N]``). Raises like
    ``compile_sm90``."""
    bound, hcfg, args = _bound(op, a, b, eps, config, (colsum, beta_b))
    with _live_args(bound, args), _codegen_env(a):
        return bound.to_triton_code(hcfg)


def compile_sm90_kernel(op: str, a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor | None = None,
                        beta_b: torch.Tensor | None = None, *, eps: float = 1e-6, config=None):
    """Like ``compile_sm90`` but returns Triton's ``CompiledKernel`` itself (``.asm["ttgir"]``, ``.asm["ptx"]``,
    ``.metadata``) for inspection, e.g. of how many shared-memory slots the pipeliner gave each operand."""
    from normfuse.compile_only import WarmupLauncher

    bound, hcfg, args = _bound(op, a, b, eps, config, (colsum, beta_b))
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(a):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError(f"{op}: Helion's host code did not launch a kernel; nothing was compiled")
    return launcher.last


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor | None = None,
                 beta_b: torch.Tensor | None = None, *, eps: float = 1e-6, config=None) -> dict:
    """Compile ``op`` (``"matmul"``, ``"lazy_rmsnorm_matmul"`` or ``"lazy_layernorm_matmul"``) for sm_90 without
    launching it.

    The caller must already have run ``normfuse.compile_only.install(90)``. ``a [M, K]``, ``b [K, N]``: CPU tensors
    (``torch.empty`` is fine; only shape, dtype and alignment matter), validated by ``check_inputs``; ``colsum``,
    ``beta_b``: the LayerNorm op's fp32 ``[N]`` vectors (None: empty ones). Binds the
    kernel, compiles ``TilingConfig.from_dict(config).to_helion(op)`` with ``BoundKernel.compile_config`` and
    calls it with a ``normfuse.compile_only.WarmupLauncher``, which compiles the Triton kernel to PTX/cubin and
    never launches. For CPU tensors ``helion.runtime.get_num_sm`` is pinned to 132 (H200) during the call, so
    persistent ``pid_type`` values compile too (Helion asserts on ``get_num_sm(cpu)``), and Helion's ``maxnreg``
    handling is switched on as on a CUDA machine (``.maxnreg`` in the PTX; Helion's persistent-only check).

    Returns ``normfuse.compile_only.summarize(...)``: PTX marker counts (wgmma, TMA, ...), ``shared_bytes``,
    ``num_warps``, ``smem_ok``, ``cluster_dims``. Raises ValueError for an unknown op, bad inputs or config,
    RuntimeError in ref mode (no code generation there), and whatever Helion/Triton raise on a compile failure.
    It checks compilation only: never a correctness signal (the pipeliner bug compiles fine).
    """
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, a, b, colsum, beta_b, eps=eps, config=config))


def ptxas_usage(compiled) -> dict:
    """Registers per thread and spill bytes of a ``CompiledKernel`` (e.g. from ``compile_sm90_kernel``): runs the
    ``ptxas`` that Triton uses for sm_90 (``-v``) on its PTX; no GPU needed. Returns ``{"registers": int,
    "spill_store_bytes": int, "spill_load_bytes": int, "ctas_per_sm": int}``, the last one being the resident
    programs per H200 SM allowed by registers and shared memory (228 KiB per SM, 1 KiB reserved per program).
    Raises RuntimeError when ptxas fails or its report cannot be read."""
    import re

    from normfuse.codestats import ptxas_log

    rc, log = ptxas_log(compiled.asm["ptx"])  # sm_90a, the target of every kernel compiled here
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if rc or not regs or not spills:
        raise RuntimeError(f"ptxas -v failed (rc={rc}):\n{log[-2000:]}")
    threads = 32 * int(compiled.metadata.num_warps)
    n_regs = int(regs.group(1))
    by_regs = H200_REGS_PER_SM // (threads * max(8, -(-n_regs // 8) * 8))  # registers are allocated per 8
    by_smem = (228 * 1024) // (int(compiled.metadata.shared) + 1024)
    return {"registers": n_regs, "spill_store_bytes": int(spills.group(1)), "spill_load_bytes": int(spills.group(2)),
            "ctas_per_sm": max(0, min(by_regs, by_smem))}
