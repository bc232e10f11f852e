"""Tables and figures of a run: the summary (markdown, also printed) and the plots; the replicate report.

A run with paired timing (``normfuse.paired``: ``paired_rounds.jsonl``) is reported from its paired rounds: every
metric as ``median [lo, hi]`` (95 % bootstrap interval over rounds), the best DSL per cell with its interval, and
a verdict against the cell's target (``target``) that is "met" only when the whole interval is at or above it,
"missed" only when it is below, else "not resolved". The sweep stage (one p50 per config, used to choose the
configs that the paired stage re-times) follows as before. Runs without rounds render exactly as before.

``derive`` re-derives a run's outputs (metrics, ``paired.parquet``, ``summary.md``, ``plots/``) into the run or
another folder; ``experiments.report`` calls it, writing into a committed run only with ``--write``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from normfuse import metrics, paired as paired_mod, plots
from normfuse.techniques import get_technique

BLOG_M = 262144  # the blog's M: its tables are targets only at this M
# Targets (fractions) the results pages (docs/results/) compare against besides the specs' blog tables; a spec's own
# ``TARGETS`` ({metric: fraction}) wins. Verdicts use them only through ``paired.verdict`` (intervals, never medians
# alone).
TARGETS = {
    "fna_llm": {"sdpa_fraction": 0.90,        # "keeps >= 90 % of SDPA's TFLOP/s while doing the norms"
                "speedup_vs_unfused": 1.0},   # "faster than SDPA + separate norms"
    "lazy_prenorm": {"frac_cublas": 0.85},    # "each DSL's best GEMM >= 85 % of cuBLAS"
}
# metrics shown after the spec's primary one, when the run has them (a metric is a column of normfuse.metrics)
SECONDARY_METRICS = ("hidden_dsl", "hidden_best", "frac_cublas", "speedup_vs_unfused", "saving")


def _spec(df: pd.DataFrame):
    techs = df["technique"].dropna().unique()
    return get_technique(techs[0]) if len(techs) == 1 else None


def _blog_of(spec, variant=None) -> dict | None:
    """The spec's ``BLOG_HIDDEN_B200`` ({(K, N): %}) for ``variant`` when that is the variant the blog measured
    (``spec.BLOG_VARIANT``; any variant when the spec does not say); None otherwise."""
    if spec is None:
        return None
    blog_variant = getattr(spec, "BLOG_VARIANT", None)
    if variant is not None and blog_variant is not None and variant != blog_variant:
        return None
    blog = getattr(spec, "BLOG_HIDDEN_B200", None)
    if blog and all(isinstance(k, str) for k in blog):  # keyed by variant first (e.g. multi_cta)
        return blog.get(variant) if variant is not None else None
    return blog


def _blog(df: pd.DataFrame, variant=None) -> dict | None:
    """The technique's ``BLOG_HIDDEN_B200`` when the run has one technique and ``variant`` is the one the blog
    measured (``spec.BLOG_VARIANT``; any variant when the spec does not say)."""
    return _blog_of(_spec(df), variant)


def metric_label(spec, metric: str) -> str:
    """``metric``'s wording in tables: the technique's own (``spec.METRIC_LABELS``, e.g. fna_llm's "% of norm latency
    hidden" against attention, not a GEMM) or ``plots.metric_label``'s."""
    return (getattr(spec, "METRIC_LABELS", None) or {}).get(metric) or plots.metric_label(metric)


def primary_metric(spec) -> str:
    """The metric a technique is judged by: ``spec.PRIMARY_METRIC`` (``hidden_dsl`` when it names none)."""
    return getattr(spec, "PRIMARY_METRIC", None) or "hidden_dsl"


def target(spec, metric: str, variant, M, N, K) -> float | None:
    """The target of ``metric`` at one cell, as a fraction, or None: the blog's B200 value for the primary metric
    (``BLOG_SAVING_B200`` keyed by ``GRID_AXES`` for ``saving``; else ``BLOG_HIDDEN_B200`` at M = ``BLOG_M``, keyed
    by (K, N), for the blog's variant), else the fixed ``TARGETS`` of the technique (spec ``TARGETS`` first)."""
    if spec is None:
        return None
    if metric == primary_metric(spec):
        if metric == "saving":
            blog = getattr(spec, "BLOG_SAVING_B200", None) or {}
            dims = {"M": M, "N": N, "K": K}
            rows, cols = getattr(spec, "GRID_AXES", ("K", "N"))
            v = blog.get((_int(dims[rows]), _int(dims[cols])))
        else:
            blog = _blog_of(spec, variant) if _int(M) == BLOG_M else None
            v = (blog or {}).get((_int(K), _int(N)))
        if v is not None:
            return v / 100
    fixed = {**TARGETS.get(getattr(spec, "NAME", ""), {}), **(getattr(spec, "TARGETS", None) or {})}
    return fixed.get(metric)


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


def sweep_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The sweep stage's rows (``stage`` missing or ``"sweep"``); all rows of a run from before stages existed; the
    paired rows of a run measured with ``timing.paired.only`` (it has no sweep stage: each point's row is its
    paired row, timed over the window's rounds)."""
    if "stage" not in df:
        return df
    sweep = df[df["stage"].fillna("sweep") == "sweep"]
    return sweep if len(sweep) else df[df["stage"] == "paired"]


def _variants(df: pd.DataFrame) -> list:
    """The variants present in ``df`` (``[None]`` when there is no variant column or it is empty)."""
    if "variant" not in df or df["variant"].isna().all():
        return [None]
    return sorted(df["variant"].dropna().unique())


def _of_variant(df: pd.DataFrame, variant) -> pd.DataFrame:
    return df if variant is None else df[df["variant"] == variant]


def _timing(df: pd.DataFrame) -> str:
    """The timing method(s) of the timed rows ('do_bench', 'cudagraph_flush', ...)."""
    if "timing" not in df:
        return "do_bench"
    m = sorted({str(t).split(" ")[0] for t in df["timing"].dropna()})
    return "/".join(m) if m else "do_bench"


def _subtitle(df: pd.DataFrame, meta: dict, paired: pd.DataFrame | None = None) -> str:
    hw = meta.get("hardware_before") or {}
    gpu = hw.get("gpu_name", "?")
    pl = hw.get("power_limit_w")
    if paired is not None and len(paired):
        n = paired["n_rounds"]
        how = f"median of {_range_text(n.min(), n.max())} paired rounds, 95 % bootstrap intervals"
    else:
        how = f"p50 of {_timing(df)}"
    Ms = ", ".join(str(int(m)) for m in sorted(df["M"].unique()))
    return f"{gpu}" + (f" @ {pl:.0f} W" if pl else "") + f", M = {Ms}, bf16, {how}"


def _range_text(lo, hi) -> str:
    return f"{int(lo)}" if lo == hi else f"{int(lo)}–{int(hi)}"


def _metric_impl(p: pd.DataFrame, metric: str) -> str | None:
    """The DSL impl a metric is reported on: ``fused`` when the fused rows have it, else the first that does."""
    f = p[(p["metric"] == metric) & p["dsl"].isin(plots.DSL_ORDER)]
    if f.empty:
        return None
    return "fused" if (f["impl"] == "fused").any() else sorted(f["impl"].unique())[0]


def paired_cells(p: pd.DataFrame, metric: str, variant=None, rows: str = "K", cols: str = "N") -> pd.DataFrame:
    """Plot cells (``plots``' tidy frame: row, col, dsl, value, lo, hi) of ``metric`` from a ``paired.parquet``
    table (or ``paired.merge_replicates``' pooled table): per grid cell and DSL its (fused) row's median and 95 %
    interval; the highest median when a DSL has several rows (configs, replicates)."""
    impl = _metric_impl(p, metric)
    f = _of_variant(p[(p["metric"] == metric) & (p["impl"] == impl) & p["dsl"].isin(plots.DSL_ORDER)], variant)
    if f.empty:
        return pd.DataFrame(columns=["row", "col", "dsl", "value", "lo", "hi"])
    f = f.loc[f.groupby([rows, cols, "dsl"])["median"].idxmax()]
    return pd.DataFrame({"row": f[rows].to_numpy(), "col": f[cols].to_numpy(), "dsl": f["dsl"].to_numpy(),
                         "value": f["median"].to_numpy(), "lo": f["ci_lo"].to_numpy(), "hi": f["ci_hi"].to_numpy()})


def _sweep_cells(best: pd.DataFrame, metric: str, rows: str, cols: str) -> pd.DataFrame:
    return pd.DataFrame({"row": best[rows].to_numpy(), "col": best[cols].to_numpy(), "dsl": best["dsl"].to_numpy(),
                         "value": pd.to_numeric(best[metric], errors="coerce").to_numpy(), "lo": np.nan,
                         "hi": np.nan})


def _load_paired(run_dir: Path, paired) -> pd.DataFrame | None:
    if paired is None:
        paired = paired_mod.load(run_dir)
    return paired if paired is not None and len(paired) else None


def make_plots(df: pd.DataFrame, run_dir: Path, mode: str, meta: dict,
               paired: pd.DataFrame | None = None) -> list[Path]:
    """Write the run's figures into ``run_dir/plots`` (timing figures in GPU mode, the check map in CPU mode), each
    in full and one-column width (``plots.WIDTHS``). ``df``: the run's rows with metrics (sweep-stage rows are
    used); ``paired``: its ``paired.parquet`` table (None: read from / computed in ``run_dir`` when it has one;
    an empty frame: none): with it, the metric figures show the paired medians with 95 % error bars."""
    out = Path(run_dir) / "plots"
    df = sweep_rows(df)
    title = str(df["experiment"].dropna().iloc[0]) if df["experiment"].notna().any() else "run"
    if mode != "gpu":
        return plots.check_heatmap(df, out, title)
    if not (df["impl"] == "fused").any():  # memory-bound technique (standalone norms): bandwidth plot
        cal = meta.get("calibration") or {}
        return plots.bandwidth_lines(metrics.best_per_impl(df), cal.get("copy_tbps"), out, title, _subtitle(df, meta))
    best = metrics.best_fused(df)
    if best.empty:
        return []
    p = _load_paired(run_dir, paired)
    sub = _subtitle(df, meta, p)
    spec = _spec(df)
    rows, cols = getattr(spec, "GRID_AXES", ("K", "N"))  # the sweep dimensions the figures are drawn over
    names = getattr(spec, "DIM_LABELS", {})
    axes = dict(row_label=names.get(rows, rows), col_label=names.get(cols, cols))
    metric = primary_metric(spec)  # naive fusion: hidden_best (DSL GEMMs are weak); fna: saving; fna_llm: % of SDPA
    variants = _variants(best)
    if getattr(spec, "REPORT", None) == "throughput":  # attention: TFLOP/s per implementation, no "% hidden"
        table, intervals = _paired_throughput(p) if p is not None else (throughput_table(df), None)
        paths = plots.tflops_bars(table, out, title, sub, intervals=intervals)
        rows, cols = "M", "N"  # S and B
        axes = dict(row_label=names.get(rows, rows), col_label=names.get(cols, cols))
        for variant in variants:
            cells = (paired_cells(p, metric, variant, rows, cols) if p is not None
                     else _sweep_cells(_of_variant(best, variant), metric, rows, cols))
            tgt = target(spec, metric, variant, None, None, None)
            t, suffix = (title, "") if len(variants) == 1 else (f"{title} ({variant})", f"_{variant}")
            paths += plots.hidden_bars(cells, None, out, t, sub, suffix=suffix, metric=metric, target=tgt,
                                       name=f"{metric}_bars", **axes)
        return paths
    blog_label = getattr(spec, "BLOG_LABEL", None) or plots.BLOG_LABEL
    what = getattr(spec, "METRIC_LABEL", None)
    paths = []
    for variant in variants:  # one pair of figures per variant (file suffix _<variant> when there are several)
        b = _of_variant(best, variant)
        if metric == "saving":  # e.g. FlashNormAttention: the blog's savings, keyed like the grid axes
            blog = getattr(spec, "BLOG_SAVING_B200", None)
        else:
            blog = _blog(df, variant) if set(b["M"]) == {BLOG_M} else None
        cells = paired_cells(p, metric, variant, rows, cols) if p is not None else _sweep_cells(b, metric, rows, cols)
        t, suffix = (title, "") if len(variants) == 1 else (f"{title} ({variant})", f"_{variant}")
        if metric != "hidden_dsl":
            t = f"{t} [{metric}]"
        paths += plots.hidden_heatmap(cells, blog, out, t, sub, blog_label=blog_label, suffix=suffix, metric=metric,
                                      what=what, **axes)
        naive = _naive(_of_variant(df, variant), spec, metric)
        paths += plots.hidden_bars(cells, blog, out, t, sub, suffix=suffix, metric=metric, naive=naive,
                                   naive_label=getattr(spec, "NAIVE_LABEL", "naive fusion"), what=what, **axes)
    blogs = {v: _blog(df, v) for v in variants} if set(best["M"]) == {BLOG_M} else None
    return paths + plots.cluster_sweep(df, out, title, sub, blog=blogs)  # [] unless configs have CLUSTER_SIZE


def _paired_throughput(p: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """``throughput_table``'s layout from the paired TFLOP/s medians, and {(index, column): (lo, hi)}."""
    f = p[p["metric"] == "tflops"].copy()
    f["who"] = [r.impl if r.dsl == "torch" else f"{r.dsl} {r.impl}" for r in f.itertuples()]
    f = f.loc[f.groupby(["variant", "M", "N", "K", "who"], dropna=False)["median"].idxmax()]
    t = f.pivot_table(index=["variant", "M", "N", "K"], columns="who", values="median", aggfunc="max")
    intervals = {((r.variant, r.M, r.N, r.K), r.who): (r.ci_lo, r.ci_hi) for r in f.itertuples()}
    t = t.rename_axis(index={k: v for k, v in getattr(_spec(f), "DIM_LABELS", {}).items()})
    base = [c for c in t.columns if " " not in c]
    dsl = [f"{d} {i}" for d in plots.DSL_ORDER for i in ("attention", "fused") if f"{d} {i}" in t.columns]
    return t[base + dsl], intervals


def _fmt(v, pct=False, nd=1):
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{100 * v:.{nd}f}" if pct else f"{v:.{nd}f}"


def _naive(df: pd.DataFrame, spec, metric: str = "hidden_dsl") -> dict | None:
    """{(K, N): 100·metric} of the fastest correct fused row whose tiling is the technique's naive-fusion form
    (config name matching the regular expression ``spec.NAIVE_CONFIG_MARKER``, e.g. Lazy Pre-Norm's tile-schedule
    ``prepass``: rstd of the tile's rows over all of K first, then the GEMM), over all DSLs; None when the spec names
    no such form or no row matches."""
    marker = getattr(spec, "NAIVE_CONFIG_MARKER", None) if spec is not None else None
    if not marker or "config_name" not in df:
        return None
    f = df[(df["impl"] == "fused") & (df["status"] == "ok")
           & df["config_name"].astype(str).str.contains(marker, regex=True)
           & pd.to_numeric(df["p50_ms"], errors="coerce").notna()]
    if f.empty:
        return None
    f = f.loc[f.groupby(["M", "K", "N"])["p50_ms"].idxmin()]
    return {(int(r.K), int(r.N)): 100 * float(getattr(r, metric)) for r in f.itertuples()}


def _hidden_rows(df, best, gemm, dsls, blog, first: dict, naive: dict | None = None,
                 metric: str = "hidden_dsl") -> list[dict]:
    """Summary rows per (M, K, N) of one variant: per DSL ``metric`` (the spec's PRIMARY_METRIC, hidden_dsl by
    default) of its fastest correct fused config and its best GEMM as % of cuBLAS; best hidden_best; naive; blog."""
    rows = []
    for (M, K, N), _ in df.groupby(["M", "K", "N"]):
        r = {**first, "M": M, "K": K, "N": N}
        for d in dsls:
            b = best[(best.dsl == d) & (best.M == M) & (best.K == K) & (best.N == N)]
            g = gemm[(gemm.dsl == d) & (gemm.M == M) & (gemm.K == K) & (gemm.N == N)]
            label = "hidden %" if metric == "hidden_dsl" else f"{metric} %"
            r[f"{d} {label}"] = _fmt(b[metric].iloc[0], pct=True) if len(b) else "–"
            r[f"{d} gemm/cuBLAS %"] = _fmt(g["frac_cublas"].iloc[0], pct=True, nd=0) if len(g) else "–"
        bb = best[(best.M == M) & (best.K == K) & (best.N == N)]
        r["best hidden_best %"] = _fmt(bb["hidden_best"].max(), pct=True) if len(bb) else "–"
        if naive is not None:
            r["naive fusion %"] = _fmt(naive.get((K, N)))
        if blog and M == 262144:
            r["blog B200 %"] = _fmt(blog.get((K, N)))
        rows.append(r)
    return rows


def summary(df: pd.DataFrame, mode: str, copy_tbps: float | None = None,
            paired: pd.DataFrame | None = None, resolution: float = 0.0) -> str:
    """Markdown summary. GPU: with ``paired`` (the run's ``paired.parquet`` table) first the paired tables
    (``paired_lines``: median [95 % interval] per DSL, best DSL, target and verdict); then, from the sweep-stage
    rows, per (K, N) the best hidden_dsl per DSL next to the blog's B200 value, and each DSL's best GEMM as a
    fraction of cuBLAS. CPU: status of every point (no timings). ``resolution``: see ``paired_lines``."""
    df = sweep_rows(df)
    counts = df.groupby(["dsl", "status"]).size().unstack(fill_value=0)
    lines = ["status counts per dsl:", "", counts.to_markdown(), ""]
    if mode == "gpu" and paired is not None and len(paired):
        lines += paired_lines(paired, resolution)
        lines += ["Sweep stage (one p50 per config, timed one after another; it chose the configs re-timed above):",
                  ""]
    if mode != "gpu":
        d = df.assign(err_over_tol=df["max_abs_err"].astype(float) / df["tol"].astype(float))
        errors = d["error"] if "error" in d else [None] * len(d)
        d["why"] = ["" if st in ("ok", "compile_only") or not isinstance(e, str) else e[:90]
                    for st, e in zip(d["status"], errors)]
        cols = ["variant", "dsl", "impl", "config_name", "M", "N", "K", "dtype", "mode", "status", "err_over_tol", "why"]
        lines += ["CPU mode: correctness only, not timings.", "", d[cols].to_markdown(index=False, floatfmt=".3f")]
        return "\n".join(lines)
    if not (df["impl"] == "fused").any():
        b = metrics.best_per_impl(df)
        b["who"] = [r.dsl if r.dsl != "torch" else r.impl for r in b.itertuples()]
        t = b.pivot_table(index=["variant", "M", "N"], columns="who", values="gbps")
        dsl_cols = [c for c in plots.DSL_ORDER if c in t.columns]
        base_cols = [c for c in t.columns if c not in dsl_cols]
        if dsl_cols:
            best_dsl = t[dsl_cols].max(axis=1)
            t["best DSL"] = t[dsl_cols].idxmax(axis=1)
            if copy_tbps:
                t["best DSL % of copy"] = 100 * best_dsl / (1000 * copy_tbps)
            for c in base_cols:
                t[f"best DSL / {c}"] = best_dsl / t[c]
        t = t.round({c: 0 for c in dsl_cols + base_cols} | {"best DSL % of copy": 1}
                    | {c: 3 for c in t.columns if str(c).startswith("best DSL / ")})
        return "\n".join(lines + ["best GB/s per implementation (read x + write y over the p50)"
                                   + (f"; measured copy bandwidth {1000 * copy_tbps:.0f} GB/s" if copy_tbps else "")
                                   + ":", "", t.to_markdown()])
    best, gemm = metrics.best_fused(df), metrics.best_gemm(df)
    dsls = [d for d in plots.DSL_ORDER if d in set(df["dsl"])]
    variants = _variants(df)
    if getattr(_spec(df), "REPORT", None) == "throughput":
        lines += _throughput_lines(df)
    elif "saving" in best and best["saving"].notna().any():  # e.g. FlashNormAttention: saving vs a baseline module
        lines += _saving_lines(df, best, dsls)
    else:
        rows = []
        metric = getattr(_spec(df), "PRIMARY_METRIC", "hidden_dsl")
        for variant in variants:  # one block of rows per variant; the blog's value only next to its own variant
            rows += _hidden_rows(_of_variant(df, variant), _of_variant(best, variant), _of_variant(gemm, variant),
                                 dsls, _blog(df, variant), {"variant": variant} if len(variants) > 1 else {},
                                 naive=_naive(_of_variant(df, variant), _spec(df)), metric=metric)
        lines += [f"% of norm latency hidden ({metric} of the fastest correct fused config per DSL) and DSL GEMM as "
                  "% of cuBLAS:", "", pd.DataFrame(rows).fillna("–").to_markdown(index=False)]
    bad = df[df["status"].isin(["incorrect", "error", "timeout", "unsupported"])]
    if len(bad):
        lines += ["", "points not timed:", "",
                  bad[(["variant"] if len(variants) > 1 else []) + ["dsl", "impl", "config_name", "M", "N", "K",
                                                                     "status", "error"]]
                  .assign(error=lambda x: x["error"].astype(str).str.slice(0, 90)).to_markdown(index=False)]
    return "\n".join(lines)


MIN_DEFINED_ROUNDS = 0.9  # paired tables: a secondary metric is shown for a cell only if defined in this share of rounds
PCT_METRICS = ("hidden_dsl", "hidden_best", "saving", "sdpa_fraction", "frac_cublas")  # shown ×100 as %


def _ci_text(med, lo, hi, pct: bool, nd: int | None = None) -> str:
    """``median [lo, hi]`` (× 100 when ``pct``; ``nd`` decimals, default 1 for % and 3 for ratios); ``[–]``
    without an interval."""
    k, nd = (100, 1 if nd is None else nd) if pct else (1, 3 if nd is None else nd)
    if med is None or not np.isfinite(med):
        return "–"
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{k * med:.{nd}f} [–]"
    return f"{k * med:.{nd}f} [{k * lo:.{nd}f}, {k * hi:.{nd}f}]"


def _clock_text(r) -> str:
    vals = [getattr(r, c, np.nan) for c in ("sm_clock_mhz_min", "sm_clock_mhz_median", "sm_clock_mhz_max")]
    return "–" if not np.isfinite(np.array(vals, dtype=float)).any() else "/".join(
        "–" if not np.isfinite(v) else f"{v:.0f}" for v in vals)


def _verdict_tally(verdicts) -> str:
    v = [x for x in verdicts if x]
    if not v:
        return ""
    counts = {k: v.count(k) for k in paired_mod.VERDICTS}
    return (f"Best DSL against the target ({len(v)} cells with a target): met {counts['met']}, missed "
            f"{counts['missed']}, not resolved {counts['not resolved']} (met: the whole 95 % interval at or above the "
            "target; missed: all of it below; not resolved: it straddles the target).")


def _res(metric: str, resolution: float) -> float:
    """The resolution that applies to ``metric``'s verdicts: ``resolution`` for ``paired.RATIO_METRICS``, else 0."""
    return resolution if metric in paired_mod.RATIO_METRICS else 0.0


def _res_note(metric: str, resolution: float) -> str:
    """The sentence under a verdict tally saying whether a timing resolution was applied ("" when none asked)."""
    if resolution <= 0:
        return ""
    if metric not in paired_mod.RATIO_METRICS:
        return (f" The timing resolution (±{100 * resolution:g} %) is not applied here: {metric} is not a ratio of "
                "times (verdicts from the interval alone).")
    return (f" Verdicts with a timing resolution of ±{100 * resolution:g} %: each interval widened to at least "
            f"median × (1 ± {resolution:g}) first.")


def paired_lines(p: pd.DataFrame, resolution: float = 0.0) -> list[str]:
    """Markdown tables of a run's paired timing (``paired.parquet``): for the technique's primary metric and the
    ``SECONDARY_METRICS`` it has, per variant and cell, each DSL's median [95 % interval] (in % for fractions),
    the best DSL (highest median) with its interval, the cell's target and the best DSL's verdict
    (``paired.verdict``), and with the primary metric the SM clock (min/median/max MHz) and the highest
    temperature during the window. ``resolution`` (fraction, default 0): the verdicts of ``paired.RATIO_METRICS``
    use the pooled interval widened to at least ±``resolution`` of the median (``paired.verdict``)."""
    spec = _spec(p)
    primary = primary_metric(spec)
    present = set(p["metric"])
    shown = list(dict.fromkeys(m for m in (primary, *SECONDARY_METRICS) if m in present))
    if not shown and "fused" not in set(p["impl"]):  # memory-bound kernels (standalone norms): bandwidth
        shown = [m for m in ("gbps",) if m in present]
    names = getattr(spec, "DIM_LABELS", {})
    variants = _variants(p)
    n = p.loc[p["metric"] == primary, "n_rounds"] if primary in present else p["n_rounds"]
    # a metric defined in fewer than MIN_DEFINED_ROUNDS of a cell's rounds (e.g. fna_llm's hidden_dsl, undefined
    # where SDPA + norms ran faster than SDPA alone) is not shown for that cell: its median over the rounds left
    # would be biased (only the rounds whose denominator came out positive)
    cell_rounds = p[p["metric"] == primary].groupby(metrics.SHAPE)["n_rounds"].max() if primary in present else None
    out = [f"Paired timing: {_range_text(n.min(), n.max())} interleaved rounds per shape; in each round every "
           "participant (the baselines and each DSL's best config of each impl) is timed once, the metric is computed "
           "within the round, and its median over rounds is shown with a 95 % percentile-bootstrap interval, "
           "`median [lo, hi]`.", ""]
    for metric in shown:
        impl = _metric_impl(p, metric)
        if impl is None:
            continue
        pct = metric in PCT_METRICS
        nd = 0 if metric in ("gbps", "tflops") else None
        rows, verdicts, sparse = [], [], 0
        for variant in variants:
            f = _of_variant(p[(p["metric"] == metric) & (p["impl"] == impl) & p["dsl"].isin(plots.DSL_ORDER)],
                            variant)
            dsls = [d for d in plots.DSL_ORDER if d in set(f["dsl"])]
            for (M, K, N), g in f.groupby(["M", "K", "N"], dropna=False):
                r = ({"variant": variant} if len(variants) > 1 else {}) | {
                    names.get("M", "M"): M, names.get("K", "K"): K, names.get("N", "N"): N}
                if cell_rounds is not None and metric != primary:
                    full = cell_rounds.reindex(pd.MultiIndex.from_frame(g[metrics.SHAPE])).to_numpy()
                    g = g[~(g["n_rounds"].to_numpy() < MIN_DEFINED_ROUNDS * full)]
                    if g.empty:
                        sparse += 1
                        rows.append(r | {plots.label(d): "–" for d in dsls} | {"best": "–"})
                        continue
                g = g.loc[g.groupby("dsl")["median"].idxmax()]
                for d in dsls:
                    x = g[g["dsl"] == d]
                    r[plots.label(d)] = _ci_text(*x[["median", "ci_lo", "ci_hi"]].iloc[0], pct, nd) if len(x) else "–"
                b = g.loc[g["median"].idxmax()]
                r["best"] = f"{plots.label(b['dsl'])} {_ci_text(b['median'], b['ci_lo'], b['ci_hi'], pct, nd)}"
                t = target(spec, metric, variant, M, N, K)
                v = paired_mod.verdict(b["ci_lo"], b["ci_hi"], t, b["median"], _res(metric, resolution))
                verdicts.append(v)
                r["target"] = "–" if t is None else (f"{100 * t:.1f}" if pct else f"{t:.2f}")
                r["verdict"] = v or "–"
                if metric == primary:
                    r["SM MHz min/med/max"] = _clock_text(b)
                    tmax = b.get("temperature_c_max", np.nan)
                    r["max °C"] = "–" if tmax is None or not np.isfinite(tmax) else f"{tmax:.0f}"
                rows.append(r)
        if not rows:
            continue
        table = pd.DataFrame(rows)
        if not any(verdicts):
            table = table.drop(columns=["target", "verdict"])
        unit = "%" if pct else {"gbps": "GB/s", "tflops": "TFLOP/s"}.get(metric, "ratio")
        what = f"{metric_label(spec, metric).replace(chr(10), ' ')} ({metric}, {unit}) of each DSL's best {impl} config"
        out += [f"{what}:", "", table.fillna("–").to_markdown(index=False, disable_numparse=True), ""]
        if sparse:
            out += [f"– in {sparse} cell(s): {metric} was defined in fewer than {MIN_DEFINED_ROUNDS:.0%} of the "
                    "cell's rounds (not shown).", ""]
        tally = _verdict_tally(verdicts)
        if tally:
            out += [tally + _res_note(metric, resolution), ""]
    return out


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s of the fastest correct row per (variant, M, N, K) and implementation: the torch baselines by impl
    name, each DSL as ``<dsl> attention`` (no norms) and ``<dsl> fused``."""
    ok = df[(df["status"] == "ok") & pd.to_numeric(df["p50_ms"], errors="coerce").notna()].copy()
    ok["who"] = [r.impl if r.dsl == "torch" else f"{r.dsl} {r.impl}" for r in ok.itertuples()]
    t = ok.pivot_table(index=["variant", "M", "N", "K"], columns="who", values="tflops", aggfunc="max")
    t = t.rename_axis(index={k: v for k, v in getattr(_spec(df), "DIM_LABELS", {}).items()})
    base = [c for c in t.columns if " " not in c]
    dsl = [f"{d} {i}" for d in plots.DSL_ORDER for i in ("attention", "fused") if f"{d} {i}" in t.columns]
    return t[base + dsl]


def _throughput_lines(df: pd.DataFrame) -> list[str]:
    """TFLOP/s table, then per DSL the fused kernel's fraction of SDPA's throughput and of its own attention's, and
    its speedup over SDPA + separate norms (the fna_llm targets: >= 90 % of SDPA, > 1x the unfused chain)."""
    t = throughput_table(df)
    out = ["attention TFLOP/s (fastest correct config; norms not counted in the FLOPs):", "",
           t.round(0).reset_index().to_markdown(index=False), ""]
    rows = []
    for idx, r in t.iterrows():
        row = dict(zip(t.index.names, idx))
        for d in plots.DSL_ORDER:
            f = r.get(f"{d} fused")
            if f is None or not np.isfinite(f):
                continue
            row[f"{d} % of sdpa"] = _fmt(f / r.get("sdpa", np.nan), pct=True)
            row[f"{d} % of own attention"] = _fmt(f / r.get(f"{d} attention", np.nan), pct=True)
            row[f"{d} x unfused"] = _fmt(f / r.get("sdpa_plus_norms", np.nan), nd=2)
        rows.append(row)
    return out + ["fused kernel vs SDPA, vs the same DSL's attention without norms, and speedup over SDPA + "
                  "torch.compile'd norms:", "", pd.DataFrame(rows).fillna("–").to_markdown(index=False), ""]


def _saving_lines(df: pd.DataFrame, best: pd.DataFrame, dsls: list) -> list[str]:
    """Table of the best ``saving`` per (M, N, K) and DSL next to the spec's ``BLOG_SAVING_B200[(M, N)]``."""
    spec = _spec(df)
    blog = getattr(spec, "BLOG_SAVING_B200", {}) or {}
    rows = []
    for (M, N, K), g in best.groupby(["M", "N", "K"]):
        r = {"M": M, "N": N, "K": K}
        for d in dsls:
            s = g[g.dsl == d]["saving"]
            r[f"{d} saving %"] = _fmt(s.max(), pct=True) if len(s) else "–"
        r["blog B200 %"] = _fmt(blog.get((int(M), int(N))))
        rows.append(r)
    return ["latency saving vs the baseline, (T_base - T_fused) / T_base, best correct config:", "",
            pd.DataFrame(rows).fillna("–").to_markdown(index=False), ""]


def replicates(run_dirs: list[Path]) -> str:
    """Markdown table over replicate runs of one technique: per shape and DSL, the fastest correct fused config's
    primary metric in each run (``spec.PRIMARY_METRIC``: ``hidden_dsl`` unless the technique says otherwise, e.g.
    ``sdpa_fraction`` for fna_llm, ``saving`` for fna) and their mean, next to the blog's value; plus the spread
    of the p50 of identical points across runs (the noise floor of a "% hidden" figure is about that spread times
    T_gemm / T_norm). The runs may come from different experiments of one technique (a replicate cut of a sweep):
    shapes missing from a run read "–"."""
    all_runs = [sweep_rows(pd.read_parquet(Path(d) / "results.parquet")) for d in run_dirs]
    best = pd.concat([metrics.best_fused(df).assign(run=Path(d).name) for d, df in zip(run_dirs, all_runs)],
                     ignore_index=True)
    spec = _spec(best)
    metric = getattr(spec, "PRIMARY_METRIC", "hidden_dsl")
    runs = [Path(d).name for d in run_dirs]
    variants = _variants(best)
    rows = []
    for (variant, M, K, N), g in best.groupby(["variant", "M", "K", "N"], dropna=False):
        blog = _blog(best, None if pd.isna(variant) else variant)
        r = ({"variant": variant} if len(variants) > 1 else {}) | {"M": M, "K": K, "N": N}
        for dsl in [x for x in plots.DSL_ORDER if x in set(best["dsl"])]:
            vals = [g[(g.dsl == dsl) & (g.run == run)][metric].max() for run in runs]
            r[f"{dsl} {metric} % (runs)"] = " / ".join(_fmt(v, pct=True) for v in vals)
            r[f"{dsl} mean %"] = _fmt(float(np.nanmean(vals)), pct=True) if np.isfinite(vals).any() else "–"
        if blog and M == 262144:
            r["blog B200 %"] = _fmt(blog.get((K, N)))
        rows.append(r)
    key = ["variant", "dsl", "impl", "config_name", "M", "N", "K"]
    spread = ""
    if len(all_runs) >= 2:
        p50 = pd.concat([df[df["status"] == "ok"].set_index(key)["p50_ms"].rename(run) for df, run in zip(all_runs, runs)],
                        axis=1).dropna()
        ratio = p50.max(axis=1) / p50.min(axis=1)
        spread = (f"\nSlowest / fastest p50 of the same point across the {len(runs)} runs ({len(ratio)} points): median "
                  f"{ratio.median():.3f}, 90th percentile {ratio.quantile(0.9):.3f}, max {ratio.max():.3f}.\n")
    title = "% of norm latency hidden" if metric.startswith("hidden") else f"{metric} in %"
    return f"{title} ({metric}, fastest correct fused config per run):\n\n" + \
        pd.DataFrame(rows).to_markdown(index=False) + "\n" + spread


# ----------------------------------------------------------------------------------------------- replicates (paired)
def replicate_report(rep_dirs: list[Path], merged: pd.DataFrame | None = None, resolution: float = 0.0) -> str:
    """Markdown report of replicate runs with paired timing (``paired.merge_replicates``): per cell the best DSL
    (highest pooled median of the technique's criterion metric, else its primary metric), each replicate's
    median [95 % interval], the pooled median [interval] (bootstrap over rounds stratified by replicate), the
    largest replicate half-width against the criterion's limit (``paired.CRITERIA``), the spread of the replicate
    medians, ``agree`` / ``overlap``, whether the criterion holds, and the pooled interval's verdict against the
    cell's target (``resolution``: as in ``paired_lines``); then every DSL's pooled interval."""
    merged = paired_mod.merge_replicates(rep_dirs) if merged is None else merged
    if merged.empty:
        return "(no paired rounds with metrics)"
    spec = _spec(merged)
    crit = paired_mod.CRITERIA.get(getattr(spec, "NAME", None))
    metric = (crit.metric if crit and crit.metric else None) or primary_metric(spec)
    pct = metric in PCT_METRICS
    runs = list(merged["runs"].iloc[0])
    names = getattr(spec, "DIM_LABELS", {})
    checks = paired_mod.check_criteria(merged) if crit else pd.DataFrame()
    variants = _variants(merged)
    f = merged[(merged["metric"] == metric) & (merged["impl"] == _metric_impl(merged, metric))
               & merged["dsl"].isin(plots.DSL_ORDER)]
    order = ["technique", "variant", "M", "K", "N", "dtype"]  # rows as in the run tables: K, then N
    rows, verdicts, holds = [], [], []
    for key, g in f.groupby(order, dropna=False):
        key = dict(zip(order, key))
        key = [key[c] for c in metrics.SHAPE]
        variant, M, N, K = key[1], key[2], key[3], key[4]
        b = g.loc[g["median"].idxmax()]
        r = ({"variant": variant} if len(variants) > 1 else {}) | {
            names.get("M", "M"): M, names.get("K", "K"): K, names.get("N", "N"): N, "best": plots.label(b["dsl"])}
        for run, med, lo, hi in zip(runs, b["rep_median"], b["rep_ci_lo"], b["rep_ci_hi"]):
            r[run] = _ci_text(med, lo, hi, pct)
        r["pooled"] = _ci_text(b["median"], b["ci_lo"], b["ci_hi"], pct)
        k, nd = (100, 1) if pct else (1, 3)  # the decimals of _ci_text: a ratio's ± 0.02 is not "0.0"
        r["max ± (rep)"] = f"{k * b['rep_half_width_max']:.{nd}f}" if np.isfinite(b["rep_half_width_max"]) else "–"
        r["spread"] = f"{k * b['spread']:.{nd}f}" if np.isfinite(b["spread"]) else "–"
        r["agree"] = _flag(b["agree"])
        r["overlap"] = _flag(b["overlap"])
        if len(checks):
            c = checks[(checks["variant"] == variant) & (checks["M"] == M) & (checks["N"] == N)
                       & (checks["K"] == K)]
            if len(c):
                c = c.iloc[0]
                lim = c["half_width_limit"]
                r["± limit"] = "–" if lim is None or not np.isfinite(lim) else f"{k * lim:.{0 if pct else nd}f}"
                r["criterion"] = "holds" if c["holds"] is True or c["holds"] is np.True_ else (
                    "–" if pd.isna(c["holds"]) else "fails")
                holds.append(r["criterion"])
        t = target(spec, metric, variant, M, N, K)
        v = paired_mod.verdict(b["ci_lo"], b["ci_hi"], t, b["median"], _res(metric, resolution))
        verdicts.append(v)
        r["target"] = "–" if t is None else (f"{100 * t:.1f}" if pct else f"{t:.2f}")
        r["verdict (pooled)"] = v or "–"
        rows.append(r)
    table = pd.DataFrame(rows)
    if not any(verdicts):
        table = table.drop(columns=["target", "verdict (pooled)"])
    n = f["rep_n_rounds"].explode()
    lines = [f"Replicates {', '.join(runs)}: paired timing, {_range_text(n.min(), n.max())} rounds per replicate and "
             f"shape. {metric_label(spec, metric).replace(chr(10), ' ')} ({metric}) of the best DSL per cell: each "
             "replicate's median [95 % bootstrap interval], the pooled median [interval] (bootstrap over rounds "
             "stratified by replicate), the largest replicate half-width (max ±), the spread (max − min) of the "
             "replicate medians, agree (every replicate's median inside every other's interval), overlap (all "
             "intervals overlap)" + (f"; criterion: {crit.source}" if crit else "") + ".", "",
             table.fillna("–").to_markdown(index=False, disable_numparse=True), ""]
    if holds:
        lines += [f"Criterion holds in {holds.count('holds')} of {len([h for h in holds if h != '–'])} cells.", ""]
    tally = _verdict_tally(verdicts)
    if tally:
        lines += [tally.replace("Best DSL", "Best DSL (pooled interval)") + _res_note(metric, resolution), ""]
    wide = []
    for key, g in f.groupby(order, dropna=False):
        r = ({"variant": key[1]} if len(variants) > 1 else {}) | {
            names.get("M", "M"): key[2], names.get("K", "K"): key[3], names.get("N", "N"): key[4]}
        for d in [x for x in plots.DSL_ORDER if x in set(f["dsl"])]:
            x = g[g["dsl"] == d]
            r[plots.label(d)] = (_ci_text(*x[["median", "ci_lo", "ci_hi"]].iloc[0], pct)
                                 + ("" if _flag(x["agree"].iloc[0]) != "no" else " ≠")) if len(x) else "–"
        wide.append(r)
    lines += [f"Every DSL, pooled over the replicates ({metric}; ≠: the replicates do not agree):", "",
              pd.DataFrame(wide).fillna("–").to_markdown(index=False, disable_numparse=True), ""]
    return "\n".join(lines)


def _flag(v) -> str:
    return "–" if v is None or pd.isna(v) else ("yes" if bool(v) else "no")


def write_replicates(rep_dirs: list[Path], out_dir: Path, console=None, resolution: float = 0.0) -> str:
    """Merge replicate runs with paired timing into ``out_dir``: ``replicates.md`` (``replicate_report``),
    ``paired_replicates.parquet`` (``paired.merge_replicates``; list columns per replicate),
    ``replicate_criteria.parquet`` (``paired.check_criteria``) and ``plots/`` (the pooled medians with their
    intervals: ``hidden_bars``/``<metric>_bars`` with suffix ``_pooled``). Returns the markdown. Writes nothing
    into the replicate folders themselves."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged = paired_mod.merge_replicates(rep_dirs)
    text = replicate_report(rep_dirs, merged, resolution)
    (out / "replicates.md").write_text(text + "\n")
    merged.to_parquet(out / "paired_replicates.parquet", index=False)
    paired_mod.check_criteria(merged).to_parquet(out / "replicate_criteria.parquet", index=False)
    spec = _spec(merged)
    metric = primary_metric(spec)
    throughput = getattr(spec, "REPORT", None) == "throughput"
    rows, cols = ("M", "N") if throughput else getattr(spec, "GRID_AXES", ("K", "N"))
    names = getattr(spec, "DIM_LABELS", {})
    variants = _variants(merged)
    title = f"{out.name}: {len(rep_dirs)} replicates pooled"
    for variant in variants:
        cells = paired_cells(merged, metric, variant, rows, cols)
        if cells.empty:
            continue
        blog = None
        if metric == "saving":
            blog = getattr(spec, "BLOG_SAVING_B200", None)
        elif not throughput and set(_of_variant(merged, variant)["M"]) == {BLOG_M}:
            blog = _blog_of(spec, variant)
        suffix = ("" if len(variants) == 1 else f"_{variant}") + "_pooled"
        plots.hidden_bars(cells, blog, out / "plots", title + ("" if len(variants) == 1 else f" ({variant})"),
                          "pooled median, 95 % interval stratified by replicate", suffix=suffix, metric=metric,
                          target=target(spec, metric, variant, None, None, None) if throughput else None,
                          what=getattr(spec, "METRIC_LABEL", None), name=f"{metric}_bars" if throughput
                          else "hidden_bars", row_label=names.get(rows, rows), col_label=names.get(cols, cols))
    if console is not None:
        print(text, flush=True)
    return text


# ----------------------------------------------------------------------------------------------- one run
def read_results(run_dir: Path) -> pd.DataFrame:
    """A run's ``results.jsonl`` as a DataFrame with every ``results.COLUMNS`` column: the last record of a point
    wins (a retried point replaces its failure), a point being its ``results.point_key`` within its stage and
    replicate (the paired stage's rows never replace the sweep's)."""
    from normfuse.results import COLUMNS, ResultsStore, point_key

    rows = ResultsStore(run_dir).rows()
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(COLUMNS))
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    if len(df):
        stage = df["stage"].fillna("sweep") if "stage" in df else pd.Series("sweep", index=df.index)
        rep = df["replicate"].fillna(0) if "replicate" in df else pd.Series(0, index=df.index)
        df["_key"] = [(point_key(r), s, int(k)) for r, s, k in zip(df.to_dict("records"), stage, rep)]
        df = df.drop_duplicates("_key", keep="last").drop(columns="_key")
    return df.reset_index(drop=True)


def derive(run_dir: Path, out_dir: Path | None = None, write_tables: bool = False, console=None,
           plots: bool = True, resolution: float = 0.0) -> tuple:
    """Re-derive one run from its ``results.jsonl`` (and ``paired_rounds.jsonl``): metrics, then, into ``out_dir``,
    ``paired.parquet`` (runs with rounds), ``plots/`` and ``summary.md``. ``out_dir=None`` writes nothing (the
    summary is only returned / printed); ``write_tables`` also rewrites ``results.parquet`` / ``.csv`` in
    ``run_dir`` (only what ``--write`` asks for); ``plots=False`` skips the figures. ``meta.json`` and
    ``results.jsonl`` are never written. ``resolution``: see ``paired_lines``.
    Returns ``(df, summary_text)``."""
    from normfuse.results import write_tables as _write_tables

    run_dir = Path(run_dir)
    df = read_results(run_dir)
    if df.empty:
        return df, ""
    df = metrics.add_technique_metrics(metrics.add_saving(metrics.add_hidden(metrics.add_rates(df))))
    if write_tables:
        _write_tables(df, run_dir)
    meta = json.loads((run_dir / "meta.json").read_text()) if (run_dir / "meta.json").exists() else {}
    mode = meta.get("mode", "gpu" if (df["mode"] == "gpu").any() else "cpu")
    if out_dir is not None:
        p = paired_mod.write(run_dir, out_dir=out_dir)
        if plots:
            make_plots(df, Path(out_dir), mode, meta, paired=p if p is not None else pd.DataFrame())
    else:
        p = paired_mod.compute(run_dir)
    text = summary(df, mode, (meta.get("calibration") or {}).get("copy_tbps"), paired=p, resolution=resolution)
    if out_dir is not None:
        (Path(out_dir) / "summary.md").write_text(text + "\n")
    if console is not None:
        print(text, flush=True)  # plain print: tables are wide, a console would wrap them
    return df, text
