"""Console entry points declared in pyproject.toml (``pip install -e .`` puts them on PATH).

    normfuse-run [hydra overrides]      = python -m experiments.run      (a sweep; e.g. experiment=norms_smoke)
    normfuse-report RUN_DIR [...]       = python -m experiments.report   (re-derive a run's tables and plots)
    normfuse-compare [--out DIR] [...]  = python -m experiments.compare_dsls   (the DSL side-by-side report)

Each one runs the module as ``__main__`` would, with the command line unchanged, so behaviour (and Hydra's
config search path, which for ``__main__`` is the file's ``../configs``) is that of ``python -m``. They need an
editable install: the configs and results live in the clone (``normfuse.pool.REPO_ROOT``), which a non-editable
wheel does not carry; :func:`repo_root` says so instead of failing later with a missing-config error.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def repo_root() -> Path:
    """The clone that this ``normfuse`` was imported from: the folder holding ``configs/`` and ``results/``.

    Raises SystemExit with the fix when ``configs/`` is not beside the package (a non-editable wheel install)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "configs" / "config.yaml").is_file():
        raise SystemExit(f"error: no configs/config.yaml beside the normfuse package ({root}): normfuse reads its "
                         "Hydra configs and writes results inside its git clone, so install it editable "
                         "(`pip install -e <clone>`), or run `python -m experiments.run` from the clone")
    return root


def _run_module(module: str) -> None:
    repo_root()
    sys.argv[0] = module
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def run() -> None:
    """``normfuse-run``: the Hydra sweep (``experiments.run``)."""
    _run_module("experiments.run")


def report() -> None:
    """``normfuse-report``: tables, plots and summary of a run folder (``experiments.report``)."""
    _run_module("experiments.report")


def compare() -> None:
    """``normfuse-compare``: the DSL side-by-side report (``experiments.compare_dsls``)."""
    _run_module("experiments.compare_dsls")
