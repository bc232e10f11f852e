r"""Helion kernels for standalone RMSNorm and LayerNorm (forward) over the last dimension.

``rms_norm(x, weight)`` returns ``(y, rstd)`` and ``layer_norm(x, weight, bias)`` returns ``(y, mean, rstd)``:
``y [M, N]`` in ``x.dtype``, statistics ``[M]`` in fp32. Math, input checks and tolerance:
``normfuse/techniques/norms.py``. These are the memory-bound denominators of every "% hidden" figure.

Sources: Helion's examples ``rms_norm.py`` and ``layer_norm.py``
(https://github.com/pytorch/helion/tree/main/examples) for the kernel shape (grid over row tiles, the whole row
as one ``[:]`` slice, ``reduction_loops`` choosing registers vs. a looped reduction); QuACK's memory-bound notes
for the targets (https://github.com/Dao-AILab/quack/blob/main/media/2025-07-10-membound-sol.md). The code here is
our own.

**Kernel structure.** One grid loop ``for tile_m in hl.tile(m)`` (``BLOCK_M`` rows per program) and the row as a
full slice ``x[tile_m, :]`` with ``n = hl.specialize(N)``. Helion's ``reduction_loops`` then picks between

* ``(None,)``: the whole row in registers (``_RDIM_SIZE = next_pow2(N)``, masked at ``N``): x is read from HBM
  once; the LayerNorm keeps the centred row ``x - mean`` in registers for the variance *and* the output;
* ``(R,)`` (a power of two < ``next_pow2(N)``): a looped reduction in chunks of ``R``: Helion emits one
  ``tl.range`` per reduction plus one for the output, each re-loading x: RMSNorm makes 2 passes over the row
  (sum of squares, output), LayerNorm 3 (sum, centred sum of squares, output). Only the first pass should
  come from HBM; the others hit L2 if the rows in flight fit (see ``H200_CANDIDATES``).

**Statistics.** fp32 throughout. RMSNorm: ``rstd = rsqrt(sum(x^2) / N + eps)``. LayerNorm uses the *two-pass*
variance ``mean = sum(x) / N; var = sum((x - mean)^2) / N`` (no ``E[x^2] - mean^2`` cancellation, so the
``x + 10`` mean-shifted inputs keep full accuracy). The generated Triton zeroes the padded lanes of
``(x - mean)^2`` (``tl.where(mask, ...)``), so the row tail past N does not leak ``mean^2`` into the variance.
``torch.var_mean(correction=0)`` was tried first: Helion 1.5.0 lowers it only with ``keepdim=True``, and the
``[tile_m, 1]`` result cannot then be narrowed to ``[tile_m]`` for the statistic store ("narrowing
kernel-tensor subscripts" is unsupported), hence the explicit two passes. Rows are reduced independently, so a
NaN/Inf in one row stays in that row (and in its statistics).

**Optional affine (``weight``/``bias`` = None).** The kernels take ``weight: Tensor | None`` (and ``bias``) and
branch with ``if weight is not None:``. Helion specializes on None-ness (a None argument is part of its bind
key), so each affine combination gets its own generated kernel, with no dummy tensor and no load of an
identity weight: the no-affine RMSNorm kernel has exactly one load (x) and three stores. In ref mode the same
``if`` is plain Python. (``rms_norm`` has no ``bias`` argument.)

**Execution modes** (as in ``kernels_helion/lazy_prenorm.py``).

* GPU: ``@helion.kernel(static_shapes=True, autotune_effort="none")`` without a pinned config; a call binds the
  arguments, compiles ``TilingConfig.to_helion()`` with ``BoundKernel.compile_config`` and caches the compiled
  callable per (op, M, N, dtype, device, weight/bias present, config).
* CPU ref mode (``HELION_INTERPRET=1`` in the environment *before* ``import helion``): the body runs as eager
  PyTorch on whole tensors; ``config`` is validated and then ignored.
* compile-only (``compile_sm90``): under ``normfuse.compile_only.install(90)``, CPU tensors are bound and the
  generated Triton is compiled for sm_90 with a launcher that never launches.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from kernels_helion.lazy_prenorm import _as_on_h200, _live_args, ptxas_usage  # shared host-side helpers
from normfuse.techniques.norms import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_aligned, check_eps, check_forward_only

__all__ = [
    "TilingConfig",
    "DEFAULT_CONFIG",
    "H200_CANDIDATES",
    "H200_CANDIDATES_BY_N",
    "OPS",
    "rms_norm",
    "layer_norm",
    "compile_sm90",
    "compile_sm90_kernel",
    "ptxas_usage",
    "triton_code",
    "ref_mode",
]

OPS = ("rms_norm", "layer_norm")
INDEXING = ("pointer", "tensor_descriptor", "block_ptr")
PID_TYPES = ("flat", "persistent_blocked", "persistent_interleaved")
MAX_ROWS_PER_TILE = 256
MAX_REDUCTION_CHUNK = 65536


# ------------------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------------------
@helion.kernel(static_shapes=True, autotune_effort="none")
def _rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = x.size()
    n = hl.specialize(n)
    y = torch.empty_like(x)
    rstd_out = torch.empty([m], dtype=torch.float32, device=x.device)
    for tile_m in hl.tile(m):
        xf = x[tile_m, :].to(torch.float32)
        rstd = torch.rsqrt(torch.sum(xf * xf, dim=-1) / n + eps)
        out = xf * rstd[:, None]
        if weight is not None:  # specialized: a separate kernel without this load when weight is None
            out = out * weight[:].to(torch.float32)
        y[tile_m, :] = out.to(y.dtype)
        rstd_out[tile_m] = rstd
    return y, rstd_out


@helion.kernel(static_shapes=True, autotune_effort="none")
def _layer_norm_kernel(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = x.size()
    n = hl.specialize(n)
    y = torch.empty_like(x)
    mean_out = torch.empty([m], dtype=torch.float32, device=x.device)
    rstd_out = torch.empty([m], dtype=torch.float32, device=x.device)
    for tile_m in hl.tile(m):
        xf = x[tile_m, :].to(torch.float32)
        mean = torch.sum(xf, dim=-1) / n
        xc = xf - mean[:, None]  # two-pass variance: no E[x^2] - mean^2 cancellation
        rstd = torch.rsqrt(torch.sum(xc * xc, dim=-1) / n + eps)
        out = xc * rstd[:, None]
        if weight is not None:
            out = out * weight[:].to(torch.float32)
        if bias is not None:
            out = out + bias[:].to(torch.float32)
        y[tile_m, :] = out.to(y.dtype)
        mean_out[tile_m] = mean
        rstd_out[tile_m] = rstd
    return y, mean_out, rstd_out


_KERNELS = {"rms_norm": _rms_norm_kernel, "layer_norm": _layer_norm_kernel}


# ------------------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------------------
def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and (v & (v - 1)) == 0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _one_tuple(name: str, v, what: str) -> tuple:
    if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or len(v) != 1:
        raise ValueError(f"{name} must be a 1-tuple ({what}), got {v!r}")
    return tuple(v)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """A typed, validated subset of ``helion.Config`` for both norm kernels (hashable: used as a cache key).

    Fields (Helion names):

    * ``block_sizes`` ``(BLOCK_M,)``: rows per program, a power of two in [1, 256].
    * ``reduction_loops`` ``(None,)`` (default): the whole row in registers; ``(R,)`` with R a power of two in
      [16, 65536]: a looped reduction in chunks of R columns (RMSNorm 2 passes over x, LayerNorm 3; see the module
      docstring). An R >= next_pow2(N) is the same as None (Helion's rule).
    * ``num_warps`` (power of two, 1..32), ``num_stages`` (1..8): kernel-level; ``num_stages`` pipelines the
      ``tl.range`` loops (the reduction chunks, and the tile loop of a persistent ``pid_type``).
    * ``indexing``: ``"pointer" | "tensor_descriptor" | "block_ptr"`` for every load and store. Helion falls
      back to pointers per access where a descriptor is not legal (1-D fp32 statistics, N * itemsize not a
      multiple of 16 B, a box larger than the tensor).
    * ``pid_type``: ``"flat"`` (one program per row tile) or ``"persistent_blocked" | "persistent_interleaved"``
      (``num_sm_multiplier`` x 132 programs on H200 that loop over the row tiles). ``"xyz"`` is not offered: the
      grid is 1-D, where it equals ``"flat"``.
    * ``num_sm_multiplier`` (1..128) and ``maxnreg`` (1..256): persistent ``pid_type`` only (Helion rejects
      ``maxnreg`` with ``"flat"``); None means Helion's default.

    Raises ValueError naming the violated constraint when a value is invalid.
    """

    block_sizes: tuple = (1,)
    reduction_loops: tuple = (None,)
    num_warps: int = 8
    num_stages: int = 1
    indexing: str = "pointer"
    pid_type: str = "flat"
    num_sm_multiplier: int | None = None
    maxnreg: int | None = None

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        bs = _one_tuple("block_sizes", self.block_sizes, "BLOCK_M,")
        if not (_is_pow2(bs[0]) and bs[0] <= MAX_ROWS_PER_TILE):
            raise ValueError(f"block_sizes[0] (rows per tile) must be a power of two in [1, {MAX_ROWS_PER_TILE}], "
                             f"got {bs[0]!r}")
        put("block_sizes", bs)
        rl = _one_tuple("reduction_loops", self.reduction_loops, "None for the whole row, or a chunk size")
        if rl[0] is not None and not (_is_pow2(rl[0]) and 16 <= rl[0] <= MAX_REDUCTION_CHUNK):
            raise ValueError(f"reduction_loops[0] must be None or a power of two in [16, {MAX_REDUCTION_CHUNK}], "
                             f"got {rl[0]!r}")
        put("reduction_loops", rl)
        if not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"num_warps must be a power of two in [1, 32], got {self.num_warps!r}")
        if not (_is_int(self.num_stages) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an integer in [1, 8], got {self.num_stages!r}")
        if self.indexing not in INDEXING:
            raise ValueError(f"indexing must be one of {INDEXING}, got {self.indexing!r}")
        if self.pid_type not in PID_TYPES:
            raise ValueError(f"pid_type must be one of {PID_TYPES}, got {self.pid_type!r}")
        persistent = self.pid_type.startswith("persistent")
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

    def to_helion(self) -> helion.Config:
        """The ``helion.Config`` (same for both ops: one tile dimension, one reduction dimension)."""
        kw: dict = {
            "block_sizes": list(self.block_sizes),
            "reduction_loops": list(self.reduction_loops),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "indexing": self.indexing,
            "pid_type": self.pid_type,
        }
        for name in ("num_sm_multiplier", "maxnreg"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return helion.Config(**kw)


DEFAULT_CONFIG = TilingConfig()

# Candidates for the H200 sweep N in {512 ... 32768}, M in {4096, 16384, 262144} (bf16); untimed. Chosen from the
# generated Triton and the sm_90 compile-only output (triton 3.6, M=262144, weight/bias bound; ptxas -v registers
# per thread, RMSNorm/LayerNorm). Resident programs per SM = min(64K regs / (threads x regs), 64 warps / num_warps).
# What the generated code shows, and why the list looks like this:
# * x is read with 128-bit vector loads (ld.global.v4: 8 bf16 per thread per load) and no shared memory beyond
#   the cross-warp reduction scratch (16-2048 B). Triton 3.6 does not software-pipeline these loads: the TTGIR
#   has no async_copy/local_alloc at num_stages 1 or 3, for the looped reduction and the persistent tile loop
#   alike, so num_stages stays 1 and latency is hidden only by bytes in flight = resident programs x tile bytes.
#   H200 needs ~25-30 KB in flight per SM (4.8 TB/s x ~0.7 us / 132 SMs); every entry below targets >= 48 KB.
# * indexing="tensor_descriptor" changes nothing for whole-row tiles (the [BLOCK_M, next_pow2(N)] box exceeds
#   TMA's 256-element box limit, so Helion falls back to pointers), hence the pointer default.
# * index arithmetic is int32 up to M*N < 2^31 and int64 beyond (Helion's automatic index_dtype), e.g. at
#   M=262144, N >= 8192.
H200_CANDIDATES = {
    # N <= 2048: 4 rows x N per program in registers. 39/40 regs (12 programs/SM) at N=512, 56/64 (9/8) at
    # N=1024, 96/116 (5/4) at N=2048 -> 48-64 KB in flight per SM; 168/177 regs at 4096, spills at 8192.
    "regs-r4-w4": dict(block_sizes=(4,), reduction_loops=(None,), num_warps=4),
    # 2048 <= N <= 16384: one row per program. 30-40 regs up to N=4096 (6-8 programs/SM), 60/64 at 8192 (4),
    # 126/128 at 16384 (2) -> 64 KB per SM in flight; 231/178 regs (1 program/SM) at 32768.
    "regs-r1-w8": dict(block_sizes=(1,), reduction_loops=(None,), num_warps=8),
    # 16384-32768, x read once: 62/89 regs at 16384 (2/1 programs/SM), 119/128 at 32768 (1 program of 16 warps,
    # 64 KB of x). One program per SM leaves a bubble at each program switch: compare with the looped entry.
    "regs-r1-w16": dict(block_sizes=(1,), reduction_loops=(None,), num_warps=16),
    # wide rows, looped: chunks of 4096 (8 KB per load step), 32-42 regs, 5-8 programs/SM. RMSNorm reads x twice,
    # LayerNorm three times; only the first pass should come from HBM: at N=32768 the rows in flight (132 x ~6 x
    # 64 KB ~ 50 MB) are about the size of L2, so this entry tells whether the re-reads hit.
    "loop4096-r1-w8": dict(block_sizes=(1,), reduction_loops=(4096,), num_warps=8),
    # persistent: 4 x 132 programs walk the 2-row tiles (fewer, longer-lived programs; no launch tail at M=262144).
    # 32-64 regs up to N=4096 (4 programs/SM), 114/128 at 8192 (2); spills at 32768.
    "persist-r2-w8-x4": dict(block_sizes=(2,), reduction_loops=(None,), num_warps=8,
                             pid_type="persistent_interleaved", num_sm_multiplier=4),
}
# Which entries make sense per N (the sweep may still time all of them everywhere).
H200_CANDIDATES_BY_N = {
    512: ("regs-r4-w4", "regs-r1-w8", "persist-r2-w8-x4"),
    1024: ("regs-r4-w4", "regs-r1-w8", "persist-r2-w8-x4"),
    2048: ("regs-r4-w4", "regs-r1-w8", "persist-r2-w8-x4"),
    4096: ("regs-r1-w8", "persist-r2-w8-x4"),
    8192: ("regs-r1-w8", "regs-r1-w16", "persist-r2-w8-x4"),
    16384: ("regs-r1-w8", "regs-r1-w16", "loop4096-r1-w8"),
    32768: ("regs-r1-w16", "loop4096-r1-w8"),
}


# ------------------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------------------
_COMPILED: dict = {}  # (op, M, N, dtype, device, has_weight, has_bias, TilingConfig) -> compiled host function


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_rms_norm_kernel.settings)


def _args(op: str, x, weight, bias, eps) -> tuple:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    eps = check_eps(eps)
    check_inputs(x, weight, bias, eps)  # the technique's contract: affine vectors of x's dtype, contiguous, [N]
    return (x, weight, eps) if op == "rms_norm" else (x, weight, bias, eps)


def _run(op: str, x, weight, bias, eps, config):
    args = _args(op, x, weight, bias, eps)
    cfg = TilingConfig.from_dict(config)
    kernel = _KERNELS[op]
    if ref_mode():
        return kernel(*args)  # eager PyTorch on whole tensors: the config does not apply
    if x.device.type != "cuda":
        raise ValueError(f"{op} needs CUDA tensors (got {x.device}); on CPU set HELION_INTERPRET=1 before "
                         "importing helion (ref mode), or use compile_sm90 for a compile-only check")
    if cfg.indexing == "tensor_descriptor":
        # a TMA descriptor needs a 16-byte aligned base; pointer indexing takes any x (Triton's launch
        # specialization drops the 16-byte vectors for an unaligned pointer)
        check_aligned(x, "x")
    M, N = x.shape
    ck = (op, M, N, x.dtype, x.device, weight is not None, bias is not None, cfg)
    fn = _COMPILED.get(ck)
    if fn is None:
        bound = kernel.bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(cfg.to_helion())
        _COMPILED[ck] = fn
    return fn(*args)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
             config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm forward over the last dimension: ``y = x * rsqrt(mean(x^2) + eps) (* weight)``.

    ``x [M, N]``: 2-D row-major contiguous, bf16/fp16/fp32, any M >= 1 and N >= 1 (row tail masked);
    ``weight [N]`` of ``x.dtype`` on ``x.device``, or None (no affine; a separate kernel, no extra load).
    ``eps`` > 0 is a runtime argument (no recompile per eps). Returns ``(y [M, N] x.dtype, rstd [M] fp32)``;
    the statistic and the products are fp32, rounded once to ``x.dtype``.
    ``config``: ``TilingConfig``, a mapping for ``TilingConfig.from_dict``, or None (``DEFAULT_CONFIG``); under
    ref mode (``HELION_INTERPRET=1``) it is validated and then ignored, and CPU tensors are accepted. The first call
    per (shape, dtype, device, affine, config) compiles; later calls reuse the compiled function.

    Raises NotImplementedError for inputs that require grad with grad mode on (forward only);
    TypeError/ValueError from ``normfuse.techniques.norms.check_inputs`` (dtype, rank, contiguity, affine
    shape/device/layout, a weight dtype other than ``x.dtype``) and ``normfuse.validate.check_eps`` (eps None,
    not finite or <= 0); ``normfuse.tiling.ConfigError`` for an invalid config; ValueError for non-CUDA tensors
    outside ref mode and, with ``indexing="tensor_descriptor"``, for an x whose data pointer is not 16-byte
    aligned (a view with a storage offset; pointer indexing takes it). x past 2^31 elements: Helion indexes in
    int64 by itself (it sizes the index type from the inputs, and y is x's size).

    Sources: Helion examples (rms_norm), https://github.com/pytorch/helion/tree/main/examples ; QuACK,
    https://github.com/Dao-AILab/quack/blob/main/media/2025-07-10-membound-sol.md
    """
    check_forward_only("norms.rms_norm", x=x, weight=weight)
    return _run("rms_norm", x, weight, None, eps, config)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
               eps: float = 1e-5, config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm forward over the last dimension: ``y = (x - mean) * rsqrt(var + eps) (* weight + bias)``.

    ``var`` is the biased variance computed in two passes (``mean((x - mean)^2)``, fp32), stable for inputs with
    a large mean. ``x``, ``weight``, ``bias`` (each optional, independently) and ``config`` as for ``rms_norm``.
    Returns ``(y [M, N] x.dtype, mean [M] fp32, rstd [M] fp32)``.

    Raises like ``rms_norm`` (bias checked like weight).

    Sources: Helion examples (layer_norm), https://github.com/pytorch/helion/tree/main/examples ; QuACK,
    https://github.com/Dao-AILab/quack/blob/main/media/2025-07-10-membound-sol.md
    """
    check_forward_only("norms.layer_norm", x=x, weight=weight, bias=bias)
    return _run("layer_norm", x, weight, bias, eps, config)


def _bound(op: str, x, eps, config, affine: bool):
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    if not isinstance(x, torch.Tensor):
        raise TypeError("x must be a torch.Tensor")
    w = b = None
    if affine:
        w = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        b = torch.zeros_like(w) if op == "layer_norm" else None
    args = _args(op, x, w, b, eps)
    cfg = TilingConfig.from_dict(config)
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    return _KERNELS[op].bind(args), cfg.to_helion(), args


def _codegen_env(x: torch.Tensor):
    return _as_on_h200() if x.device.type == "cpu" else contextlib.nullcontext()


def triton_code(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, affine: bool = False) -> str:
    """The Triton source Helion generates for ``op`` at ``config`` for the shape/dtype of ``x`` (CPU tensors are
    fine; nothing is compiled); ``affine`` adds ``weight`` (and for LayerNorm ``bias``). Raises like
    ``compile_sm90``."""
    bound, hcfg, args = _bound(op, x, eps, config, affine)
    with _live_args(bound, args), _codegen_env(x):
        return bound.to_triton_code(hcfg)


def compile_sm90_kernel(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, affine: bool = False):
    """Like ``compile_sm90`` but returns Triton's ``CompiledKernel`` (``.asm["ptx"]``, ``.metadata``, ...)."""
    from normfuse.compile_only import WarmupLauncher

    bound, hcfg, args = _bound(op, x, eps, config, affine)
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(x):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError(f"{op}: Helion's host code did not launch a kernel; nothing was compiled")
    return launcher.last


def compile_sm90(op: str, x: torch.Tensor, *, eps: float = 1e-6, config=None, affine: bool = False) -> dict:
    """Compile ``op`` (``"rms_norm"`` or ``"layer_norm"``) for sm_90 without launching it.

    The caller must already have run ``normfuse.compile_only.install(90)``. ``x [M, N]``: a CPU tensor
    (``torch.empty`` is fine; only shape and dtype matter), validated by ``check_inputs``; ``affine=True`` binds a
    ``weight`` (and for LayerNorm a ``bias``) of ``x.dtype``, else the no-affine kernel. Binds the kernel,
    compiles ``TilingConfig.from_dict(config).to_helion()`` and calls it with a
    ``normfuse.compile_only.WarmupLauncher`` (compiles to PTX/cubin, never launches). For CPU tensors
    ``helion.runtime.get_num_sm`` is pinned to 132 (H200) during the call, so persistent ``pid_type`` values
    compile too.

    Returns ``normfuse.compile_only.summarize(...)`` (PTX marker counts, ``shared_bytes``, ``num_warps``,
    ``smem_ok``, ``cluster_dims``). Raises ValueError/TypeError for an unknown op, bad inputs or config,
    RuntimeError in ref mode, and whatever Helion/Triton raise on a compile failure. Compilation only: never a
    correctness signal.
    """
    from normfuse.compile_only import summarize

    return summarize(compile_sm90_kernel(op, x, eps=eps, config=config, affine=affine))
