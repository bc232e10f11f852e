r"""QK-RMSNorm attention with autograd: the fused FlashNormAttention-LLM forward kernel, a backward made of our
Triton norm kernels and PyTorch's attention backward, a ``torch.library`` custom op, and the ``nn.Module`` drop-in
``QKNormAttention``.

Forward (``kernels_<dsl>/fna_llm.qknorm_attention``, spec ``normfuse.techniques.fna_llm``; Qwen3 / OLMo2 style)::

    qn = rmsnorm(q) * q_weight,  kn = rmsnorm(k) * k_weight          (per head, over head_dim D)
    o  = softmax(qn kn^T / sqrt(D) [causal]) v                         (GQA: Hq a multiple of Hkv)
    [o = rmsnorm(o) * o_weight]                                        (optional output norm)

one attention kernel (preceded by the K pre-pass of its ``K_NORM`` mode); the normalized q and k never reach memory.

Backward. The fused forward keeps no softmax statistics (no log-sum-exp output), so the attention part is
recomputed::

    qn, rstd_q = rms_norm(q, q_weight);  kn, rstd_k = rms_norm(k, k_weight)     our Triton forward kernel
    o_pre = sdpa(qn, kn, v)  +  its autograd backward                          PyTorch (flash / efficient / math
                                                                                backend; on the H200 the flash one)
    [do_pre, do_weight = rms_norm_bwd(do, o_pre, rstd_o, o_weight)]            our Triton backward kernel
    dq, dq_weight = rms_norm_bwd(dqn, q, rstd_q, q_weight); same for k          our Triton backward kernel

The price of the recompute is one attention forward in the backward (what FlashAttention's own backward avoids by
saving the log-sum-exp); our kernels are the norm forwards and backwards. Source: PyTorch blog "Towards Free
Normalization" (FlashNormAttention), https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
FlashAttention-2, https://arxiv.org/abs/2307.08691 .
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normfuse.nn import norm_ops
from normfuse.nn._common import check_dsl, check_eps, config_from_json, config_json, dense, kernel_module

__all__ = ["qknorm_attention", "reference", "QKNormAttention"]


@torch.library.custom_op("normfuse::qknorm_attention", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
        o_weight: torch.Tensor | None, causal: bool, eps: float, dsl: str, config: str) -> torch.Tensor:
    mod = kernel_module(dsl, "fna_llm")
    return mod.qknorm_attention(dense(q), dense(k), dense(v), q_weight, k_weight, causal=causal,
                                eps=eps, o_weight=o_weight, config=config_from_json(config))


@_op.register_fake
def _(q, k, v, q_weight, k_weight, o_weight, causal, eps, dsl, config):
    return torch.empty_like(q)


def _sdpa_bwd(qn, kn, v, do, o_weight, causal: bool, eps: float):
    """``(dqn, dkn, dv, do_weight)`` of ``[rmsnorm(.) * o_weight](sdpa(qn, kn, v))`` for the cotangent ``do``:
    PyTorch's attention forward recomputed under autograd (so that ``torch.compile`` traces it into the backward
    graph), our Triton RMSNorm kernels for the optional output norm, PyTorch's attention backward."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (qn, kn, v)]
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=qn.shape[1] != kn.shape[1])
    dow = None
    if o_weight is not None:
        D = o.shape[-1]
        o_pre = o.detach().contiguous().view(-1, D)
        _, rstd_o = norm_ops.rms_norm(o_pre, None, eps)
        do, dow = norm_ops.rms_norm_bwd(do.contiguous().view(-1, D), o_pre, rstd_o, o_weight, False)
        do = do.view(o.shape)
    dqn, dkn, dv = torch.autograd.grad(o, leaves, do)
    return dqn, dkn, dv, dow


def _setup(ctx, inputs, output):
    q, k, v, qw, kw, ow, causal, eps, _, _ = inputs
    ctx.save_for_backward(q, k, v, qw, kw, ow)
    ctx.causal, ctx.eps = causal, eps


def _backward(ctx, do):
    q, k, v, qw, kw, ow = ctx.saved_tensors
    D = q.shape[-1]
    q2, k2 = q.contiguous().view(-1, D), k.contiguous().view(-1, D)
    qn, rstd_q = norm_ops.rms_norm(q2, qw, ctx.eps)
    kn, rstd_k = norm_ops.rms_norm(k2, kw, ctx.eps)
    dqn, dkn, dv, dow = _sdpa_bwd(qn.view(q.shape), kn.view(k.shape), v, do.contiguous(), ow, ctx.causal, ctx.eps)
    dq, dqw = norm_ops.rms_norm_bwd(dqn.contiguous().view(-1, D), q2, rstd_q, qw, False)
    dk, dkw = norm_ops.rms_norm_bwd(dkn.contiguous().view(-1, D), k2, rstd_k, kw, False)
    return (dq.view(q.shape), dk.view(k.shape), dv, dqw, dkw, dow,
            None, None, None, None)


_op.register_autograd(_backward, setup_context=_setup)


def qknorm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, *, causal: bool, eps: float = 1e-6, o_weight: torch.Tensor | None = None,
                     dsl: str = "triton", config=None) -> torch.Tensor:
    """``softmax(rmsnorm(q) q_weight (rmsnorm(k) k_weight)^T / sqrt(D) [causal]) v`` [then ``rmsnorm(.) o_weight``]
    through one fused attention kernel, with autograd (module docstring).

    ``q [B, Hq, S, D]``, ``k, v [B, Hkv, S, D]`` (Hq a multiple of Hkv; D a power of 2 in [16, 256]), weights
    ``[D]``, one dtype (bf16 on the GPU; fp16/fp32 and the CPU only under the interpreters). Returns ``o [B, Hq,
    S, D]``. ``dsl``: "triton", "helion" or "tlx"; ``config``: that kernel's tiling (``K_NORM`` etc.). Raises
    TypeError / ValueError for bad inputs (``normfuse.techniques.fna_llm.check_inputs``), eps, dsl or config;
    RuntimeError for an unavailable dsl."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return _op(q, k, v, q_weight, k_weight, o_weight, causal, check_eps(eps), check_dsl(dsl), config_json(config))


def reference(q, k, v, q_weight, k_weight, *, causal: bool, eps: float = 1e-6, o_weight=None) -> torch.Tensor:
    """Unfused PyTorch: ``F.rms_norm`` per head, ``F.scaled_dot_product_attention`` (GQA), optional output norm."""
    D = q.shape[-1]
    qn = F.rms_norm(q, (D,), q_weight, eps)
    kn = F.rms_norm(k, (D,), k_weight, eps)
    o = F.scaled_dot_product_attention(qn, kn, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return o if o_weight is None else F.rms_norm(o, (D,), o_weight, eps)


class QKNormAttention(nn.Module):
    """Drop-in for per-head ``q_norm`` / ``k_norm`` (``nn.RMSNorm(head_dim)``, Qwen3 / OLMo2 style) followed by
    ``F.scaled_dot_product_attention``: ``forward(q [B, Hq, S, D], k, v [B, Hkv, S, D]) -> o [B, Hq, S, D]`` through
    ``qknorm_attention``. Parameters ``q_weight``, ``k_weight`` ``[head_dim]`` (ones) and, with ``o_norm=True``,
    ``o_weight``."""

    def __init__(self, head_dim: int, eps: float = 1e-6, *, causal: bool = True, o_norm: bool = False,
                 dsl: str = "triton", config=None, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.head_dim, self.causal = head_dim, causal
        self.eps, self.dsl, self.config = check_eps(eps), check_dsl(dsl), config_json(config)
        self.q_weight = nn.Parameter(torch.ones(head_dim, **kw))
        self.k_weight = nn.Parameter(torch.ones(head_dim, **kw))
        self.o_weight = nn.Parameter(torch.ones(head_dim, **kw)) if o_norm else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _op(q, k, v, self.q_weight, self.k_weight, self.o_weight, self.causal, self.eps, self.dsl,
                   self.config)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, eps={self.eps}, causal={self.causal}, dsl={self.dsl}"

