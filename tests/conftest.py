"""Shared fixtures: tiny models per architecture, a toy data root, and the real-data markers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tiny import build_tiny, write_sentiment_data  # noqa: E402

# One intra-op thread: tiny models are dominated by thread overhead, and on a shared 2-core machine
# OpenMP spin-waiting across processes makes them 10-100x slower. SKILLGRAFT_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("SKILLGRAFT_TEST_THREADS", "1")))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    slow_ok = os.environ.get("SKILLGRAFT_SLOW") == "1"
    for item in items:
        if "slow" in item.keywords and not slow_ok:
            item.add_marker(pytest.mark.skip(reason="slow real-model run; set SKILLGRAFT_SLOW=1"))
        if "real" in item.keywords and not SHARED_DATA.is_dir():
            item.add_marker(pytest.mark.skip(reason=f"needs {SHARED_DATA}"))


@pytest.fixture(scope="session", autouse=True)
def fixture_store(tmp_path_factory):
    """The store of the session- and module-scoped fixtures (set up before any test's own): the fine-tuned runs
    several tests read are made once, as inputs; never ./runs/cache."""
    root = tmp_path_factory.mktemp("fixture-store")
    old = os.environ.get("SKILLGRAFT_CACHE")
    os.environ["SKILLGRAFT_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("SKILLGRAFT_CACHE", None)
    else:
        os.environ["SKILLGRAFT_CACHE"] = old


@pytest.fixture(autouse=True)
def isolated_store(tmp_path_factory, monkeypatch):
    """Each test's own store of finished stages (``$SKILLGRAFT_CACHE``), empty at its start and never ./runs/cache:
    what a test costs does not depend on which tests ran before it in the same worker. What several tests read (the
    tiny models, the toy data, a fine-tuned run of a module) are fixtures, read-only inputs."""
    root = tmp_path_factory.mktemp("store")
    monkeypatch.setenv("SKILLGRAFT_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {kind: build_tiny(kind, root / kind) for kind in ("bert", "roberta", "gpt2", "llama", "gemma3")}


@pytest.fixture(scope="session")
def tiny_bert(tiny_models) -> Path:
    return tiny_models["bert"]


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """A data root holding a learnable toy 'SST-2' (JSONL layout)."""
    return write_sentiment_data(tmp_path_factory.mktemp("toy-data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return SHARED_DATA
