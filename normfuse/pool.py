"""Long-lived worker processes, one per (environment, mode), driven over JSON lines.

An environment (``configs/env/*.yaml``) is a python executable plus environment variables; the repository root
is prepended to the worker's PYTHONPATH so ``normfuse`` and ``kernels_*`` import there. A worker that crashes
(illegal address, deadlocked barrier, ``os._exit``) or does not answer within the point timeout is killed, the
point is recorded as ``error``/``timeout`` with the tail of its stderr, and the next request starts a fresh one.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# extra environment variables per CPU mode, set before the worker imports triton / helion
MODE_ENV = {
    "interpret": {"TRITON_INTERPRET": "1"},
    "ref": {"HELION_INTERPRET": "1"},
    "compile_only": {},
    "gpu": {},
    "cpu": {},  # PyTorch baselines on the CPU
}

# the variables that configs/env/local.yaml reads for each environment's interpreter (defaults: what `make venvs` makes)
PYTHON_VARS = {"upstream": "NORMFUSE_UPSTREAM_PYTHON", "tlx": "NORMFUSE_TLX_PYTHON"}


def require_python(env_name: str, python: str) -> str:
    """``python`` when it is an executable (a path, or a command on PATH); else ValueError naming the environment,
    the variable that selects its interpreter and ``make venvs``."""
    if shutil.which(python):
        return python
    var = PYTHON_VARS.get(env_name)
    fix = f"run `make venvs` or set {var} to its interpreter" if var else "run `make venvs`"
    raise ValueError(f"the {env_name!r} environment's interpreter {python} does not exist or is not executable: {fix}")


class WorkerDied(RuntimeError):
    """The worker exited or timed out; ``status`` is 'error' or 'timeout'."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class Worker:
    """One ``python -m normfuse.worker`` subprocess."""

    def __init__(self, name: str, python: str, env: dict[str, str], log_path: Path):
        self.name, self.python, self.env, self.log_path = name, python, env, log_path
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self.restarts = -1

    def start(self) -> None:
        env = {**os.environ, **{k: str(v) for k, v in self.env.items() if v is not None}}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("HELION_DISALLOW_AUTOTUNING", "1")
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a")
        self._log.write(f"\n==== start worker {self.name} at {time.strftime('%F %T')} ====\n")
        self._log.flush()
        self.proc = subprocess.Popen([self.python, "-m", "normfuse.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env, text=True, bufsize=1,
                                     cwd=str(REPO_ROOT), start_new_session=True)
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self._lines), daemon=True).start()
        self.restarts += 1

    @staticmethod
    def _pump(proc, q):
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, req: dict, timeout_s: float, on_wait=None) -> dict:
        """Send one request and wait for its reply; raise WorkerDied on exit or timeout (worker then killed).
        ``on_wait(elapsed_s)`` is called about once a second while waiting (progress inside long points); the wait
        is interruptible (Ctrl-C / SIGTERM reach the caller within a second)."""
        if not self.alive():
            self.start()
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied("error", f"worker {self.name} closed its input. {self.stderr_tail()}") from None
        t0 = time.monotonic()
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= timeout_s:
                self.kill()
                raise WorkerDied("timeout", f"no reply within {timeout_s:.0f} s; worker killed")
            try:
                line = self._lines.get(timeout=min(1.0, timeout_s - elapsed))
                break
            except queue.Empty:
                if on_wait is not None:
                    on_wait(time.monotonic() - t0)
        if line is None:
            code = self.proc.wait()
            raise WorkerDied("error", f"worker {self.name} died (exit code {code}). {self.stderr_tail()}")
        return json.loads(line)

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            self._log.flush()
            return "stderr tail: " + self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.alive():
            try:
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                self.kill()


class Pool:
    """Workers keyed by (environment name, mode), started on first use."""

    def __init__(self, envs: dict, log_dir: Path):
        self.envs, self.log_dir = envs, Path(log_dir)
        self.workers: dict[tuple[str, str], Worker] = {}

    def worker(self, env_name: str, mode: str) -> Worker:
        if env_name not in self.envs:
            raise ValueError(f"unknown env {env_name!r}; choices: {', '.join(self.envs)}")
        key = (env_name, mode)
        if key not in self.workers:
            e = self.envs[env_name]
            extra = {**(e.get("vars") or {}), **MODE_ENV[mode]}
            self.workers[key] = Worker(f"{env_name}-{mode}", str(e["python"]), extra,
                                       self.log_dir / f"worker-{env_name}-{mode}.log")
        return self.workers[key]

    def request(self, env_name: str, mode: str, req: dict, timeout_s: float, on_wait=None) -> dict:
        return self.worker(env_name, mode).request(req, timeout_s, on_wait=on_wait)

    def close(self, kill: bool = False) -> None:
        """Ask every worker to exit (waiting for the point in flight), or with ``kill=True`` (an interrupt) kill
        their process groups at once."""
        for w in self.workers.values():
            w.kill() if kill else w.close()
