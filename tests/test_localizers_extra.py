"""The localizers beyond the paper's: saliency scores, relaxed learned masks (Adam, saliency γ_base,
straight-through binary grafts). Exact sizes for every registered localizer are in test_localizers.py."""

import pytest
import torch
from localizing import Interrupt, assert_intact, snapshot

from skillgraft.errors import SkillgraftError
from skillgraft.graft import Budget, Graft, LocalizeConfig, get_localizer, graftable_names, localize
from skillgraft.graft.localizers.relaxed import RelaxedOptions, accuracy
from skillgraft.graft.localizers.saliency import SaliencyConfig, saliency_scores

NEW = ["saliency", "learned-adam", "learned-saliency", "straight-through", "prune", "hard-concrete"]
FAST = {"steps": 4, "eval_every": 2, "micro_batch": 16}


def test_new_localizers_are_registered_with_typed_options():
    for name in NEW:
        loc = get_localizer(name)
        assert loc.name == name and loc.Options.__name__.endswith("Options")
    assert get_localizer("learned-adam").options().optimizer == "adam"
    assert get_localizer("learned-saliency").options().base == "saliency"
    assert get_localizer("straight-through").options().relaxation == "straight-through"
    assert RelaxedOptions(optimizer="sgd", relaxation="sigmoid").lr == 1e7  # the paper's lr on S
    assert RelaxedOptions(relaxation="straight-through").lr == 0.05 and RelaxedOptions(lr=0.3).lr == 0.3
    assert RelaxedOptions(relaxation="straight-through", optimizer="nsgd").lr == 0.1
    prune = get_localizer("prune").options()
    assert (prune.relaxation, prune.optimizer, prune.anneal_from, prune.anneal_steps, prune.candidates) == (
        "straight-through", "nsgd", 0.1, 60, None)
    assert get_localizer("hard-concrete").options().lr == 1.0
    # settings a relaxation does not read stay out of its config (store keys of earlier runs unchanged)
    assert "anneal_from" not in get_localizer("straight-through").options().to_dict()
    assert "l0_penalty" in get_localizer("hard-concrete").options().to_dict()
    assert "l0_penalty" not in prune.to_dict() and prune.to_dict()["anneal_steps"] == 60
    for bad, word in (({"anneal_steps": 100}, "anneal_steps"), ({"relaxation": "sigmoid"}, "anneal_from"),
                      ({"candidates": 0.01}, "anneal_from")):
        with pytest.raises(SkillgraftError, match=word):
            get_localizer("prune").options(bad)
    for bad in ({"optimiser": "adam"}, {"lr": 0}, {"select_on": "test"}, {"candidates": 2.0}):
        with pytest.raises(SkillgraftError, match=next(iter(bad))):
            get_localizer("straight-through").options(bad)
    with pytest.raises(SkillgraftError, match="at"):
        get_localizer("saliency").options({"at": "mid"})


def manual_gradient(scorer, examples):
    params = dict(scorer.named_parameters())
    names = graftable_names(scorer)
    batch = scorer.collate(examples)
    labels = batch.pop("labels")
    loss = torch.nn.functional.cross_entropy(scorer(**batch), labels)
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return {n: torch.zeros_like(params[n]) if g is None else g for n, g in zip(names, grads)}


def test_saliency_scores_are_gradient_times_movement(pair):
    pre, ft, data = pair
    for p in ft.parameters():
        p.grad = None  # (the pair's training loop leaves grads on the frozen embeddings)
    before_pre, before_ft = snapshot(pre), snapshot(ft)
    full = len(data.train)
    ours = saliency_scores(pre, ft, data.train, SaliencyConfig(micro_batch=full))
    grads = manual_gradient(ft, data.train)
    p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
    for n, g in grads.items():
        expect = (g * (p_ft[n] - p_pre[n])).abs().detach()
        torch.testing.assert_close(ours[n], expect, rtol=1e-4, atol=1e-9)
    signed = saliency_scores(pre, ft, data.train, SaliencyConfig(micro_batch=full, signed=True))
    n = next(iter(grads))
    torch.testing.assert_close(signed[n], -(grads[n] * (p_ft[n] - p_pre[n])).detach(), rtol=1e-4, atol=1e-9)
    per_batch = saliency_scores(pre, ft, data.train, SaliencyConfig(micro_batch=4))
    assert all(bool((per_batch[m] >= ours[m] - 1e-7).all()) for m in ours)  # Σ_b |g_b Δ| ≥ |Σ_b g_b Δ|
    at_pre = saliency_scores(pre, ft, data.train, SaliencyConfig(at="pre"))  # θ_pre wears the FT head meanwhile
    fisher = saliency_scores(pre, ft, data.train, SaliencyConfig(kind="fisher", fisher={"n_examples": 8}))
    assert set(at_pre) == set(fisher) == set(ours) and all(bool((s >= 0).all()) for s in fisher.values())
    assert_intact(pre, before_pre)
    assert_intact(ft, before_ft)
    region = get_localizer("saliency").region(pre, ft, data, 25, {"micro_batch": full})
    top = torch.cat([ours[m].reshape(-1)[i] for m, i in region.indices.items()]).min()
    assert len(region) == 25 and all(int((ours[m] > top).sum()) <= 25 for m in ours)
    with pytest.raises(SkillgraftError, match="training examples"):
        get_localizer("saliency").region(pre, ft, None, 25)


@pytest.mark.parametrize("name", ["learned-saliency", "straight-through"])
def test_zero_steps_gives_the_base_region(pair, name):
    """Step 0 of a relaxed localizer is the top-k of its base score: |Δ| or saliency (for the sigmoid
    relaxation at the size of γ_base; smaller budgets take the top of γ inside it)."""
    pre, ft, data = pair
    opts = {"steps": 0, "sparsity": 0.01, "base": "movement"}
    assert get_localizer(name).region(pre, ft, data, 0.01, opts) == get_localizer("movement").region(
        pre, ft, data, 0.01)
    sal = {**opts, "base": "saliency", "saliency": {"micro_batch": 8}}
    assert get_localizer(name).region(pre, ft, data, 0.01, sal) == get_localizer("saliency").region(
        pre, ft, data, 0.01, {"micro_batch": 8})


def test_sigmoid_sgd_is_the_papers_update(pair):
    """One engine: the sigmoid relaxation from |Δ| with SGD on the whole universe *is* the learned localizer —
    the same S draw (C = U), arithmetic and trajectory; its regions are the top-k of γ's logit, here the same."""
    pre, ft, data = pair
    budgets = [Budget.parse(0.01), Budget.parse(0.05)]
    paper = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.01, steps=6, lr=1e7, budgets=budgets,
                                                                    micro_batch=16, eval_every=2), progress=False)
    ours = get_localizer("learned-saliency").run(pre, ft, data, {
        "base": "movement", "optimizer": "sgd", "lr": 1e7, "sparsity": 0.01, "steps": 6, "candidates": None,
        "micro_batch": 16, "eval_every": 2, "select_on": "train+dev", "budgets": budgets})
    assert ours.regions == paper.regions and ours.history == paper.history
    assert ours.best_step == paper.best_step and ours.best_score == paper.best_score


@pytest.mark.parametrize("name,optimizer", [("learned-adam", "adam"), ("straight-through", "adam"),
                                            ("straight-through", "nsgd"), ("prune", "nsgd"),
                                            ("hard-concrete", "adam")])
def test_relaxed_selects_on_dev_and_keeps_pre_intact(pair, name, optimizer):
    pre, ft, data = pair
    before = snapshot(pre)
    extra = {"anneal_steps": 0} if name == "prune" else {}
    result = get_localizer(name).run(pre, ft, data, {**FAST, **extra, "optimizer": optimizer, "budgets": [0.01, 30]})
    assert_intact(pre, before)
    for b, region in result.regions.items():
        assert len(region) == b.size(region.universe_size)
        with Graft.from_models(pre, ft, region).applied(pre):
            dev_acc = accuracy(pre, data.dev, 64)
        assert dev_acc == pytest.approx(result.summary["best_score"][b.key])  # the kept region's dev accuracy
        steps = [r["step"] for r in result.summary["history"] if f"{b.label}:acc" in r]
        assert steps == [0, 2, 4]  # step 0 (the base region) is a candidate too
        assert max(r[f"{b.label}:acc"] for r in result.summary["history"] if f"{b.label}:acc" in r) == pytest.approx(
            dev_acc)
    assert_intact(pre, before)
    with pytest.raises(SkillgraftError, match="dev"):
        get_localizer(name).run(pre, ft, data.train, {**FAST, **extra, "budgets": [30]})  # a plain list: no dev
    with pytest.raises(SkillgraftError, match="round"):
        get_localizer(name).run(pre, ft, data, {**FAST, **extra, "budgets": ["round"]})


def test_interrupted_relaxed_localization_leaves_pre_intact(pair):
    pre, ft, data = pair
    pre.train()
    try:
        before = snapshot(pre)
        for name in ("straight-through", "learned-saliency", "prune", "hard-concrete"):
            hook = Interrupt(3)
            handle = pre.model.register_forward_hook(hook)
            try:
                with pytest.raises(KeyboardInterrupt):
                    get_localizer(name).run(pre, ft, data, {**FAST, "micro_batch": 8, "budgets": [30],
                                                            "saliency": {"micro_batch": 64},
                                                            **({"anneal_steps": 2} if name == "prune" else {})})
            finally:
                handle.remove()
            assert hook.seen == 3
            assert_intact(pre, before)
    finally:
        pre.eval()


def test_prune_scores_only_at_the_budget_and_starts_from_the_base_order(pair):
    """The pruning schedule shrinks the forward mask from the top `anneal_from` of |Δ| to the budget; regions
    are scored (and kept) only once they have the budget's exact size. Without a schedule, step 0 is the
    top-k of |Δ|, as for straight-through."""
    pre, ft, data = pair
    before = snapshot(pre)
    result = get_localizer("prune").run(pre, ft, data, {**FAST, "steps": 5, "anneal_steps": 3, "anneal_from": 0.5,
                                                        "budgets": [30]})
    (b, region), = result.regions.items()
    assert len(region) == 30 and [r["step"] for r in result.summary["history"]] == [3, 4, 5]
    assert result.summary["best_step"][b.key] >= 3
    assert_intact(pre, before)
    start = get_localizer("prune").region(pre, ft, data, 30, {"steps": 0, "anneal_steps": 0})
    assert start == get_localizer("movement").region(pre, ft, data, 30)


def test_hard_concrete_starts_open_on_the_base_region(pair):
    """log α starts with the top-k of |Δ| open (P(z = 1) = 0.95) and k/10 gates open in expectation elsewhere,
    so E‖z‖₀ ≈ 1.1·k; with no steps the region is the top-k of |Δ|."""
    pre, ft, data = pair
    k = 30
    result = get_localizer("hard-concrete").run(pre, ft, data, {**FAST, "steps": 0, "budgets": [k]})
    assert result.region == get_localizer("movement").region(pre, ft, data, k)
    assert result.summary["history"][0]["expected_size"] == pytest.approx(1.1 * k, rel=0.01)
    moved = get_localizer("hard-concrete").run(pre, ft, data, {**FAST, "steps": 6, "budgets": [k], "l0_penalty": 50.0})
    sizes = [r["expected_size"] for r in moved.summary["history"]]
    assert abs(sizes[-1] - k) < abs(sizes[0] - k)  # the size penalty pulls E‖z‖₀ towards the budget
