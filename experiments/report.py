"""Re-derive a run's tables, plots and summary from its results.jsonl, or compare replicate runs.

    python -m experiments.report results/lazy_prenorm_blog/<run_id> [...]
    python -m experiments.report --replicates results/lazy_prenorm_blog/<run_a> results/lazy_prenorm_blog/<run_b>

``--replicates`` prints (and writes next to the runs as ``replicates.md``, or to ``--out``) each run's primary
metric per cell (% hidden; fna_llm: % of SDPA; fna: saving), the mean, and the spread of identical points' p50
across the runs, e.g.

    python -m experiments.report --replicates results/fna_llm/20261130_h200 results/fna_llm_rep/20261130_h200_rep2 \
        results/fna_llm_rep/20261130_h200_rep3 --out results/fna_llm_rep/replicates.md
"""

import argparse
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", type=Path, help="run folders holding results.jsonl")
    ap.add_argument("--replicates", action="store_true", help="compare replicate runs of one technique")
    ap.add_argument("--out", type=Path, default=None, help="with --replicates: the markdown file to write "
                    "(default: replicates.md next to the first run)")
    args = ap.parse_args(argv)
    for d in args.run_dirs:
        if not (d / "results.jsonl").exists():
            raise SystemExit(f"{d} has no results.jsonl")
    from rich.console import Console

    from normfuse.report import replicates
    from normfuse.sweep import finalize

    if args.replicates:
        text = replicates(args.run_dirs)
        (args.out or args.run_dirs[0].parent / "replicates.md").write_text(text)
        print(text)
        return
    for d in args.run_dirs:
        finalize(d, console=Console())


if __name__ == "__main__":
    main()
