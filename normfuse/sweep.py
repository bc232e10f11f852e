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
import random
import subprocess
import sys
import time
from pathlib import Path

from normfuse import hardware, registry, shapes
from normfuse.pool import REPO_ROOT, Pool, WorkerDied, require_python
from normfuse.paired import ROUNDS_FILE_GZ as ROUNDS_FILE  # the raw samples: a JSON line per window, round, participant
from normfuse.paired import WINDOWS_FILE, read_jsonl
from normfuse.results import ResultsStore, point_key
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
    tilings = _select_tilings(tilings, cfg.get("tiling_only") or {})
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
                    only_impls = c.pop("_only_impls", None)  # tiling_only's per-entry impl restriction
                    impls = [i for i in impls if not only_impls or i in only_impls]
                    c.pop("known_incorrect", None)  # a config kept to record a miscompile (see gpu_checks)
                    for impl in impls:
                        points.append({**common, "dsl": dsl_name, "impl": impl, "env": d["env"], "mode": mode,
                                       "dtype": dtype, "config_name": cname, "config": c})
    return points


def _select_tilings(tilings: dict, only: dict) -> dict:
    """Filter each DSL's tiling list by ``tiling_only`` ({dsl: [name | {name:, impls: [...]}, ...]}): the same
    list of tilings, a subset of it measured (e.g. each DSL's winners for replicate runs). ValueError naming the
    available names for a name that is not in the list."""
    out = dict(tilings)
    for dsl_name, wanted in only.items():
        configs = list(tilings.get(dsl_name) or [])
        by_name = {c.get("name"): c for c in configs}
        chosen = []
        for w in wanted or []:
            name, impls = (w.get("name"), w.get("impls")) if isinstance(w, dict) else (w, None)
            if name not in by_name:
                raise ValueError(f"tiling_only.{dsl_name}: no config named {name!r} in the tiling list; "
                                 f"available: {', '.join(str(n) for n in by_name)}")
            chosen.append({**by_name[name], **({"_only_impls": list(impls)} if impls else {})})
        out[dsl_name] = chosen
    return out


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


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a sweep; the rows measured so far and meta.json are on disk, and the same
    ``run_id`` resumes after them."""

    def __init__(self, run_id: str, run_dir: Path):
        super().__init__(run_id)
        self.run_id, self.run_dir = run_id, run_dir


def run(cfg: dict) -> Path:
    """Run (or resume) the sweep described by the composed config ``cfg``; return the run folder.

    ``replicates: N`` (N > 1) measures the whole sweep N times, each a complete run folder ``<run_id>/rep<k>/``
    with fresh worker processes and fresh random inputs; ``replicate: k`` measures only replicate k (one job of a
    Hydra multirun / launcher, e.g. one per GPU: jobs write separate folders and never share a meta.json).
    Ctrl-C and SIGTERM stop within seconds with meta.json written and raise :class:`SweepInterrupted`."""
    import signal
    import threading

    select_gpu(cfg.get("gpu"), cfg.get("replicate"))  # before anything initializes CUDA
    run_mode = resolve_mode(cfg.get("mode", "auto"))
    if run_mode == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("mode=gpu but no CUDA device is visible (use mode=auto or mode=cpu)")
    points = expand_points(cfg, run_mode)  # validates the config before anything is written
    paired = {**PAIRED_DEFAULTS, **((cfg.get("timing") or {}).get("paired") or {})}
    _check_order(paired["order"])  # a misspelt order or settle stops here, before any run folder exists
    if not isinstance(paired["settle"], bool):
        raise ValueError(f"timing.paired.settle must be true or false, got {paired['settle']!r}")
    reps, rep = int(cfg.get("replicates") or 1), cfg.get("replicate")
    if reps < 1 or (rep is not None and (isinstance(rep, bool) or not isinstance(rep, int) or rep < 0)):
        raise ValueError(f"replicates must be >= 1 and replicate a non-negative integer or null, got {reps!r}, {rep!r}")
    run_id = cfg.get("run_id") or default_run_id(hardware.read_gpu() if run_mode == "gpu" else {})
    base = Path(cfg.get("results_dir") or REPO_ROOT / "results") / cfg["experiment_name"] / run_id
    previous = None
    if threading.current_thread() is threading.main_thread():  # schedulers send SIGTERM: treat it as Ctrl-C
        def on_term(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        previous = signal.signal(signal.SIGTERM, on_term)
    current = base
    lock = _gpu_lock() if run_mode == "gpu" and cfg.get("gpu_lock", True) else None
    try:
        if lock is not None:
            lock.acquire()
        if rep is not None:
            current = base / f"rep{rep}"
            return _run_one(cfg, points, run_mode, run_id, current, replicate=int(rep))
        if reps > 1:
            for k in range(reps):
                current = base / f"rep{k}"
                _run_one(cfg, points, run_mode, run_id, current, replicate=k, calibration=_calibration_of(base / "rep0"))
            _merge_replicates(base)
            return base
        return _run_one(cfg, points, run_mode, run_id, base, replicate=0)
    except KeyboardInterrupt:
        raise SweepInterrupted(run_id, current) from None
    finally:
        if lock is not None and lock.is_locked:
            lock.release()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def select_gpu(gpu, replicate=None) -> None:
    """Restrict this process and its workers to one GPU by setting ``CUDA_VISIBLE_DEVICES``: ``gpu=k`` takes the
    k-th currently visible GPU, ``gpu='auto'`` the ``replicate % (number of visible GPUs)``-th (one replicate job per
    GPU under a Hydra launcher), ``None`` changes nothing. ValueError for anything else."""
    if gpu is None:
        return
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if not visible:
        try:
            import pynvml

            pynvml.nvmlInit()
            visible = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001  no NVML: no GPU to choose from
            return
    if not visible:
        return
    if gpu == "auto":
        k = int(replicate or 0) % len(visible)
    elif isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < len(visible):
        k = gpu
    else:
        raise ValueError(f"gpu must be null, 'auto' or an index below the {len(visible)} visible GPU(s), got {gpu!r}")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[k]


def _gpu_lock():
    """An inter-process file lock for the GPU this process uses (``filelock``; /tmp), so that two sweeps (e.g. two
    launcher jobs given the same GPU) never time at the same time: the second waits."""
    import tempfile

    from filelock import FileLock

    gpu = hardware.read_gpu()
    ident = gpu.get("gpu_uuid") or os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    return FileLock(os.path.join(tempfile.gettempdir(), f"normfuse-gpu-{ident}.lock"))


def _merge_replicates(base: Path) -> None:
    """The merged report of a replicate set (replicates.md, paired_replicates.parquet, pooled plots) in ``base``;
    only when the replicates have paired rounds (a CPU run has none: nothing to merge)."""
    from normfuse import paired, report

    reps = paired.replicate_dirs(base)
    if reps and all(paired.rounds_path(d) is not None for d in reps):
        report.write_replicates(reps, base)


def _progress(console):
    """A rich progress display on a terminal; on a log file (not a terminal) None: one line per point instead."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if not console.is_terminal:
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[point]}"), console=console)


def _shape_key(p: dict) -> tuple:
    """A paired-timing window: the points of one shape and variant (and options) compared with each other."""
    return (p["technique"], p.get("variant"), p["M"], p["N"], p.get("K"), p["dtype"],
            json.dumps(p.get("options") or {}, sort_keys=True))


def _calibration_of(run_dir: Path) -> dict | None:
    """The copy-bandwidth / cuBLAS calibration recorded in a run folder's meta.json (None if absent or failed):
    the replicates of one invocation share replicate 0's instead of measuring it again."""
    f = run_dir / "meta.json"
    cal = json.loads(f.read_text()).get("calibration") if f.exists() else None
    return {**cal, "measured_in": run_dir.name} if cal and cal.get("status", "ok") == "ok" and "copy_tbps" in cal else None


def _run_one(cfg: dict, points: list[dict], run_mode: str, run_id: str, run_dir: Path, replicate: int,
             calibration: dict | None = None) -> Path:
    """Measure ``points`` into ``run_dir`` (resuming it): per shape window, the sweep points, then (GPU,
    ``timing.paired.rounds > 0``) the paired rounds of its baselines and each DSL's best configs."""
    from rich.console import Console

    console = Console(stderr=True)
    fresh = not run_dir.exists()  # a configuration error leaves no trace of a run folder this call created
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
    paired_cfg = dict((cfg.get("timing") or {}).get("paired") or {})
    done = store.done_keys(retry_statuses=retry) if cfg.get("resume", True) else set()
    paired_on = run_mode == "gpu" and int(paired_cfg.get("rounds") or 0) > 0
    # paired.only: no per-config sweep timing; every point of a window is checked and timed in its rounds
    todo = [] if paired_on and paired_cfg.get("only") else \
        [p for p in points if point_key({**p, "stage": "sweep"}) not in done]
    windows_done = _windows_done(run_dir) if paired_on else set()
    console.print(f"[bold]{cfg['experiment_name']}[/] run {run_id}"
                  + (f" replicate {replicate}" if run_dir.name.startswith("rep") else "")
                  + f" ({run_mode} mode): {len(points)} points, "
                  + ("all checked and timed in paired windows" if paired_on and paired_cfg.get("only") else
                     f"{len(points) - len(todo)} already done, {len(todo)} to run") + (f", paired windows of up to {paired_cfg['rounds']} rounds" if paired_on else "")
                  + f" -> {run_dir}")
    versions = dict(meta.get("versions", {}))
    inject = {}
    for spec in cfg.get("debug", {}).get("inject") or []:  # "crash@<pattern>" | "hang@<pattern>"
        what, _, pattern = str(spec).partition("@")
        if what not in ("crash", "hang") or not pattern:
            raise ValueError(f"debug.inject entries look like 'crash@<pattern>' or 'hang@<pattern>', got {spec!r}")
        inject[pattern] = what
    calibration = meta.get("calibration") or calibration
    completed, measured, windows, interrupted, config_error = False, 0, 0, False, False
    gpu_before, uuid, mismatches, gpu_props = {"available": False}, None, [], {}
    common = {"run_id": run_id, "experiment": cfg["experiment_name"], "hardware": cfg["hardware"]["name"],
              "replicate": replicate, **git}
    try:
        used = {p["env"] for p in points} | ({cfg["baseline_env"]} if run_mode == "gpu" else set())
        try:  # a missing interpreter (no `make venvs` yet) is a configuration error, not an error row per point
            for name in sorted(used & set(envs)):
                require_python(name, str(envs[name]["python"]))
        except ValueError:
            config_error = True
            raise
        for wkey in sorted({(p["env"], p["mode"]) for p in points}):  # versions, the GPU, the tiling configs
            hello = _hello(pool, *wkey)
            versions[f"{wkey[0]}-{wkey[1]}"] = hello.get("versions") or {"error": hello.get("error")}
            gpu_props = gpu_props or (hello.get("gpu") or {})  # the device the workers use (CUDA_VISIBLE_DEVICES)
            uuid = uuid or gpu_props.get("gpu_uuid")
            try:
                _validate_configs(pool, wkey, [p for p in points if (p["env"], p["mode"]) == wkey])
            except ValueError:
                config_error = True
                raise
        gpu_before = hardware.read_gpu(uuid=uuid)
        if run_mode == "gpu":
            gpu_before.update({k: v for k, v in gpu_props.items() if v is not None})
            mismatches = hardware.compare(cfg["hardware"], gpu_before, strict=bool(cfg["hardware"].get("strict", False)))
        else:
            mismatches = [f"configured hardware {cfg['hardware']['name']!r}; ran in CPU mode (no timings)"]
        common.update({"gpu_name": gpu_before.get("gpu_name", "none (cpu)"), "power_limit_w": gpu_before.get("power_limit_w")})
        if run_mode == "gpu" and cfg.get("calibrate", True) and not calibration and todo:
            try:
                calibration = pool.request(cfg["baseline_env"], "gpu", {"op": "calibrate"}, 600)
            except WorkerDied as e:
                calibration = {"status": e.status, "error": str(e)}
        groups: dict[tuple, list[dict]] = {}
        for p in points:
            groups.setdefault(_shape_key(p), []).append(p)
        todo_keys = {point_key({**p, "stage": "sweep"}) for p in todo}
        n_windows = sum(1 for k in groups if paired_on and k not in windows_done)
        prog = _progress(console)
        total = len(todo) + n_windows
        task = None
        if prog is not None:
            prog.start()
            task = prog.add_task("sweep", total=total, point="")
        step = 0
        hung = {}  # (dsl, impl, variant, config_name) -> shape at which it timed out

        beat = {"label": None, "minutes": 0}

        def tell(label: str, result: str = "", elapsed: float | None = None):
            """Progress: the current point (and, inside long points, its elapsed time); one line per point in logs
            and, inside a point that runs long, one line a minute."""
            if prog is not None:
                prog.update(task, description=label[:60], point=f"{elapsed:.0f} s" if elapsed else "")
            elif result:
                print(f"[{step}/{total}] {label}: {result}", file=sys.stderr, flush=True)
            elif elapsed:
                if beat["label"] != label:
                    beat.update(label=label, minutes=0)
                if int(elapsed // 60) > beat["minutes"]:
                    beat["minutes"] = int(elapsed // 60)
                    print(f"[{step + 1}/{total}] {label}: still running ({elapsed:.0f} s)", file=sys.stderr, flush=True)

        for gkey, gpoints in groups.items():
            for p in gpoints:
                if point_key({**p, "stage": "sweep"}) not in todo_keys:
                    continue
                label = f"{p['dsl']}/{p['impl']}/{p['config_name']} " + _shape_text(p)
                tell(label)
                ckey = (p["dsl"], p["impl"], p.get("variant"), p["config_name"])
                if ckey in hung:  # a config that hung once would likely hang again: record, do not wait again
                    row = {**p, "status": "skipped", "error": f"not run: this config timed out at {hung[ckey]}"}
                else:
                    row = _measure(pool, p, cfg, nonce, inject, on_wait=lambda t, lb=label: tell(lb, elapsed=t))
                    if row.get("status") == "timeout" and cfg.get("skip_config_after_timeout", True):
                        hung[ckey] = f"{p['M']}x{p['N']}x{p['K']}"
                row.update({**common, "stage": "sweep",
                            "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
                store.append(row)
                measured += 1
                step += 1
                if prog is not None:
                    prog.advance(task)
                tell(label, _row_result(row))
            if paired_on and gkey not in windows_done:
                label = f"paired {gpoints[0]['technique']} " + _shape_text(gpoints[0])
                tell(label)
                res = _paired_window(pool, gkey, gpoints, store, run_dir, cfg, paired_cfg, nonce, common, uuid,
                                     on_wait=lambda t, lb=label: tell(lb, elapsed=t))
                windows += 1
                step += 1
                if prog is not None:
                    prog.advance(task)
                tell(label, res)
        if prog is not None:
            prog.stop()
        completed = True
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        pool.close(kill=interrupted or config_error)  # an interrupt does not wait for the point in flight
        if config_error and fresh:  # nothing was measured: write nothing, and remove the folder this call made
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
            try:  # and the experiment's folder, if that was all it held
                run_dir.parent.rmdir()
            except OSError:
                pass
        if not config_error:
            # meta.json also when the sweep is interrupted (Ctrl-C, SIGTERM, a time budget): the rows already measured
            # keep their hardware, versions and calibration
            gpu_after = hardware.read_gpu(uuid=uuid)
            now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            invocation = {"time": now, "git_sha": git["git_sha"], "dsls": list(cfg.get("dsls") or {}),
                          "shape": cfg["shape"].get("name"), "tiling": sorted(cfg.get("tiling") or {}),
                          "points": len(points), "measured": measured, "windows": windows,
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_uuid": uuid}
            if meta and not measured and not windows:
                # an invocation that measured nothing (a resume with nothing left, or one stopped before its first
                # point): the run's commit, hardware and config stay those of the invocations that measured it
                meta["invocations"] = meta.get("invocations", []) + [invocation]
            else:
                meta.update({"run_id": run_id, "experiment": cfg["experiment_name"], "mode": run_mode,
                             "replicate": replicate, "created": meta.get("created") or now, "updated": now,
                             "hardware_config": cfg["hardware"], "hardware_before": gpu_before,
                             "hardware_after": gpu_after,
                             "hardware_mismatches": sorted(set(meta.get("hardware_mismatches", [])) | set(mismatches)),
                             "versions": versions, "calibration": calibration, **git, "config": cfg,
                             "invocations": meta.get("invocations", []) + [invocation],
                             "timing_note": _timing_note(cfg, run_mode, paired_cfg)})
                if not completed:
                    meta["interrupted"] = now
                else:
                    meta.pop("interrupted", None)
            meta_path.write_text(json.dumps(meta, indent=2, default=str))
    finalize(run_dir, console=console)
    return run_dir


def _shape_text(p: dict) -> str:
    """'<variant> MxN[xK]' of a point for progress lines (no K for [M, N] techniques)."""
    shape = f"{p['M']}x{p['N']}" + (f"x{p['K']}" if p.get("K") is not None else "")
    return f"{p['variant']} {shape}" if p.get("variant") else shape


def _timing_note(cfg: dict, run_mode: str, paired_cfg: dict) -> str:
    if run_mode != "gpu":
        return "CPU mode: correctness only, no timings"
    note = f"p50 of normfuse.timing.bench, method {cfg['timing']['method']}"
    pc = {**PAIRED_DEFAULTS, **paired_cfg}  # what the windows run with (_paired_window)
    if int(paired_cfg.get("rounds") or 0) > 0:
        note += (f"; paired windows: per shape, the baselines and each DSL's best {paired_cfg.get('candidates', 1)} "
                 f"config(s) per impl sampled in up to {paired_cfg['rounds']} alternating rounds (CUDA-graph pairs, "
                 f"cold L2; order {pc['order']}, settle {'on' if pc['settle'] else 'off'}), metrics per round, "
                 f"median with a 95 % bootstrap interval (paired.parquet)")
    return note


def _row_result(row: dict) -> str:
    st = row.get("status")
    if st == "ok" and row.get("p50_ms") is not None:
        return f"ok {row['p50_ms']:.4g} ms (compile {row.get('compile_s') or 0:.1f} s)"
    return st if st in ("ok", "compile_only") else f"{st}: {str(row.get('error'))[:120]}"


def _hello(pool: Pool, env: str, mode: str) -> dict:
    try:
        return pool.request(env, mode, {"op": "hello"}, 300)
    except WorkerDied as e:
        return {"error": str(e)[:500]}


def _validate_configs(pool: Pool, wkey: tuple, points: list[dict]) -> None:
    """Every tiling config of the run built through its DSL's TilingConfig (no compile) before any point is
    measured: an unknown key or bad value is a configuration error that stops the run (ValueError), not a row."""
    seen, items = set(), []
    for p in points:
        if p["dsl"] == registry.BASELINE_DSL:
            continue
        k = (p["dsl"], p["technique"], p["impl"], p.get("variant"), p["config_name"])
        if k not in seen:
            seen.add(k)
            items.append({"dsl": p["dsl"], "technique": p["technique"], "impl": p["impl"], "variant": p.get("variant"),
                          "name": p["config_name"], "config": p["config"]})
    if not items:
        return
    try:
        reply = pool.request(wkey[0], wkey[1], {"op": "validate_config", "configs": items}, 300)
    except WorkerDied as e:
        raise RuntimeError(f"the {wkey[0]}-{wkey[1]} worker died while validating the tiling configs: {e}") from None
    if reply.get("status") != "ok":
        raise RuntimeError(f"validating the tiling configs failed in the {wkey[0]}-{wkey[1]} worker: {reply.get('error')}")
    if reply.get("errors"):
        raise ValueError("invalid tiling config(s):\n  " + "\n  ".join(dict.fromkeys(reply["errors"])))


def _measure(pool: Pool, p: dict, cfg: dict, nonce: str, inject: dict, on_wait=None) -> dict:
    key = point_key(p)
    req = {"op": "measure", **p, "seed": _seed(nonce, key), "warmup_ms": cfg["timing"]["warmup_ms"],
           "rep_ms": cfg["timing"]["rep_ms"], "timing": cfg["timing"]["method"]}
    for pattern, what in inject.items():  # test hook: simulate a crash or hang at matching points
        if pattern in f"{p['dsl']}/{p['impl']}/{p['config_name']}/{p['M']}x{p['N']}x{p['K']}":
            req["inject"] = what
    row = {k: v for k, v in p.items()}
    row["seed"] = req["seed"]
    try:
        reply = pool.request(p["env"], p["mode"], req, float(cfg["point_timeout_s"]), on_wait=on_wait)
    except WorkerDied as e:
        reply = {"status": e.status, "error": str(e)[-2000:]}
    reply.pop("traceback", None)
    row.update(reply)
    return row


# ----------------------------------------------------------------------------------------------- paired windows
# order: "shuffled" = a fresh seeded permutation of the participants every round; "rotated" = the same cyclic order
# started one position later every round (the order of every run before this option: with participants in two worker
# processes, the first participant of the list came right after the other process's block in all rounds but the
# boundary ones, and read 0.7-1.8 % faster than in a one-process window: results/norms_inductor_aa/)
# settle: after a replay in another worker process, the participant is replayed once untimed before its sample
PAIRED_DEFAULTS = {"rounds": 0, "min_rounds": 15, "candidates": 1, "graph_ms": 3.0, "max_window_s": 60.0, "only": False,
                   "order": "shuffled", "settle": True}
PAIRED_ORDERS = ("shuffled", "rotated")


def round_order(ready: list, r: int, order: str, rng: random.Random) -> list:
    """The participants of round ``r`` in the order they are replayed: ``"shuffled"`` a permutation drawn from
    ``rng`` (seeded per window, so a rerun replays the same orders), ``"rotated"`` ``ready`` started at position
    ``r mod len(ready)``. ValueError for another ``order``."""
    _check_order(order)
    if order == "shuffled":
        return rng.sample(ready, len(ready))
    return ready[r % len(ready):] + ready[:r % len(ready)]


def _check_order(order: str) -> None:
    if order not in PAIRED_ORDERS:
        raise ValueError(f"timing.paired.order must be one of {PAIRED_ORDERS}, got {order!r}")


def _windows_done(run_dir: Path) -> set:
    """Shape keys of the windows already recorded in the run (a resume skips them)."""
    f = run_dir / WINDOWS_FILE
    return {tuple(w["key"]) for w in read_jsonl(f)} if f.exists() else set()


def _participants(gpoints: list[dict], store: ResultsStore, candidates: int) -> list[dict]:
    """The points of a window worth pairing: every baseline that passed, and per (dsl, impl) the ``candidates``
    fastest correct configs by their sweep p50."""
    keys = {point_key({**p, "stage": "sweep"}): p for p in gpoints}
    best: dict[tuple, list] = {}
    out = []
    for r in reversed(store.rows()):  # the last row of a key wins (a retried point replaces its failure)
        k = point_key(r)
        if k not in keys:
            continue
        p = keys.pop(k)
        if r.get("status") != "ok" or r.get("p50_ms") is None:
            continue
        if p["dsl"] == registry.BASELINE_DSL:
            out.append(p)
        else:
            best.setdefault((p["dsl"], p["impl"]), []).append((float(r["p50_ms"]), p))
    for _, cands in sorted(best.items()):
        out.extend(p for _, p in sorted(cands, key=lambda t: t[0])[:candidates])
    return out


def _paired_window(pool: Pool, gkey: tuple, gpoints: list[dict], store: ResultsStore, run_dir: Path, cfg: dict,
                   paired_cfg: dict, nonce: str, common: dict, uuid: str | None, on_wait=None) -> str:
    """Time one shape's participants in alternating rounds; append the rounds, the window and one
    ``stage='paired'`` row per participant. Every participant is prepared (fresh inputs, checked against the fp32
    reference) before any round; a participant that fails is recorded and left out. Returns a one-line result."""
    pc = {**PAIRED_DEFAULTS, **paired_cfg}
    parts = list(gpoints) if pc.get("only") else _participants(gpoints, store, int(pc["candidates"]))
    if not pc.get("only") and (not any(p["dsl"] != registry.BASELINE_DSL for p in parts) or len(parts) < 2):
        _append_jsonl(run_dir / WINDOWS_FILE, {"key": list(gkey), "n_rounds": 0, "note": "nothing to pair"})
        return "nothing to pair"
    timeout = float(cfg["point_timeout_s"])
    ready, rows = [], {}
    seed = _seed(nonce, gkey + ("paired",))  # one set of inputs for the whole window (shared within each worker)
    for i, p in enumerate(parts):
        handle = f"w{i}"
        req = {"op": "prepare", **p, "handle": handle, "graph_ms": float(pc["graph_ms"]), "seed": seed,
               "share_inputs": True}
        row = {**p, "seed": req["seed"], "stage": "paired"}
        try:
            reply = pool.request(p["env"], p["mode"], req, timeout, on_wait=on_wait)
        except WorkerDied as e:
            reply = {"status": e.status, "error": str(e)[-2000:]}
        reply.pop("traceback", None)
        row.update(reply)
        rows[handle] = row
        if row.get("status") == "ok":
            ready.append((handle, p))
    samples: dict[str, list] = {h: [] for h, _ in ready}
    window_id = len(_windows_done(run_dir))  # windows are numbered in the order they were measured
    window = {"key": list(gkey), "window": window_id, "technique": gkey[0], "variant": gkey[1], "M": gkey[2], "N": gkey[3], "K": gkey[4],
              "dtype": gkey[5], "replicate": common["replicate"],
              "participants": [f"{p['dsl']}/{p['impl']}/{p['config_name']}" for _, p in ready]}
    error = None
    t0 = time.monotonic()
    rounds = int(pc["rounds"])
    rng = random.Random(seed)
    last_worker = None  # (env, mode) of the previous replay
    round_rows = []
    try:
        with hardware.Sampler(uuid) as sampler:
            r = 0
            while r < rounds and len(ready) >= 2:
                for pos, (handle, p) in enumerate(round_order(ready, r, pc["order"], rng)):
                    # settle: the first replay after the other worker process's reads ~1 % short (only the first:
                    # results/norms_inductor_aa/): after a switch of worker, replay twice and keep the second
                    settle = bool(pc["settle"]) and last_worker not in (None, (p["env"], p["mode"]))
                    last_worker = (p["env"], p["mode"])
                    req = {"op": "replay", "handles": [handle, handle] if settle else [handle]}
                    ms = pool.request(p["env"], p["mode"], req, timeout)["ms"][-1]
                    samples[handle].append(ms)
                    round_rows.append({"technique": gkey[0], "variant": gkey[1], "M": gkey[2], "N": gkey[3],
                                       "K": gkey[4], "dtype": gkey[5], "replicate": common["replicate"], "window": window_id, "round": r,
                                       "dsl": p["dsl"], "impl": p["impl"], "config_name": p["config_name"], "ms": ms,
                                       "position": pos, "settled": settle})
                r += 1
                spent = time.monotonic() - t0
                if r == 1:  # cap the rounds by the window's time budget, never below min_rounds
                    rounds = max(min(rounds, int(pc["min_rounds"])), min(rounds, int(float(pc["max_window_s"]) / spent)))
                if on_wait is not None:
                    on_wait(spent)
        window.update(sampler.stats())
    except WorkerDied as e:
        error = f"{e.status}: {str(e)[-500:]}"
    finally:
        for env_mode in {(p["env"], p["mode"]) for _, p in ready}:
            try:
                pool.request(*env_mode, {"op": "release"}, 120)
            except WorkerDied:
                pass
    window.update({"n_rounds": min((len(v) for v in samples.values()), default=0), "seconds": time.monotonic() - t0,
                   "gpu_uuid": uuid, **({"error": error} if error else {})})
    n = window["n_rounds"]
    import gzip

    with gzip.open(run_dir / ROUNDS_FILE, "at") as f:  # complete rounds only; appended gzip members (~15x smaller)
        for rr in round_rows:
            if rr["round"] < n:
                f.write(json.dumps(rr) + "\n")
    from normfuse.timing import summarize

    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    for handle, row in rows.items():
        if row.get("status") == "ok":
            xs = sorted(samples.get(handle, [])[:n])
            if xs:
                row.update(summarize(xs))
            elif error:
                row.update({"status": "error", "error": error})
            else:
                row.update({"status": "skipped", "error": "checked, not timed: no other participant passed its "
                                                           "check in this window"})
            row["sm_clock_mhz"] = window.get("sm_clock_mhz_median")
        row.update({**common, "timestamp": stamp})
        store.append(row)
    _append_jsonl(run_dir / WINDOWS_FILE, window)
    return f"{n} rounds x {len(ready)} participants in {window['seconds']:.1f} s" + (f" ({error})" if error else "")


def _append_jsonl(path: Path, obj: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(obj, default=str) + "\n")


def finalize(run_dir: Path, console=None) -> "object":
    """Recompute metrics from results.jsonl (and the paired rounds) and write results.parquet/.csv, paired.parquet,
    plots and summary.md into the run folder (``normfuse.report.derive``); returns the DataFrame. A replicate folder
    (``rep<k>``) gets no plots of its own: the merged set has them."""
    from normfuse import report

    run_dir = Path(run_dir)
    is_replicate = run_dir.name.startswith("rep") and run_dir.name[3:].isdigit()
    return report.derive(run_dir, out_dir=run_dir, write_tables=True, console=console, plots=not is_replicate)[0]
