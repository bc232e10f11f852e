"""Autograd drop-ins for the fused ops (import cost: torch only; kernels are imported on first call)."""
