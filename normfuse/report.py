"""Tables and figures of a run: the summary (markdown, also printed) and the plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from normfuse import metrics, plots
from normfuse.techniques import get_technique


def _spec(df: pd.DataFrame):
    techs = df["technique"].dropna().unique()
    return get_technique(techs[0]) if len(techs) == 1 else None


def _blog(df: pd.DataFrame, variant=None) -> dict | None:
    """The technique's ``BLOG_HIDDEN_B200`` when the run has one technique and ``variant`` is the one the blog
    measured (``spec.BLOG_VARIANT``; any variant when the spec does not say)."""
    spec = _spec(df)
    if spec is None:
        return None
    blog_variant = getattr(spec, "BLOG_VARIANT", None)
    if variant is not None and blog_variant is not None and variant != blog_variant:
        return None
    blog = getattr(spec, "BLOG_HIDDEN_B200", None)
    if blog and all(isinstance(k, str) for k in blog):  # keyed by variant first (e.g. multi_cta)
        return blog.get(variant) if variant is not None else None
    return blog


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


def _subtitle(df: pd.DataFrame, meta: dict) -> str:
    hw = meta.get("hardware_before") or {}
    gpu = hw.get("gpu_name", "?")
    pl = hw.get("power_limit_w")
    return f"{gpu}" + (f" @ {pl:.0f} W" if pl else "") + f", M = {', '.join(str(int(m)) for m in sorted(df['M'].unique()))}, bf16, p50 of {_timing(df)}"


def make_plots(df: pd.DataFrame, run_dir: Path, mode: str, meta: dict) -> list[Path]:
    """Write the run's figures into ``run_dir/plots`` (timing figures in GPU mode, the check map in CPU mode)."""
    out = Path(run_dir) / "plots"
    title = str(df["experiment"].dropna().iloc[0]) if df["experiment"].notna().any() else "run"
    if mode != "gpu":
        return plots.check_heatmap(df, out, title)
    if not (df["impl"] == "fused").any():  # memory-bound technique (standalone norms): bandwidth plot
        cal = meta.get("calibration") or {}
        return plots.bandwidth_lines(metrics.best_per_impl(df), cal.get("copy_tbps"), out, title, _subtitle(df, meta))
    best = metrics.best_fused(df)
    if best.empty:
        return []
    sub = _subtitle(df, meta)
    spec = _spec(df)
    if getattr(spec, "REPORT", None) == "throughput":  # attention: TFLOP/s per implementation, no "% hidden"
        return plots.tflops_bars(throughput_table(df), out, title, sub)
    label = getattr(spec, "BLOG_LABEL", None) or plots.BLOG_LABEL
    variants = _variants(best)
    paths = []
    rows, cols = getattr(spec, "GRID_AXES", ("K", "N"))  # the sweep dimensions the figures are drawn over
    names = getattr(spec, "DIM_LABELS", {})
    axes = dict(what=getattr(spec, "METRIC_LABEL", "% of norm latency hidden"), row_label=names.get(rows, rows),
                col_label=names.get(cols, cols))
    for variant in variants:  # one pair of figures per variant (file suffix _<variant> when there are several)
        b = _of_variant(best, variant)
        metric = getattr(spec, "PRIMARY_METRIC", "hidden_dsl")  # naive fusion: hidden_best (DSL GEMMs are weak)
        if metric == "saving":  # e.g. FlashNormAttention: the blog's savings, keyed like the grid axes
            blog = getattr(spec, "BLOG_SAVING_B200", None)
        else:
            blog = _blog(df, variant) if set(b["M"]) == {262144} else None
        b = b.assign(K=b[rows], N=b[cols])
        t, suffix = (title, "") if len(variants) == 1 else (f"{title} ({variant})", f"_{variant}")
        if metric != "hidden_dsl":
            t = f"{t} [{metric}]"
        paths += plots.hidden_heatmap(b, blog, out, t, sub, blog_label=label, suffix=suffix, metric=metric, **axes)
        naive = _naive(_of_variant(df, variant), spec, metric)
        paths += plots.hidden_bars(b, blog, out, t, sub, suffix=suffix, metric=metric, naive=naive,
                                   naive_label=getattr(spec, "NAIVE_LABEL", "naive fusion"), **axes)
    blogs = {v: _blog(df, v) for v in variants} if set(best["M"]) == {262144} else None
    return paths + plots.cluster_sweep(df, out, title, sub, blog=blogs)  # [] unless configs have CLUSTER_SIZE


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


def summary(df: pd.DataFrame, mode: str, copy_tbps: float | None = None) -> str:
    """Markdown summary. GPU: per (K, N) the best hidden_dsl per DSL next to the blog's B200 value, and each DSL's
    best GEMM as a fraction of cuBLAS. CPU: status of every point (no timings)."""
    counts = df.groupby(["dsl", "status"]).size().unstack(fill_value=0)
    lines = ["status counts per dsl:", "", counts.to_markdown(), ""]
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
    all_runs = [pd.read_parquet(Path(d) / "results.parquet") for d in run_dirs]
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
