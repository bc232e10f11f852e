"""TLX (Meta's Triton Low-level Extensions, fbtriton 3.7.4) kernels for the H200 (sm_90).

Modules are imported explicitly (``from kernels_tlx import lazy_prenorm``); importing this package does not
import triton, so the orchestrator can import it from an environment without fbtriton.

- ``lazy_prenorm``: warp-specialized TMA + wgmma GEMM with the Lazy Pre-Norm RMSNorm fusion
  (``matmul`` baseline and ``lazy_rmsnorm_matmul`` from one kernel source).
"""
