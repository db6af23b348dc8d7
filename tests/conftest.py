"""Shared fixtures: tiny models per architecture, a toy data root, and the real-data markers."""

from __future__ import annotations

import gc
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# torch, tests/tiny.py and skillgraft are imported by the fixtures that use them: the pytest-xdist controller, which
# runs no test, loads this file too and never needs them (~2.5 s CPU of imports).


def _invoke(*args):
    from userland import invoke  # noqa: PLC0415

    return invoke(*args)


def pytest_collection(session):
    """One intra-op thread where tests are collected (a worker, or the one process): tiny models are dominated by
    thread overhead, and on a shared 2-core machine OpenMP spin-waiting across processes makes them 10-100x slower.
    SKILLGRAFT_TEST_THREADS overrides. (The xdist controller collects nothing: it does not import torch.)"""
    if hasattr(session.config, "workerinput") or not session.config.pluginmanager.hasplugin("dsession"):
        import torch  # noqa: PLC0415

        torch.set_num_threads(int(os.environ.get("SKILLGRAFT_TEST_THREADS", "1")))
        if hasattr(os, "fork") and "skillgraft" not in sys.modules:  # before any test module imports skillgraft
            from clean import fork_clean  # noqa: PLC0415

            session.config._clean_python = fork_clean()

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Figures are built but not rendered: every PNG a verb writes is a 1x1 placeholder (SKILLGRAFT_FIGURES=placeholder,
# skillgraft.evaluate.plots.save_figure; inherited by the CLI processes tests start). Rendering was ~14 % of the
# suite's CPU and most tests only check that a figure file is there; a test that looks at a figure's pixels is marked
# `figures` and renders for real (`figures(NAME, …)`: those files only). SKILLGRAFT_FIGURES=png in the environment
# renders everywhere.
os.environ.setdefault("SKILLGRAFT_FIGURES", "placeholder")


# The files that take longest, longest first, run first: with `make test`'s `--dist loadfile` a long file started last
# would leave the other worker idle at the end (`make test` passes --no-loadscope-reorder: xdist otherwise reorders
# files by their number of tests). Order within a file is kept. Ordered by the summed seconds per file of a full
# two-worker run (setup + call per test; refreshed in session 28, after the forked children and the clean
# interpreter); the files not named (each under 2 s) follow in file order.
LONG_FIRST = ("test_gemma_recipes.py", "test_keep.py", "test_export_gguf.py", "test_keep_paired.py",
              "test_multitask.py", "test_docs.py", "test_open_world.py", "test_resume_sharded.py",
              "test_paper_schedule.py", "test_export.py", "test_lean_pair.py", "test_merge_routed_keep.py",
              "test_engine.py", "test_run_floors.py", "test_fit.py", "test_resume.py", "test_gemma.py",
              "test_scale.py", "test_families.py", "test_kill.py", "test_recipes_eval.py", "test_merge.py",
              "test_layers.py", "test_merge_task_aware.py", "test_fisher.py", "test_keep_generative.py",
              "test_first_hour.py", "test_inputs_outputs_specials.py", "test_cli_config.py", "test_paper_recipe.py",
              "test_serve.py", "test_placement.py", "test_localizers.py", "test_cli_bad_inputs.py",
              "test_shared_store.py", "test_router.py", "test_metrics.py", "test_registries.py", "test_cli_json.py",
              "test_second_hour.py", "test_overhead.py", "test_graft_bad_inputs.py", "test_cli_help.py",
              "test_merge_causal_routed.py", "test_finetune.py", "test_memory_plan.py", "test_cli.py",
              "test_routed_threads.py", "test_localizers_extra.py", "test_io_bad_inputs.py", "test_workbench.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise unchanged
    slow_ok = os.environ.get("SKILLGRAFT_SLOW") == "1"
    for item in items:
        if "slow" in item.keywords and not slow_ok:
            item.add_marker(pytest.mark.skip(reason="slow real-model run; set SKILLGRAFT_SLOW=1"))
        if "real" in item.keywords and not SHARED_DATA.is_dir():
            item.add_marker(pytest.mark.skip(reason=f"needs {SHARED_DATA}"))


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, every test module) lives for the whole session: frozen out of
    the cyclic collector, the gc.collect() a workbench runs after releasing a model scans only what tests made."""
    gc.freeze()


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
def rendered_figures(request, monkeypatch):
    """A test marked `figures` renders its figures (the suite's default writes placeholders); `figures(NAME, …)`:
    only the files whose names match those patterns (the others are placeholders)."""
    marker = request.node.get_closest_marker("figures")
    if marker:
        monkeypatch.setenv("SKILLGRAFT_FIGURES", "png:" + ",".join(marker.args) if marker.args else "png")


@pytest.fixture(autouse=True)
def isolated_store(tmp_path_factory, monkeypatch):
    """Each test's own store of finished stages (``$SKILLGRAFT_CACHE``), empty at its start and never ./runs/cache:
    what a test costs does not depend on which tests ran before it in the same worker. What several tests read (the
    tiny models, the toy data, a fine-tuned run of a module) are fixtures, read-only inputs."""
    root = tmp_path_factory.mktemp("store")
    monkeypatch.setenv("SKILLGRAFT_CACHE", str(root))
    return root


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)`` once per test run, not once per pytest-xdist worker: the first worker to ask builds the
    folder under a file lock, in the temporary root the workers share; the others wait for it and read it. For the
    session fixtures' read-only inputs (deterministic builds: the same files whichever worker makes them)."""
    from filelock import FileLock  # noqa: PLC0415

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed in another worker
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def clean_python(request, tmp_path_factory):
    """An interpreter that never imported skillgraft, forking a child per program (tests/clean.py): what a fresh
    ``python -c`` would do, without paying torch's and transformers' imports per test. Forked before collection
    (pytest_collection); where that could not be (no os.fork), each program runs in a fresh interpreter."""
    from clean import CleanPython  # noqa: PLC0415

    clean = getattr(request.config, "_clean_python", None) or CleanPython()
    clean.folder = tmp_path_factory.mktemp("clean-python")
    yield clean
    clean.close()


TINY_KINDS = ("bert", "roberta", "gpt2", "llama", "llama3", "qwen3", "gemma3")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    from tiny import build_tiny  # noqa: PLC0415

    root = built_once(tmp_path_factory, "tiny-models",
                      lambda root: [build_tiny(kind, root / kind) for kind in TINY_KINDS])
    return {kind: root / kind for kind in TINY_KINDS}


@pytest.fixture(scope="session")
def moved_llama(tiny_models, tmp_path_factory) -> tuple[Path, Path]:
    """(A, B): the tiny Llama and a copy whose body moved (seeded noise on every layer tensor), both saved by plain
    transformers: a checkpoint pair as a user brings one."""
    import torch  # noqa: PLC0415
    import transformers as tf

    a = tiny_models["llama"]
    b = tmp_path_factory.mktemp("moved-llama") / "ft"
    model = tf.AutoModelForCausalLM.from_pretrained(a)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(b)
    tf.AutoTokenizer.from_pretrained(a).save_pretrained(b)
    return a, b


@pytest.fixture(scope="session")
def tiny_bert(tiny_models) -> Path:
    return tiny_models["bert"]


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """A data root holding a learnable toy 'SST-2' (JSONL layout)."""
    from tiny import write_sentiment_data  # noqa: PLC0415

    return built_once(tmp_path_factory, "toy-data", write_sentiment_data)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return SHARED_DATA


@pytest.fixture(scope="module")
def pair(tiny_bert, toy_data, tmp_path_factory):
    """(pre, ft, data): the tiny BERT and its plain-AdamW copy (localizing.adamw_pair); one per module, since a
    test that breaks its promise to give ``pre`` back intact must not spoil another module's. The training runs once
    per test run (built_once); each module builds its own two scorers and reads back ft's trained state, the
    gradients it was left holding and the global RNG state the training left: the same pair, bit for bit."""
    import torch  # noqa: PLC0415
    from localizing import adamw_pair, load_pair  # noqa: PLC0415

    def build(folder):
        folder.mkdir()
        _, ft, _ = adamw_pair(tiny_bert, toy_data)
        grads = {n: p.grad for n, p in ft.named_parameters() if p.grad is not None}  # the embeddings' (no optimizer)
        torch.save({"state": ft.state_dict(), "grads": grads, "rng": torch.get_rng_state()}, folder / "ft.pt")

    return load_pair(tiny_bert, toy_data, built_once(tmp_path_factory, "adamw-pair", build) / "ft.pt")


@pytest.fixture(scope="session")
def trained_run(tiny_bert, toy_data, tmp_path_factory):
    """A `skillgraft finetune` run of the tiny BERT that has learned the toy task (40 AdamW steps; the CLI and keep
    tests graft from it, read-only: every reader writes to its own --out)."""
    def build(folder):
        r = _invoke("finetune", "--task", "SST-2", "--k", 16, "--seed", 13, "--model", tiny_bert, "--optimizer",
                    "adamw", "--lr", 1e-3, "--steps", 40, "--eval-every", 20, "--data-dir", toy_data, "--out",
                    folder / "ft")
        assert r.exit_code == 0, r.output
        assert "test acc" in r.output

    return built_once(tmp_path_factory, "trained-run", build) / "ft"


# ---------------------------------------------------------------------------------------------- bad-input inputs
# Read-only inputs of the bad-input tests (tests/test_*_bad_inputs.py), made once per session: a graft, a
# fine-tuning run, a plain classifier and a PEFT adapter of the tiny BERT. Every case checks they are untouched.
@pytest.fixture(scope="session")
def tiny_graft(tiny_bert, tmp_path_factory):
    """A small graft on the tiny BERT (task SST-2, head mode), saved to a folder."""
    import torch  # noqa: PLC0415

    from skillgraft.graft import Graft, Region, graftable_names  # noqa: PLC0415
    from skillgraft.models import build_scorer  # noqa: PLC0415

    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=1)
    with torch.no_grad():
        for p in ft.model.parameters():
            p.add_(0.01)
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    region = Region(shapes, {names[0]: [0, 3, 5, 17], names[2]: [1, 2]})
    graft = Graft.from_models(pre, ft, region, {"task": "SST-2", "mode": "head"})
    return built_once(tmp_path_factory, "graft", lambda root: graft.save_pretrained(root / "g")) / "g"


@pytest.fixture(scope="session")
def ft_run(tiny_bert, toy_data, tmp_path_factory):
    """A fine-tuning run directory of the tiny BERT (a few steps; enough to graft from)."""
    def build(folder):
        r = _invoke("finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", tiny_bert, "--optimizer",
                    "adamw", "--lr", 1e-3, "--steps", 6, "--eval-every", 3, "--data-dir", toy_data, "--test-limit", 8,
                    "--out", folder / "run")
        assert r.exit_code == 0, r.output

    return built_once(tmp_path_factory, "ft-run", build) / "run"


@pytest.fixture(scope="session")
def classifiers(tiny_models, tmp_path_factory) -> dict:
    """Two tiny BERT classifiers of one base: sentiment (2 labels) and topic (3 labels), with their data (the merge
    tests' inputs, read-only; made once per run: built_once)."""
    from userland import sentiment_rows, topic_rows, train_classifier, write_rows  # noqa: PLC0415

    base = tiny_models["bert"]
    makers = (("sentiment", sentiment_rows), ("topic", topic_rows))

    def build(root):
        root.mkdir()
        for name, make in makers:
            write_rows(root / f"{name}.jsonl", make(120, 0))
            write_rows(root / f"{name}-test.jsonl", make(48, 1))
            train_classifier(base, root / name, make(120, 0), steps=30)

    root = built_once(tmp_path_factory, "merge", build)
    return {"base": base, **{name: (root / name, root / f"{name}.jsonl", root / f"{name}-test.jsonl")
                             for name, _ in makers}}


@pytest.fixture(scope="session")
def tiny_classifier(tiny_bert, tmp_path_factory):
    """A plain Hugging Face sequence classifier (the tiny BERT with a fresh 2-label head)."""
    import torch  # noqa: PLC0415
    import transformers as tf

    def build(folder):
        out = folder / "clf"
        torch.manual_seed(0)
        model = tf.AutoModelForSequenceClassification.from_pretrained(
            tiny_bert, num_labels=2, id2label={0: "bad", 1: "good"}, label2id={"bad": 0, "good": 1})
        model.save_pretrained(out)
        tf.AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(out)

    return built_once(tmp_path_factory, "clf", build) / "clf"


@pytest.fixture(scope="session")
def tiny_adapter(tiny_graft, tiny_bert, tmp_path_factory):
    def build(folder):
        assert _invoke("export", tiny_graft, "--model", tiny_bert, "--to", "peft", "--out", folder / "a").exit_code == 0

    return built_once(tmp_path_factory, "adapter", build) / "a"


@pytest.fixture(scope="session")
def tiny_gemma(tmp_path_factory) -> Path:
    """A tiny random Gemma 3 written as an unquantized GGUF file (the path `gemma-3-270m` takes)."""
    from tiny import write_tiny_gguf  # noqa: PLC0415

    path, _ = write_tiny_gguf(tmp_path_factory.mktemp("gemma-gguf") / "tiny-gemma.gguf", quantize=None, layers=4)
    return path
