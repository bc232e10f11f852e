"""Which implementations exist: DSL kernel modules and the PyTorch baselines.

Every DSL folder ``kernels_<dsl>/`` has one module per technique with the same function names
(e.g. ``kernels_triton.lazy_prenorm.lazy_rmsnorm_matmul``); the technique spec says which function implements
which impl (``spec.kernel_function_name``) and which baselines it has (``spec.BASELINES``, run by the pseudo-DSL
``torch``). Nothing here imports triton.
"""

from __future__ import annotations

from importlib import import_module

from normfuse.techniques import get_technique

DSLS = ("triton", "helion", "tlx")
BASELINE_DSL = "torch"


def check_dsl(dsl: str) -> str:
    """Return ``dsl`` if known, else raise ValueError listing the choices."""
    if dsl not in DSLS and dsl != BASELINE_DSL:
        raise ValueError(f"unknown dsl {dsl!r}; choices: {', '.join(DSLS + (BASELINE_DSL,))}")
    return dsl


def kernel_module(dsl: str, technique: str):
    """Import ``kernels_<dsl>.<technique>`` (only inside a worker of the DSL's environment)."""
    check_dsl(dsl)
    get_technique(technique)  # ValueError listing the techniques
    return import_module(f"kernels_{dsl}.{technique}")


def kernel_function(dsl: str, technique: str, impl: str, variant: str | None = None):
    """The callable implementing ``impl`` (and ``variant``) of ``technique`` in ``dsl``."""
    name = get_technique(technique).kernel_function_name(impl, variant)
    return getattr(kernel_module(dsl, technique), name)
