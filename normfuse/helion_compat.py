"""Compatibility shims that let Helion run in our two environments; import this module before ``import helion``.

Two gaps are papered over, each only when it actually exists (so on a complete install both are no-ops):

(a) **CPU ``aten::mm.dtype`` / ``aten::bmm.dtype``.** Helion's eager reference mode (``HELION_INTERPRET=1``)
    lowers ``torch.addmm`` / ``torch.baddbmm`` / ``hl.dot`` to ``torch.mm(..., out_dtype=)``, which the CPU build
    of torch does not implement, so no Helion matmul runs in ref mode on the CPU-only CI machine (DSL primer,
    blocker 6). We register CPU kernels for both overloads that upcast to fp32, multiply, and cast to the
    requested ``out_dtype``. Registration happens only when a 1x1 probe call fails.

(b) **``IntelGPUError`` on torch 2.11.** helion 1.5.1 imports
    ``torch._inductor.runtime.triton_compat.IntelGPUError``, which torch 2.11 (the GPU machine's torch) lacks
    (DSL primer, blocker 2). If the name is missing we define it there (re-exporting triton's class when triton
    has one). helion 1.5.0 does not need this; the shim then does nothing.

Both actions are idempotent: importing this module twice, or with both gaps already closed, changes nothing.
``install()`` is run on import; ``status()`` reports what was done.
"""

from __future__ import annotations

import torch

_STATE = {"mm_dtype_registered": False, "intel_gpu_error_defined": False}
_LIB = None  # keep the torch.library.Library alive: dropping it would unregister the kernels


def _cpu_has_mm_out_dtype() -> bool:
    """True when ``torch.mm(bf16, bf16, out_dtype=fp32)`` already works on CPU tensors."""
    x = torch.ones(1, 1, dtype=torch.bfloat16)
    try:
        torch.mm(x, x, out_dtype=torch.float32)
        return True
    except (NotImplementedError, RuntimeError, TypeError):
        return False


def _mm_out_dtype_cpu(self: torch.Tensor, mat2: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    # fp32 accumulation, one rounding to out_dtype: the contract of the CUDA kernel
    return torch.mm(self.float(), mat2.float()).to(out_dtype)


def _bmm_out_dtype_cpu(self: torch.Tensor, mat2: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.bmm(self.float(), mat2.float()).to(out_dtype)


def _register_cpu_mm_dtype() -> None:
    global _LIB
    if _LIB is not None or _cpu_has_mm_out_dtype():
        return
    try:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("mm.dtype", _mm_out_dtype_cpu, "CPU")
        lib.impl("bmm.dtype", _bmm_out_dtype_cpu, "CPU")
    except (RuntimeError, ValueError):  # this torch has no such overloads: Helion will not emit them either
        return
    _LIB = lib
    _STATE["mm_dtype_registered"] = True


def _define_intel_gpu_error() -> None:
    try:
        import torch._inductor.runtime.triton_compat as triton_compat
    except ImportError:  # no inductor at all: helion cannot import anyway, nothing for us to fix
        return
    if hasattr(triton_compat, "IntelGPUError"):
        return
    try:
        from triton.runtime.errors import IntelGPUError as err_cls  # present in some triton builds
    except ImportError:

        class IntelGPUError(Exception):
            """Placeholder for the exception torch >= 2.13 exports; never raised on NVIDIA machines."""

        err_cls = IntelGPUError
    triton_compat.IntelGPUError = err_cls
    _STATE["intel_gpu_error_defined"] = True


def install() -> dict:
    """Apply both shims where needed (idempotent) and return ``status()``."""
    _register_cpu_mm_dtype()
    _define_intel_gpu_error()
    return status()


def status() -> dict:
    """Which shims this process applied: ``{"mm_dtype_registered": bool, "intel_gpu_error_defined": bool}``."""
    return dict(_STATE)


install()
