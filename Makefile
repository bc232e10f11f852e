# normfuse — two commands:  `make run` (the main job)  and  `make test` (the CPU test suite).
#
# `make run` measures on a GPU when one is visible (experiment=lazy_prenorm_blog) and otherwise runs the CPU
# smoke experiment (Triton interpreter, Helion ref mode, TLX compile-only; no timings). It creates the two
# virtualenvs it needs first. On an offline GPU host prepared with `source .gpubundle/env.sh` it uses that
# host's python3 and the bundle instead (env=gpubundle) and creates nothing.
#   make run ARGS='dsl=[triton,tlx] run_id=myrun'       extra Hydra overrides
#   make run EXPERIMENT=smoke                           force an experiment

PYTHON_BOOT ?= python3
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
# torch pin: the GPU numbers were taken with torch 2.11 + triton 3.6; CPU CI uses the CPU build of torch 2.13
TORCH_SPEC ?= $(if $(HAS_GPU),torch==2.11.0,torch==2.13.0)
EXPERIMENT ?= $(if $(HAS_GPU),lazy_prenorm_blog,smoke)

ifdef GPUBUNDLE_SITE
  PY := python3
  TLX_PY := PYTHONPATH=$$GPUBUNDLE_FBTRITON:$$GPUBUNDLE_SITE python3
  ENV_ARG := env=gpubundle
  VENVS :=
else
  PY := .venv/bin/python
  TLX_PY := .venv-tlx/bin/python
  ENV_ARG :=
  VENVS := .venv/.done .venv-tlx/.done
endif

.PHONY: run test test-gpu venvs lock clean-venvs
run: $(VENVS)
	$(PY) -m experiments.run experiment=$(EXPERIMENT) $(ENV_ARG) $(ARGS)

test: $(VENVS)
	$(PY) -m pytest -q tests --ignore=tests/tlx -m "not gpu" $(PYTEST_ARGS)
	$(TLX_PY) -m pytest -q tests/tlx -m "not gpu" $(PYTEST_ARGS)

# GPU correctness of every shipped config (device only; see README)
test-gpu:
	$(PY) -m pytest -q -m gpu tests --ignore=tests/tlx $(PYTEST_ARGS)
	$(TLX_PY) -m pytest -q -m gpu tests/tlx $(PYTEST_ARGS)

venvs: $(VENVS)

# Each venv: torch first (TORCH_SPEC, by platform; not in the locks), then the pinned lock of that environment
# (requirements/*.txt, generated from pyproject.toml by `make lock`), then this project, editable, without deps.
.venv/.done: requirements/upstream.txt pyproject.toml
	$(PYTHON_BOOT) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q "$(TORCH_SPEC)"
	.venv/bin/pip install -q -r requirements/upstream.txt
	.venv/bin/pip install -q --no-deps -e .
	touch $@

# fbtriton installs its own `triton/`. The lock goes in with --no-deps (nothing in it may pull upstream triton);
# a CUDA torch pulls upstream triton in itself: then remove it and reinstall fbtriton over the files they share.
FBTRITON_SPEC = $(shell grep '^fbtriton==' requirements/tlx.txt)
.venv-tlx/.done: requirements/tlx.txt pyproject.toml
	$(PYTHON_BOOT) -m venv .venv-tlx
	.venv-tlx/bin/pip install -q --upgrade pip
	.venv-tlx/bin/pip install -q "$(TORCH_SPEC)"
	.venv-tlx/bin/pip install -q --no-deps -r requirements/tlx.txt
	if .venv-tlx/bin/pip show -q triton 2>/dev/null; then \
	  .venv-tlx/bin/pip uninstall -q -y triton && \
	  .venv-tlx/bin/pip install -q --no-deps --force-reinstall "$(FBTRITON_SPEC)"; fi
	.venv-tlx/bin/pip install -q --no-deps -e .
	touch $@

# Regenerate the lock files from pyproject.toml (needs the package index; keeps existing pins where they still
# satisfy pyproject.toml: delete a line to let it move). requirements/README.md explains the torch handling.
PIP_TOOLS_SPEC ?= pip-tools==7.6.2
LOCK_FLAGS = -q --strip-extras --no-emit-index-url --no-emit-find-links -c requirements/torch-resolve.txt \
	--unsafe-package torch --unsafe-package setuptools --unsafe-package pip
lock: .venv-lock/.done
	CUSTOM_COMPILE_COMMAND="make lock" .venv-lock/bin/pip-compile $(LOCK_FLAGS) --extra upstream --extra test \
	  -o requirements/upstream.txt pyproject.toml
	CUSTOM_COMPILE_COMMAND="make lock" .venv-lock/bin/pip-compile $(LOCK_FLAGS) --extra tlx --extra test \
	  -o requirements/tlx.txt pyproject.toml

.venv-lock/.done:
	$(PYTHON_BOOT) -m venv .venv-lock
	.venv-lock/bin/pip install -q "$(PIP_TOOLS_SPEC)"
	touch $@

clean-venvs:
	rm -rf .venv .venv-tlx .venv-lock
