"""One engine for the paper's Eq. 3–4 (issue 22): every learned localizer is a relaxation × optimizer × layout over
:mod:`skillgraft.graft.localizers.machinery.engine`, and every registered localizer runs with candidates, sharded (FSDP) and
generative data, or refuses with one line naming itself and what it cannot do, before any work."""

import hashlib
import json
import random
import types

import pytest
import torch
from hostreads import HostReads, count_host_reads
from localizing import assert_intact, digest, snapshot

from skillgraft.data.loading import Example
from skillgraft.data.user import GenerativeTask
from skillgraft.errors import SkillgraftError
from skillgraft.graft import LOCALIZERS, get_localizer, graftable_names
from skillgraft.graft.localizers import Localization, LocalizeResult
from skillgraft.models import build_scorer

# Regions recorded on the pair of test_localizers with the code before the engine (git b9e4a3a: learned.py +
# candidates.py, and relaxed.py with its own candidates, loss, accuracy and result type): region digests, best
# steps and scores, and for the learned localizer the whole history's digest.
BEFORE = {
    "learned": ("learned", {"sparsity": 0.01, "steps": 4, "seed": 3, "budgets": [0.005, 0.02, "round"],
                            "eval_every": 2, "micro_batch": 8},
                {"0.005": "1711a4ed6369dfba", "0.02": "557ab92c17fccaf2", "round": "48e085de78d9b8a7"},
                {"0.005": 0, "0.02": 4, "round": 0}, {"0.005": 0.578125, "0.02": 0.625, "round": 0.578125},
                "a0c7fedcdac31635"),
    "learned-candidates-l1": ("learned", {"sparsity": 0.01, "steps": 4, "seed": 3, "budgets": [0.005, 0.02, "round"],
                                          "candidates": 0.2, "micro_batch": 8, "l1": 1e-3, "eval_every": 1},
                              {"0.005": "fa56c7d04dce2e1f", "0.02": "1d1459691261d731", "round": "48e085de78d9b8a7"},
                              {"0.005": 4, "0.02": 1, "round": 0},
                              {"0.005": 0.59375, "0.02": 0.609375, "round": 0.578125}, "fd53cbbeaef0aafe"),
    "learned-adam": ("learned-adam", {"steps": 4, "eval_every": 2, "micro_batch": 16, "budgets": [0.01, 30],
                                      "sparsity": 0.005},
                     {"0.01": "0339b48bf9cc63f5", "30": "680346ee128cd5b7"}, {"0.01": 0, "30": 0},
                     {"0.01": 0.53125, "30": 0.53125}, None),
    "learned-adam-moving": ("learned-adam", {"steps": 8, "eval_every": 4, "micro_batch": 16, "budgets": [0.01, 30],
                                             "sparsity": 0.02, "select_on": "last"},
                            {"0.01": "9962251bf1fe2b70", "30": "8121a7b96fc413c7"}, {"0.01": 8, "30": 8}, None, None),
    "learned-saliency-moving": ("learned-saliency", {"steps": 8, "eval_every": 4, "micro_batch": 16,
                                                     "budgets": [0.01, 30], "select_on": "last", "lr": 1e8,
                                                     "saliency": {"micro_batch": 16}},
                                {"0.01": "e9ff7a57f09c7e17", "30": "931fe71367acaa9f"}, {"0.01": 8, "30": 8}, None,
                                None),
    "straight-through-adam": ("straight-through", {"steps": 8, "eval_every": 2, "micro_batch": 16,
                                                   "budgets": [0.01, 30], "select_on": "last", "lr": 0.5},
                              {"0.01": "e869a4685c4b8d9f", "30": "13bd2a69d051093a"}, {"0.01": 8, "30": 8}, None, None),
    "straight-through-nsgd": ("straight-through", {"steps": 8, "eval_every": 4, "micro_batch": 16, "budgets": [30],
                                                   "optimizer": "nsgd", "select_on": "last", "lr": 2.0},
                              {"30": "90e7d975dd5b9254"}, {"30": 8}, None, None),
    "prune": ("prune", {"steps": 6, "anneal_steps": 3, "anneal_from": 0.5, "eval_every": 2, "micro_batch": 16,
                        "budgets": [30, 0.01], "select_on": "last"},
              {"30": "8c7f21fc974cc9f2", "0.01": "a6edb2202106f11e"}, {"30": 6, "0.01": 6}, None, None),
    "prune-on-dev": ("prune", {"steps": 5, "anneal_steps": 3, "anneal_from": 0.5, "eval_every": 2, "micro_batch": 16,
                               "budgets": [30, 0.01]},
                     {"30": "b916cc3327fda061", "0.01": "4c9be8d5e26f0108"}, {"30": 3, "0.01": 3},
                     {"30": 0.5625, "0.01": 0.625}, None),
    "hard-concrete": ("hard-concrete", {"steps": 4, "eval_every": 2, "micro_batch": 16, "budgets": [0.01, 30]},
                      {"0.01": "48e085de78d9b8a7", "30": "844efd492c99ebc6"}, {"0.01": 0, "30": 0},
                      {"0.01": 0.53125, "30": 0.53125}, None),
}


@pytest.mark.parametrize("case", list(BEFORE))
def test_the_engine_reproduces_the_previous_localizers(pair, case):
    pre, ft, data = pair
    name, options, regions, best_step, best_score, history = BEFORE[case]
    before = snapshot(pre)
    res = get_localizer(name).run(pre, ft, data, options)
    assert isinstance(res, Localization) and LocalizeResult is Localization  # one result type
    assert {b.key: digest(r) for b, r in res.regions.items()} == regions
    assert res.summary["best_step"] == best_step
    if best_score is not None:
        assert res.summary["best_score"] == best_score
    if history is not None:
        columns = [step.columns() for step in res.history]  # the typed log read as the JSON it writes
        fits = [(c.pop(k), c[k[:-len(":fit")] + ":acc"]) for c in columns for k in list(c) if k.endswith(":fit")]
        assert hashlib.sha256(json.dumps(columns, sort_keys=True).encode()).hexdigest()[:16] == history
        ft_score = res.reference["score"]  # each scored region's fit share is its score ÷ FT's on the same rows
        assert fits and all(fit == round(acc / ft_score, 6) for fit, acc in fits)
    assert_intact(pre, before)


def test_score_based_summaries_are_unchanged(pair):
    pre, ft, data = pair
    res = get_localizer("movement").run(pre, ft, data, {"budgets": [30]})
    assert isinstance(res, Localization) and set(res.summary) == {"budgets", "config", "score_seconds"}


# ---------------------------------------------------------------------------------------------- works or refuses
def fast(name: str, **more) -> dict:
    """Options that keep localizer ``name`` quick on the tiny models (only the fields it has)."""
    wanted = {"sparsity": 0.01, "steps": 2, "eval_every": 1, "micro_batch": 16, "fisher": {"n_examples": 8},
              "saliency": {"micro_batch": 16}, **({"anneal_steps": 1} if name == "prune" else {}), **more}
    return {k: v for k, v in wanted.items() if k in get_localizer(name).Options.model_fields}


SHARDED = {"learned", "learned-adam"}      # run sharded under FSDP2; every other one refuses
GENERATIVE_REFUSED = {"fish": "localizer 'fish' needs class labels.*generative",  # the Fisher of log p(y|x)
                      "bias": "has no bias parameters"}  # not the data: the tiny Llama has no biases


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
def test_candidates_work_or_are_refused_by_name(pair, name):
    pre, ft, data = pair
    loc = get_localizer(name)
    if "candidates" not in loc.Options.model_fields:
        with pytest.raises(SkillgraftError, match="candidates"):
            loc.options({"candidates": 0.3})
        return
    before = snapshot(pre)
    res = loc.run(pre, ft, data, {**fast(name), "candidates": 0.3, "budgets": [0.01, 20]})
    universe = sum(p.numel() for n, p in pre.named_parameters() if n in graftable_names(pre))
    assert 0 < res.candidate_size < universe and res.summary["candidate_size"] == res.candidate_size
    top_c = get_localizer("movement").region(pre, ft, None, res.candidate_size)
    for budget, region in res.regions.items():
        assert len(region) == budget.size(universe)
        if loc.options().to_dict().get("base", "movement") == "movement":
            assert len(region & top_c) == len(region)  # every region lies in C = the top-c |Δ|
    assert_intact(pre, before)


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
def test_sharded_runs_work_or_are_refused_before_any_work(pair, name, monkeypatch):
    """The decision is made from the options alone; under an FSDP launch a refusing localizer stops with one line
    naming itself before it touches the model. (Sharded runs themselves: test_scale's two-process test.)"""
    pre, ft, data = pair
    loc = get_localizer(name)
    opts = loc.options(fast(name, budgets=[30]))
    if name in SHARDED:
        loc.refuse(opts, sharded=True)
        return
    with pytest.raises(SkillgraftError, match=f"localizer '{name}'.*does not run sharded"):
        loc.refuse(opts, sharded=True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    before = snapshot(pre)
    with pytest.raises(SkillgraftError, match=f"localizer '{name}'.*does not run sharded"):
        loc.run(pre, ft, data, opts)
    assert_intact(pre, before)


@pytest.fixture(scope="module")
def generative(tiny_models):
    """(pre, ft, data): a tiny Llama as a prompt → completion scorer and a copy trained on the completions."""
    rng = random.Random(0)
    rows = [Example(f"review {i}: the {rng.choice(['film', 'movie'])} was", 0, [" bad", " good"][i % 2])
            for i in range(40)]
    task = GenerativeTask.make("g")
    pre = build_scorer(str(tiny_models["llama"]), task, "generative")
    ft = build_scorer(str(tiny_models["llama"]), task, "generative")
    torch.manual_seed(0)
    opt = torch.optim.AdamW([p for n, p in ft.named_parameters() if "embed" not in n], lr=3e-3)
    for step in range(15):
        ft.loss(ft.collate([rows[(step * 8 + i) % 32] for i in range(8)])).backward()
        opt.step()
        opt.zero_grad()
    return pre, ft.eval(), types.SimpleNamespace(train=rows[:32], dev=rows[32:])


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
def test_generative_data_works_or_is_refused_by_name(generative, name):
    pre, ft, data = generative
    loc = get_localizer(name)
    before = snapshot(pre)
    options = fast(name, budgets=[0.01, 20])
    if name in GENERATIVE_REFUSED:
        with pytest.raises(SkillgraftError, match=GENERATIVE_REFUSED[name]):
            loc.run(pre, ft, data, options)
    else:
        res = loc.run(pre, ft, data, options)
        for budget, region in res.regions.items():
            assert len(region) == budget.size(region.universe_size)
        for row in res.history:  # scored by completion-token accuracy
            assert all(0 <= v <= 1 for k, v in row.items() if k.endswith(":acc"))
    assert_intact(pre, before)


def test_a_fisher_saliency_is_refused_on_generative_data(generative):
    pre, ft, data = generative
    for name in ("saliency", "learned-saliency"):
        options = fast(name, budgets=[20])
        options = {**options, "kind": "fisher"} if name == "saliency" else {**options, "saliency": {"kind": "fisher"}}
        with pytest.raises(SkillgraftError, match=f"localizer '{name}' needs class labels"):
            get_localizer(name).run(pre, ft, data, options)



@pytest.mark.parametrize("name, options", [
    ("learned", {"sparsity": 0.01, "budgets": [0.005, "round"]}),
    ("learned", {"sparsity": 0.01, "budgets": [0.005], "candidates": 0.2, "l1": 1e-3}),
    ("learned-adam", {"sparsity": 0.005, "budgets": [30]}),
    ("straight-through", {"budgets": [30], "optimizer": "nsgd", "lr": 2.0}),
    ("prune", {"anneal_steps": 3, "anneal_from": 0.5, "budgets": [30]}),
    ("hard-concrete", {"budgets": [30]})])
def test_no_host_read_inside_a_localization_step(pair, monkeypatch, name, options):
    """Issue 45: a step reads nothing back from the device (loss, metrics and the non-finite check wait for the
    scored steps), so on a GPU the host never waits inside the loop."""
    import skillgraft.graft.localizers.machinery.engine as engine

    pre, ft, data = pair
    reads, steps, real = [], [], engine._step

    def watched(*args, **kwargs):
        mine = []
        with pytest.MonkeyPatch.context() as mp, HostReads(mine):
            count_host_reads(mp, mine)
            real(*args, **kwargs)
        reads.extend(mine)
        steps.append(args[-1])

    monkeypatch.setattr(engine, "_step", watched)
    get_localizer(name).run(pre, ft, data, {"steps": 4, "eval_every": 4, "micro_batch": 16, **options})
    assert steps and reads == []


def test_a_non_finite_loss_still_stops_at_its_step_and_moves_nothing(pair, monkeypatch):
    import skillgraft.graft.localizers.machinery.engine as engine

    pre, ft, data = pair
    before = snapshot(pre)
    moved = []
    real = engine.Optimizer.step

    def step(self, grads, finite=None, **kwargs):
        params = [p.detach().clone() for p in self.params]
        real(self, grads, finite, **kwargs)
        moved.append(any(not torch.equal(a, b) for a, b in zip(params, self.params)))

    calls = iter(range(100))
    real_loss = engine.batch_loss
    monkeypatch.setattr(engine.Optimizer, "step", step)
    monkeypatch.setattr(engine, "batch_loss", lambda *a, **k: real_loss(*a, **k) * (
        float("nan") if next(calls) == 1 else 1.0))
    with pytest.raises(SkillgraftError, match="localization stopped at step 2: the loss is nan"):
        get_localizer("learned").run(pre, ft, data, {"steps": 4, "eval_every": 4, "micro_batch": 64,
                                                     "sparsity": 0.01, "budgets": [0.005]})
    assert moved == [True, False, True, True]  # step 2 moved nothing; the run stops at its next read
    assert_intact(pre, before)


def test_the_on_device_top_k_takes_what_top_k_flat_takes():
    from skillgraft.graft.selection import top_k_flat, top_k_flat_on_device

    flat = torch.tensor([1.0, 3.0, 3.0, float("nan"), 2.0, 3.0, float("inf"), 3.0, -1.0])
    for k in range(0, 11):
        assert torch.equal(top_k_flat_on_device(flat, k), top_k_flat(flat, k)), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_localization_step_on_cuda_never_synchronises(pair, monkeypatch):
    """torch's sync debug mode warns at every host synchronisation; none may come from a step (transformers' own
    SDPA mask check is the one known exception, docs/gpu.md)."""
    import warnings

    import skillgraft.graft.localizers.machinery.engine as engine

    pre, ft, data = pair
    pre, ft = pre.to("cuda"), ft.to("cuda")
    real, caught = engine._step, []

    def watched(*args, **kwargs):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                real(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        caught.extend(w for w in seen if "synchroniz" in str(w.message) and "masking_utils" not in w.filename)

    monkeypatch.setattr(engine, "_step", watched)
    try:
        get_localizer("learned").run(pre, ft, data, {"steps": 3, "eval_every": 3, "micro_batch": 16,
                                                     "sparsity": 0.01, "budgets": [0.005]})
    finally:
        pre.to("cpu"), ft.to("cpu")
    assert caught == []


@pytest.mark.parametrize("options, dtype, chunk", [
    ({"budgets": [0.005, "round"]}, torch.float32, None),
    ({"budgets": [0.02], "l1": 1e-3, "init": "movement"}, torch.float32, 3000),
    ({"budgets": [0.005]}, torch.bfloat16, 3000)])
def test_the_fused_dense_step_is_the_separate_calls_bit_for_bit(pair, monkeypatch, options, dtype, chunk):
    """Issue 75: the dense sigmoid's fused step (one op per chunk of tensors, γ_base's flips by index) moves S and
    the working weights exactly as ∂L/∂S, the optimizer's step and the mask's write made one by one do — with an
    L1 term, S started from |Δ|, in bf16, over several chunks."""
    import copy

    import skillgraft.graft.localizers.machinery.engine as engine
    from skillgraft.graft.localizers.machinery.layouts import Dense
    from skillgraft.graft.localizers.machinery.relaxations import Sigmoid

    pre, ft, data = pair
    pre, ft = copy.deepcopy(pre).to(dtype), copy.deepcopy(ft).to(dtype)
    if chunk:
        monkeypatch.setattr(Dense, "CHUNK", chunk)
    real, fused = engine._step, Sigmoid.fused

    def run(fuse: bool):
        seen, took = [], []

        def watched(pre_, layout, relax, *rest):
            real(pre_, layout, relax, *rest)
            seen.append(([s.clone() for s in relax.S.values()], [p.detach().clone() for p in layout.params.values()]))

        def maybe(self, *args):
            took.append(fuse and fused(self, *args))
            return took[-1]

        monkeypatch.setattr(engine, "_step", watched)
        monkeypatch.setattr(Sigmoid, "fused", maybe)
        res = get_localizer("learned").run(pre, ft, data, {"sparsity": 0.01, "steps": 4, "eval_every": 2,
                                                           "micro_batch": 16, "schedule": "fixed", **options})
        return seen, took, {b.key: digest(r) for b, r in res.regions.items()}, [h.columns() for h in res.history]

    (a, took_a, regions_a, history_a), (b, took_b, regions_b, history_b) = run(True), run(False)
    assert all(took_a) and not any(took_b) and len(a) == len(b) == 4
    for (s1, w1), (s2, w2) in zip(a, b):
        assert all(torch.equal(x, y) for x, y in zip(s1, s2)) and all(torch.equal(x, y) for x, y in zip(w1, w2))
    assert regions_a == regions_b and history_a == history_b


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view counts once)."""
    seen = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def test_the_dense_localizer_keeps_delta_s_and_the_base_between_steps(pair, monkeypatch):
    """Issue 45: between steps the dense (paper's) localizer holds Δ and S (fp32) and γ_base (bool) per coordinate
    and no gradient; γ is dropped (recomputed before S moves): 9 bytes per coordinate (13 before), 2.25 × the
    body's fp32 bytes. The digests of test_the_engine_reproduces_the_previous_localizers pin the results."""
    import skillgraft.graft.localizers.machinery.engine as engine

    pre, ft, data = pair
    held, real = [], engine._step

    def counted(pre_, layout, relax, opt, *rest, **kwargs):
        real(pre_, layout, relax, opt, *rest, **kwargs)
        assert layout._current is None
        kept = [*layout.delta.values(), *relax.S.values(), *relax.base.values(), *[p.grad for p in pre_.parameters()]]
        held.append((_storage_bytes(kept), layout.universe))

    monkeypatch.setattr(engine, "_step", counted)
    get_localizer("learned").run(pre, ft, data, {"sparsity": 0.01, "steps": 2, "eval_every": 2, "micro_batch": 16,
                                                 "budgets": [0.005]})
    body = sum(p.numel() * p.element_size() for n, p in pre.named_parameters() if n in graftable_names(pre))
    assert len(held) == 2 and all(b == 9 * u for b, u in held)  # Δ, S: 4 bytes each; γ_base: 1
    assert all(b == 2.25 * body for b, _ in held)


def test_a_steps_micro_batches_and_a_scoring_take_their_rows_in_length_order(pair, monkeypatch):
    """A full-batch step over rows of mixed lengths pads each micro-batch to its longest row; taken in length order
    they pad little (the paper schedule's mr localization step: 86–98 s → 40–44 s). Every step still sees every
    training row once, and every scoring every selection row once."""
    import skillgraft.graft.localizers.machinery.engine as engine
    from skillgraft.data.loading import text_length

    from skillgraft.models.rows import Tokenized

    pre, ft, data = pair
    batches, real, building = [], type(pre).collate, []

    def collate(self, examples):
        if not building:  # a micro-batch (a step's own, or a scoring's), not the run's rows tokenized once
            batches.append([text_length(ex) for ex in examples])
        return real(self, examples)

    def of(cls, *args, _real=Tokenized.of.__func__, **kwargs):
        building.append(1)
        try:
            return _real(cls, *args, **kwargs)
        finally:
            building.pop()

    def take(self, examples=None, rows=None, _real=Tokenized.take):  # a step's micro-batch cut from those rows
        batches.append([text_length(data.train[i]) for i in rows])
        return _real(self, examples, rows)

    monkeypatch.setattr(type(pre), "collate", collate)
    monkeypatch.setattr(Tokenized, "of", classmethod(of))
    monkeypatch.setattr(Tokenized, "take", take)
    steps, real_step = [], engine._step

    def step(*args, **kwargs):
        start = len(batches)
        real_step(*args, **kwargs)
        steps.append(batches[start:])

    monkeypatch.setattr(engine, "_step", step)
    get_localizer("learned").run(pre, ft, data, {"steps": 2, "eval_every": 2, "micro_batch": 4, "sparsity": 0.01,
                                                 "budgets": [0.005]})
    train = sorted(text_length(ex) for ex in data.train)
    assert len(set(train)) > 1 and len(steps) == 2
    for chunks in steps:
        flat = [n for chunk in chunks for n in chunk]
        assert flat == train  # every row once, shortest first: each micro-batch holds rows of like length
    assert batches[-1] and max(batches[-2]) <= min(batches[-1])  # the last scoring, in order too
