"""Autograd drop-ins for the fused ops: ``torch.library`` custom ops with backward passes, and ``nn.Module``\\ s.

=========================  ==============================  =====================================================
drop-in (module / function)  forward kernel (``dsl=``)        backward: our kernels (Triton) + PyTorch
=========================  ==============================  =====================================================
``LazyRMSNormLinear``        ``lazy_prenorm``: RMSNorm ->      RMSNorm recompute + RMSNorm backward; dgrad / wgrad
``lazy_rmsnorm_linear``      GEMM, gamma folded into W         cuBLAS
``LinearRMSNorm``,           ``multi_cta`` / ``naive_fusion``  norm backward from the saved normalized output;
``LinearLayerNorm``          (GEMM -> norm epilogue)           dgrad / wgrad cuBLAS
``QKNormAttention``          ``fna_llm``: QK-RMSNorm flash     q/k (o) norm recompute + backward; attention
``qknorm_attention``         attention                         recomputed and differentiated by PyTorch SDPA
``FlashNormAttention``,      ``fna``: the blog's PFFN module   LayerNorm / RMSNorm recompute + backward; GDPA
``gdpa``                                                       recomputed on a padded batch, PyTorch autograd
``MXNormLinear``,            ``mxnorm``: MXNorm + MXFP8 cast,  straight-through: RMSNorm backward with rho;
``mxnorm_linear``            gamma folded into the next W      dgrad / wgrad cuBLAS (bf16)
=========================  ==============================  =====================================================

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
