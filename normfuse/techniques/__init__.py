"""Technique specs: one module per technique holds its math, inputs, reference, cost model and tolerance."""

from importlib import import_module

TECHNIQUES = ("lazy_prenorm", "norms", "naive_fusion", "mxnorm", "multi_cta", "fna", "fna_llm")


def get_technique(name: str):
    """Return the spec module of technique `name` (ValueError listing the choices if unknown)."""
    if name not in TECHNIQUES:
        raise ValueError(f"unknown technique {name!r}; choices: {', '.join(TECHNIQUES)}")
    return import_module(f"normfuse.techniques.{name}")
