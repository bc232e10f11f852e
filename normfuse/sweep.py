"""The sweep: expand a composed config into points, resume, measure each point in its worker, write results.

One sweep point, end to end::

    python -m experiments.run experiment=lazy_prenorm_blog      (Hydra composes configs/)
      -> expand_points(): shapes x (baselines + dsl x tiling x impl), in a stable order
      -> skip points already in <run>/results.jsonl (resume)
      -> Pool.request(env, mode, point): the worker checks against the fp32 reference, then times
      -> ResultsStore.append(row) as each point finishes
      -> finalize(): metrics, results.parquet/.csv, meta.json, plots/, summary table
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import subprocess
import time
from pathlib import Path

from normfuse import hardware, registry, shapes
from normfuse.pool import REPO_ROOT, Pool, WorkerDied
from normfuse.results import ResultsStore, point_key, write_tables
from normfuse.techniques import get_technique


# ----------------------------------------------------------------------------------------------- points
def resolve_mode(requested: str) -> str:
    """'auto' -> 'gpu' when a CUDA device is visible, else 'cpu'. ValueError for anything else unknown."""
    if requested not in ("auto", "gpu", "cpu"):
        raise ValueError(f"unknown mode {requested!r}; choices: auto, gpu, cpu")
    if requested != "auto":
        return requested
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


TIMING_METHODS = ("do_bench", "cudagraph", "cudagraph_flush")  # normfuse.timing.bench


def expand_points(cfg: dict, run_mode: str) -> list[dict]:
    """All points of a run as request dicts (without run-specific fields), baselines first for each shape."""
    tech = cfg["technique"]
    spec = get_technique(tech["name"])
    dsls = cfg.get("dsls") or {}
    for name in dsls:
        registry.check_dsl(name)
    if not dsls:
        raise ValueError("no dsl selected (e.g. dsl=[triton,helion,tlx])")
    tilings = cfg.get("tiling") or {}
    points = []
    variants = tech.get("variants") or [tech.get("variant")]
    options = dict(tech.get("options") or {})
    baselines = cfg.get("baselines") or []
    for impl in baselines:
        if impl not in spec.BASELINES:
            raise ValueError(f"unknown baseline {impl!r} for {tech['name']}; choices: {', '.join(spec.BASELINES)}")
    spec_variants = tuple(getattr(spec, "VARIANTS", ()) or ())
    for v in variants:
        if spec_variants and v not in spec_variants:
            raise ValueError(f"unknown variant {v!r} for {tech['name']}; choices: {', '.join(map(str, spec_variants))}")
    eps = tech.get("eps")
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"technique.eps must be a finite number > 0, got {eps!r}")
    from normfuse.techniques.lazy_prenorm import DTYPES
    for key in ("dtype", "cpu_dtype"):
        if cfg.get(key) not in DTYPES:
            raise ValueError(f"{key}={cfg.get(key)!r} is not supported; choices: {', '.join(DTYPES)}")
    method = (cfg.get("timing") or {}).get("method", "do_bench")
    if method not in TIMING_METHODS:
        raise ValueError(f"timing.method={method!r} is not supported; choices: {', '.join(TIMING_METHODS)}")
    for shp in shapes.expand(cfg["shape"]):
        spec.check_shape(shp["M"], shp["N"], shp["K"])
        for variant in variants:
            common = {"technique": tech["name"], "variant": variant, "eps": float(tech["eps"]), "options": options,
                      **shp}
            base_mode = "gpu" if run_mode == "gpu" else "cpu"
            base_dtype = cfg["dtype"] if run_mode == "gpu" else cfg["cpu_dtype"]
            for impl in baselines:
                if not getattr(spec, "baseline_applies", lambda i, v: True)(impl, variant):
                    continue  # a baseline that belongs to another variant of the technique (e.g. mxnorm)
                points.append({**common, "dsl": registry.BASELINE_DSL, "impl": impl, "env": cfg["baseline_env"],
                               "mode": base_mode, "dtype": base_dtype, "config_name": "-", "config": {}})
            for dsl_name, d in dsls.items():
                mode = "gpu" if run_mode == "gpu" else d["cpu_mode"]
                dtype = cfg["dtype"] if mode in ("gpu", "compile_only") else cfg["cpu_dtype"]
                configs = tilings.get(dsl_name)
                if not configs:
                    raise ValueError(f"tiling list has no configs for dsl {dsl_name!r} (keys: {list(tilings)})")
                for c in configs:
                    c = dict(c)
                    cname = c.pop("name", None) or json.dumps(c, sort_keys=True)
                    impls = c.pop("impls", None) or tech["impls"]  # e.g. [fused]: the GEMM of these tiles is listed once
                    c.pop("known_incorrect", None)  # a config kept to record a miscompile (see gpu_checks)
                    for impl in impls:
                        points.append({**common, "dsl": dsl_name, "impl": impl, "env": d["env"], "mode": mode,
                                       "dtype": dtype, "config_name": cname, "config": c})
    return points


def _seed(nonce: str, key: tuple) -> int:
    return int(hashlib.sha256((nonce + repr(key)).encode()).hexdigest()[:8], 16)


GIT_SHA_FILE = ".normfuse_git_sha"  # written next to a copy of the tree that travels without .git (e.g. to a GPU host)


def git_info() -> dict:
    """The commit being measured. ``$NORMFUSE_GIT_SHA`` wins when set (``tools/device_run.sh`` sets it from the
    ``.normfuse_git_sha`` file written before copying a tree to a GPU host: such a copy may carry a stale ``.git``
    of an older commit with the changes overlaid), then git, then the ``.normfuse_git_sha`` file alone."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            return ""

    if os.environ.get("NORMFUSE_GIT_SHA"):
        return {"git_sha": os.environ["NORMFUSE_GIT_SHA"], "git_dirty": None}
    sha = git("rev-parse", "--short=12", "HEAD")
    if sha:
        return {"git_sha": sha, "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    f = REPO_ROOT / GIT_SHA_FILE
    sha = f.read_text().strip() if f.exists() else ""
    return {"git_sha": sha or "unknown", "git_dirty": None}


# ----------------------------------------------------------------------------------------------- run
def default_run_id(gpu: dict) -> str:
    """``<yyyymmdd-HHMMSS>_<gpu short name or cpu>``: a new run per invocation (pass run_id=... to resume)."""
    tag = "cpu"
    if gpu.get("available"):
        tag = str(gpu.get("gpu_name", "gpu")).replace("NVIDIA", "").strip().split()[0].lower()
    return f"{dt.datetime.now():%Y%m%d-%H%M%S}_{tag}"


def run(cfg: dict) -> Path:
    """Run (or resume) the sweep described by the composed config ``cfg``; return the run folder."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    run_mode = resolve_mode(cfg.get("mode", "auto"))
    if run_mode == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("mode=gpu but no CUDA device is visible (use mode=auto or mode=cpu)")
    points = expand_points(cfg, run_mode)  # validates the config before anything is written
    gpu_before = hardware.read_gpu()
    if run_mode == "gpu":
        mismatches = hardware.compare(cfg["hardware"], gpu_before, strict=bool(cfg["hardware"].get("strict", False)))
    else:
        mismatches = [f"configured hardware {cfg['hardware']['name']!r}; ran in CPU mode (no timings)"]
    run_id = cfg.get("run_id") or default_run_id(gpu_before)
    run_dir = Path(cfg.get("results_dir") or REPO_ROOT / "results") / cfg["experiment_name"] / run_id
    store = ResultsStore(run_dir)
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    envs = {k: dict(v) for k, v in cfg["env"]["envs"].items()}
    for e in envs.values():  # relative python paths are relative to the repository root
        p = str(e["python"])
        if os.sep in p and not os.path.isabs(p):
            e["python"] = str(REPO_ROOT / p)
    pool = Pool(envs, run_dir / "logs")
    nonce = f"{time.time_ns()}"
    git = git_info()
    retry = tuple(cfg.get("retry_statuses") or ())
    done = store.done_keys(retry_statuses=retry) if cfg.get("resume", True) else set()
    todo = [p for p in points if point_key(p) not in done]
    console.print(f"[bold]{cfg['experiment_name']}[/] run {run_id} ({run_mode} mode): {len(points)} points, "
                  f"{len(points) - len(todo)} already done, {len(todo)} to run -> {run_dir}")
    versions = dict(meta.get("versions", {}))
    inject = {}
    for spec in cfg.get("debug", {}).get("inject") or []:  # "crash@<pattern>" | "hang@<pattern>"
        what, _, pattern = str(spec).partition("@")
        if what not in ("crash", "hang") or not pattern:
            raise ValueError(f"debug.inject entries look like 'crash@<pattern>' or 'hang@<pattern>', got {spec!r}")
        inject[pattern] = what
    calibration = meta.get("calibration")
    completed, measured = False, 0
    try:
        if run_mode == "gpu" and cfg.get("calibrate", True) and not calibration and todo:
            try:
                calibration = pool.request(cfg["baseline_env"], "gpu", {"op": "calibrate"}, 600)
            except WorkerDied as e:
                calibration = {"status": e.status, "error": str(e)}
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=console, disable=not todo) as prog:
            task = prog.add_task("sweep", total=len(todo))
            hung = {}  # (dsl, impl, variant, config_name) -> shape at which it timed out
            for p in todo:
                wkey = f"{p['env']}-{p['mode']}"
                label = f"{p['dsl']}/{p['impl']}/{p['config_name']} {p['M']}x{p['N']}x{p['K']}"
                prog.update(task, description=label[:60])
                if wkey not in versions:
                    try:
                        versions[wkey] = pool.request(p["env"], p["mode"], {"op": "hello"}, 300).get("versions")
                    except WorkerDied as e:
                        versions[wkey] = {"error": str(e)[:500]}
                ckey = (p["dsl"], p["impl"], p.get("variant"), p["config_name"])
                if ckey in hung:  # a config that hung once would likely hang again: record, do not wait again
                    row = {**p, "status": "skipped", "error": f"not run: this config timed out at {hung[ckey]}"}
                else:
                    row = _measure(pool, p, cfg, nonce, inject)
                    if row.get("status") == "timeout" and cfg.get("skip_config_after_timeout", True):
                        hung[ckey] = f"{p['M']}x{p['N']}x{p['K']}"
                row.update({"run_id": run_id, "experiment": cfg["experiment_name"], "hardware": cfg["hardware"]["name"],
                            "gpu_name": gpu_before.get("gpu_name", "none (cpu)"),
                            "power_limit_w": gpu_before.get("power_limit_w"), **git,
                            "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
                store.append(row)
                measured += 1
                prog.advance(task)
        completed = True
    finally:
        pool.close()
        # meta.json also when the sweep is interrupted (Ctrl-C, a time budget): the rows already measured keep
        # their hardware, versions and calibration
        gpu_after = hardware.read_gpu()
        meta.update({"run_id": run_id, "experiment": cfg["experiment_name"], "mode": run_mode,
                     "created": meta.get("created") or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "updated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "hardware_config": cfg["hardware"], "hardware_before": gpu_before, "hardware_after": gpu_after,
                     "hardware_mismatches": sorted(set(meta.get("hardware_mismatches", [])) | set(mismatches)),
                     "versions": versions, "calibration": calibration, **git, "config": cfg,
                     "invocations": meta.get("invocations", []) + [{
                         "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": git["git_sha"],
                         "dsls": list(cfg.get("dsls") or {}), "shape": cfg["shape"].get("name"),
                         "tiling": sorted(cfg.get("tiling") or {}), "points": len(points), "measured": measured}],
                     "timing_note": f"p50 of normfuse.timing.bench, method {cfg['timing']['method']}" if run_mode == "gpu"
                     else "CPU mode: correctness only, no timings"})
        if not completed:
            meta["interrupted"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        else:
            meta.pop("interrupted", None)
        meta_path.write_text(json.dumps(meta, indent=2, default=str))
    finalize(run_dir, console=console)
    return run_dir


def _measure(pool: Pool, p: dict, cfg: dict, nonce: str, inject: dict) -> dict:
    key = point_key(p)
    req = {"op": "measure", **p, "seed": _seed(nonce, key), "warmup_ms": cfg["timing"]["warmup_ms"],
           "rep_ms": cfg["timing"]["rep_ms"], "timing": cfg["timing"]["method"]}
    for pattern, what in inject.items():  # test hook: simulate a crash or hang at matching points
        if pattern in f"{p['dsl']}/{p['impl']}/{p['config_name']}/{p['M']}x{p['N']}x{p['K']}":
            req["inject"] = what
    row = {k: v for k, v in p.items()}
    row["seed"] = req["seed"]
    try:
        reply = pool.request(p["env"], p["mode"], req, float(cfg["point_timeout_s"]))
    except WorkerDied as e:
        reply = {"status": e.status, "error": str(e)[-2000:]}
    reply.pop("traceback", None)
    row.update(reply)
    return row


def finalize(run_dir: Path, console=None) -> "object":
    """Recompute metrics from results.jsonl and write tables, plots and the summary; returns the DataFrame."""
    from normfuse import metrics, report

    run_dir = Path(run_dir)
    df = ResultsStore(run_dir).dataframe()
    if df.empty:
        return df
    df = metrics.add_technique_metrics(metrics.add_saving(metrics.add_hidden(metrics.add_rates(df))))
    write_tables(df, run_dir)
    meta = json.loads((run_dir / "meta.json").read_text()) if (run_dir / "meta.json").exists() else {}
    mode = meta.get("mode", "gpu" if (df["mode"] == "gpu").any() else "cpu")
    report.make_plots(df, run_dir, mode, meta)
    text = report.summary(df, mode, (meta.get("calibration") or {}).get("copy_tbps"))
    (run_dir / "summary.md").write_text(text + "\n")
    if console is not None:
        print(text, flush=True)  # plain print: tables are wide, a console would wrap them
    return df
