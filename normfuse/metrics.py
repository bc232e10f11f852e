r"""Derived metrics, computed from the tidy rows of one run (definitions in techniques.md section 10).

For a fused kernel at a shape, with T in ms (p50):

* ``hidden_dsl  = (T_gemm_dsl + T_norm_ref - T_fused) / T_norm_ref`` — the blog's "% of normalization latency
  hidden", where T_gemm_dsl is the same DSL's unfused GEMM, best over the same tiling list (same tuning budget),
  and T_norm_ref the torch.compile norm compiled for that shape;
* ``hidden_best = (min(T_cublas, T_gemm_dsl) + T_norm_best - T_fused) / T_norm_best`` — against the best
  unfused pair available (can be negative);
* ``speedup     = (T_gemm_dsl + T_norm_ref) / T_fused``;
* ``frac_cublas = T_cublas / T_gemm`` for the DSL GEMM rows;
* ``saving      = (T_baseline - T_fused) / T_baseline`` for techniques whose spec names ``SAVING_BASELINE`` (the
  blog's FlashNormAttention "latency saving": T_baseline is that baseline, e.g. the torch.compile'd module).

TFLOP/s and GB/s come from each technique's explicit FLOP and byte model, never from a profiler.
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd

from normfuse.techniques import get_technique

SHAPE = ["technique", "variant", "M", "N", "K", "dtype"]


def add_rates(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``tflops`` and ``gbps`` from p50_ms and the technique's cost model."""
    df = df.copy()
    tf, gb = [], []
    for r in df.itertuples():
        t = r.p50_ms
        if t is None or not np.isfinite(t) or t <= 0 or r.status != "ok":
            tf.append(np.nan), gb.append(np.nan)
            continue
        spec = get_technique(r.technique)
        item = 4 if r.dtype == "fp32" else 2
        kw = {"variant": r.variant} if "variant" in inspect.signature(spec.flops).parameters else {}  # causal: /2
        tf.append(spec.flops(r.impl, r.M, r.N, r.K, **kw) / (t * 1e-3) / 1e12)
        gb.append(spec.bytes_moved(r.impl, r.M, r.N, r.K, item) / (t * 1e-3) / 1e9)
    df["tflops"], df["gbps"] = tf, gb
    return df


def add_hidden(df: pd.DataFrame, norm_impls=("torch_compile_norm",)) -> pd.DataFrame:
    """Fill hidden_dsl, hidden_best, speedup (fused rows) and frac_cublas (GEMM rows)."""
    df = df.copy()
    for c in ("hidden_dsl", "hidden_best", "speedup", "frac_cublas"):
        df[c] = np.nan
    df["p50_ms"] = pd.to_numeric(df["p50_ms"], errors="coerce")
    ok = df[df["status"] == "ok"]
    for _, g in ok.groupby(SHAPE, dropna=False):
        t = lambda impl, dsl=None: g[(g["impl"] == impl) & ((g["dsl"] == dsl) if dsl else True)]["p50_ms"].min()  # noqa: E731
        t_norm_ref = g[g["impl"] == "torch_compile_norm"]["p50_ms"].min()
        t_norm_best = g[g["impl"].isin(norm_impls)]["p50_ms"].min()
        t_cublas = t("cublas")
        for dsl, gd in g.groupby("dsl"):
            t_gemm = gd[gd["impl"] == "gemm"]["p50_ms"].min()
            for idx, r in gd[gd["impl"] == "fused"].iterrows():
                tf = r["p50_ms"]
                df.loc[idx, "hidden_dsl"] = (t_gemm + t_norm_ref - tf) / t_norm_ref
                df.loc[idx, "hidden_best"] = (_min_finite(t_cublas, t_gemm) + t_norm_best - tf) / t_norm_best
                df.loc[idx, "speedup"] = (t_gemm + t_norm_ref) / tf
            for idx, r in gd[gd["impl"] == "gemm"].iterrows():
                df.loc[idx, "frac_cublas"] = t_cublas / r["p50_ms"]
    return df


def add_saving(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``saving = (T_baseline - T_fused) / T_baseline`` on the fused rows of techniques whose spec defines
    ``SAVING_BASELINE`` (the baseline impl's best p50 at the same shape); NaN elsewhere."""
    df = df.copy()
    df["saving"] = np.nan
    df["p50_ms"] = pd.to_numeric(df["p50_ms"], errors="coerce")
    ok = df[df["status"] == "ok"]
    for key, g in ok.groupby(SHAPE, dropna=False):
        base = getattr(get_technique(key[0]), "SAVING_BASELINE", None)
        if base is None:
            continue
        t_base = g[g["impl"] == base]["p50_ms"].min()
        for idx, r in g[g["impl"] == "fused"].iterrows():
            df.loc[idx, "saving"] = (t_base - r["p50_ms"]) / t_base
    return df


def add_technique_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Apply ``spec.add_metrics(df)`` of every technique in ``df`` whose spec defines it (e.g. fna_llm's
    ``sdpa_fraction``); other techniques pass through unchanged."""
    for name in df["technique"].dropna().unique() if "technique" in df else []:
        fn = getattr(get_technique(name), "add_metrics", None)
        if fn is not None:
            df = fn(df)
    return df


def _min_finite(*xs) -> float:
    finite = [x for x in xs if x is not None and np.isfinite(x)]
    return min(finite) if finite else np.nan


def best_fused(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, dsl): the fastest correct fused config, with its metrics."""
    f = df[(df["impl"] == "fused") & (df["status"] == "ok") & df["p50_ms"].notna()]
    if f.empty:
        return f
    return f.loc[f.groupby(SHAPE + ["dsl"])["p50_ms"].idxmin()].reset_index(drop=True)


def best_per_impl(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, variant, dsl, impl): the fastest correct config."""
    f = df[(df["status"] == "ok") & df["p50_ms"].notna()]
    if f.empty:
        return f
    return f.loc[f.groupby(SHAPE + ["dsl", "impl"], dropna=False)["p50_ms"].idxmin()].reset_index(drop=True)


def best_gemm(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, dsl): the fastest correct DSL GEMM config."""
    f = df[(df["impl"] == "gemm") & (df["status"] == "ok") & df["p50_ms"].notna()]
    if f.empty:
        return f
    return f.loc[f.groupby(SHAPE + ["dsl"])["p50_ms"].idxmin()].reset_index(drop=True)
