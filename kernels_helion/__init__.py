"""Helion implementations of the normfuse techniques (one module per technique, same API as the Triton and TLX
folders). ``normfuse.helion_compat`` is imported first: it must run before ``import helion`` (CPU mm.dtype for
ref mode, IntelGPUError for helion 1.5.1 on torch 2.11). Set ``HELION_INTERPRET=1`` before importing this package
to run the kernels as eager PyTorch on CPU (ref mode).
"""

import normfuse.helion_compat  # noqa: F401  (before any `import helion`)
