"""Packaging: ``pip install -e .`` into a fresh venv (no network: --no-deps, --no-build-isolation), imports and
console scripts from outside the clone, and the lock files against pyproject.toml."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the locks are resolved for 3.11)

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = {"normfuse-run": "normfuse.cli:run", "normfuse-report": "normfuse.cli:report",
           "normfuse-compare": "normfuse.cli:compare"}
PACKAGES = ("normfuse", "normfuse.techniques", "experiments", "kernels_triton", "kernels_helion", "kernels_tlx")
# what each lock file must cover: the core dependencies plus these extras
LOCKS = {"upstream": ("upstream", "test"), "tlx": ("tlx", "test")}
NOT_LOCKED = {"torch"}  # installed first, per platform (Makefile TORCH_SPEC; requirements/README.md)


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(cmd, cwd, env, timeout=300) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed (rc={p.returncode})\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n" \
                              f"{p.stderr[-3000:]}"
    return p


def _site_packages(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A new venv with only normfuse, installed editable from this clone. The build runs offline: the venv has no
    pip or setuptools of its own, so this interpreter's (setuptools >= 64) are lent to the install step only."""
    import importlib.util

    venv = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent, env=_clean_env())
    lend = os.pathsep.join(dict.fromkeys(str(Path(importlib.util.find_spec(m).origin).parents[1])
                                         for m in ("setuptools", "pip")))
    _run([venv / "bin/python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-e", ROOT], cwd=venv.parent, env=_clean_env(PYTHONPATH=lend))
    return venv


def test_editable_install_imports_and_scripts_outside_the_clone(fresh_venv, tmp_path):
    code = f"""
import importlib, importlib.metadata as md, importlib.util, json
import normfuse, normfuse.cli, experiments, kernels_triton, kernels_tlx
eps = {{e.name: e.value for e in md.entry_points(group="console_scripts") if e.name.startswith("normfuse")}}
for e in md.entry_points(group="console_scripts"):
    if e.name.startswith("normfuse"):
        assert callable(e.load()), e
print(json.dumps(dict(version=md.version("normfuse"), ver_attr=normfuse.__version__, scripts=eps,
                      origins={{m: importlib.util.find_spec(m).origin for m in {PACKAGES!r}}},
                      root=str(normfuse.cli.repo_root()))))
"""
    out = _run([fresh_venv / "bin/python", "-c", code], cwd=tmp_path, env=_clean_env())
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["version"] == info["ver_attr"]
    assert info["scripts"] == SCRIPTS
    assert info["root"] == str(ROOT)
    for mod, origin in info["origins"].items():  # editable: every package resolves to this clone's files
        assert Path(origin).is_relative_to(ROOT), (mod, origin)
    for name in SCRIPTS:
        assert (fresh_venv / "bin" / name).exists(), name
    # the two argparse commands answer --help before importing their heavy dependencies (none are installed here)
    for name, expect in (("normfuse-report", "run_dirs"), ("normfuse-compare", "--out")):
        p = _run([fresh_venv / "bin" / name, "--help"], cwd=tmp_path, env=_clean_env())
        assert expect in p.stdout, p.stdout


def test_installed_runner_finds_configs_from_outside_the_clone(fresh_venv, tmp_path):
    """With the test interpreter's packages on the path (hydra etc.), the console script and ``python -m`` both
    compose the Hydra config from the clone's configs/ while the working directory is elsewhere."""
    env = _clean_env(PYTHONPATH=_site_packages(Path(sys.executable)), HOME=str(tmp_path))
    for cmd in ([fresh_venv / "bin/normfuse-run"], [fresh_venv / "bin/python", "-m", "experiments.run"]):
        p = _run([*cmd, "--cfg", "job", "experiment=norms_smoke"], cwd=tmp_path, env=env)
        assert re.search(r"^experiment_name: norms_smoke$", p.stdout, re.M), p.stdout[-2000:]
        assert "technique:" in p.stdout


def test_cli_rejects_a_non_editable_layout(tmp_path, monkeypatch):
    import normfuse.cli as cli

    fake = tmp_path / "site-packages" / "normfuse" / "cli.py"
    fake.parent.mkdir(parents=True)
    monkeypatch.setattr(cli, "__file__", str(fake))
    with pytest.raises(SystemExit, match="install it editable"):
        cli.repo_root()


# ----------------------------------------------------------------------------------------------- lock files
def _lock(env: str) -> dict[str, Requirement]:
    pins = {}
    for line in (ROOT / "requirements" / f"{env}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        assert not line.startswith("-"), f"{env}.txt: option line {line!r} (machine-specific index settings?)"
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"{env}.txt: {line!r} is not an exact pin"
        pins[canonicalize_name(req.name)] = req
    return pins


def _declared(extras) -> list[Requirement]:
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]]
    return reqs


@pytest.mark.parametrize("env", sorted(LOCKS))
def test_lock_pins_every_declared_dependency(env):
    pins = _lock(env)
    for req in _declared(LOCKS[env]):
        name = canonicalize_name(req.name)
        if name in NOT_LOCKED:
            assert name not in pins, f"{name} must not be in {env}.txt (installed per platform first)"
            continue
        assert name in pins, f"{env}.txt does not pin {req.name} (declared in pyproject.toml)"
        version = Version(next(iter(pins[name].specifier)).version)
        assert req.specifier.contains(version, prereleases=True), f"{env}.txt pins {name}=={version}, " \
                                                                   f"pyproject.toml asks {req.specifier}"


def test_the_two_environments_never_share_a_triton():
    assert "triton" in _lock("upstream") and "fbtriton" not in _lock("upstream")
    assert "fbtriton" in _lock("tlx") and "triton" not in _lock("tlx")


def test_torch_specs_satisfy_pyproject():
    """The Makefile's per-platform torch pins and the version the locks were resolved against are all allowed by
    pyproject.toml; the CPU pin is the one the locks were resolved against."""
    declared = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch"))
    spec_line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("TORCH_SPEC"))
    gpu_pin, cpu_pin = re.findall(r"torch==([\w.]+)", spec_line)
    resolved = [Requirement(line) for line in (ROOT / "requirements/torch-resolve.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert [r.name for r in resolved] == ["torch"]
    assert next(iter(resolved[0].specifier)).version == cpu_pin
    for pin in (gpu_pin, cpu_pin):
        assert declared.specifier.contains(pin), (pin, declared)
