"""Hygiene of the compile-only path.

No test module may install the fake compile-only driver (``normfuse.compile_only.install``) at import time
unconditionally: pytest imports every collected module into one process, so the GPU tests collected with it would
then launch kernels through the fake driver (this broke the TLX fna / fna_llm GPU tests on the H200 once). Calls
inside subprocess scripts (string literals) or under a ``torch.cuda.is_available()`` guard are fine. PTX compared
between two compiles is compared without its debug info (``ptx_code``), which names the checkout's path."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _module_level_installs(path: Path) -> list[int]:
    """Line numbers of ``compile_only.install(...)`` calls executed at import of ``path``: module-level statements,
    not inside a function, a class or an ``if`` on ``torch.cuda.is_available()``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []

    def visit(stmts, guarded):
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(st, ast.If):
                g = guarded or "is_available" in ast.unparse(st.test)
                visit(st.body, g)
                visit(st.orelse, guarded)
                continue
            for node in ast.walk(st):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "install"
                        and "compile_only" in ast.unparse(node.func.value) and not guarded):
                    lines.append(node.lineno)

    visit(tree.body, False)
    return lines


def test_no_unguarded_compile_only_install_at_import():
    offenders = {str(p.relative_to(TESTS)): ln for p in sorted(TESTS.rglob("test_*.py"))
                 if (ln := _module_level_installs(p))}
    assert not offenders, f"compile_only.install() at import time (move it into a subprocess script or guard it): {offenders}"


def test_checker_catches_an_unguarded_install(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text("from normfuse import compile_only\ncompile_only.install(90)\n")
    good = tmp_path / "test_good.py"
    good.write_text("import torch\nfrom normfuse import compile_only\nif not torch.cuda.is_available():\n"
                    "    compile_only.install(90)\nS = '''\ncompile_only.install(90)\n'''\n")
    assert _module_level_installs(bad) == [2]
    assert _module_level_installs(good) == []



_KERNEL = '''import triton, triton.language as tl

@triton.jit
def _scale(x_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < N) * 2.0, mask=offs < N)
'''

_COMPILE = '''import sys, torch
from normfuse import compile_only
compile_only.install(90)
sys.path.insert(0, sys.argv[1])
import k
print(k._scale.warmup(torch.empty(1024), 1024, BLOCK=256, grid=(4,)).asm["ptx"])
'''


def test_ptx_code_ignores_the_source_path(tmp_path):
    """The same kernel compiled from two checkouts gives PTX that differs in its debug info (the source path) only:
    ``ptx_code`` compares equal and still holds the instructions. (A CI run compared a Triton-cache entry compiled
    from another checkout with a fresh compile and failed on the path.)"""
    import os
    import subprocess
    import sys

    from normfuse.compile_only import ptx_code
    ptx = []
    for name in ("a", "another_checkout"):
        d = tmp_path / name
        d.mkdir()
        (d / "k.py").write_text(_KERNEL)
        env = {**os.environ, "TRITON_CACHE_DIR": str(d / "cache"),
               "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
        p = subprocess.run([sys.executable, "-c", _COMPILE, str(d)], capture_output=True, text=True, env=env,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        ptx.append(p.stdout)
    assert ptx[0] != ptx[1] and "another_checkout" in ptx[1]
    assert ptx_code(ptx[0]) == ptx_code(ptx[1])
    assert "st.global" in ptx_code(ptx[0]) and ".loc" not in ptx_code(ptx[0]) and "checkout" not in ptx_code(ptx[1])
