"""Issue 13's three fna_llm targets, per cell, from a paired run of the QK-norm attention grid.

Reads ``<run>/paired_replicates.parquet`` of a replicated run (``experiments.report <run> --write``: one row per
cell, dsl, impl and metric, the best config per DSL with the pooled median and 95 % bootstrap interval) or, for a
single run, its ``paired.parquet`` (the config with the highest median per cell, dsl, impl and metric), and prints,
per cell
(variant, S = M, B = N), for the best TLX entries:
- ``attention % of fastest SDPA`` (impl ``attention``, metric ``sdpa_fraction``; target >= 100 %),
- ``fused % of fastest SDPA`` (impl ``fused``, ``sdpa_fraction``; target >= 95 %),
- ``fused x (SDPA + norms)`` (impl ``fused``, ``speedup_vs_unfused`` = T(SDPA + compiled norms) / T(fused);
  target > 1),
- the fused config(s) chosen, and TFLOP/s of the fastest SDPA backend (faster of ``sdpa`` and ``sdpa_cudnn``), the
  attention and the fused kernel (pooled medians).
A target is *met* when the whole pooled interval is at or above it (``normfuse.paired.verdict``), *missed* when all
of it is below, else *not resolved*; bold marks met. ``--compare OTHER`` adds the medians of a second run;
``--resolution R`` widens every interval to at least median × (1 ± R) before the verdict (all three metrics are
ratios of times; 0.005 = the A/A resolution of the paired harness).

    .venv/bin/python -m tools.fna_llm_targets results/fna_llm_lazyq/20261202_h200 [--compare results/fna_llm_lazyq/20261201_h200] [--resolution 0.005]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from normfuse.paired import check_resolution, verdict
from normfuse.report import _ci_text

TARGETS = {  # column -> (impl, metric, target, shown in % (×100, 1 decimal) rather than as a ratio (3 decimals))
    "attention % of fastest SDPA": ("attention", "sdpa_fraction", 1.00, True),
    "fused % of fastest SDPA": ("fused", "sdpa_fraction", 0.95, True),
    "fused × (SDPA + norms)": ("fused", "speedup_vs_unfused", 1.0 + 1e-12, False),
}
NAN = float("nan")
CELL = ["variant", "M", "N"]


def load(run_dir: Path, dsl: str = "tlx") -> pd.DataFrame:
    """The fna_llm rows for ``dsl`` and the torch SDPA baselines of ``run_dir/paired_replicates.parquet``, else of
    ``run_dir/paired.parquet`` (best config per cell, dsl, impl and metric; ``configs`` = [its name]).
    Raises FileNotFoundError without either file, ValueError when there are no fna_llm rows of ``dsl``."""
    run_dir = Path(run_dir)
    path = run_dir / "paired_replicates.parquet"
    if path.exists():
        d = pd.read_parquet(path)
    elif (run_dir / "paired.parquet").exists():
        path = run_dir / "paired.parquet"
        d = pd.read_parquet(path)
        d = d.loc[d.groupby(["technique", *CELL, "dsl", "impl", "metric"], dropna=False)["median"].idxmax()]
        d = d.assign(configs=[[c] for c in d["config_name"]])
    else:
        raise FileNotFoundError(f"{run_dir}: no paired_replicates.parquet or paired.parquet (a paired run's folder; "
                                "a replicated run's merged file comes from `experiments.report <run> --write`)")
    d = d[(d["technique"] == "fna_llm") & d["dsl"].isin([dsl, "torch"])]
    if not (d["dsl"] == dsl).any():
        raise ValueError(f"{path}: no fna_llm rows for dsl={dsl!r}")
    return d


def targets(d: pd.DataFrame, resolution: float = 0.0) -> pd.DataFrame:
    """One row per cell: for each target column its pooled ``median``, ``ci_lo``, ``ci_hi`` and ``verdict``
    (``normfuse.paired.verdict`` with ``resolution``), the fused ``configs`` and ``tflops_sdpa`` /
    ``tflops_attention`` / ``tflops_fused`` (TFLOP/s, pooled medians)."""
    rows = []
    for (variant, S, B), g in d.groupby(CELL, sort=True):
        def one(impl, metric):
            r = g[(g["impl"] == impl) & (g["metric"] == metric)]
            return r.iloc[0] if len(r) else None
        row = {"variant": variant, "S": int(S), "B": int(B)}
        for col, (impl, metric, tgt, _) in TARGETS.items():
            r = one(impl, metric)
            med, lo, hi = (NAN, NAN, NAN) if r is None else (r["median"], r["ci_lo"], r["ci_hi"])
            row.update({f"{col}|median": med, f"{col}|ci_lo": lo, f"{col}|ci_hi": hi,
                        f"{col}|verdict": verdict(lo, hi, tgt, med, resolution)})  # no interval: "not resolved"
        sp = one("fused", "speedup_vs_unfused")
        row["configs"] = ", ".join(sorted(set(sp["configs"]))) if sp is not None else ""
        sdpa = [one(i, "tflops") for i in ("sdpa", "sdpa_cudnn")]
        row["tflops_sdpa"] = max((r["median"] for r in sdpa if r is not None), default=NAN)
        for impl in ("attention", "fused"):
            r = one(impl, "tflops")
            row[f"tflops_{impl}"] = r["median"] if r is not None else NAN
        rows.append(row)
    return pd.DataFrame(rows)


def counts(t: pd.DataFrame) -> dict:
    """target column -> {"met": n, "missed": n, "not resolved": n}."""
    return {col: {v: int((t[f"{col}|verdict"] == v).sum()) for v in ("met", "missed", "not resolved")}
            for col in TARGETS}


def markdown(t: pd.DataFrame, other: pd.DataFrame | None = None, resolution: float = 0.0) -> str:
    """The per-cell table (bold: met) and the tally; with ``other``, each cell's median there in parentheses;
    ``resolution`` > 0 adds a line saying the verdicts used it (the table shows the intervals as measured)."""
    def cell(r, col, o):
        pct = TARGETS[col][3]
        s = _ci_text(r[col + "|median"], r[col + "|ci_lo"], r[col + "|ci_hi"], pct)
        if r[f"{col}|verdict"] == "met":
            s = f"**{s}**"
        if o is not None:
            s += f" ({_ci_text(o[col + '|median'], None, None, pct).removesuffix(' [–]')})"  # the median alone
        return s
    idx = other.set_index(["variant", "S", "B"]) if other is not None else None
    head = ["variant, S, B", *TARGETS, "best fused config", "TFLOP/s: fastest SDPA / attention / fused"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in t.iterrows():
        o = idx.loc[(r["variant"], r["S"], r["B"])] if idx is not None and (r["variant"], r["S"], r["B"]) in idx.index else None
        name = f"{'non-causal' if r['variant'] == 'noncausal' else r['variant']}, {r['S']}, {r['B']}"
        tf = f"{r['tflops_sdpa']:.0f} / {r['tflops_attention']:.0f} / {r['tflops_fused']:.0f}"
        lines.append("| " + " | ".join([name, *(cell(r, c, o) for c in TARGETS), r["configs"], tf]) + " |")
    lines.append("")
    for col, c in counts(t).items():
        lines.append(f"- {col}: met {c['met']}, missed {c['missed']}, not resolved {c['not resolved']} of {len(t)}")
    if resolution > 0:
        lines.append(f"- verdicts (bold and tallies) with a timing resolution of ±{100 * resolution:g} %: each interval "
                     f"widened to at least median × (1 ± {resolution:g}); the table shows the intervals as measured")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="an fna_llm paired run folder (paired_replicates.parquet of a replicated run, else paired.parquet)")
    ap.add_argument("--compare", type=Path, default=None, help="a second run: its medians in parentheses")
    ap.add_argument("--dsl", default="tlx", help="the DSL whose best entries are judged (default tlx)")
    ap.add_argument("--resolution", type=float, default=0.0, metavar="R",
                    help="relative timing resolution (fraction, e.g. 0.005): intervals widened to median × (1 ± R)")
    a = ap.parse_args(argv)
    try:
        check_resolution(a.resolution, "--resolution")
    except ValueError as e:
        ap.error(str(e))
    try:
        t = targets(load(a.run, a.dsl), a.resolution)
        o = targets(load(a.compare, a.dsl), a.resolution) if a.compare else None
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    print(markdown(t, o, a.resolution))


if __name__ == "__main__":
    main()
