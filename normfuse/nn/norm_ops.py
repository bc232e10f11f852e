"""The norm building blocks that the drop-ins' backward passes call, as ``torch.library`` custom ops (so that
``torch.compile`` / AOTAutograd can trace a backward made of them and of cuBLAS matmuls without looking inside):

* ``normfuse::rms_norm(x, weight, eps) -> (y, rstd)`` and ``normfuse::layer_norm(x, weight, bias, eps) -> (y, mean,
  rstd)``: the forward kernels of ``kernels_triton/norms.py``, used to *recompute* the normalized activation and
  its statistics in a backward (the fused forwards never write them);
* ``normfuse::rms_norm_bwd`` / ``normfuse::layer_norm_bwd``: the backward kernels of ``kernels_triton/norms_bwd.py``.

All four are forward-only ops themselves (they are only ever called inside a backward, with grad mode off) and
run in both environments and the Triton interpreter. Shapes: ``x, dy [M, N]`` contiguous; statistics fp32 ``[M]``;
``weight``/``bias`` ``[N]`` or None. A missing gradient is returned as an empty tensor (custom-op schemas have no
optional outputs).

Reference mode: CPU tensors outside the Triton interpreter (e.g. a Helion forward in Helion's reference mode,
``HELION_INTERPRET=1``, which cannot share a process with ``TRITON_INTERPRET=1``) take the same math in PyTorch
(fp32, ``reference_*`` below) instead of a Triton kernel; CUDA tensors always run the Triton kernels.
"""

from __future__ import annotations

import os

import torch

from normfuse.nn._common import dense

_EMPTY = (0,)


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(_EMPTY)


def _reference_mode(t: torch.Tensor) -> bool:
    """CPU tensor and no Triton interpreter: the Triton kernels cannot run, the PyTorch reference does."""
    return t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


# --- PyTorch references (fp32 math; the semantics of the Triton kernels) ---------------------------------------
def reference_rms_norm(x, weight, eps: float):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    y = xf * rstd[:, None]
    return (y if weight is None else y * weight.float()).to(x.dtype), rstd


def reference_layer_norm(x, weight, bias, eps: float):
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + eps)
    y = (xf - mean[:, None]) * rstd[:, None]
    y = y if weight is None else y * weight.float()
    return (y if bias is None else y + bias.float()).to(x.dtype), mean, rstd


def reference_norm_bwd(dy, x, mean, rstd, weight, *, is_rms: bool, normalized: bool, bias: bool = False):
    """``(dx, dweight, dbias)`` of ``kernels_triton.norms_bwd`` (None where not computed)."""
    dyf, xf, r = dy.float(), x.float(), rstd[:, None]
    xhat = xf if normalized else (xf * r if is_rms else (xf - mean[:, None]) * r)
    g = dyf if weight is None else dyf * weight.float()
    dx = g - xhat * (g * xhat).mean(-1, keepdim=True)
    dx = (dx if is_rms else dx - g.mean(-1, keepdim=True)) * r
    dw = (dyf * xhat).sum(0).to(weight.dtype) if weight is not None else None
    db = dyf.sum(0).to(weight.dtype) if bias and weight is not None else None
    return dx.to(dy.dtype), dw, db


# --- custom ops -------------------------------------------------------------------------------------------------
@torch.library.custom_op("normfuse::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x * rstd (* weight) [M, N] in x.dtype, rstd [M] fp32)``, ``rstd = rsqrt(mean(x^2) + eps)``."""
    if _reference_mode(x):
        return reference_rms_norm(x, weight, eps)
    from kernels_triton import norms

    return norms.rms_norm(dense(x), weight, eps=eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("normfuse::layer_norm", mutates_args=())
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y [M, N] in x.dtype, mean [M] fp32, rstd [M] fp32)`` of LayerNorm (biased variance)."""
    if _reference_mode(x):
        return reference_layer_norm(x, weight, bias, eps)
    from kernels_triton import norms

    return norms.layer_norm(dense(x), weight, bias, eps=eps)


@layer_norm.register_fake
def _(x, weight, bias, eps):
    stat = x.new_empty(x.shape[0], dtype=torch.float32)
    return torch.empty_like(x), stat, stat.clone()


@torch.library.custom_op("normfuse::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None,
                 normalized: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` (dweight empty when ``weight`` is None); ``kernels_triton.norms_bwd.rms_norm_bwd``."""
    if _reference_mode(x):
        dx, dw, _ = reference_norm_bwd(dy, x, None, rstd, weight, is_rms=True, normalized=normalized)
    else:
        from kernels_triton import norms_bwd

        dx, dw = norms_bwd.rms_norm_bwd(dense(dy), dense(x), dense(rstd), weight, normalized=normalized)
    return dx, dw if dw is not None else _empty(dy)


@rms_norm_bwd.register_fake
def _(dy, x, rstd, weight, normalized):
    return torch.empty_like(dy), (torch.empty_like(weight) if weight is not None else _empty(dy))


@torch.library.custom_op("normfuse::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor | None, rstd: torch.Tensor,
                   weight: torch.Tensor | None, bias: bool,
                   normalized: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweight, dbias)`` (empty when not requested); ``kernels_triton.norms_bwd.layer_norm_bwd``."""
    if _reference_mode(x):
        dx, dw, db = reference_norm_bwd(dy, x, mean, rstd, weight, is_rms=False, normalized=normalized, bias=bias)
    else:
        from kernels_triton import norms_bwd

        dx, dw, db = norms_bwd.layer_norm_bwd(dense(dy), dense(x), mean, dense(rstd), weight, bias=bias,
                                              normalized=normalized)
    return dx, dw if dw is not None else _empty(dy), db if db is not None else _empty(dy)


@layer_norm_bwd.register_fake
def _(dy, x, mean, rstd, weight, bias, normalized):
    dw = torch.empty_like(weight) if weight is not None else _empty(dy)
    db = torch.empty_like(weight) if weight is not None and bias else _empty(dy)
    return torch.empty_like(dy), dw, db
