"""normfuse: how much of the cost of RMSNorm/LayerNorm can be hidden by fusing it into GEMM, attention and
quantization kernels, measured for three kernel DSLs (TLX, Helion, Triton) side by side.

The core package never imports triton or helion at import time: the orchestrator runs without them and the
kernels run in worker processes (`normfuse.worker`), one per environment.
"""

__version__ = "0.1.0"
