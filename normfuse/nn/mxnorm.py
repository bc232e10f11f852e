r"""MXNorm -> MXFP8 cast -> Linear with autograd (``MXNormLinear`` of the MXNorm paper): the fused norm + cast
kernel, gamma folded into the next linear, a straight-through-estimator backward made of our Triton norm kernel and
cuBLAS, a ``torch.library`` custom op and the ``nn.Module`` drop-in ``MXNormLinear``.

Forward (spec ``normfuse.techniques.mxnorm``; ``variant``: "mxnorm_p2" (default), "mxnorm_p1" or the exact
"rmsnorm_cast")::

    (data, scales, rho) = kernels_<dsl>/mxnorm.mxnorm_mxfp8(x, p)     (rmsnorm_mxfp8 for "rmsnorm_cast")
    W_eff = W diag(gamma)                      [N, K], fp32, cast to MXFP8 along K (``normfuse.mxfp8.quantize``)
    out = dequant(data, scales) @ dequant(W_eff)^T                      in x's dtype

gamma cannot multiply the normalized row without breaking the reuse of the block absmaxes, so it is folded into the
next weight (H = MXNorm(X) MXCast(W diag(gamma))^T in the paper). The GEMM: ``gemm="dequant"`` (default; both
operands dequantized to x's dtype, cuBLAS; runs anywhere) or ``gemm="dot_scaled"``
(``kernels_triton.mxfp8_gemm.mxfp8_matmul``, ``tl.dot_scaled``: a bf16 *emulation* on Hopper, which has no MX MMA;
GPU only, bf16 output). Neither is a native MXFP8 GEMM: the H200 has none.

Backward, straight-through (the paper: "uses RMSNorm's gradient as a straight-through estimator; caches X and
rho"): both MXFP8 casts are treated as the identity and the RMSNorm gradient is taken with rho in place of rstd::

    yg  = x * rho * gamma                          recomputed (PyTorch pointwise)
    dW  = dout^T @ yg                              cuBLAS       (= dW_eff diag(gamma))
    u   = dout @ W                                 cuBLAS
    dx, dgamma = rms_norm_bwd(u, x, rho, gamma)    our Triton kernel:  dx = rho (u gamma - yhat mean(u gamma yhat)),
                                                   yhat = rho x;  dgamma = sum_rows(u yhat)  (= sum_n W dW_eff)

The backward GEMMs run in x's dtype (bf16), not in MXFP8. Sources: McLean, Prince, Payot, Balança, Luschi,
"MXNorm: Reusing MXFP block scales for efficient tensor normalisation", arXiv 2603.13180 (2026); the STE formula as
read in ``shared/docs/techniques.md`` section 8.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from normfuse.nn import norm_ops
from normfuse.nn._common import check_dsl, check_eps, config_from_json, config_json, dense, kernel_module

__all__ = ["VARIANTS", "GEMMS", "mxnorm_linear", "reference", "MXNormLinear"]

VARIANTS = ("mxnorm_p2", "mxnorm_p1", "rmsnorm_cast")
GEMMS = ("dequant", "dot_scaled")


def _check_choice(name, v, choices):
    if v not in choices:
        raise ValueError(f"unknown {name} {v!r}; choices: {', '.join(choices)}")
    return v


def _norm_cast(x, variant: str, eps: float, scale_mode: str, dsl: str, config):
    mod = kernel_module(dsl, "mxnorm")
    if variant == "rmsnorm_cast":
        return mod.rmsnorm_mxfp8(x, eps=eps, scale_mode=scale_mode, config=config)
    return mod.mxnorm_mxfp8(x, p=int(variant[-1]), eps=eps, scale_mode=scale_mode, config=config)


def _mx_gemm(data, scales, w_eff, scale_mode: str, gemm: str, dtype):
    from normfuse import mxfp8

    wq, ws = mxfp8.quantize(w_eff, scale_mode)
    if gemm == "dot_scaled":
        from kernels_triton.mxfp8_gemm import mxfp8_matmul

        return mxfp8_matmul(data, scales, wq, ws, out_dtype=dtype)
    a = mxfp8.dequantize(data, scales, dtype=dtype)
    return a @ mxfp8.dequantize(wq, ws, dtype=dtype).t()


@torch.library.custom_op("normfuse::mxnorm_linear", mutates_args=())
def _op(x: torch.Tensor, gamma: torch.Tensor, weight: torch.Tensor, variant: str, eps: float, scale_mode: str,
        gemm: str, dsl: str, config: str) -> tuple[torch.Tensor, torch.Tensor]:
    data, scales, rho = _norm_cast(dense(x), variant, eps, scale_mode, dsl, config_from_json(config))
    w_eff = weight.float() * gamma.float()
    return _mx_gemm(data, scales, w_eff, scale_mode, gemm, x.dtype), rho


@_op.register_fake
def _(x, gamma, weight, variant, eps, scale_mode, gemm, dsl, config):
    return x.new_empty(x.shape[0], weight.shape[0]), x.new_empty(x.shape[0], dtype=torch.float32)


def _setup(ctx, inputs, output):
    x, gamma, weight = inputs[:3]
    ctx.save_for_backward(x, gamma, weight, output[1])


def _backward(ctx, dout, _drho):
    x, gamma, weight, rho = ctx.saved_tensors
    need_x, need_g, need_w = ctx.needs_input_grad[:3]
    dout = dout.contiguous()
    dw = dout.t().mm((x * rho[:, None] * gamma).to(dout.dtype)) if need_w else None
    dx = dgamma = None
    if need_x or need_g:
        dx, dgamma = norm_ops.rms_norm_bwd(dout.mm(weight.to(dout.dtype)), x.contiguous(), rho, gamma, False)
    return dx, dgamma, dw, None, None, None, None, None, None


_op.register_autograd(_backward, setup_context=_setup)


def _check_args(variant, scale_mode, gemm, dsl, eps):
    from normfuse import mxfp8

    _check_choice("variant", variant, VARIANTS)
    _check_choice("gemm", gemm, GEMMS)
    mxfp8.check_scale_mode(scale_mode)
    return check_eps(eps), check_dsl(dsl)


def mxnorm_linear(x: torch.Tensor, gamma: torch.Tensor, weight: torch.Tensor, *, variant: str = "mxnorm_p2",
                  eps: float = 1e-6, scale_mode: str = "floor", gemm: str = "dequant", dsl: str = "triton",
                  config=None) -> torch.Tensor:
    """``MXCast(MXNorm(x)) @ MXCast(W diag(gamma))^T`` with a straight-through backward (module docstring).

    ``x [..., K]`` (K a multiple of 32), ``gamma [K]``, ``weight [N, K]`` (``nn.Linear`` layout), one dtype (bf16 on
    the GPU; fp16/fp32 and the CPU only under ``TRITON_INTERPRET=1`` / ``HELION_INTERPRET=1``). Returns ``[..., N]``
    in x's dtype. ``variant``: "mxnorm_p2", "mxnorm_p1" or "rmsnorm_cast"; ``scale_mode``: "floor" or "rceil";
    ``gemm``: "dequant" or "dot_scaled" (GPU); ``dsl``: the norm + cast kernel's DSL; ``config``: its tiling.
    Raises TypeError / ValueError for bad inputs or choices (the kernel names the violated constraint),
    RuntimeError for an unavailable dsl."""
    eps, dsl = _check_args(variant, scale_mode, gemm, dsl, eps)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be [N, K] with K = x.shape[-1] = {x.shape[-1]}")
    out, _ = _op(x.reshape(-1, x.shape[-1]), gamma, weight, variant, eps, scale_mode, gemm, dsl, config_json(config))
    return out.reshape(*x.shape[:-1], weight.shape[0])


class _STERMSNorm(torch.autograd.Function):
    """``y = x * rho`` forward; backward the RMSNorm gradient with rho in place of rstd (the paper's STE)."""

    @staticmethod
    def forward(ctx, x, rho):
        ctx.save_for_backward(x, rho)
        return x * rho[:, None]

    @staticmethod
    def backward(ctx, g):
        x, rho = ctx.saved_tensors
        yhat = x * rho[:, None]
        return rho[:, None] * (g - yhat * (g * yhat).mean(-1, keepdim=True)), None


def reference(x, gamma, weight, *, variant: str = "mxnorm_p2", eps: float = 1e-6, scale_mode: str = "floor",
              rho: torch.Tensor | None = None) -> torch.Tensor:
    """The module in PyTorch ops (tests): rho from ``normfuse.techniques.mxnorm.reference_rstd`` (or the given fp32
    ``rho [T]``, e.g. a kernel's, so that both sides cast the same fp32 values), both MXFP8 casts in fp32
    (``normfuse.mxfp8``; W diag(gamma) formed in fp32 as the op does), the product of the dequantized operands in
    x's dtype; its autograd is the straight-through backward of ``mxnorm_linear`` (casts as the identity,
    ``_STERMSNorm``), in x's dtype (fp64 for the reference)."""
    from normfuse import mxfp8
    from normfuse.techniques.mxnorm import reference_rstd

    x2 = x.reshape(-1, x.shape[-1])
    r = (reference_rstd(variant, x2.detach(), eps) if rho is None else rho.float()).to(x2.device)
    yq = mxfp8.dequantize(*mxfp8.quantize(x2.detach().float() * r[:, None], scale_mode), dtype=x.dtype)
    w_eff = weight * gamma
    w_eff32 = weight.detach().float() * gamma.detach().float()
    wq = mxfp8.dequantize(*mxfp8.quantize(w_eff32, scale_mode), dtype=x.dtype)
    y = _STERMSNorm.apply(x2, r.to(x.dtype))
    smooth = y @ w_eff.t()
    out = smooth + (yq @ wq.t() - smooth).detach()  # forward value: the quantized product; gradient: STE
    return out.reshape(*x.shape[:-1], weight.shape[0])


class MXNormLinear(nn.Module):
    """Drop-in for ``nn.Sequential(nn.RMSNorm(in_features), nn.Linear(in_features, out_features, bias=False))`` in
    an MXFP8 model, the paper's ``MXNormLinear``: ``forward(x [..., in_features]) -> [..., out_features]`` through
    ``mxnorm_linear``. Parameters ``norm_weight [in_features]`` (gamma, ones; folded into the weight) and ``weight
    [out_features, in_features]`` (nn.Linear layout and init)."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-6, *, variant: str = "mxnorm_p2",
                 scale_mode: str = "floor", gemm: str = "dequant", dsl: str = "triton", config=None, device=None,
                 dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.eps, self.dsl = _check_args(variant, scale_mode, gemm, dsl, eps)
        self.in_features, self.out_features = in_features, out_features
        self.variant, self.scale_mode, self.gemm, self.config = variant, scale_mode, gemm, config_json(config)
        self.norm_weight = nn.Parameter(torch.ones(in_features, **kw))
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = _op(x.reshape(-1, self.in_features), self.norm_weight, self.weight, self.variant, self.eps,
                     self.scale_mode, self.gemm, self.dsl, self.config)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, variant={self.variant}, "
                f"scale_mode={self.scale_mode}, gemm={self.gemm}, dsl={self.dsl}")
