r"""FlashNormAttention ``gdpa`` (the blog's module) in Helion (1.5.x, Hopper sm_90): LayerNorm prologue, GELU-gated
attention without softmax, residual, RMSNorm and a second residual in ONE kernel.

Math (spec: ``normfuse.techniques.fna``), per token t of sequence b::

    ln_q = LayerNorm(q[t]) over H*D;  g_h = gelu_tanh(ln_q_h @ k[b,:,h]^T) @ v[b,:,h];  r = g + ln_q
    out[t] = RMSNorm(r) over H*D + q[t]

Design (what Helion can express; the same as the Triton kernel): the grid tiles ``[B, max_len]`` with a batch block
of 1 (``tile_b.begin`` is the scalar sequence index, the 2-D-tile style of dsl-primer §B.8; the 3-D style fails to
compile on sm_90), so one program owns ``BLOCK_M`` tokens of one sequence and ALL H heads and both norms reduce
program-locally. Tokens are gathered by index (``starts + tile_m.index``) and masked past the sequence's length
(``hl.load(..., extra_mask=)``; ``q`` is viewed as ``[total_q, H*D]``). Per head (``hl.static_range(H)``, unrolled:
no pipelined loop in which one loaded tile feeds a dot and a reduction, dsl-primer §0): the LayerNorm statistics
(two passes), then ``S = ln_q_h @ k_h^T`` over all of Lkv (short-KV), GELU, ``g_h = P @ v_h``, ``r_h = g_h +
ln_q_h``, the per-token sum of r^2; ``r_h`` is staged in the output (input dtype), and a last pass writes
``r_h * rstd + q_h``.

Not expressible in Helion, hence not done: clusters / DSMEM, warp specialization, explicit shared-memory staging of
r, early exit of programs whose tile lies past their sequence's end (such programs run on fully masked tiles: the
grid spans max_len for every sequence, ~2x the useful tiles at uniform lengths; masked rows load 0, so no NaN
appears and nothing is stored). Between the staging store of r and its re-load, Helion's code
generation emits ``tl.debug_barrier()`` itself (read-after-write on the same tensor; checked in the generated code
by the tests).

``head_loop="grid"`` (``_fna_gdpa_loop_kernel``): the head loops as ``hl.grid`` device loops (one copy of the body
in the generated code: ~58 KiB of SASS at bm64-w4 for any H, against 106 / 160 / 207 KiB unrolled at H = 2/3/4,
where the H200 measured a ~2.3x per-head cliff from H = 3 on; hypothesis: instruction-cache thrashing, see
``kernels_triton/fna.py``), one-pass LayerNorm statistics (Chan's combination of per-head mean/M2), and a trip count
of 0 for tiles past their sequence's end (``torch.where(tile_m.begin < length, H, 0)``), so those programs do no
work: the early exit the static kernel lacks.

CPU: ref mode (``HELION_INTERPRET=1`` before ``import helion``; needs the mm.dtype shim of
``normfuse.helion_compat``) runs the body as eager PyTorch; ``compile_sm90`` compiles the generated Triton for sm_90.

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(FlashNormAttention); Helion's jagged examples (gather by offsets + ``extra_mask``),
https://github.com/pytorch/helion/tree/main/examples . Written here. Status: CPU-checked (ref mode, compile-only).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from kernels_helion.lazy_prenorm import _as_on_h200, _live_args
from normfuse.techniques import fna as spec
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

FUNCTIONS = ("gdpa",)
HEAD_LOOPS = ("static", "grid")  # hl.static_range (unrolled) or hl.grid device loops


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _fna_gdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
                     max_len: int, eps: float) -> torch.Tensor:
    total, hd = q.size()
    hd = hl.specialize(hd)
    nb, lkv, nh, d = k.size()
    lkv = hl.specialize(lkv)
    nh = hl.specialize(nh)
    d = hl.specialize(d)
    out = torch.empty_like(q)
    for tile_b, tile_m in hl.tile([nb, max_len], block_size=[1, None]):
        b = tile_b.begin
        start = q_offsets[b]                                       # scalar
        length = q_offsets[b + 1] - start
        rows = start + tile_m.index                                # [BLOCK_M] token ids
        mask = tile_m.index < length
        s1 = hl.zeros([tile_m], dtype=torch.float32)
        for h in hl.static_range(nh):
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            s1 = s1 + torch.sum(x, dim=-1)
        mean = s1 / hd
        s2 = hl.zeros([tile_m], dtype=torch.float32)
        for h in hl.static_range(nh):
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            xc = x - mean[:, None]
            s2 = s2 + torch.sum(xc * xc, dim=-1)
        rstd_ln = torch.rsqrt(s2 / hd + eps)
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for h in hl.static_range(nh):
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            ln = (x - mean[:, None]) * rstd_ln[:, None]
            kh = k[b, :, h, :]                                        # [Lkv, D]
            vh = v[b, :, h, :]
            s = hl.dot(ln.to(q.dtype), kh.T, out_dtype=torch.float32)  # [BLOCK_M, Lkv]
            u = 0.7978845608028654 * (s + 0.044715 * s * s * s)
            p = s / (1.0 + torch.exp(-2.0 * u))                       # gelu_tanh(s) = s * sigmoid(2u)
            g = hl.dot(p.to(q.dtype), vh, out_dtype=torch.float32)   # [BLOCK_M, D]
            r = g + ln
            ss = ss + torch.sum(r * r, dim=-1)
            hl.store(out, [rows, h * d + hl.arange(d)], r.to(q.dtype), extra_mask=mask[:, None])
        rstd_rms = torch.rsqrt(ss / hd + eps)
        for h in hl.static_range(nh):
            r = hl.load(out, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            hl.store(out, [rows, h * d + hl.arange(d)], (r * rstd_rms[:, None] + x).to(q.dtype),
                     extra_mask=mask[:, None])
    return out


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _fna_gdpa_loop_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
                          max_len: int, eps: float) -> torch.Tensor:
    """``_fna_gdpa_kernel`` with device loops over the heads (``hl.grid``: one copy of the body in the generated
    code, whatever H) and one-pass LayerNorm statistics (Chan's combination of per-head mean / M2). The loops' trip
    count is 0 for a tile past its sequence's end, so such programs do no work (the static kernel computes them on
    masked rows)."""
    total, hd = q.size()
    hd = hl.specialize(hd)
    nb, lkv, nh, d = k.size()
    lkv = hl.specialize(lkv)
    nh = hl.specialize(nh)
    d = hl.specialize(d)
    out = torch.empty_like(q)
    for tile_b, tile_m in hl.tile([nb, max_len], block_size=[1, None]):
        b = tile_b.begin
        start = q_offsets[b]
        length = q_offsets[b + 1] - start
        rows = start + tile_m.index
        mask = tile_m.index < length
        heads = torch.where(tile_m.begin < length, nh, 0)          # 0: the tile lies past the sequence's end
        mean = hl.zeros([tile_m], dtype=torch.float32)
        m2 = hl.zeros([tile_m], dtype=torch.float32)
        for h in hl.grid(heads):
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            mh = torch.sum(x, dim=-1) / d
            xc = x - mh[:, None]
            n_prev = h * d * 1.0
            frac = d / (n_prev + d)
            delta = mh - mean
            mean = mean + delta * frac
            m2 = m2 + torch.sum(xc * xc, dim=-1) + delta * delta * (n_prev * frac)
        rstd_ln = torch.rsqrt(m2 / hd + eps)
        ss = hl.zeros([tile_m], dtype=torch.float32)
        for h in hl.grid(heads):
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            ln = (x - mean[:, None]) * rstd_ln[:, None]
            kh = k[b, :, h, :]                                        # [Lkv, D]
            vh = v[b, :, h, :]
            s = hl.dot(ln.to(q.dtype), kh.T, out_dtype=torch.float32)  # [BLOCK_M, Lkv]
            u = 0.7978845608028654 * (s + 0.044715 * s * s * s)
            p = s / (1.0 + torch.exp(-2.0 * u))
            g = hl.dot(p.to(q.dtype), vh, out_dtype=torch.float32)   # [BLOCK_M, D]
            r = g + ln
            ss = ss + torch.sum(r * r, dim=-1)
            hl.store(out, [rows, h * d + hl.arange(d)], r.to(q.dtype), extra_mask=mask[:, None])
        rstd_rms = torch.rsqrt(ss / hd + eps)
        for h in hl.grid(heads):
            r = hl.load(out, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            x = hl.load(q, [rows, h * d + hl.arange(d)], extra_mask=mask[:, None]).to(torch.float32)
            hl.store(out, [rows, h * d + hl.arange(d)], (r * rstd_rms[:, None] + x).to(q.dtype),
                     extra_mask=mask[:, None])
    return out


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """``block_sizes = [BLOCK_M]`` (tokens per program: 16..128, power of two), ``num_warps`` (4 or 8),
    ``num_stages`` (1..4), ``head_loop`` ('static': ``hl.static_range``, unrolled; 'grid': ``hl.grid`` device
    loops, one-pass statistics, no work past a sequence's end)."""

    block_sizes: tuple = (64,)
    num_warps: int = 4
    num_stages: int = 1
    head_loop: str = "static"

    def __post_init__(self):
        if self.head_loop not in HEAD_LOOPS:
            raise ValueError(f"head_loop must be one of {HEAD_LOOPS}, got {self.head_loop!r}")
        if len(self.block_sizes) != 1 or self.block_sizes[0] not in (16, 32, 64, 128):
            raise ValueError(f"block_sizes must be [BLOCK_M] with BLOCK_M in 16, 32, 64, 128, got {self.block_sizes}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps must be 4 or 8, got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"num_stages must be in 1..4, got {self.num_stages}")

    def to_helion(self) -> helion.Config:
        return helion.Config(block_sizes=list(self.block_sizes), num_warps=self.num_warps,
                             num_stages=self.num_stages)


_COMPILED: dict = {}


def _kernel(cfg: TilingConfig):
    return _fna_gdpa_loop_kernel if cfg.head_loop == "grid" else _fna_gdpa_kernel


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_fna_gdpa_kernel.settings)


def _args(q, k, v, q_offsets, max_len, eps, config):
    """Validate; return the kernel's arguments and the TilingConfig. A batch of one token (total_q = 1) gets q
    padded with a zero row that no sequence reaches: Helion's code generation specializes a size-1 dimension and
    then fails to compile the ``[BLOCK_M, D]`` token gather (issue 15)."""
    check_forward_only("fna.gdpa", q=q, k=k, v=v)
    eps = check_eps(eps)
    cfg = TilingConfig.from_dict(config)
    total_q, B, H, D, Lkv = spec.check_inputs(q, k, v, q_offsets, max_len, eps)
    q2 = q.view(total_q, H * D)
    if total_q == 1:
        q2 = torch.cat([q2, q2.new_zeros(1, H * D)])
    return (q2, k, v, q_offsets, max_len, eps), cfg


def gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, max_len: int, *,
         eps: float = 1e-5, config=None) -> torch.Tensor:
    """FlashNormAttention forward: ``RMSNorm(gdpa(LayerNorm(q)) + LayerNorm(q)) + q`` (norms over H*D, no affine).

    ``q [total_q, H, D]`` jagged with ``q_offsets [B+1]`` (int32/int64; lengths in [0, max_len]), ``k, v
    [B, Lkv, H, D]``; bf16/fp16 (fp32 in ref mode); D, Lkv as ``normfuse.techniques.fna.check_inputs`` (powers of
    two; D 32..128, Lkv 16..128). Any B, any size (Helion picks 64-bit indexing when an input exceeds 2^31
    elements), any alignment (pointer loads). Returns ``out`` like q. Raises NotImplementedError when autograd
    would record through it (forward only), TypeError/ValueError for invalid inputs, ``eps`` (None included) or
    config (``normfuse.techniques.fna.check_inputs``, ``TilingConfig``), ValueError for CPU tensors outside ref
    mode."""
    args, cfg = _args(q, k, v, q_offsets, max_len, eps, config)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    if ref_mode():
        return _kernel(cfg)(*args)[:q.shape[0]].view(q.shape)
    if q.device.type != "cuda":
        raise ValueError("gdpa needs CUDA tensors; on CPU set HELION_INTERPRET=1 before importing helion (ref mode)")
    q2 = args[0]
    key = (tuple(q2.shape), tuple(k.shape), q.dtype, q_offsets.dtype, max_len, q.device, cfg)
    fn = _COMPILED.get(key)
    if fn is None:
        bound = _kernel(cfg).bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(cfg.to_helion())
        _COMPILED[key] = fn
    return fn(*args)[:q.shape[0]].view(q.shape)


def _bound(op, q, k, v, q_offsets, max_len, eps, config):
    if op not in FUNCTIONS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(FUNCTIONS)}")
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    args, cfg = _args(q, k, v, q_offsets, max_len, eps, config)
    return _kernel(cfg).bind(args), cfg.to_helion(), args


def _codegen_env(q):
    return _as_on_h200() if q.device.type == "cpu" else contextlib.nullcontext()


def triton_code(op: str, q, k, v, q_offsets, max_len, *, eps: float = 1e-5, config=None) -> str:
    """The Triton source Helion generates for ``op`` ('gdpa') at ``config`` (CPU tensors fine; nothing compiled)."""
    bound, hcfg, args = _bound(op, q, k, v, q_offsets, max_len, eps, config)
    with _live_args(bound, args), _codegen_env(q):
        return bound.to_triton_code(hcfg)


def compile_sm90(op: str, q, k, v, q_offsets, max_len, *, eps: float = 1e-5, config=None) -> dict:
    """Compile ``op`` ('gdpa') for sm_90 without launching (``normfuse.compile_only.install(90)`` must have run);
    return ``normfuse.compile_only.summarize`` (PTX markers: wgmma, ...). RuntimeError in ref mode."""
    from normfuse.compile_only import WarmupLauncher, summarize

    bound, hcfg, args = _bound(op, q, k, v, q_offsets, max_len, eps, config)
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(q):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError("gdpa: Helion's host code did not launch a kernel; nothing was compiled")
    return summarize(launcher.last)
