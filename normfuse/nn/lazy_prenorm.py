r"""RMSNorm -> Linear with autograd: the Lazy Pre-Norm forward kernel, a backward made of our Triton norm kernels
and cuBLAS, a ``torch.library`` custom op, and the ``nn.Module`` drop-in ``LazyRMSNormLinear``.

Forward (``kernels_<dsl>/lazy_prenorm.lazy_rmsnorm_matmul``, technique spec ``normfuse.techniques.lazy_prenorm``)::

    out = (rmsnorm(x) * gamma) @ W^T = diag(rstd) (x @ W'),   W' = diag(gamma) W^T  [K, N],
    rstd = rsqrt(mean(x^2) + eps)

The module keeps ``nn.Linear``'s ``weight [N, K]`` and ``RMSNorm``'s ``gamma [K]`` as separate parameters and folds
them into ``W'`` (one multiply-and-transpose pass over the weight, in x's dtype) on every call: parameters change at
every optimizer step, and the fold is part of what the fused path costs.

Backward (exact for the forward above; ``y = rmsnorm(x) * gamma`` is never stored by the forward)::

    y, rstd   = rms_norm(x, gamma)                     recomputed: our Triton kernel (kernels_triton/norms.py)
    dW        = dout^T @ y                  [N, K]     cuBLAS (wgrad)
    u         = dout @ W                    [M, K]     cuBLAS (dgrad with the unfolded weight)
    dx, dgamma = rms_norm_bwd(u, x, rstd, gamma)       our Triton kernel (kernels_triton/norms_bwd.py)

which is the chain rule through the folded weight: with ``dW' = xhat^T dout`` (xhat = x * rstd), ``dW = dW'^T
diag(gamma)`` and ``dgamma_k = sum_n W_nk dW'_kn`` — written through ``y = xhat * gamma`` and ``u = dout W`` the
recovery costs no weight-sized pass (``dgamma = sum_rows(u * xhat)`` is the RMSNorm weight gradient). Our kernels
in the backward: the rstd / y recompute and the norm backward (Triton, both environments); the two GEMMs are
cuBLAS through ``torch.matmul``.

Forward dispatch: ``dsl`` picks ``kernels_triton`` (default), ``kernels_helion`` or ``kernels_tlx`` (TLX only in
the fbtriton environment); ``config`` is that DSL's tiling (a mapping or its ``TilingConfig``; None = default).

Source: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog
(Lazy Pre-Norm), https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ .
"""

from __future__ import annotations

import math

import torch
from torch import nn

from normfuse.nn import norm_ops
from normfuse.nn._common import check_dsl, check_eps, config_from_json, config_json, dense, kernel_module

__all__ = ["lazy_rmsnorm_linear", "reference", "fold_weight", "LazyRMSNormLinear"]


def fold_weight(gamma: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``W' = diag(gamma) W^T`` as a contiguous ``[K, N]`` tensor of ``dtype`` (one pass: the product is computed
    in the promoted dtype and rounded once into the output)."""
    out = torch.empty(weight.shape[1], weight.shape[0], dtype=dtype, device=weight.device)
    torch.mul(weight.t(), gamma[:, None], out=out)
    return out


def _check(x, gamma, weight):
    for name, t in (("x", x), ("gamma", gamma), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or gamma.dim() != 1 or weight.dim() != 2:
        raise ValueError(f"need x [M, K], gamma [K], weight [N, K]; got {tuple(x.shape)}, {tuple(gamma.shape)}, "
                         f"{tuple(weight.shape)}")
    if gamma.shape[0] != x.shape[1] or weight.shape[1] != x.shape[1]:
        raise ValueError(f"K mismatch: x {tuple(x.shape)}, gamma {tuple(gamma.shape)}, weight {tuple(weight.shape)}")


@torch.library.custom_op("normfuse::lazy_rmsnorm_linear", mutates_args=())
def _lazy_op(x: torch.Tensor, gamma: torch.Tensor, weight: torch.Tensor, eps: float, dsl: str,
             config: str) -> torch.Tensor:
    b_folded = fold_weight(gamma, weight, x.dtype)
    mod = kernel_module(dsl, "lazy_prenorm")
    return mod.lazy_rmsnorm_matmul(dense(x), b_folded, eps=eps, config=config_from_json(config))


@_lazy_op.register_fake
def _(x, gamma, weight, eps, dsl, config):
    return x.new_empty(x.shape[0], weight.shape[0])


def _setup(ctx, inputs, output):
    x, gamma, weight, eps, _, _ = inputs
    ctx.save_for_backward(x, gamma, weight)
    ctx.eps = eps


def _backward(ctx, dout):
    x, gamma, weight = ctx.saved_tensors
    need_x, need_g, need_w = ctx.needs_input_grad[:3]
    dout = dout.contiguous()
    y, rstd = norm_ops.rms_norm(x, gamma, ctx.eps)
    dw = dout.t().mm(y) if need_w else None
    dx = dgamma = None
    if need_x or need_g:
        dx, dgamma = norm_ops.rms_norm_bwd(dout.mm(weight.to(dout.dtype)), x, rstd, gamma, False)
    return dx, dgamma, dw, None, None, None


_lazy_op.register_autograd(_backward, setup_context=_setup)


def lazy_rmsnorm_linear(x: torch.Tensor, gamma: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6,
                        dsl: str = "triton", config=None) -> torch.Tensor:
    """``F.linear(F.rms_norm(x, (K,), gamma, eps), weight)`` through the fused Lazy Pre-Norm kernel, with autograd.

    ``x [..., K]``, ``gamma [K]``, ``weight [N, K]`` (``nn.Linear`` layout), one dtype: bf16 on the GPU (fp16/fp32
    too; the CPU runs only under ``TRITON_INTERPRET=1`` / ``HELION_INTERPRET=1``, fp16/fp32), K and N multiples of 8.
    Returns ``[..., N]`` in x's dtype; gradients for all three tensors (module docstring). ``dsl``: "triton",
    "helion" or "tlx"; ``config``: that DSL's tiling (mapping / ``TilingConfig`` / None).

    Raises TypeError / ValueError for bad tensors, ``eps``, ``dsl`` or ``config`` (the kernel's own checks name the
    violated constraint), RuntimeError when ``dsl`` is not importable in this environment.
    """
    _check(x, gamma, weight)
    eps = check_eps(eps)
    out = _lazy_op(x.reshape(-1, x.shape[-1]), gamma, weight, eps, check_dsl(dsl), config_json(config))
    return out.reshape(*x.shape[:-1], weight.shape[0])


def reference(x: torch.Tensor, gamma: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """The unfused PyTorch module, ``F.linear(F.rms_norm(x, (K,), gamma, eps), weight)`` (tests: fp64 reference and
    same-dtype tolerance; the layer benchmark's torch.compile baseline)."""
    return torch.nn.functional.linear(torch.nn.functional.rms_norm(x, (x.shape[-1],), gamma, eps), weight)


class LazyRMSNormLinear(nn.Module):
    """Drop-in for ``nn.Sequential(nn.RMSNorm(in_features, eps), nn.Linear(in_features, out_features, bias))``:
    one fused Lazy Pre-Norm kernel in the forward, gamma folded into the weight on every call
    (``lazy_rmsnorm_linear``).

    Parameters: ``norm_weight [in_features]`` (gamma, ones), ``weight [out_features, in_features]`` (nn.Linear's
    layout and init), ``bias [out_features]`` or None (added after the kernel). ``forward(x [..., in_features]) ->
    [..., out_features]``. ``from_modules(norm, linear)`` copies an existing pair.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, eps: float = 1e-6, *,
                 dsl: str = "triton", config=None, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.eps = check_eps(eps)
        self.dsl = check_dsl(dsl)
        self.config = config_json(config)
        self.norm_weight = nn.Parameter(torch.ones(in_features, **kw))
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.uniform_(self.bias, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))

    @classmethod
    def from_modules(cls, norm: nn.Module, linear: nn.Linear, *, dsl: str = "triton", config=None):
        """A drop-in holding copies of ``norm.weight`` (gamma; ``norm.eps`` or 1e-6) and ``linear.weight`` /
        ``linear.bias``."""
        eps = getattr(norm, "eps", None) or 1e-6
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, eps, dsl=dsl, config=config,
                device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            m.norm_weight.copy_(norm.weight)
            m.weight.copy_(linear.weight)
            if linear.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _lazy_op(x.reshape(-1, self.in_features), self.norm_weight, self.weight, self.eps, self.dsl,
                       self.config).reshape(*x.shape[:-1], self.out_features)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"eps={self.eps}, dsl={self.dsl}")
