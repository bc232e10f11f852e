"""Compile Triton/TLX/Helion kernels for sm_90 on a machine without a GPU.

``install(90)`` makes Triton believe a CUDA device of compute capability 9.0 is active; ``kernel.warmup(...)``
then compiles to PTX/cubin with the real argument binding and never launches. This is the CPU CI check for TLX
(which has no interpreter) and the PTX check for Triton and Helion. It catches API misuse, shared-memory
over-allocation and missing Hopper instructions; it does not catch races, deadlocks or wrong numerics.

Imports triton lazily: call it only inside a worker or test process of the right environment.
"""

from __future__ import annotations

import re

SMEM_LIMIT_BYTES = 232448  # per-block opt-in shared memory on H100/H200 (227 KB)

# PTX markers we assert on; counted by `ptx_markers`.
PTX_MARKERS = {
    "wgmma": "wgmma.mma_async",
    "tma_load": "cp.async.bulk.tensor",
    "mbarrier": "mbarrier",
    "setmaxnreg": "setmaxnreg",
    "cp_async": "cp.async.ca",
    "mapa": "mapa",
}


def install(arch: int = 90) -> None:
    """Activate a fake CUDA driver targeting ``sm_<arch>`` for the rest of this process. Never at the import of a
    test module that shares its process with GPU tests (they would launch through the fake driver): call it in a
    subprocess script or only when ``torch.cuda.is_available()`` is False (tests/test_compile_only_hygiene.py)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class _CompileOnlyDriver(DriverBase):
        def __init__(self):
            self.target = GPUTarget("cuda", arch, 32)

        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            from triton.backends.nvidia.driver import ty_to_cpp

            return ty_to_cpp(ty)

        def get_current_target(self):
            return self.target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def set_current_device(self, device):
            pass

        def get_device_capability(self, device=None):
            return (arch // 10, arch % 10)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_benchmarker(self):
            raise RuntimeError("the compile-only driver cannot benchmark")

    triton.runtime.driver.set_active(_CompileOnlyDriver())


def ptx_code(ptx: str) -> str:
    """The PTX text without its debug information (``.loc``/``.file`` lines, DWARF ``.section .debug_*``), for
    comparing two compiles: the debug parts name the source file's absolute path, which differs between a checkout
    and a Triton cache entry compiled from another checkout of the same source."""
    return re.sub(r"[ \t]*\.(loc|file)\b[^\n]*\n?", "", ptx.split(".section\t.debug")[0])


def summarize(compiled) -> dict:
    """Turn a triton ``CompiledKernel`` into a JSON-able summary: PTX marker counts, shared bytes, warps."""
    ptx = compiled.asm["ptx"]
    md = compiled.metadata
    return {
        "ptx_markers": {k: ptx.count(v) for k, v in PTX_MARKERS.items()},
        "shared_bytes": int(md.shared),
        "num_warps": int(md.num_warps),
        "smem_ok": int(md.shared) <= SMEM_LIMIT_BYTES,
        "cluster_dims": list(getattr(md, "cluster_dims", ()) or ()),
    }


class WarmupLauncher:
    """Drop-in for Helion's ``_launcher=``: compiles and keeps the CompiledKernel in ``.last``; never launches."""

    def __init__(self):
        self.last = None

    def __call__(self, kernel, grid, *args, num_warps, num_stages, **kw):
        self.last = kernel.warmup(*args, grid=grid, num_warps=num_warps, num_stages=num_stages, **kw)
        return self.last
