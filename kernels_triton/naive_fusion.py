r"""Naive fusion in upstream Triton (3.6.0, Hopper sm_90): ``y = norm(a @ b)`` with the GEMM tile spanning all of N.

Formulation (technique spec: ``normfuse.techniques.naive_fusion``; fp32 accumulator and statistics)::

    acc = a @ b                                       # [BLOCK_M, N] fp32, never written to memory
    LayerNorm: mean = sum(acc) / N;  var = sum((acc - mean)^2) / N;  rstd = rsqrt(var + eps)
               y = (acc - mean) * rstd (* weight + bias)
    RMSNorm:   rstd = rsqrt(sum(acc^2) / N + eps);   y = acc * rstd (* weight)

One program owns ``BLOCK_M`` complete rows of the output: its accumulator is ``[BLOCK_M, BLOCK_N]`` with
``BLOCK_N = max(16, next_pow2(N))``, so the epilogue sees whole rows and normalizes them from the fp32 accumulator
before anything is rounded (more accurate than the unfused GEMM -> bf16 C -> norm). The LayerNorm variance is
two-pass over the register-resident accumulator (mean first, then the centred sum of squares: no
``E[x^2] - mean^2`` cancellation); when N is not a power of two the padding columns ``N <= n < BLOCK_N`` are
masked out of it (they are zero in the accumulator: TMA zero-fills B past N; ``MASK_N`` is a constexpr, so
power-of-two N pays no mask). ``y`` (input dtype, TMA stores clipped at M and N) and the fp32 ``mean``/``rstd``
[M] (masked stores) are written.

Limits (ValueError naming them, so the sweep records ``unsupported``):

* TMA boxes are at most 256 elements wide, so the row is held as ``SPLIT = BLOCK_N // SUB_N`` accumulators of
  ``SUB_N = min(BLOCK_N, 256)`` columns, each fed by its own B box and stored through its own Y box; the kernel
  has one or two of them, hence ``N <= MAX_N = 512``.
* On Hopper the wgmma accumulator lives in registers: ``BLOCK_M * BLOCK_N / (32 * num_warps)`` fp32 registers per
  thread for the accumulator alone. Above ``MAX_ACC_REGS = 128`` (of 255, the rest is for addresses, the
  epilogue and the centred copy) the config is rejected: N=512 needs ``BLOCK_M=64`` with 8 warps, N=256
  ``BLOCK_M=128`` with 8 warps or ``BLOCK_M=64`` with 4.
* Shared memory: the estimate ``smem_bytes`` (the TMA ring, resident B, the Y staging tile; checked against the
  sm_90 compile) plus 1 KiB must stay within the 227 KiB an sm_90 block can use. B is ``[BLOCK_K, BLOCK_N]`` per
  stage, so N = 512 fits 3 stages of ``BLOCK_K=64`` (216 KiB) in the tile schedule, 2 in the flattened one.

Schedules (``TilingConfig.PERSISTENT``):

* ``PERSISTENT=False``: one program per ``BLOCK_M`` row block (grid ``cdiv(M, BLOCK_M)``), the K loop pipelined by
  Triton into a ``num_stages``-deep TMA + mbarrier + wgmma ring, then the norm epilogue and TMA stores. In the
  blog's regime (K = 64 .. 256 with BLOCK_K = 64 .. 256) the K loop has 1 .. 4 iterations, so overlap between
  loads, MMAs and the epilogue comes only from co-resident programs on the same SM.
* ``PERSISTENT=True``: ``min(tiles, #SMs * min(PROGRAMS_PER_SM, occupancy))`` programs loop over row blocks
  (``occupancy``: estimated co-resident programs per SM, so that no persistent program waits for another).
  If the whole K fits in one ``BLOCK_K`` step (``cdiv(K, BLOCK_K) == 1``, e.g. K = 64), B ``[K, N]`` is loaded
  ONCE per program and stays resident in shared memory ("resident B"); the row-block loop then only streams A
  tiles, and Triton pipelines that loop (``num_stages``) so the TMA loads of the next row blocks are in flight
  while the current block's epilogue runs. Otherwise the row-block loop and the K loop are flattened into one
  software-pipelined loop (``tl.range(..., flatten=True)``, as in Triton's persistent-matmul tutorial).
  ``BLOCK_K=None`` means "the whole K in one step" (``next_pow2(K)``, at most 256), i.e. resident B whenever
  it fits in shared memory. The two 256-column halves share one Y staging tile, so the TMA store of the second
  waits until the first has been read out of shared memory (not until it reached HBM).

sm_90 compile facts (compile-only, bf16, ``ptxas -v`` of Triton's bundled ptxas on the PTX; no spills anywhere):
tile 64 rows / 8 warps: 42 registers at N = 64, 101 at N = 256, 199 at N = 512 (147 KiB smem at 2 stages);
tile 128 rows / 8 warps: 58 at N = 64, 195 at N = 256; persistent resident B, 64 rows: 46 (N = 64) .. 213
(N = 512, 121 KiB); persistent 128 rows, whole K: 63 (N = 64) .. 219 (N = 256). In the resident-B TTGIR the B
halves are TMA-loaded once before the row-block loop, A has a ``num_stages``-slot ring prefetched
``num_stages - 1`` row blocks ahead, and the wgmmas read the resident B straight from shared memory.

The pipeliner bug of dsl-primer §0 (triton#6691: one loaded tile feeding both ``tl.dot`` and a row reduction)
does not arise here: the reductions read the accumulator after the K loop, never a loaded tile. With two
sub-accumulators one A tile feeds two ``tl.dot``s (two MMA consumers of the same shared-memory buffer, the usual
pattern). Only a GPU run can confirm numerics at a given ``num_stages``: every shipped config is checked by
``normfuse.gpu_checks`` and every sweep point before it is timed.

Interpreter (``TRITON_INTERPRET=1``, set before importing triton): runs on CPU tensors in fp16/fp32 (the
interpreter's bf16 dot is wrong), host ``TensorDescriptor`` included; ``rsqrt`` is ``tl.math.rsqrt``
(``libdevice`` returns None there). fp32 inputs use ``input_precision="ieee"`` (exact fp32 dot; on the GPU an
FMA-loop debugging path, not wgmma). ``matmul`` is ``kernels_triton.lazy_prenorm.matmul`` re-exported: the same
DSL's best plain GEMM (its own ``TilingConfig``; tiling entries with ``impls: [gemm]``).

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(the naive full-N epilogue fusion, its feasibility bound and its B200 numbers); Helion's ``matmul_layernorm``
example, https://github.com/pytorch/helion/blob/main/examples/matmul_layernorm.py (same math); Triton's
persistent/TMA matmul tutorial, https://triton-lang.org/main/getting-started/tutorials/09-persistent-matmul.html
(host descriptors, flattened persistent loop). Written from scratch here.
Status: CPU-checked (interpreter fp16/fp32, sm_90 compile-only); GPU numbers are open work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels_triton.lazy_prenorm import _fix_interpreter_scalar_index, _interpreting
from kernels_triton.lazy_prenorm import matmul  # noqa: F401  (the plain GEMM of this DSL, impl "gemm")
from normfuse.techniques.naive_fusion import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

__all__ = [
    "OPS",
    "MAX_N",
    "MAX_ACC_REGS",
    "TilingConfig",
    "DEFAULT_CONFIG",
    "launch_params",
    "smem_bytes",
    "matmul",
    "matmul_layernorm",
    "matmul_rmsnorm",
    "compile_sm90",
    "compile_sm90_kernel",
]

OPS = ("matmul", "matmul_layernorm", "matmul_rmsnorm")
MAX_N = 512  # two TMA boxes of 256 columns; also the register budget at BLOCK_M=64, 8 warps
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread we allow (of 255)
SMEM_LIMIT_BYTES = 232448  # = normfuse.compile_only.SMEM_LIMIT_BYTES (227 KiB per block on H100/H200)
_MAX_BOX = 256  # TMA: at most 256 elements per box dimension
_MIN_BLOCK = 16  # tl.dot needs every dimension >= 16
_SMEM_PER_SM = 233472  # 228 KiB of shared memory per SM on sm_90
_SMEM_RESERVE = 1024  # per block: the 1 KiB the driver reserves, which also covers our barriers (~0.5 KiB)
_DEFAULT_NUM_SMS = 132  # H100 SXM / H200 (used off-GPU: interpreter, compile-only)

if _interpreting():
    _fix_interpreter_scalar_index()


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tiling of the fused kernels (BLOCK_N is not a field: it is ``max(16, next_pow2(N))``, the whole row).

    * ``BLOCK_M`` (power of 2 in [16, 256]): rows per program / per row block (64 is one wgmma warpgroup tile).
    * ``BLOCK_K`` (power of 2 in [16, 256] or None): the K step; None = the whole K in one step
      (``next_pow2(K)``, at least 16, at most 256; larger K raises ValueError).
    * ``num_warps`` (power of 2 in [1, 16]) and ``num_stages`` (>= 1, the depth of the pipelined loop).
    * ``PERSISTENT`` (bool): persistent grid over row blocks (resident B when K fits one BLOCK_K step, else a
      flattened row-block x K loop); see the module docstring.
    * ``PROGRAMS_PER_SM`` (int in [1, 8]): persistent programs per SM, capped by the estimated occupancy
      (``launch_params``) so that every persistent program is resident at once: grid
      ``min(tiles, #SMs * min(PROGRAMS_PER_SM, occupancy))``.

    Construction with a bad value (wrong type included) raises ValueError naming the constraint. Whether a config
    serves a given N and K (registers, shared memory) is checked per call by ``launch_params``.
    """

    BLOCK_M: int = 64
    BLOCK_K: int | None = 64
    num_warps: int = 8
    num_stages: int = 3
    PERSISTENT: bool = False
    PROGRAMS_PER_SM: int = 1

    def __post_init__(self):
        for name in ("BLOCK_M", "BLOCK_K", "num_warps", "num_stages", "PROGRAMS_PER_SM"):
            v = getattr(self, name)
            if v is None and name == "BLOCK_K":
                continue
            if not _is_int(v):
                raise ValueError(f"TilingConfig.{name} must be an int{' or None' if name == 'BLOCK_K' else ''}, "
                                 f"got {v!r}")
        for name in ("BLOCK_M", "BLOCK_K"):
            v = getattr(self, name)
            if v is not None and not (_is_pow2(v) and _MIN_BLOCK <= v <= _MAX_BOX):
                raise ValueError(f"TilingConfig.{name}={v} must be a power of 2 in [{_MIN_BLOCK}, {_MAX_BOX}] "
                                 f"(tl.dot minimum, TMA box maximum)")
        if not (_is_pow2(self.num_warps) and self.num_warps <= 16):
            raise ValueError(f"TilingConfig.num_warps={self.num_warps} must be a power of 2 in [1, 16]")
        if self.num_stages < 1:
            raise ValueError(f"TilingConfig.num_stages={self.num_stages} must be >= 1")
        if not isinstance(self.PERSISTENT, bool):
            raise ValueError(f"TilingConfig.PERSISTENT must be a bool, got {self.PERSISTENT!r}")
        if not 1 <= self.PROGRAMS_PER_SM <= 8:
            raise ValueError(f"TilingConfig.PROGRAMS_PER_SM={self.PROGRAMS_PER_SM} must be in [1, 8]")


DEFAULT_CONFIG = TilingConfig()


# --------------------------------------------------------------------------------------------------------
# device code
# --------------------------------------------------------------------------------------------------------
@triton.jit
def _k_loop(a_desc, b_desc, off_m, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB_N: tl.constexpr,
            SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The full-row GEMM of one row block: ``(acc0, acc1)``, each ``[BLOCK_M, SUB_N]`` fp32 (``acc1`` holds
    columns ``SUB_N .. 2*SUB_N`` when ``SPLIT == 2``; otherwise it is a dead zero tile). Pipelined by the launch's
    ``num_stages`` (or flattened into the caller's persistent loop)."""
    acc0 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        acc0 = tl.dot(a, b_desc.load([k0, 0]), acc0, input_precision=DOT_PRECISION)
        if SPLIT == 2:
            acc1 = tl.dot(a, b_desc.load([k0, SUB_N]), acc1, input_precision=DOT_PRECISION)
    return acc0, acc1


@triton.jit
def _row_vector(ptr, cols, N, MASK_N: tl.constexpr):
    """An affine vector's columns ``cols`` as fp32 (0 past N when the row has padding columns)."""
    if MASK_N:
        return tl.load(ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    return tl.load(ptr + cols).to(tl.float32)


@triton.jit
def _norm_epilogue(acc0, acc1, y_desc, w_ptr, bias_ptr, mean_ptr, rstd_ptr, off_m, M, N, eps,
                   BLOCK_M: tl.constexpr, SUB_N: tl.constexpr, SPLIT: tl.constexpr, NORM: tl.constexpr,
                   HAS_W: tl.constexpr, HAS_B: tl.constexpr, MASK_N: tl.constexpr):
    """Normalize the fp32 row block held in ``acc0`` (| ``acc1``), store ``y`` through TMA (clipped past M and
    N) and the fp32 statistics with masked stores. Padding columns (>= N, present when ``MASK_N``) are zero in
    the accumulators and are masked out of the centred LayerNorm sum."""
    rows = off_m + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols0 = tl.arange(0, SUB_N)
    cols1 = SUB_N + cols0
    if NORM == "layernorm":
        s = tl.sum(acc0, axis=1)
        if SPLIT == 2:
            s += tl.sum(acc1, axis=1)
        mean = s / N
        x0 = acc0 - mean[:, None]
        if MASK_N:
            x0 = tl.where((cols0 < N)[None, :], x0, 0.0)
        var = tl.sum(x0 * x0, axis=1)
        if SPLIT == 2:
            x1 = acc1 - mean[:, None]
            if MASK_N:
                x1 = tl.where((cols1 < N)[None, :], x1, 0.0)
            var += tl.sum(x1 * x1, axis=1)
        rstd = tl.math.rsqrt(var / N + eps)  # not libdevice: it returns None in the interpreter
        tl.store(mean_ptr + rows, mean, mask=row_ok)
    else:  # rmsnorm: padding columns are zero, no mask needed
        x0 = acc0
        ss = tl.sum(acc0 * acc0, axis=1)
        if SPLIT == 2:
            x1 = acc1
            ss += tl.sum(acc1 * acc1, axis=1)
        rstd = tl.math.rsqrt(ss / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)

    y0 = x0 * rstd[:, None]
    if HAS_W:
        y0 = y0 * _row_vector(w_ptr, cols0, N, MASK_N)[None, :]
    if HAS_B:
        y0 = y0 + _row_vector(bias_ptr, cols0, N, MASK_N)[None, :]
    y_desc.store([off_m, 0], y0.to(y_desc.dtype))
    if SPLIT == 2:
        y1 = x1 * rstd[:, None]
        if HAS_W:
            y1 = y1 * _row_vector(w_ptr, cols1, N, MASK_N)[None, :]
        if HAS_B:
            y1 = y1 + _row_vector(bias_ptr, cols1, N, MASK_N)[None, :]
        y_desc.store([off_m, SUB_N], y1.to(y_desc.dtype))


@triton.jit
def _naive_fusion_kernel(a_desc, b_desc, y_desc, w_ptr, bias_ptr, mean_ptr, rstd_ptr, M, N, K, eps,
                         BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB_N: tl.constexpr, SPLIT: tl.constexpr,
                         NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, NORM: tl.constexpr,
                         HAS_W: tl.constexpr, HAS_B: tl.constexpr, MASK_N: tl.constexpr, SCHEDULE: tl.constexpr,
                         NUM_PROGRAMS: tl.constexpr):
    """``SCHEDULE``: ``"tile"`` (one program per row block), ``"resident"`` (persistent, B loaded once, the
    row-block loop pipelined; requires K <= BLOCK_K) or ``"flat"`` (persistent, row-block x K loop flattened)."""
    if SCHEDULE == "tile":
        off_m = tl.program_id(0) * BLOCK_M
        acc0, acc1 = _k_loop(a_desc, b_desc, off_m, K, BLOCK_M, BLOCK_K, SUB_N, SPLIT, DOT_PRECISION)
        _norm_epilogue(acc0, acc1, y_desc, w_ptr, bias_ptr, mean_ptr, rstd_ptr, off_m, M, N, eps,
                       BLOCK_M, SUB_N, SPLIT, NORM, HAS_W, HAS_B, MASK_N)
    elif SCHEDULE == "resident":
        # the whole B [K <= BLOCK_K, N] once per program (zero-filled past K and N); only A streams
        b0 = b_desc.load([0, 0])
        b1 = b0
        if SPLIT == 2:
            b1 = b_desc.load([0, SUB_N])
        num_tiles = tl.cdiv(M, BLOCK_M)
        for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, num_stages=NUM_STAGES):
            off_m = tile * BLOCK_M
            a = a_desc.load([off_m, 0])
            acc0 = tl.dot(a, b0, tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32), input_precision=DOT_PRECISION)
            acc1 = acc0
            if SPLIT == 2:
                acc1 = tl.dot(a, b1, tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32), input_precision=DOT_PRECISION)
            _norm_epilogue(acc0, acc1, y_desc, w_ptr, bias_ptr, mean_ptr, rstd_ptr, off_m, M, N, eps,
                           BLOCK_M, SUB_N, SPLIT, NORM, HAS_W, HAS_B, MASK_N)
    else:
        num_tiles = tl.cdiv(M, BLOCK_M)
        for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
            off_m = tile * BLOCK_M
            acc0, acc1 = _k_loop(a_desc, b_desc, off_m, K, BLOCK_M, BLOCK_K, SUB_N, SPLIT, DOT_PRECISION)
            _norm_epilogue(acc0, acc1, y_desc, w_ptr, bias_ptr, mean_ptr, rstd_ptr, off_m, M, N, eps,
                           BLOCK_M, SUB_N, SPLIT, NORM, HAS_W, HAS_B, MASK_N)


# --------------------------------------------------------------------------------------------------------
# host code
# --------------------------------------------------------------------------------------------------------
def _as_config(config) -> TilingConfig:
    if config is None or isinstance(config, TilingConfig):
        return config or DEFAULT_CONFIG
    if isinstance(config, Mapping):
        return TilingConfig.from_dict(config)
    raise TypeError(f"config must be a dict, a TilingConfig or None, got {type(config).__name__}")


def _next_pow2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def smem_bytes(BLOCK_M: int, BLOCK_K: int, BLOCK_N: int, num_stages: int, itemsize: int, schedule: str) -> int:
    """Estimated shared memory of one program (bytes): the pipelined TMA ring (``num_stages`` A tiles, plus
    ``num_stages`` B tiles, or one B tile when B is resident) and the Y staging tile of the TMA store
    (``[BLOCK_M, min(BLOCK_N, 256)]``). With the ``"tile"`` schedule the staging tile and the epilogue's scratch
    reuse the ring (dead after the K loop), so they do not add up; the persistent schedules keep the ring, the
    staging tile and the epilogue scratch (cross-warp row reductions, affine-vector layout conversions:
    ``16 * BLOCK_M`` bytes allowed) allocated at once. Checked against the sm_90 compile of the shipped configs
    (tests/test_naive_fusion_triton.py): the compiled size is at most ~0.1 KiB above this (barriers), and at
    most 2 KiB below."""
    a_tile = BLOCK_M * BLOCK_K * itemsize
    b_tile = BLOCK_K * BLOCK_N * itemsize
    ring = num_stages * a_tile + (b_tile if schedule == "resident" else num_stages * b_tile)
    staging = BLOCK_M * min(BLOCK_N, _MAX_BOX) * itemsize
    return max(ring, staging) if schedule == "tile" else ring + staging + 16 * BLOCK_M


def _num_sms(device) -> int:
    if isinstance(device, torch.device) and device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_NUM_SMS


def launch_params(M: int, N: int, K: int, dtype: torch.dtype, config=None, *, num_sms: int | None = None) -> dict:
    """Resolve ``config`` for one problem: ``BLOCK_N``, ``SUB_N``, ``SPLIT``, ``BLOCK_K``, ``SCHEDULE``
    (``tile`` / ``resident`` / ``flat``), ``grid``, ``acc_regs`` (fp32 accumulator registers per thread) and
    ``smem`` (estimated bytes).

    ``occupancy`` is an estimate of co-resident programs per SM (shared memory; registers as the accumulator
    plus ~64), used to cap the persistent grid. Raises ValueError when the config cannot serve the shape:
    N > ``MAX_N`` (512), an accumulator needing more than ``MAX_ACC_REGS`` (128) registers per thread,
    ``BLOCK_K=None`` with K > 256, or more shared memory than an sm_90 block has (227 KiB)."""
    cfg = _as_config(config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    BLOCK_N = max(_MIN_BLOCK, _next_pow2(N))
    if BLOCK_N > MAX_N:
        raise ValueError(f"N={N} needs BLOCK_N={BLOCK_N} > MAX_N={MAX_N}: naive fusion keeps the whole row's fp32 "
                         f"accumulator in registers (at most two 256-column TMA boxes); use N <= {MAX_N}")
    SUB_N = min(BLOCK_N, _MAX_BOX)
    SPLIT = BLOCK_N // SUB_N
    acc_regs = cfg.BLOCK_M * BLOCK_N // (32 * cfg.num_warps)
    if acc_regs > MAX_ACC_REGS:
        raise ValueError(f"the [BLOCK_M={cfg.BLOCK_M}, BLOCK_N={BLOCK_N}] fp32 accumulator needs {acc_regs} registers "
                         f"per thread with num_warps={cfg.num_warps}, above MAX_ACC_REGS={MAX_ACC_REGS} (use a smaller "
                         f"BLOCK_M or more warps)")
    if cfg.BLOCK_K is None:
        BLOCK_K = max(_MIN_BLOCK, _next_pow2(K))
        if BLOCK_K > _MAX_BOX:
            raise ValueError(f"BLOCK_K=None (whole K in one step) needs K <= {_MAX_BOX}, got K={K}")
    else:
        BLOCK_K = cfg.BLOCK_K
    tiles = triton.cdiv(M, cfg.BLOCK_M)
    schedule = "tile" if not cfg.PERSISTENT else ("resident" if K <= BLOCK_K else "flat")
    smem = smem_bytes(cfg.BLOCK_M, BLOCK_K, BLOCK_N, cfg.num_stages, itemsize, schedule)
    if smem + _SMEM_RESERVE > SMEM_LIMIT_BYTES:
        raise ValueError(f"needs ~{smem} bytes of shared memory (BLOCK_M={cfg.BLOCK_M}, BLOCK_K={BLOCK_K}, "
                         f"BLOCK_N={BLOCK_N}, num_stages={cfg.num_stages}, {schedule} schedule), above the sm_90 "
                         f"limit of {SMEM_LIMIT_BYTES}")
    # estimated co-resident programs per SM: shared memory, and registers (the accumulator plus ~64 others,
    # 64K 32-bit registers per SM); a persistent grid never exceeds it, so that every program runs at once
    by_smem = _SMEM_PER_SM // (smem + _SMEM_RESERVE)
    by_regs = 65536 // ((acc_regs + 64) * 32 * cfg.num_warps)
    occupancy = max(1, min(by_smem, by_regs))
    if schedule == "tile":
        grid = (tiles,)
    else:
        n_sms = _DEFAULT_NUM_SMS if num_sms is None else num_sms
        grid = (max(1, min(tiles, n_sms * min(cfg.PROGRAMS_PER_SM, occupancy))),)
    return dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=BLOCK_N, SUB_N=SUB_N, SPLIT=SPLIT, BLOCK_K=BLOCK_K, SCHEDULE=schedule,
                grid=grid, tiles=tiles, acc_regs=acc_regs, smem=smem, occupancy=occupancy,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _prepare(a, b, weight, bias, eps, config, norm: str, *, launch: bool):
    """Validate, resolve the launch, allocate y / mean / rstd and build the descriptors and arguments."""
    eps = check_eps(eps)
    M, N, K = check_inputs(a, b, weight, bias, eps)  # the technique's contract (16-byte aligned a, b included)
    cfg = _as_config(config)
    p = launch_params(M, N, K, a.dtype, cfg, num_sms=_num_sms(a.device) if launch else None)
    if launch and a.device.type != "cuda" and not _interpreting():
        raise ValueError(f"inputs must be CUDA tensors (got device {a.device}); CPU tensors run only under "
                         f"TRITON_INTERPRET=1")
    y = torch.empty((M, N), dtype=a.dtype, device=a.device)
    mean = torch.empty((M,), dtype=torch.float32, device=a.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=a.device)
    a_desc = TensorDescriptor.from_tensor(a, [p["BLOCK_M"], p["BLOCK_K"]])
    b_desc = TensorDescriptor.from_tensor(b, [p["BLOCK_K"], p["SUB_N"]])
    y_desc = TensorDescriptor.from_tensor(y, [p["BLOCK_M"], p["SUB_N"]])
    args = (a_desc, b_desc, y_desc, weight if weight is not None else rstd, bias if bias is not None else rstd,
            mean, rstd, M, N, K, eps)
    meta = dict(BLOCK_M=p["BLOCK_M"], BLOCK_K=p["BLOCK_K"], SUB_N=p["SUB_N"], SPLIT=p["SPLIT"],
                NUM_STAGES=cfg.num_stages,
                # fp32 inputs: exact fp32 dot (TF32 would fail the fp32 tolerance); 16-bit inputs: tensor cores
                DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
                NORM=norm, HAS_W=weight is not None, HAS_B=bias is not None, MASK_N=p["BLOCK_N"] != N,
                SCHEDULE=p["SCHEDULE"],
                NUM_PROGRAMS=p["grid"][0], num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (y, mean, rstd), args, p["grid"], meta


def _launch(a, b, weight, bias, eps, config, norm):
    (y, mean, rstd), args, grid, meta = _prepare(a, b, weight, bias, eps, config, norm, launch=True)
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        _naive_fusion_kernel[grid](*args, **meta)
    return y, mean, rstd


def matmul_layernorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, eps: float = 1e-5, config=None):
    """Fused ``y = layer_norm(a @ b) (* weight + bias)`` over the last dim, statistics from the fp32 accumulator.

    ``a [M, K]``, ``b [K, N]``: 2-D row-major contiguous, one dtype (bf16 on the GPU; fp16/fp32 also accepted and
    required under ``TRITON_INTERPRET=1``), K and N multiples of 8 (16-byte TMA rows), N <= ``MAX_N`` (512),
    M >= 1, 16-byte aligned data pointers (TMA descriptors), on a CUDA device (CPU only under the interpreter).
    ``weight``/``bias``: contiguous ``[N]`` of a's dtype, or None. ``eps``: finite float > 0 (inside the rsqrt).
    ``config``: dict, ``TilingConfig`` or None (``DEFAULT_CONFIG``). y may exceed 2^31 elements (TMA coordinates
    and the statistics' offsets stay below M).

    Returns ``(y [M, N] a.dtype, mean [M] fp32, rstd [M] fp32)`` with population variance,
    ``rstd = rsqrt(var + eps)``. Raises NotImplementedError for inputs that require grad with grad mode on
    (forward only), TypeError (non-tensors, dtypes, config type) and ValueError (ranks, shapes, alignment,
    contiguity, devices, eps, a config that cannot hold the row: see ``launch_params``) through
    ``normfuse.techniques.naive_fusion.check_inputs``, and ``normfuse.tiling.ConfigError`` for bad config
    values or keys. Source: the PyTorch blog "Towards Free Normalization" (naive fusion),
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ .
    """
    check_forward_only("naive_fusion.matmul_layernorm", a=a, b=b, weight=weight, bias=bias)
    return _launch(a, b, weight, bias, eps, config, "layernorm")


def matmul_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
                   config=None):
    """Fused ``y = rms_norm(a @ b) (* weight)`` over the last dim, ``rstd = rsqrt(mean(acc^2) + eps)`` from the fp32
    accumulator. Inputs, ``config`` and errors as ``matmul_layernorm`` (no bias). Returns
    ``(y [M, N] a.dtype, rstd [M] fp32)``. Source: as ``matmul_layernorm``."""
    check_forward_only("naive_fusion.matmul_rmsnorm", a=a, b=b, weight=weight)
    y, _, rstd = _launch(a, b, weight, None, eps, config, "rmsnorm")
    return y, rstd


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-5, config=None,
                 affine: bool = False) -> dict:
    """Compile ``op`` (one of ``OPS``) for sm_90 without launching it; return ``normfuse.compile_only.summarize``
    of the compiled kernel (PTX marker counts incl. wgmma / TMA, shared bytes, warps).

    The caller must already have run ``normfuse.compile_only.install(90)`` in this process and must not set
    ``TRITON_INTERPRET``. ``a [M, K]``, ``b [K, N]``: CPU tensors with the real shapes and dtype (never read).
    ``affine``: compile the weight (and, for LayerNorm, bias) variant. ``op="matmul"`` compiles
    ``kernels_triton.lazy_prenorm.matmul`` with that module's ``config``. Raises ValueError for an unknown ``op``,
    RuntimeError under the interpreter, and the errors of the op for bad inputs or config."""
    from normfuse.compile_only import summarize

    if op == "matmul":
        from kernels_triton import lazy_prenorm

        return lazy_prenorm.compile_sm90("matmul", a, b, config=config)
    return summarize(compile_sm90_kernel(op, a, b, eps=eps, config=config, affine=affine))


def compile_sm90_kernel(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-5, config=None,
                        affine: bool = False):
    """As ``compile_sm90`` for the fused ops, but return Triton's ``CompiledKernel`` (``.asm["ttgir"]``,
    ``.asm["ptx"]``, ``.metadata``). Same preconditions and errors."""
    if op not in OPS[1:]:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS[1:])} (and 'matmul' via compile_sm90)")
    if _interpreting():
        raise RuntimeError("compile_sm90 cannot run under TRITON_INTERPRET=1")
    norm = "layernorm" if op == "matmul_layernorm" else "rmsnorm"
    N = b.shape[1] if b.dim() == 2 else 0
    w = torch.empty(N, dtype=a.dtype) if affine else None
    bias = torch.empty(N, dtype=a.dtype) if affine and norm == "layernorm" else None
    _, args, grid, meta = _prepare(a, b, w, bias, eps, config, norm, launch=False)
    return _naive_fusion_kernel.warmup(*args, grid=grid, **meta)
