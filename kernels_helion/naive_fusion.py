r"""Helion kernels for naive fusion: a GEMM whose tile spans all of N, with a LayerNorm/RMSNorm epilogue.

``matmul_layernorm(a, b, weight, bias)`` returns ``(y, mean, rstd)`` and ``matmul_rmsnorm(a, b, weight)`` returns
``(y, rstd)`` with ``y = norm(a @ b)`` normalized over N: the fp32 accumulator ``acc [BLOCK_M, N]`` of one row
block is complete when the K loop ends, so the statistics come from the fp32 rows before any rounding, and
``y`` is rounded once to ``a.dtype``. ``matmul`` is the same DSL's plain GEMM (re-exported from
``kernels_helion.lazy_prenorm``), the T_gemm of the "% hidden" metric.

Sources: PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels"
(2026-07-10), https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(section 1, "naive fusion": its numbers are Helion on B200); the kernel shape follows Helion's
``examples/matmul_layernorm.py`` (https://github.com/pytorch/helion/blob/main/examples/matmul_layernorm.py).
techniques.md "Naive fusion" has the math and the blog's numbers. The code here is our own.

**Kernel structure.** The grid tiles M only (``for tile_m in hl.tile(m)``, ``BLOCK_M`` rows per program); N is
``hl.specialize``-d and taken as a full slice (``b[tile_k, :]``, ``hl.zeros([tile_m, n])``), which Helion turns
into one ``_RDIM_SIZE`` constexpr = ``BLOCK_N`` = next power of two >= N, masked at N. One device loop over K
(``BLOCK_K``) accumulates ``acc = addmm(acc, a[tile_m, tile_k], b[tile_k, :])`` in fp32 (wgmma on sm_90). The
epilogue then runs on the register-resident accumulator:

* LayerNorm, two passes over the resident rows (no ``E[x^2] - mean^2`` cancellation):
  ``mean = sum(acc) / N``, ``xc = acc - mean``, ``rstd = rsqrt(sum(xc^2) / N + eps)``, ``y = xc * rstd``;
* RMSNorm: ``rstd = rsqrt(sum(acc^2) / N + eps)``, ``y = acc * rstd``;
* then ``* weight`` and ``+ bias`` when given. Helion specializes on ``weight``/``bias`` being None (part of the
  bind key), so the no-affine kernel has no affine loads at all.

Helion zeroes the padded lanes ``N <= n < BLOCK_N`` (``tl.where(mask, ...)``) before every row sum, so the
padding does not leak ``mean^2`` into the variance; ``y``'s store and the statistics' stores are masked at N and M.

**What Helion could and could not express** (helion 1.5.0, sm_90 codegen read on CPU):

* *Expressed:* the whole-N accumulator, the fused two-pass epilogue, M tails, optional affine without dummy
  tensors, TMA (``indexing="tensor_descriptor"``) for A, and for B and y while the box fits (see next point),
  persistent ``pid_type`` with the tile loop flattened into the K loop (``persistent_flatten``: the next row
  block's TMA loads are in flight while this one's epilogue runs).
* *BLOCK_N is not a knob.* Helion derives ``_RDIM_SIZE = next_pow2(N)`` itself; there is no block size or
  ``reduction_loops`` entry for N (the accumulator is loop-carried through a dot, so Helion offers no looped
  reduction for it). The accumulator for N = 72 is therefore [BLOCK_M, 128].
* *TMA for B and y only when the box fits the tensor.* Helion uses a descriptor only when the block shape
  ``[BLOCK_K, BLOCK_N]`` / ``[BLOCK_M, BLOCK_N]`` is at most 256 per dimension (TMA's box limit) and not larger
  than the tensor. So N = 512 (box 512 > 256) and any non-power-of-two N (box 128 > N = 72) silently fall back to
  pointer loads/stores for B and y (cp.async / st.global), while A keeps TMA. (Helion checks the 256 limit only
  for CUDA devices; ``TilingConfig.to_helion(..., N)`` applies both rules itself so that CPU compile-only
  generates what the GPU runs.) A split of N into two [BLOCK_M, 256] accumulators with two B descriptors would
  keep TMA at N = 512; Helion has no list of accumulators, so it would need a hand-written two-accumulator kernel
  per split; not done (B is at most 512 KiB and L2-resident, so its loads are the cheap ones).
* *No epilogue subtiling.* Helion's ``epilogue_subtile`` splits the accumulator's store into column pieces but
  not the ``weight``/``bias`` row it is multiplied with: helion 1.5.0 raises ``ShapeMismatch`` on the affine
  epilogue, so the option is not offered.
* *N < 16 is not served* (``MIN_N``): the accumulator cannot be padded beyond next_pow2(N) to ``tl.dot``'s
  minimum width (M = 1, N = 8 fails to compile in Triton).
* *No control of register/warpgroup layout.* The accumulator is split over the warps by Triton; there is no
  2-consumer-warpgroup ping-pong and no warp specialization on sm_90 (Helion 1.5 offers
  ``range_warp_specializes`` only for compute capability >= 10).

**Capacity limit (``ValueError``).** The accumulator lives in registers: ``BLOCK_M * BLOCK_N / (32 * num_warps)``
fp32 registers per thread. A config serves N only while that is <= ``MAX_ACC_REGS_PER_THREAD`` (128, leaving the
rest of the 255-register budget to the epilogue, the addresses and the wgmma operands; techniques.md: N <= 256 at
BLOCK_M = 128, N <= 512 at BLOCK_M = 64 with 8 warps), and while the estimated shared memory
``num_stages * (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * itemsize`` (+ one ``BLOCK_M x BLOCK_N`` tile of y under
a persistent ``pid_type``) is <= ``SMEM_LIMIT_BYTES`` (227 KiB per block on H200). Beyond that (or for N <
``MIN_N``) ``matmul_layernorm`` / ``matmul_rmsnorm`` raise ValueError naming the limit; the sweep records
``unsupported``. The register rule was checked with ptxas (sm_90, compile-only): at 128 accumulator registers per
thread the LayerNorm kernels take 156-177 registers (up to 245 with weight and bias) and do not spill; at 256
they spill.

**Execution modes** (as in ``kernels_helion/lazy_prenorm.py``).

* GPU: kernels are ``@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")`` without
  a pinned config; a call binds the arguments, compiles ``TilingConfig.to_helion()`` with
  ``BoundKernel.compile_config`` and caches the compiled callable per (op, shape, dtype, device, affine, config).
  No autotuning at call time.
* CPU ref mode (``HELION_INTERPRET=1`` before ``import helion``): the body runs as eager PyTorch on whole
  tensors; ``config`` is validated (including the capacity limit) and otherwise ignored.
* compile-only (``compile_sm90``): under ``normfuse.compile_only.install(90)``, CPU tensors are bound and the
  generated Triton is compiled for sm_90 with a launcher that never launches.
* Triton interpreter (``TRITON_INTERPRET=1``, tests only, fp32): the generated Triton runs tile by tile on CPU,
  which checks the masks and the tiling that ref mode skips.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from kernels_helion.lazy_prenorm import (  # shared host-side helpers and the GEMM baseline
    _as_on_h200,
    _indexed_kernel,
    _live_args,
    matmul,
    ptxas_usage,
)
from normfuse.techniques.naive_fusion import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

__all__ = [
    "TilingConfig",
    "DEFAULT_CONFIG",
    "H200_CANDIDATES",
    "H200_GEMM_CANDIDATES",
    "OPS",
    "MAX_ACC_REGS_PER_THREAD",
    "MIN_N",
    "SMEM_LIMIT_BYTES",
    "block_n",
    "matmul",
    "matmul_layernorm",
    "matmul_rmsnorm",
    "compile_sm90",
    "compile_sm90_kernel",
    "ptxas_usage",
    "triton_code",
    "ref_mode",
]

OPS = ("matmul_layernorm", "matmul_rmsnorm", "matmul")
FUSED_OPS = ("matmul_layernorm", "matmul_rmsnorm")
INDEXING = ("pointer", "tensor_descriptor", "block_ptr")
PID_TYPES = ("flat", "persistent_blocked", "persistent_interleaved")
MIN_N = 16  # tl.dot's minimum width; Helion's accumulator is next_pow2(N) wide, not padded further
MAX_ACC_REGS_PER_THREAD = 128  # fp32 accumulator registers per thread that a config may use (of 255)
SMEM_LIMIT_BYTES = 232448  # per-block opt-in shared memory on H100/H200 (227 KiB)
TMA_BOX_MAX = 256  # TMA's largest box extent per dimension


# ------------------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------------------
@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _matmul_layernorm_kernel(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                             bias: torch.Tensor | None, eps: float
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    n = hl.specialize(n)  # the row length is a constexpr: acc is [BLOCK_M, next_pow2(N)], masked at N
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    mean_out = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd_out = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):  # grid: one program per BLOCK_M row block
        acc = hl.zeros([tile_m, n], dtype=torch.float32)
        for tile_k in hl.tile(k):  # the only device loop: the GEMM K loop (memory ops 0 (a), 1 (b))
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, :])
        mean = torch.sum(acc, dim=-1) / n  # pass 1 over the resident rows
        xc = acc - mean[:, None]
        rstd = torch.rsqrt(torch.sum(xc * xc, dim=-1) / n + eps)  # pass 2: centred sum of squares
        out = xc * rstd[:, None]
        if weight is not None:  # specialized: no load at all when weight is None
            out = out * weight[:].to(torch.float32)
        if bias is not None:
            out = out + bias[:].to(torch.float32)
        y[tile_m, :] = out.to(y.dtype)
        mean_out[tile_m] = mean
        rstd_out[tile_m] = rstd
    return y, mean_out, rstd_out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _matmul_rmsnorm_kernel(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    n = hl.specialize(n)
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd_out = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        acc = hl.zeros([tile_m, n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, :])
        rstd = torch.rsqrt(torch.sum(acc * acc, dim=-1) / n + eps)
        out = acc * rstd[:, None]
        if weight is not None:
            out = out * weight[:].to(torch.float32)
        y[tile_m, :] = out.to(y.dtype)
        rstd_out[tile_m] = rstd
    return y, rstd_out


_KERNELS = {"matmul_layernorm": _matmul_layernorm_kernel, "matmul_rmsnorm": _matmul_rmsnorm_kernel}


# ------------------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------------------
def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and (v & (v - 1)) == 0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def block_n(N: int) -> int:
    """``BLOCK_N`` of the accumulator for a row length N: the next power of two >= N (Helion's ``_RDIM_SIZE``),
    at least 16 (``tl.dot``'s minimum)."""
    return max(16, 1 << max(0, int(N) - 1).bit_length())


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """A typed, validated subset of ``helion.Config`` for both fused kernels (hashable: used as a cache key).

    Fields (Helion names unless noted):

    * ``block_sizes`` ``(BLOCK_M, BLOCK_K)``: powers of two in [16, 256] (``tl.dot`` needs >= 16). There is no
      ``BLOCK_N``: the accumulator spans all of N (``block_n(N)`` columns, chosen by Helion).
    * ``num_warps`` (power of two, 1..32), ``num_stages`` (1..8): ``num_stages`` is the software-pipelining depth
      of the K loop (Helion 1.5 drops ``range_num_stages`` under tensor descriptors, so this is the knob).
    * ``indexing``: ``"pointer" | "tensor_descriptor" | "block_ptr"`` for ``a``, ``b`` and ``y``, or a 3-tuple
      ``(a, b, y)``. The 1-D loads/stores (weight, bias, mean, rstd) always use ``"pointer"``. Helion falls back
      to pointers where a descriptor is not legal (box > 256 or > the tensor; see the module docstring).
    * ``pid_type``: ``"flat"`` (one program per row block) or ``"persistent_blocked" |
      "persistent_interleaved"`` (``num_sm_multiplier`` x 132 programs loop over the row blocks). ``"xyz"`` is
      not offered: the grid is 1-D.
    * ``persistent_flatten`` (ours; Helion's leading ``range_flattens`` entry, persistent ``pid_type`` only):
      ``True`` makes Triton fuse the row-block loop with the K loop into one software-pipelined loop whose
      epilogue runs in an ``scf.if``, so the next row block's loads are in flight during this one's epilogue.
    * ``num_sm_multiplier`` (1..128), ``maxnreg`` (1..256): persistent ``pid_type`` only (Helion rejects
      ``maxnreg`` with ``"flat"``); None means Helion's default. (Helion's ``epilogue_subtile`` is not offered:
      helion 1.5.0 splits the accumulator but not the ``weight``/``bias`` row it is multiplied with and fails
      with ``ShapeMismatch``.)

    A config that cannot hold a given N is not an invalid config: ``check_capacity(N, itemsize)`` raises then.
    Raises ValueError naming the violated constraint when a value is invalid.
    """

    block_sizes: tuple = (64, 64)
    num_warps: int = 4
    num_stages: int = 3
    indexing: str | tuple = "tensor_descriptor"
    pid_type: str = "flat"
    persistent_flatten: bool | None = None
    num_sm_multiplier: int | None = None
    maxnreg: int | None = None

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        bs = self.block_sizes
        if isinstance(bs, (str, bytes)) or not isinstance(bs, (tuple, list)) or len(bs) != 2:
            raise ValueError(f"block_sizes must be (BLOCK_M, BLOCK_K), 2 entries (BLOCK_N spans all of N), got {bs!r}")
        if not all(_is_pow2(x) and 16 <= x <= 256 for x in bs):
            raise ValueError(f"block_sizes entries must be powers of two in [16, 256] (tl.dot needs >= 16), got {bs!r}")
        put("block_sizes", tuple(bs))
        if not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"num_warps must be a power of two in [1, 32], got {self.num_warps!r}")
        if not (_is_int(self.num_stages) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an integer in [1, 8], got {self.num_stages!r}")
        ix = self.indexing
        if isinstance(ix, str):
            if ix not in INDEXING:
                raise ValueError(f"indexing must be one of {INDEXING} or a 3-tuple (a, b, y) of them, got {ix!r}")
        else:
            if isinstance(ix, bytes) or not isinstance(ix, (tuple, list)) or len(ix) != 3 \
                    or not all(x in INDEXING for x in ix):
                raise ValueError(f"indexing must be one of {INDEXING} or a 3-tuple (a, b, y) of them, got {ix!r}")
            put("indexing", tuple(ix))
        if self.pid_type not in PID_TYPES:
            raise ValueError(f"pid_type must be one of {PID_TYPES}, got {self.pid_type!r}")
        persistent = self.pid_type.startswith("persistent")
        if self.persistent_flatten is not None:
            if not isinstance(self.persistent_flatten, bool):
                raise ValueError(f"persistent_flatten must be None, True or False, got {self.persistent_flatten!r}")
            if not persistent:
                raise ValueError(f"persistent_flatten needs a persistent pid_type (with {self.pid_type!r} there is no "
                                 "row-block loop to flatten)")
        if self.num_sm_multiplier is not None:
            if not (_is_int(self.num_sm_multiplier) and 1 <= self.num_sm_multiplier <= 128):
                raise ValueError(f"num_sm_multiplier must be None or an integer in [1, 128], "
                                 f"got {self.num_sm_multiplier!r}")
            if not persistent:
                raise ValueError(f"num_sm_multiplier needs a persistent pid_type, got {self.pid_type!r}")
        if self.maxnreg is not None:
            if not (_is_int(self.maxnreg) and 1 <= self.maxnreg <= 256):
                raise ValueError(f"maxnreg must be None or an integer in [1, 256], got {self.maxnreg!r}")
            if not persistent:
                raise ValueError(f"maxnreg needs a persistent pid_type (Helion 1.5 rejects it with {self.pid_type!r})")

    @property
    def block_m(self) -> int:
        return self.block_sizes[0]

    @property
    def block_k(self) -> int:
        return self.block_sizes[1]

    def indexing_of(self, name: str) -> str:
        """The indexing strategy of memory op ``name`` (``"a"``, ``"b"``, ``"y"``; anything else: pointer)."""
        ix = (self.indexing,) * 3 if isinstance(self.indexing, str) else self.indexing
        return dict(zip(("a", "b", "y"), ix)).get(name, "pointer")

    @staticmethod
    def row_box_fits(N: int) -> bool:
        """Whether a TMA box spanning the whole (padded) row, ``block_n(N)`` columns, is legal: <= 256 and <= N."""
        return block_n(N) <= TMA_BOX_MAX and block_n(N) <= N

    def acc_regs_per_thread(self, N: int) -> int:
        """fp32 accumulator registers per thread for a row of N: ``BLOCK_M * block_n(N) / (32 * num_warps)``."""
        return -(-self.block_m * block_n(N) // (32 * self.num_warps))

    def smem_estimate(self, N: int, itemsize: int) -> int:
        """Bytes of shared memory expected for a row of N (an upper bound): the K loop's ring of ``num_stages``
        A and B tiles, plus, under a persistent ``pid_type``, one ``BLOCK_M x BLOCK_N`` tile of y (the TMA store's
        staging buffer, or Triton's layout-conversion scratch for a pointer store; it is live while the next row
        block's loads fill the ring, whereas a flat kernel reuses the ring for it). Within ~600 B of the sm_90
        compile-only figure for the shipped candidates once the K loop has >= 2 iterations (tests; a single
        iteration is not pipelined and takes one stage); ``compile_sm90`` reports the real figure."""
        bn = block_n(N)
        ring = max(1, self.num_stages) * (self.block_m * self.block_k + self.block_k * bn) * itemsize
        staging = self.block_m * bn * itemsize if self.pid_type != "flat" else 0
        return ring + staging

    def check_capacity(self, N: int, itemsize: int = 2) -> None:
        """Raise ValueError when this config cannot hold a row of N: N < ``MIN_N`` (16), the fp32 accumulator
        would need more than ``MAX_ACC_REGS_PER_THREAD`` registers per thread, or the estimated shared memory
        exceeds ``SMEM_LIMIT_BYTES``."""
        if N < MIN_N:
            raise ValueError(
                f"N={N} is below MIN_N={MIN_N}: Helion sizes the accumulator to next_pow2(N) columns itself and cannot "
                "pad it to tl.dot's minimum width of 16 (at M=1, N=8 Triton fails to compile the dot)")
        regs = self.acc_regs_per_thread(N)
        if regs > MAX_ACC_REGS_PER_THREAD:
            n_max = MAX_ACC_REGS_PER_THREAD * 32 * self.num_warps // self.block_m
            raise ValueError(
                f"N={N} does not fit this config: the fp32 accumulator [BLOCK_M={self.block_m}, BLOCK_N={block_n(N)}] "
                f"needs {regs} registers per thread over {self.num_warps} warps, more than MAX_ACC_REGS_PER_THREAD="
                f"{MAX_ACC_REGS_PER_THREAD} (naive fusion keeps the whole row in registers; this config holds "
                f"N <= {n_max}: use a smaller BLOCK_M or more warps)")
        smem = self.smem_estimate(N, itemsize)
        if smem > SMEM_LIMIT_BYTES:
            raise ValueError(
                f"N={N} does not fit this config: num_stages={self.num_stages} x (A [{self.block_m}x{self.block_k}] + "
                f"B [{self.block_k}x{block_n(N)}]) tiles (+ a y staging tile for a TMA store) need ~{smem} B of shared memory, more than SMEM_LIMIT_BYTES={SMEM_LIMIT_BYTES} "
                "(use fewer stages or a smaller BLOCK_K)")

    def to_helion(self, op: str = "matmul_layernorm", affine: tuple[bool, bool] = (False, False),
                  N: int | None = None) -> helion.Config:
        """The ``helion.Config`` for ``op`` (``"matmul_layernorm"`` or ``"matmul_rmsnorm"``) with ``affine =
        (weight given, bias given)``: the memory-op list depends on which affine loads exist. Helion's program
        order is ``a, b, [weight], [bias], y, [mean], rstd``.

        With the row length ``N`` given, ``b`` and ``y`` are switched from ``"tensor_descriptor"`` to
        ``"pointer"`` when their TMA box (``[BLOCK_K, block_n(N)]``, ``[BLOCK_M, block_n(N)]``) cannot be used:
        ``block_n(N) > 256`` (TMA's box limit) or ``> N``. Helion 1.5.0 falls back by itself in both cases on a
        CUDA device, but checks the 256 limit *only* for CUDA devices, so CPU-bound code generation (compile-only)
        would otherwise emit 512-wide boxes that the GPU run never sees; deciding it here makes both identical."""
        if op not in FUSED_OPS:
            raise ValueError(f"to_helion: unknown fused op {op!r}; choices: {', '.join(FUSED_OPS)}")
        has_w, has_b = affine
        mem = ["a", "b"] + (["weight"] if has_w else []) + (["bias"] if has_b and op == "matmul_layernorm" else [])
        mem += ["y", "mean", "rstd"] if op == "matmul_layernorm" else ["y", "rstd"]
        ix = [self.indexing_of(x) for x in mem]
        if N is not None and not self.row_box_fits(N):
            ix = ["pointer" if m in ("b", "y") and i == "tensor_descriptor" else i for m, i in zip(mem, ix)]
        kw: dict = {
            "block_sizes": list(self.block_sizes),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "pid_type": self.pid_type,
            "indexing": ix[0] if len(set(ix)) == 1 else ix,
        }
        if self.persistent_flatten is not None:  # Helion's range_* lists: [grid (tile) loop, K loop]
            kw["range_flattens"] = [self.persistent_flatten, None]
        for name in ("num_sm_multiplier", "maxnreg"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return helion.Config(**kw)


DEFAULT_CONFIG = TilingConfig()

# Candidates for the H200 sweep (configs/tiling/naive_fusion_h200.yaml, section helion; M = 262144, K, N in
# {64, 128, 256, 512}, bf16, LayerNorm without affine); untimed. Chosen from the sm_90 compile-only output
# (triton 3.6; ptxas -v registers per thread, no spills in the N range each entry serves; resident programs per SM
# by registers and shared memory). Naive fusion is memory-bound at these shapes except K = N = 512 (2MKN / 700
# TFLOP/s ~ M(K+N)2 B / 4.8 TB/s there), so what counts is bytes in flight per SM (~25-30 KB on H200) and the
# overlap of one row block's epilogue with the next one's loads. BLOCK_K = 64 everywhere: a BLOCK_K > K makes the
# TMA box larger than the tensor, and Helion then falls back to pointer loads (at K = 64 the K loop has one
# iteration, so num_stages only matters from K = 128 on, or across row blocks in a flattened persistent loop).
# Numbers: registers / resident programs per SM at (K, N) = (64, 64), (128, 128), (256, 256), (512, 512).
H200_CANDIDATES = {
    # one warpgroup per 64-row block; N <= 256. 58/8, 90/3, 157/1, - (N = 512 needs 256 acc regs: unsupported).
    "tma-64x64-w4-s3": dict(block_sizes=(64, 64), num_warps=4, num_stages=3, indexing="tensor_descriptor"),
    # two warpgroups (64 rows each) share one B tile; N <= 256. 58/4, 90/2, 156/1, -.
    "tma-128x64-w8-s3": dict(block_sizes=(128, 64), num_warps=8, num_stages=3, indexing="tensor_descriptor"),
    # 8 warps on 64 rows: half the accumulator per thread, the only flat entry that holds N = 512
    # (B and y use pointers there: box 512 > 256; ring 2 x (8 + 64) KiB). 42/5, 60/4, 108/2, 177/1.
    "tma-64x64-w8-s2": dict(block_sizes=(64, 64), num_warps=8, num_stages=2, indexing="tensor_descriptor"),
    # persistent, 2 x 132 programs, row-block loop flattened into the K loop (the next row block's TMA loads fly
    # during this one's LayerNorm epilogue); N <= 256. 62/3, 94/2, 162/1 (the second 132 then run as a 2nd wave).
    "persist-flat-64x64-w4-s3-x2": dict(block_sizes=(64, 64), num_warps=4, num_stages=3,
                                        indexing="tensor_descriptor", pid_type="persistent_interleaved",
                                        persistent_flatten=True, num_sm_multiplier=2),
}
# The plain-GEMM baseline (impl "gemm", ``kernels_helion.lazy_prenorm.matmul``, whose TilingConfig these are) at
# the same shapes. registers / programs per SM at (64, 64), (256, 256), (512, 512): 90/5, 90/2, 90/2 and 90/2 x3.
H200_GEMM_CANDIDATES = {
    "gemm-tma-128x64x64-w4-s4": dict(block_sizes=(128, 64, 64), num_warps=4, num_stages=4,
                                     indexing="tensor_descriptor"),
    "gemm-persist-flat-128x128x64-s3-sub2-x2": dict(block_sizes=(128, 128, 64), num_warps=8, num_stages=3,
                                                    indexing="tensor_descriptor", pid_type="persistent_interleaved",
                                                    persistent_flatten=True, num_sm_multiplier=2,
                                                    epilogue_subtile=2, l2_groupings=(8,)),
}


# ------------------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------------------
_COMPILED: dict = {}  # (op, M, N, K, dtype, device, has_weight, has_bias, TilingConfig) -> compiled host function


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_matmul_layernorm_kernel.settings)


def _args(op: str, a, b, weight, bias, eps) -> tuple:
    if op not in FUSED_OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(FUSED_OPS)}")
    eps = check_eps(eps)
    check_inputs(a, b, weight, bias if op == "matmul_layernorm" else None, eps)  # the technique's contract
    return (a, b, weight, bias, eps) if op == "matmul_layernorm" else (a, b, weight, eps)


def _prepare(op: str, a, b, weight, bias, eps, config):
    args = _args(op, a, b, weight, bias, eps)
    cfg = TilingConfig.from_dict(config)
    cfg.check_capacity(b.shape[1], a.element_size())
    return args, cfg


def _run(op: str, a, b, weight, bias, eps, config):
    args, cfg = _prepare(op, a, b, weight, bias, eps, config)
    (M, K), N = a.shape, b.shape[1]
    kernel = _indexed_kernel(_KERNELS[op], a.numel(), b.numel(), M * N)  # int64 offsets past 2^31 elements
    if ref_mode():
        return kernel(*args)  # eager PyTorch on whole tensors: the config does not apply
    if a.device.type != "cuda":
        raise ValueError(f"{op} needs CUDA tensors (got {a.device}); on CPU set HELION_INTERPRET=1 before "
                         "importing helion (ref mode), or use compile_sm90 for a compile-only check")
    affine = (weight is not None, bias is not None and op == "matmul_layernorm")
    ck = (op, M, N, K, a.dtype, a.device, affine, cfg)
    fn = _COMPILED.get(ck)
    if fn is None:
        bound = kernel.bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(cfg.to_helion(op, affine, N))
        _COMPILED[ck] = fn
    return fn(*args)  # a and b are 16-byte aligned (check_inputs): TMA descriptors are legal whenever configured


def matmul_layernorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, eps: float = 1e-5,
                     config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Naive fusion, LayerNorm: ``y = layer_norm(a @ b) (* weight + bias)`` over N, in one kernel.

    ``a [M, K]``, ``b [K, N]``: 2-D row-major contiguous tensors of one dtype (bf16 on the GPU; bf16/fp16/fp32;
    fp32 dots are true fp32 FMA, for correctness checks only), K and N multiples of 8, any M >= 1.
    ``weight``, ``bias``: ``[N]`` of ``a.dtype`` on ``a.device``, each optional (None: no affine load).
    ``eps`` > 0 (runtime argument). The accumulator, the mean and the two-pass biased variance are fp32.
    Returns ``(y [M, N] a.dtype, mean [M] fp32, rstd [M] fp32)``.
    ``config``: ``TilingConfig``, a mapping for ``TilingConfig.from_dict``, or None (``DEFAULT_CONFIG``); under
    ref mode (``HELION_INTERPRET=1``) it is validated (capacity included) and then ignored, and CPU tensors are
    accepted. The first call per (shape, dtype, device, affine, config) compiles; later calls reuse it.

    Raises NotImplementedError for inputs that require grad with grad mode on (forward only); TypeError/ValueError
    from ``normfuse.techniques.naive_fusion.check_inputs`` (dtypes, ranks, K/N multiples of 8, contiguity,
    16-byte aligned a and b, devices, ``eps``, a weight/bias of the wrong type, dtype, shape, device or layout);
    ``normfuse.tiling.ConfigError`` (a ValueError) for an invalid config; ValueError for an N that the config
    cannot hold (``TilingConfig.check_capacity``: ``MAX_ACC_REGS_PER_THREAD``, ``SMEM_LIMIT_BYTES``) and for
    non-CUDA tensors outside ref mode. y past 2^31 elements gets the int64-indexing twin of the kernel.

    Source: PyTorch blog "Towards Free Normalization", section 1,
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    Helion's examples/matmul_layernorm.py, https://github.com/pytorch/helion/tree/main/examples
    """
    check_forward_only("naive_fusion.matmul_layernorm", a=a, b=b, weight=weight, bias=bias)
    return _run("matmul_layernorm", a, b, weight, bias, eps, config)


def matmul_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
                   config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive fusion, RMSNorm: ``y = (a @ b) * rsqrt(mean((a @ b)^2) + eps) (* weight)`` over N, in one kernel.

    Inputs, ``config`` and errors as for ``matmul_layernorm`` (no bias). The accumulator and the sum of squares
    are fp32. Returns ``(y [M, N] a.dtype, rstd [M] fp32)``.

    Source: PyTorch blog "Towards Free Normalization", section 1,
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
    """
    check_forward_only("naive_fusion.matmul_rmsnorm", a=a, b=b, weight=weight)
    return _run("matmul_rmsnorm", a, b, weight, None, eps, config)


# ------------------------------------------------------------------------------------------------------------
# code generation and compile-only
# ------------------------------------------------------------------------------------------------------------
def _bound(op: str, a, b, eps, config, affine: bool):
    if op not in FUSED_OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    w = bias = None
    if affine:
        N = b.shape[1] if isinstance(b, torch.Tensor) and b.dim() == 2 else 0
        w = torch.ones(N, dtype=a.dtype, device=a.device)
        bias = torch.zeros_like(w) if op == "matmul_layernorm" else None
    args, cfg = _prepare(op, a, b, w, bias, eps, config)
    kernel = _indexed_kernel(_KERNELS[op], a.numel(), b.numel(), a.shape[0] * b.shape[1])
    return kernel.bind(args), cfg.to_helion(op, (affine, affine and op == "matmul_layernorm"), b.shape[1]), args


def _codegen_env(a: torch.Tensor):
    return _as_on_h200() if a.device.type == "cpu" else contextlib.nullcontext()


def triton_code(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-5, config=None,
                affine: bool = False) -> str:
    """The Triton source Helion generates for fused ``op`` at ``config`` for the shapes/dtypes of ``a``, ``b``
    (CPU tensors are fine; nothing is compiled); ``affine`` binds a ``weight`` (and for LayerNorm a ``bias``).
    Raises like ``compile_sm90``."""
    if op == "matmul":
        from kernels_helion import lazy_prenorm

        return lazy_prenorm.triton_code("matmul", a, b, config=config)
    bound, hcfg, args = _bound(op, a, b, eps, config, affine)
    with _live_args(bound, args), _codegen_env(a):
        return bound.to_triton_code(hcfg)


def compile_sm90_kernel(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-5, config=None,
                        affine: bool = False):
    """Like ``compile_sm90`` but returns Triton's ``CompiledKernel`` (``.asm["ptx"]``, ``.asm["ttgir"]``,
    ``.metadata``) for inspection, e.g. with ``ptxas_usage``."""
    if op == "matmul":
        from kernels_helion import lazy_prenorm

        return lazy_prenorm.compile_sm90_kernel("matmul", a, b, config=config)
    from normfuse.compile_only import WarmupLauncher

    bound, hcfg, args = _bound(op, a, b, eps, config, affine)
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(a):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError(f"{op}: Helion's host code did not launch a kernel; nothing was compiled")
    return launcher.last


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-5, config=None,
                 affine: bool = False) -> dict:
    """Compile ``op`` (``"matmul_layernorm"``, ``"matmul_rmsnorm"``, or ``"matmul"``, the latter with a
    ``kernels_helion.lazy_prenorm`` config) for sm_90 without launching it.

    The caller must already have run ``normfuse.compile_only.install(90)``. ``a [M, K]``, ``b [K, N]``: CPU
    tensors (``torch.empty`` is fine; only shape, dtype and alignment matter), validated like the kernel inputs
    (including the capacity limit). ``affine=True`` binds a ``weight`` (and for LayerNorm a ``bias``) of
    ``a.dtype``. For CPU tensors ``helion.runtime.get_num_sm`` is pinned to 132 (H200) during the call, so
    persistent ``pid_type`` values compile too.

    Returns ``normfuse.compile_only.summarize(...)`` (PTX marker counts, ``shared_bytes``, ``num_warps``,
    ``smem_ok``, ``cluster_dims``). Raises ValueError/TypeError for an unknown op, bad inputs, config or
    capacity, RuntimeError in ref mode, and whatever Helion/Triton raise on a compile failure. Compilation
    only: never a correctness signal.
    """
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, a, b, eps=eps, config=config, affine=affine))
