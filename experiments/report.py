"""Re-derive a run's tables, plots and summary from its results.jsonl:
``python -m experiments.report results/lazy_prenorm_blog/<run_id> [...]``."""

import argparse
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dirs", nargs="+", type=Path, help="run folders holding results.jsonl")
    args = ap.parse_args(argv)
    from rich.console import Console

    from normfuse.sweep import finalize

    for d in args.run_dirs:
        if not (d / "results.jsonl").exists():
            raise SystemExit(f"{d} has no results.jsonl")
        finalize(d, console=Console())


if __name__ == "__main__":
    main()
