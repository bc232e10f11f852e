"""How much did the replay order within a paired round bias the committed paired runs?

A paired window replays every participant once per round; participants live in two worker processes, "upstream"
(dsl torch / triton / helion) and "tlx". A sample taken right after a replay in the *other* process reads ~1 %
short (results/norms_inductor_aa/). With the old ``rotated`` order (round r starts at position r mod L of the
participant list) the same participants follow the other process's block in nearly every round. This tool
rebuilds each window's replay sequence (``position`` when the rows carry it, else the file order within
(replicate, window, round): ``normfuse.sweep._paired_window`` writes the rows in replay order), labels each sample
``after_switch`` when the previous replay of the window -- across round boundaries too -- ran in the other process
(the window's first sample has no previous one and is left out of the comparisons), and reports per run and
participant the share of after-switch samples and, for participants with share >= ``SYSTEMATIC`` (0.75), the
bias: median of all samples / median of the samples that were not after a switch, minus 1 (%, per window, then
the median over windows; negative = read fast). Times are ms; ``rel`` = sample / the participant's median in its
window (dimensionless).

    .venv/bin/python -m tools.order_bias [--root results] [--write]   # --write: results/harness_order_bias/
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from normfuse.paired import read_rounds, rounds_path

SYSTEMATIC = 0.75  # share of after-switch samples from which a participant's time counts as biased
REPO = Path(__file__).resolve().parents[1]
OUT_DIR = Path("results/harness_order_bias")
WIN = ["part", "replicate", "window"]  # one window: the rep folder, the replicate and the runner's window number
WHO = ["dsl", "impl", "config_name"]


def worker_envs() -> dict:
    """dsl -> the worker environment (process) it runs in: ``env`` of configs/dsl/<dsl>.yaml, and the torch
    baselines' ``baseline_env`` of configs/config.yaml (today: tlx -> "tlx", everything else -> "upstream")."""
    import yaml

    envs = {p.stem: yaml.safe_load(p.read_text())["env"] for p in (REPO / "configs" / "dsl").glob("*.yaml")}
    envs["torch"] = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())["baseline_env"]
    return envs


def find_runs(root: Path) -> dict[Path, list[Path]]:
    """Run folder -> the folders holding its rounds file (the run itself, or its rep*/ subfolders)."""
    runs: dict[Path, list[Path]] = {}
    for f in sorted(Path(root).rglob("paired_rounds.jsonl*")):
        if rounds_path(f.parent) != f:  # both .jsonl.gz and .jsonl: count the folder once
            continue
        d = f.parent
        runs.setdefault(d.parent if d.name.startswith("rep") else d, []).append(d)
    return runs


def label(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (rounds rows of one run, in file order; ``part`` names the rep folder) in replay order, with columns
    ``process`` ("tlx" / "upstream"), ``slot`` (place within the round), ``seq`` (place within the window),
    ``prev_process`` (None for the window's first sample), ``after_switch`` (bool), ``rel`` (ms / participant's
    window median). Windows whose samples all ran in one process are dropped."""
    df = df.copy()
    df["file_order"] = np.arange(len(df))
    df["process"] = df["dsl"].map(worker_envs())
    pos = df["position"] if "position" in df else pd.Series(np.nan, index=df.index)
    df["slot"] = pos.fillna(df.groupby([*WIN, "round"]).cumcount()).astype(float)
    df = df.sort_values([*WIN, "round", "slot", "file_order"]).reset_index(drop=True)
    df = df[df.groupby(WIN)["process"].transform("nunique") > 1].reset_index(drop=True)
    g = df.groupby(WIN)
    df["seq"] = g.cumcount()
    df["prev_process"] = g["process"].shift(1)
    df["after_switch"] = df["prev_process"].notna() & (df["prev_process"] != df["process"])
    df["participant"] = df["dsl"] + "/" + df["impl"] + "/" + df["config_name"].astype(str)
    df["rel"] = df["ms"] / df.groupby([*WIN, "participant"])["ms"].transform("median")
    return df


def window_order(df: pd.DataFrame) -> pd.Series:
    """Per window of labelled rows: "rotated" when every round is round 0's order started at r mod L, else
    "shuffled"."""
    def one(w):
        seqs = [list(x) for _, x in w.groupby("round", sort=True)["participant"]]
        first = seqs[0]
        ok = all(s == first[r % len(first):] + first[:r % len(first)] for r, s in enumerate(seqs))
        return "rotated" if ok else "shuffled"
    return df.groupby(WIN).apply(one, include_groups=False)


def load_run(run: Path, parts: list[Path]) -> pd.DataFrame:
    """All rounds rows of one run, labelled (``label``); empty when no window holds two processes."""
    frames = []
    for d in parts:
        r = read_rounds(d)
        if r is not None:
            frames.append(r.assign(part=d.name if d != run else "."))
    return label(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()


def window_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Per (participant, window) of labelled rows (the window's first sample left out): ``ms`` (median of all
    samples), ``ms_after`` / ``ms_other`` (medians after a switch / otherwise), ``share_after``, ``n``, and
    ``switch_effect`` = ms_after / ms_other - 1 (a fraction; NaN unless both kinds were sampled)."""
    d = df[df["prev_process"].notna()]
    key = ["participant", "process", "impl", *WIN]
    out = d.groupby(key).agg(ms=("ms", "median"), share_after=("after_switch", "mean"), n=("ms", "size"))
    out["ms_after"] = d[d["after_switch"]].groupby(key)["ms"].median()
    out["ms_other"] = d[~d["after_switch"]].groupby(key)["ms"].median()
    out["switch_effect"] = out["ms_after"] / out["ms_other"] - 1.0
    return out.reset_index()


def switch_effects(ws: pd.DataFrame) -> dict:
    """Per process: the median ``switch_effect`` over the participant-windows that sampled both kinds."""
    return ws.dropna(subset=["switch_effect"]).groupby("process")["switch_effect"].median().to_dict()


def hidden_shift(ws: pd.DataFrame, effects: dict) -> pd.Series:
    """Per fused participant: median over windows of the first-order shift (points, 100 = 1.0) the order gave
    ``hidden_dsl = (T_gemm + T_norm - T_fused) / T_norm`` (``normfuse.metrics.add_hidden``), taking every
    participant-window's time as biased by ``share_after * effect[process]``; only windows holding a
    torch_compile_norm and the DSL's own ``gemm``."""
    w = ws.assign(dsl=ws["participant"].str.split("/").str[0])
    w["true"] = w["ms"] / (1.0 + w["share_after"] * w["process"].map(effects).fillna(0.0))
    out = {}
    for _, g in w.groupby(WIN):
        norm = g[g["impl"] == "torch_compile_norm"]
        for f in g[g["impl"] == "fused"].itertuples():
            gemm = g[(g["impl"] == "gemm") & (g["dsl"] == f.dsl)]
            if norm.empty or gemm.empty:
                continue
            h = lambda c, fc: (gemm[c].min() + norm[c].iloc[0] - fc) / norm[c].iloc[0]  # noqa: E731
            out.setdefault(f.participant, []).append((f.share_after >= SYSTEMATIC,
                                                      100 * (h("ms", f.ms) - h("true", f.true))))
    # a participant's systematic windows when it has any (the first TLX entry can differ from shape to shape)
    pick = {k: [x for flag, x in v if flag] or [x for _, x in v] for k, v in out.items()}
    return pd.Series({k: float(np.median(v)) for k, v in pick.items()}, name="hidden_shift_pts", dtype=float)


def shape_effects(df: pd.DataFrame, ws: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, M, N, K, process): the median ``switch_effect`` (%) over its participant-windows, their
    count and the median participant time (ms) -- the effect is closer to a few us than to a fixed fraction."""
    shp = df.groupby(WIN)[["variant", "M", "N", "K"]].first().reset_index()
    w = ws.dropna(subset=["switch_effect"]).merge(shp, on=WIN)
    g = w.groupby(["variant", "M", "N", "K", "process"], dropna=False)
    return g.agg(effect_pct=("switch_effect", lambda x: 100 * x.median()), n=("switch_effect", "size"),
                 ms=("ms", "median")).reset_index()


def run_summary(df: pd.DataFrame, ws: pd.DataFrame) -> dict:
    """One run's labelled rows -> windows, order, and per process the median ``rel`` after a switch / otherwise
    (pooled over participants), the after-switch sample count and the switch effect (%, ``switch_effects``)."""
    orders = window_order(df)
    out = {"windows": int(len(orders)), "order": "/".join(sorted(set(orders)))}
    has_prev = df["prev_process"].notna()
    eff = switch_effects(ws)
    for proc in ("upstream", "tlx"):
        s = df[has_prev & (df["process"] == proc)]
        out[f"{proc}_rel_after"] = s.loc[s["after_switch"], "rel"].median()
        out[f"{proc}_rel_other"] = s.loc[~s["after_switch"], "rel"].median()
        out[f"{proc}_n_after"] = int(s["after_switch"].sum())
        out[f"{proc}_effect_pct"] = 100 * eff.get(proc, np.nan)
    return out


def participant_table(df: pd.DataFrame, ws: pd.DataFrame) -> pd.DataFrame:
    """Per participant of one run: samples, windows, ``share_after`` (over all its samples), median ``rel`` after /
    otherwise, ``systematic_windows`` (windows where its share was >= SYSTEMATIC: the first TLX entry of the list
    can differ from shape to shape), ``systematic`` (any such window); over its systematic windows when it has any,
    else over all: ``bias_pct`` = median of (ms / ms_other - 1) * 100 (direct; NaN where no window sampled it
    outside a switch) and its min / max, ``bias_est_pct`` = median of the window's share_after * the run's switch
    effect of its process (%), ``hidden_shift_pts`` (``hidden_shift``) for fused participants where easy."""
    d = df[df["prev_process"].notna()]
    t = d.groupby("participant").agg(process=("process", "first"), samples=("ms", "size"),
                                     share_after=("after_switch", "mean"))
    t["windows"] = ws.groupby("participant").size()
    t["rel_after"] = d[d["after_switch"]].groupby("participant")["rel"].median()
    t["rel_other"] = d[~d["after_switch"]].groupby("participant")["rel"].median()
    eff = switch_effects(ws)
    w = ws.assign(sys_window=ws["share_after"] >= SYSTEMATIC,
                  direct=(ws["ms"] / ws["ms_other"] - 1.0) * 100,
                  est=100 * ws["share_after"] * ws["process"].map(eff))
    t["systematic_windows"] = w.groupby("participant")["sys_window"].sum().astype(int)
    t["systematic"] = t["systematic_windows"] > 0
    # the bias over a participant's systematic windows when it has any, else over all its windows
    w = w[w["sys_window"] | ~w["participant"].map(t["systematic"])]
    t = t.join(w.groupby("participant")["direct"].agg(bias_pct="median", bias_pct_min="min", bias_pct_max="max"))
    t["bias_est_pct"] = w.groupby("participant")["est"].median()
    t = t.join(hidden_shift(ws, eff))
    return t.reset_index()


def analyse(root: Path = Path("results")) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per-run, per-participant, per-shape effect tables) over every run under ``root`` with two-process
    paired windows."""
    tracked = set(subprocess.run(["git", "ls-files", str(root)], capture_output=True, text=True).stdout.split())
    runs, parts, shapes = [], [], []
    for run, dirs in find_runs(root).items():
        df = load_run(run, dirs)
        if df.empty:
            continue
        name = str(run.relative_to(root))
        committed = all(str(rounds_path(d)) in tracked for d in dirs)
        ws = window_stats(df)
        runs.append({"run": name, "committed": committed, "replicates": len(dirs), **run_summary(df, ws)})
        parts.append(participant_table(df, ws).assign(run=name))
        shapes.append(shape_effects(df, ws).assign(run=name))
    cols = ["run", "participant", "process"]
    pt = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    sh = pd.concat(shapes, ignore_index=True) if shapes else pd.DataFrame(columns=["run", "effect_pct"])
    return pd.DataFrame(runs), pt[cols + [c for c in pt.columns if c not in cols]], sh


def _f(x, fmt="{:.3f}") -> str:
    return "–" if pd.isna(x) else fmt.format(x)


def markdown(runs: pd.DataFrame, parts: pd.DataFrame, shapes: pd.DataFrame | None = None) -> str:
    """The report: method, command, the per-run table, the systematic participants, the shapes whose switch
    effect reached 2 %."""
    lines = [
        "# Replay-order bias of the paired runs", "",
        "Regenerate: `.venv/bin/python -m tools.order_bias --write` (repo root; "
        "[tools/order_bias.py](../../tools/order_bias.py)).", "",
        "Method. Each window's replay sequence is rebuilt (`position` when present, else the file order within the "
        "round: the runner writes rows in replay order). A sample is *after switch* when the previous replay of its "
        "window (across rounds) ran in the other worker process (tlx vs upstream = torch/triton/helion); the "
        "window's first sample is left out, windows of one process are skipped. `rel` = sample / the participant's "
        "median in its window. *Effect* (per process) = median over participant-windows that sampled both kinds of "
        "(median after switch / median otherwise − 1); in `rotated` runs these are the few round-boundary switches "
        "of otherwise unswitched participants. A participant is *systematic* when ≥ "
        f"{SYSTEMATIC:.0%} of its samples were after a switch in at least one window (its *systematic windows*; "
        "the bias columns then cover those windows only). Its bias: *direct* = median over windows of (median "
        "of all its samples / median of its samples not after a switch − 1), undefined when every sample was after "
        "a switch (all systematic participants of `rotated` runs); *est.* = share × the run's effect for its "
        "process. Negative = read fast. Δhidden = first-order shift of `hidden_dsl` (points) of a fused "
        "participant from every participant's est. bias, in windows with torch_compile_norm and the DSL's GEMM. "
        "Ratio metrics t_ref / t_x are biased by about est(x) − est(ref).", "",
        "## Per run", "",
        "| run | committed | order | reps | windows | upstream rel after / other | upstream effect % |"
        " tlx rel after / other | tlx effect % | systematic: est. % (direct %) [Δhidden pts] |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs.itertuples():
        s = parts[(parts["run"] == r.run) & parts["systematic"]]
        sys_txt = "; ".join(
            f"`{p.participant}` {_f(p.bias_est_pct, '{:+.2f}')} ({_f(p.bias_pct, '{:+.2f}')})"
            + ("" if pd.isna(p.hidden_shift_pts) else f" [{p.hidden_shift_pts:+.2f}]") for p in s.itertuples())
        lines.append(f"| {r.run} | {'yes' if r.committed else 'no'} | {r.order} | {r.replicates} | {r.windows} | "
                     f"{_f(r.upstream_rel_after)} / {_f(r.upstream_rel_other)} | {_f(r.upstream_effect_pct, '{:+.2f}')} | "
                     f"{_f(r.tlx_rel_after)} / {_f(r.tlx_rel_other)} | {_f(r.tlx_effect_pct, '{:+.2f}')} | "
                     f"{sys_txt or 'none'} |")
    lines += ["", "## Systematic participants", "",
              "| run | participant | share after switch (all windows) | systematic windows / windows |"
              " bias direct % [min, max] | bias est. % | Δhidden pts |", "|---|---|---|---|---|---|---|"]
    for p in parts[parts["systematic"]].itertuples():
        lines.append(f"| {p.run} | `{p.participant}` | {p.share_after:.2f} | {p.systematic_windows} / {p.windows} | "
                     f"{_f(p.bias_pct, '{:+.2f}')} [{_f(p.bias_pct_min, '{:+.1f}')}, {_f(p.bias_pct_max, '{:+.1f}')}] | "
                     f"{_f(p.bias_est_pct, '{:+.2f}')} | {_f(p.hidden_shift_pts, '{:+.2f}')} |")
    big = shapes[shapes["effect_pct"].abs() >= 2] if shapes is not None else shapes
    if big is not None and len(big):
        lines += ["", "## Shapes with a switch effect of 2 % or more", "",
                  "One or two participant-windows per row in `rotated` runs (a few boundary samples each): rows of "
                  "mixed sign at ms-long kernels are noise; the shift is a few us, so it is large only where the "
                  "kernel takes a few us (4096-row norms: negative in every window).", "",
                  "| run | variant | M | N | K | process | effect % | participant-windows | median ms |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in big.itertuples():
            k = "–" if pd.isna(s.K) else int(s.K)
            lines.append(f"| {s.run} | {s.variant} | {int(s.M)} | {int(s.N)} | {k} | {s.process} | "
                         f"{s.effect_pct:+.1f} | {s.n} | {s.ms:.4f} |")
    lines += ["", "`order_bias.parquet`: every participant of every run (the columns above, `rel_after`, "
              "`rel_other`, `samples`, `systematic`).", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("results"),
                    help="the results folder whose paired runs are analysed (default results)")
    ap.add_argument("--write", action="store_true", help=f"write {OUT_DIR}/order_bias.md and .parquet")
    a = ap.parse_args(argv)
    runs, parts, shapes = analyse(a.root)
    md = markdown(runs, parts, shapes)
    if a.write:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        (OUT_DIR / "order_bias.md").write_text(md)
        parts.to_parquet(OUT_DIR / "order_bias.parquet", index=False)
    print(md)


if __name__ == "__main__":
    main()
