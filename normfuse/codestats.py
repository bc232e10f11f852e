"""Registers, spills, shared memory and SASS size of compiled kernels, on a machine without a GPU.

A kernel is compiled for sm_90a through the repository's compile-only path (``normfuse.compile_only``: the fake
sm_90 driver; each ``kernels_<dsl>/<technique>.py`` has a ``compile_sm90`` that the sweep's ``compile_only`` mode
calls), and every ``CompiledKernel`` it produces is read back:

* ``ptxas -v`` on the kernel's PTX (the ptxas of the installed triton / fbtriton, with the same ``--gpu-name``,
  ``--fmad`` and extra options Triton used): registers per thread, spill store / load bytes, stack frame bytes;
* ``cuobjdump -sass`` of the kernel's own cubin: instruction count (``sass_kb`` = instructions x 16 bytes, the
  Hopper encoding), static local-memory instructions (``LDL`` / ``STL``, spills and stack arrays), ``HGMMA``;
* Triton's metadata: shared memory bytes, warps, cluster dims.

Needs triton (upstream or fbtriton) at call time, never at import. Command line, run in the DSL's environment
(``.venv`` for triton / helion, ``.venv-tlx`` for tlx); one JSON line per compiled kernel on stdout::

    python -m normfuse.codestats '[{"dsl": "triton", "technique": "norms", "impl": "norm", "variant": "rmsnorm",
                                    "M": 4096, "N": 4096, "K": null, "config": {"BLOCK_N": 8192}, "config_name": "x"}]'

``tools/fna_regs.py`` and ``experiments/compare_dsls.py`` use it.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SASS_BYTES_PER_INSTRUCTION = 16  # sm_90 instructions are 128 bits
STAT_COLUMNS = ("regs", "spill_st", "spill_ld", "stack", "smem", "STL", "LDL", "hgmma", "sass_instr", "sass_kb",
                "warps", "cluster")


def _ptxas_flags(compiled) -> list[str]:
    md = compiled.metadata
    flags = [] if getattr(md, "enable_fp_fusion", True) else ["--fmad=false"]
    extra = getattr(md, "ptx_options", None)
    return flags + (extra.split() if extra else [])


def ptxas_stats(compiled, arch: int = 90) -> dict:
    """Statistics of one Triton ``CompiledKernel`` (upstream triton, fbtriton, or Helion's generated kernel).

    Args:
        compiled: the object ``kernel.warmup(...)`` returns under ``normfuse.compile_only.install(arch)``; its
            ``asm`` must hold ``ptx`` and ``cubin``.
        arch: compute capability as an int (90: ptxas is run with ``--gpu-name=sm_90a``).

    Returns:
        ``{regs, spill_st, spill_ld, stack}`` (registers per thread; bytes) from ``ptxas -v``; ``{STL, LDL, hgmma,
        sass_instr, sass_kb}`` from the SASS of the kernel's cubin (counts; KiB); ``{smem, warps, cluster}``
        (shared bytes, warps per CTA, CTAs per cluster) from Triton's metadata. Without a ``cuobjdump`` beside
        ptxas the SASS fields are None.

    Raises:
        TypeError: ``compiled`` has no PTX (not a compiled Triton kernel).
        RuntimeError: ptxas failed (its log's tail in the message) or printed no register count.
    """
    from triton.backends.nvidia.compiler import get_ptxas

    asm = getattr(compiled, "asm", None)
    if not isinstance(asm, dict) or "ptx" not in asm:
        raise TypeError(f"expected a compiled Triton kernel with asm['ptx'], got {type(compiled).__name__}")
    ptxas = get_ptxas(arch).path
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.o"
        src.write_text(asm["ptx"])
        p = subprocess.run([ptxas, "-v", *_ptxas_flags(compiled), f"--gpu-name={gpu}", str(src), "-o", str(out)],
                           capture_output=True, text=True)
        log = p.stdout + p.stderr
        if p.returncode:
            raise RuntimeError(f"ptxas failed (rc={p.returncode}): {log[-2000:]}")
        sass = None
        if cuobjdump_path(arch) is not None:
            sass = cuobjdump(asm["cubin"] if isinstance(asm.get("cubin"), bytes) else out.read_bytes(), arch=arch,
                             check=False)
    regs = re.search(r"Used (\d+) registers", log)
    if regs is None:
        raise RuntimeError(f"ptxas printed no register count: {log[-1000:]}")
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    md = compiled.metadata
    cluster = 1
    for d in (getattr(md, "cluster_dims", None) or ()):
        cluster *= int(d)
    row = dict(regs=int(regs.group(1)), spill_st=int(spills.group(1)) if spills else 0,
               spill_ld=int(spills.group(2)) if spills else 0, stack=int(stack.group(1)) if stack else 0,
               smem=int(md.shared), warps=int(md.num_warps), cluster=cluster)
    if sass is None:
        return row | dict(STL=None, LDL=None, hgmma=None, sass_instr=None, sass_kb=None)
    n_instr = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, flags=re.M))
    return row | dict(STL=len(re.findall(r"\bSTL\b", sass)), LDL=len(re.findall(r"\bLDL\b", sass)),
                      hgmma=len(re.findall(r"\bHGMMA\b", sass)), sass_instr=n_instr,
                      sass_kb=round(SASS_BYTES_PER_INSTRUCTION * n_instr / 1024, 1))


def cuobjdump_path(arch: int = 90) -> Path | None:
    """The ``cuobjdump`` beside the installed Triton's ptxas (None when it has none)."""
    from triton.backends.nvidia.compiler import get_ptxas

    path = Path(get_ptxas(arch).path).parent / "cuobjdump"
    return path if path.exists() else None


def cuobjdump(cubin: bytes, flag: str = "-sass", arch: int = 90, check: bool = True) -> str:
    """``cuobjdump <flag>`` (``-sass``: the SASS; ``-elf``: the ELF sections and attributes) of a cubin's bytes, with
    the cuobjdump beside the installed Triton's ptxas. RuntimeError when there is none; ``check``: CalledProcessError
    when cuobjdump fails (else its stdout as it is)."""
    tool = cuobjdump_path(arch)
    if tool is None:
        raise RuntimeError("no cuobjdump beside the installed Triton's ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(tool), flag, str(path)], capture_output=True, text=True, check=check).stdout


def _ptxas_run(ptx: str, arch: int, cubin: Path, timeout_s: float | None):
    """``ptxas -v -arch=sm_<arch>a`` on PTX text (the installed Triton's ptxas), its cubin written to ``cubin``."""
    from triton.backends.nvidia.compiler import get_ptxas

    src = cubin.with_suffix(".ptx")
    src.write_text(ptx)
    return subprocess.run([get_ptxas(arch).path, f"-arch=sm_{arch}a", "-v", str(src), "-o", str(cubin)],
                          capture_output=True, text=True, timeout=timeout_s)


def ptxas_log(ptx: str, arch: int = 90, timeout_s: float = 300) -> tuple[int, str]:
    """``(return code, log)`` of ``ptxas -v`` on PTX text for ``sm_<arch>a`` (the installed Triton's ptxas; the
    cubin is discarded): for checks of registers, spills or ptxas warnings (e.g. C7515, wgmma serialization) of a
    kernel compiled on the CPU."""
    with tempfile.TemporaryDirectory() as tmp:
        p = _ptxas_run(ptx, arch, Path(tmp) / "k.cubin", timeout_s)
    return p.returncode, p.stdout + p.stderr


def ptxas_info(ptx: str, arch: int = 90, timeout_s: float = 300) -> dict:
    """``ptxas_log``'s ``{registers, spill_stores, spill_loads}`` (count per thread; bytes), None where the log has
    no such line (e.g. ptxas failed) — the compile-only summaries of the kernels (``compile_sm90(..., ptxas=True)``)
    report it as is."""
    log = ptxas_log(ptx, arch, timeout_s)[1]

    def grab(pattern):
        m = re.search(pattern, log)
        return int(m.group(1)) if m else None

    return {"registers": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads")}


def ptx_to_sass(ptx: str, arch: int = 90) -> tuple[str, str]:
    """``(ptxas -v log, cuobjdump SASS)`` of PTX text compiled for ``sm_<arch>a`` with the installed Triton's ptxas
    (for tests that read the machine code of a kernel compiled on the CPU). RuntimeError when ptxas fails (its log's
    tail in the message) or no cuobjdump sits beside it."""
    if cuobjdump_path(arch) is None:
        raise RuntimeError("no cuobjdump beside the installed Triton's ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        p = _ptxas_run(ptx, arch, cubin, None)
        log = p.stdout + p.stderr
        if p.returncode:
            raise RuntimeError(f"ptxas failed (rc={p.returncode}): {log[-2000:]}")
        return log, cuobjdump(cubin.read_bytes(), arch=arch)


def spill_store_bytes(log: str) -> int:
    """Spill-store bytes in a ``ptxas -v`` log; RuntimeError when the log has no spill line."""
    m = re.search(r"(\d+) bytes spill stores", log)
    if m is None:
        raise RuntimeError(f"no spill line in the ptxas log: {log[-1000:]}")
    return int(m.group(1))


def sass_inner_loops(sass: str, marker: str = "HGMMA") -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """``(instructions [(address, text)], loops [(start, end)])`` of cuobjdump SASS: the innermost loops (a loop =
    the address range of a backward branch) that hold an instruction containing ``marker`` (default ``HGMMA``:
    the wgmma loops of a Hopper kernel), in program order."""
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    marked = [a for a, t in ins if marker in t]
    loops = []
    for a, t in ins:
        b = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", t)
        if b and int(b.group(1), 16) < a and any(int(b.group(1), 16) <= h <= a for h in marked):
            loops.append((int(b.group(1), 16), a))
    inner = [(s, e) for s, e in loops if not any((s, e) != (s2, e2) and s <= s2 and e2 <= e for s2, e2 in loops)]
    return ins, sorted(inner)


@contextlib.contextmanager
def capture_compiled():
    """Collect every ``CompiledKernel`` that a ``compile_sm90`` call summarizes while the block runs.

    Every ``kernels_<dsl>/<technique>.compile_sm90`` passes each kernel it compiles (the main kernel, then any
    pre-pass or second pass) to ``normfuse.compile_only.summarize``, imported at call time; this wraps that
    function for the duration of the block, in order, without changing what it returns::

        with capture_compiled() as kernels:
            mod.compile_sm90(op, *inputs, eps=eps, config=config)
        stats = [ptxas_stats(k) for k in kernels]
    """
    from normfuse import compile_only

    seen: list = []
    original = compile_only.summarize

    def recording(compiled):
        seen.append(compiled)
        return original(compiled)

    compile_only.summarize = recording
    try:
        yield seen
    finally:
        compile_only.summarize = original


def kernel_name(compiled) -> str:
    """The compiled kernel's function name (Triton's ``metadata.name``)."""
    return str(getattr(compiled, "name", None) or getattr(compiled.metadata, "name", "?"))


def compile_stats(dsl: str, technique: str, impl: str, variant: str | None, M: int, N: int, K: int | None,
                  config: dict, *, dtype: str = "bf16", eps: float = 1e-6, arch: int = 90) -> list[dict]:
    """Compile ``impl`` of ``technique`` in ``dsl`` at one shape for sm_90a, exactly as the sweep's
    ``compile_only`` mode does (``spec.compile_inputs(M, N, K, dtype)`` and ``mod.compile_sm90(op, ..., eps,
    config)``), and return one :func:`ptxas_stats` dict per compiled kernel, with ``kernel`` (its name) and
    ``compile_s`` (wall seconds of the whole ``compile_sm90`` call, on the first kernel; cold unless Triton's
    on-disk cache held it).

    Installs the fake sm_90 driver for the rest of the process (``normfuse.compile_only.install``); run it in a
    process of the DSL's environment without ``TRITON_INTERPRET`` / ``HELION_INTERPRET``. Raises what the
    kernel's ``compile_sm90`` raises for a config it rejects (ValueError / TypeError), and RuntimeError when the
    call compiled no kernel."""
    from normfuse import compile_only, registry
    from normfuse.techniques import get_technique

    compile_only.install(arch)
    spec = get_technique(technique)
    mod = registry.kernel_module(dsl, technique)
    op = spec.kernel_function_name(impl, variant)
    t0 = time.perf_counter()
    with capture_compiled() as kernels:
        mod.compile_sm90(op, *spec.compile_inputs(M, N, K, dtype), eps=eps, config=config)
    seconds = time.perf_counter() - t0
    if not kernels:
        raise RuntimeError(f"{dsl} {technique}.compile_sm90({op!r}) compiled no kernel")
    rows = []
    for i, ck in enumerate(kernels):
        rows.append(dict(kernel=kernel_name(ck), compile_s=round(seconds, 3) if i == 0 else None,
                         **ptxas_stats(ck, arch)))
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m normfuse.codestats JOBS_JSON``: a JSON list of jobs (keys of :func:`compile_stats` plus any
    labels, e.g. ``config_name``). Prints one JSON line per compiled kernel: the job's labels, then the stats, or
    ``error`` ("Type: message") for a job that failed; later jobs still run."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m normfuse.codestats JOBS_JSON  (a JSON list; see the module docstring)")
    jobs = json.loads(argv[0])
    keys = ("dsl", "technique", "impl", "variant", "M", "N", "K", "config")
    for job in jobs:
        label = {k: v for k, v in job.items() if k != "config"}
        try:
            rows = compile_stats(*(job.get(k) for k in keys), dtype=job.get("dtype", "bf16"),
                                 eps=float(job.get("eps", 1e-6)))
        except Exception as e:  # noqa: BLE001  (a reported row, not a crash of the batch)
            rows = [dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")]
        for row in rows:
            print(json.dumps(label | row), flush=True)


if __name__ == "__main__":
    main()
