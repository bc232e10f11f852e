"""Figures of a run, written as PNG and PDF into ``<run>/plots/``.

* ``hidden_heatmap``: per DSL, % of norm latency hidden (best correct config per cell) over (K, N), like the
  blog's chart, with the blog's B200 values as the last panel;
* ``hidden_bars``: the DSLs side by side per (K, N), the blog's B200 value marked;
* ``check_heatmap`` (CPU mode): the correctness check per DSL (error / tolerance); no timings;
* ``tflops_bars``: attention throughput, one group per (variant, shape): the torch baselines and per DSL its
  attention without norms next to its fused kernel (fna_llm);
* ``cluster_sweep``: % hidden over the thread-block cluster size (configs with a ``CLUSTER_SIZE``: TLX multi-CTA),
  one panel per (variant, N), one line per K, the blog's B200 value as a dashed line.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

DSL_ORDER = ["triton", "helion", "tlx"]
PALETTE = {"triton": "#4C72B0", "helion": "#DD8452", "tlx": "#55A868"}
BLOG_LABEL = "blog, B200 @ 750 W (TLX)"  # default title of the blog panel (a spec's BLOG_LABEL overrides it)


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    for p in paths:  # no creation date in the PDF: re-deriving a committed run leaves its files unchanged
        fig.savefig(p, bbox_inches="tight", dpi=150,
                    metadata={"CreationDate": None} if p.suffix == ".pdf" else {"Software": None})
    plt.close(fig)
    return paths


def _grid(values: dict, Ks, Ns) -> pd.DataFrame:
    return pd.DataFrame([[values.get((k, n), np.nan) for n in Ns] for k in Ks], index=Ks, columns=Ns)


def hidden_heatmap(best: pd.DataFrame, blog: dict | None, out_dir: Path, title: str, subtitle: str = "",
                   blog_label: str = BLOG_LABEL, suffix: str = "", metric: str = "hidden_dsl",
                   what: str = "% of norm latency hidden", row_label: str = "K", col_label: str = "N") -> list[Path]:
    """Heatmaps of 100·``metric`` per DSL over (K rows, N columns; a caller plotting other axes puts them in the K
    and N columns and names them ``row_label`` / ``col_label``); ``blog`` maps (K, N) -> % (B200), drawn as the last
    panel titled ``blog_label``; ``what`` names the metric in the title. Written as ``hidden_heatmap<suffix>``."""
    dsls = [d for d in DSL_ORDER if d in set(best["dsl"])]
    Ks = sorted(set(best["K"]) | {k for k, _ in (blog or {})})
    Ns = sorted(set(best["N"]) | {n for _, n in (blog or {})})
    panels = [(d, _grid({(r.K, r.N): 100 * getattr(r, metric) for r in best[best.dsl == d].itertuples()}, Ks, Ns))
              for d in dsls]
    if blog:
        panels.append((blog_label, _grid(blog, Ks, Ns)))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False, layout="constrained")
    for ax, (panel, grid) in zip(axes[0], panels):
        sns.heatmap(grid, ax=ax, annot=True, fmt=".1f", cmap="RdYlGn", vmin=-50, vmax=100, cbar=False,
                    linewidths=0.5, annot_kws={"size": 9})
        ax.set_title(panel)
        ax.set_xlabel(col_label)
        ax.set_ylabel(row_label)
    fig.suptitle(f"{title}: {what}" + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return _save(fig, out_dir, f"hidden_heatmap{suffix}")


def hidden_bars(best: pd.DataFrame, blog: dict | None, out_dir: Path, title: str, subtitle: str = "",
                suffix: str = "", metric: str = "hidden_dsl", naive: dict | None = None,
                naive_label: str = "naive fusion", what: str = "% of norm latency hidden", row_label: str = "K",
                col_label: str = "N") -> list[Path]:
    """Grouped bars: one group per (K, N), one bar per DSL (100·``metric``), the blog's B200 value as a marker and,
    when given, ``naive`` {(K, N): %} (the best naive-fusion form of the same sweep) as a second marker.
    Written as ``hidden_bars<suffix>.png|pdf``."""
    d = best.copy()
    d["cell"] = [f"{row_label}={r.K}\n{col_label}={r.N}" for r in d.itertuples()]
    d["hidden %"] = 100 * d[metric]
    order = [f"{row_label}={k}\n{col_label}={n}" for k, n in sorted({(r.K, r.N) for r in d.itertuples()})]
    dsls = [x for x in DSL_ORDER if x in set(d["dsl"])]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(order)), 3.8))
    sns.barplot(data=d, x="cell", y="hidden %", hue="dsl", order=order, hue_order=dsls, palette=PALETTE, ax=ax,
                errorbar=None)  # one best value per cell and DSL: no (random bootstrap) error bars
    if blog:
        xs = [i for i, c in enumerate(order) if _cell_key(c) in blog]
        ax.scatter(xs, [blog[_cell_key(order[i])] for i in xs], marker="_", s=900, color="black", zorder=5,
                   label="blog B200")
    if naive:
        xs = [i for i, c in enumerate(order) if _cell_key(c) in naive]
        ax.scatter(xs, [naive[_cell_key(order[i])] for i in xs], marker="x", s=60, color="dimgrey", zorder=6,
                   label=naive_label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("")
    ax.set_ylabel(f"{metric} %")
    ax.legend(fontsize=8, ncol=4)
    ax.set_title(f"{title}: {what}" + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return _save(fig, out_dir, f"hidden_bars{suffix}")


def _cell_key(cell: str) -> tuple[int, int]:
    k, n = cell.split("\n")
    return int(k.split("=")[1]), int(n.split("=")[1])


def check_heatmap(df: pd.DataFrame, out_dir: Path, title: str) -> list[Path]:
    """CPU mode: per DSL and shape, the kernel's max error over its tolerance (<= 1 passes), or, for kernels that
    were only compiled for sm_90 (TLX), the word 'compiled'."""
    d = df[df["dsl"].isin(DSL_ORDER)].copy()
    d["shape"] = [f"{r.M}x{r.N}x{r.K}" for r in d.itertuples()]
    variants = d["variant"].astype(str)
    d["what"] = (variants + " " if d["variant"].nunique() > 1 else "") + d["impl"] + " / " + d["config_name"].astype(str)
    d["r"] = pd.to_numeric(d["max_abs_err"], errors="coerce") / pd.to_numeric(d["tol"], errors="coerce")
    dsls = [x for x in DSL_ORDER if x in set(d["dsl"])]
    fig, axes = plt.subplots(1, len(dsls), figsize=(4.2 * len(dsls), 1.6 + 0.45 * d["what"].nunique()),
                             squeeze=False, layout="constrained")
    for ax, dsl in zip(axes[0], dsls):
        g = d[d.dsl == dsl]
        grid = g.pivot_table(index="what", columns="shape", values="r", aggfunc="max", dropna=False)
        status = g.pivot_table(index="what", columns="shape", values="status", aggfunc="first").reindex_like(grid)
        annot = np.where(grid.notna(), grid.map(lambda v: f"{v:.2f}"),
                         status.replace({"compile_only": "compiled"}).fillna(""))
        sns.heatmap(grid.fillna(0.0), ax=ax, annot=annot, fmt="", cmap="RdYlGn_r", vmin=0, vmax=2, cbar=False,
                    linewidths=0.5, annot_kws={"size": 8})
        mode = g["mode"].iloc[0]
        ax.set_title(f"{dsl} ({mode})" + ("\nsm_90 PTX only, not executed" if mode == "compile_only" else ""),
                     fontsize=9)
        ax.set_xlabel("M x N x K")
        ax.set_ylabel("")
    fig.suptitle(f"{title}: CPU mode, correctness only — max error / tolerance (<= 1 passes). NOT timings",
                 fontsize=10)
    return _save(fig, out_dir, "check_heatmap")


def bandwidth_lines(best: pd.DataFrame, copy_tbps: float | None, out_dir: Path, title: str, subtitle: str = "") -> list[Path]:
    """Memory-bound kernels: GB/s over N per implementation (best config), one panel per (variant, M), with the
    measured copy bandwidth drawn as the ceiling (QuACK-style)."""
    d = best.copy()
    d["impl_label"] = [r.dsl if r.dsl != "torch" else r.impl for r in d.itertuples()]
    variants = sorted({r.variant for r in d.itertuples()})
    Ms = sorted({r.M for r in d.itertuples()})
    fig, axes = plt.subplots(len(variants), len(Ms), figsize=(4.2 * len(Ms), 3.4 * len(variants)), squeeze=False,
                             layout="constrained", sharey=True)
    for ax, (variant, M) in zip(axes.flat, [(v, m) for v in variants for m in Ms]):
        g = d[(d.variant == variant) & (d.M == M)]
        sns.lineplot(data=g, x="N", y="gbps", hue="impl_label", marker="o", ax=ax)
        if copy_tbps:
            ax.axhline(copy_tbps * 1000, color="black", ls="--", lw=1, label="copy")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{variant}, M = {M}", fontsize=9)
        ax.set_ylabel("GB/s (read x + write y)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}: bandwidth" + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return _save(fig, out_dir, "bandwidth")


def _config_field(cfg, key):
    """``cfg[key]`` for a config stored as a dict or as a JSON string (parquet); None if absent."""
    if isinstance(cfg, str):
        import json

        try:
            cfg = json.loads(cfg)
        except ValueError:
            return None
    return cfg.get(key) if isinstance(cfg, dict) else None


def cluster_sweep(df: pd.DataFrame, out_dir: Path, title: str, subtitle: str = "",
                  blog: dict | None = None) -> list[Path]:
    """% of norm latency hidden (hidden_dsl, best correct config per cluster size) over the cluster size, for the
    fused rows whose config has a ``CLUSTER_SIZE`` (TLX multi-CTA). Panels: rows = variants, columns = N; one
    line per K; ``blog`` maps variant -> {(K, N): %} (dashed, same colour). Returns [] when no row qualifies."""
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
    best = d.loc[d.groupby(["variant", "M", "N", "K", "C"])["hidden %"].idxmax()]
    variants = sorted(best["variant"].dropna().unique())
    Ns = sorted(best["N"].unique())
    Ks = sorted(best["K"].unique())
    colors = dict(zip(Ks, sns.color_palette("viridis", len(Ks))))
    fig, axes = plt.subplots(len(variants), len(Ns), figsize=(3.4 * len(Ns), 3.0 * len(variants)), squeeze=False,
                             layout="constrained", sharey=True)
    for i, v in enumerate(variants):
        for j, n in enumerate(Ns):
            ax = axes[i][j]
            for k in Ks:
                g = best[(best.variant == v) & (best.N == n) & (best.K == k)].sort_values("C")
                if len(g):
                    ax.plot(g["C"], g["hidden %"], marker="o", color=colors[k], label=f"K={k}")
                ref = (blog or {}).get(v, {}).get((k, n)) if isinstance((blog or {}).get(v), dict) else None
                if ref is not None:
                    ax.axhline(ref, color=colors[k], ls="--", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8, 16])
            ax.set_xticklabels(["1", "2", "4", "8", "16"])
            ax.axhline(0, color="grey", lw=0.6)
            ax.set_title(f"{v}, N = {n}", fontsize=9)
            ax.set_xlabel("CTAs per cluster")
            if j == 0:
                ax.set_ylabel("% of norm hidden")
            ax.legend(fontsize=7)
    fig.suptitle(f"{title}: cluster-size sweep (best config per size; dashed: blog B200)"
                 + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return _save(fig, out_dir, "cluster_sweep")


def tflops_bars(table: pd.DataFrame, out_dir: Path, title: str, subtitle: str = "") -> list[Path]:
    """Grouped bars of TFLOP/s: one group per row of ``table`` (index: variant, S, ...; columns: implementation
    labels such as ``sdpa``, ``triton attention``, ``triton fused``), the baselines in grey, each DSL's attention
    without norms hatched next to its fused kernel. Written as ``tflops_bars.png|pdf``."""
    t = table.copy()
    t.index = ["\n".join(f"{k}={v}" if k not in ("variant",) else str(v) for k, v in zip(t.index.names, idx))
               for idx in t.index]
    cols = list(t.columns)
    fig, ax = plt.subplots(figsize=(max(6, 1.9 * len(t)), 3.8))
    width = 0.8 / max(1, len(cols))
    for j, c in enumerate(cols):
        dsl = c.split()[0]
        color = PALETTE.get(dsl, "0.6" if "norm" in c else "0.35")
        ax.bar(np.arange(len(t)) + (j - (len(cols) - 1) / 2) * width, t[c].to_numpy(float), width, label=c,
               color=color, hatch="//" if c.endswith("attention") else None, edgecolor="white", linewidth=0.5)
    ax.set_xticks(np.arange(len(t)), t.index, fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    ax.set_title(f"{title}: attention TFLOP/s" + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return _save(fig, out_dir, "tflops_bars")
