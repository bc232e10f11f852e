"""Which implementations exist: DSL kernel modules and the PyTorch baselines.

Every DSL folder ``kernels_<dsl>/`` has one module per technique with the same function names
(e.g. ``kernels_triton.lazy_prenorm.lazy_rmsnorm_matmul``). Kernel impls map to those functions; baseline impls
(``cublas``, ``torch_compile_norm``) belong to the pseudo-DSL ``torch``. Nothing here imports triton.
"""

from __future__ import annotations

from importlib import import_module

DSLS = ("triton", "helion", "tlx")
BASELINE_DSL = "torch"

# impl name -> function name in kernels_<dsl>/<technique>.py
KERNEL_IMPLS = {
    "lazy_prenorm": {"fused": "lazy_rmsnorm_matmul", "gemm": "matmul"},
}
BASELINE_IMPLS = {
    "lazy_prenorm": ("cublas", "torch_compile_norm"),
}


def check_dsl(dsl: str) -> str:
    """Return ``dsl`` if known, else raise ValueError listing the choices."""
    if dsl not in DSLS and dsl != BASELINE_DSL:
        raise ValueError(f"unknown dsl {dsl!r}; choices: {', '.join(DSLS + (BASELINE_DSL,))}")
    return dsl


def kernel_module(dsl: str, technique: str):
    """Import ``kernels_<dsl>.<technique>`` (only inside a worker of the DSL's environment)."""
    check_dsl(dsl)
    if technique not in KERNEL_IMPLS:
        raise ValueError(f"unknown technique {technique!r}; choices: {', '.join(KERNEL_IMPLS)}")
    return import_module(f"kernels_{dsl}.{technique}")


def kernel_function(dsl: str, technique: str, impl: str):
    """The callable implementing ``impl`` ('fused' | 'gemm') of ``technique`` in ``dsl``."""
    impls = KERNEL_IMPLS[technique]
    if impl not in impls:
        raise ValueError(f"unknown impl {impl!r} for {technique}; choices: {', '.join(impls)}")
    return getattr(kernel_module(dsl, technique), impls[impl])
