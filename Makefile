# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Each bootstraps .venv from nothing: torch==2.13.0 (CPU build) first, then pinned deps, then skillgraft.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.skillgraft-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (CI has 2 cores); TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= 2

.PHONY: demo test test-all bench setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/skillgraft demo

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS)

test-all: $(STAMP)
	SKILLGRAFT_SLOW=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs/demo runs/cache
