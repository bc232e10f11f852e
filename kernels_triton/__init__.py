"""Upstream Triton (3.6.0) kernels for normfuse, one module per technique (``lazy_prenorm``).

Modules here import triton at import time, so import them only in a worker or test process of the upstream
environment (``.venv``), never from the orchestrator.
"""
