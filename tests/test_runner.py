"""The runner end to end on the CPU: a worker crash, a hang (timeout), resume, retry, results and plots."""

import json
import subprocess
import sys

import pandas as pd
import pytest


def _run(repo_root, env, tmp_path, *overrides, timeout=900):
    experiment = [o for o in overrides if o.startswith("experiment=")] or ["experiment=smoke"]
    overrides = [o for o in overrides if not o.startswith("experiment=")]
    cmd = [sys.executable, "-m", "experiments.run", *experiment, f"results_dir={tmp_path}", "run_id=t",
           "hydra.run.dir=" + str(tmp_path / "hydra"), *overrides]
    p = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_crash_timeout_resume(repo_root, subprocess_env, tmp_path):
    common = ["dsl=[triton]", "baselines=[cublas]", "shape.points=[{M: 64, N: 64, K: 64},{M: 1, N: 72, K: 72}]",
              "point_timeout_s=60"]
    _run(repo_root, subprocess_env, tmp_path, *common,
         "debug.inject=['crash@triton/gemm/b32-reload/64x64x64','hang@torch/cublas/-/64x64x64']")
    run_dir = tmp_path / "smoke" / "t"
    rows = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6  # 2 shapes x (cublas + triton fused + triton gemm)
    status = {(r["dsl"], r["impl"], r["M"]): r["status"] for r in rows}
    assert status[("triton", "gemm", 64)] == "error"          # the crash is recorded...
    assert status[("torch", "cublas", 64)] == "timeout"       # ...and the hang is killed,
    assert status[("torch", "cublas", 1)] == "skipped"        # the hung config is not waited for again
    assert status[("triton", "fused", 64)] == "ok"            # the next point, in a restarted worker, is fine
    assert status[("triton", "fused", 1)] == "ok" and status[("triton", "gemm", 1)] == "ok"
    assert all(r["mode"] in ("interpret", "cpu") for r in rows)
    assert all(r.get("p50_ms") is None for r in rows)         # CPU mode makes no timing claims

    # resume: nothing to do, nothing duplicated; the run's meta.json keeps the commit of the invocation that
    # measured it (a no-op resume from another commit, or another host, is only listed under invocations)
    before = json.loads((run_dir / "meta.json").read_text())
    p = _run(repo_root, {**subprocess_env, "NORMFUSE_GIT_SHA": "0123456789ab"}, tmp_path, *common)
    assert "0 to run" in p.stderr
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 6
    after = json.loads((run_dir / "meta.json").read_text())
    assert after["git_sha"] == before["git_sha"] != "0123456789ab" and after["updated"] == before["updated"]
    last = after["invocations"][-1]
    assert len(after["invocations"]) == len(before["invocations"]) + 1
    assert last["git_sha"] == "0123456789ab" and last["measured"] == 0 and last["windows"] == 0

    # retry the failed points (no fault injected this time)
    _run(repo_root, subprocess_env, tmp_path, *common, "retry_statuses=[error,timeout,skipped]")
    df = pd.read_parquet(run_dir / "results.parquet")
    assert len(df) == 6 and set(df["status"]) == {"ok"}
    for f in ("results.csv", "meta.json", "summary.md", "plots/check_heatmap.png", "plots/check_heatmap.pdf"):
        assert (run_dir / f).exists(), f
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["mode"] == "cpu" and meta["hardware_mismatches"] and "upstream-interpret" in meta["versions"]


@pytest.mark.slow
def test_norms_smoke_end_to_end(repo_root, subprocess_env, tmp_path):
    """The standalone-norm technique through the whole CPU path: Triton interpreter, Helion ref mode, TLX sm_90
    compile (plain and cluster), for RMSNorm and LayerNorm."""
    _run(repo_root, subprocess_env, tmp_path, "experiment=norms_smoke")
    df = pd.read_parquet(tmp_path / "norms_smoke" / "t" / "results.parquet")
    assert set(df["variant"]) == {"rmsnorm", "layernorm"}
    assert set(df["status"]) <= {"ok", "compile_only"}, df[["dsl", "config_name", "status", "error"]]
    assert (df[df.dsl == "tlx"]["status"] == "compile_only").all()
    assert df["K"].isna().all()


@pytest.mark.slow
def test_interrupted_sweep_writes_meta(repo_root, subprocess_env, tmp_path):
    """Ctrl-C (or a time budget's SIGINT) in the middle of a sweep: the rows measured so far stay, meta.json is
    written and says ``interrupted``, and the exit code is non-zero with a resume hint."""
    import signal
    import time

    cmd = [sys.executable, "-m", "experiments.run", "experiment=smoke", f"results_dir={tmp_path}", "run_id=t",
           "hydra.run.dir=" + str(tmp_path / "hydra"), "dsl=[triton]", "baselines=[cublas]",
           "shape.points=[{M: 64, N: 64, K: 64}]", "point_timeout_s=120",
           "debug.inject=['hang@triton/fused/b32-reload/64x64x64']"]
    # SIGINT back to its default in the child: a test run started in the background of a non-interactive shell
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    p = subprocess.Popen(cmd, cwd=repo_root, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    rows = tmp_path / "smoke" / "t" / "results.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and not (rows.exists() and rows.read_text().strip()):
        time.sleep(0.5)
    time.sleep(2.0)  # now inside the injected hang of the next point
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert "resume" in (out + err)
    meta = json.loads((tmp_path / "smoke" / "t" / "meta.json").read_text())
    assert meta.get("interrupted") and meta["invocations"][-1]["measured"] >= 1
    assert len(rows.read_text().splitlines()) >= 1


def test_missing_interpreter_is_a_configuration_error(repo_root, subprocess_env, tmp_path):
    """No ``.venv-tlx`` (``make venvs`` not run) and a TLX point to run: exit 2 with a message naming the variable
    that selects the interpreter and ``make venvs`` (no traceback), and no run folder left behind."""
    missing = tmp_path / "no-venv-tlx" / "bin" / "python"
    env = {**subprocess_env, "NORMFUSE_TLX_PYTHON": str(missing), "NORMFUSE_UPSTREAM_PYTHON": sys.executable}
    cmd = [sys.executable, "-m", "experiments.run", "experiment=smoke", f"results_dir={tmp_path}", "run_id=t",
           "hydra.run.dir=" + str(tmp_path / "hydra"), "dsl=[tlx]", "baselines=[]",
           "shape.points=[{M: 64, N: 64, K: 64}]"]
    p = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout[-3000:] + p.stderr[-3000:]
    assert "NORMFUSE_TLX_PYTHON" in p.stderr and "make venvs" in p.stderr and str(missing) in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "smoke" / "t").exists()


def test_versions_record_the_ptxas_that_compiles():
    """meta.json's versions name the ptxas Triton compiles with (TRITON_PTXAS_PATH or its own), version and path."""
    import re

    from normfuse.worker import versions

    v = versions()["ptxas"]
    assert re.fullmatch(r"\d+\.\d+ \(/.*ptxas\)", v), v
