r"""Standalone RMSNorm / LayerNorm forward in upstream Triton (3.6.0, Hopper sm_90): the memory-bound
denominators of the "% hidden" figures.

Math (technique spec: ``normfuse.techniques.norms``; fp32 statistics, output in ``x.dtype``)::

    RMSNorm:   rstd = rsqrt(sum(x^2) / N + eps);                 y = x * rstd (* weight)
    LayerNorm: mean = sum(x) / N; var = sum((x - mean)^2) / N;  rstd = rsqrt(var + eps)
               y = (x - mean) * rstd (* weight + bias)

LayerNorm never uses ``E[x^2] - mean^2`` (catastrophic cancellation for mean-shifted rows): the whole-row kernel
takes the mean, then the centred sum of squares, both over the row held in registers; the looped kernel takes the
same two-pass statistics per chunk and merges chunks with Chan et al.'s pairwise update
(``M2 = M2_a + M2_b + delta^2 * n_a * n_b / n``), which is as stable as the two-pass formula.

Kernel structure. One program normalizes a ``[ROWS, BLOCK_N]`` tile: ``ROWS`` consecutive rows, fp32 math,
one cross-thread reduction per row. Two variants, picked by ``BLOCK_N`` relative to ``N`` (``launch_params``):

* whole row (``BLOCK_N >= N``, the default ``BLOCK_N=None`` = ``next_pow2(N)``): x is read from HBM once, kept
  in registers, normalized and written: exactly 2*M*N*itemsize bytes, the memory-bound minimum. Use this for
  N up to ~16K-32K (bf16). For small N, ``ROWS > 1`` packs several rows into one program so each program moves
  ``TILE_BYTES`` (default 16 KiB) of x; ``num_warps`` (auto) gives each thread ~``THREAD_ELEMS`` (32) elements
  (four 16-byte vectors in bf16), so it grows with the tile: 4 warps at 4K elements ... 32 warps at 32K.
* looped (``BLOCK_N < N``): pass 1 streams the row in ``BLOCK_N`` chunks to get the statistics (RMSNorm:
  elementwise fp32 sum-of-squares accumulator, reduced once at the end; LayerNorm: per-chunk two-pass stats,
  Chan merge), pass 2 re-reads each chunk (from L2: pass 1 loads carry ``evict_last``, pass 2 ``evict_first``),
  normalizes and stores. HBM traffic stays 2*M*N*itemsize if the rows in flight fit in L2 (H200: 50 MiB; one
  row of 64K bf16 is 128 KiB, times ~132 SMs x a few programs: fits), at the price of an L2 re-read. Use this
  only for very wide rows (N > ~32K) or when the whole-row tile would need more than 32 warps x ~64 registers.
  ``BLOCK_N=None`` picks it automatically beyond ``_MAX_WHOLE_ROW`` (65536) elements.

Inductor's code generation (issue 13 v2; options, all off by default so the older configs compile to the same PTX):
``SPECIALIZE`` compiles for one (M, N) as ``torch.compile(dynamic=False)`` does (M, N constexpr; no row/column
predicates when ``M % ROWS == 0`` and ``N == BLOCK_N`` / ``N % BLOCK_N == 0``; int32 row offsets when they fit),
``EVICT="none"`` drops the L2 ``evict_first`` policy of the whole-row load (and its ``createpolicy``), and
``STATS=False`` writes y only (the torch.compile baseline's kernels store no rstd/mean:
results/inductor_norms/20261201_h200/*.kernel.txt). sm_90 PTX of ``per-w1-spec`` at 262144 x 512 / 1024: 210 / 185
instructions (RMS) and 294 / 259 (LN) against Inductor's 209 / 184 and 293 / 258 (unspecialized ``per-w1``: 233 /
216, 356 / 326); the remaining instruction is the runtime ``eps`` (Inductor folds it).

v3 (options, off by default): ``CONST_EPS`` compiles eps in, which removes that instruction (``per-w1-spec-eps``: 209 /
184 and 293 / 258, Inductor's counts). ``LN_STATS="shifted"`` replaces the looped LayerNorm's per-chunk two-pass
statistics -- two barrier-separated cross-thread reductions per chunk (16 at N = 16384 in 2048-wide chunks), so each
chunk's loads wait for the previous chunk's reductions, while Inductor's Welford loop is elementwise with one
reduction after it; both read x twice (statistics loop, then the re-read loop) -- by elementwise shifted sums and one
paired reduction after the loop. It also brings the one-chunk re-read LayerNorm at 262144 x 32768 (32 warps) from 64
to 32 registers (two 1024-thread programs per SM, as Inductor's kernel). ``MAXNREG`` passes Triton's ``maxnreg``
option to ptxas: capping the two-pass kernel there at 32 registers spills (~170 bytes).

Persistent grid (``PERSISTENT=True``): ``min(#tiles, #SMs * max(1, 32 // num_warps))`` programs (an estimate
of how many are co-resident: half the 64 warps an SM can hold, leaving room for register limits) loop over
row tiles; otherwise one program per tile. Which wins is for the GPU sweep to say (``PROPOSED_TILINGS``).

16-byte accesses. Triton vectorizes a masked load only if it can prove the mask and the address are constant /
aligned over the vector. The row stride and the column mask both use ``N``, so the host passes ``N`` as
``N_DIV * ALIGN`` (``ALIGN``: the largest power of two <= 16 dividing N, a constexpr): the compiler then knows
``N`` is a multiple of ``ALIGN`` and emits ``ld.global.v4.b32`` / ``st.global.v4.b32`` (16 bytes) whenever
``ALIGN * itemsize >= 16`` (bf16/fp16: N % 8 == 0; fp32: N % 4 == 0), e.g. N=1000 in bf16 too (Triton's own
argument specialization only knows "divisible by 16"). Odd N (e.g. 4095) falls back to scalar accesses:
correct, slower. Row offsets are int64 (M*N may exceed 2^31). Rows past M and columns past N are masked, so any
M >= 1, N >= 1 works; a NaN/Inf in one row only reaches that row's statistics and output (reductions are per row).

sm_90 compile facts (compile-only, bf16, affine; registers from Triton's bundled ``ptxas -v`` on the PTX):
16-byte ``ld.global.L1::evict_first.L2::cache_hint.v4.b32`` loads and ``st.global.v4.b32`` stores of x / y for
N = 512, 1000, 1024, 4096 ... 32768 (looped too); N = 4095 gives 2-byte scalar accesses. Shared memory is only the
reduction scratch (32 B .. 8 KiB). Defaults: RMSNorm 51-64 registers, no spills; LayerNorm 64 registers with a
4-byte spill at N=1024 (ROWS=8, 8 warps; ``THREAD_ELEMS=16``: 40 registers, no spill), 101 registers at N=16K
(16 warps: one program per SM), 60 at 32K (32 warps). Persistent adds ~15-25 registers.

Interpreter (``TRITON_INTERPRET=1``, set before importing triton): CPU tensors in fp16/fp32 (bf16 is not
checked there). ``rsqrt`` is ``tl.math.rsqrt`` (``libdevice`` returns None in the interpreter). Triton 3.6's
interpreter cannot run ``tl.range`` over a runtime bound with numpy >= 2.4 (triton#9171): we apply
``kernels_triton.lazy_prenorm._fix_interpreter_scalar_index`` (interpreter only).

Sources: the Triton LayerNorm tutorial (https://triton-lang.org/main/getting-started/tutorials/05-layer-norm.html,
whole-row-in-registers forward; its looped variant uses three passes, here two with a Chan merge); Chan, Golub,
LeVeque, "Updating formulae and a pairwise algorithm for computing sample variances" (1979); QuACK's memory-bound
notes on rows-per-program / threads-per-row (https://github.com/Dao-AILab/quack/blob/main/media/2025-07-10-membound-sol.md).
Written from scratch here. Status: CPU-checked (interpreter, sm_90 compile-only); GPU numbers are open work.
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
from normfuse.techniques.norms import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

__all__ = [
    "OPS",
    "TilingConfig",
    "DEFAULT_CONFIG",
    "PROPOSED_TILINGS",
    "launch_params",
    "rms_norm",
    "layer_norm",
    "compile_sm90",
    "compile_sm90_kernel",
]

OPS = ("rms_norm", "layer_norm")
_MAX_BLOCK_N = 65536  # widest register tile (elements) we allow
_MAX_WHOLE_ROW = 65536  # BLOCK_N=None: whole row up to this N, looped beyond it
_AUTO_LOOP_BLOCK_N = 8192  # BLOCK_N=None and N > _MAX_WHOLE_ROW
_MAX_ROWS = 256
_DEFAULT_NUM_SMS = 132  # H100 SXM / H200 (used off-GPU: interpreter, compile-only)
_EVICT_POLICIES = {"first": "evict_first", "last": "evict_last", "none": ""}  # EVICT -> Triton eviction_policy
_LN_STATS = ("twopass", "shifted")  # LN_STATS: looped LayerNorm statistics
_FP32_TINY, _FP32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38  # CONST_EPS: eps stays an fp32 constant

if _interpreting():
    _fix_interpreter_scalar_index()


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tiling of both norm kernels (see the module docstring for which variant to use where).

    * ``BLOCK_N`` (power of 2 in [16, 65536] or None): columns per register tile. None: ``next_pow2(N)`` (whole
      row) up to N = 65536, else 8192 (looped). ``BLOCK_N >= N``: whole-row kernel (BLOCK_N is clamped to
      ``next_pow2(N)``); ``BLOCK_N < N``: looped two-pass kernel.
    * ``ROWS`` (power of 2 in [1, 256] or None): rows per program. None: ``TILE_BYTES // (BLOCK_N * itemsize)``
      rounded down to a power of 2, at least 1, at most ``next_pow2(M)`` and 256.
    * ``TILE_BYTES`` (power of 2 in [1024, 1 MiB]): target bytes of x per program when ``ROWS`` is None.
    * ``THREAD_ELEMS`` (power of 2 in [4, 128]): target elements per thread when ``num_warps`` is None.
    * ``num_warps`` (power of 2 in [1, 32] or None): None gives ~``THREAD_ELEMS`` elements per thread,
      ``clamp(next_pow2(ROWS * BLOCK_N / (32 * THREAD_ELEMS)), 4, 32)``.
    * ``PERSISTENT`` (bool): persistent grid over row tiles instead of one program per tile.
    * ``REREAD`` (bool): the looped two-pass kernel even when the row fits in one ``BLOCK_N`` chunk: statistics
      pass (``evict_last``), then a re-read of the row (from L1/L2, ``evict_first``) to normalize and store. This
      is Inductor's kernel shape for wide rows (one row per program, 16-32 warps); it keeps fewer values live
      than holding the row in registers across the reduction.
    * ``EVICT`` ("first" | "last" | "none"): L2 eviction hint on the last read of x (the whole-row load, or the
      re-read pass of the looped kernel; the looped statistics pass always loads with ``evict_last`` so that the
      re-read hits L2). "first" (default) is ``evict_first``; "none" drops the hint and with it the
      ``createpolicy`` instruction, as Inductor's whole-row (persistent-reduction) kernels do.
    * ``SPECIALIZE`` (bool): compile for this one shape, as ``torch.compile(dynamic=False)`` does: M and N become
      compile-time constants; the row mask is dropped when ``M % ROWS == 0``, the column mask when
      ``N == BLOCK_N`` (whole row) or ``N % BLOCK_N == 0`` (looped), so those loads and stores carry no
      predicates; row offsets are int32 when every offset fits (``cdiv(M, ROWS) * ROWS * N < 2^31``). One
      compile per (M, N). Same arithmetic as the unspecialized kernel (bit-identical in the interpreter).
    * ``STATS`` (bool): store the fp32 statistics (default). False: write y only, like the ``torch_compile_norm``
      baseline (its kernels store y and nothing else, results/inductor_norms/20261201_h200/*.kernel.txt); the
      functions then return the 1-tuple ``(y,)`` (``out[0]`` is y either way). For like-for-like timing against
      Inductor, not for callers that need the statistics (backward).

    * ``CONST_EPS`` (bool): compile ``eps`` in as a constant, as Inductor does (``tmp = 1e-05`` in its kernels), instead
      of a runtime fp32 argument: one compile per eps value, one PTX instruction less (the parameter load). The
      constant is the same fp32 value, so the output is bit-identical.
    * ``LN_STATS`` ("twopass" | "shifted"): LayerNorm statistics of the looped / re-read kernel. "twopass" (default):
      per chunk the mean, then the centred sum of squares, merged with Chan's update: two cross-thread reductions
      (shared memory + barriers) per chunk, so each chunk's loads wait for the previous chunk's reductions.
      "shifted": one-pass shifted sums ``S1 = sum(x - c)``, ``S2 = sum((x - c)^2)`` with ``c = x[row, 0]``,
      accumulated elementwise in the loop (like the RMS accumulator, like Inductor's elementwise Welford loop) and
      reduced once after it: ``mean = c + S1 / N``, ``var = max(S2 / N - (S1 / N)^2, 0)``. Stable for mean-shifted
      rows (the shift removes the mean up to one element's deviation: ``(mean - c)^2 <= N * var``), not
      ``E[x^2] - mean^2``. RMSNorm and the whole-row kernel ignore it.
    * ``LEAN_ARGS`` (bool): pass None for every pointer or scalar the compiled kernel never reads (w / b without
      affine, mean / rstd with ``STATS=False``, eps with ``CONST_EPS``, n_tiles without ``PERSISTENT``): Triton
      turns a None argument into a constexpr and drops it from the kernel's parameters, so without affine, with
      ``STATS=False`` and ``CONST_EPS`` and not ``PERSISTENT`` the parameter block is Inductor's (x, y, the row and
      column counts, which are always passed, and Triton's two scratch pointers: 6 parameters; 10-12 otherwise).
      Same code otherwise (a None argument that the kernel did read would fail to compile, not compute).
    * ``MAXNREG`` (int multiple of 8 in [16, 248] or None): register cap per thread handed to ptxas (Triton's
      ``maxnreg`` compile option, ``.maxnreg`` in the PTX), e.g. 32 so that two 1024-thread programs fit per SM
      (65536 registers). Values below what the kernel needs make ptxas spill to local memory (check ``ptxas -v``).

    Construction with a bad value (wrong type included) raises ValueError naming the constraint.
    """

    BLOCK_N: int | None = None
    ROWS: int | None = None
    TILE_BYTES: int = 16384
    THREAD_ELEMS: int = 32
    num_warps: int | None = None
    PERSISTENT: bool = False
    REREAD: bool = False
    EVICT: str = "first"
    SPECIALIZE: bool = False
    STATS: bool = True
    CONST_EPS: bool = False
    LN_STATS: str = "twopass"
    LEAN_ARGS: bool = False
    MAXNREG: int | None = None

    def __post_init__(self):
        for name, lo, hi in (("BLOCK_N", 16, _MAX_BLOCK_N), ("ROWS", 1, _MAX_ROWS), ("TILE_BYTES", 1024, 1 << 20),
                             ("THREAD_ELEMS", 4, 128), ("num_warps", 1, 32)):
            v = getattr(self, name)
            if v is None and name in ("BLOCK_N", "ROWS", "num_warps"):
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"TilingConfig.{name} must be an int{' or None' if name in ('BLOCK_N', 'ROWS', 'num_warps') else ''}, "
                                 f"got {v!r}")
            if not (_is_pow2(v) and lo <= v <= hi):
                raise ValueError(f"TilingConfig.{name}={v} must be a power of 2 in [{lo}, {hi}]")
        for name in ("PERSISTENT", "REREAD", "SPECIALIZE", "STATS", "CONST_EPS", "LEAN_ARGS"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TilingConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.EVICT, str) or self.EVICT not in _EVICT_POLICIES:
            raise ValueError(f"TilingConfig.EVICT must be one of {', '.join(_EVICT_POLICIES)}, got {self.EVICT!r}")
        if not isinstance(self.LN_STATS, str) or self.LN_STATS not in _LN_STATS:
            raise ValueError(f"TilingConfig.LN_STATS must be one of {', '.join(_LN_STATS)}, got {self.LN_STATS!r}")
        if self.MAXNREG is not None and (not isinstance(self.MAXNREG, int) or isinstance(self.MAXNREG, bool)
                                         or not 16 <= self.MAXNREG <= 248 or self.MAXNREG % 8):
            raise ValueError(f"TilingConfig.MAXNREG must be None or a multiple of 8 in [16, 248] (registers per "
                             f"thread), got {self.MAXNREG!r}")


DEFAULT_CONFIG = TilingConfig()

# Proposed tiling list for the H200 sweep N in {512 ... 32768}, M in {4096, 16384, 262144} (bf16). Every entry is
# valid at every N (None fields adapt to N); the sweep keeps the best per shape. Unmeasured: GPU work is open.
PROPOSED_TILINGS = [
    {"name": "row-auto"},  # whole row, ~16 KiB of x per program, ~32 elements per thread
    {"name": "row-auto-32k", "TILE_BYTES": 32768},  # twice the rows per program (N <= 8K): more bytes in flight
    {"name": "row-auto-8k", "TILE_BYTES": 8192},  # half the rows per program: more, smaller programs
    {"name": "row-auto-16ept", "THREAD_ELEMS": 16},  # twice the warps: ~16 elements/thread, fewer registers
    {"name": "row-auto-persistent", "PERSISTENT": True},  # persistent grid over the row tiles
    {"name": "loop-8192", "BLOCK_N": 8192},  # whole row up to N=8K, looped two-pass for 16K and 32K
]


# --------------------------------------------------------------------------------------------------------
# device code
# --------------------------------------------------------------------------------------------------------
@triton.jit
def _tile_mask(row_ok, cmask, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
    """[ROWS, BLOCK_N] in-bounds mask (only the parts not known statically; unused when EVEN_M and EVEN_N)."""
    if EVEN_N:
        return row_ok[:, None]
    elif EVEN_M:
        return cmask[None, :]
    else:
        return row_ok[:, None] & cmask[None, :]


@triton.jit
def _load_tile(ptrs, mask, NO_MASK: tl.constexpr, EVICT: tl.constexpr):
    """x[ptrs] in fp32, 0 where ``mask`` is False; NO_MASK (tile known in bounds): no predicates at all."""
    if NO_MASK:
        x = tl.load(ptrs, eviction_policy=EVICT)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
    return x.to(tl.float32)


@triton.jit
def _store_tile(ptrs, y, mask, NO_MASK: tl.constexpr):
    if NO_MASK:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty))
    else:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _load_vec(ptrs, cmask, EVEN_N: tl.constexpr):
    """weight / bias [BLOCK_N] in fp32 (0 past N unless EVEN_N)."""
    if EVEN_N:
        v = tl.load(ptrs)
    else:
        v = tl.load(ptrs, mask=cmask, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _row_offsets(rows, N, IDX64: tl.constexpr):
    """Element offset of each row start: int64 unless the launcher proved every offset fits in int32."""
    if IDX64:
        return rows.to(tl.int64) * N
    else:
        return rows * N


@triton.jit
def _rms_tile(x_ptr, w_ptr, y_ptr, rstd_ptr, tile, M, N, eps,
              BLOCK_N: tl.constexpr, ROWS: tl.constexpr, LOOPED: tl.constexpr, HAS_W: tl.constexpr,
              EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, IDX64: tl.constexpr, EVICT: tl.constexpr,
              STATS: tl.constexpr):
    rows = tile * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    row_off = _row_offsets(rows, N, IDX64)  # [ROWS]; N is a known multiple of ALIGN (or a constexpr)
    if not LOOPED:
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        offs = row_off[:, None] + cols[None, :]
        mask = _tile_mask(row_ok, cmask, EVEN_M, EVEN_N)
        x = _load_tile(x_ptr + offs, mask, EVEN_M and EVEN_N, EVICT)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        y = x * rstd[:, None]
        if HAS_W:
            w = _load_vec(w_ptr + cols, cmask, EVEN_N)
            y = y * w[None, :]
        _store_tile(y_ptr + offs, y, mask, EVEN_M and EVEN_N)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for n0 in tl.range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            mask = _tile_mask(row_ok, cols < N, EVEN_M, EVEN_N)
            x = _load_tile(x_ptr + row_off[:, None] + cols[None, :], mask, EVEN_M and EVEN_N, "evict_last")
            acc += x * x
        rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / N + eps)
        for n0 in tl.range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            offs = row_off[:, None] + cols[None, :]
            mask = _tile_mask(row_ok, cmask, EVEN_M, EVEN_N)
            x = _load_tile(x_ptr + offs, mask, EVEN_M and EVEN_N, EVICT)
            y = x * rstd[:, None]
            if HAS_W:
                w = _load_vec(w_ptr + cols, cmask, EVEN_N)
                y = y * w[None, :]
            _store_tile(y_ptr + offs, y, mask, EVEN_M and EVEN_N)
    if STATS:
        if EVEN_M:
            tl.store(rstd_ptr + rows, rstd)
        else:
            tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _add_pair(a1, a2, b1, b2):
    """Combine function of ``tl.reduce`` over the pair (S1, S2)."""
    return a1 + b1, a2 + b2


@triton.jit
def _ln_reread(x_ptr, w_ptr, b_ptr, y_ptr, row_off, row_ok, mean, rstd, N, BLOCK_N: tl.constexpr,
               HAS_W: tl.constexpr, HAS_B: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
               EVICT: tl.constexpr):
    """Pass 2 of the looped LayerNorm: re-read each chunk (L2), normalize with the row's mean / rstd, store."""
    for n0 in tl.range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        cmask = cols < N
        offs = row_off[:, None] + cols[None, :]
        mask = _tile_mask(row_ok, cmask, EVEN_M, EVEN_N)
        x = _load_tile(x_ptr + offs, mask, EVEN_M and EVEN_N, EVICT)
        y = (x - mean[:, None]) * rstd[:, None]
        if HAS_W:
            y = y * _load_vec(w_ptr + cols, cmask, EVEN_N)[None, :]
        if HAS_B:
            y = y + _load_vec(b_ptr + cols, cmask, EVEN_N)[None, :]
        _store_tile(y_ptr + offs, y, mask, EVEN_M and EVEN_N)


@triton.jit
def _ln_tile(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, tile, M, N, eps,
             BLOCK_N: tl.constexpr, ROWS: tl.constexpr, LOOPED: tl.constexpr, HAS_W: tl.constexpr,
             HAS_B: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, IDX64: tl.constexpr,
             EVICT: tl.constexpr, STATS: tl.constexpr, SHIFTED: tl.constexpr):
    rows = tile * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    row_off = _row_offsets(rows, N, IDX64)
    if not LOOPED:
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        offs = row_off[:, None] + cols[None, :]
        mask = _tile_mask(row_ok, cmask, EVEN_M, EVEN_N)
        x = _load_tile(x_ptr + offs, mask, EVEN_M and EVEN_N, EVICT)
        mean = tl.sum(x, axis=1) / N  # two passes over registers: mean, then the centred sum of squares
        if EVEN_N:
            d = x - mean[:, None]
        else:
            d = tl.where(cmask[None, :], x - mean[:, None], 0.0)
        rstd = tl.math.rsqrt(tl.sum(d * d, axis=1) / N + eps)
        y = d * rstd[:, None]
        if HAS_W:
            y = y * _load_vec(w_ptr + cols, cmask, EVEN_N)[None, :]
        if HAS_B:
            y = y + _load_vec(b_ptr + cols, cmask, EVEN_N)[None, :]
        _store_tile(y_ptr + offs, y, mask, EVEN_M and EVEN_N)
    elif SHIFTED:
        # pass 1: shifted sums of x - x[row, 0], elementwise in the loop, reduced once after it (no barrier per chunk)
        if EVEN_M:
            c = tl.load(x_ptr + row_off).to(tl.float32)
        else:
            c = tl.load(x_ptr + row_off, mask=row_ok, other=0.0).to(tl.float32)
        s1 = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        s2 = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for n0 in tl.range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = _tile_mask(row_ok, cmask, EVEN_M, EVEN_N)
            x = _load_tile(x_ptr + row_off[:, None] + cols[None, :], mask, EVEN_M and EVEN_N, "evict_last")
            if EVEN_N:
                d = x - c[:, None]
            else:
                d = tl.where(cmask[None, :], x - c[:, None], 0.0)
            s1 += d
            s2 += d * d
        t1, t2 = tl.reduce((s1, s2), 1, _add_pair)  # one cross-thread reduction of both sums
        dmean = t1 / N
        var = t2 / N - dmean * dmean
        var = tl.where(var < 0.0, 0.0, var)  # rounding; a NaN stays NaN
        mean = c + dmean
        rstd = tl.math.rsqrt(var + eps)
        _ln_reread(x_ptr, w_ptr, b_ptr, y_ptr, row_off, row_ok, mean, rstd, N, BLOCK_N, HAS_W, HAS_B,
                   EVEN_M, EVEN_N, EVICT)
    else:
        # pass 1: per-chunk (mean_b, M2_b) in registers, merged into (mean, M2) with Chan's update
        mean = tl.zeros([ROWS], dtype=tl.float32)
        m2 = tl.zeros([ROWS], dtype=tl.float32)
        for n0 in tl.range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = _tile_mask(row_ok, cmask, EVEN_M, EVEN_N)
            x = _load_tile(x_ptr + row_off[:, None] + cols[None, :], mask, EVEN_M and EVEN_N, "evict_last")
            n_a = n0 * 1.0  # elements merged so far (every earlier chunk is full)
            if EVEN_N:
                n_b = BLOCK_N * 1.0
                mean_b = tl.sum(x, axis=1) / n_b
                d = x - mean_b[:, None]
            else:
                n_b = tl.minimum(N - n0, BLOCK_N) * 1.0
                mean_b = tl.sum(x, axis=1) / n_b
                d = tl.where(cmask[None, :], x - mean_b[:, None], 0.0)
            m2_b = tl.sum(d * d, axis=1)
            delta = mean_b - mean
            n_ab = n_a + n_b
            mean = mean + delta * (n_b / n_ab)
            m2 = m2 + m2_b + delta * delta * (n_a * n_b / n_ab)
        rstd = tl.math.rsqrt(m2 / N + eps)
        _ln_reread(x_ptr, w_ptr, b_ptr, y_ptr, row_off, row_ok, mean, rstd, N, BLOCK_N, HAS_W, HAS_B,
                   EVEN_M, EVEN_N, EVICT)
    if STATS:
        if EVEN_M:
            tl.store(mean_ptr + rows, mean)
            tl.store(rstd_ptr + rows, rstd)
        else:
            tl.store(mean_ptr + rows, mean, mask=row_ok)
            tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, M_RT, N_DIV, eps, n_tiles,
                     ALIGN: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, LOOPED: tl.constexpr,
                     HAS_W: tl.constexpr, PERSISTENT: tl.constexpr, M_C: tl.constexpr = 0,
                     N_C: tl.constexpr = 0, EVEN_M: tl.constexpr = False, EVEN_N: tl.constexpr = False,
                     IDX64: tl.constexpr = True, EVICT: tl.constexpr = "evict_first",
                     STATS: tl.constexpr = True, EPS_C: tl.constexpr = 0.0):
    # M_C / N_C > 0 (SPECIALIZE): the shape is a compile-time constant, as in Inductor's dynamic=False kernels
    if N_C > 0:
        N: tl.constexpr = N_C
    else:
        N = N_DIV * ALIGN  # N % ALIGN == 0 is now visible to the alignment analysis (16-byte vectors)
    if M_C > 0:
        M: tl.constexpr = M_C
    else:
        M = M_RT
    if EPS_C > 0.0:  # CONST_EPS: eps folded in (fp32 constant, the same value as the runtime argument)
        EPS: tl.constexpr = EPS_C
    else:
        EPS = eps
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            _rms_tile(x_ptr, w_ptr, y_ptr, rstd_ptr, tile, M, N, EPS, BLOCK_N, ROWS, LOOPED, HAS_W,
                      EVEN_M, EVEN_N, IDX64, EVICT, STATS)
    else:
        _rms_tile(x_ptr, w_ptr, y_ptr, rstd_ptr, tl.program_id(0), M, N, EPS, BLOCK_N, ROWS, LOOPED, HAS_W,
                  EVEN_M, EVEN_N, IDX64, EVICT, STATS)


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M_RT, N_DIV, eps, n_tiles,
                       ALIGN: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, LOOPED: tl.constexpr,
                       HAS_W: tl.constexpr, HAS_B: tl.constexpr, PERSISTENT: tl.constexpr, M_C: tl.constexpr = 0,
                       N_C: tl.constexpr = 0, EVEN_M: tl.constexpr = False, EVEN_N: tl.constexpr = False,
                       IDX64: tl.constexpr = True, EVICT: tl.constexpr = "evict_first",
                       STATS: tl.constexpr = True, EPS_C: tl.constexpr = 0.0, SHIFTED: tl.constexpr = False):
    if N_C > 0:
        N: tl.constexpr = N_C
    else:
        N = N_DIV * ALIGN
    if M_C > 0:
        M: tl.constexpr = M_C
    else:
        M = M_RT
    if EPS_C > 0.0:  # CONST_EPS: eps folded in (fp32 constant, the same value as the runtime argument)
        EPS: tl.constexpr = EPS_C
    else:
        EPS = eps
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            _ln_tile(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, tile, M, N, EPS,
                     BLOCK_N, ROWS, LOOPED, HAS_W, HAS_B, EVEN_M, EVEN_N, IDX64, EVICT, STATS, SHIFTED)
    else:
        _ln_tile(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, tl.program_id(0), M, N, EPS,
                 BLOCK_N, ROWS, LOOPED, HAS_W, HAS_B, EVEN_M, EVEN_N, IDX64, EVICT, STATS, SHIFTED)


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
def _num_sms(device_index: int | None) -> int:
    if device_index is None:
        return _DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def launch_params(M: int, N: int, dtype: torch.dtype, config=None, *, num_sms: int = _DEFAULT_NUM_SMS) -> dict:
    """Resolve ``config`` (dict, ``TilingConfig`` or None) for ``x [M, N]`` of ``dtype``: the concrete
    ``BLOCK_N``, ``ROWS``, ``num_warps``, ``LOOPED``, ``ALIGN`` (largest power of two <= 16 dividing N),
    ``PERSISTENT``, ``n_tiles``, ``grid``, the shape specialization ``EVEN_M`` / ``EVEN_N`` (mask-free rows /
    columns) and ``IDX64`` (int64 row offsets; always True without ``SPECIALIZE``), ``EVICT`` (Triton's
    eviction_policy string), ``STATS``, ``CONST_EPS``, ``SHIFTED`` (``LN_STATS == "shifted"``; LayerNorm's looped
    kernel only), ``MAXNREG`` and ``LEAN_ARGS``. Pure host arithmetic (no triton call); the rules are in the
    ``TilingConfig`` docstring. Raises the ``TilingConfig`` errors."""
    cfg = _as_config(config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    full = triton.next_power_of_2(N)
    if cfg.BLOCK_N is None:
        block_n = full if N <= _MAX_WHOLE_ROW else _AUTO_LOOP_BLOCK_N
    else:
        block_n = min(cfg.BLOCK_N, full)
    looped = block_n < N or cfg.REREAD
    if cfg.ROWS is None:
        rows = max(1, cfg.TILE_BYTES // (block_n * itemsize))
        rows = min(1 << (rows.bit_length() - 1), triton.next_power_of_2(M), _MAX_ROWS)
    else:
        rows = cfg.ROWS
    if cfg.num_warps is None:
        num_warps = min(32, max(4, triton.next_power_of_2(triton.cdiv(rows * block_n, 32 * cfg.THREAD_ELEMS))))
    else:
        num_warps = cfg.num_warps
    align = 1
    while align < 16 and N % (2 * align) == 0:
        align *= 2
    n_tiles = triton.cdiv(M, rows)
    programs = min(n_tiles, num_sms * max(1, 32 // num_warps)) if cfg.PERSISTENT else n_tiles
    spec = cfg.SPECIALIZE
    even_m = spec and M % rows == 0
    even_n = spec and (N == block_n if not looped else N % block_n == 0)
    idx64 = not spec or n_tiles * rows * N >= 2**31
    return dict(BLOCK_N=block_n, ROWS=rows, num_warps=num_warps, LOOPED=looped, ALIGN=align,
                PERSISTENT=cfg.PERSISTENT, n_tiles=n_tiles, grid=(programs,), SPECIALIZE=spec, EVEN_M=even_m,
                EVEN_N=even_n, IDX64=idx64, EVICT=_EVICT_POLICIES[cfg.EVICT], STATS=cfg.STATS,
                CONST_EPS=cfg.CONST_EPS, SHIFTED=cfg.LN_STATS == "shifted", MAXNREG=cfg.MAXNREG,
                LEAN_ARGS=cfg.LEAN_ARGS)


def _prepare(op, x, weight, bias, eps, config, *, launch: bool):
    """Validate, resolve the config, allocate outputs and build the launch arguments."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    eps = check_eps(eps)
    M, N = check_inputs(x, weight, bias, eps)
    cfg = _as_config(config)
    if launch and x.device.type != "cuda" and not _interpreting():
        raise ValueError(f"inputs must be CUDA tensors (got device {x.device}); CPU tensors run only under "
                         f"TRITON_INTERPRET=1")
    p = launch_params(M, N, x.dtype, cfg, num_sms=_num_sms(x.device.index or 0) if x.is_cuda else _DEFAULT_NUM_SMS)
    y = torch.empty_like(x)
    if p["STATS"]:
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        mean = torch.empty(M, dtype=torch.float32, device=x.device) if op == "layer_norm" else None
    else:  # STATS=False: never written; dummy pointers
        rstd = mean = None
    # what the kernel never reads: None with LEAN_ARGS (a constexpr, no kernel parameter), else a dummy pointer
    lean = p["LEAN_ARGS"]
    w = weight if weight is not None else (None if lean else x)  # HAS_W=False: never read
    b = bias if bias is not None else (None if lean else x)
    meta = dict(ALIGN=p["ALIGN"], BLOCK_N=p["BLOCK_N"], ROWS=p["ROWS"], LOOPED=p["LOOPED"],
                HAS_W=weight is not None, PERSISTENT=p["PERSISTENT"], num_warps=p["num_warps"], num_stages=1)
    # options beyond the original kernel are passed only when they differ from the kernel's defaults, so the
    # configs without them compile (and are cached) exactly as before
    if p["SPECIALIZE"]:
        meta.update(M_C=M, N_C=N, EVEN_M=p["EVEN_M"], EVEN_N=p["EVEN_N"], IDX64=p["IDX64"])
    if p["EVICT"] != "evict_first":
        meta["EVICT"] = p["EVICT"]
    if not p["STATS"]:
        meta["STATS"] = False
    if p["CONST_EPS"]:
        if not _FP32_TINY <= eps <= _FP32_MAX:  # Triton types a float constant outside this range as fp64
            raise ValueError(f"CONST_EPS needs eps in the normal fp32 range [{_FP32_TINY}, {_FP32_MAX:.4g}], "
                             f"got {eps!r}")
        meta["EPS_C"] = eps  # > 0 (check_eps): 0.0 is the kernel's "runtime eps" sentinel
    if p["MAXNREG"] is not None:
        meta["maxnreg"] = p["MAXNREG"]  # Triton compile option (NVIDIA): .maxnreg in the PTX
    scalars = (M, N // p["ALIGN"], None if lean and p["CONST_EPS"] else eps,
               None if lean and not p["PERSISTENT"] else p["n_tiles"])
    unused = None if lean else y  # an output the kernel never writes (STATS=False)
    rstd_arg = rstd if rstd is not None else unused
    if op == "rms_norm":
        kernel, args = _rms_norm_kernel, (x, w, y, rstd_arg, *scalars)
    else:
        mean_arg = mean if mean is not None else unused
        kernel, args = _layer_norm_kernel, (x, w, b, y, mean_arg, rstd_arg, *scalars)
        meta["HAS_B"] = bias is not None
        if p["SHIFTED"]:
            meta["SHIFTED"] = True
    return kernel, args, p["grid"], meta, (y, mean, rstd)


def _launch(op, x, weight, bias, eps, config):
    kernel, args, grid, meta, outs = _prepare(op, x, weight, bias, eps, config, launch=True)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        kernel[grid](*args, **meta)
    return outs if outs[-1] is not None else (outs[0],)  # STATS=False: (y,)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
             config=None) -> tuple[torch.Tensor, ...]:
    """RMSNorm forward over the last dimension: returns ``(y [M, N] in x.dtype, rstd [M] fp32)`` with
    ``rstd = rsqrt(mean(x^2) + eps)`` and ``y = x * rstd (* weight)``, fp32 math; ``(y,)`` for a config with
    ``STATS=False``.

    ``x [M, N]``: row-major contiguous bf16/fp16/fp32 on a CUDA device (CPU tensors only under
    ``TRITON_INTERPRET=1``, fp16/fp32); any M, N >= 1; any data pointer (a view with a storage offset gets
    Triton's unaligned specialization: scalar instead of 16-byte accesses). ``weight [N]`` or None (x's dtype
    and device, contiguous; read in fp32). ``eps``: finite float > 0. ``config``: dict, ``TilingConfig`` or None
    (``DEFAULT_CONFIG``: whole row, auto rows/warps). Row offsets are int64: x may exceed 2^31 elements.

    Raises NotImplementedError when autograd would record through it (grad mode on and an input requires grad:
    forward only), TypeError (non-tensors, dtypes, a weight of another dtype, config type), ValueError (rank,
    contiguity, shapes, devices, eps, CPU tensors outside the interpreter, naming CUDA) via
    ``normfuse.techniques.norms.check_inputs`` and ``normfuse.validate``, and ``normfuse.tiling.ConfigError`` (a
    ValueError) for an unknown config key or a bad value. Sources: module docstring.
    """
    check_forward_only("norms.rms_norm", x=x, weight=weight)
    out = _launch("rms_norm", x, weight, None, eps, config)
    return out if len(out) == 1 else (out[0], out[2])


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
               eps: float = 1e-5, config=None) -> tuple[torch.Tensor, ...]:
    """LayerNorm forward over the last dimension: returns ``(y [M, N] in x.dtype, mean [M] fp32, rstd [M] fp32)``
    with the biased variance ``mean((x - mean)^2)`` (two-pass / Chan merge, never ``E[x^2] - mean^2``),
    ``rstd = rsqrt(var + eps)``, ``y = (x - mean) * rstd (* weight + bias)``; ``(y,)`` for ``STATS=False``.

    Inputs, config and errors as ``rms_norm``; ``bias [N]`` or None like ``weight``. Sources: module docstring.
    """
    check_forward_only("norms.layer_norm", x=x, weight=weight, bias=bias)
    return _launch("layer_norm", x, weight, bias, eps, config)


def compile_sm90(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, affine: bool = False) -> dict:
    """Compile ``op`` ("rms_norm" or "layer_norm") for sm_90 without launching it; return
    ``normfuse.compile_only.summarize(compiled)`` (PTX marker counts, shared bytes, warps).

    The caller must already have run ``normfuse.compile_only.install(90)`` in this process and must not set
    ``TRITON_INTERPRET``. ``x [M, N]``: a CPU tensor with the real shape and dtype (``torch.empty`` is enough; it
    is never read). ``affine``: compile with weight (and, for LayerNorm, bias) of ``x.dtype``. ``config`` as in
    ``rms_norm``. Raises ValueError for an unknown ``op``, RuntimeError under ``TRITON_INTERPRET=1``, the errors
    of ``rms_norm`` for bad inputs/config, and Triton's compile errors as they come (no ``OutOfResources``:
    check ``shared_bytes`` / ``smem_ok``).
    """
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, x, eps=eps, config=config, affine=affine))


def compile_sm90_kernel(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, affine: bool = False):
    """As ``compile_sm90``, but return Triton's ``CompiledKernel`` (``.asm["ptx"]``, ``.asm["ttgir"]``,
    ``.metadata``), e.g. to check for 16-byte ``ld.global.v4`` accesses. Same preconditions and errors."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    if _interpreting():
        raise RuntimeError("compile_sm90 cannot run under TRITON_INTERPRET=1")
    w = torch.empty(x.shape[-1], dtype=x.dtype, device=x.device) if affine and x.dim() == 2 else None
    b = torch.empty_like(w) if w is not None and op == "layer_norm" else None
    kernel, args, grid, meta, _ = _prepare(op, x, w, b, eps, config, launch=False)
    return kernel.warmup(*args, grid=grid, **meta)
