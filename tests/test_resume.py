"""skillgraft.resume: a stage stopped midway resumes from its saved state on the same command, to the same
result as an uninterrupted run, bit for bit (issue 36: a localization stopped at step 28 of 30 wrote nothing)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from badinputs import graft_args, invoke

import skillgraft.graft.localizers.machinery.engine as engine
from skillgraft.errors import SkillgraftError


def _files(out):
    """Every graft's bytes and the localization's history without its timings."""
    grafts = {p.name: (p / "graft.safetensors").read_bytes() for p in sorted((out / "grafts").iterdir())}
    loc = json.loads((out / "metrics.json").read_text())["localization"]
    return grafts, loc.get("history"), loc.get("best_step")


def _counting(monkeypatch, stop_at: int | None = None) -> list[int]:
    """Count the localization's steps; with ``stop_at`` the run stops before that step moves."""
    calls: list[int] = []
    real = engine._step

    def step(*args):
        calls.append(args[-1])
        if stop_at is not None and len(calls) == stop_at:
            raise SkillgraftError("stopped from the test")
        return real(*args)

    monkeypatch.setattr(engine, "_step", step)
    return calls


@pytest.mark.parametrize("localizer, extra", [
    ("learned", ["--budgets", "0.05,0.1", "--schedule", "fixed"]),  # a tiny pair's start already fits
    ("hard-concrete", ["--budgets", "0.05,0.1"]),  # one trajectory per budget, Adam, stochastic gates
    ("learned", ["--budgets", "0.05,0.1", "--per-size", "--schedule", "fixed"]),  # the paper's protocol: a trajectory per budget
])
def test_localization_resumes_to_the_same_result(localizer, extra, ft_run, toy_data, tmp_path, monkeypatch):  # noqa: F811
    steps = 6
    args = lambda out, store: [*graft_args(ft_run, toy_data, out, store, "--localizer", localizer, "--steps", steps,  # noqa: E731
                                           "--eval-every", 2, "--deterministic"), *extra]  # bit for bit on a GPU too
    args_ref = args(tmp_path / "ref", tmp_path / "store-ref")
    args_ref[args_ref.index("--budgets") + 1] = extra[1]
    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "0")  # save after every step
    r = invoke(*args_ref)
    assert r.exit_code == 0, r.output
    reference = _files(tmp_path / "ref")
    if "--per-size" in extra:  # no shared γ_base to report: each budget started from its own
        assert "base patch of each budget's own size (per_size)" in (tmp_path / "ref" / "report.md").read_text()
    per_budget = localizer == "hard-concrete" or "--per-size" in extra
    total = 2 * steps if per_budget else steps

    stop = total - 2 if per_budget else 4  # a trajectory per budget: inside the second
    calls = _counting(monkeypatch, stop_at=stop)
    store = tmp_path / "store"
    r = invoke(*args(tmp_path / "g", store))
    assert r.exit_code == 2 and "stopped from the test" in r.output, r.output
    assert not (tmp_path / "g").exists()
    saved = [p for p in store.iterdir() if p.name.endswith(".resume")]
    assert len(saved) == 1 and list(saved[0].iterdir()), list(store.iterdir())
    # the stage's time counts the stopped run's (kept in its state; a resumed localization's time was that of its
    # last process alone: issue 46's 2.4 h localization read 3,560 s): say it had spent 1e6 s
    state_file = saved[0] / "localize-0.pt"
    state = torch.load(state_file, weights_only=True)
    assert 0 < state["seconds"] < 1e5
    torch.save({**state, "seconds": 1e6}, state_file)

    calls = _counting(monkeypatch)  # the same command again: it goes on from the last saved step
    r = invoke(*args(tmp_path / "g", store))
    assert r.exit_code == 0, r.output
    assert len(calls) == total - (stop - 1), calls  # only the steps not done before the stop
    assert _files(tmp_path / "g") == reference
    assert not [p for p in store.iterdir() if p.name.startswith(".")]  # the saved state is gone with the entry
    (summary,) = store.glob("regions-*/summary.json")
    assert 1e6 < json.loads(summary.read_text())["seconds"] < 1e6 + 1e5


def test_a_state_saved_by_other_settings_is_not_used(ft_run, toy_data, tmp_path, monkeypatch):  # noqa: F811
    from skillgraft.resume import Checkpoint, checkpoint, resume_point

    with resume_point(tmp_path / "r"):
        a = checkpoint("localize", {"steps": 6})
        a.save({"step": 3})
        assert checkpoint("localize", {"steps": 6}).load() is None  # the second loop of the stage: its own file
    with resume_point(tmp_path / "r"):
        assert checkpoint("localize", {"steps": 6}).load()["step"] == 3
    with resume_point(tmp_path / "r"):
        assert checkpoint("localize", {"steps": 7}).load() is None
    (tmp_path / "r" / "localize-0.pt").write_bytes(b"damaged")
    assert Checkpoint(tmp_path / "r" / "localize-0.pt", "x").load() is None
    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "soon")
    with resume_point(tmp_path / "r"), pytest.raises(SkillgraftError, match="SKILLGRAFT_CHECKPOINT_SECONDS"):
        checkpoint("localize", {})


def _finetune_args(tiny_bert, toy_data, out, *extra):
    return ("finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", tiny_bert, "--optimizer", "adamw",
            "--lr", 1e-3, "--steps", 8, "--eval-every", 2, "--data-dir", toy_data, "--test-limit", 8, "--out", out,
            "--deterministic", *extra)  # bit for bit on a GPU too (docs/gpu.md)


def _run_files(run):
    """The run's weights and its metrics without timings."""
    metrics = json.loads((run / "metrics.json").read_text())
    for k in ("train_seconds", "train_examples_per_second", "eval_examples_per_second"):
        metrics.pop(k, None)
    weights = {p.name: p.read_bytes() for p in sorted((run / "model").iterdir()) if p.suffix == ".safetensors"}
    return weights, metrics


def test_finetuning_resumes_to_the_same_run(tiny_bert, toy_data, tmp_path, monkeypatch):
    """Stopped at step 5 of 8 (dropout on: the random generators are part of the state), then the same command."""
    import skillgraft.train.core as core

    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "0")
    r = invoke(*_finetune_args(tiny_bert, toy_data, tmp_path / "ref"))
    assert r.exit_code == 0, r.output
    reference = _run_files(tmp_path / "ref")

    calls: list[int] = []
    real = core._step

    def check(*args):  # each step run (its number is the last argument)
        calls.append(args[-1])
        if len(calls) == 5 and stop:
            raise SkillgraftError("stopped from the test")
        return real(*args)

    monkeypatch.setattr(core, "_step", check)
    stop = True
    r = invoke(*_finetune_args(tiny_bert, toy_data, tmp_path / "run"))
    assert r.exit_code == 2 and "stopped from the test" in r.output, r.output
    assert not (tmp_path / "run").exists() and (tmp_path / ".run.resume" / "finetune-0.pt").is_file()
    stop, calls[:] = False, []
    r = invoke(*_finetune_args(tiny_bert, toy_data, tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert calls == [5, 6, 7, 8]  # steps 1–4 were saved: only the rest ran
    assert _run_files(tmp_path / "run") == reference
    assert not (tmp_path / ".run.resume").exists()
    # other settings on the same --out never take that state: a stopped run with --lr 2e-3 starts over
    stop, calls[:] = True, []
    assert invoke(*_finetune_args(tiny_bert, toy_data, tmp_path / "other")).exit_code == 2
    stop, calls[:] = False, []
    args = list(_finetune_args(tiny_bert, toy_data, tmp_path / "other"))
    args[args.index("--lr") + 1] = 2e-3
    assert invoke(*args).exit_code == 0 and calls[0] == 1


def test_a_store_finetuning_resumes_in_another_process(tiny_bert, toy_data, tmp_path, monkeypatch):
    """A fine-tuning run as a store stage (recipes, the dev grid) saves its state beside the entry, not inside the
    stage's temporary folder (which the next process never sees): stopped at step 5 of 8, the same call goes on."""
    import skillgraft.train.core as core
    from skillgraft.data.spec import DataSpec
    from skillgraft.models.spec import ModelSpec
    from skillgraft.pipeline.opening import finetuned_run
    from skillgraft.pipeline.store import Store
    from skillgraft.train.config import FinetuneConfig

    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "0")
    model = ModelSpec(model=str(tiny_bert), mode="prompt")
    data = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, test_limit=8)
    config = FinetuneConfig(optimizer="adamw", lr=1e-3, steps=8, eval_every=3, freeze_embeddings=False)
    ref, _ = finetuned_run(Store(tmp_path / "ref"), model, data, config, progress=False)
    calls: list[int] = []
    real = core._step

    def check(*args):  # each step run (its number is the last argument)
        calls.append(args[-1])
        if len(calls) == 5 and stop:
            raise KeyboardInterrupt  # the process ends here
        return real(*args)

    monkeypatch.setattr(core, "_step", check)
    stop, store = True, Store(tmp_path / "store")
    with pytest.raises(KeyboardInterrupt):
        finetuned_run(store, model, data, config, progress=False)
    saved = list((tmp_path / "store").glob(".ft-*.resume/run/finetune-0.pt"))
    assert len(saved) == 1
    for tmp in (tmp_path / "store").glob(".ft-*.tmp"):  # a later process never sees this one's temporary folder
        shutil.rmtree(tmp)
    stop, calls[:] = False, []
    run, _ = finetuned_run(store, model, data, config, progress=False)
    assert calls == [5, 6, 7, 8]  # steps 1–4 came from the saved state
    assert _run_files(run) == _run_files(ref)
    assert not list((tmp_path / "store").glob(".ft-*.resume"))


def test_a_stopped_comparison_scores_only_the_variants_it_had_not(ft_run, toy_data, tmp_path, monkeypatch):
    """The rows of a store stage (e.g. the paper recipe's 14 Gemma models on 872 test rows, an hour on a CPU): stopped
    after two variants, the same stage scores only the rest, and its rows and probabilities are the uninterrupted
    run's, bit for bit (FT's restored record is the agreement reference of the rest)."""
    import numpy as np

    import skillgraft.pipeline.variants as variants
    from skillgraft.graft import get_localizer
    from skillgraft.pipeline.opening import from_run
    from skillgraft.resume import resume_point

    member = from_run(ft_run, data_dir=toy_data)
    movement = get_localizer("movement")
    grafts = [variants.graft_variant(member, movement.region(member.pre, member.ft, member.data, d), d)
              for d in (0.01, 0.05)]
    models = variants.base_variants(member) + grafts
    rows_ref, probs_ref = variants.compare(member, models)

    monkeypatch.setenv("SKILLGRAFT_CHECKPOINT_SECONDS", "0")
    scored: list[str] = []
    real = variants.evaluate_variant

    def counting(m, v, *args, **kw):
        if stop and len(scored) == 2:
            raise SkillgraftError("stopped from the test")
        scored.append(v.name)
        return real(m, v, *args, **kw)

    monkeypatch.setattr(variants, "evaluate_variant", counting)
    fresh = from_run(ft_run, data_dir=toy_data)  # a new process's member: FT's record empty
    stop = True
    with resume_point(tmp_path / "r"), pytest.raises(SkillgraftError, match="stopped"):
        variants.compare(fresh, models)
    first = list(scored)
    assert first[0] == "fine-tuned" and len(first) == 2
    fresh = from_run(ft_run, data_dir=toy_data)
    stop, scored[:] = False, []
    with resume_point(tmp_path / "r"):
        rows, probs = variants.compare(fresh, models)
    assert scored == [v.name for v in models if v.name not in first]  # only the rest
    assert [r.columns() for r in rows] == [r.columns() for r in rows_ref]
    assert probs.keys() == probs_ref.keys() and all(np.array_equal(probs[k], probs_ref[k]) for k in probs)


def test_a_state_holds_graft_types_through_their_registered_codecs(tmp_path):
    """resume.py imports no layer: graft registers Budget's and Region's codecs into it (issue 79), and a state
    holding them (a dict keyed by budgets, a region, a NumPy array) is written as the same tagged plain values and
    read back equal."""
    import numpy as np

    from skillgraft import resume
    from skillgraft.graft.region import Region
    from skillgraft.graft.selection import Budget

    region = Region({"w": (2, 3)}, {"w": torch.tensor([1, 4])})
    state = {"best": {Budget.parse("0.01"): 3, Budget.parse("round"): 1}, "region": region,
             "rng": np.arange(3, dtype=np.int64), "plain": {"__budget__": 1}}
    plain = resume._plain(state)
    assert plain["best"]["__items__"][0][0] == {"__budget__": Budget.parse("0.01").model_dump()}
    assert plain["region"] == {"__region__": {"shapes": {"w": [2, 3]}, "indices": {"w": region.indices["w"]}}}
    assert "__items__" in plain["plain"]  # a key spelt like a registered tag is not read back as that type
    resume._write(tmp_path / "s.pt", state)
    back = resume._restored(torch.load(tmp_path / "s.pt", weights_only=True))
    assert back["best"] == state["best"] and back["plain"] == {"__budget__": 1}
    assert back["region"].shapes == region.shapes and torch.equal(back["region"].indices["w"], region.indices["w"])
    assert back["rng"].tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="cannot hold a object"):
        resume._plain(object())
