"""The localizer core: registry, typed budgets, the shared selection, exact sizes, safe localization."""

import pytest
import torch
from localizing import Interrupt, assert_intact, digest, snapshot

from skillgraft.errors import SkillgraftError
from skillgraft.graft import (LOCALIZERS, ROUND, Budget, LocalizeConfig, Region, get_localizer, graftable_names,
                              localize, parse_budgets, register_localizer, select)
from skillgraft.graft.localizers import Localizer, LocalizerOptions
from skillgraft.graft.selection import region_universe, select_streamed

# Options that keep every registered localizer fast on the tiny model.
# A few steps of each learned localizer (their default 50-90 per budget, twice per case, were most of this file): the
# region's exact size is set by the last step's top-k whatever the step count; prune still anneals to each budget.
SHORT = {"steps": 4, "eval_every": 2}
FAST = {"learned": {"sparsity": 0.01, "steps": 2}, "fish": {"fisher": {"n_examples": 8}},
        **dict.fromkeys(("learned-adam", "learned-saliency", "straight-through", "hard-concrete"), SHORT),
        "prune": {**SHORT, "steps": 6, "anneal_steps": 4}}


# ---------------------------------------------------------------------------------------------- budgets
def test_budget_parsing_and_sizes():
    assert Budget.parse(1e-4) == Budget.parse("1e-4") == Budget.parse("0.0001")
    assert Budget.parse(1e-4).fraction == 1e-4 and Budget.parse(1e-4).label == f"{1e-4:g}"
    assert Budget.parse(1e-5).label == "1e-05" and Budget.parse(0.001).label == "0.001"
    assert Budget.parse(100).count == 100 and Budget.parse("100") == Budget.parse(100) == Budget.parse("1e2")
    assert Budget.parse(1.0).fraction == 1.0 and Budget.parse(1).count == 1  # a float 1.0 is the whole universe
    assert Budget.parse("round") == ROUND and ROUND.rounding and str(ROUND) == "round"
    for b in (Budget.parse(3e-4), Budget.parse(7), ROUND, Budget.parse(1 / 3)):
        assert Budget.parse(b.key) == b  # exact round trip through JSON keys / folder names
    assert len({Budget.parse(0.001), Budget.parse("0.001"), Budget.parse(5), Budget.parse(5.0)}) == 2  # hashable
    assert Budget.parse(0.001).size(10_000) == 10 and Budget.parse(1e-9).size(10_000) == 1
    assert Budget.parse(50).size(50) == 50
    assert parse_budgets("1e-4, 100") == [Budget.parse(1e-4), Budget.parse(100)]
    for bad in (0, 0.0, 1.5, -1, -0.1, float("nan")):
        with pytest.raises(SkillgraftError, match="impossible"):
            Budget.parse(bad)
    for bad in ("abc", True, None, [1]):
        with pytest.raises(SkillgraftError, match="budget"):
            Budget.parse(bad)
    with pytest.raises(SkillgraftError, match="exceeds"):
        Budget.parse(51).size(50)
    with pytest.raises(SkillgraftError, match="round"):
        ROUND.size(50)


def test_budgets_in_configs():
    cfg = LocalizeConfig.build({"budgets": ["1e-4", 100, "round"]}, where="recipe field 'localize'")
    assert cfg.budgets == [Budget.parse(1e-4), Budget.parse(100), ROUND]
    assert cfg.to_dict()["budgets"] == [1e-4, 100, "round"]  # plain numbers in JSON and cache keys
    assert LocalizeConfig.build(cfg.to_dict()) == cfg
    assert LocalizeConfig(budgets=[1e-4, 3e-4]).to_dict()["budgets"] == [1e-4, 3e-4]
    assert LocalizeConfig().budget_list == [ROUND] and LocalizeConfig.build({"budgets": "0.001"}).budgets == [
        Budget.parse(0.001)]
    with pytest.raises(SkillgraftError, match=r"recipe field 'localize'\.budgets\.0: budget 0 is impossible"):
        LocalizeConfig.build({"budgets": [0]}, where="recipe field 'localize'")
    for field, value in (("sparsity", 1.5), ("steps", -1), ("lr", 0), ("micro_batch", 0), ("eval_every", 0),
                         ("graftable", "heads"), ("select_on", "dev")):
        with pytest.raises(SkillgraftError, match=field):
            LocalizeConfig.build({field: value})
    with pytest.raises(SkillgraftError, match="unknown field"):
        LocalizeConfig.build({"budget": [0.1]})
    with pytest.raises(SkillgraftError, match="options"):
        get_localizer("random").options({"seeds": 3})


# ---------------------------------------------------------------------------------------------- selection
def test_select_is_exact_and_fraction_of_the_universe():
    shapes = {"a.weight": (4, 5), "a.bias": (5,), "b.bias": (5,)}
    scores = {"a.bias": torch.arange(5.0), "b.bias": torch.ones(5)}  # only biases are candidates; ties in b
    region = select(scores, 0.2, shapes)  # 20% of the 30-coordinate universe = 6, from the 10 scored
    assert len(region) == 6 and region.shapes == shapes and region.universe_size == 30
    assert set(region.indices) <= {"a.bias", "b.bias"} and region.contains("a.bias", 4)
    assert len(select(scores, 10, shapes)) == 10
    with pytest.raises(SkillgraftError, match="only 10 can be chosen"):
        select(scores, 11, shapes)
    with pytest.raises(SkillgraftError, match="do not fit"):
        select({"a.bias": torch.ones(4)}, 1, shapes)
    gamma = {"a.bias": torch.tensor([0.2, 0.6, 0.5, 0.9, 0.1])}
    assert select(gamma, ROUND).indices["a.bias"].tolist() == [1, 3]  # γ rounded at 0.5 (strictly above)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_streamed_selection_is_select(dtype):
    """One tensor at a time, each tensor's own top-k pooled: the same regions as select on the dense scores, ties
    (many exact zeros, repeated values across tensors) resolved by position as top_k_flat resolves them."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"e": (50, 8), "a": (30, 7), "z": (40,), "b": (6, 5, 4), "c": (3,)}
    scores = {n: (torch.randint(0, 4, s, generator=gen).to(dtype) * 0.25) for n, s in shapes.items()}
    scores["e"].zero_()  # an untouched tensor: |Δ| = 0 everywhere
    scores["z"] = torch.linspace(0, 1, 40).to(dtype)
    budgets = [Budget.parse(b) for b in (1, 7, 40, 0.05, 0.3, 0.9, 773)]
    streamed = select_streamed(iter(scores.items()), budgets, shapes)
    for b in budgets:
        assert streamed[b] == select(scores, b, shapes), b
        assert list(streamed[b].shapes) == list(shapes)
    with pytest.raises(SkillgraftError, match="only 250 can be chosen"):
        select_streamed(iter({"a": scores["a"], "z": scores["z"]}.items()), [Budget.parse(251)], shapes)
    with pytest.raises(SkillgraftError, match="do not fit"):
        select_streamed(iter({"a": torch.ones(4)}.items()), [Budget.parse(1)], shapes)


def test_movement_streams_and_reads_files(pair, tmp_path):
    """movement's regions: streamed (small budgets) or dense (large), from the scorer or its saved files: equal."""
    pre, ft, _ = pair
    movement = get_localizer("movement")
    ft.save_pretrained(tmp_path / "ft")
    budgets = [Budget.parse(b) for b in (30, 0.01, 0.5)]  # 0.5: above the streaming share (the dense path)
    dense = {b: select(movement.scores(pre, ft, None, movement.options({})), b, region_universe(pre))
             for b in budgets}
    for source in (ft, tmp_path / "ft"):
        assert movement.regions(pre, source, None, budgets) == dense


# ---------------------------------------------------------------------------------------------- registry
def test_registry_lists_the_localizers():
    assert {"learned", "movement", "random", "bias", "fish"} <= set(LOCALIZERS)
    assert all(loc.name == name for name, loc in LOCALIZERS.items())
    with pytest.raises(SkillgraftError, match=r"unknown localizer 'lottery'; known: learned, movement"):
        get_localizer("lottery")


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
def test_every_localizer_gives_exactly_the_requested_size(pair, name):
    pre, ft, data = pair
    before = snapshot(pre)
    budgets = [Budget.parse(0.01), Budget.parse(37)]
    localizer = get_localizer(name)
    regions = localizer.regions(pre, ft, data, budgets, FAST.get(name))
    universe = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in set(graftable_names(pre))}
    assert list(regions) == budgets
    for budget, region in regions.items():
        assert region.shapes == universe
        assert len(region) == budget.size(region.universe_size), (name, budget)
    assert len(regions[Budget.parse(0.01)]) == round(0.01 * sum(p.numel() for p in map(torch.empty, universe.values())))
    assert_intact(pre, before)  # θ_pre, its head, flags and modes untouched
    run = localizer.run(pre, ft, data, {**FAST.get(name, {}), "budgets": [0.01]})
    assert run.region == regions[Budget.parse(0.01)] and run.summary["budgets"] == [Budget.parse(0.01).key]
    if name != "learned":
        with pytest.raises(SkillgraftError, match="round"):
            localizer.regions(pre, ft, data, [ROUND], FAST.get(name))


def test_baseline_localizers_behave(pair):
    pre, ft, data = pair
    random = get_localizer("random")
    assert random.region(pre, ft, None, 50, {"seed": 1}) != random.region(pre, ft, None, 50, {"seed": 2})
    nested = random.regions(pre, ft, None, [20, 60], {"seed": 1})  # one permutation, prefixes of it
    assert len(nested[Budget.parse(20)] & nested[Budget.parse(60)]) == 20
    bias = get_localizer("bias")
    region = bias.region(pre, ft, None, 20)
    assert all(n.endswith("bias") for n in region.indices) and region.universe_size > 20 * 100
    biases = sum(p.numel() for n, p in pre.named_parameters() if n in graftable_names(pre, "bias"))
    assert len(bias.region(pre, ft, None, 1.0, {"graftable": "bias"})) == biases  # every bias
    with pytest.raises(SkillgraftError, match="can be chosen"):
        bias.region(pre, ft, None, biases + 1)
    move = get_localizer("movement").region(pre, ft, None, 30)
    delta = {n: (dict(ft.named_parameters())[n] - p).abs().detach() for n, p in pre.named_parameters()
             if n in move.shapes}
    smallest_in = min(float(delta[n].view(-1)[i].min()) for n, i in move.indices.items())
    assert all(float(d.max()) <= smallest_in or n in move.indices for n, d in delta.items())
    fish = get_localizer("fish")
    own_head = fish.region(pre, None, data.train, 37, {"head": "pre", "fisher": {"n_examples": 8}})
    assert len(own_head) == 37
    with pytest.raises(SkillgraftError, match="give ft"):
        fish.region(pre, None, data.train, 37)
    with pytest.raises(SkillgraftError, match="training examples"):
        fish.region(pre, ft, None, 37)


def test_register_a_localizer(pair):
    """Adding a localizer = a Localizer subclass with ``scores`` + a registry entry."""
    pre, ft, _ = pair

    @register_localizer("first-k")
    class FirstK(Localizer):
        """The first coordinates of each tensor (scores fall with the flat position)."""

        def scores(self, pre, ft, data, options, *, progress=False):
            names = set(graftable_names(pre, options.graftable))
            return {n: -torch.arange(p.numel(), dtype=torch.float64).view(p.shape)
                    for n, p in pre.named_parameters() if n in names}

    try:
        assert get_localizer("first-k").Options is LocalizerOptions
        region = get_localizer("first-k").region(pre, ft, None, 8)
        assert len(region) == 8 and all(int(i.max()) < 8 for i in region.indices.values())
        with pytest.raises(SkillgraftError, match="already registered"):
            register_localizer("first-k")(FirstK)
        with pytest.raises(SkillgraftError, match="Localizer subclass"):
            register_localizer("not-one")(object)
    finally:
        LOCALIZERS.pop("first-k", None)


# ---------------------------------------------------------------------------------------------- safety
def test_interrupted_localization_leaves_pre_intact(pair):
    pre, ft, data = pair
    pre.train()  # a mode and flags that localize changes for its own use, and must give back
    pre.model.embeddings.word_embeddings.weight.requires_grad_(False)
    try:
        before = snapshot(pre)
        hook = Interrupt(3)
        handle = pre.model.register_forward_hook(hook)
        try:
            with pytest.raises(KeyboardInterrupt):
                localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.05, steps=5, micro_batch=8),
                         progress=False)
        finally:
            handle.remove()
        assert hook.seen == 3  # stopped mid-step: after two backward passes into θ_pre + γ⊙Δ
        assert_intact(pre, before)
        hook = Interrupt(1, grad_only=False)  # also in the middle of a FISH pass (the head is lent)
        handle = pre.model.register_forward_hook(hook)
        try:
            with pytest.raises(KeyboardInterrupt):
                get_localizer("fish").region(pre, ft, data.train, 10)
        finally:
            handle.remove()
        assert_intact(pre, before)
    finally:
        pre.eval()
        pre.model.embeddings.word_embeddings.weight.requires_grad_(True)


def test_failed_localization_leaves_pre_intact(pair):
    pre, ft, data = pair
    before = snapshot(pre)
    with pytest.raises(SkillgraftError, match="base region"):
        localize(pre, ft, data.train, None, LocalizeConfig(steps=1),
                 base=Region({"nope": (3,)}, {"nope": [0]}), progress=False)
    assert_intact(pre, before)


# ---------------------------------------------------------------------------------------------- reference
# Regions of the learned localizer computed with the code before the localizer core (git e688180,
# graft/localize.py) on the pair above: sizes, a sha256 of the indices, the best step and its accuracy.
REFERENCE_ROUND = [1847, "163fcbdf626c93bd", 5, 0.65625]
REFERENCE_ROUND_SIZES = [181, 196, 481, 968, 1435, 1847]
REFERENCE_BUDGETS = {0.001: [18, "17aba73f019f56dd", 0, 0.578125], 0.005: [91, "1711a4ed6369dfba", 0, 0.578125],
                     0.02: [363, "557ab92c17fccaf2", 4, 0.625]}
REFERENCE_MOVEMENT = {0.01: "48e085de78d9b8a7", 363: "ce3958aec7f2e7d1"}


def test_learned_regions_match_the_reference(pair):
    pre, ft, data = pair
    cfg = LocalizeConfig(sparsity=0.01, steps=5, lr=1e9, seed=3, eval_every=1, select_on="last")
    res = localize(pre, ft, data.train, data.dev, cfg, progress=False)
    assert list(res.regions) == [ROUND]
    region = res.regions[ROUND]
    assert [len(region), digest(region), res.best_step[ROUND], res.best_score[ROUND]] == REFERENCE_ROUND
    assert [h["round:size"] for h in res.history] == REFERENCE_ROUND_SIZES
    cfg = LocalizeConfig(sparsity=0.01, steps=5, seed=3, budgets=list(REFERENCE_BUDGETS), eval_every=2)
    res = get_localizer("learned").run(pre, ft, data, cfg)
    assert [h["step"] for h in res.history] == [0, 2, 4, 5]
    for b, ref in REFERENCE_BUDGETS.items():
        budget = Budget.parse(b)
        got = res.regions[budget]
        assert [len(got), digest(got), res.best_step[budget], res.best_score[budget]] == ref, b
    assert res.summary["best_step"] == {Budget.parse(b).key: ref[2] for b, ref in REFERENCE_BUDGETS.items()}
    for b, ref in REFERENCE_MOVEMENT.items():
        assert digest(get_localizer("movement").region(pre, ft, None, b)) == ref


def test_per_size_learns_each_budget_from_its_own_base_as_separate_runs_do(pair):
    """``per_size`` (the paper's protocol): each budget's region is what a run at ``sparsity`` = that budget learns,
    bit for bit — not a read of one trajectory from the ``sparsity`` γ_base (which gives other regions here); it
    refuses an explicit γ_base and a keep target, which need one trajectory."""
    pre, ft, data = pair
    budgets = [0.005, 0.02]
    both = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.001, steps=4, seed=3, budgets=budgets,
                                                                  eval_every=2, per_size=True), progress=False)
    shared = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.001, steps=4, seed=3, budgets=budgets,
                                                                    eval_every=2), progress=False)
    for b in budgets:
        alone = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=b, steps=4, seed=3, budgets=[b],
                                                                       eval_every=2), progress=False)
        budget = Budget.parse(b)
        assert digest(both.regions[budget]) == digest(alone.regions[budget]), b
        assert (both.best_step[budget], both.best_score[budget]) == (alone.best_step[budget], alone.best_score[budget])
    assert any(digest(both.regions[Budget.parse(b)]) != digest(shared.regions[Budget.parse(b)]) for b in budgets)
    assert {h["budget"] for h in both.history} == {"0.005", "0.02"}  # each scored step names its trajectory
    assert "base_size" not in both.summary and shared.summary["base_size"] > 0  # no shared γ_base was made
    # the frontier's trajectory is one per sparsity by construction: per_size is dropped there, so it has an order
    one = get_localizer("learned").trajectory(pre, ft, data, {"sparsity": 0.001, "steps": 4, "seed": 3, "eval_every": 2,
                                                              "budgets": budgets, "per_size": True}, ranked=True)
    assert one.ranking is not None
    assert [digest(one.regions[Budget.parse(b)]) for b in budgets] == [digest(shared.regions[Budget.parse(b)])
                                                                       for b in budgets]
    with pytest.raises(SkillgraftError, match="per_size"):
        localize(pre, ft, data.train, data.dev, LocalizeConfig(budgets=budgets, per_size=True),
                 base=get_localizer("movement").region(pre, ft, None, 0.01), progress=False)
    with pytest.raises(SkillgraftError, match="per_size"):
        localize(pre, ft, data.train, data.dev, LocalizeConfig(budgets=budgets, per_size=True), keep=0.9,
                 progress=False)


def test_random_ranks_are_written_in_chunks_to_the_same_permutation(pair, monkeypatch):
    """The random baseline writes its ranks a chunk at a time (no third full-size tensor): the same ranks, so the
    same seeded regions, as the one-shot scatter rank[perm] = universe … 1."""
    import skillgraft.graft.localizers.random as random_module

    pre, ft, data = pair
    loc = get_localizer("random")
    opts = loc.options({"budgets": [30], "seed": 5})
    shapes = region_universe(pre, opts.graftable)
    universe = sum(torch.Size(s).numel() for s in shapes.values())
    order = torch.randperm(universe, generator=torch.Generator().manual_seed(5))
    want = torch.empty(universe, dtype=torch.float64)
    want[order] = torch.arange(universe, 0, -1, dtype=torch.float64)
    monkeypatch.setattr(random_module, "_CHUNK", 97)  # many chunks, the last one short
    got = loc.scores(pre, ft, data, opts)
    assert torch.equal(torch.cat([got[n].reshape(-1) for n in shapes]), want)
