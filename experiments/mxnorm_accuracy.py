"""MXNorm accuracy study (CPU): how well the block-absmax estimate reproduces RMSNorm, and what it does to the
MXFP8 output.

    python -m experiments.mxnorm_accuracy [--rows 2048] [--out results/mxnorm_accuracy]

For D in {1024, 4096, 8192}, inputs "gaussian" (N(0,1)), "student_t" (3 degrees of freedom, heavy tails) and
"outlier_channels" (N(0,1) with 8 fixed columns x20, as in LLM activations), rows rounded to bf16 like the kernels'
inputs, and p in {1, 2}:

* the per-row estimate error ``rho_tilde / rho`` = MXNorm's rstd over RMSNorm's rstd (both
  ``normfuse.techniques.mxnorm.reference_rstd``, eps = 1e-6): its distribution (mean, std, coefficient of
  variation std/mean, quantiles) and the implied constant ``G / RMS`` (what c(p, 32) would have to be for that
  distribution). A mean away from 1 is a constant scale (c is calibrated on Gaussians), which training absorbs into
  the next layer (gamma is folded there anyway); the row-to-row spread (``ratio_cv``) is the part it cannot;
* the output error, against the exact normalized row ``y = x * rho`` (fp64): the relative (Frobenius) error of the
  dequantized MXFP8 cast of RMSNorm's output (the baseline: quantization only) and of MXNorm's output (the same
  cast of ``x * rho_tilde``: estimate error + quantization), MXNorm's error after dividing by the mean ratio (the
  constant bias removed: row-to-row estimate error + quantization; what a trained next layer sees) and after
  removing the per-row scalar (``y_mx * rho / rho_tilde``: quantization at MXNorm's scales only), for FLOOR and
  RCEIL; the fraction of elements that saturate at 448.

Writes ``rows.parquet`` (one row per (distribution, D, p, input row): the ratio), ``summary.parquet`` /
``summary.md`` (per distribution, D, p, scale mode), ``meta.json`` and ``plots/{ratio,output_error}.{png,pdf}``.
Deterministic (seeded). Source: McLean et al., arXiv 2603.13180 (the paper's estimator and constants).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from normfuse import mxfp8
from normfuse.techniques import mxnorm as T

DS = (1024, 4096, 8192)
DISTS = T.DISTRIBUTIONS
PS = (1, 2)
EPS = 1e-6
_META = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None}}  # byte-stable figures


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row relative Frobenius error ||a - b|| / ||b|| (fp64)."""
    return (a.double() - b.double()).norm(dim=-1) / b.double().norm(dim=-1)


def study(rows: int = 2048, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the study; return (per-row ratios, summary)."""
    per_row, summary = [], []
    for di, dist in enumerate(DISTS):
        for D in DS:
            g = torch.Generator().manual_seed(seed + 1000 * di + D)
            x = T.sample_rows(rows, D, dist, generator=g).to(torch.bfloat16)
            xf = x.float()
            rho = T.reference_rstd("rmsnorm_cast", x, EPS)
            y = xf.double() * rho.double()[:, None]  # the exact RMSNorm output
            base = {}
            for mode in mxfp8.SCALE_MODES:
                d, s = mxfp8.quantize(xf * rho[:, None], mode)
                base[mode] = _rel(mxfp8.dequantize(d, s), y)
            for p in PS:
                rho_mx = T.reference_rstd(f"mxnorm_p{p}", x, EPS)
                ratio = (rho_mx.double() / rho.double()).numpy()
                m = mxfp8.block_amax(xf)
                G = m.double().pow(p).mean(-1).pow(1.0 / p)
                rms = xf.double().pow(2).mean(-1).sqrt()
                implied_c = (G / rms).numpy()
                per_row.append(pd.DataFrame({"distribution": dist, "D": np.int32(D), "p": np.int8(p),
                                             "row": np.arange(rows, dtype=np.int32),
                                             "ratio": ratio.astype(np.float32)}))
                q = np.quantile(ratio, [0.001, 0.01, 0.05, 0.5, 0.95, 0.99, 0.999])
                for mode in mxfp8.SCALE_MODES:
                    d, s = mxfp8.quantize(xf * rho_mx[:, None], mode)
                    y_mx = mxfp8.dequantize(d, s).double()
                    err_mx = _rel(y_mx, y)
                    err_mx_rescaled = _rel(y_mx * (rho.double() / rho_mx.double())[:, None], y)
                    err_mx_const = _rel(y_mx / float(ratio.mean()), y)
                    sat = (d.view(torch.uint8) & 0x7F) == 0x7E
                    summary.append({
                        "distribution": dist, "D": D, "p": p, "scale_mode": mode, "rows": rows,
                        "c_used": mxfp8.correction_constant(p, 32), "implied_c_mean": float(implied_c.mean()),
                        "ratio_mean": float(ratio.mean()), "ratio_std": float(ratio.std()),
                        "ratio_cv": float(ratio.std() / ratio.mean()),
                        "ratio_abs_err_mean": float(np.abs(ratio - 1).mean()),
                        "ratio_q001": q[0], "ratio_q01": q[1], "ratio_q05": q[2], "ratio_q50": q[3],
                        "ratio_q95": q[4], "ratio_q99": q[5], "ratio_q999": q[6],
                        "out_rel_err_rmsnorm_cast": float(base[mode].mean()),
                        "out_rel_err_mxnorm_cast": float(err_mx.mean()),
                        "out_rel_err_mxnorm_cast_p99": float(err_mx.quantile(0.99)),
                        "out_rel_err_mxnorm_const_corrected": float(err_mx_const.mean()),
                        "out_rel_err_mxnorm_rescaled": float(err_mx_rescaled.mean()),
                        "saturated_frac": float(sat.float().mean()),
                    })
    return pd.concat(per_row, ignore_index=True), pd.DataFrame(summary)


def plot(rows_df: pd.DataFrame, summary: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, len(DISTS), figsize=(4.2 * len(DISTS), 3.6), sharey=False, layout="constrained")
    colors = {1: "#DD8452", 2: "#4C72B0"}
    for ax, dist in zip(axes, DISTS):
        data, pos, cols = [], [], []
        for i, D in enumerate(DS):
            for j, p in enumerate(PS):
                r = rows_df[(rows_df.distribution == dist) & (rows_df.D == D) & (rows_df.p == p)]["ratio"]
                data.append(r.to_numpy())
                pos.append(i * 3 + j)
                cols.append(colors[p])
        bp = ax.boxplot(data, positions=pos, widths=0.8, whis=(1, 99), showfliers=False, patch_artist=True)
        for patch, c in zip(bp["boxes"], cols):
            patch.set_facecolor(c)
            patch.set_alpha(0.7)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks([i * 3 + 0.5 for i in range(len(DS))], [str(D) for D in DS])
        ax.set_xlabel("D")
        ax.set_title(dist)
    axes[0].set_ylabel("rho_tilde / rho  (MXNorm rstd / RMSNorm rstd)")
    axes[-1].legend([plt.Rectangle((0, 0), 1, 1, color=colors[p], alpha=0.7) for p in PS], [f"p = {p}" for p in PS],
                    loc="best", fontsize=8)
    fig.suptitle("MXNorm per-row estimate error (boxes: quartiles, whiskers: 1st-99th percentile), bf16 inputs",
                 fontsize=10)
    for ext in ("png", "pdf"):
        fig.savefig(out / f"ratio.{ext}", dpi=150, bbox_inches="tight", metadata=_META[ext])
        paths.append(out / f"ratio.{ext}")
    plt.close(fig)

    s = summary[summary.scale_mode == "floor"]
    fig, axes = plt.subplots(1, len(DISTS), figsize=(4.2 * len(DISTS), 3.4), sharey=True, layout="constrained")
    width = 0.25
    for ax, dist in zip(axes, DISTS):
        sd = s[s.distribution == dist]
        xs = np.arange(len(DS))

        def col(p, name):
            return [sd[(sd.D == D) & (sd.p == p)][name].iloc[0] for D in DS]

        ax.bar(xs - width, col(1, "out_rel_err_rmsnorm_cast"), width, label="RMSNorm + cast", color="#55A868")
        for k, p in enumerate(PS):
            at = xs + k * width
            ax.bar(at, col(p, "out_rel_err_mxnorm_const_corrected"), width, color=colors[p], alpha=0.8,
                   label=f"MXNorm p={p} + cast, constant bias removed")
            ax.scatter(at, col(p, "out_rel_err_mxnorm_cast"), marker="x", s=30, color=colors[p], zorder=3,
                       label=f"MXNorm p={p} + cast, as is")
            ax.scatter(at, col(p, "out_rel_err_mxnorm_rescaled"), marker="_", s=120, color="k", zorder=3,
                       label="per-row scale corrected (quantization only)" if k == 0 else None)
        ax.set_xticks(xs + width / 2, [str(D) for D in DS])
        ax.set_xlabel("D")
        ax.set_title(dist)
        ax.set_yscale("log")
    axes[0].set_ylabel("mean relative error vs exact RMSNorm output")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=7)
    fig.suptitle("Dequantized MXFP8 output (FLOOR) against x * rho (fp64), bf16 inputs", fontsize=10)
    for ext in ("png", "pdf"):
        fig.savefig(out / f"output_error.{ext}", dpi=150, bbox_inches="tight", metadata=_META[ext])
        paths.append(out / f"output_error.{ext}")
    plt.close(fig)
    return paths


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2048, help="rows per (distribution, D)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "mxnorm_accuracy")
    args = ap.parse_args(argv)
    if args.rows < 1:
        raise SystemExit("--rows must be >= 1")
    from normfuse.sweep import git_info

    git = git_info()  # before writing: the outputs themselves are tracked files
    rows_df, summary = study(args.rows, args.seed)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    rows_df.to_parquet(out / "rows.parquet", index=False)
    summary.to_parquet(out / "summary.parquet", index=False)
    cols = ["distribution", "D", "p", "scale_mode", "implied_c_mean", "ratio_mean", "ratio_cv", "ratio_q01",
            "ratio_q99", "out_rel_err_rmsnorm_cast", "out_rel_err_mxnorm_cast", "out_rel_err_mxnorm_const_corrected",
            "out_rel_err_mxnorm_rescaled",
            "saturated_frac"]
    text = ("MXNorm accuracy (bf16 inputs, eps = 1e-6, c(1,32) = %.6f, c(2,32) = %.6f)\n\n"
            % (mxfp8.correction_constant(1, 32), mxfp8.correction_constant(2, 32))
            + summary[cols].to_markdown(index=False, floatfmt=".4g") + "\n")
    (out / "summary.md").write_text(text)
    plot(rows_df, summary, out / "plots")

    meta = {"experiment": "mxnorm_accuracy", "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m experiments.mxnorm_accuracy " + " ".join(argv or []), "rows": args.rows,
            "seed": args.seed, "D": list(DS), "distributions": list(DISTS), "p": list(PS), "eps": EPS,
            "torch": torch.__version__, "mode": "cpu (no timings)", **git}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    print(text)
    return out


if __name__ == "__main__":
    main()
