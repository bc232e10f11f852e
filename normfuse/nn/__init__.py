"""Autograd drop-ins for the fused ops: ``torch.library`` custom ops with backward passes, and ``nn.Module`` s.

One module per fused op (forward call, backward, custom op, module and PyTorch reference in one place):

* ``lazy_prenorm``: ``LazyRMSNormLinear`` / ``lazy_rmsnorm_linear`` -- RMSNorm -> Linear through the Lazy Pre-Norm
  kernel, gamma folded into the weight; backward: RMSNorm recompute + RMSNorm backward (ours), dgrad / wgrad cuBLAS.
* ``linear_norm``: ``LinearRMSNorm``, ``LinearLayerNorm`` / ``linear_rmsnorm``, ``linear_layernorm`` -- Linear ->
  norm through the multi-CTA or naive-fusion kernel; backward: norm backward from the saved normalized output
  (ours), dgrad / wgrad cuBLAS.
* ``fna_llm``: ``QKNormAttention`` / ``qknorm_attention`` -- QK-RMSNorm flash attention; backward: q/k (and output)
  norm recompute + backward (ours), attention recomputed and differentiated by PyTorch SDPA.
* ``fna``: ``FlashNormAttention`` / ``gdpa`` -- the blog's PFFN module; backward: LayerNorm / RMSNorm recompute +
  backward (ours), GDPA recomputed on a padded batch and differentiated by PyTorch.
* ``mxnorm``: ``MXNormLinear`` / ``mxnorm_linear`` -- MXNorm + MXFP8 cast, gamma folded into the next weight;
  straight-through backward: RMSNorm backward with rho (ours), dgrad / wgrad cuBLAS in bf16.
* ``norm_ops``: the backward building blocks as custom ops; ``checks``: the GPU gradient checks.

Every op takes ``dsl`` ("triton" default, "helion", or "tlx" in the fbtriton environment) for its forward kernel and
that DSL's tiling ``config``; the backward kernels are Triton (``kernels_triton/norms_bwd.py``): plain row
reductions, and Triton is the one DSL that runs in both environments and in the CPU interpreter. The forward-only
kernel wrappers in ``kernels_*/`` refuse inputs that require grad (``normfuse.validate.check_forward_only``); these
drop-ins call them with grad mode off. Importing this package costs torch only: kernels are imported on first call.
"""

from normfuse.nn._common import DSLS, check_grads
from normfuse.nn.fna import FlashNormAttention, gdpa
from normfuse.nn.lazy_prenorm import LazyRMSNormLinear, lazy_rmsnorm_linear
from normfuse.nn.linear_norm import LinearLayerNorm, LinearRMSNorm, linear_layernorm, linear_rmsnorm
from normfuse.nn.mxnorm import MXNormLinear, mxnorm_linear
from normfuse.nn.fna_llm import QKNormAttention, qknorm_attention

__all__ = ["DSLS", "check_grads", "LazyRMSNormLinear", "lazy_rmsnorm_linear", "LinearRMSNorm", "LinearLayerNorm",
           "linear_rmsnorm", "linear_layernorm", "QKNormAttention", "qknorm_attention", "FlashNormAttention", "gdpa",
           "MXNormLinear", "mxnorm_linear"]
