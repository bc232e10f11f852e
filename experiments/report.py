"""Re-derive a run's tables and figures, or merge replicate runs. Prints by default; writes only where asked.

    python -m experiments.report RUN [RUN ...]             print each run's summary (nothing written)
    python -m experiments.report RUN --out DIR             write summary.md, plots/, paired.parquet into DIR
                                                           (DIR/<experiment>/<run>/ for several runs)
    python -m experiments.report RUN --write               regenerate the run in place: results.parquet/.csv,
                                                           paired.parquet, summary.md, plots/
    python -m experiments.report TOP                       TOP holds rep0/, rep1/, ... (replicates=N): print the
                                                           replicate report (per-replicate medians, pooled
                                                           intervals, agreement, the issue-12 criteria)
    python -m experiments.report TOP --write               ... and write the merged outputs into TOP
                                                           (replicates.md, paired_replicates.parquet,
                                                           replicate_criteria.parquet, plots/) and re-derive each
                                                           rep<k>/ in place
    python -m experiments.report --replicates RUN_A RUN_B ...   the same for separate runs (runs with paired timing;
                                                           older runs: each run's best primary metric and the p50
                                                           spread). Prints; --out FILE.md or DIR writes the report
                                                           there, --write writes replicates.md next to the first run
    python -m experiments.report RUN --resolution 0.005    verdicts of the ratio metrics (x torch.compile, x unfused,
                                                           % of SDPA, GB/s, TFLOP/s) from intervals widened to at least
                                                           ±0.5 % of the median (the A/A resolution; default 0)

A committed run's results.jsonl, results.parquet/.csv and meta.json are never modified without --write
(results.jsonl and meta.json not even then), e.g.

    python -m experiments.report --replicates results/fna_llm/20261130_h200 results/fna_llm_rep/20261130_h200_rep2 \\
        results/fna_llm_rep/20261130_h200_rep3 --out results/fna_llm_rep/replicates.md
"""

import argparse
from pathlib import Path


def _kind(d: Path) -> str:
    """'run' (a run folder), 'replicated' (a folder of rep<k>/ runs); SystemExit otherwise."""
    from normfuse.paired import replicate_dirs

    if (d / "results.jsonl").exists():
        return "run"
    if replicate_dirs(d):
        return "replicated"
    raise SystemExit(f"{d} has no results.jsonl and no rep<k>/ run folders")


def _replicates(dirs: list, out: Path | None, write: bool, resolution: float = 0.0) -> None:
    from normfuse import report
    from normfuse.paired import rounds_path

    if all(rounds_path(d) is not None for d in dirs):
        if out is not None and out.suffix == ".md":
            text = report.replicate_report(dirs, resolution=resolution)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text + "\n")
            print(text)
        elif out is not None or write:
            report.write_replicates(dirs, out if out is not None else Path(dirs[0]).parent, console=True,
                                    resolution=resolution)
        else:
            print(report.replicate_report(dirs, resolution=resolution))
        return
    for d in dirs:
        if not (Path(d) / "results.parquet").exists():
            raise SystemExit(f"{d} has no results.parquet (re-derive it with --write first)")
    text = report.replicates(dirs)
    target = out if out is None or out.suffix == ".md" else out / "replicates.md"
    if write and target is None:
        target = Path(dirs[0]).parent / "replicates.md"
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", type=Path, help="run folders (results.jsonl) or folders of rep<k>/ runs")
    ap.add_argument("--replicates", action="store_true", help="the run folders are replicates of one technique")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None, help="write the derived outputs into this folder (or, "
                       "with --replicates, this .md file) instead of only printing them")
    where.add_argument("--write", action="store_true", help="regenerate the derived files of the run(s) in place "
                       "(results.parquet/.csv, paired.parquet, summary.md, plots/; merged replicate outputs)")
    ap.add_argument("--resolution", type=float, default=0.0, metavar="R",
                    help="relative timing resolution for the verdicts of ratio metrics (fraction, e.g. 0.005 = "
                    "±0.5 %%: each pooled interval is widened to at least median × (1 ± R)); default 0")
    args = ap.parse_args(argv)
    from normfuse import report
    from normfuse.paired import check_resolution, replicate_dirs

    try:
        res = check_resolution(args.resolution, "--resolution")
    except ValueError as e:
        ap.error(str(e))

    if args.replicates:
        for d in args.run_dirs:
            if _kind(d) != "run":
                raise SystemExit(f"--replicates takes run folders; {d} is a folder of replicates (pass it alone)")
        _replicates(args.run_dirs, args.out, args.write, res)
        return
    several = len(args.run_dirs) > 1
    for d in args.run_dirs:
        out = None if args.out is None else (args.out / d.resolve().parent.name / d.name if several else args.out)
        if _kind(d) == "replicated":
            reps = replicate_dirs(d)
            for r in reps:
                if args.write:  # a replicate gets no plots of its own (as the runner writes it): the merged set has them
                    report.derive(r, out_dir=r, write_tables=True, plots=False, resolution=res)
                elif out is not None:
                    report.derive(r, out_dir=out / r.name, plots=False, resolution=res)
            _replicates(reps, out, args.write, res) if (out is not None or args.write) else print(
                report.replicate_report(reps, resolution=res))
            continue
        if args.write:
            report.derive(d, out_dir=d, write_tables=True, console=True, resolution=res)
        else:
            report.derive(d, out_dir=out, console=True, resolution=res)


if __name__ == "__main__":
    main()
