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

.PHONY: run test test-gpu venvs clean-venvs
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

.venv/.done: requirements/upstream.txt
	$(PYTHON_BOOT) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q "$(TORCH_SPEC)"
	.venv/bin/pip install -q -r requirements/upstream.txt
	touch $@

# fbtriton installs its own `triton/`: remove upstream triton first (a CUDA torch pulls it in), then --no-deps
.venv-tlx/.done: requirements/tlx.txt
	$(PYTHON_BOOT) -m venv .venv-tlx
	.venv-tlx/bin/pip install -q --upgrade pip
	.venv-tlx/bin/pip install -q "$(TORCH_SPEC)"
	.venv-tlx/bin/pip install -q -r requirements/tlx.txt
	.venv-tlx/bin/pip uninstall -q -y triton || true
	.venv-tlx/bin/pip install -q --no-deps fbtriton==3.7.4
	touch $@

clean-venvs:
	rm -rf .venv .venv-tlx
