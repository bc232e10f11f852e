r"""Lazy Pre-Norm in upstream Triton (3.6.0, Hopper sm_90): a TMA GEMM and the same GEMM with RMSNorm or LayerNorm
fused in.

Formulation (technique spec: ``normfuse.techniques.lazy_prenorm``)::

    C = (rmsnorm(A, eps) * gamma) @ B = diag(rstd) @ (A @ b_folded),   b_folded = diag(gamma) @ B,
    rstd_i = rsqrt(sum_k A_ik^2 / K + eps)

RMSNorm is a pure row scale, so it commutes with the GEMM. ``lazy_rmsnorm_matmul`` streams raw A tiles into the
MMA, accumulates the per-row sum of squares of A in fp32 on the side, and multiplies the fp32 accumulator by
``rstd`` in the epilogue; the normalized activation never exists in memory. ``matmul`` is the same kernel
without the statistics, the GEMM baseline the fused kernel is measured against.

Kernel structure (both kernels, ``schedule="tile"``, the default): one program per ``BLOCK_M x BLOCK_N``
output tile on a 1-D grid, tiles visited in grouped order (``GROUP_M`` row-tiles share each sweep over N, so the
A row-block and the B column-block stay in L2); A, B and C travel through host-side TMA tensor descriptors
(``triton.tools.tensor_descriptor.TensorDescriptor``: no device allocator is needed); the K loop is a
``tl.range(..., num_stages=...)`` that Triton's software pipeliner turns into a multi-buffered
TMA + mbarrier + wgmma pipeline; the accumulator is fp32. TMA zero-fills out-of-bounds loads and clips
out-of-bounds stores, so M, K and N need not be multiples of the blocks (K and N must be multiples of 8:
16-byte rows, enforced by ``check_inputs``). The row-block schedules below keep the descriptors and the
pipelined K loop and change only which program owns which tiles.

The pipeliner bug (triton-lang/triton#6691, open): when ONE loaded tile feeds both ``tl.dot`` and a register
consumer such as the row reduction ``sum(a*a)``, triton 3.6.0 miscompiles the pipelined loop at
``num_stages >= 3`` with pointer loads (wrong results on H200, rel. err ~3e-2 .. 5e-2, per the upstream repro). That is exactly the naive lazy-prenorm loop. ``TilingConfig.sumsq`` picks how
the fused kernel obtains ``sum(a^2)``:

* ``"shared_tile"``: the naive form; the TMA-loaded A tile feeds the dot and the row sum. Measured on the H200
  (two sweeps of the 9 blog shapes, plus the GPU tests' odd shapes): CORRECT at ``num_stages`` 2 and 3 through
  these host-side TMA descriptors, unlike the pointer-load repro of the bug (wrong at ``num_stages >= 3``). The
  sm_90 TTGIR still shows the hazard: the pipeliner gives A a ring of ``num_stages - 1`` smem slots but B
  ``num_stages``, both prefetched ``num_stages - 1`` iterations ahead with the wgmma left in flight
  (``warp_group_dot_wait pendings=1``), so the TMA for step ``k + num_stages - 1`` targets the A slot that the
  wgmma of step ``k`` reads. ptxas serializes the wgmmas of this loop (warning C7515), which plausibly retires
  each wgmma before that TMA lands (our inference, not verified); it is also why this form is no faster than
  ``"reload"``. Kept to record the finding, not recommended.
* ``"reload"`` (default): the dot takes A from the TMA descriptor load; the sum of squares comes from a
  separate masked pointer load (``tl.load``) of the same A tile in the same iteration, so no loaded value
  has two consumers. The pipeliner then gives the TMA A ring the same depth as B, and streams the second read
  through its own cp.async ring (``num_stages - 1`` extra [BLOCK_M, BLOCK_K] smem slots: 32 KiB at the
  default config). Costs a second read of each A tile (from L2: TMA just brought it there), overlapped with
  the MMAs.
* ``"prepass"`` (same name and meaning as ``"prepass"`` in ``kernels_helion``): a first K loop over the
  program's A row-block computes only the sum of squares (pointer loads), then the unmodified GEMM loop runs
  (Triton pipelines the prepass loop through its own cp.async ring, which shares smem with the GEMM ring).
  The two loops never share a loaded value, but the prepass is not overlapped with MMA work and is repeated by
  every tile of the row-block (``cdiv(N, BLOCK_N)`` times).

Row-block schedules (``TilingConfig.schedule``), "rstd once per row block" (Meta's ``REUSE_RMSNORM_ACROSS_N``
idea, non-persistent): with ``schedule="tile"`` every output tile recomputes the sum of squares of its row block,
``cdiv(N, BLOCK_N)`` times per row (4x at N=1024, 8x at N=2048 with BLOCK_N=256). With ``"rowblock"`` /
``"rowblock_nested"`` one program owns one ``BLOCK_M`` row block (grid ``cdiv(M, BLOCK_M)``; 2048 programs at
M=262144, BLOCK_M=128; ``GROUP_M`` is unused), obtains rstd ONCE, then sweeps all N tiles with the same TMA +
wgmma K loop, scaling each tile's accumulator in its epilogue. A is read from HBM once (its first pass) and
re-read from L2 by the later N tiles (one row block is 256 KiB at K=1024, ~33 MB for 132 resident programs);
B [K, N] is shared by all programs and stays in L2. ``sumsq`` then means:

* ``"prepass"``: a first K loop over the row block computes only the sum of squares, from TMA loads of the same
  descriptor (no dot in that loop, so no loaded value has two consumers: triton#6691 cannot hit). It is not
  overlapped with MMA work, so it is pipelined deeper than the GEMM loop (``_prepass_stages``: up to 8 stages,
  7 tiles in flight); its smem ring is dead before the GEMM ring is allocated and shares its bytes (no extra smem).
  Then all N tiles run the plain GEMM loop.
* ``"reload"``: the first N tile is peeled; its K loop takes the sum of squares exactly like the tile schedule's
  ``"reload"`` (separate masked pointer load, own cp.async ring), overlapped with its MMAs; the remaining
  N tiles run the plain GEMM loop. The extra read is paid once per row block instead of once per tile.
* ``"shared_tile"``: as ``"reload"`` but the naive shared-tile loop in the first tile (same miscompile hazard
  as the tile schedule's ``"shared_tile"``, same 1-slot-short A ring in the IR; not recommended).

``"rowblock"`` flattens the loop over N tiles and the inner K loop into one software-pipelined loop
(``tl.range(..., flatten=True)``, the structure of the Triton persistent-matmul tutorial on Hopper): the TMA
loads of tile n+1 are in flight while tile n's epilogue runs, the epilogue is an ``scf.if`` on the last K step,
and the TMA store of tile n overlaps tile n+1's loop. ``"rowblock_nested"`` keeps the two loops (the inner K
loop is pipelined and drains at the end of every N tile); it is the fallback if the flattened loop misbehaves.
sm_90 IR facts at 128x256x64, num_stages=3 (compile-only): the GEMM loops keep 3-slot A and B TMA rings
(``warp_group_dot`` async, ``warp_group_dot_wait pendings=1``), the prepass gets a 7-slot TMA ring, ``"reload"``
a 2-slot cp.async ring in the peeled tile only; 213016 B of smem (the C staging tile, 64 KiB, stays allocated
across the N loop so that its TMA store can overlap the next tile; the tile schedule reuses the ring for it),
so num_stages=4 does not fit at 128x256x64 (262176 B). No ptxas wgmma-serialization warning (C7515) except for
``"shared_tile"``.

Which GEMM is the fair baseline for the row-block kernels: ``matmul`` honours ``schedule`` too (same kernel,
no statistics), so a row-block tiling entry also times the row-block GEMM, and the metrics take the best GEMM of
the tiling list (``normfuse.metrics``: ``T_gemm_dsl`` is the min over the list). If the schedule alone (flattened
pipeline, store overlap) made the GEMM faster, that gain is thus not credited to the fusion; if the grouped
tile GEMM is faster, the fused row-block kernel also pays for its schedule.

**LayerNorm** (``lazy_layernorm_matmul``, the same kernels with the constexpr ``LN``; math in
``normfuse.techniques.lazy_prenorm``): ``C = rstd ⊙ (A @ b_folded) - (rstd * mean) ⊗ colsum + beta_b``. The
statistics ride on exactly the ``sumsq`` / ``schedule`` machinery above (``"reload"``: a second, pointer load of
each A tile in the K loop; ``"prepass"``: a dot-free loop first; row-block schedules: once per row block), so the
same pipeliner discipline holds: no loaded tile feeds both the dot and a reduction (except in ``"shared_tile"``,
kept for symmetry, not shipped). Per row they are the shifted sums ``S1 = sum (a - c)``, ``S2 = sum (a - c)^2``
with ``c = a[:, 0]`` (one extra pointer load per row before the loop; the K padding is masked unless
``K % BLOCK_K == 0``, constexpr ``EVEN_K``), then ``d = S1/K``, ``mean = c + d``, ``var = max(S2/K - d^2, 0)``.
Two epilogues:

* **extra MMA** (``schedule="tile"`` and ``"rowblock_nested"``, and the peeled first tile of ``"rowblock"``):
  ``acc += A_ext @ B_ext`` with one more ``tl.dot`` of K = 16, then ``acc * rstd``. ``A_ext [BLOCK_M, 16]`` holds
  per row ``-c`` (exact: an element of A), ``-d`` and ``1/rstd`` split into input-dtype parts; ``B_ext [16,
  BLOCK_N]`` the matching input-dtype splits of the colsum / beta_b tile (3 parts for colsum: ~24 bits, the shift
  term is the one that cancels against ``acc``). The colsum / beta_b tile is loaded before the tile's K loop (its
  latency hides behind the loop). Each thread then needs no per-column values at all; a register
  broadcast needs the colsum and beta_b values of all its accumulator columns (64 + 64 per thread at 128x256,
  8 warps), i.e. about as many extra shared/L1 loads per tile as the tile has columns per thread.
* **broadcast** (``schedule="rowblock"``, the flattened N x K loop): the colsum / beta_b tile is loaded and
  broadcast in registers. In the flattened loop the extra dot sits in the pipelined loop's epilogue branch, and
  there the sm_90 TTGIR lost the async wgmma pipelining (no ``pendings = 1``) and ptxas serialized the wgmmas
  (C7515), so the flattened schedule keeps the broadcast.

Only a GPU run can say which formulation is correct at a given ``num_stages``: the compile-only check does not
catch this bug. Every fused config needs a GPU correctness check before its timing is reported. (Every shipped
config, row-block schedules included, passed the H200 check at the 9 blog shapes and at the GPU tests' odd
shapes; results in ``results/lazy_prenorm_blog/``.)

Interpreter (``TRITON_INTERPRET=1``, set before importing triton): both kernels run on CPU tensors in
fp16/fp32. Host ``TensorDescriptor`` works there, so the TMA path itself is interpreted (no pointer fallback is
needed). bf16 ``tl.dot`` is wrong in the interpreter and ``libdevice`` returns None, so the kernels use
``tl.math.rsqrt`` only. Triton 3.6's interpreter cannot run ``tl.range`` over a runtime bound with
numpy >= 2.4 (triton#9171); ``_fix_interpreter_scalar_index`` applies the upstream one-line fix, under the
interpreter only. fp32 inputs use ``input_precision="ieee"`` (exact fp32 FMA dot, no wgmma: fp32 is a debugging
dtype; torch's fp32 matmul with TF32 off is the reference); on sm_90 the default tiles need ~320 KiB of smem in
fp32, so fp32 on the GPU needs e.g. ``BLOCK_N=128, num_stages=2``.

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
the TMA descriptor / grouped-order structure follows the ideas of the Triton persistent/TMA matmul tutorial,
https://triton-lang.org/main/getting-started/tutorials/09-persistent-matmul.html (written from scratch here,
non-persistent).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from normfuse.techniques.lazy_prenorm import check_inputs, check_layernorm_vectors
from normfuse.validate import check_eps, check_forward_only
from normfuse.tiling import TilingConfigBase

__all__ = [
    "SUMSQ_CHOICES",
    "SCHEDULE_CHOICES",
    "TilingConfig",
    "DEFAULT_CONFIG",
    "matmul",
    "lazy_rmsnorm_matmul",
    "lazy_layernorm_matmul",
    "compile_sm90",
    "compile_sm90_kernel",
]

SUMSQ_CHOICES = ("shared_tile", "reload", "prepass")
SCHEDULE_CHOICES = ("tile", "rowblock", "rowblock_nested")
OPS = ("matmul", "lazy_rmsnorm_matmul")
LN_OP = "lazy_layernorm_matmul"
ALL_OPS = OPS + (LN_OP,)
_MAX_BOX = 256  # TMA: at most 256 elements per box dimension
_MIN_BLOCK = 16  # tl.dot needs every dimension >= 16


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _fix_interpreter_scalar_index() -> None:
    """Interpreter-only compat fix for triton#9171 (closed upstream; the 3.6.0 wheel still has the bug).

    The interpreter wraps scalar kernel arguments as 1-element numpy arrays and converts them with ``int(arr)``,
    which numpy >= 2.4 rejects (``TypeError: only 0-dimensional arrays can be converted to Python scalars``),
    so ``tl.range(0, K, ...)`` over a runtime ``K`` fails. We re-register the interpreter's ``tensor.__index__``
    patch with the upstream fix (take the single element explicitly). Applied only under TRITON_INTERPRET and
    only when numpy needs it; it changes nothing on the GPU path. Pinning ``numpy<2.4`` would also do.
    """
    import numpy as np

    try:
        int(np.zeros(1, dtype=np.int32))
        return  # this numpy still converts 1-element arrays: nothing to fix
    except TypeError:
        pass
    from triton.runtime import interpreter as interp

    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_normfuse_index_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._normfuse_index_fix = True
    interp._patch_lang_tensor = patched


if _interpreting():
    _fix_interpreter_scalar_index()


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tile shape, launch parameters and sum-of-squares formulation of both kernels.

    ``BLOCK_M x BLOCK_N`` is one program's output tile, ``BLOCK_K`` the K step; all three are powers of two
    in [16, 256] (``tl.dot`` minimum; TMA box maximum). ``GROUP_M`` (>= 1) row-tiles are swept together over N
    for L2 reuse. ``num_warps`` (power of two, 1..32) and ``num_stages`` (>= 1, the K-loop pipeline depth) are
    passed to the launch and to ``tl.range``. ``sumsq`` (one of ``SUMSQ_CHOICES``) only affects
    ``lazy_rmsnorm_matmul``. ``schedule`` (one of ``SCHEDULE_CHOICES``): ``"tile"`` (one program per output tile,
    grouped order), ``"rowblock"`` (one program per row block over all N tiles, flattened N x K loop, rstd once
    per row block; ``GROUP_M`` unused) or ``"rowblock_nested"`` (the same with a nested N / K loop); it applies
    to both ops. See the module docstring. Construction with a bad value (wrong type included) raises
    ValueError naming the constraint.
    """

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3
    sumsq: str = "reload"
    schedule: str = "tile"

    def __post_init__(self):
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"TilingConfig.{name} must be an int, got {v!r}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(self, name)
            if not (_is_pow2(v) and _MIN_BLOCK <= v <= _MAX_BOX):
                raise ValueError(
                    f"TilingConfig.{name}={v} must be a power of 2 in [{_MIN_BLOCK}, {_MAX_BOX}] "
                    f"(tl.dot minimum, TMA box maximum)"
                )
        if self.GROUP_M < 1:
            raise ValueError(f"TilingConfig.GROUP_M={self.GROUP_M} must be >= 1")
        if not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"TilingConfig.num_warps={self.num_warps} must be a power of 2 in [1, 32]")
        if self.num_stages < 1:
            raise ValueError(f"TilingConfig.num_stages={self.num_stages} must be >= 1")
        if not isinstance(self.sumsq, str):
            raise ValueError(f"TilingConfig.sumsq must be a str, one of {', '.join(SUMSQ_CHOICES)}; got {self.sumsq!r}")
        if self.sumsq not in SUMSQ_CHOICES:
            raise ValueError(f"TilingConfig.sumsq={self.sumsq!r} must be one of {', '.join(SUMSQ_CHOICES)}")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULE_CHOICES:
            raise ValueError(f"TilingConfig.schedule={self.schedule!r} must be one of {', '.join(SCHEDULE_CHOICES)}")


DEFAULT_CONFIG = TilingConfig()


# --------------------------------------------------------------------------------------------------------
# device code
# --------------------------------------------------------------------------------------------------------
@triton.jit
def _grouped_tile(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear tile id to (row-tile, col-tile): GROUP_M row-tiles are swept column by column together."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    group = tile_id // per_group
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may be short
    local = tile_id - group * per_group
    pid_m = first_m + local % rows_in_group
    pid_n = local // rows_in_group
    return pid_m, pid_n


@triton.jit
def _tile_sumsq(a_rows_ptr, row_ok, k0, K, BLOCK_K: tl.constexpr):
    """fp32 per-row sum of squares of one [BLOCK_M, BLOCK_K] A tile read with a masked pointer load
    (independent of the TMA load that feeds the dot). ``a_rows_ptr`` is [BLOCK_M, 1] row-start pointers."""
    cols = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(a_rows_ptr + cols[None, :], mask=row_ok & (cols < K)[None, :], other=0.0).to(tl.float32)
    return tl.sum(x * x, axis=1)


@triton.jit
def _matmul_kernel(a_desc, b_desc, c_desc, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        a = a_desc.load([off_m, k0])
        b = b_desc.load([k0, off_n])
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _tile_ln_stats(x, c, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """LayerNorm: fp32 per-row partial sums ``(sum y, sum y^2)`` of one A tile ``x`` [BLOCK_M, BLOCK_K] (fp32,
    zero past K and past M), shifted by the per-row ``c`` [BLOCK_M]: ``y = x - c``, masked to 0 past K (the
    zero-filled padding would otherwise contribute ``-c``). ``EVEN_K`` (K % BLOCK_K == 0) drops the mask."""
    y = x - c[:, None]
    if not EVEN_K:
        y = tl.where(((k0 + tl.arange(0, BLOCK_K)) < K)[None, :], y, 0.0)
    return tl.sum(y, axis=1), tl.sum(y * y, axis=1)


@triton.jit
def _tile_ln_stats_reload(a_rows_ptr, row_ok, c, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """``_tile_ln_stats`` of the A tile read with its own masked pointer load (the ``"reload"`` discipline: the
    tile feeding the dot and the tile feeding the reductions are different loads)."""
    cols = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(a_rows_ptr + cols[None, :], mask=row_ok & (cols < K)[None, :], other=0.0).to(tl.float32)
    return _tile_ln_stats(x, c, k0, K, BLOCK_K, EVEN_K)


@triton.jit
def _ln_row_scales(s1, s2, K, eps):
    """LayerNorm statistics per row from the shifted sums: ``d = s1/K`` (mean = shift + d) and
    ``rstd = rsqrt(max(s2/K - d^2, 0) + eps)``; returns ``(rstd, d)``."""
    d = s1 / K
    var = tl.maximum(s2 / K - d * d, 0.0)
    return tl.math.rsqrt(var + eps), d  # not libdevice: it returns None in the interpreter


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
    """The [rows, 16] A operand of the rank-1 epilogue MMA (columns: ``-shift`` x3, ``-d1, -d1, -d2``,
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
def _ln_vectors(colsum_ptr, betab_ptr, off_n, N, BLOCK_N: tl.constexpr):
    """The fp32 colsum / beta_b tile [BLOCK_N] of the output columns ``off_n ...`` (0 past N). The extra-MMA
    epilogue loads it before the tile's K loop, so that its latency hides behind the loop."""
    cols = off_n + tl.arange(0, BLOCK_N)
    return (tl.load(colsum_ptr + cols, mask=cols < N, other=0.0),
            tl.load(betab_ptr + cols, mask=cols < N, other=0.0))


@triton.jit
def _ln_b_ext(cs, bb, DT: tl.constexpr):
    """The [16, BLOCK_N] B operand of the rank-1 epilogue MMA from the fp32 colsum / beta_b tile ``cs``, ``bb``:
    rows ``cs1, cs2, cs3, cs1, cs2, cs1, bb1, bb2, bb1`` and zeros, their ``DT`` splits. With ``_ln_a_ext``:
    ``A_ext @ B_ext = -shift ⊗ colsum - d ⊗ colsum + (1/rstd) ⊗ beta_b`` (to ~24 bits in the shift term, whose
    cancellation against ``acc`` is the large one, ~16 bits in the others)."""
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
def _ln_apply(acc, rstd, a_ext, cs, bb, DOT_PRECISION: tl.constexpr):
    """LayerNorm epilogue on one [BLOCK_M, BLOCK_N] fp32 accumulator tile:
    ``rstd * (acc - mean ⊗ colsum + (1/rstd) ⊗ beta_b) = rstd * acc - (rstd * mean) ⊗ colsum + beta_b``, with the
    rank-1 terms added by one extra K=16 MMA (``a_ext`` from ``_ln_a_ext``, B from ``_ln_b_ext`` of the colsum /
    beta_b tile ``cs``, ``bb``) so that no thread has to hold its accumulator columns' colsum / beta_b values (64 of
    each per thread at BLOCK_N=256)."""
    b_ext = _ln_b_ext(cs, bb, a_ext.dtype)
    acc = tl.dot(a_ext, b_ext, acc, input_precision=DOT_PRECISION)
    return acc * rstd[:, None]


@triton.jit
def _ln_apply_broadcast(acc, rstd, d, shift, colsum_ptr, betab_ptr, off_n, N, BLOCK_N: tl.constexpr):
    """The same epilogue with the colsum / beta_b tiles broadcast to the accumulator in registers (every thread
    loads the values of its accumulator columns): ``rstd * acc - (rstd * mean) ⊗ colsum + beta_b``."""
    cols = off_n + tl.arange(0, BLOCK_N)
    cs = tl.load(colsum_ptr + cols, mask=cols < N, other=0.0)
    bb = tl.load(betab_ptr + cols, mask=cols < N, other=0.0)
    return acc * rstd[:, None] - (rstd * (shift + d))[:, None] * cs[None, :] + bb[None, :]


@triton.jit
def _lazy_rmsnorm_matmul_kernel(a_desc, b_desc, c_desc, a_ptr, M, N, K, eps,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                SUMSQ: tl.constexpr, colsum_ptr=None, betab_ptr=None, LN: tl.constexpr = False,
                                EVEN_K: tl.constexpr = False):
    """``schedule="tile"``. ``LN`` (LayerNorm, ``lazy_layernorm_matmul``): shifted ``(sum y, sum y^2)`` instead of
    the sum of squares, and the rank-1 epilogue with ``colsum_ptr`` / ``betab_ptr`` (fp32 [N])."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    # row-start pointers for the pointer-load formulations (int64: M*K may exceed 2^31)
    rows = off_m + tl.arange(0, BLOCK_M)
    row_ok = (rows < M)[:, None]
    a_rows_ptr = a_ptr + rows.to(tl.int64)[:, None] * K

    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    shift = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if LN:  # per-row shift: the row's first element (0 for rows past M)
        shift = tl.load(a_ptr + rows.to(tl.int64) * K, mask=rows < M, other=0.0).to(tl.float32)
    if SUMSQ == "prepass":
        # statistics first, in their own loop: nothing loaded here reaches the dot
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            if LN:
                p1, p2 = _tile_ln_stats_reload(a_rows_ptr, row_ok, shift, k0, K, BLOCK_K, EVEN_K)
                s1 += p1
                ss += p2
            else:
                ss += _tile_sumsq(a_rows_ptr, row_ok, k0, K, BLOCK_K)

    if LN:  # the epilogue's colsum / beta_b tile, loaded before the K loop (latency hidden behind it)
        cs, bb = _ln_vectors(colsum_ptr, betab_ptr, off_n, N, BLOCK_N)
    # "shared_tile": `a` feeds the dot AND the reduction (triton#6691 territory); "reload": a separate pointer
    # load of the same tile, so no loaded value has two consumers; "prepass": a plain GEMM loop
    acc, ss_loop, s1_loop = _k_loop(a_desc, b_desc, a_rows_ptr, row_ok, off_m, off_n, K, BLOCK_M, BLOCK_N,
                                    BLOCK_K, NUM_STAGES, DOT_PRECISION, "none" if SUMSQ == "prepass" else SUMSQ,
                                    shift, LN, EVEN_K)
    ss += ss_loop

    if LN:
        s1 += s1_loop
        rstd, d = _ln_row_scales(s1, ss, K, eps)
        a_ext = _ln_a_ext(shift, d, rstd, a_desc.dtype)
        acc = _ln_apply(acc, rstd, a_ext, cs, bb, DOT_PRECISION)
    else:
        rstd = tl.math.rsqrt(ss / K + eps)  # not libdevice: it returns None in the interpreter
        acc = acc * rstd[:, None]
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _k_loop(a_desc, b_desc, a_rows_ptr, row_ok, off_m, off_n, K,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
            DOT_PRECISION: tl.constexpr, SS_MODE: tl.constexpr, shift, LN: tl.constexpr, EVEN_K: tl.constexpr):
    """One output tile's pipelined K loop (TMA A and B -> wgmma); returns ``(acc, ss, s1)``. ``SS_MODE``:
    ``"none"`` (plain GEMM loop, ``ss``/``s1`` stay 0), ``"shared_tile"`` or ``"reload"`` (the row statistics
    taken in the same loop, as in the tile schedule): the sum of squares, or with ``LN`` the shifted
    ``sum y^2`` (``ss``) and ``sum y`` (``s1``), ``y = a - shift``."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        a = a_desc.load([off_m, k0])
        b = b_desc.load([k0, off_n])
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if SS_MODE == "shared_tile":
            af = a.to(tl.float32)
            if LN:
                p1, p2 = _tile_ln_stats(af, shift, k0, K, BLOCK_K, EVEN_K)
                s1 += p1
                ss += p2
            else:
                ss += tl.sum(af * af, axis=1)
        elif SS_MODE == "reload":
            if LN:
                p1, p2 = _tile_ln_stats_reload(a_rows_ptr, row_ok, shift, k0, K, BLOCK_K, EVEN_K)
                s1 += p1
                ss += p2
            else:
                ss += _tile_sumsq(a_rows_ptr, row_ok, k0, K, BLOCK_K)
    return acc, ss, s1


@triton.jit
def _rowblock_kernel(a_desc, b_desc, c_desc, a_ptr, M, N, K, eps,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, SUMSQ: tl.constexpr,
                     PRE_STAGES: tl.constexpr, FLATTEN: tl.constexpr, colsum_ptr=None, betab_ptr=None,
                     LN: tl.constexpr = False, EVEN_K: tl.constexpr = False):
    """``schedule="rowblock"`` (``FLATTEN``) / ``"rowblock_nested"``: one program per BLOCK_M row block, looping
    over ALL N tiles; rstd once per row block (module docstring). ``SUMSQ="none"`` is the plain GEMM with this
    schedule (the ``matmul`` op; ``a_ptr``/``eps`` unused). ``PRE_STAGES``: pipeline depth of the prepass.
    ``LN``: LayerNorm statistics (shifted sums) and the rank-1 epilogue, as in ``_lazy_rmsnorm_matmul_kernel``."""
    off_m = tl.program_id(0) * BLOCK_M
    rows = off_m + tl.arange(0, BLOCK_M)
    row_ok = (rows < M)[:, None]
    a_rows_ptr = a_ptr + rows.to(tl.int64)[:, None] * K

    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    shift = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if LN:  # per-row shift: the row's first element (0 for rows past M)
        shift = tl.load(a_ptr + rows.to(tl.int64) * K, mask=rows < M, other=0.0).to(tl.float32)
    if SUMSQ == "prepass":
        # Statistics of the whole row block first, through TMA (zero-filled past M and K): A comes from HBM here
        # and stays in L2 for the GEMM loops. Elementwise fp32 accumulation, one cross-thread reduction at the end.
        # No dot in this loop, so nothing loaded here has two consumers (triton#6691 cannot hit). Its ring is
        # dead before the GEMM rings are allocated, so PRE_STAGES (> NUM_STAGES) costs no extra shared memory.
        sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        if LN:
            sy = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
            for k0 in tl.range(0, K, BLOCK_K, num_stages=PRE_STAGES):
                y = a_desc.load([off_m, k0]).to(tl.float32) - shift[:, None]
                if not EVEN_K:  # the zero-filled K padding would contribute -shift
                    y = tl.where(((k0 + tl.arange(0, BLOCK_K)) < K)[None, :], y, 0.0)
                sy += y
                sq += y * y
            s1 = tl.sum(sy, axis=1)
        else:
            for k0 in tl.range(0, K, BLOCK_K, num_stages=PRE_STAGES):
                x = a_desc.load([off_m, k0]).to(tl.float32)
                sq += x * x
        ss = tl.sum(sq, axis=1)

    PEEL: tl.constexpr = SUMSQ == "shared_tile" or SUMSQ == "reload"
    if PEEL:
        # first N tile, peeled: the statistics come from its K loop
        if LN:
            cs, bb = _ln_vectors(colsum_ptr, betab_ptr, 0, N, BLOCK_N)
        acc, ss, s1 = _k_loop(a_desc, b_desc, a_rows_ptr, row_ok, off_m, 0, K,
                              BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, DOT_PRECISION, SUMSQ, shift, LN, EVEN_K)
    if LN:
        rstd, d = _ln_row_scales(s1, ss, K, eps)
        a_ext = _ln_a_ext(shift, d, rstd, a_desc.dtype)  # once per row block
    else:
        rstd = tl.math.rsqrt(ss / K + eps)  # unused (and removed) when SUMSQ == "none"
    if PEEL:
        if LN:
            acc = _ln_apply(acc, rstd, a_ext, cs, bb, DOT_PRECISION)
            c_desc.store([off_m, 0], acc.to(c_desc.dtype))
        else:
            c_desc.store([off_m, 0], (acc * rstd[:, None]).to(c_desc.dtype))

    # the (remaining) N tiles: plain GEMM loops, rstd reused
    for off_n in tl.range(BLOCK_N if PEEL else 0, N, BLOCK_N, flatten=FLATTEN):
        if LN and not FLATTEN:
            cs, bb = _ln_vectors(colsum_ptr, betab_ptr, off_n, N, BLOCK_N)
        acc, _, _ = _k_loop(a_desc, b_desc, a_rows_ptr, row_ok, off_m, off_n, K,
                            BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, DOT_PRECISION, "none", shift, LN, EVEN_K)
        if SUMSQ != "none":
            if LN:
                if FLATTEN:
                    acc = _ln_apply_broadcast(acc, rstd, d, shift, colsum_ptr, betab_ptr, off_n, N, BLOCK_N)
                else:
                    acc = _ln_apply(acc, rstd, a_ext, cs, bb, DOT_PRECISION)
            else:
                acc = acc * rstd[:, None]
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


# --------------------------------------------------------------------------------------------------------
# host code
# --------------------------------------------------------------------------------------------------------
def _as_config(config) -> TilingConfig:
    if config is None or isinstance(config, TilingConfig):
        return config or DEFAULT_CONFIG
    if isinstance(config, Mapping):
        return TilingConfig.from_dict(config)
    raise TypeError(f"config must be a dict, a TilingConfig or None, got {type(config).__name__}")


_MAX_PRE_STAGES = 8


def _prepass_stages(cfg: TilingConfig) -> int:
    """Pipeline depth of the rowblock prepass loop: as deep as the GEMM loop's A+B ring could hold in
    [BLOCK_M, BLOCK_K] slots (the prepass ring is dead before that ring is allocated and shares its shared
    memory), at least ``num_stages``, at most 8 (7 A tiles, 112 KiB at 128x64 bf16, in flight per SM: the
    prepass reads A from HBM and is latency-bound, not overlapped with MMA work)."""
    fit = cfg.num_stages * (cfg.BLOCK_M + cfg.BLOCK_N) // cfg.BLOCK_M
    return max(cfg.num_stages, min(_MAX_PRE_STAGES, fit))


def _prepare(a, b, eps, config, *, launch: bool):
    """Validate, pick the config, allocate C and build the descriptors and launch arguments."""
    M, N, K = check_inputs(a, b, eps)  # the technique's contract, 16-byte aligned a and b (TMA) included
    cfg = _as_config(config)
    if launch and a.device.type != "cuda" and not _interpreting():
        raise ValueError(f"inputs must be CUDA tensors (got device {a.device}); CPU tensors run only under "
                         f"TRITON_INTERPRET=1")
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    a_desc = TensorDescriptor.from_tensor(a, [cfg.BLOCK_M, cfg.BLOCK_K])
    b_desc = TensorDescriptor.from_tensor(b, [cfg.BLOCK_K, cfg.BLOCK_N])
    c_desc = TensorDescriptor.from_tensor(c, [cfg.BLOCK_M, cfg.BLOCK_N])
    if cfg.schedule != "tile":  # one program per row block, all N tiles; GROUP_M is not used
        grid = (triton.cdiv(M, cfg.BLOCK_M),)
        meta = dict(PRE_STAGES=_prepass_stages(cfg), FLATTEN=cfg.schedule == "rowblock")
    else:
        grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N),)
        meta = dict(GROUP_M=cfg.GROUP_M)
    meta.update(
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K,
        NUM_STAGES=cfg.num_stages,
        # fp32 inputs: exact fp32 dot (TF32 would fail the fp32 tolerance); 16-bit inputs: the tensor-core path
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return cfg, (M, N, K), c, (a_desc, b_desc, c_desc), grid, meta


def matmul(a: torch.Tensor, b: torch.Tensor, *, config=None) -> torch.Tensor:
    """``C[M, N] = a[M, K] @ b[K, N]`` with an fp32 accumulator, returned in ``a.dtype`` (the GEMM baseline).

    ``a`` and ``b``: 2-D row-major contiguous tensors of one dtype (bf16 on the GPU; fp16/fp32 also accepted,
    and required under ``TRITON_INTERPRET=1``, whose bf16 dot is wrong), K and N multiples of 8, M >= 1, on a
    CUDA device (CPU tensors only under the interpreter). ``config``: dict, ``TilingConfig`` or None
    (``DEFAULT_CONFIG``); ``sumsq`` is ignored here, ``schedule`` is honoured (``"rowblock*"``: the row-block GEMM,
    the same-schedule counterpart of the fused row-block kernel).

    Raises TypeError (non-tensors, dtypes, config type) and ValueError (ranks, shapes, alignment,
    contiguity, devices, bad config values) via ``normfuse.techniques.lazy_prenorm.check_inputs`` and
    ``TilingConfig``. Source: Triton persistent/TMA matmul tutorial,
    https://triton-lang.org/main/getting-started/tutorials/09-persistent-matmul.html (TMA descriptors, grouped
    tile order; this kernel is non-persistent).
    """
    check_forward_only("lazy_prenorm.matmul", a=a, b=b)
    cfg, (M, N, K), c, descs, grid, meta = _prepare(a, b, None, config, launch=True)
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        if cfg.schedule != "tile":
            _rowblock_kernel[grid](*descs, a, M, N, K, 1.0, SUMSQ="none", **meta)
        else:
            _matmul_kernel[grid](*descs, M, N, K, **meta)
    return c


def lazy_rmsnorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, *, eps: float = 1e-6,
                        config=None) -> torch.Tensor:
    """Fused Lazy Pre-Norm: ``C = rsqrt(mean(a^2, -1) + eps)[:, None] * (a @ b_folded)``, fp32 statistics and
    accumulator, returned in ``a.dtype``. Equals ``(rmsnorm(a) * gamma) @ b`` when ``b_folded = diag(gamma) @ b``
    (``normfuse.techniques.lazy_prenorm.fold_gamma``).

    ``a [M, K]``, ``b_folded [K, N]``: as in ``matmul`` (one dtype, contiguous, K and N multiples of 8, CUDA
    device or the interpreter). ``eps``: finite float > 0. ``config``: dict, ``TilingConfig`` or None;
    ``config.sumsq`` selects how the sum of squares is computed and ``config.schedule`` whether it is computed per
    output tile or once per row block (module docstring; ``"shared_tile"`` is expected to be miscompiled by
    triton 3.6.0 at ``num_stages >= 3``, triton#6691).

    Raises TypeError / ValueError as ``matmul``, and ValueError for a bad ``eps``. Source: PyTorch blog
    "Towards Free Normalization",
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    GEMM structure from https://triton-lang.org/main/getting-started/tutorials/09-persistent-matmul.html .
    """
    check_forward_only("lazy_prenorm.lazy_rmsnorm_matmul", a=a, b_folded=b_folded)
    eps = check_eps(eps)
    cfg, (M, N, K), c, descs, grid, meta = _prepare(a, b_folded, eps, config, launch=True)
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        kernel = _rowblock_kernel if cfg.schedule != "tile" else _lazy_rmsnorm_matmul_kernel
        kernel[grid](*descs, a, M, N, K, eps, SUMSQ=cfg.sumsq, **meta)
    return c


def _ln_meta(a, b_folded, colsum, beta_b, eps, config, *, launch: bool):
    """``_prepare`` plus the LayerNorm extras: the epilogue vectors validated, ``LN`` and ``EVEN_K`` set."""
    eps = check_eps(eps)
    _, N, _ = check_inputs(a, b_folded, eps)
    check_layernorm_vectors(colsum, beta_b, N, a.device)  # before the device check: a bad vector is named first
    cfg, (M, N, K), c, descs, grid, meta = _prepare(a, b_folded, eps, config, launch=launch)
    meta.update(LN=True, EVEN_K=K % cfg.BLOCK_K == 0)
    return eps, cfg, (M, N, K), c, descs, grid, meta


def lazy_layernorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor, *,
                          eps: float = 1e-5, config=None) -> torch.Tensor:
    """Fused Lazy Pre-Norm for LayerNorm: ``C = rstd ⊙ (a @ b_folded) - (rstd * mean) ⊗ colsum + beta_b``, fp32
    statistics, accumulator and epilogue, returned in ``a.dtype``. Equals ``(LN(a) * gamma + beta) @ b`` when
    ``b_folded = diag(gamma) @ b``, ``colsum = b_folded.float().sum(0)`` and ``beta_b = beta @ b`` in fp32
    (``normfuse.techniques.lazy_prenorm.fold_gamma`` / ``layernorm_vectors``, computed once outside timing).

    Numerics: within the flash-attention tolerance for rows whose |mean| is at most 100 standard deviations, the
    documented limit of the rank-1 form (``normfuse.techniques.lazy_prenorm``; at ~1000 std the epilogue's
    cancellation exceeds it in bf16).

    Statistics: per row, the shifted sums ``S1 = sum_k (a_ik - c_i)`` and ``S2 = sum_k (a_ik - c_i)^2`` with
    ``c_i = a_i0`` (shifted one-pass variance; the K padding is masked), accumulated in fp32 by the same
    ``config.sumsq`` / ``config.schedule`` machinery as ``lazy_rmsnorm_matmul`` (``"reload"``: a separate pointer
    load of each A tile in the K loop; ``"prepass"``: a dot-free loop first; row-block schedules: once per row
    block). Then ``mean = c + S1/K``, ``var = max(S2/K - (S1/K)^2, 0)``, ``rstd = rsqrt(var + eps)``.

    ``a [M, K]``, ``b_folded [K, N]``: as in ``matmul``. ``colsum``, ``beta_b``: fp32 ``[N]``, contiguous, on
    ``a``'s device. ``eps``: finite float > 0 (default 1e-5, ``torch.nn.LayerNorm``'s). ``config``: as in
    ``lazy_rmsnorm_matmul``.

    Raises TypeError / ValueError as ``lazy_rmsnorm_matmul``, plus TypeError for a non-tensor or non-fp32
    ``colsum``/``beta_b`` and ValueError for a wrong shape, device or layout of them. Sources: the PyTorch blog
    "Towards Free Normalization" (RMSNorm form; the LayerNorm extension is ours, docs techniques.md §5),
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    shifted one-pass variance: Chan, Golub & LeVeque, "Algorithms for computing the sample variance" (1983).
    """
    check_forward_only("lazy_prenorm.lazy_layernorm_matmul", a=a, b_folded=b_folded, colsum=colsum, beta_b=beta_b)
    eps, cfg, (M, N, K), c, descs, grid, meta = _ln_meta(a, b_folded, colsum, beta_b, eps, config, launch=True)
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        kernel = _rowblock_kernel if cfg.schedule != "tile" else _lazy_rmsnorm_matmul_kernel
        kernel[grid](*descs, a, M, N, K, eps, SUMSQ=cfg.sumsq, colsum_ptr=colsum, betab_ptr=beta_b, **meta)
    return c


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor | None = None,
                 beta_b: torch.Tensor | None = None, *, eps: float = 1e-6, config=None) -> dict:
    """Compile ``op`` (one of ``ALL_OPS``: "matmul", "lazy_rmsnorm_matmul", "lazy_layernorm_matmul") for sm_90
    without launching it; return ``normfuse.compile_only.summarize(compiled)`` (PTX marker counts incl. wgmma /
    TMA, shared bytes, warps).

    The caller must already have run ``normfuse.compile_only.install(90)`` in this process (the fake driver is
    process-global) and must not set ``TRITON_INTERPRET``. ``a [M, K]``, ``b [K, N]``: CPU tensors with the
    real shapes and dtype (``torch.empty`` is enough; they are never read). ``colsum``, ``beta_b``: the
    LayerNorm op's fp32 ``[N]`` vectors; None allocates empty ones. ``config`` as in ``matmul``.
    Raises ValueError for an unknown ``op``, RuntimeError under ``TRITON_INTERPRET=1``, the errors of
    ``matmul`` / ``lazy_rmsnorm_matmul`` / ``lazy_layernorm_matmul`` for bad inputs or config, and Triton's
    compile errors as they come (``OutOfResources`` is NOT raised here, since nothing is loaded onto a device:
    check ``shared_bytes`` / ``smem_ok`` in the result). Compiles through ``kernel.warmup(..., grid=...)``.
    Sources: see ``lazy_rmsnorm_matmul``.
    """
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, a, b, colsum, beta_b, eps=eps, config=config))


def compile_sm90_kernel(op: str, a: torch.Tensor, b: torch.Tensor, colsum: torch.Tensor | None = None,
                        beta_b: torch.Tensor | None = None, *, eps: float = 1e-6, config=None):
    """As ``compile_sm90``, but return Triton's ``CompiledKernel`` itself (``.asm["ttgir"]``, ``.asm["ptx"]``,
    ``.metadata``), e.g. to check how the K loops were pipelined. Same preconditions and errors."""
    if op not in ALL_OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(ALL_OPS)}")
    if _interpreting():
        raise RuntimeError("compile_sm90 cannot run under TRITON_INTERPRET=1")
    if op == "matmul":
        cfg, (M, N, K), c, descs, grid, meta = _prepare(a, b, None, config, launch=False)
        if cfg.schedule != "tile":
            return _rowblock_kernel.warmup(*descs, a, M, N, K, 1.0, grid=grid, SUMSQ="none", **meta)
        return _matmul_kernel.warmup(*descs, M, N, K, grid=grid, **meta)
    if op == LN_OP:
        if isinstance(b, torch.Tensor) and b.dim() == 2:
            n = b.shape[1]
            colsum = torch.empty(n, dtype=torch.float32, device=a.device) if colsum is None else colsum
            beta_b = torch.empty(n, dtype=torch.float32, device=a.device) if beta_b is None else beta_b
        eps, cfg, (M, N, K), c, descs, grid, meta = _ln_meta(a, b, colsum, beta_b, eps, config, launch=False)
        kernel = _rowblock_kernel if cfg.schedule != "tile" else _lazy_rmsnorm_matmul_kernel
        return kernel.warmup(*descs, a, M, N, K, eps, grid=grid, SUMSQ=cfg.sumsq, colsum_ptr=colsum,
                             betab_ptr=beta_b, **meta)
    eps = check_eps(eps)
    cfg, (M, N, K), c, descs, grid, meta = _prepare(a, b, eps, config, launch=False)
    kernel = _rowblock_kernel if cfg.schedule != "tile" else _lazy_rmsnorm_matmul_kernel
    return kernel.warmup(*descs, a, M, N, K, eps, grid=grid, SUMSQ=cfg.sumsq, **meta)
