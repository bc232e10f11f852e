r"""The blog's FlashNormAttention module (``gdpa``) with autograd: the fused forward kernel, a backward made of our
Triton norm kernels and PyTorch matmuls, a ``torch.library`` custom op and the ``nn.Module`` drop-in
``FlashNormAttention``.

Forward (``kernels_<dsl>/fna.gdpa``, spec ``normfuse.techniques.fna``; norms over all H*D features of a token,
no affine, jagged Q)::

    ln = LayerNorm(q);  g = gelu_tanh(ln k^T) v;  r = g + ln;  out = RMSNorm(r) + q

Backward (nothing but ``out`` leaves the fused forward, so the cheap parts are recomputed)::

    ln, mean, rstd_ln = layer_norm(q)                          our Triton forward kernel (kernels_triton/norms.py)
    g = gelu_tanh(ln k^T) v  (+ autograd)                      PyTorch matmuls on a zero-padded [B, H, L, D] batch,
                                                               ``normfuse.techniques.fna._gdpa_padded`` (cuBLAS)
    _, rstd_r = rms_norm(r),  dr = rms_norm_bwd(dout, r, rstd_r)              our Triton kernels
    dln = dr + (d g / d ln)^T dr;  dk, dv = (d g / d k, v)^T dr                PyTorch autograd of the padded GEMMs
    dq = dout + layer_norm_bwd(dln, q, mean, rstd_ln)                          our Triton kernel

The padded batch costs what the torch.compile baseline's GDPA costs (``REF_CHUNK`` sequences at a time bound the
memory). Source: PyTorch blog "Towards Free Normalization" (FlashNormAttention / Kunlun PFFN),
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ .
"""

from __future__ import annotations

import torch
from torch import nn

from normfuse.nn import norm_ops
from normfuse.nn._common import check_dsl, check_eps, config_from_json, config_json, dense, kernel_module

__all__ = ["gdpa", "reference", "FlashNormAttention", "token_positions"]


@torch.library.custom_op("normfuse::gdpa", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, max_len: int, eps: float,
        dsl: str, config: str) -> torch.Tensor:
    mod = kernel_module(dsl, "fna")
    return mod.gdpa(dense(q), dense(k), dense(v), dense(q_offsets), max_len, eps=eps,
                    config=config_from_json(config))


@_op.register_fake
def _(q, k, v, q_offsets, max_len, eps, dsl, config):
    return torch.empty_like(q)


def token_positions(q_offsets: torch.Tensor, total_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(seq_ids, positions)``, int64 ``[total_q]``: the sequence and the position of every packed token, computed
    on the offsets' device without a host synchronization (the output size is given)."""
    off = q_offsets.long()
    lengths = off[1:] - off[:-1]
    seq_ids = torch.repeat_interleave(torch.arange(lengths.shape[0], device=off.device), lengths,
                                      output_size=total_q)
    return seq_ids, torch.arange(total_q, device=off.device) - off[seq_ids]


def _setup(ctx, inputs, output):
    q, k, v, q_offsets, max_len, eps, _, _ = inputs
    ctx.save_for_backward(q, k, v, q_offsets)
    ctx.max_len, ctx.eps = max_len, eps


def _backward(ctx, dout):
    from normfuse.techniques.fna import REF_CHUNK, _gdpa_padded

    q, k, v, q_offsets = ctx.saved_tensors
    T, H, D = q.shape
    x = q.contiguous().view(T, H * D)
    dout = dout.contiguous().view(T, H * D)
    ln, mean, rstd_ln = norm_ops.layer_norm(x, None, None, ctx.eps)
    seq_ids, positions = token_positions(q_offsets, T)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (ln.view(T, H, D), k, v)]
        g = _gdpa_padded(*leaves, seq_ids, positions, ctx.max_len, chunk=REF_CHUNK)
    r = (g.detach().view(T, H * D) + ln).contiguous()
    _, rstd_r = norm_ops.rms_norm(r, None, ctx.eps)
    dr, _ = norm_ops.rms_norm_bwd(dout, r, rstd_r, None, False)
    dln_g, dk, dv = torch.autograd.grad(g, leaves, dr.view(T, H, D))
    dln = (dln_g.reshape(T, H * D) + dr).contiguous()
    dx, _, _ = norm_ops.layer_norm_bwd(dln, x, mean, rstd_ln, None, False, False)
    return (dx + dout).view(T, H, D), dk, dv, None, None, None, None, None


_op.register_autograd(_backward, setup_context=_setup)


def gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, max_len: int, *,
         eps: float = 1e-5, dsl: str = "triton", config=None) -> torch.Tensor:
    """``RMSNorm(gelu_tanh(LN(q) k^T) v + LN(q)) + q`` (norms over H*D, no affine) in one fused kernel, with autograd
    for ``q``, ``k`` and ``v`` (module docstring).

    ``q [total_q, H, D]`` packed (jagged), ``k, v [B, Lkv, H, D]``, ``q_offsets [B+1]`` int32/int64, ``max_len``
    >= every sequence length, one float dtype (bf16 on the GPU; fp16/fp32 and the CPU only under the
    interpreters); constraints of ``normfuse.techniques.fna.check_inputs`` (2 <= H <= 8, D and Lkv multiples of 16
    in [16, 256]). Returns ``[total_q, H, D]``. ``dsl``: "triton", "helion" or "tlx"; ``config``: that kernel's
    tiling. Raises TypeError / ValueError for bad inputs, eps, dsl or config; RuntimeError for an unavailable dsl."""
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    return _op(q, k, v, q_offsets, max_len, check_eps(eps), check_dsl(dsl), config_json(config))


def reference(q, k, v, q_offsets, max_len: int, *, eps: float = 1e-5) -> torch.Tensor:
    """The module in PyTorch (``normfuse.techniques.fna.module``, padded GDPA), differentiable."""
    from normfuse.techniques.fna import REF_CHUNK, module

    seq_ids, positions = token_positions(q_offsets, q.shape[0])
    return module(q, k, v, seq_ids, positions, max_len, eps, chunk=REF_CHUNK)


class FlashNormAttention(nn.Module):
    """Drop-in for the blog's PFFN block ``RMSNorm(gdpa(LN(q)) + LN(q)) + q`` (no parameters: the norms have no
    affine, as in the blog): ``forward(q [total_q, H, D], k, v [B, Lkv, H, D], q_offsets [B+1], max_len) ->
    [total_q, H, D]`` through ``gdpa``."""

    def __init__(self, eps: float = 1e-5, *, dsl: str = "triton", config=None):
        super().__init__()
        self.eps, self.dsl, self.config = check_eps(eps), check_dsl(dsl), config_json(config)

    def forward(self, q, k, v, q_offsets, max_len: int) -> torch.Tensor:
        return _op(q, k, v, q_offsets, max_len, self.eps, self.dsl, self.config)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, dsl={self.dsl}"
