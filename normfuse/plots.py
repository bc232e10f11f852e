"""Figures of a run, written as PNG and PDF into ``<run>/plots/``, each in two widths: full width (``WIDTHS[""]``,
7 in, a two-column page) and one column (``_1col``, 3.5 in).

Conventions, the same in every figure: one colour per DSL and per baseline (``PALETTE``, the Okabe–Ito
colour-blind-safe set; readable names in ``LABELS``), colour maps that are colour-blind safe (ColorBrewer RdBu,
PuOr) and always have a colour bar, the metric and its unit named on the axis, values outside the plotted range
clipped to it and marked (▲ / ▼ with the value), one legend per figure, and 95 % intervals as error bars where
the run has paired timing (``normfuse.paired``).

* ``hidden_heatmap``: per DSL, the metric (% of norm latency hidden, saving, ...) over the sweep grid, the
  blog's B200 values as the last panel;
* ``hidden_bars``: the DSLs side by side per grid cell, the blog's value and the naive-fusion form marked;
* ``check_heatmap`` (CPU mode): the correctness check per DSL (error / tolerance); no timings;
* ``tflops_bars``: attention throughput per (variant, shape): the torch baselines and per DSL its attention
  without norms next to its fused kernel (fna_llm);
* ``cluster_sweep``: % hidden over the thread-block cluster size (configs with a ``CLUSTER_SIZE``: TLX multi-CTA);
* ``bandwidth_lines``: GB/s over N per implementation with the measured copy bandwidth (memory-bound kernels).

Cell frames (``hidden_heatmap``, ``hidden_bars``) are tidy: one row per (grid cell, DSL) with columns ``row`` and
``col`` (the two grid axes, e.g. K and N), ``dsl``, ``value`` (a fraction: 0.62 = 62 %) and optionally ``lo``,
``hi`` (its interval; NaN or absent without paired timing).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

DSL_ORDER = ["triton", "helion", "tlx"]
# Okabe & Ito, "Color universal design" (2008): distinguishable with every common colour-vision deficiency
PALETTE = {
    "triton": "#0072B2",             # blue
    "helion": "#E69F00",             # orange
    "tlx": "#009E73",                # bluish green
    "cublas": "#000000",
    "torch_compile_norm": "#CC79A7",  # reddish purple
    "torch_eager_norm": "#D55E00",   # vermillion
    "liger_norm": "#56B4E9",         # sky blue
    "sdpa": "#000000",
    "sdpa_flash": "#555555",
    "sdpa_cudnn": "#999999",
    "sdpa_plus_norms": "#CC79A7",
    "torch_compile_gdpa": "#CC79A7",
    "torch_eager_gdpa": "#D55E00",
    "torch_compile_rmsnorm_cast": "#CC79A7",
    "torch_compile_mxnorm_cast": "#D55E00",
    "copy": "#000000",
}
OTHER_BASELINE = "#7F7F7F"  # a baseline not in PALETTE
LABELS = {
    "triton": "Triton", "helion": "Helion", "tlx": "TLX", "torch": "PyTorch", "cublas": "cuBLAS",
    "torch_compile_norm": "torch.compile norm", "torch_eager_norm": "eager norm", "liger_norm": "Liger norm",
    "sdpa": "SDPA", "sdpa_flash": "SDPA (flash)", "sdpa_cudnn": "SDPA (cuDNN)", "sdpa_plus_norms": "SDPA + norms",
    "torch_compile_gdpa": "torch.compile module", "torch_eager_gdpa": "eager module",
    "torch_compile_rmsnorm_cast": "torch.compile RMSNorm + cast",
    "torch_compile_mxnorm_cast": "torch.compile MXNorm + cast", "copy": "copy (measured)",
}
# the metric on an axis, with its unit (a spec's METRIC_LABEL overrides its primary metric's)
METRIC_LABELS = {
    "hidden_dsl": "% of norm latency hidden\n(vs the same DSL's GEMM)",
    "hidden_best": "% of norm latency hidden\n(vs the best unfused pair)",
    "saving": "% latency saving", "sdpa_fraction": "% of SDPA's TFLOP/s", "frac_cublas": "% of cuBLAS",
    "speedup_vs_unfused": "× SDPA + norms", "speedup": "× unfused", "gbps": "GB/s", "tflops": "TFLOP/s",
    "compile_ratio": "× torch.compile\n(speed ratio, same shape)",
}
BLOG_LABEL = "blog, B200 @ 750 W (TLX)"  # default title of the blog panel (a spec's BLOG_LABEL overrides it)
WIDTHS = {"": 7.0, "_1col": 3.5}  # file-name suffix -> figure width in inches (full page width, one column)
PCT_RANGE = (-50.0, 110.0)  # % metrics are drawn within this range; values outside are clipped and marked
CMAP = "RdBu"  # diverging, colour-blind safe (ColorBrewer); centred at 0 for % metrics


def label(name: str) -> str:
    """Readable name of a DSL or baseline (``LABELS``; the name itself when unknown)."""
    return LABELS.get(name, str(name))


def color(name: str) -> str:
    """The one colour of a DSL or baseline in every figure (``PALETTE``; grey for an unknown baseline)."""
    return PALETTE.get(name, OTHER_BASELINE)


def metric_label(metric: str, what: str | None = None) -> str:
    """Axis label of ``metric`` with its unit (``what`` overrides)."""
    return what or METRIC_LABELS.get(metric, metric)


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    for p in paths:  # no creation date in the PDF: re-deriving a committed run leaves its files unchanged
        fig.savefig(p, bbox_inches="tight", dpi=200,
                    metadata={"CreationDate": None} if p.suffix == ".pdf" else {"Software": None})
    plt.close(fig)
    return paths


def _fontsize(width: float) -> dict:
    small = width < 5
    return {"title": 7 if small else 10, "label": 7 if small else 9, "tick": 6 if small else 8,
            "annot": 5.5 if small else 8, "legend": 6 if small else 8}


def _title(fig, title: str, subtitle: str, fs: dict) -> None:
    """Title and subtitle, each line wrapped to the figure's width (a saved figure never grows past it)."""
    per_inch = 17 if fs["title"] < 9 else 12  # characters per inch at the title's font size
    chars = int(fig.get_size_inches()[0] * per_inch)
    lines = [textwrap.fill(x, chars) for x in (title + (f"\n{subtitle}" if subtitle else "")).split("\n")]
    fig.suptitle("\n".join(lines), fontsize=fs["title"])


def _figure_legend(fig, handles: list, fs: dict, ncol: int | None = None) -> None:
    """The figure's one legend, below the axes."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol or min(len(handles), 4),
                   fontsize=fs["legend"], frameon=False)


def _pct(cells: pd.DataFrame) -> pd.DataFrame:
    d = cells.copy()
    for c in ("value", "lo", "hi"):
        d[c] = 100 * pd.to_numeric(d[c], errors="coerce") if c in d else np.nan
    return d


def _clip_mark(v: float, lo: float, hi: float) -> str:
    return "▲" if v > hi else "▼" if v < lo else ""


# ----------------------------------------------------------------------------------------------- heatmaps
def hidden_heatmap(cells: pd.DataFrame, blog: dict | None, out_dir: Path, title: str, subtitle: str = "",
                   blog_label: str = BLOG_LABEL, suffix: str = "", metric: str = "hidden_dsl",
                   what: str | None = None, row_label: str = "K", col_label: str = "N") -> list[Path]:
    """Heatmaps of 100·value per DSL over the grid (``row`` down, ``col`` across; ``cells`` as in the module
    docstring), one panel per DSL and, when ``blog`` ({(row, col): %}) is given, the blog's values as the last
    panel titled ``blog_label``. Cells read ``value`` and, with an interval, ``±half-width`` (points); values outside
    ``PCT_RANGE`` get the colour of the range's end and a ▲/▼ mark. One shared colour bar. Written as
    ``hidden_heatmap<suffix>`` and ``hidden_heatmap<suffix>_1col`` (.png, .pdf)."""
    d = _pct(cells)
    dsls = [x for x in DSL_ORDER if x in set(d["dsl"])]
    rows = sorted(set(d["row"]) | {r for r, _ in (blog or {})})
    cols = sorted(set(d["col"]) | {c for _, c in (blog or {})})
    panels = []
    for dsl in dsls:
        g = d[d["dsl"] == dsl].set_index(["row", "col"])
        val = pd.DataFrame([[g["value"].get((r, c), np.nan) for c in cols] for r in rows], index=rows, columns=cols)
        hw = pd.DataFrame([[(g["hi"].get((r, c), np.nan) - g["lo"].get((r, c), np.nan)) / 2 for c in cols]
                           for r in rows], index=rows, columns=cols)
        panels.append((label(dsl), val, hw))
    if blog:
        val = pd.DataFrame([[blog.get((r, c), np.nan) for c in cols] for r in rows], index=rows, columns=cols)
        panels.append((blog_label, val, val * np.nan))
    lo, hi = PCT_RANGE
    norm = TwoSlopeNorm(vmin=lo, vcenter=0.0, vmax=hi)
    paths = []
    for wsuffix, width in WIDTHS.items():
        fs = _fontsize(width)
        wide = width >= 5
        ncols = min(len(panels), max(1, 12 // max(1, len(cols)))) if wide else min(2, len(panels))
        nrows = -(-len(panels) // ncols)
        ncols = -(-len(panels) // nrows)  # balanced rows
        cell_in = min(0.5, (width - (1.1 if wide else 0.3)) / (ncols * (len(cols) + 1.3)))
        height = (0.8 if wide else 1.6) + nrows * (cell_in * len(rows) + 0.75)
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, layout="constrained")
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        clipped = False
        for ax, (name, val, hw) in zip(axes.flat, panels):
            annot = np.empty(val.shape, dtype=object)
            for i in range(val.shape[0]):
                for j in range(val.shape[1]):
                    v, h = val.iat[i, j], hw.iat[i, j]
                    mark = _clip_mark(v, lo, hi) if np.isfinite(v) else ""
                    clipped |= bool(mark)
                    annot[i, j] = ("–" if not np.isfinite(v) else f"{v:.0f}{mark}" if abs(v) >= 99.95 else
                                   f"{v:.1f}{mark}") + (f"\n±{h:.1f}" if np.isfinite(h) else "")
            sns.heatmap(val.clip(lo, hi), ax=ax, annot=annot, fmt="", cmap=CMAP, norm=norm, cbar=False,
                        linewidths=0.5, linecolor="white", annot_kws={"size": fs["annot"]}, square=True)
            ax.set_facecolor("#DDDDDD")  # no value: light grey
            ax.set_title(textwrap.fill(name, 20 if wide else 30), fontsize=fs["label"])
            ax.set_xlabel(col_label, fontsize=fs["label"])
            ax.set_ylabel(row_label, fontsize=fs["label"])
            ax.tick_params(labelsize=fs["tick"], length=0)
            ax.tick_params(axis="y", rotation=0)
            ax.tick_params(axis="x", rotation=0)
        cb = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=CMAP), ax=axes.ravel().tolist(), extend="both",
                          shrink=0.85 if wide else 0.7, aspect=25, location="right" if wide else "bottom")
        cb.set_label(textwrap.fill(metric_label(metric, what).replace("\n", " "), 28 if wide else 60),
                     fontsize=fs["label"] - 1)
        cb.ax.tick_params(labelsize=fs["tick"])
        note = f"▲/▼: outside {lo:.0f}…{hi:.0f} %, colour clipped" if clipped else ""
        _title(fig, title, "\n".join(x for x in (subtitle, note) if x), fs)
        paths += _save(fig, out_dir, f"hidden_heatmap{suffix}{wsuffix}")
    return paths


# ----------------------------------------------------------------------------------------------- bars
def _range(values: list, floor: float, ceil: float) -> tuple[float, float]:
    """The y range: the data with a margin, never beyond (floor, ceil), always including 0."""
    v = np.array([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if not len(v):
        return floor, ceil
    lo, hi = min(0.0, v.min()), max(0.0, v.max())
    pad = 0.06 * max(hi - lo, 1.0)
    return max(floor, lo - pad), min(ceil, hi + pad)


def hidden_bars(cells: pd.DataFrame, blog: dict | None, out_dir: Path, title: str, subtitle: str = "",
                suffix: str = "", metric: str = "hidden_dsl", naive: dict | None = None,
                naive_label: str = "naive fusion", what: str | None = None, row_label: str = "K",
                col_label: str = "N", target: float | None = None, name: str = "hidden_bars") -> list[Path]:
    """Grouped bars: one group per grid cell (``row``, ``col``), one bar per DSL (100·value) with its 95 %
    interval as an error bar where ``cells`` has ``lo``/``hi``; ``blog`` {(row, col): %} as a black dash,
    ``naive`` {(row, col): %} (the naive-fusion form of the same sweep) as a grey ×, ``target`` (a fraction) as a
    dashed line. The y range follows the data within ``PCT_RANGE``; bars beyond it are clipped and marked with
    ▲/▼ and their value. Written as ``<name><suffix>`` and ``<name><suffix>_1col`` (.png, .pdf)."""
    d = _pct(cells)
    keys = sorted({(r, c) for r, c in zip(d["row"], d["col"])})
    dsls = [x for x in DSL_ORDER if x in set(d["dsl"])]
    extra = [v for v in (blog or {}).values()] + [v for v in (naive or {}).values()]
    y0, y1 = _range(list(d["value"]) + list(d["lo"]) + list(d["hi"]) + extra
                    + ([100 * target] if target is not None else []), *PCT_RANGE)
    paths = []
    for wsuffix, width in WIDTHS.items():
        fs = _fontsize(width)
        fig, ax = plt.subplots(figsize=(width, 2.9 if width < 5 else 3.6), layout="constrained")
        bw = 0.8 / max(1, len(dsls))
        x = np.arange(len(keys))
        for j, dsl in enumerate(dsls):
            g = d[d["dsl"] == dsl].set_index(["row", "col"])
            v = np.array([g["value"].get(k, np.nan) for k in keys])
            lo_, hi_ = (np.array([g[c].get(k, np.nan) for k in keys]) for c in ("lo", "hi"))
            xs = x + (j - (len(dsls) - 1) / 2) * bw
            ax.bar(xs, np.clip(v, y0, y1), bw * 0.92, color=color(dsl), label=label(dsl), zorder=2)
            have = np.isfinite(lo_) & np.isfinite(hi_) & np.isfinite(v)
            if have.any():
                yerr = np.vstack([np.clip(v - lo_, 0, None), np.clip(hi_ - v, 0, None)])[:, have]
                ax.errorbar(xs[have], np.clip(v[have], y0, y1), yerr=yerr, fmt="none", ecolor="black",
                            elinewidth=0.7, capsize=1.5 if width < 5 else 2.5, zorder=3)
            for xi, vi in zip(xs, v):
                if np.isfinite(vi) and (vi > y1 or vi < y0):
                    edge = y1 if vi > y1 else y0
                    ax.annotate(f"{_clip_mark(vi, y0, y1)}{vi:.0f}", (xi, edge), ha="center",
                                va="top" if vi > y1 else "bottom", fontsize=fs["annot"], zorder=6,
                                xytext=(0, -1 if vi > y1 else 1), textcoords="offset points",
                                color="white" if vi < y0 else "black",
                                bbox={"boxstyle": "square,pad=0.1", "fc": color(dsl), "ec": "none"})
        handles = [Patch(color=color(x_), label=label(x_)) for x_ in dsls]
        if blog:
            xs = [i for i, k in enumerate(keys) if k in blog]
            ax.scatter(xs, [np.clip(blog[keys[i]], y0, y1) for i in xs], marker="_",
                       s=(250 if width < 5 else 900) * 0.8, color="black", zorder=5, linewidths=1.5)
            handles.append(Line2D([], [], color="black", marker="_", ls="none", markersize=12, label="blog B200"))
        if naive:
            xs = [i for i, k in enumerate(keys) if k in naive]
            ax.scatter(xs, [np.clip(naive[keys[i]], y0, y1) for i in xs], marker="x", s=30 if width < 5 else 60,
                       color="#555555", zorder=6)
            handles.append(Line2D([], [], color="#555555", marker="x", ls="none", label=naive_label))
        if target is not None:
            ax.axhline(100 * target, color="black", ls="--", lw=0.8, zorder=1)
            handles.append(Line2D([], [], color="black", ls="--", lw=0.8, label=f"target {100 * target:.0f} %"))
        if d["lo"].notna().any():
            handles.append(Line2D([], [], color="black", marker="|", ls="none", label="95 % interval"))
        ax.axhline(0, color="grey", lw=0.6, zorder=1)
        ax.set_ylim(y0, y1)
        ax.set_xlim(-0.6, len(keys) - 0.4)
        ax.set_xticks(x, [f"{r}\n{c}" for r, c in keys], fontsize=fs["tick"])
        ax.set_xlabel(f"{row_label} (top), {col_label} (bottom)", fontsize=fs["label"])
        ax.set_ylabel(metric_label(metric, what), fontsize=fs["label"])
        ax.tick_params(axis="y", labelsize=fs["tick"])
        ax.grid(axis="y", lw=0.3, alpha=0.5, zorder=0)
        _figure_legend(fig, handles, fs, ncol=min(len(handles), 3 if width < 5 else 7))
        _title(fig, title, subtitle, fs)
        paths += _save(fig, out_dir, f"{name}{suffix}{wsuffix}")
    return paths


def tflops_bars(table: pd.DataFrame, out_dir: Path, title: str, subtitle: str = "",
                intervals: dict | None = None) -> list[Path]:
    """Grouped bars of TFLOP/s, one panel per variant (index level ``variant``) and one group per remaining index
    (S, B, ...; levels that never change are left out of the labels): columns are implementation labels such as
    ``sdpa``, ``triton attention``, ``triton fused``; the baselines in their ``PALETTE`` colour, each DSL's
    attention without norms hatched and pale next to its fused kernel in the DSL's colour. ``intervals``
    {(row index, column): (lo, hi)} adds 95 % error bars. Written as ``tflops_bars`` and ``tflops_bars_1col``."""
    t = table.copy()
    names = list(t.index.names)
    vlevel = "variant" if "variant" in names else None
    variants = list(dict.fromkeys(t.index.get_level_values(vlevel))) if vlevel else [None]
    shown = [n for n in names if n != vlevel and t.index.get_level_values(n).nunique() > 1] or \
        [n for n in names if n != vlevel][:1]
    cols = list(t.columns)
    paths = []
    for wsuffix, width in WIDTHS.items():
        fs = _fontsize(width)
        fig, axes = plt.subplots(len(variants), 1, figsize=(width, (2.0 if width < 5 else 2.4) * len(variants) + 1.0),
                                 squeeze=False, layout="constrained", sharey=True)
        for ax, variant in zip(axes[:, 0], variants):
            part = t[t.index.get_level_values(vlevel) == variant] if vlevel else t
            bw = 0.86 / max(1, len(cols))
            for j, c in enumerate(cols):
                who, _, kind = c.partition(" ")
                xs = np.arange(len(part)) + (j - (len(cols) - 1) / 2) * bw
                v = part[c].to_numpy(float)
                pale = kind == "attention"
                ax.bar(xs, v, bw * 0.92, color=color(who), alpha=0.45 if pale else 1.0,
                       hatch="////" if pale else None, edgecolor=color(who), linewidth=0.4, zorder=2)
                if intervals:
                    lo_hi = np.array([intervals.get((idx, c), (np.nan, np.nan)) for idx in part.index], dtype=float)
                    have = np.isfinite(lo_hi).all(axis=1) & np.isfinite(v)
                    if have.any():
                        yerr = np.vstack([v - lo_hi[:, 0], lo_hi[:, 1] - v])[:, have].clip(0)
                        ax.errorbar(xs[have], v[have], yerr=yerr, fmt="none", ecolor="black", elinewidth=0.6,
                                    capsize=1.0, zorder=3)
            frame = part.index.to_frame(index=False)
            ax.set_xticks(np.arange(len(part)), ["\n".join(str(frame.at[i, n]) for n in shown)
                                                 for i in range(len(part))], fontsize=fs["tick"])
            ax.set_xlim(-0.6, len(part) - 0.4)
            if variant is not None:
                ax.set_title(str(variant), fontsize=fs["label"])
            ax.set_ylabel("attention TFLOP/s\n(norms not counted)", fontsize=fs["label"])
            ax.tick_params(axis="y", labelsize=fs["tick"])
            ax.grid(axis="y", lw=0.3, alpha=0.5, zorder=0)
        axes[-1, 0].set_xlabel(", ".join(f"{n} ({p})" for n, p in zip(shown, ("top", "middle", "bottom")
                                                                       if len(shown) == 3 else ("top", "bottom")))
                               if len(shown) > 1 else shown[0], fontsize=fs["label"])
        handles = []
        for c in cols:
            who, _, kind = c.partition(" ")
            pale = kind == "attention"
            handles.append(Patch(facecolor=color(who), alpha=0.45 if pale else 1.0, hatch="////" if pale else None,
                                 edgecolor=color(who), label=label(who) + (f" {kind}" if kind else "")))
        if intervals:
            handles.append(Line2D([], [], color="black", marker="|", ls="none", label="95 % interval"))
        _figure_legend(fig, handles, fs, ncol=3 if width < 5 else 5)
        _title(fig, f"{title}: attention TFLOP/s", subtitle, fs)
        paths += _save(fig, out_dir, f"tflops_bars{wsuffix}")
    return paths


# ----------------------------------------------------------------------------------------------- CPU check map
def check_heatmap(df: pd.DataFrame, out_dir: Path, title: str) -> list[Path]:
    """CPU mode: per DSL and shape, the kernel's max error over its tolerance (<= 1 passes; colour bar 0…2,
    diverging at 1), or, for kernels that were only compiled for sm_90 (TLX), the word 'compiled'. One width
    (a diagnostic, not a paper figure)."""
    d = df[df["dsl"].isin(DSL_ORDER)].copy()
    d["shape"] = [f"{r.M}x{r.N}x{r.K}" for r in d.itertuples()]
    variants = d["variant"].astype(str)
    d["what"] = (variants + " " if d["variant"].nunique() > 1 else "") + d["impl"] + " / " + d["config_name"].astype(str)
    d["r"] = pd.to_numeric(d["max_abs_err"], errors="coerce") / pd.to_numeric(d["tol"], errors="coerce")
    dsls = [x for x in DSL_ORDER if x in set(d["dsl"])]
    fs = _fontsize(WIDTHS[""])
    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=2.0)
    cmap = "PuOr_r"  # diverging at error = tolerance, colour-blind safe
    fig, axes = plt.subplots(1, len(dsls), figsize=(4.2 * len(dsls), 1.6 + 0.45 * d["what"].nunique()),
                             squeeze=False, layout="constrained")
    for ax, dsl in zip(axes[0], dsls):
        g = d[d.dsl == dsl]
        grid = g.pivot_table(index="what", columns="shape", values="r", aggfunc="max", dropna=False)
        status = g.pivot_table(index="what", columns="shape", values="status", aggfunc="first").reindex_like(grid)
        annot = np.where(grid.notna(), grid.map(lambda v: f"{v:.2f}"),
                         status.replace({"compile_only": "compiled"}).fillna(""))
        sns.heatmap(grid.clip(0, 2), ax=ax, annot=annot, fmt="", cmap=cmap, norm=norm, cbar=False,
                    linewidths=0.5, annot_kws={"size": 8})
        ax.set_facecolor("#DDDDDD")
        mode = g["mode"].iloc[0]
        ax.set_title(f"{label(dsl)} ({mode})" + ("\nsm_90 PTX only, not executed" if mode == "compile_only" else ""),
                     fontsize=9)
        ax.set_xlabel("M x N x K")
        ax.set_ylabel("")
    cb = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes[0].tolist(), extend="max", shrink=0.8)
    cb.set_label("max |error| / tolerance (≤ 1 passes)", fontsize=fs["label"])
    fig.suptitle(f"{title}: CPU mode, correctness only — max error / tolerance (<= 1 passes). NOT timings",
                 fontsize=10)
    return _save(fig, out_dir, "check_heatmap")


# ----------------------------------------------------------------------------------------------- lines
def bandwidth_lines(best: pd.DataFrame, copy_tbps: float | None, out_dir: Path, title: str, subtitle: str = "") -> list[Path]:
    """Memory-bound kernels: GB/s over N per implementation (best config), one panel per (variant, M), with the
    measured copy bandwidth drawn as the ceiling (QuACK-style). Written as ``bandwidth`` and ``bandwidth_1col``."""
    d = best.copy()
    d["who"] = [r.dsl if r.dsl != "torch" else r.impl for r in d.itertuples()]
    variants = sorted({r.variant for r in d.itertuples()})
    Ms = sorted({r.M for r in d.itertuples()})
    order = [x for x in DSL_ORDER if x in set(d["who"])] + sorted(x for x in set(d["who"]) if x not in DSL_ORDER)
    paths = []
    for wsuffix, width in WIDTHS.items():
        fs = _fontsize(width)
        ncols = len(Ms) if width >= 5 else min(2, len(Ms))
        panels = [(v, m) for v in variants for m in Ms]
        nrows = -(-len(panels) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, (2.6 if width >= 5 else 2.0) * nrows + 0.8),
                                 squeeze=False, layout="constrained", sharey=True)
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        for ax, (variant, M) in zip(axes.flat, panels):
            g = d[(d.variant == variant) & (d.M == M)]
            for who in order:
                s = g[g["who"] == who].sort_values("N")
                if len(s):
                    ax.plot(s["N"], s["gbps"], marker="o", ms=3, lw=1.2, color=color(who), label=label(who))
            if copy_tbps:
                ax.axhline(copy_tbps * 1000, color=color("copy"), ls="--", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{variant}, M = {M}", fontsize=fs["label"])
            ax.set_xlabel("N", fontsize=fs["label"])
            ax.set_ylabel("GB/s (read x + write y)", fontsize=fs["label"])
            ax.tick_params(labelsize=fs["tick"])
        handles = [Line2D([], [], color=color(w), marker="o", ms=3, label=label(w)) for w in order]
        if copy_tbps:
            handles.append(Line2D([], [], color=color("copy"), ls="--", label=label("copy")))
        _figure_legend(fig, handles, fs, ncol=3 if width < 5 else 5)
        _title(fig, f"{title}: bandwidth", subtitle, fs)
        paths += _save(fig, out_dir, f"bandwidth{wsuffix}")
    return paths


def _config_field(cfg, key):
    """``cfg[key]`` for a config stored as a dict or as a JSON string (parquet); None if absent."""
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            return None
    return cfg.get(key) if isinstance(cfg, dict) else None


def cluster_sweep(df: pd.DataFrame, out_dir: Path, title: str, subtitle: str = "",
                  blog: dict | None = None) -> list[Path]:
    """% of norm latency hidden (hidden_dsl, best correct config per cluster size) over the cluster size, for the
    fused rows whose config has a ``CLUSTER_SIZE`` (TLX multi-CTA). Panels: rows = variants, columns = N; one
    line per K in shades of the DSL's colour (darker = larger K, with its own marker); ``blog`` maps
    variant -> {(K, N): %} (dashed, same shade). Values outside ``PCT_RANGE`` are clipped and marked. Written as
    ``cluster_sweep`` and ``cluster_sweep_1col``; returns [] when no row qualifies."""
    if "config" not in df.columns:
        return []
    d = df[(df["impl"] == "fused") & (df["status"] == "ok")].copy()
    if d.empty:
        return []
    d["C"] = [_config_field(c, "CLUSTER_SIZE") for c in d["config"]]
    d = d[d["C"].notna() & pd.to_numeric(d["hidden_dsl"], errors="coerce").notna()]
    if d.empty:
        return []
    d["C"] = d["C"].astype(int)
    d["hidden %"] = 100 * d["hidden_dsl"].astype(float)
    best = d.loc[d.groupby(["dsl", "variant", "M", "N", "K", "C"])["hidden %"].idxmax()]
    dsl = next((x for x in DSL_ORDER if x in set(best["dsl"])), best["dsl"].iloc[0])
    best = best[best["dsl"] == dsl]
    variants = sorted(best["variant"].dropna().unique())
    Ns, Ks = sorted(best["N"].unique()), sorted(best["K"].unique())
    shades = dict(zip(Ks, sns.light_palette(color(dsl), len(Ks) + 1)[1:]))
    markers = dict(zip(Ks, "osD^v<>p"))
    lo, hi = PCT_RANGE
    paths = []
    for wsuffix, width in WIDTHS.items():
        fs = _fontsize(width)
        fig, axes = plt.subplots(len(variants), len(Ns), figsize=(width, (1.7 if width < 5 else 2.3) * len(variants)
                                                                    + 1.0), squeeze=False, layout="constrained",
                                 sharey=True, sharex=True)
        clipped = False
        for i, v in enumerate(variants):
            for j, n in enumerate(Ns):
                ax = axes[i][j]
                for k in Ks:
                    g = best[(best.variant == v) & (best.N == n) & (best.K == k)].sort_values("C")
                    if len(g):
                        y = g["hidden %"].to_numpy()
                        ax.plot(g["C"], np.clip(y, lo, hi), marker=markers[k], ms=3, lw=1.1, color=shades[k])
                        out = (y < lo) | (y > hi)
                        clipped |= bool(out.any())
                        if out.any():  # clipped points: a triangle on the edge, pointing outwards
                            ax.scatter(g["C"][out], np.where(y[out] > hi, hi, lo), marker="^" if y[out][0] > hi
                                       else "v", s=14, color=shades[k], edgecolors="black", linewidths=0.4,
                                       zorder=5, clip_on=False)
                    ref = (blog or {}).get(v, {}).get((k, n)) if isinstance((blog or {}).get(v), dict) else None
                    if ref is not None:
                        ax.axhline(ref, color=shades[k], ls="--", lw=0.8)
                ax.set_xscale("log", base=2)
                ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
                ax.axhline(0, color="grey", lw=0.6)
                ax.set_ylim(lo, hi)
                ax.tick_params(labelsize=fs["tick"])
                if i == 0:
                    ax.set_title(f"N = {n}", fontsize=fs["label"])
                if j == 0:
                    ax.set_ylabel(f"{v}\n% of norm latency hidden", fontsize=fs["label"])
        for ax in axes[-1]:
            ax.set_xlabel("CTAs per cluster" if width >= 5 else "CTAs/cluster", fontsize=fs["label"])
        handles = [Line2D([], [], color=shades[k], marker=markers[k], ms=3, label=f"{label(dsl)}, K = {k}")
                   for k in Ks]
        if blog:
            handles.append(Line2D([], [], color="grey", ls="--", lw=0.8, label="blog B200 (same shade)"))
        if clipped:
            handles.append(Line2D([], [], color="grey", marker="v", ls="none", markeredgecolor="black", ms=4,
                                  label=f"outside {lo:.0f}…{hi:.0f} %, clipped"))
        _figure_legend(fig, handles, fs, ncol=2 if width < 5 else len(handles))
        _title(fig, f"{title}: cluster-size sweep (best config per size)", subtitle, fs)
        paths += _save(fig, out_dir, f"cluster_sweep{wsuffix}")
    return paths
