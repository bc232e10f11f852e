"""Test helpers shared by the three DSLs' CPU tests (importable in both environments: torch + pytest only)."""

from __future__ import annotations

import pytest
import torch


def assert_rejects_bad_inputs(fn, dtype: torch.dtype, bad_config: dict) -> None:
    """Every kernel entry point (``fn(a, b, config=...)``) must reject bad inputs with a TypeError/ValueError
    naming the constraint: mixed or unsupported dtypes, non-tensors, wrong rank, mismatched K, non-contiguous
    inputs, K or N not a multiple of 8, and an invalid tiling ``bad_config`` (a power-of-2 violation)."""
    a, b = torch.randn(16, 16).to(dtype), torch.randn(16, 16).to(dtype)
    with pytest.raises(TypeError):  # mixed dtypes
        fn(a, b.to(torch.float32 if dtype != torch.float32 else torch.float16))
    with pytest.raises(TypeError):  # unsupported dtype
        fn(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(TypeError):  # not a tensor
        fn(a.float().numpy(), b)
    with pytest.raises(ValueError):  # rank
        fn(a[None], b)
    with pytest.raises(ValueError, match="inner dimensions"):
        fn(a, torch.randn(24, 16).to(dtype))
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(32, 16).to(dtype)[::2], b)
    with pytest.raises(ValueError, match="multiple of 8"):  # K (16-byte TMA rows)
        fn(torch.randn(16, 12).to(dtype), torch.randn(12, 16).to(dtype))
    with pytest.raises(ValueError, match="multiple of 8"):  # N
        fn(a, torch.randn(16, 20).to(dtype))
    with pytest.raises(ValueError, match="power(s)? of (2|two)"):  # bad tiling through the public function
        fn(a, b, config=bad_config)


def run_python_json(code: str, *argv: str, env: dict | None = None, timeout: float = 300):
    """Run ``code`` (dedented) with ``argv`` in a fresh interpreter at the repository root and return the JSON
    value printed on its last stdout line; fail the calling test with stdout/stderr if it exits non-zero.

    Interpreter switches are process-wide and read at import, hence the fresh process: ``TRITON_INTERPRET`` and
    ``HELION_INTERPRET`` are cleared unless ``env`` sets them (e.g. ``env={"TRITON_INTERPRET": "1"}``)."""
    import json
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([root] + ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else []))
    full.pop("TRITON_INTERPRET", None)
    full.pop("HELION_INTERPRET", None)
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], cwd=root, env=full,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed (rc={proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}\n"
                    f"--- stderr\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
