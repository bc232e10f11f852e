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

Which rows are compared with which: the rows of one shape (``SHAPE``) and, where the frame has them, of one
replicate, one stage (``"sweep"``: the per-config points; ``"paired"``: the interleaved re-timing of the best
configs) and one paired round (``window``, ``round``): ``COMPARISON_KEYS`` with their defaults for missing values.
So one call computes the metrics of every round of a paired window at once (``normfuse.paired``), and a
replicate's or a stage's times are never mixed with another's. Frames without these columns are grouped by
shape alone, as before they existed.
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd

from normfuse.techniques import get_technique

SHAPE = ["technique", "variant", "M", "N", "K", "dtype"]
# further columns that separate comparisons when present: column -> value meaning "missing" (None: no default)
COMPARISON_KEYS = {"replicate": 0, "stage": "sweep", "window": None, "round": None}


def comparison_keys(df: pd.DataFrame) -> list[pd.Series]:
    """The grouping keys of a comparison in ``df``: the ``SHAPE`` columns, then those of ``COMPARISON_KEYS``
    that ``df`` has (missing values filled with their default, e.g. ``stage`` NaN = ``"sweep"``). A list of
    Series aligned with ``df`` (for ``groupby(..., dropna=False)``)."""
    missing = [c for c in SHAPE if c not in df.columns]
    if missing:
        raise ValueError(f"metrics need the shape columns {SHAPE}; missing {missing}")
    keys = [df[c] for c in SHAPE]
    for c, default in COMPARISON_KEYS.items():
        if c in df.columns:
            keys.append(df[c] if default is None else df[c].fillna(default))
    return keys


def _group_min(t: pd.Series, mask: pd.Series, keys: list) -> pd.Series:
    """Per row, the minimum of ``t`` over the rows of its group (``keys``) where ``mask`` holds (NaN if none)."""
    return t.where(mask).groupby(keys, dropna=False, sort=False).transform("min")


def _positional(fn):
    """Run ``fn`` on a copy of the frame with a fresh RangeIndex and give the result the caller's index back (a
    frame concatenated from several runs may repeat index labels)."""
    def wrapped(df: pd.DataFrame, *args, **kw) -> pd.DataFrame:
        index = df.index
        out = fn(df.reset_index(drop=True), *args, **kw)
        out.index = index
        return out
    wrapped.__doc__, wrapped.__name__, wrapped.__wrapped__ = fn.__doc__, fn.__name__, fn
    return wrapped


@_positional
def add_rates(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``tflops`` and ``gbps`` from p50_ms (ms) and the technique's cost model (``spec.flops``,
    ``spec.bytes_moved``; itemsize 4 for fp32, else 2); NaN for rows that are not ``ok`` or have no positive,
    finite p50."""
    df = df.copy()
    t = pd.to_numeric(df["p50_ms"], errors="coerce") if len(df) else pd.Series(dtype=float)
    timed = (df["status"] == "ok") & np.isfinite(t) & (t > 0) if len(df) else pd.Series(dtype=bool)
    flops = pd.Series(np.nan, index=df.index)
    nbytes = pd.Series(np.nan, index=df.index)
    cols = ["technique", "impl", "variant", "M", "N", "K", "dtype"]
    sub = df.loc[timed, cols] if len(df) else df
    for _, g in sub.groupby(cols, dropna=False, sort=False):  # the cost model once per (technique, impl, shape)
        r = g.iloc[0]
        spec = get_technique(r["technique"])
        item = 4 if r["dtype"] == "fp32" else 2
        kw = {"variant": r["variant"]} if "variant" in inspect.signature(spec.flops).parameters else {}  # causal: /2
        flops[g.index] = spec.flops(r["impl"], r["M"], r["N"], r["K"], **kw)
        nbytes[g.index] = spec.bytes_moved(r["impl"], r["M"], r["N"], r["K"], item)
    seconds = t.where(timed) * 1e-3
    df["tflops"] = (flops / seconds / 1e12).astype(float)
    df["gbps"] = (nbytes / seconds / 1e9).astype(float)
    return df


@_positional
def add_hidden(df: pd.DataFrame, norm_impls=("torch_compile_norm",)) -> pd.DataFrame:
    """Fill hidden_dsl, hidden_best, speedup (fused rows) and frac_cublas (GEMM rows) from the p50 (ms) of the
    ``ok`` rows of each comparison (``comparison_keys``); see the module docstring for the definitions."""
    df = df.copy()
    for c in ("hidden_dsl", "hidden_best", "speedup", "frac_cublas"):
        df[c] = np.nan
    df["p50_ms"] = pd.to_numeric(df["p50_ms"], errors="coerce")
    if df.empty:
        return df
    t, impl, dsl = df["p50_ms"], df["impl"], df["dsl"]
    ok = df["status"] == "ok"
    keys = comparison_keys(df)
    t_norm_ref = _group_min(t, ok & (impl == "torch_compile_norm"), keys)
    t_norm_best = _group_min(t, ok & impl.isin(norm_impls), keys)
    t_cublas = _group_min(t, ok & (impl == "cublas"), keys)
    t_gemm = _group_min(t, ok & (impl == "gemm"), keys + [dsl])  # the same DSL's GEMM, best over its tilings
    finite = lambda s: s.where(np.isfinite(s))  # noqa: E731
    t_gemm_best = np.fmin(finite(t_cublas), finite(t_gemm))  # the faster finite one; NaN if neither
    fused = ok & (impl == "fused") & dsl.notna()
    gemm = ok & (impl == "gemm") & dsl.notna()
    df.loc[fused, "hidden_dsl"] = ((t_gemm + t_norm_ref - t) / t_norm_ref)[fused]
    df.loc[fused, "hidden_best"] = ((t_gemm_best + t_norm_best - t) / t_norm_best)[fused]
    df.loc[fused, "speedup"] = ((t_gemm + t_norm_ref) / t)[fused]
    df.loc[gemm, "frac_cublas"] = (t_cublas / t)[gemm]
    return df


@_positional
def add_saving(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``saving = (T_baseline - T_fused) / T_baseline`` on the fused rows of techniques whose spec defines
    ``SAVING_BASELINE`` (the baseline impl's best p50 in the same comparison); NaN elsewhere."""
    df = df.copy()
    df["saving"] = np.nan
    df["p50_ms"] = pd.to_numeric(df["p50_ms"], errors="coerce")
    if df.empty:
        return df
    ok = df["status"] == "ok"
    base_of = {name: getattr(get_technique(name), "SAVING_BASELINE", None)
               for name in df.loc[ok, "technique"].unique()}
    base = df["technique"].map(base_of)
    if base.isna().all():
        return df
    t = df["p50_ms"]
    t_base = _group_min(t, ok & (df["impl"] == base), comparison_keys(df))
    fused = ok & (df["impl"] == "fused") & base.notna()
    df.loc[fused, "saving"] = ((t_base - t) / t_base)[fused]
    return df


@_positional
def add_technique_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Apply ``spec.add_metrics(df)`` of every technique in ``df`` whose spec defines it (e.g. fna_llm's
    ``sdpa_fraction``); other techniques pass through unchanged. A spec groups by shape only, so a frame holding
    several comparisons of one shape (replicates, stages, paired rounds: ``COMPARISON_KEYS``) is passed to it in
    batches that hold at most one comparison per shape (batch k: the k-th comparison of every shape)."""
    for name in df["technique"].dropna().unique() if "technique" in df else []:
        fn = getattr(get_technique(name), "add_metrics", None)
        if fn is None:
            continue
        batch = _batches(df)
        if batch.nunique() <= 1:
            df = fn(df)
        else:
            df = pd.concat([fn(g) for _, g in df.groupby(batch, sort=False)]).loc[df.index]
    return df


def _batches(df: pd.DataFrame) -> pd.Series:
    """Per row, the rank of its comparison (``comparison_keys``) among the comparisons of its shape: rows of one
    batch never share a shape with another comparison."""
    keys = comparison_keys(df)
    shape = df.groupby(keys[:len(SHAPE)], dropna=False, sort=False).ngroup()
    comp = df.groupby(keys, dropna=False, sort=False).ngroup()
    first = pd.DataFrame({"shape": shape.to_numpy(), "comp": comp.to_numpy()}).drop_duplicates("comp")
    rank = pd.Series(first.groupby("shape").cumcount().to_numpy(), index=first["comp"].to_numpy())
    return pd.Series(rank.reindex(comp.to_numpy()).to_numpy(), index=df.index)


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
