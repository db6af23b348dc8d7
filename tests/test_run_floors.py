"""One graft run walks down the floors (issue 79): each model resolved into its reference once, when the run opens,
and passed down."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from skillgraft.data.spec import DataSpec
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.verbs.graft import GraftInputs, ReportSpec, graft

OPTIONS = {"budgets": ["0.01"], "steps": 2, "eval_every": 1}


@pytest.fixture
def resolutions(monkeypatch) -> Counter:
    """Counts how often each model name is resolved into a reference (``models.loading.model_reference`` called with a
    name, not with a reference passed down), wherever the resolver was imported."""
    import skillgraft.models.loading as loading

    original, seen = loading.model_reference, Counter()

    def counting(name):
        if not isinstance(name, loading.ModelRef):
            seen[str(name)] += 1
        return original(name)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("skillgraft") and \
                getattr(module, "model_reference", None) is original:
            monkeypatch.setattr(module, "model_reference", counting)
    return seen


@pytest.fixture
def loading_entries() -> Counter:
    """Each entry into ``models/loading.py``: a call of a function of that file (a method of an opened model too)
    from a frame outside it (traced, so an import under any name counts), by the function entered. This file's spies
    (``resolutions``) are transparent. ``.weights``: how often each model's weights are read from its files (a call
    of ``_load_weights``, however reached, that is not given the tensors in memory), by its reference's name;
    ``.tokenizers``: how often each model's tokenizer is parsed from its files (``load_tokenizer``), by its path."""
    import skillgraft.models.loading as loading

    path, seen = loading.__file__, Counter()
    seen.weights, seen.tokenizers = Counter(), Counter()

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or code.co_filename != path:
            return
        if code.co_name == "_load_weights" and frame.f_locals["want"].tensors is None:  # not built on tensors in memory
            seen.weights[frame.f_locals["ref"].name] += 1
        if code.co_name == "load_tokenizer":
            seen.tokenizers[str(frame.f_locals["path"])] += 1
        back = frame.f_back
        while back is not None and back.f_code.co_filename == __file__:
            back = back.f_back
        if back is None or back.f_code.co_filename != path:
            seen[code.co_name] += 1

    sys.setprofile(profile)
    yield seen
    sys.setprofile(None)


@pytest.fixture(scope="module")
def llama_pair(moved_llama) -> tuple[Path, Path]:
    """(A, B): the tiny Llama and a copy whose body moved (conftest's ``moved_llama``)."""
    return moved_llama


def test_a_graft_run_resolves_its_base_model_once(ft_run, tiny_bert, toy_data, tmp_path, resolutions,
                                                  loading_entries):
    """The base is resolved once; θ_ft (the run's saved model) and θ_pre (its base) each load through one entry into
    models/loading.py, ``load`` (reference, tokenizer, weights); the report's base note reads the reference handed
    down."""
    graft(GraftInputs(str(ft_run), data=DataSpec(data_dir=str(toy_data))),
          report=ReportSpec(baselines=["movement"], lottery_zero=False), localize=LocalizeConfig(**OPTIONS),
          out=tmp_path / "g", cache=tmp_path / "store")
    assert dict(resolutions) == {str(tiny_bert): 1}
    assert dict(loading_entries) == {"load": 2}
    assert dict(loading_entries.weights) == {str(ft_run / "model"): 1, str(tiny_bert): 1}


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "both-loaded"])
def test_a_graft_run_on_a_pair_resolves_each_model_once(llama_pair, toy_data, tmp_path, resolutions, lean,
                                                        loading_entries):
    """Each model of a pair is opened once (``open_model``: resolved), then asked through the opened model for its
    tokenizer, parsed once (compared with the other's before any weights load), and for its weights, read once (a
    lean pair's θ_pre after θ_ft's release): three steps of one model, none repeated."""
    a, b = llama_pair
    report = ReportSpec(baselines=[] if lean else ["movement"], lottery_zero=not lean)
    graft(GraftInputs(str(b), pretrained=str(a), task="SST-2", data=DataSpec(data_dir=str(toy_data))),
          report=report, localize=LocalizeConfig(**OPTIONS), keep=None, out=tmp_path / "g", cache=tmp_path / "store")
    assert dict(resolutions) == {str(a): 1, str(b): 1}
    assert dict(loading_entries) == {"open_model": 2, "tokenizer": 2, "weights": 2}
    assert dict(loading_entries.tokenizers) == {str(a): 1, str(b): 1}
    assert dict(loading_entries.weights) == {str(a): 1, str(b): 1}


def test_a_merge_resolves_each_model_once(classifiers, tmp_path, resolutions, monkeypatch, loading_entries):
    """Each model's reference and the localizer's options are resolved once (the options by the command line,
    whose errors name the flags; the verb takes them as resolved). Each model is opened once (``open_model``, in
    ``check_inputs``); the base's tokenizer (parsed once, asked for twice) is compared with each fine-tuned model's;
    then each model's weights are read from its files once (four weights requests, three reads) — the second member's θ_pre classifier is built on the bench's
    θ_pre tensors, and the merged classifiers are written from θ_pre's scorer with each θ_ft's head, config and
    tokenizer kept at its release (no θ_ft read back)."""
    from userland import cli

    import skillgraft.pipeline.regions as regions

    real, calls = regions.localizer_options, []
    monkeypatch.setattr(regions, "localizer_options", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    c = classifiers
    cli("merge", "--pretrained", c["base"], "--finetuned", c["sentiment"][0], "--data", c["sentiment"][1],
        "--finetuned", c["topic"][0], "--data", c["topic"][1], "--localizer", "movement", "--budget", "0.05",
        "--mergekit", "", "--out", tmp_path / "m")
    assert dict(resolutions) == {str(c["base"]): 1, str(c["sentiment"][0]): 1, str(c["topic"][0]): 1}
    assert calls == ["movement"]
    assert dict(loading_entries) == {"open_model": 3, "tokenizer": 4, "weights": 4}
    assert dict(loading_entries.tokenizers) == {str(c["base"]): 1, str(c["sentiment"][0]): 1, str(c["topic"][0]): 1}
    assert dict(loading_entries.weights) == {str(c["base"]): 1, str(c["sentiment"][0]): 1, str(c["topic"][0]): 1}


def test_an_opened_model_holds_no_weights_it_loaded(llama_pair):
    """An opened model (``open_model``, which a merge keeps for its whole run) holds its reference and tokenizer, not
    the weights it loaded: released by the run, they are freed (a merge once held every θ_ft this way: 4.7× one
    model's weights at N = 2, bench/merge_memory.py). A second load gets a copy of the tokenizer the first got."""
    import gc
    import weakref

    from skillgraft.models.loading import Weights, open_model

    a, _ = llama_pair
    opened = open_model(str(a))
    compared = opened.tokenizer()
    loaded = opened.weights(Weights("causal", role="pre-trained"))
    assert loaded.tokenizer is compared
    gone = weakref.ref(loaded.model)
    del loaded
    gc.collect()
    assert gone() is None
    again = opened.weights(Weights("causal", role="pre-trained"))
    assert again.tokenizer is not compared and again.tokenizer.get_vocab() == compared.get_vocab()


# the fields of a Member that say where its models are and what was recorded of them (pipeline/member.py)
MEMBER_STATE = {"state", "pre_state", "probs", "ft_metrics", "inputs", "graft", "head", "load_pre", "ft", "pre"}


def test_the_workbench_is_the_only_writer_of_member_state():
    """No module but pipeline/workbench.py assigns a member's state or what goes with it (a member made anew with
    ``dataclasses.replace`` is no write); read from the source, so a new writer elsewhere fails here."""
    import ast

    import skillgraft

    writers = []
    for path in sorted(Path(skillgraft.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    t = t.value if isinstance(t, ast.Subscript) else t  # member.probs[set] = …
                    if isinstance(t, ast.Attribute) and t.attr in MEMBER_STATE and "member" in ast.unparse(t.value):
                        writers.append(f"{path.name}:{node.lineno} {ast.unparse(t)}")
    assert writers and all(w.startswith("workbench.py:") for w in writers), writers


def test_a_members_states_are_one_enum_each(llama_pair, toy_data):
    """θ_pre deferred or loaded is ``pre_state``, FT scored is ``state`` (set by the bench's ``record``, kept by
    ``add``), released is read from ``state``."""
    from skillgraft.pipeline.member import MemberState, PreState
    from skillgraft.pipeline.opening import from_pair
    from skillgraft.pipeline.variants import score_ft_first
    from skillgraft.pipeline.workbench import Workbench

    a, b = llama_pair
    spec = DataSpec.build({"task": "SST-2", "k": 4, "seed": 42, "data_dir": str(toy_data), "test_limit": 4},
                          where="test")
    member = from_pair(str(a), str(b), spec, data_dir=toy_data, lean=True)
    assert (member.state, member.pre_state) == (MemberState.LOADED, PreState.DEFERRED) and member.pre is None
    bench = Workbench.of(member)
    score_ft_first(bench, member.name, release=True)
    assert (member.state, member.pre_state) == (MemberState.LAZY, PreState.LOADED) and member.released
    assert set(member.probs) == set(member.ft_metrics) == {"test"}
    again = from_pair(str(a), str(b), spec, data_dir=toy_data)
    Workbench.record(again, "test", member.ft_metrics["test"], member.probs["test"])
    assert Workbench.of(again).states[again.name] is MemberState.SCORED and not again.released


@pytest.fixture
def ambient_reads(monkeypatch) -> list[str]:
    """Where the active placement (``placement.active``, the context variable the command line sets) is read: the
    file of each reader (through ``placement.boundary``, the verb's one read: the verb's file)."""
    import skillgraft.models.placement as placement

    original, readers = placement.active, []

    def spying():
        frame = sys._getframe(1)
        if frame.f_code.co_name == "boundary":
            frame = frame.f_back
        readers.append(Path(frame.f_code.co_filename).name)
        return original()

    monkeypatch.setattr(placement, "active", spying)
    return readers


@pytest.mark.parametrize("pair", [False, True], ids=["run", "lean-pair"])
def test_a_graft_run_reads_its_placement_once_and_passes_it_down(ft_run, llama_pair, toy_data, tmp_path,
                                                                 ambient_reads, pair):
    """The command line activates the placement; the verb reads it once, where it starts, and everything below
    it (loaders, the Workbench, the report, the memory plan) is given it: the models load in bf16, the report
    says so, and nothing below the verb reads the ambient placement."""
    import json

    from skillgraft.models.placement import Placement, using

    a, b = llama_pair
    inputs = (GraftInputs(str(b), pretrained=str(a), task="SST-2", data=DataSpec(data_dir=str(toy_data))) if pair
              else GraftInputs(str(ft_run), data=DataSpec(data_dir=str(toy_data))))
    with using(Placement(device="cpu", precision="bf16")):
        result = graft(inputs, report=ReportSpec(baselines=[], lottery_zero=False), localize=LocalizeConfig(**OPTIONS),
                       out=tmp_path / "g", cache=tmp_path / "store")
    assert ambient_reads == ["graft.py"]  # verbs/graft.py, once
    assert json.loads((result.out / "metrics.json").read_text())["placement"]["precision"] == "bf16"
    assert "Ran on cpu, bf16." in (result.out / "report.md").read_text()


@pytest.fixture
def loads(monkeypatch) -> list:
    """The runtime each model load was given (``load_hf_model``, ``load_classifier``, ``complete_model``), wherever
    the loader was imported."""
    import skillgraft.models.loading as loading

    seen = []
    for module, name in ((loading, "load_hf_model"), (loading, "load_classifier"), (loading, "complete_model")):
        original = getattr(module, name)

        def spy(*args, _original=original, **kwargs):
            seen.append(kwargs.get("runtime", args[2] if _original.__name__ == "complete_model" and len(args) > 2
                                   else None))
            return _original(*args, **kwargs)

        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("skillgraft") and getattr(mod, name, None) is original:
                monkeypatch.setattr(mod, name, spy)
    return seen


def test_a_verb_that_loads_a_model_is_placed(tiny_bert, toy_data, tmp_path, loads):
    """Every model ``skillgraft finetune``, ``graft``, ``evaluate`` and ``fim`` load is given the placement the
    command line activated (``--precision bf16``); the same verb called without one (no command line, no ``using``)
    is not placed: its loads get no runtime, which is what this test fails on for a command that forgets its
    placement."""
    from userland import cli

    run = tmp_path / "ft"
    cli("finetune", "--model", tiny_bert, "--task", "SST-2", "--k", 4, "--steps", 2, "--eval-every", 0,
        "--data-dir", toy_data, "--test-limit", 4, "--precision", "bf16", "--out", run)
    cli("graft", "--finetuned", run, "--budgets", "0.01", "--steps", 1, "--baselines", "", "--no-lottery-zero",
        "--data-dir", toy_data, "--test-limit", 4, "--precision", "bf16", "--out", tmp_path / "g")
    cli("evaluate", run, "--data-dir", toy_data, "--limit", 4, "--precision", "bf16")
    cli("evaluate", tiny_bert, "--task", "SST-2", "--mode", "prompt", "--data-dir", toy_data, "--limit", 4,
        "--precision", "bf16")
    cli("fim", "--task", "SST-2", "--model", tiny_bert, "--k", 4, "--data-dir", toy_data, "--precision", "bf16",
        "--out", tmp_path / "fim")
    assert len(loads) >= 6 and all(r is not None and r.precision == "bf16" for r in loads), loads
    loads.clear()
    graft(GraftInputs(str(run), data=DataSpec(data_dir=str(toy_data))),
          report=ReportSpec(baselines=[], lottery_zero=False), localize=LocalizeConfig(**OPTIONS), out=tmp_path / "u")
    assert loads and all(r is None for r in loads)  # not placed: as transformers loads them


def test_the_verbs_that_use_a_graft_are_placed(tiny_graft, toy_data, tmp_path, loads, ambient_reads):
    """``skillgraft apply`` (evaluated, and with ``--export``), ``export`` and ``inspect`` of a PEFT adapter read the
    placement once, where the verb starts, and give it to every model they load (the base of the graft, the
    adapter's base): each load gets the runtime; nothing below the verb reads the ambient placement."""
    from userland import cli

    from skillgraft.models.placement import Placement, using
    from skillgraft.verbs.inspect import inspect

    cli("apply", tiny_graft, "--data-dir", toy_data, "--limit", 4, "--precision", "bf16")
    cli("apply", tiny_graft, "--export", tmp_path / "hf", "--evaluate-on", "", "--precision", "bf16")
    cli("export", tiny_graft, "--to", "peft", "--out", tmp_path / "peft", "--precision", "bf16")
    assert len(loads) == 3 and all(r is not None and r.precision == "bf16" for r in loads), loads
    assert ambient_reads == ["apply.py", "apply.py", "export.py"]  # verbs/apply.py, verbs/export.py: once each
    loads.clear()
    ambient_reads.clear()
    with using(Placement(device="cpu", precision="fp32")):  # fp32: the adapter's fingerprint is its base's in fp32
        result = inspect(tmp_path / "peft")  # a SHiRA adapter: read on its base model
    assert result.graft.size > 0
    assert len(loads) == 1 and loads[0] is not None and loads[0].precision == "fp32", loads
    assert ambient_reads == ["inspect.py"]


def test_routed_skills_load_on_the_runtime_they_are_given(tiny_bert, tmp_path):
    """``RoutedSkills.from_pretrained(folder, runtime=…)`` (what ``serve`` and ``merge --routed`` pass down) loads the
    base model there, with no placement active."""
    from routing import write_routed_folder

    from skillgraft.graft.routed import RoutedSkills
    from skillgraft.models.placement import Runtime

    folder = write_routed_folder(tiny_bert, tmp_path / "routed")
    skills = RoutedSkills.from_pretrained(folder, runtime=Runtime(torch.device("cpu"), "bf16"))
    assert {p.dtype for p in skills.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in RoutedSkills.from_pretrained(folder).model.parameters()} == {torch.float32}
