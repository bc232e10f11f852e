r"""FlashNormAttention, LLM variant, in Helion (1.5, Hopper sm_90): per-head RMSNorm of Q and K (learned γ, Qwen3 /
OLMo2 style) fused into a FlashAttention-2 forward (online softmax in fp32, causal or not, GQA), with an optional
per-head RMSNorm of the output. Math and cost model: ``normfuse/techniques/fna_llm.py``.

Written with **2-D tiles** (dsl-primer §B.8): the grid is ``hl.tile([B*Hq, S], block_size=[1, BLOCK_M])`` and the
(batch x head) index is the scalar ``tile_b.begin``, so every load is a 2-D ``[tile, D]`` block and both GEMMs are
``hl.dot`` on 2-D operands. (Helion's own ``examples/attention.py`` style with 3-D tiles and ``torch.bmm`` fails
to compile for sm_90, dsl-primer blocker 4.)

Three ways to normalize K (``TilingConfig.K_NORM``), all inside the public (timed) ``qknorm_attention`` call:

* ``"prepass"`` (default), the algebraic form
  ``<rmsnorm(q_i)·γq, rmsnorm(k_j)·γk> = rstd_q,i · rstd_k,j · Σ_d (q_i,d γq_d γk_d) k_j,d``: a second Helion
  kernel (``_k_rstd_kernel``, ``RSTD_CONFIG``) reads K once and writes ``rstd_k = rsqrt(mean_d(k²) + eps)`` in
  fp32, ``[B*Hkv, S]`` (not a normalized copy of K); the attention kernel folds ``γk`` into the Q normalization,
  feeds the *raw* K tile to ``hl.dot`` and scales the score columns by ``rstd_k[n] · log2(e)/sqrt(D)`` (a
  separate ``[BLOCK_N]`` fp32 load per K tile) before the masks and the online softmax. No loaded tile feeds
  both a dot and a reduction (dsl-primer §0 blocker 1, which Helion's generated code can hit, cannot apply);
* ``"inloop"`` (the previous code path): K tiles normalized in fp32 as they stream through the KV loop (once per
  K/V tile load, by every Q tile), rounded, fed to ``hl.dot``;
* ``"materialize"``: no K work at all in the KV loop. A pre-pass kernel (``_k_norm_kernel``, ``KNORM_CONFIG``)
  reads K once and writes the normalized copy ``k_n = (k · rsqrt(mean_d(k²) + eps) · γk).to(k.dtype)``,
  ``[B, Hkv, S, D]`` (fp32 statistics; a scratch tensor allocated per call like the rstd_k buffer), and the
  attention kernel runs the plain ``attention`` KV loop on ``k_n`` (raw tile into ``hl.dot``, no rstd load, no
  column scale, the same ``log2(e)/sqrt(D)`` scale) after normalizing only the Q tile (with ``γq`` alone). It is
  the combination ``norm_qk`` with neither ``k_inloop`` nor ``k_prepass`` of the kernel's constexpr flags, with
  ``k_n`` passed as K. Cost: one extra write + read of K, ``2·B·Hkv·S·D·2`` bytes in bf16, which an inference
  engine pays anyway when it writes the normed K into its KV cache (and then every later decode/prefill step
  reads the normalized K directly).

``attention`` (no norms) ignores ``K_NORM``.

* Q tile: loaded once, normalized in fp32 (``rsqrt(mean(q²) + eps) * q_weight``, times ``k_weight`` for
  prepass only), rounded to the input dtype; scores scaled by ``log2(e)/sqrt(D)`` in fp32, softmax in base 2;
* causal: the KV loop is ``hl.tile(0, tile_m.end)`` (Helion clamps ``tile_m.end`` to S; blocks above the
  diagonal are never visited) and
  the diagonal block is masked with ``torch.where``; keys past S are masked likewise;
* epilogue: ``acc / l``, optional output RMSNorm, store.

What Helion could express: the prepass and materialize forms (two ``helion.kernel`` s launched from one Python
function; a column scale of a 2-D ``hl.dot`` result; a row-normalizing pre-pass that writes a ``[rows, D]`` tile).
What it could not: the split of the KV loop into an unmasked part and a masked diagonal part (FlashAttention's
two stages; the mask is applied on every block, a few % of ALU work); warp specialization / ping-pong scheduling
of the two softmax halves (Helion generates plain Triton); a normalized K tile shared by the Q tiles of one
launch (hence the pre-pass, one extra read of K: ~0.1-1% of the attention time at the benchmark shapes); TMA
loads of the K/V tiles (with ``indexing="tensor_descriptor"`` Helion 1.5 turns only the Q load into a TMA load,
the loads of the KV loop, bounded by the Q tile, stay pointer loads; so the configs use pointer indexing).

Numerics: fp32 statistics (rstd_q, rstd_k), softmax state and accumulator (materialize: ``k_n`` rounded to the
input dtype before the dot, exactly as inloop rounds its normalized K tile); one program per (batch x head, Q tile),
one rstd_k per K row, masked key columns get ``-inf`` and their V rows are zeroed, so a NaN/Inf in one batch
element cannot reach another.

Execution modes: GPU (``BoundKernel.compile_config`` of the ``TilingConfig``, cached per shape); CPU ref mode
(``HELION_INTERPRET=1`` before ``import helion``: eager PyTorch, tiling validated and ignored, ``K_NORM`` still
selects the code path); ``compile_sm90``
(CPU tensors, fake sm_90 driver, never launches); ``triton_code``.

Sources: FlashAttention-2 (https://arxiv.org/abs/2307.08691); Helion's attention example,
https://github.com/pytorch/helion/tree/main/examples ; the PyTorch blog "Towards Free Normalization: Fusing
Normalization into GEMM and Attention Kernels" (FlashNormAttention; and its Lazy Pre-Norm, the per-row rstd
factored out of a GEMM and applied to its output, applied here to the columns of QKᵀ),
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
FlashNorm (deferred RMS normalization, γ folded into the other operand), https://arxiv.org/abs/2407.09577 .
Code written for this repo.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import normfuse.helion_compat  # noqa: F401  (must precede `import helion`)
import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from kernels_helion.lazy_prenorm import _as_on_h200, _live_args
from normfuse.scratch import scratch_like
from normfuse.techniques.fna_llm import check_inputs
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

OPS = ("qknorm_attention", "attention")
LOG2E = 1.4426950408889634
K_NORM_MODES = ("prepass", "inloop", "materialize")


@helion.kernel(static_shapes=True, autotune_effort="none")
def _k_rstd_kernel(k2: torch.Tensor, rstd: torch.Tensor, eps: float) -> None:
    """Pre-pass: ``rstd[r] = rsqrt(mean_d(k2[r, d]²) + eps)`` in fp32 for the rows ``r`` of ``k2 [B*Hkv*S, D]``."""
    d = hl.specialize(k2.size(1))
    for tile_r in hl.tile(k2.size(0)):
        x = k2[tile_r, :].to(torch.float32)
        rstd[tile_r] = torch.rsqrt(torch.sum(x * x, dim=-1) / d + eps)


@helion.kernel(static_shapes=True, autotune_effort="none")
def _k_norm_kernel(k2: torch.Tensor, k_weight: torch.Tensor, k_n: torch.Tensor, eps: float) -> None:
    """Pre-pass of K_NORM = "materialize": ``k_n[r, :] = (k2[r, :] · rsqrt(mean_d(k2[r, d]²) + eps) · k_weight)``
    rounded to ``k_n``'s dtype, for the rows ``r`` of ``k2 [B*Hkv*S, D]`` (statistics and products in fp32)."""
    d = hl.specialize(k2.size(1))
    for tile_r in hl.tile(k2.size(0)):
        x = k2[tile_r, :].to(torch.float32)
        rstd = torch.rsqrt(torch.sum(x * x, dim=-1, keepdim=True) / d + eps)
        k_n[tile_r, :] = (x * rstd * k_weight[None, :].to(torch.float32)).to(k_n.dtype)


@helion.kernel(static_shapes=True, autotune_effort="none", dot_precision="ieee")
def _fna_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor | None,
                k_weight: torch.Tensor | None, o_weight: torch.Tensor | None, k_rstd: torch.Tensor | None,
                eps: float, causal: hl.constexpr, norm_qk: hl.constexpr, k_inloop: hl.constexpr,
                k_prepass: hl.constexpr) -> torch.Tensor:
    bh_dim = q.size(0) * q.size(1)
    hq = hl.specialize(q.size(1))
    group = hl.specialize(q.size(1) // k.size(1))
    m_dim = q.size(2)
    d = hl.specialize(q.size(3))
    qv = q.reshape([-1, m_dim, d])
    kv = k.reshape([-1, m_dim, d])
    vv = v.reshape([-1, m_dim, d])
    out = torch.empty_like(qv)
    qk_scale = LOG2E / math.sqrt(d)
    for tile_b, tile_m in hl.tile([bh_dim, m_dim], block_size=[1, None]):
        b = tile_b.begin
        bkv = (b // hq) * (hq // group) + (b % hq) // group
        qt = qv[b, tile_m, :].to(torch.float32)
        if norm_qk:
            gamma = q_weight[None, :].to(torch.float32)
            if k_prepass:  # γk folded into Q: q_n·k_n = rstd_k · Σ_d (q_n,d γk_d) k_d
                gamma = gamma * k_weight[None, :].to(torch.float32)
            qt = qt * torch.rsqrt(torch.mean(qt * qt, dim=-1, keepdim=True) + eps) * gamma
        qt = qt.to(qv.dtype)
        m_i = hl.full([tile_m], float("-inf"), dtype=torch.float32)
        l_i = hl.zeros([tile_m], dtype=torch.float32)
        acc = hl.zeros([tile_m, d], dtype=torch.float32)
        hi = m_dim
        if causal:
            hi = tile_m.end
        for tile_n in hl.tile(0, hi):
            valid_n = tile_n.index < m_dim
            kt = kv[bkv, tile_n, :]
            if k_inloop:  # once per K/V tile load
                kf = kt.to(torch.float32)
                kt = (kf * torch.rsqrt(torch.mean(kf * kf, dim=-1, keepdim=True) + eps)
                      * k_weight[None, :].to(torch.float32)).to(kv.dtype)
            # k_prepass: the raw K tile feeds only the dot; materialize (neither flag): kv is k_n, as in attention
            s = hl.dot(qt, kt.T, out_dtype=torch.float32)
            if k_prepass:  # column scale rstd_k[n] (fp32, a separate [BLOCK_N] load) · log2(e)/sqrt(D)
                s = s * (k_rstd[bkv, tile_n] * qk_scale)[None, :]
            else:
                s = s * qk_scale
            if causal:
                s = torch.where((tile_n.index[None, :] <= tile_m.index[:, None]) & valid_n[None, :], s,
                                float("-inf"))
            else:
                s = torch.where(valid_n[None, :], s, float("-inf"))
            m_ij = torch.maximum(m_i, torch.amax(s, -1))
            p = torch.exp2(s - m_ij[:, None])
            alpha = torch.exp2(m_i - m_ij)
            l_i = l_i * alpha + torch.sum(p, -1)
            vt = torch.where(valid_n[:, None], vv[bkv, tile_n, :], 0.0)
            acc = hl.dot(p.to(vv.dtype), vt, acc=acc * alpha[:, None])
            m_i = m_ij
        o = acc / l_i[:, None]
        if o_weight is not None:
            o = o * torch.rsqrt(torch.mean(o * o, dim=-1, keepdim=True) + eps) * o_weight[None, :].to(torch.float32)
        out[b, tile_m, :] = o.to(out.dtype)
    return out.view(q.size())


def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """``block_sizes`` ``(BLOCK_M, BLOCK_N)`` (powers of two in [16, 256]), ``num_warps`` (power of two, 1..16),
    ``num_stages`` (1..6), ``K_NORM`` (``"prepass"``: a pre-pass kernel computes ``rstd_k`` and the KV loop scales
    the score columns; ``"inloop"``: every K tile is normalized in the KV loop; ``"materialize"``: a pre-pass kernel
    writes the normalized K copy ``k_n`` and the KV loop is the plain attention loop; ignored by ``attention``).
    Raises ValueError naming the violated constraint."""

    block_sizes: tuple = (128, 64)
    num_warps: int = 8
    num_stages: int = 3
    K_NORM: str = "prepass"

    def __post_init__(self):
        bs = self.block_sizes
        if isinstance(bs, (str, bytes)) or not isinstance(bs, (tuple, list)) or len(bs) != 2:
            raise ValueError(f"block_sizes must be (BLOCK_M, BLOCK_N), got {bs!r}")
        if not all(_is_pow2(x) and 16 <= x <= 256 for x in bs):
            raise ValueError(f"block_sizes entries must be powers of two in [16, 256], got {bs!r}")
        object.__setattr__(self, "block_sizes", tuple(bs))
        if not (_is_pow2(self.num_warps) and self.num_warps <= 16):
            raise ValueError(f"num_warps must be a power of two in [1, 16], got {self.num_warps!r}")
        if not (isinstance(self.num_stages, int) and 1 <= self.num_stages <= 6):
            raise ValueError(f"num_stages must be an integer in [1, 6], got {self.num_stages!r}")
        if self.K_NORM not in K_NORM_MODES:
            raise ValueError(f"K_NORM must be one of {', '.join(K_NORM_MODES)}, got {self.K_NORM!r}")

    def to_helion(self) -> helion.Config:
        """Helion block ids: [batch x head (fixed 1), BLOCK_M, BLOCK_N]."""
        bm, bn = self.block_sizes
        return helion.Config(block_sizes=[bm, bn], num_warps=self.num_warps, num_stages=self.num_stages)


_COMPILED: dict = {}
# the rstd_k pre-pass: 32 K rows x D per program (D = 128 bf16: 8 KB), a memory-bound row reduction
RSTD_CONFIG = helion.Config(block_sizes=[32], num_warps=4, num_stages=1)
# the k_n pre-pass (materialize): the same 32 K rows x D per program, read 8 KB + write 8 KB (bf16, D = 128)
KNORM_CONFIG = helion.Config(block_sizes=[32], num_warps=4, num_stages=1)


@dataclass(frozen=True)
class _PrePass:
    """A K pre-pass launch: ``name`` (``"k_rstd"`` or ``"k_norm"``), the Helion kernel, its arguments, its config."""

    name: str
    kernel: object
    args: tuple
    config: helion.Config


def ref_mode() -> bool:
    """True when Helion runs kernels as eager PyTorch (``HELION_INTERPRET=1`` set before ``import helion``)."""
    return is_ref_mode_enabled(_fna_kernel.settings)


def _args(q, k, v, q_weight, k_weight, o_weight, causal, eps, norms: bool,
          config) -> tuple[tuple, TilingConfig, _PrePass | None]:
    """Validate; return (the ``_fna_kernel`` arguments, the TilingConfig, the K pre-pass or None). With ``norms``:
    ``K_NORM = "prepass"``: ``k_rstd`` (argument 6) is a ``[B*Hkv, S]`` fp32 buffer written by ``_k_rstd_kernel``;
    ``"materialize"``: argument 1 is a ``[B, Hkv, S, D]`` scratch ``k_n`` written by ``_k_norm_kernel`` from k
    and k_weight, and the attention kernel gets ``k_weight = None``; ``"inloop"``: no pre-pass. ``attention``
    ignores K_NORM (no norms, no pre-pass). Raises NotImplementedError when autograd would record through the op
    (forward only), ValueError for ``eps`` (None included) not a finite number > 0."""
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
    if not norms:
        q_weight = k_weight = o_weight = None
    mode = cfg.K_NORM if norms else None
    k_rstd, pre = None, None
    if mode == "prepass":
        k_rstd = scratch_like(k, (B * Hkv, S), torch.float32)
        pre = _PrePass("k_rstd", _k_rstd_kernel, (k.view(-1, D), k_rstd.view(-1), float(eps)), RSTD_CONFIG)
    elif mode == "materialize":
        k_n = scratch_like(k)
        pre = _PrePass("k_norm", _k_norm_kernel, (k.view(-1, D), k_weight, k_n.view(-1, D), float(eps)),
                       KNORM_CONFIG)
        k, k_weight = k_n, None  # the attention kernel streams k_n like plain attention streams k
    return (q, k, v, q_weight, k_weight, o_weight, k_rstd, float(eps), causal, norms, mode == "inloop",
            mode == "prepass"), cfg, pre


def _compiled(kernel, args: tuple, key: tuple, hcfg: helion.Config):
    fn = _COMPILED.get(key)
    if fn is None:
        bound = kernel.bind(args)
        with _live_args(bound, args):
            fn = bound.compile_config(hcfg)
        _COMPILED[key] = fn
    return fn


def _run(args: tuple, cfg: TilingConfig, pre: _PrePass | None):
    if ref_mode():
        if pre is not None:
            pre.kernel(*pre.args)
        return _fna_kernel(*args)
    q, k = args[0], args[1]
    if q.device.type != "cuda":
        raise ValueError(f"needs CUDA tensors (got {q.device}); on CPU set HELION_INTERPRET=1 before importing "
                         "helion (ref mode), or use compile_sm90")
    if pre is not None:  # rstd_k / k_n first (same stream, so ordered before the attention); part of the timed call
        _compiled(pre.kernel, pre.args, (pre.name, tuple(k.shape), k.dtype, k.device), pre.config)(*pre.args)
    key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device, args[5] is not None, args[8:], cfg)
    return _compiled(_fna_kernel, args, key, cfg.to_helion())(*args)


def qknorm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, *, causal: bool, eps: float = 1e-6, o_weight=None,
                     config=None) -> torch.Tensor:
    """``softmax(RMSNorm(q)·γq (RMSNorm(k)·γk)ᵀ / sqrt(D) [causal]) v`` [then RMSNorm(·)·γo]: one attention
    kernel, preceded (same stream, both launches inside this call) by a K pre-pass kernel depending on ``K_NORM``:
    ``"prepass"``: ``rstd_k`` (fp32 ``[B*Hkv, S]`` scratch); ``"materialize"``: the normalized K copy
    ``k_n = (k·rsqrt(mean(k²) + eps)·γk).to(k.dtype)`` (``[B, Hkv, S, D]`` scratch, fp32 statistics; one extra
    write + read of K, ``2·B·Hkv·S·D·itemsize`` bytes, what an inference engine pays anyway when it stores the
    normed K in its KV cache), after which the attention kernel's KV loop is that of ``attention``;
    ``"inloop"``: none (K tiles normalized in the KV loop).

    q ``[B, Hq, S, D]``, k, v ``[B, Hkv, S, D]`` (Hq a multiple of Hkv), weights ``[D]``, one dtype (bf16 on the
    GPU), contiguous, CUDA (CPU in ref mode); any B·Hq, any size (Helion picks 64-bit indexing past 2^31
    elements), any alignment (pointer loads). Returns o ``[B, Hq, S, D]`` in q's dtype. Raises
    NotImplementedError when autograd would record through it (forward only), TypeError / ValueError for bad
    inputs (``normfuse.techniques.fna_llm.check_inputs``), ``eps`` (None included) or config (e.g. ``K_NORM`` not
    prepass / inloop / materialize), ValueError for CPU tensors outside ref mode.
    """
    return _run(*_args(q, k, v, q_weight, k_weight, o_weight, causal, eps, True, config))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, config=None) -> torch.Tensor:
    """The same kernel without norms: ``softmax(q kᵀ / sqrt(D) [causal]) v`` (as ``qknorm_attention``; ``K_NORM``
    is validated and ignored)."""
    return _run(*_args(q, k, v, None, None, None, causal, 1e-6, False, config))


def _bound(op, q, k, v, q_weight, k_weight, eps, config, causal, o_norm):
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}")
    norms = op == "qknorm_attention"
    D = q.shape[-1]
    if norms:
        q_weight = q_weight if q_weight is not None else torch.empty(D, dtype=q.dtype)
        k_weight = k_weight if k_weight is not None else torch.empty(D, dtype=q.dtype)
    ow = torch.empty(D, dtype=q.dtype) if (o_norm and norms) else None
    args, cfg, pre = _args(q, k, v, q_weight, k_weight, ow, causal, eps, norms, config)
    if ref_mode():
        raise RuntimeError("code generation is unavailable in Helion ref mode (unset HELION_INTERPRET)")
    return _fna_kernel.bind(args), cfg.to_helion(), args, pre


def _codegen_env(q):
    return _as_on_h200() if q.device.type == "cpu" else contextlib.nullcontext()


def triton_code(op: str, q, k, v, q_weight=None, k_weight=None, *, eps: float = 1e-6, config=None,
                causal: bool = True, o_norm: bool = False, prepass: bool = False) -> str:
    """The Triton source Helion generates for ``op`` at ``config`` (CPU tensors are fine): the attention kernel,
    or with ``prepass=True`` the K pre-pass kernel of 'qknorm_attention' with ``K_NORM`` prepass / materialize
    (ValueError when there is none)."""
    bound, hcfg, args, pre = _bound(op, q, k, v, q_weight, k_weight, eps, config, causal, o_norm)
    if prepass:
        if pre is None:
            raise ValueError(f"{op} with K_NORM = {TilingConfig.from_dict(config).K_NORM!r} has no K pre-pass")
        bound, hcfg, args = pre.kernel.bind(pre.args), pre.config, pre.args
    with _live_args(bound, args), _codegen_env(q):
        return bound.to_triton_code(hcfg)


def compile_sm90(op: str, q, k, v, q_weight=None, k_weight=None, *, eps: float = 1e-6, config=None,
                 causal: bool = True, o_norm: bool = False) -> dict:
    """Compile ``op`` for sm_90 without launching (needs ``normfuse.compile_only.install(90)``; CPU tensors, never
    read); returns ``normfuse.compile_only.summarize`` of the attention kernel, plus the K pre-pass's summary for
    'qknorm_attention' under ``k_rstd`` (``K_NORM = "prepass"``) or ``k_norm`` (``"materialize"``). RuntimeError in
    ref mode."""
    from normfuse.compile_only import WarmupLauncher, summarize

    bound, hcfg, args, pre = _bound(op, q, k, v, q_weight, k_weight, eps, config, causal, o_norm)
    launcher = WarmupLauncher()
    with _live_args(bound, args), _codegen_env(q):
        bound.compile_config(hcfg)(*args, _launcher=launcher)
    if launcher.last is None:
        raise RuntimeError(f"{op}: Helion's host code did not launch a kernel; nothing was compiled")
    out = summarize(launcher.last)
    if pre is not None:  # K_NORM = "prepass" / "materialize": the K pre-pass too
        bound = pre.kernel.bind(pre.args)
        launcher = WarmupLauncher()
        with _live_args(bound, pre.args), _codegen_env(q):
            bound.compile_config(pre.config)(*pre.args, _launcher=launcher)
        if launcher.last is None:
            raise RuntimeError(f"{pre.name}: Helion's host code did not launch a kernel; nothing was compiled")
        out[pre.name] = summarize(launcher.last)
    return out


if __name__ == "__main__":  # GPU self-check: every shipped config at a few odd shapes
    from normfuse.gpu_checks import check_all

    fails = check_all("helion", "fna_llm")
    print("\n".join(fails) or "fna_llm helion: all shipped configs correct")
