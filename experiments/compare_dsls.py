"""The DSL side-by-side report: per technique x DSL (Triton, Helion, TLX), what each implementation cost and gave.

    python -m experiments.compare_dsls                      # report from the committed results -> results/compare_dsls/
    python -m experiments.compare_dsls --collect-sass       # first recompile the shipped configs for sm_90a (slow)
    python -m experiments.compare_dsls --collect-sass --studies norms --dsls triton --configs row-auto --out /tmp/x

Columns, per study (``configs/dsl_features.yaml``: technique, committed run, kernel impl, metric) and DSL:

* **SLOC** of ``kernels_<dsl>/<technique>.py`` (radon's source lines: no blanks, comments or docstrings), split into
  kernel code (functions decorated ``@triton.jit`` / ``@helion.kernel``) and host code (configs, checks, launch);
* **configs**: entries of the tiling list the run used (its ``config.tiling`` in meta.json) / configs the run
  measured for the kernel impl; Helion: whether its autotuner ran (our kernels pin ``autotune_effort="none"``);
* **compile s**: from the run's rows (``compile_s`` of the first call at each point, on the GPU host): the median
  over configs of each config's slowest (first) compile, and the maximum; a config already in the host's on-disk
  Triton cache shows near zero. **cold compile s CPU**: the median over configs of ``normfuse.codestats``'s
  compile time with an empty Triton cache on this CPU (codegen + ptxas for sm_90a; the first job of each
  process also pays imports);
* **regs / spills / SASS**: from ``results/compare_dsls/sass_stats.csv`` (``--collect-sass``: every config the
  run measured, compiled for sm_90a on the CPU through ``normfuse.codestats`` at the study's compile shape; the
  ranges are over configs, main kernel only);
* **metric**: the study's metric (``hidden_dsl`` / ``hidden_best``: % of the norm latency hidden; ``saving``: %
  latency saved; ``sdpa_fraction``: % of SDPA's speed; ``copy_fraction``: % of the measured copy bandwidth) of the
  fastest correct config at each shape: median and range over shapes, with the 95 % interval of each shape from
  the run's ``paired.parquet`` when it has one; **wins**: shapes where the DSL was fastest; **rel. speed**:
  geometric mean over shapes of (fastest DSL's time / this DSL's time);
* **failures**: rows with status incorrect / error / timeout, tiling entries marked ``known_incorrect``, and the
  curated workarounds; **features** and **could not express** from the YAML (each claim cites file:function).

Writes ``report.md`` and ``report.html`` (markdown-it-py) into ``--out``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DSLS = ("triton", "helion", "tlx")
FEATURES_YAML = ROOT / "configs" / "dsl_features.yaml"
RESULTS = ROOT / "results"
KERNELS = ROOT
DEFAULT_OUT = RESULTS / "compare_dsls"
SASS_CSV = "sass_stats.csv"
BAD_STATUS = ("incorrect", "error", "timeout")
METRIC_LABELS = {"hidden_dsl": "% norm hidden (own GEMM)", "hidden_best": "% norm hidden (best unfused)",
                 "saving": "% latency saved vs torch.compile", "sdpa_fraction": "% of SDPA speed",
                 "copy_fraction": "% of copy bandwidth"}
KERNEL_DECORATORS = ("triton.jit", "helion.kernel")


# ------------------------------------------------------------------------------------------------ inputs
def load_features(path: Path = FEATURES_YAML) -> dict:
    """The report's data file: ``{features, studies, implementations}``. ValueError naming the first study or
    implementation entry that lacks a required key or names an unknown DSL / feature."""
    import yaml

    data = yaml.safe_load(path.read_text())
    for key in ("features", "studies", "implementations"):
        if key not in data:
            raise ValueError(f"{path}: missing top-level key {key!r}")
    for sid, st in data["studies"].items():
        missing = {"title", "technique", "experiment", "run", "impl", "metric", "compile"} - set(st)
        if missing:
            raise ValueError(f"{path}: study {sid!r} lacks {sorted(missing)}")
        if st["metric"] not in METRIC_LABELS:
            raise ValueError(f"{path}: study {sid!r} metric {st['metric']!r}; choices: {', '.join(METRIC_LABELS)}")
        impls = data["implementations"].get(sid, {})
        if set(impls) != set(DSLS):
            raise ValueError(f"{path}: implementations.{sid} must list exactly {DSLS}, has {sorted(impls)}")
        for dsl, entry in impls.items():
            for item in entry.get("needed", []):
                if item.get("feature") not in data["features"]:
                    raise ValueError(f"{path}: {sid}.{dsl}: unknown feature {item.get('feature')!r}; "
                                     f"choices: {', '.join(data['features'])}")
            for kind in ("needed", "could_not", "workarounds"):
                for item in entry.get(kind, []):
                    if not item.get("where") or not item.get("note"):
                        raise ValueError(f"{path}: {sid}.{dsl}.{kind}: every entry needs 'note' and 'where'")
    return data


def run_dir(study: dict) -> Path:
    """``results/<experiment>/<run>`` of a study."""
    return RESULTS / study["experiment"] / study["run"]


def load_rows(study: dict):
    """The run's tidy rows (``results.parquet``) and its ``meta.json``. FileNotFoundError naming the run."""
    import pandas as pd

    d = run_dir(study)
    if not (d / "results.parquet").exists():
        raise FileNotFoundError(f"{d}/results.parquet not found (study run {study['experiment']}/{study['run']})")
    return pd.read_parquet(d / "results.parquet"), json.loads((d / "meta.json").read_text())


def tiling_lists(meta: dict) -> dict:
    """``{dsl: [entry, ...]}``: the tiling list the run was composed with (meta.json ``config.tiling``)."""
    tiling = (meta.get("config") or {}).get("tiling") or {}
    return {d: list(tiling.get(d) or []) for d in DSLS}


# ------------------------------------------------------------------------------------------------ code size
def kernel_sloc(path: Path) -> dict:
    """Source lines of one kernel module, counted by radon (``radon.raw.analyze``: ``sloc`` excludes blank lines,
    comments and docstrings): ``total``, ``kernel`` (top-level functions decorated ``@triton.jit`` or
    ``@helion.kernel``, decorators included), ``host`` (the rest), and ``doc`` (comment + docstring lines)."""
    from radon.raw import analyze

    src = path.read_text()
    whole = analyze(src)
    lines = src.splitlines()
    kernel = 0
    for node in ast.parse(src).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        decos = [ast.get_source_segment(src, d) or "" for d in node.decorator_list]
        if any(k in d for d in decos for k in KERNEL_DECORATORS):
            first = min(d.lineno for d in node.decorator_list)
            kernel += analyze(textwrap.dedent("\n".join(lines[first - 1:node.end_lineno])) + "\n").sloc
    return dict(total=whole.sloc, kernel=kernel, host=whole.sloc - kernel, doc=whole.comments + whole.multi)


# ------------------------------------------------------------------------------------------------ SASS stats
def measured_configs(study: dict, df) -> dict[str, dict[str, dict]]:
    """``{dsl: {config_name: config}}``: every config the run measured for the study's kernel impl (from the rows'
    ``config`` JSON, so configs of earlier invocations of a resumed run are included)."""
    rows = df[(df["impl"] == study["impl"]) & df["dsl"].isin(DSLS)][["dsl", "config_name", "config"]]
    out: dict[str, dict[str, dict]] = {d: {} for d in DSLS}
    for r in rows.drop_duplicates(["dsl", "config_name"]).itertuples():
        out[r.dsl][r.config_name] = json.loads(r.config) if isinstance(r.config, str) else dict(r.config or {})
    return out


def compile_shape(study: dict, df, dsl: str, config_name: str) -> tuple:
    """(N, K) to compile a config at: the study's compile shape when the run measured the config correct there,
    else the smallest (N, K) at which it did (a config may not serve every shape: shared memory, cluster width);
    the study's own shape when the config never passed."""
    c = study["compile"]
    ok = df[(df["impl"] == study["impl"]) & (df["dsl"] == dsl) & (df["config_name"] == config_name)
            & (df["status"] == "ok")]
    K = c.get("K")
    same = (ok["N"] == c["N"]) & ((ok["K"] == K) if K is not None else ok["K"].isna())
    if ok.empty or same.any():
        return c["N"], K
    first = ok.sort_values(["N", "K"]).iloc[0]
    return int(first["N"]), (None if first["K"] != first["K"] or first["K"] is None else int(first["K"]))


def sass_jobs(data: dict, studies: list[str], dsls: list[str], configs: list[str] | None) -> dict[str, list]:
    """``{dsl: [codestats job, ...]}``: every config each study's run measured for its kernel impl, compiled at
    the study's compile shape (or, for a config that shape does not serve, at one it ran: ``compile_shape``);
    ``configs``: only these names."""
    jobs: dict[str, list] = {d: [] for d in dsls}
    for sid in studies:
        st = data["studies"][sid]
        df, _ = load_rows(st)
        c = st["compile"]
        for dsl, cfgs in measured_configs(st, df).items():
            if dsl not in dsls:
                continue
            for name, cfg in sorted(cfgs.items()):
                if configs and name not in configs:
                    continue
                N, K = compile_shape(st, df, dsl, name)
                jobs[dsl].append(dict(study=sid, dsl=dsl, technique=st["technique"], impl=st["impl"],
                                      variant=c.get("variant"), M=c["M"], N=N, K=K, config=cfg,
                                      config_name=name, eps=1e-5))
    return jobs


def env_python(dsl: str) -> str:
    """The interpreter of a DSL's environment: ``NORMFUSE_TLX_PYTHON`` / ``NORMFUSE_UPSTREAM_PYTHON`` (as in
    configs/env/local.yaml), else the repo's ``.venv-tlx`` / ``.venv``."""
    if dsl == "tlx":
        return os.environ.get("NORMFUSE_TLX_PYTHON") or str(ROOT / ".venv-tlx/bin/python")
    return os.environ.get("NORMFUSE_UPSTREAM_PYTHON") or str(ROOT / ".venv/bin/python")


def collect_sass(jobs: dict[str, list], timeout_s: float = 3600):
    """Run ``python -m normfuse.codestats`` in each DSL's environment; a DataFrame of one row per compiled kernel
    (``kernel_index`` 0 is the main kernel). RuntimeError with the stderr tail if a batch process fails;
    ValueError naming ``make venvs`` and the variable to set if a DSL's interpreter does not exist."""
    import pandas as pd

    from normfuse.pool import require_python

    rows = []
    for dsl, js in jobs.items():
        if not js:
            continue
        python = require_python("tlx" if dsl == "tlx" else "upstream", env_python(dsl))
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "HELION_INTERPRET")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.setdefault("HELION_DISALLOW_AUTOTUNING", "1")
        with tempfile.TemporaryDirectory() as cache:  # an empty Triton cache: compile_s is a cold compile
            env["TRITON_CACHE_DIR"] = cache
            p = subprocess.run([python, "-m", "normfuse.codestats", json.dumps(js)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=timeout_s)
        if p.returncode:
            raise RuntimeError(f"codestats ({dsl}) failed rc={p.returncode}: {p.stderr[-3000:]}")
        last = None
        for line in p.stdout.splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = (r["study"], r["config_name"])
            r["kernel_index"] = 0 if key != last else rows[-1]["kernel_index"] + 1
            last = key
            rows.append(r)
    cols = ["study", "dsl", "config_name", "kernel_index", "kernel", "variant", "M", "N", "K", "compile_s",
            "regs", "spill_st", "spill_ld", "stack", "smem", "STL", "LDL", "hgmma", "sass_instr", "sass_kb",
            "warps", "cluster", "error"]
    df = pd.DataFrame(rows)
    return df.reindex(columns=cols)


def merge_sass(old, new):
    """``old`` with the (study, dsl, config_name) groups present in ``new`` replaced by ``new``'s rows."""
    import pandas as pd

    if old is None or old.empty:
        return new.reset_index(drop=True)
    key = ["study", "dsl", "config_name"]
    keep = ~old.set_index(key).index.isin(new.set_index(key).index)
    return pd.concat([old[keep], new], ignore_index=True).sort_values(key + ["kernel_index"]).reset_index(drop=True)


# ------------------------------------------------------------------------------------------------ results
def _metric_frame(study: dict, df, meta: dict):
    """Rows of the study's kernel impl (status ok) with a ``metric`` column in % (higher is better)."""
    ok = df[(df["impl"] == study["impl"]) & (df["status"] == "ok") & df["dsl"].isin(DSLS)].copy()
    m = study["metric"]
    if m == "copy_fraction":
        copy = ((meta.get("calibration") or {}).get("copy_tbps") or float("nan")) * 1000.0
        ok["metric"] = 100.0 * ok["gbps"] / copy
    else:
        ok["metric"] = 100.0 * ok[m]
    return ok


SHAPE = ["variant", "M", "N", "K"]


def best_per_shape(study: dict, df, meta: dict):
    """One row per (shape, DSL): the fastest correct config (min p50) and its metric."""
    ok = _metric_frame(study, df, meta)
    ok = ok[ok["p50_ms"].notna()]
    if ok.empty:
        return ok
    return ok.loc[ok.groupby(SHAPE + ["dsl"], dropna=False)["p50_ms"].idxmin()].reset_index(drop=True)


def paired_intervals(study: dict, best):
    """The 95 % intervals of the study metric at each (shape, DSL) from the run's ``paired.parquet`` (columns
    technique, variant, M, N, K, dtype, replicate, dsl, config_name, metric, median, ci_lo, ci_hi), for the
    config that ``best`` picked; medians in % like ``metric``. None when the run has no such file."""
    import pandas as pd

    path = run_dir(study) / "paired.parquet"
    if not path.exists():
        return None
    p = pd.read_parquet(path)
    p = p[(p["metric"] == study["metric"]) & (p["technique"] == study["technique"]) & p["dsl"].isin(DSLS)]
    if "replicate" in p:  # several replicates: their medians' median and the widest interval
        p = p.groupby(SHAPE + ["dsl", "config_name"], dropna=False).agg(
            median=("median", "median"), ci_lo=("ci_lo", "min"), ci_hi=("ci_hi", "max")).reset_index()
    p = p.merge(best[SHAPE + ["dsl", "config_name"]], on=SHAPE + ["dsl", "config_name"])
    for c in ("median", "ci_lo", "ci_hi"):
        p[c] = 100.0 * p[c]
    return p[SHAPE + ["dsl", "median", "ci_lo", "ci_hi"]]


def speed_summary(best) -> dict:
    """Per DSL: shapes measured, wins (fastest DSL at that shape), geometric-mean relative speed."""
    import numpy as np

    out = {}
    fastest = best.groupby(SHAPE, dropna=False)["p50_ms"].transform("min")
    rel = fastest / best["p50_ms"]
    for dsl in DSLS:
        sel = best["dsl"] == dsl
        out[dsl] = dict(shapes=int(sel.sum()), wins=int((best.loc[sel, "p50_ms"] == fastest[sel]).sum()),
                        rel=float(np.exp(np.log(rel[sel]).mean())) if sel.any() else float("nan"))
    return out


def compile_summary(study: dict, df) -> dict:
    """Per DSL: ``first_med`` (median over configs of each config's largest compile_s) and ``max`` in seconds."""
    rows = df[(df["impl"] == study["impl"]) & df["dsl"].isin(DSLS) & df["compile_s"].notna()]
    out = {}
    for dsl, g in rows.groupby("dsl"):
        per_cfg = g.groupby("config_name")["compile_s"].max()
        out[dsl] = dict(first_med=float(per_cfg.median()), max=float(per_cfg.max()), configs=int(len(per_cfg)))
    return out


def failures(study: dict, df, meta: dict, impls: dict) -> list[dict]:
    """Correctness problems: bad-status rows of the run (grouped per DSL, config and status), known_incorrect
    tiling entries, and the curated workarounds."""
    out = []
    bad = df[df["status"].isin(BAD_STATUS) & df["dsl"].isin(DSLS)]
    for (dsl, cfg, status), g in bad.groupby(["dsl", "config_name", "status"]):
        err = next((str(e) for e in g["error"] if isinstance(e, str) and e), "")
        shapes = ", ".join(f"{r.M}x{r.N}x{r.K}" if r.K == r.K and r.K is not None else f"{r.M}x{r.N}"
                           for r in g.head(4).itertuples())
        out.append(dict(dsl=dsl, kind=f"{len(g)} row(s) {status}", config=cfg,
                        note=(f"at {shapes}" + (f": {err[:160]}" if err else "")), where=f"{study['run']} rows"))
    for dsl, entries in tiling_lists(meta).items():
        for e in entries:
            if e.get("known_incorrect"):
                out.append(dict(dsl=dsl, kind="known_incorrect config", config=e["name"],
                                note="kept in the tiling list to record a miscompile; the sweep records it incorrect",
                                where="configs/tiling (run's tiling list)"))
    for dsl in DSLS:
        for w in impls[dsl].get("workarounds", []):
            out.append(dict(dsl=dsl, kind="workaround", config="", note=w["note"], where=w["where"]))
    return out


# ------------------------------------------------------------------------------------------------ report
def _pct(v, nd=0) -> str:
    return "–" if v is None or v != v else f"{v:.{nd}f}"


def _range(s, nd=0) -> str:
    s = s.dropna()
    return "–" if s.empty else (_pct(s.min(), nd) if s.min() == s.max() else f"{_pct(s.min(), nd)}–{_pct(s.max(), nd)}")


def study_tables(sid: str, data: dict, sass) -> dict:
    """Everything the report shows for one study: summary rows, per-shape table, SASS table, failures."""
    import pandas as pd

    st = data["studies"][sid]
    impls = data["implementations"][sid]
    df, meta = load_rows(st)
    best = best_per_shape(st, df, meta)
    ci = paired_intervals(st, best)
    speed = speed_summary(best) if not best.empty else {}
    comp = compile_summary(st, df)
    tilings = tiling_lists(meta)
    ss = sass[(sass["study"] == sid)] if sass is not None and not sass.empty else None
    summary = []
    for dsl in DSLS:
        loc = kernel_sloc(KERNELS / f"kernels_{dsl}" / f"{st['technique']}.py")
        b = best[best["dsl"] == dsl]
        c = comp.get(dsl, {})
        sp = speed.get(dsl, {})
        main = ss[(ss["dsl"] == dsl) & (ss["kernel_index"] == 0) & ss["regs"].notna()] if ss is not None else None
        row = {"DSL": dsl, "SLOC kernel / host": f"{loc['kernel']} / {loc['host']}",
               "configs (list / run)": f"{len(tilings[dsl])} / {c.get('configs', 0)}",
               "compile s (median first / max)": f"{_pct(c.get('first_med'), 1)} / {_pct(c.get('max'), 1)}"}
        cold = main["compile_s"] if main is not None else None
        row["cold compile s CPU (median)"] = _pct(cold.median(), 1) if cold is not None and cold.notna().any() else "–"
        if main is not None and not main.empty:
            spills = main["spill_st"] + main["spill_ld"]
            row |= {"regs": _range(main["regs"]), "spill B (max)": _pct(spills.max()),
                    "configs spilling": f"{int((spills > 0).sum())}/{len(main)}",
                    "SASS KiB": _range(main["sass_kb"], 1), "smem KiB (max)": _pct(main["smem"].max() / 1024, 0)}
        else:
            row |= {"regs": "–", "spill B (max)": "–", "configs spilling": "–", "SASS KiB": "–", "smem KiB (max)": "–"}
        metric = f"{_pct(b['metric'].median())} ({_range(b['metric'])})" if not b.empty else "–"
        row |= {f"{METRIC_LABELS[st['metric']]}: median (range)": metric,
                "wins": f"{sp.get('wins', 0)}/{sp.get('shapes', 0)}", "rel. speed": _pct(sp.get("rel"), 2)}
        summary.append(row)

    shapes = best.pivot_table(index=SHAPE, columns="dsl", values="metric", dropna=False) if not best.empty else None
    per_shape = None
    if shapes is not None:
        per_shape = shapes.reindex(columns=[d for d in DSLS if d in shapes.columns]).map(lambda v: _pct(v, 1))
        if ci is not None and not ci.empty:
            iv = ci.set_index(SHAPE + ["dsl"])
            for idx in per_shape.index:
                for dsl in per_shape.columns:
                    if (*idx, dsl) in iv.index:
                        r = iv.loc[(*idx, dsl)]
                        per_shape.loc[idx, dsl] = f"{r['median']:.1f} [{r['ci_lo']:.1f}, {r['ci_hi']:.1f}]"
        per_shape = per_shape.reset_index()
        per_shape = per_shape.loc[:, per_shape.notna().any()]
    sass_tab = None
    if ss is not None and not ss.empty:
        sass_tab = ss[["dsl", "config_name", "N", "K", "kernel", "regs", "spill_st", "spill_ld", "smem", "LDL",
                       "STL", "sass_kb", "warps", "cluster", "error"]].copy()
        sass_tab["error"] = sass_tab["error"].astype(object).where(sass_tab["error"].notna(), "").astype(str).str.slice(0, 80)
        for col in ("N", "K", "regs", "spill_st", "spill_ld", "smem", "LDL", "STL", "warps", "cluster"):
            sass_tab[col] = pd.to_numeric(sass_tab[col], errors="coerce").map(
                lambda v: "–" if pd.isna(v) else str(int(v))).astype(object)
    return dict(study=st, summary=pd.DataFrame(summary), per_shape=per_shape, has_ci=ci is not None,
                sass=sass_tab, failures=failures(st, df, meta, impls), impls=impls, git_sha=meta.get("git_sha"))


def helion_autotune_note() -> str:
    """How the Helion kernels were tuned: the ``@helion.kernel`` decorators of kernels_helion/ that pin
    ``autotune_effort="none"`` (explicit tiling configs, no autotuner run) out of all of them."""
    total = pinned = 0
    for f in sorted((KERNELS / "kernels_helion").glob("*.py")):
        src = f.read_text()
        for node in ast.parse(src).body:
            for d in getattr(node, "decorator_list", []):
                seg = ast.get_source_segment(src, d) or ""
                if "helion.kernel" in seg:
                    total += 1
                    pinned += 'autotune_effort="none"' in seg.replace("'", '"')
    return (f"Helion tuning: {pinned} of {total} `@helion.kernel`s pin `autotune_effort=\"none\"`: every Helion "
            "config is an explicit entry of the tiling list (hand-picked, as for Triton and TLX); no autotuner "
            "state is recorded." if total else "No Helion kernels found.")


def _md(df) -> str:
    return df.to_markdown(index=False) if df is not None and not df.empty else "(none)"


def render_markdown(data: dict, tables: dict[str, dict], sass_note: str) -> str:
    """The report as markdown (pandas ``to_markdown`` tables)."""
    import pandas as pd

    feats = list(data["features"])
    out = ["# Triton vs Helion vs TLX: the DSL side-by-side report", "",
           "Generated by `python -m experiments.compare_dsls` from the committed results; do not edit by hand. "
           "Columns are defined in the module docstring of `experiments/compare_dsls.py`; the curated parts "
           "(features, what a DSL could not express, workarounds) come from `configs/dsl_features.yaml`, each "
           "claim with the file and function it rests on.", "", sass_note, "", helion_autotune_note(), "",
           "TLX's warp-specialized kernels report ptxas's per-kernel register count; `setmaxnreg` moves registers "
           "between their producer and consumer warpgroups at run time.", "",
           "## Features each implementation needed", "",
           "; ".join(f"**{k}**: {v}" for k, v in data["features"].items()), ""]
    rows = []
    for sid, t in tables.items():
        for dsl in DSLS:
            used = {i["feature"] for i in t["impls"][dsl].get("needed", [])}
            rows.append({"study": sid, "DSL": dsl, **{f: ("✔" if f in used else "–") for f in feats}})
    out += [_md(pd.DataFrame(rows)), ""]
    for sid, t in tables.items():
        st = t["study"]
        out += [f"## {st['title']} (`{sid}`)", "",
                f"Run `results/{st['experiment']}/{st['run']}` (commit {t['git_sha']}), kernel impl "
                f"`{st['impl']}`, modules `kernels_<dsl>/{st['technique']}.py`; SASS statistics at "
                f"{json.dumps(st['compile'])}.", "", _md(t["summary"]), ""]
        notes = []
        for dsl in DSLS:
            for i in t["impls"][dsl].get("needed", []):
                notes.append(f"- {dsl}, {i['feature']}: {i['note']} (`{i['where']}`)")
            for i in t["impls"][dsl].get("could_not", []):
                notes.append(f"- {dsl}, could not express: {i['note']} (`{i['where']}`)")
        if notes:
            out += ["Features and limits:", ""] + notes + [""]
        fl = t["failures"]
        out += ["Correctness failures and workarounds:", "",
                _md(pd.DataFrame(fl)[["dsl", "kind", "config", "note", "where"]]) if fl else "(none)", ""]
        ci = " with the 95 % interval from `paired.parquet`" if t["has_ci"] else \
            " (medians; this run has no `paired.parquet`, so no intervals)"
        out += [f"{METRIC_LABELS[st['metric']]} of the fastest correct config per shape{ci}:", "",
                _md(t["per_shape"]), ""]
        if t["sass"] is not None:
            out += ["<details><summary>Registers, spills and code size per config (sm_90a)</summary>", "",
                    _md(t["sass"]), "", "</details>", ""]
    return "\n".join(out)


def render_html(markdown: str) -> str:
    """The markdown rendered by markdown-it-py (CommonMark + tables), in a minimal HTML page."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    style = ("body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}"
             "td,th{border:1px solid #bbb;padding:2px 6px}th{background:#eee}code{font-size:0.9em}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>normfuse: DSL comparison</title>"
            f"<style>{style}</style></head>\n<body>\n{body}</body></html>\n")


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default results/compare_dsls)")
    ap.add_argument("--studies", default=None, help="comma-separated subset of the studies in the YAML")
    ap.add_argument("--collect-sass", action="store_true", help="recompile the configs for sm_90a first "
                    "(updates <out>/sass_stats.csv for the selected studies / DSLs / configs)")
    ap.add_argument("--dsls", default=",".join(DSLS), help="with --collect-sass: DSLs to compile")
    ap.add_argument("--configs", default=None, help="with --collect-sass: config names to compile")
    ap.add_argument("--features", type=Path, default=FEATURES_YAML, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    import pandas as pd

    data = load_features(args.features)
    studies = args.studies.split(",") if args.studies else list(data["studies"])
    unknown = [s for s in studies if s not in data["studies"]]
    if unknown:
        raise SystemExit(f"error: unknown studies {unknown}; choices: {', '.join(data['studies'])}")
    dsls = args.dsls.split(",")
    if not set(dsls) <= set(DSLS):
        raise SystemExit(f"error: --dsls {args.dsls!r}; choices: {', '.join(DSLS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    csv = args.out / SASS_CSV
    sass = pd.read_csv(csv) if csv.exists() else None
    if args.collect_sass:
        try:
            new = collect_sass(sass_jobs(data, studies, dsls, args.configs.split(",") if args.configs else None))
        except ValueError as e:  # e.g. a DSL's interpreter missing: say what to do, without a traceback
            raise SystemExit(f"error: {e}") from None
        sass = merge_sass(sass, new)
        sass.to_csv(csv, index=False)
    tables = {sid: study_tables(sid, data, sass) for sid in studies}
    note = (f"Registers / spills / SASS from `{SASS_CSV}` ({len(sass)} compiled kernels; regenerate with "
            "`--collect-sass`)." if sass is not None else "No SASS statistics yet (run with `--collect-sass`).")
    md = render_markdown(data, tables, note)
    (args.out / "report.md").write_text(md)
    (args.out / "report.html").write_text(render_html(md))
    print(f"wrote {args.out / 'report.md'} and report.html ({len(studies)} studies)")
    return args.out


if __name__ == "__main__":
    main()
