"""Run the GPU tests (``-m gpu``) one pytest process per test, several at once (GPU host only).

The GPU tests are dominated by kernel compilation (CPU-bound, one core per process), so running them side by side
on a many-core host shortens the wall time several-fold; the kernels share the GPU, which only matters for timing,
and nothing here is timed. Upstream tests run under this interpreter, tests/tlx under the TLX interpreter
(``$GPUBUNDLE_FBTRITON`` first on PYTHONPATH, as ``make test-gpu`` does).

    python3 tools/gpu_tests_parallel.py --jobs 8 --timeout 300 [-k EXPR] --log-dir LOGS

Writes one log per test under ``LOGS/tests/`` and prints one line per test (PASSED / SKIPPED / FAILED / ERROR /
TIMEOUT, seconds, node id) as each finishes, then a summary; exits 1 when any test did not pass.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path


def _tlx_env() -> dict:
    env = dict(os.environ)
    parts = [env.get("GPUBUNDLE_FBTRITON", ""), env.get("GPUBUNDLE_SITE", ""), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = ":".join(p for p in parts if p)
    return env


def collect(tlx: bool, k: str | None) -> list[str]:
    """Node ids of the GPU tests in tests/tlx (``tlx``) or in the other test folders."""
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    args += ["tests/tlx"] if tlx else ["tests", "--ignore=tests/tlx"]
    if k:
        args += ["-k", k]
    out = subprocess.run(args, capture_output=True, text=True, env=_tlx_env() if tlx else None).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def run_one(node: str, tlx: bool, timeout: float, log_dir: Path) -> tuple[str, float, str]:
    t0 = time.time()
    log = log_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", node)[-150:] + ".log")
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", "-m", "gpu", node]
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_tlx_env() if tlx else None)
        log.write_text(p.stdout + p.stderr)
        tail = (p.stdout.strip().splitlines() or [""])[-1]
        status = "PASSED" if p.returncode == 0 else ("FAILED" if p.returncode == 1 else f"ERROR(rc={p.returncode})")
        if status == "PASSED" and "passed" not in tail:  # e.g. "1 skipped": no CUDA device
            status = "SKIPPED"
    except subprocess.TimeoutExpired as e:
        log.write_text((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
        status = "TIMEOUT"
    return status, time.time() - t0, node


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per test")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--log-dir", type=Path, required=True)
    a = ap.parse_args(argv)
    (a.log_dir / "tests").mkdir(parents=True, exist_ok=True)
    todo = [(n, False) for n in collect(False, a.k)] + [(n, True) for n in collect(True, a.k)]
    print(f"{len(todo)} GPU tests, {a.jobs} at a time", flush=True)
    results = []
    with ThreadPoolExecutor(a.jobs) as pool:  # printed as they finish: a budget cut keeps every finished line
        futures = [pool.submit(run_one, n, tlx, a.timeout, a.log_dir / "tests") for n, tlx in todo]
        for fut in as_completed(futures):
            status, secs, node = fut.result()
            print(f"{status:8s} {secs:6.0f} s  {node}", flush=True)
            results.append(status)
    bad = sum(s != "PASSED" for s in results)
    print(f"{len(results) - bad} passed, {bad} not passed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
