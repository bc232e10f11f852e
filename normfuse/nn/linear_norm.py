r"""Linear -> RMSNorm / LayerNorm with autograd (post-norm: ``y = norm(x @ W) * w (+ b)``): the multi-CTA or
naive-fusion forward kernels, a backward made of our Triton norm kernel and cuBLAS, ``torch.library`` custom ops,
and the ``nn.Module`` drop-ins ``LinearRMSNorm`` / ``LinearLayerNorm``.

Forward (``kernels_<dsl>/multi_cta.matmul_rmsnorm`` / ``matmul_layernorm``, or ``kernels_<dsl>/naive_fusion``, the
same signatures; specs ``normfuse.techniques.multi_cta`` / ``naive_fusion``): the GEMM with the row statistics
taken from its fp32 accumulator and the row normalized in the epilogue.

Where the affine goes. With gradients, the op returns the *normalized* row ``xhat = norm(x @ W)`` (the kernel
called without weight / bias) and its statistics, and the module applies ``xhat * w (+ b)`` as ordinary PyTorch
ops: the backward then needs exactly what a norm backward needs — ``xhat`` (the op's output, saved) and ``rstd`` —
and nothing has to be recomputed (``x @ W`` is never stored: recovering ``xhat`` from ``xhat * w`` would fail
where ``w = 0``, recomputing the GEMM would cost a GEMM). Under ``torch.compile`` the affine multiply fuses into the
consumer's pointwise kernel (e.g. the residual add). Without gradients (inference: grad mode off, or no input or
parameter requiring grad) the module calls the kernel with the affine in its epilogue: one kernel, nothing saved.

Backward of the op (``dxhat`` from autograd of the affine)::

    dh = rstd * (dxhat - xhat * mean(dxhat * xhat))            RMSNorm     } our Triton kernel
    dh = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   LayerNorm } (kernels_triton/norms_bwd.py,
    dx = dh @ W^T,  dW = x^T @ dh                                                  normalized=True); cuBLAS GEMMs

Weight layout: the kernels take ``W [K, N]`` row-major, so the modules store ``weight`` as ``[in_features,
out_features]`` (the transpose of ``nn.Linear.weight``; ``from_modules`` converts) and no call pays a transposing
copy. Source: "Towards Free Normalization" (multi-CTA norm fusion, naive fusion), PyTorch blog,
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ .
"""

from __future__ import annotations

import math

import torch
from torch import nn

from normfuse.nn import norm_ops
from normfuse.nn._common import (check_dsl, check_eps, config_from_json, config_json, dense, kernel_module,
                                 needs_grad)

__all__ = ["IMPLS", "linear_rmsnorm", "linear_layernorm", "reference", "LinearRMSNorm", "LinearLayerNorm"]

IMPLS = ("multi_cta", "naive_fusion")


def _check_impl(impl) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choices: {', '.join(IMPLS)}")
    return impl


def _kernel(dsl: str, impl: str, is_rms: bool):
    mod = kernel_module(dsl, impl)
    return mod.matmul_rmsnorm if is_rms else mod.matmul_layernorm


# --- RMSNorm ---------------------------------------------------------------------------------------------------
@torch.library.custom_op("normfuse::linear_rmsnorm", mutates_args=())
def _rms_op(a: torch.Tensor, b: torch.Tensor, eps: float, impl: str, dsl: str,
            config: str) -> tuple[torch.Tensor, torch.Tensor]:
    xhat, rstd = _kernel(dsl, impl, True)(dense(a), dense(b), None, eps=eps,
                                          config=config_from_json(config))
    return xhat, rstd


@_rms_op.register_fake
def _(a, b, eps, impl, dsl, config):
    return a.new_empty(a.shape[0], b.shape[1]), a.new_empty(a.shape[0], dtype=torch.float32)


def _rms_setup(ctx, inputs, output):
    a, b = inputs[:2]
    ctx.save_for_backward(a, b, *output)


def _rms_backward(ctx, dxhat, _drstd):
    a, b, xhat, rstd = ctx.saved_tensors
    dh, _ = norm_ops.rms_norm_bwd(dxhat.contiguous(), xhat, rstd, None, True)
    return _gemm_grads(ctx, a, b, dh) + (None, None, None, None)


_rms_op.register_autograd(_rms_backward, setup_context=_rms_setup)


# --- LayerNorm -------------------------------------------------------------------------------------------------
@torch.library.custom_op("normfuse::linear_layernorm", mutates_args=())
def _ln_op(a: torch.Tensor, b: torch.Tensor, eps: float, impl: str, dsl: str,
           config: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    xhat, mean, rstd = _kernel(dsl, impl, False)(dense(a), dense(b), None, None, eps=eps,
                                                 config=config_from_json(config))
    return xhat, mean, rstd


@_ln_op.register_fake
def _(a, b, eps, impl, dsl, config):
    stat = a.new_empty(a.shape[0], dtype=torch.float32)
    return a.new_empty(a.shape[0], b.shape[1]), stat, stat.clone()


def _ln_setup(ctx, inputs, output):
    a, b = inputs[:2]
    xhat, _, rstd = output
    ctx.save_for_backward(a, b, xhat, rstd)


def _ln_backward(ctx, dxhat, _dmean, _drstd):
    a, b, xhat, rstd = ctx.saved_tensors
    dh, _, _ = norm_ops.layer_norm_bwd(dxhat.contiguous(), xhat, None, rstd, None, False, True)
    return _gemm_grads(ctx, a, b, dh) + (None, None, None, None)


_ln_op.register_autograd(_ln_backward, setup_context=_ln_setup)


def _gemm_grads(ctx, a, b, dh):
    need_a, need_b = ctx.needs_input_grad[:2]
    return (dh.mm(b.t()) if need_a else None, a.t().mm(dh) if need_b else None)


# --- forward-only fully fused path (affine in the kernel's epilogue) ------------------------------------------
@torch.library.custom_op("normfuse::linear_norm_affine", mutates_args=())
def _affine_op(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, is_rms: bool, impl: str, dsl: str, config: str) -> torch.Tensor:
    """Forward only (no autograd formula: backward through it raises torch's 'no autograd formula' error)."""
    fn = _kernel(dsl, impl, is_rms)
    cfg = config_from_json(config)
    a, b = dense(a), dense(b)
    return fn(a, b, weight, eps=eps, config=cfg)[0] if is_rms else fn(a, b, weight, bias, eps=eps, config=cfg)[0]


@_affine_op.register_fake
def _(a, b, weight, bias, eps, is_rms, impl, dsl, config):
    return a.new_empty(a.shape[0], b.shape[1])


# --- functional API ------------------------------------------------------------------------------------------
def _check(x, w, weight, bias, is_rms):
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if w.dim() != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"need x [..., K] and w [K, N]; got {tuple(x.shape)} and {tuple(w.shape)}")
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and (not isinstance(v, torch.Tensor) or v.shape != (w.shape[1],)):
            raise ValueError(f"{name} must be None or a tensor of shape [N] = [{w.shape[1]}]")
    if is_rms and bias is not None:
        raise ValueError("RMSNorm has no bias")


def _forward(x, w, weight, bias, eps, impl, dsl, cfg: str, is_rms):
    """``cfg``: the config as ``config_json`` made it."""
    _check(x, w, weight, bias, is_rms)
    eps = check_eps(eps)
    impl, dsl = _check_impl(impl), check_dsl(dsl)
    a = x.reshape(-1, x.shape[-1])
    shape = (*x.shape[:-1], w.shape[1])
    if not needs_grad(x, w, weight, bias):
        return _affine_op(a, w, weight, bias, eps, is_rms, impl, dsl, cfg).reshape(shape)
    xhat = _rms_op(a, w, eps, impl, dsl, cfg)[0] if is_rms else _ln_op(a, w, eps, impl, dsl, cfg)[0]
    y = xhat if weight is None else xhat * weight
    y = y if bias is None else y + bias
    return y.reshape(shape)


def linear_rmsnorm(x: torch.Tensor, w: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
                   impl: str = "multi_cta", dsl: str = "triton", config=None) -> torch.Tensor:
    """``F.rms_norm(x @ w, (N,), weight, eps)`` through one fused GEMM + norm kernel, with autograd.

    ``x [..., K]``, ``w [K, N]`` (row-major; the transpose of an ``nn.Linear`` weight), ``weight [N]`` or None, one
    dtype (bf16 on the GPU; fp16/fp32, and the CPU only under ``TRITON_INTERPRET=1`` / ``HELION_INTERPRET=1``), K and
    N multiples of 8 (``naive_fusion``: N <= 512; TLX multi-CTA: N <= 2048). Returns ``[..., N]`` in x's dtype.
    ``impl``: "multi_cta" or "naive_fusion"; ``dsl``: "triton", "helion" or "tlx"; ``config``: that kernel's tiling.
    With gradients the affine runs after the kernel (module docstring). Raises TypeError / ValueError for bad
    inputs, eps, impl, dsl or config (the kernels name the violated constraint), RuntimeError for an unavailable dsl.
    """
    return _forward(x, w, weight, None, eps, impl, dsl, config_json(config), True)


def linear_layernorm(x: torch.Tensor, w: torch.Tensor, weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, eps: float = 1e-5, impl: str = "multi_cta",
                     dsl: str = "triton", config=None) -> torch.Tensor:
    """``F.layer_norm(x @ w, (N,), weight, bias, eps)`` (biased variance) through one fused GEMM + norm kernel, with
    autograd. Arguments and errors as ``linear_rmsnorm``; ``bias [N]`` or None."""
    return _forward(x, w, weight, bias, eps, impl, dsl, config_json(config), False)


def reference(x: torch.Tensor, w: torch.Tensor, weight=None, bias=None, *, eps: float, norm: str) -> torch.Tensor:
    """Unfused PyTorch: ``F.rms_norm`` / ``F.layer_norm`` of ``x @ w`` (``norm`` = "rmsnorm" | "layernorm")."""
    h = x @ w
    if norm == "rmsnorm":
        return torch.nn.functional.rms_norm(h, (w.shape[1],), weight, eps)
    if norm == "layernorm":
        return torch.nn.functional.layer_norm(h, (w.shape[1],), weight, bias, eps)
    raise ValueError(f"unknown norm {norm!r}; choices: rmsnorm, layernorm")


class _LinearNorm(nn.Module):
    _IS_RMS = True

    def __init__(self, in_features: int, out_features: int, eps: float, *, elementwise_affine: bool = True,
                 bias: bool = False, impl: str = "multi_cta", dsl: str = "triton", config=None, device=None,
                 dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.eps, self.impl, self.dsl = check_eps(eps), _check_impl(impl), check_dsl(dsl)
        self.config = config_json(config)
        self.weight = nn.Parameter(torch.empty(in_features, out_features, **kw))
        nn.init.uniform_(self.weight, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))
        self.norm_weight = nn.Parameter(torch.ones(out_features, **kw)) if elementwise_affine else None
        self.norm_bias = nn.Parameter(torch.zeros(out_features, **kw)) if elementwise_affine and bias else None

    @classmethod
    def from_modules(cls, linear: nn.Linear, norm: nn.Module, *, impl: str = "multi_cta", dsl: str = "triton",
                     config=None):
        """A drop-in holding ``linear.weight`` transposed (``[in, out]``) and copies of ``norm.weight`` /
        ``norm.bias``; ``linear`` must have no bias (the norm would cancel a per-column constant only partly)."""
        if linear.bias is not None:
            raise ValueError("from_modules: the linear layer must have bias=False")
        w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
        kw = {} if cls._IS_RMS else {"bias": b is not None}
        m = cls(linear.in_features, linear.out_features, getattr(norm, "eps", None) or cls._EPS,
                elementwise_affine=w is not None, impl=impl, dsl=dsl, config=config,
                device=linear.weight.device, dtype=linear.weight.dtype, **kw)
        with torch.no_grad():
            m.weight.copy_(linear.weight.t())
            if w is not None:
                m.norm_weight.copy_(w)
            if b is not None:
                m.norm_bias.copy_(b)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _forward(x, self.weight, self.norm_weight, self.norm_bias, self.eps, self.impl, self.dsl,
                        self.config, self._IS_RMS)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, eps={self.eps}, "
                f"impl={self.impl}, dsl={self.dsl}")


class LinearRMSNorm(_LinearNorm):
    """Drop-in for ``nn.Sequential(nn.Linear(in, out, bias=False), nn.RMSNorm(out, eps))``: ``forward(x [..., in])
    -> [..., out]`` through one fused kernel (``linear_rmsnorm``). Parameters: ``weight [in, out]`` (the kernels'
    layout: ``nn.Linear.weight`` transposed), ``norm_weight [out]`` (ones) unless ``elementwise_affine=False``."""

    _IS_RMS = True
    _EPS = 1e-6

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-6, **kw):
        super().__init__(in_features, out_features, eps, **kw)


class LinearLayerNorm(_LinearNorm):
    """Drop-in for ``nn.Sequential(nn.Linear(in, out, bias=False), nn.LayerNorm(out, eps, bias=bias))``, as
    ``LinearRMSNorm`` plus ``norm_bias [out]`` (zeros) when ``bias=True``."""

    _IS_RMS = False
    _EPS = 1e-5

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, *, bias: bool = True, **kw):
        super().__init__(in_features, out_features, eps, bias=bias, **kw)
