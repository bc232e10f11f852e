"""Cross-variant report of an ``mxnorm_kernels`` run: the speedups the generic summary (one table per variant) does
not show.

    python -m experiments.mxnorm_report results/mxnorm_kernels/<run_id>

Writes ``<run>/mxnorm_summary.md`` and ``<run>/plots/mxnorm_speedup.{png,pdf}``:

* per (T, D): the best p50 (us) of each DSL's ``rmsnorm_cast`` / ``mxnorm_p1`` / ``mxnorm_p2`` kernel and of both
  torch.compile baselines, each MXNorm kernel's speedup over torch.compile RMSNorm + FLOOR cast (the paper's
  comparison: up to 2.4x on GB200) and over the same DSL's single-pass RMSNorm + cast;
* the best GB/s of each as a fraction of the measured copy bandwidth (``meta.json`` calibration);
* the issue's targets: best MXNorm kernel >= 90 % of copy bandwidth at T >= 16384, and at least as fast as the best
  single-pass RMSNorm + cast (both move the same bytes), with the margin.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from normfuse.techniques import mxnorm as T

PAPER_MAX_SPEEDUP = 2.4  # GB200, torch.compile MXNorm vs torch.compile RMSNorm + MXCast (arXiv 2603.13180)


def tables(df: pd.DataFrame, copy_tbps: float | None) -> dict:
    """``{"speedups", "bandwidth", "targets"}`` DataFrames from the run's rows (status ok, p50 present)."""
    ok = df[(df["status"] == "ok") & df["p50_ms"].notna()].copy()
    ok["who"] = [(r.impl if r.dsl == "torch" else f"{r.dsl}/{r.variant}") for r in ok.itertuples()]
    ok["gbps"] = [T.bytes_moved("norm_cast", int(r.M), int(r.N)) / (r.p50_ms * 1e-3) / 1e9 for r in ok.itertuples()]
    bw = ok.groupby(["M", "N", "who"])["gbps"].max().unstack("who")
    if copy_tbps:
        bw = (bw / (copy_tbps * 1e3) * 100).round(1).add_suffix(" % copy")
    rows = []
    for (M, N), g in ok.groupby(["M", "N"]):
        best = lambda pred: g[pred(g)]["p50_ms"].min()  # noqa: E731
        t_mx = best(lambda d: (d.dsl != "torch") & d.variant.str.startswith("mxnorm"))
        t_rms = best(lambda d: (d.dsl != "torch") & (d.variant == "rmsnorm_cast"))
        t_tc = best(lambda d: d.impl == "torch_compile_rmsnorm_cast")
        gb = T.bytes_moved("norm_cast", int(M), int(N)) / (t_mx * 1e-3) / 1e9 if np.isfinite(t_mx) else np.nan
        rows.append({"T": M, "D": N, "best mxnorm us": t_mx * 1e3, "best rmsnorm_cast us": t_rms * 1e3,
                     "mxnorm vs rmsnorm_cast": t_rms / t_mx, "mxnorm vs tc_rms_cast": t_tc / t_mx,
                     "mxnorm % copy": 100 * gb / (copy_tbps * 1e3) if copy_tbps else np.nan,
                     "target 90% copy": (gb >= 0.9 * copy_tbps * 1e3) if (copy_tbps and M >= 16384) else None,
                     "target >= rmsnorm_cast": bool(t_mx <= t_rms) if np.isfinite(t_rms) else None})
    return {"speedups": T.speedups(df), "bandwidth": bw.reset_index(), "targets": pd.DataFrame(rows)}


def plot(speed: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [c for c in speed.columns if c.endswith(" vs tc_rms_cast")]
    Ds = sorted(speed["N"].unique())
    if not cols or not Ds:
        return []
    fig, axes = plt.subplots(1, len(Ds), figsize=(3.4 * len(Ds), 3.2), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, D in zip(axes[0], Ds):
        g = speed[speed.N == D].sort_values("M")
        for c in cols:
            ax.plot(g["M"], g[c], marker="o", label=c.replace(" vs tc_rms_cast", ""))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(PAPER_MAX_SPEEDUP, color="grey", ls="--", lw=0.8, label="paper max (GB200)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"D = {D}", fontsize=9)
        ax.set_xlabel("T (tokens)")
    axes[0][0].set_ylabel("speedup over torch.compile RMSNorm + cast")
    axes[0][-1].legend(fontsize=6)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        fig.savefig(out / f"mxnorm_speedup.{ext}", dpi=150, bbox_inches="tight")
        paths.append(out / f"mxnorm_speedup.{ext}")
    plt.close(fig)
    return paths


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    run = args.run_dir
    if (run / "results.parquet").exists():
        df = pd.read_parquet(run / "results.parquet")
    elif (run / "results.jsonl").exists():
        from normfuse.results import ResultsStore

        df = ResultsStore(run).dataframe()
    else:
        raise SystemExit(f"{run} has no results.parquet or results.jsonl")
    df["p50_ms"] = pd.to_numeric(df["p50_ms"], errors="coerce")
    meta = json.loads((run / "meta.json").read_text()) if (run / "meta.json").exists() else {}
    copy_tbps = (meta.get("calibration") or {}).get("copy_tbps")
    t = tables(df, copy_tbps)
    text = [f"# {run.name}: MXNorm vs RMSNorm + MXFP8 cast (copy bandwidth "
            f"{f'{copy_tbps:.3f}' if copy_tbps else '?'} TB/s)", ""]
    for name in ("targets", "speedups", "bandwidth"):
        tab = t[name].rename(columns={"M": "T", "N": "D"})  # the runner's M, N are tokens and hidden size here
        tab = tab.astype({c: int for c in ("T", "D") if c in tab}).astype({c: str for c in ("T", "D") if c in tab})  # printed as integers, not 1.02e+03
        text += [f"## {name}", "", tab.to_markdown(index=False, floatfmt=".3g") if len(tab) else "(no data)", ""]
    out = "\n".join(text)
    (run / "mxnorm_summary.md").write_text(out)
    if len(t["speedups"]):
        plot(t["speedups"], run / "plots")
    print(out)
    return out


if __name__ == "__main__":
    main()
