r"""Multi-CTA Norm Fusion in Helion (1.5, Hopper sm_90): ``Y = norm(A @ B)`` (RMSNorm or LayerNorm over the rows of
the GEMM output, optional affine) with the cross-tile row reduction Helion can express.

What Helion cannot express: thread-block clusters and distributed shared memory (Helion generates upstream Triton,
which exposes neither), so the programs that share an M-tile cannot exchange partial statistics while they hold
their accumulators. Inter-program waits are possible in principle (``hl.wait`` / ``hl.signal`` spin on global
flags) but safe only if the co-operating programs are co-resident, which a normal launch does not guarantee (and
a previous global-memory exchange with waits in this repo failed at multi-wave shapes: ``results/attempts/``).

What it expresses here, **"rowblock"**: one program per ``BLOCK_M``-row block walks all N tiles of its rows. Per
tile it runs the K loop (``torch.addmm`` into an fp32 accumulator; TMA loads of A and B with
``indexing="tensor_descriptor"``), folds the tile's fp32 statistics into running per-row statistics, and stores
the un-normalized tile, rounded to the output dtype, into ``y``. After the last tile the statistics are complete;
a second device loop re-reads the row block (just written by this program: L2-resident) and normalizes it in
place. No atomics, no inter-program communication, deterministic (tiles are visited in order). The statistics:
RMSNorm the sum of squares; LayerNorm a running **Chan merge** of per-tile (count, mean, M2) (no
``E[x^2] - mean^2`` cancellation). Columns past N: the accumulator is 0 there (masked loads) and the centred
values are masked explicitly.

The store -> re-load of ``y`` by *other threads* of the same program is a global-memory RAW hazard; Helion sees the
dependency and emits ``tl.debug_barrier()`` between the two loops (checked in the tests on the generated Triton).
A TMA store would not be covered by that barrier (``cp.async.bulk.wait_group.read`` waits for the smem read only),
so every access to ``y`` and to the statistics uses pointer indexing, whatever ``TilingConfig.indexing`` says (it
applies to the A/B operand loads).

Costs against the cluster kernel: the un-normalized tile makes an L2 round trip (written, re-read, overwritten in
place: the HBM traffic stays near the GEMM's if the row blocks in flight fit in L2: 132 x 128 x N x 2 B, i.e. 34 MB
at N = 1024, 67 MB at N = 2048, beyond the H200's ~50 MB), A's row block is re-read from L2 once per N tile,
and a program's normalization pass is not overlapped with its own MMAs (other programs' are).

**Limit of ``flatten_n``: N a multiple of BLOCK_N** (``matmul_rmsnorm`` / ``matmul_layernorm`` raise ValueError
otherwise, the sweep's ``unsupported``). On the H200 (helion 1.5.0, triton 3.6) ``rowblock-flatn-128x256x64-s3``
returned rstd 6 % off at M=257, N=264 (one full 256 tile + an 8-column tile), K=1000, while it passed at N = 392,
1000, 2000, 4000 and every multiple of 256, and the same tiles without ``flatten_n`` passed everywhere. Root cause
not found: Helion's Triton for that loop is correct (the partial tile's columns are masked out of the sum and
the store; the TMA loads zero-fill them), and the sm_90 TTGIR of the fused, pipelined loop is identical at N=264
and N=392 except for the constants, so the fault lies below the generated Triton (Triton's loop fusion +
wgmma pipelining, ptxas, or the run) and cannot be told apart by shape from the CPU. Restricting the flattened
loop to full N tiles covers the benchmark shapes (N multiples of 256) and excludes the failing class; ragged N
runs the unflattened configs. Compile-only and ``triton_code`` still accept any N.

Execution modes (as in ``kernels_helion/lazy_prenorm.py``): GPU (the config compiled once per shape through
``BoundKernel.compile_config`` and cached); CPU ref mode (``HELION_INTERPRET=1`` before ``import helion``: eager
PyTorch, config validated and ignored); ``compile_sm90`` (CPU tensors, fake sm_90 driver, never launches);
``triton_code`` (the generated Triton).

Sources: PyTorch blog "Towards Free Normalization" (multi-CTA norm fusion),
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
Helion examples ``matmul_layernorm.py`` (full-N epilogue norm), https://github.com/pytorch/helion/tree/main/examples ;
Chan, Golub, LeVeque (1979) for the merge. Code written for this repo.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from kernels_helion import lazy_prenorm as _lp
from kernels_helion.lazy_prenorm import _as_on_h200, _live_args, ptxas_usage  # noqa: F401  (shared host helpers)
from normfuse.techniques import multi_cta as _spec
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

__all__ = ["TilingConfig", "DEFAULT_CONFIG", "H200_CANDIDATES", "OPS", "matmul", "matmul_rmsnorm",
           "matmul_layernorm", "compile_sm90", "compile_sm90_kernel", "triton_code", "ref_mode", "ptxas_usage"]

OPS = ("matmul_rmsnorm", "matmul_layernorm", "matmul")
INDEXING = ("pointer", "tensor_descriptor")
PID_TYPES = ("flat", "persistent_blocked", "persistent_interleaved")

# The plain GEMM of this DSL (the 'gemm' impl): kernels_helion.lazy_prenorm.matmul, with its own TilingConfig.
matmul = _lp.matmul


# ------------------------------------------------------------------------------------------------------------
# kernels (memory ops in program order are listed in _MEMORY_OPS: Helion's per-op `indexing` follows it)
# ------------------------------------------------------------------------------------------------------------
@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _rms_rowblock_kernel(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd_out = torch.empty([m], dtype=torch.float32, device=a.device)
    block_n = hl.register_block_size(n)  # one BLOCK_N for both N loops
    for tile_m in hl.tile(m):  # grid: one program per row block
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):  # loop n: GEMM tile, statistics, rounded tile to y
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            ss = ss + torch.sum(acc * acc, dim=-1)
            y[tile_m, tile_n] = acc.to(y.dtype)
        rstd = torch.rsqrt(ss / n + eps)
        for tile_n2 in hl.tile(n, block_size=block_n):  # loop n2: normalize the row block in place
            yt = y[tile_m, tile_n2].to(torch.float32) * rstd[:, None]
            if weight is not None:
                yt = yt * weight[tile_n2].to(torch.float32)
            y[tile_m, tile_n2] = yt.to(y.dtype)
        rstd_out[tile_m] = rstd
    return y, rstd_out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _ln_rowblock_kernel(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    mean_out = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd_out = torch.empty([m], dtype=torch.float32, device=a.device)
    block_n = hl.register_block_size(n)
    for tile_m in hl.tile(m):
        cnt = hl.zeros([tile_m], dtype=torch.float32)  # running (count, mean, M2) per row: Chan's merge
        mean = hl.zeros([tile_m], dtype=torch.float32)
        m2 = hl.zeros([tile_m], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            valid = (tile_n.index < n).to(torch.float32)  # columns past N: acc is 0, but not its centred value
            n_t = torch.sum(valid, dim=-1)
            mean_t = torch.sum(acc, dim=-1) / n_t
            d = (acc - mean_t[:, None]) * valid[None, :]
            m2_t = torch.sum(d * d, dim=-1)
            tot = cnt + n_t
            delta = mean_t - mean
            mean = mean + delta * (n_t / tot)
            m2 = m2 + m2_t + delta * delta * (cnt * n_t / tot)
            cnt = tot
            y[tile_m, tile_n] = acc.to(y.dtype)
        rstd = torch.rsqrt(m2 / n + eps)
        for tile_n2 in hl.tile(n, block_size=block_n):
            yt = (y[tile_m, tile_n2].to(torch.float32) - mean[:, None]) * rstd[:, None]
            if weight is not None:
                yt = yt * weight[tile_n2].to(torch.float32)
            if bias is not None:
                yt = yt + bias[tile_n2].to(torch.float32)
            y[tile_m, tile_n2] = yt.to(y.dtype)
        mean_out[tile_m] = mean
        rstd_out[tile_m] = rstd
    return y, mean_out, rstd_out


_KERNELS = {"matmul_rmsnorm": _rms_rowblock_kernel, "matmul_layernorm": _ln_rowblock_kernel}


def _memory_ops(op: str, has_w: bool, has_b: bool) -> tuple[str, ...]:
    """Loads and stores of ``op``'s kernel in Helion's program order (one ``indexing`` entry each)."""
    ops = ["a", "b", "y_store", "y_load"]
    if has_w:
        ops.append("weight")
    if has_b and op == "matmul_layernorm":
        ops.append("bias")
    ops.append("y_store")
    ops += ["mean", "rstd"] if op == "matmul_layernorm" else ["rstd"]
    return tuple(ops)


# ------------------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------------------
def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and (v & (v - 1)) == 0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """A typed, validated subset of ``helion.Config`` for the row-block kernels (hashable: a cache key).

    * ``block_sizes`` ``(BLOCK_M, BLOCK_N, BLOCK_K)``: powers of two in [16, 256] (``tl.dot`` minimum, TMA box);
      ``BLOCK_N`` serves both N loops (``hl.register_block_size``).
    * ``num_warps`` (power of two, 1..32), ``num_stages`` (1..8): kernel-level; the K loop's pipelining depth.
    * ``indexing``: ``"pointer"`` or ``"tensor_descriptor"`` for the A and B operand loads; ``y`` and the
      statistics always use pointers (module docstring: the in-program re-read of ``y``).
    * ``pid_type``: ``"flat"`` (one program per row block) or ``"persistent_blocked" |
      "persistent_interleaved"`` (``num_sm_multiplier`` x 132 programs on the H200 walk the row blocks).
    * ``num_sm_multiplier`` (1..128): persistent only; None = Helion's default.
    * ``flatten_n``: ``range_flattens`` of the first N loop: Triton fuses it with the K loop into one software-
      pipelined loop (the next N tile's loads in flight during this tile's epilogue), as in Lazy Pre-Norm's
      ``rowblock-flatn`` configs. Served only when N % BLOCK_N == 0 (module docstring; ValueError otherwise).

    Raises ValueError naming the violated constraint.
    """

    block_sizes: tuple = (128, 256, 64)
    num_warps: int = 8
    num_stages: int = 3
    indexing: str = "tensor_descriptor"
    pid_type: str = "flat"
    num_sm_multiplier: int | None = None
    flatten_n: bool = False

    def __post_init__(self):
        bs = self.block_sizes
        if isinstance(bs, (str, bytes)) or not isinstance(bs, (tuple, list)) or len(bs) != 3:
            raise ValueError(f"block_sizes must be (BLOCK_M, BLOCK_N, BLOCK_K), 3 entries, got {bs!r}")
        if not all(_is_pow2(x) and 16 <= x <= 256 for x in bs):
            raise ValueError(f"block_sizes entries must be powers of two in [16, 256] (tl.dot minimum, TMA box), "
                             f"got {bs!r}")
        object.__setattr__(self, "block_sizes", tuple(bs))
        if not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"num_warps must be a power of two in [1, 32], got {self.num_warps!r}")
        if not (_is_int(self.num_stages) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an integer in [1, 8], got {self.num_stages!r}")
        if self.indexing not in INDEXING:
            raise ValueError(f"indexing must be one of {INDEXING}, got {self.indexing!r}")
        if self.pid_type not in PID_TYPES:
            raise ValueError(f"pid_type must be one of {PID_TYPES}, got {self.pid_type!r}")
        if self.num_sm_multiplier is not None:
            if not (_is_int(self.num_sm_multiplier) and 1 <= self.num_sm_multiplier <= 128):
                raise ValueError(f"num_sm_multiplier must be None or an integer in [1, 128], "
                                 f"got {self.num_sm_multiplier!r}")
            if not self.pid_type.startswith("persistent"):
                raise ValueError(f"num_sm_multiplier needs a persistent pid_type, got {self.pid_type!r}")
        if not isinstance(self.flatten_n, bool):
            raise ValueError(f"flatten_n must be a bool, got {self.flatten_n!r}")

    def to_helion(self, op: str = "matmul_rmsnorm", has_w: bool = False, has_b: bool = False) -> helion.Config:
        """The ``helion.Config`` of ``op``'s kernel (with the affine vectors present or not: they change the
        memory-op list). Helion's block-size order: ``[BLOCK_N (registered first), BLOCK_M, BLOCK_K]``; its
        range lists have one entry per block id: [grid loop (a loop only when persistent), loop k, both n loops
        (they share BLOCK_N; flattening the second, which holds no inner loop, changes nothing)]."""
        if op not in _KERNELS:
            raise ValueError(f"unknown op {op!r}; choices: {', '.join(_KERNELS)}")
        bm, bn, bk = self.block_sizes
        mem = _memory_ops(op, has_w, has_b)
        kw: dict = {
            "block_sizes": [bn, bm, bk],
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "pid_type": self.pid_type,
            "indexing": [self.indexing if m in ("a", "b") else "pointer" for m in mem],
        }
        if self.flatten_n:
            kw["range_flattens"] = [None, None, True]
        if self.num_sm_multiplier is not None:
            kw["num_sm_multiplier"] = self.num_sm_multiplier
        return helion.Config(**kw)


DEFAULT_CONFIG = TilingConfig()

# H200 candidates (configs/tiling/multi_cta_h200.yaml mirrors them): the GEMM tile shapes that the Lazy Pre-Norm
# row-block configs use, since this kernel is that schedule plus an L2 normalization pass.
H200_CANDIDATES = {
    "rowblock-128x256x64-s3": dict(block_sizes=(128, 256, 64), num_warps=8, num_stages=3),
    "rowblock-flatn-128x256x64-s3": dict(block_sizes=(128, 256, 64), num_warps=8, num_stages=3, flatten_n=True),
    "rowblock-flatn-128x128x64-s4": dict(block_sizes=(128, 128, 64), num_warps=8, num_stages=4, flatten_n=True),
    "rowblock-persist-128x128x64-s3-x2": dict(block_sizes=(128, 128, 64), num_warps=8, num_stages=3,
                                              pid_type="persistent_interleaved", num_sm_multiplier=2),
}


# ------------------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------------------
_COMPILED: dict = {}  # (op, M, N, K, dtype, device, has_w, has_b, TilingConfig) -> compiled host function


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_rms_rowblock_kernel.settings)


def _args(op: str, a, b, weight, bias, eps) -> tuple:
    eps = check_eps(eps)
    if op == "matmul_rmsnorm":
        bias = None
    _spec.check_inputs(a, b, weight, bias, eps)  # the technique's contract (16-byte aligned a, b included)
    return (a, b, weight, eps) if op == "matmul_rmsnorm" else (a, b, weight, bias, eps)


def _run(op: str, a, b, weight, bias, eps, config):
    args = _args(op, a, b, weight, bias, eps)
    cfg = TilingConfig.from_dict(config)
    N, BLOCK_N = b.shape[1], cfg.block_sizes[1]
    if cfg.flatten_n and N % BLOCK_N:
        raise ValueError(f"flatten_n needs N % BLOCK_N == 0 (got N={N}, BLOCK_N={BLOCK_N}): the flattened N x K "
                         "loop gave wrong statistics on the H200 at a partial last N tile (module docstring); "
                         "use a config without flatten_n")
    M, K = a.shape
    kernel = _lp._indexed_kernel(_KERNELS[op], a.numel(), b.numel(), M * N)  # int64 offsets past 2^31 elements
    if ref_mode():
        return kernel(*args)  # eager PyTorch on whole tensors: the config does not apply
    if a.device.type != "cuda":
        raise ValueError(f"{op} needs CUDA tensors (got {a.device}); on CPU set HELION_INTERPRET=1 before "
                         "importing helion (ref mode), or use compile_sm90 for a compile-only check")
    has_w, has_b = weight is not None, op == "matmul_layernorm" and bias is not None
    ck = (op, M, b.shape[1], K, a.dtype, a.device, has_w, has_b, cfg)
    fn = _COMPILED.get(ck)
    if fn is None:
        bound = kernel.bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(cfg.to_helion(op, has_w, has_b))
        _COMPILED[ck] = fn
    return fn(*args)


def matmul_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
                   config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = rmsnorm(a @ b) (* weight)``: one program per row block, GEMM tiles + running statistics, then an
    in-place normalization pass over the (L2-resident) row block (module docstring).

    Args:
        a: ``[M, K]``, b: ``[K, N]``: one dtype (bf16/fp16/fp32), row-major contiguous, K and N multiples of 8,
            CUDA (CPU in ref mode); 16-byte aligned with ``indexing="tensor_descriptor"``.
        weight: ``[N]`` of a's dtype, or None (Helion specializes the kernel on None-ness).
        eps: finite, > 0.
        config: ``TilingConfig``, a mapping or None; validated and ignored in ref mode.

    Returns:
        ``(y [M, N] a.dtype, rstd [M] fp32)``.

    Raises:
        NotImplementedError: an input requires grad with grad mode on (forward only).
        TypeError/ValueError: from ``normfuse.techniques.multi_cta.check_inputs`` (16-byte aligned a and b, the
        affine vectors in a's dtype, ...); ValueError naming eps for a bad ``eps`` (None too), for non-CUDA
        tensors outside ref mode and for ``flatten_n`` with a partial last N tile; ``normfuse.tiling.ConfigError``
        for an invalid config.

    y past 2^31 elements (e.g. 262144 x 8200) gets the int64-indexing twin of the kernel.

    Sources: see the module docstring.
    """
    check_forward_only("multi_cta.matmul_rmsnorm", a=a, b=b, weight=weight)
    return _run("matmul_rmsnorm", a, b, weight, None, eps, config)


def matmul_layernorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, eps: float = 1e-5,
                     config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y = layernorm(a @ b) (* weight + bias)`` (biased variance; per-tile statistics merged with Chan's formula
    in tile order). Args and errors as ``matmul_rmsnorm``; ``bias`` ``[N]`` or None.

    Returns:
        ``(y [M, N] a.dtype, mean [M] fp32, rstd [M] fp32)``.
    """
    check_forward_only("multi_cta.matmul_layernorm", a=a, b=b, weight=weight, bias=bias)
    return _run("matmul_layernorm", a, b, weight, bias, eps, config)


def _bound(op: str, a, b, eps, config, affine: bool):
    if op not in _KERNELS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(_KERNELS)}")
    N = b.shape[1] if isinstance(b, torch.Tensor) and b.dim() == 2 else 8
    w = torch.empty(N, dtype=a.dtype, device=a.device) if affine and isinstance(a, torch.Tensor) else None
    bias = torch.empty(N, dtype=a.dtype, device=a.device) if affine and op == "matmul_layernorm" and w is not None \
        else None
    args = _args(op, a, b, w, bias, eps)
    cfg = TilingConfig.from_dict(config)
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    kernel = _lp._indexed_kernel(_KERNELS[op], a.numel(), b.numel(), a.shape[0] * b.shape[1])
    return kernel.bind(args), cfg.to_helion(op, w is not None, bias is not None), args


def _codegen_env(a: torch.Tensor):
    return _as_on_h200() if a.device.type == "cpu" else contextlib.nullcontext()


def triton_code(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-6, config=None,
                affine: bool = False) -> str:
    """The Triton source Helion generates for ``op`` (``"matmul_rmsnorm"`` / ``"matmul_layernorm"``) at ``config``
    for the shapes/dtypes of ``a``, ``b`` (CPU tensors are fine; nothing is compiled). ``affine``: bind a weight
    (and bias). Raises like ``compile_sm90``."""
    bound, hcfg, args = _bound(op, a, b, eps, config, affine)
    with _live_args(bound, args), _codegen_env(a):
        return bound.to_triton_code(hcfg)


def compile_sm90_kernel(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-6, config=None,
                        affine: bool = False):
    """As ``compile_sm90`` but returns Triton's ``CompiledKernel``."""
    from normfuse.compile_only import WarmupLauncher

    bound, hcfg, args = _bound(op, a, b, eps, config, affine)
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(a):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError(f"{op}: Helion's host code did not launch a kernel; nothing was compiled")
    return launcher.last


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-6, config=None,
                 affine: bool = False) -> dict:
    """Compile ``op`` for sm_90 without launching it (needs ``normfuse.compile_only.install(90)``; ``a``, ``b``
    CPU tensors, never read) and return ``normfuse.compile_only.summarize(...)``. ``op="matmul"`` is delegated to
    ``kernels_helion.lazy_prenorm.compile_sm90`` (its own TilingConfig). Raises ValueError for an unknown op, bad
    inputs or config, RuntimeError in ref mode."""
    from normfuse.compile_only import summarize

    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    if op == "matmul":
        return _lp.compile_sm90("matmul", a, b, config=config)
    return summarize(compile_sm90_kernel(op, a, b, eps=eps, config=config, affine=affine))
