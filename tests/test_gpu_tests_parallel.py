"""tools/gpu_tests_parallel.py on the CPU: the scheduling and reporting, with the pytest subprocesses replaced."""

import importlib.util
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_tests_parallel", ROOT / "tools" / "gpu_tests_parallel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_print_as_they_finish_and_failures_set_the_exit_code(monkeypatch, tmp_path, capsys):
    mod = _load()
    nodes = {False: ["tests/a.py::slow", "tests/a.py::fast"], True: ["tests/tlx/b.py::broken"]}
    monkeypatch.setattr(mod, "collect", lambda tlx, k: nodes[tlx])

    def fake_run_one(node, tlx, timeout, log_dir):
        time.sleep(0.5 if node.endswith("slow") else 0.0)
        return ("FAILED" if node.endswith("broken") else "PASSED"), 0.0, node

    monkeypatch.setattr(mod, "run_one", fake_run_one)
    rc = mod.main(["--jobs", "3", "--log-dir", str(tmp_path)])
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "::" in ln]
    assert rc == 1
    assert "2 passed, 1 not passed" in out
    assert len(lines) == 3
    assert lines[-1].endswith("tests/a.py::slow")      # submitted first, finished last, printed last
