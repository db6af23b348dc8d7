import json

import math

import pytest
import torch

from skillgraft.data import load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate import evaluate
from skillgraft.graft import (ROUND, Budget, Graft, LocalizeConfig, Region, fingerprint, get_localizer, graftable_names,
                              localize, module_type, top_k_masks)
from skillgraft.graft.localizers.machinery.layouts import Dense
from skillgraft.graft.localizers.machinery.relaxations import Sigmoid
from skillgraft.models import build_scorer
from skillgraft.train import FinetuneConfig, finetune


@pytest.fixture(scope="module")
def pair(tiny_bert, toy_data):
    """(pre, ft, data): a tiny BERT and its fine-tuned copy on the toy task."""
    data = load_kshot("SST-2", 16, 13, toy_data)
    ft = build_scorer(str(tiny_bert), "SST-2", "head")
    finetune(ft, data.train, data.dev, FinetuneConfig(optimizer="adamw", lr=1e-3, steps=60, eval_every=20,
                                                      freeze_embeddings=True), progress=False)
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    return pre, ft, data


def top_movement(pre, ft, budget):
    return get_localizer("movement").region(pre, ft, None, budget)


def random_region(pre, budget, seed=0):
    return get_localizer("random").region(pre, None, None, budget, {"seed": seed})


def shapes():
    return {"a": (2, 3), "b": (4,)}


def test_region_algebra():
    A = Region(shapes(), {"a": [0, 1, 5], "b": [2]})
    B = Region(shapes(), {"a": [1, 2], "b": [2, 3]})
    assert len(A | B) == 6 and len(A & B) == 2 and len(A - B) == 2
    assert A.overlap(B) == pytest.approx(2 / 4) and B.overlap(A) == pytest.approx(2 / 4)
    assert A.iou(B) == pytest.approx(2 / 6)
    assert (A | B) - B == A - B
    assert A.density == pytest.approx(4 / 10)
    assert Region.from_masks(A.to_masks()) == A
    assert A.contains("a", 5) and not A.contains("a", 4)
    with pytest.raises(SkillgraftError, match="out of range"):
        Region(shapes(), {"b": [4]})
    with pytest.raises(SkillgraftError, match="not in its universe"):
        Region(shapes(), {"c": [0]})


def test_region_iou_and_indices_match_the_set_algebra():
    """iou counts |A ∩ B| by binary search (|A ∪ B| = |A| + |B| − |A ∩ B|): equal to the union and intersection built
    as regions, on random regions (tensors in one, both or neither); a region's indices are sorted, unique and its
    own copy whether they came sorted or not."""
    gen = torch.Generator().manual_seed(0)
    universe = {"a": (40, 5), "b": (300,), "c": (3,)}

    def draw():
        out = {}
        for name, shape in universe.items():
            if torch.rand(1, generator=gen) < 0.7:
                n = math.prod(shape)
                idx = torch.randint(0, n, (int(torch.randint(0, n, (1,), generator=gen)),), generator=gen)
                out[name] = torch.unique(idx)[::2] if torch.rand(1, generator=gen) < 0.5 else idx
        return Region(universe, out)

    for _ in range(50):
        a, b = draw(), draw()
        assert a.iou(b) == (len(a & b) / len(a | b) if len(a | b) else 0.0)
        for idx in a.indices.values():
            assert idx.dtype == torch.long and idx.is_contiguous() and bool((idx[1:] > idx[:-1]).all())
    given = torch.arange(5)
    region = Region({"b": (300,)}, {"b": given})
    given[0] = 9
    assert region.indices["b"].tolist() == [0, 1, 2, 3, 4]


def test_region_save_load(tmp_path):
    A = Region(shapes(), {"a": [0, 5], "b": [1]})
    A.save(tmp_path / "r")
    assert Region.load(tmp_path / "r") == A


def test_module_types():
    assert module_type("model.encoder.layer.3.attention.self.value.weight") == "attn.value"
    assert module_type("model.encoder.layer.3.intermediate.dense.weight") == "ffn.intermediate"
    assert module_type("model.encoder.layer.3.output.dense.bias") == "ffn.output"
    assert module_type("model.encoder.layer.3.attention.output.LayerNorm.weight") == "layernorm"
    assert module_type("model.model.layers.0.mlp.down_proj.weight") == "ffn.output"
    assert module_type("model.transformer.h.0.attn.c_attn.weight") == "attn.qkv"


def test_top_k_exact_with_ties():
    scores = {"a": torch.ones(3, 3), "b": torch.ones(5)}
    masks = top_k_masks(scores, 4)
    assert sum(int(m.sum()) for m in masks.values()) == 4
    assert sum(int(m.sum()) for m in top_k_masks(scores, 0).values()) == 0


def test_save_load_apply_revert_bit_exact(pair, tmp_path):
    pre, ft, _ = pair
    region = top_movement(pre, ft, 0.01)
    graft = Graft.from_models(pre, ft, region, {"task": "SST-2"})
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    graft.save_pretrained(tmp_path / "g")
    loaded = Graft.from_pretrained(tmp_path / "g")
    assert loaded.region == region and loaded.base_fingerprint == fingerprint(pre)
    loaded.apply(pre)
    p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
    for name, idx in region.indices.items():
        assert torch.equal(p_pre[name].view(-1)[idx], p_ft[name].view(-1)[idx])
        outside = torch.ones(p_pre[name].numel(), dtype=torch.bool)
        outside[idx] = False
        assert torch.equal(p_pre[name].view(-1)[outside], before[name].view(-1)[outside])
    assert torch.equal(p_pre["head.weight"], p_ft["head.weight"])  # the new head travels with the graft
    with pytest.raises(SkillgraftError, match="already applied"):
        loaded.apply(pre)
    loaded.revert(pre)
    for n, p in pre.named_parameters():
        assert torch.equal(p, before[n]), n
    cfg = json.loads((tmp_path / "g" / "graft_config.json").read_text())
    assert cfg["size"] == len(region) and cfg["carried_parameters"] == 2 * 32 + 2


def test_file_is_about_eight_bytes_per_parameter(pair, tmp_path):
    pre, ft, _ = pair
    region = top_movement(pre, ft, 0.2)
    g = Graft.from_models(pre, ft, region)
    g.carried = {}
    g.save_pretrained(tmp_path / "g")
    size = (tmp_path / "g" / "graft.safetensors").stat().st_size
    header = int.from_bytes((tmp_path / "g" / "graft.safetensors").read_bytes()[:8], "little") + 8
    assert (size - header) / len(region) == pytest.approx(8.0)
    assert header < 1024  # one packed indices tensor + one values tensor, whatever the number of tensors
    assert Graft.from_pretrained(tmp_path / "g").region == region
    # values of mixed dtypes fall back to per-tensor entries and still round-trip
    first = next(iter(g.values))
    g.values[first] = g.values[first].double()
    g.save_pretrained(tmp_path / "mixed")
    back = Graft.from_pretrained(tmp_path / "mixed")
    assert back.region == region and back.values[first].dtype == torch.float64


def test_wrong_base_is_refused(pair, tiny_models):
    pre, ft, _ = pair
    graft = Graft.from_models(pre, ft, top_movement(pre, ft, 0.01))
    other = build_scorer(str(tiny_models["bert"]), "SST-2", "head")
    with torch.no_grad():
        other.model.encoder.layer[0].output.dense.weight.add_(0.01)
    with pytest.raises(SkillgraftError, match="fingerprint"):
        graft.apply(other)
    graft.apply(other, force=True)
    graft.revert(other)
    llama = build_scorer(str(tiny_models["llama"]), "SST-2", "head")
    with pytest.raises(SkillgraftError, match="different architecture"):
        graft.apply(llama, force=True)


def test_architecture_mismatch_is_clear(pair, tiny_models):
    pre, _, _ = pair
    gpt2 = build_scorer(str(tiny_models["gpt2"]), "SST-2", "head")
    with pytest.raises(SkillgraftError, match="differ in architecture"):
        top_movement(pre, gpt2, 0.01)


def test_missing_graft_folder(tmp_path):
    with pytest.raises(SkillgraftError, match="not a graft folder"):
        Graft.from_pretrained(tmp_path)


def test_baselines_match_size(pair):
    pre, ft, _ = pair
    n = len(top_movement(pre, ft, 50))
    bias = get_localizer("bias")
    assert n == 50 and len(random_region(pre, 50)) == 50 and len(bias.region(pre, ft, None, 20)) == 20
    assert all(name.endswith("bias") for name in bias.region(pre, ft, None, 1.0, {"graftable": "bias"}).indices)
    assert random_region(pre, 50, seed=1) != random_region(pre, 50, seed=2)
    for bad in (0, 0.0, 1.5, -1):
        with pytest.raises(SkillgraftError, match="impossible"):
            top_movement(pre, ft, bad)


def test_lottery_ticket_zero_outside(pair, toy_data):
    pre, ft, data = pair
    graft = Graft.from_models(pre, ft, top_movement(pre, ft, 0.01))
    graft.apply(pre, outside="zero")
    name = graftable_names(pre)[0]
    p = dict(pre.named_parameters())[name]
    outside = torch.ones(p.numel(), dtype=torch.bool)
    outside[graft.region.indices.get(name, torch.empty(0, dtype=torch.long))] = False
    assert (p.view(-1)[outside] == 0).all()
    graft.revert(pre)


def test_localization_gradient_matches_autograd(pair):
    """The hand-written dL/dS equals autograd through θ_pre + γ(S)⊙Δ (functional_call)."""
    pre, ft, data = pair
    cfg = LocalizeConfig(sparsity=0.05, sigmoid_bias=2.0)
    names = graftable_names(pre)[:4]
    pre_state = {n: p.detach().clone() for n, p in pre.named_parameters()}
    batch = pre.collate(data.train[:8])
    labels = batch.pop("labels")
    # autograd reference
    S = {n: torch.rand(pre_state[n].shape, generator=torch.Generator().manual_seed(i)).requires_grad_(True)
         for i, n in enumerate(names)}
    ftp = dict(ft.named_parameters())
    delta = {n: ftp[n].detach() - pre_state[n] for n in names}
    base = top_k_masks({n: delta[n].abs() for n in names}, 10)
    params = dict(pre_state)
    params.update({n: ftp[n].detach() for n in pre_state if n.startswith("head.")})
    for n in names:
        s = torch.sigmoid(S[n] - cfg.sigmoid_bias)
        params[n] = pre_state[n] + torch.where(base[n], 1 - s, s) * delta[n]
    loss = torch.nn.functional.cross_entropy(torch.func.functional_call(pre, params, kwargs=batch), labels)
    loss.backward()
    # manual formula, as in localize()
    with torch.no_grad():
        for n in pre_state:
            if n.startswith("head."):
                dict(pre.named_parameters())[n].copy_(ftp[n])
    theta = {n: (pre_state[n] + (params[n].detach() - pre_state[n])).requires_grad_(True) for n in names}
    full = dict(pre.named_parameters())
    full = {k: v.detach() for k, v in full.items()}
    full.update(theta)
    loss2 = torch.nn.functional.cross_entropy(torch.func.functional_call(pre, full, kwargs=batch), labels)
    loss2.backward()
    for n in names:
        s = torch.sigmoid(S[n].detach() - cfg.sigmoid_bias)
        manual = theta[n].grad * delta[n] * (1 - 2 * base[n].float()) * s * (1 - s)
        assert torch.allclose(manual, S[n].grad, atol=1e-7, rtol=1e-4), n
    with torch.no_grad():
        for n, p in pre.named_parameters():
            p.copy_(pre_state[n])


def test_localize_restores_pre_and_learns(pair):
    pre, ft, data = pair
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    res = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.01, steps=6, eval_every=2),
                   progress=False)
    for n, p in pre.named_parameters():
        assert torch.equal(p, before[n]), n  # working model restored bit-exactly (incl. the head)
    assert res.base_size == round(0.01 * res.region.universe_size)
    assert [h["step"] for h in res.history] == [0, 2, 4, 6]
    assert len(res.region) == res.history[[h["step"] for h in res.history].index(res.best_step[ROUND])]["round:size"]
    assert res.step_seconds > 0


def test_localize_with_full_base_recovers_finetuned(pair):
    """γ_base = everything ⇒ the rounded graft is θ_ft: its accuracy equals the fine-tuned model's."""
    pre, ft, data = pair
    res = localize(pre, ft, data.train, None, LocalizeConfig(sparsity=1.0, steps=1), progress=False)
    graft = Graft.from_models(pre, ft, res.region)
    assert graft.region.density == 1.0
    graft.apply(pre)
    a, _ = evaluate(pre, data.test)
    graft.revert(pre)
    b, _ = evaluate(ft, data.test)
    assert a["accuracy"] == b["accuracy"]


def test_localize_budgets_exact_and_validation(pair):
    pre, ft, data = pair
    res = localize(pre, ft, data.train, data.dev, LocalizeConfig(sparsity=0.01, steps=2, budgets=[0.001, 0.02]),
                   progress=False)
    universe = res.region.universe_size
    assert len(res.regions[Budget.parse(0.001)]) == round(0.001 * universe)
    assert len(res.regions[Budget.parse(0.02)]) == round(0.02 * universe)
    for bad in ([0.0], [1.5], [-0.1]):
        with pytest.raises(SkillgraftError, match="impossible"):
            localize(pre, ft, data.train, None, LocalizeConfig.build({"budgets": bad}), progress=False)
    with pytest.raises(SkillgraftError, match="sparsity"):
        localize(pre, ft, data.train, None, LocalizeConfig.build({"sparsity": 2.0}), progress=False)


def test_working_state_is_memory_lean(pair):
    """Δ is kept in the model dtype and the base patch as booleans; S covers only graftable tensors."""
    pre, ft, _ = pair
    names = graftable_names(pre)
    layout = Dense(pre, ft, names)
    relax = Sigmoid()
    relax.start(layout, None, layout.top({n: d.abs() for n, d in layout.delta.items()}, 30), None, 0)
    assert all(layout.delta[n].dtype == dict(pre.named_parameters())[n].dtype for n in names)
    assert all(relax.base[n].dtype == torch.bool for n in names) and layout.count(relax.base) == 30
    assert set(relax.S) == set(names)


def test_union_policies(pair):
    """Graft.union is gone: compose (graft/compose.py) is the one way to combine grafts."""
    from skillgraft.graft.compose import compose

    pre, ft, _ = pair
    a = Graft.from_models(pre, ft, top_movement(pre, ft, 30))
    b = Graft.from_models(pre, ft, random_region(pre, 30, seed=0) | top_movement(pre, ft, 5))
    with pytest.raises(SkillgraftError, match="overlap"):
        compose([a, b])
    u = compose([a, b], policy="first")
    assert len(u.region) == len(a.region | b.region)
    assert not hasattr(Graft, "union")


# ---------------------------------------------------------------------------------------------- apply / revert safety
def _two_grafts(pre, ft):
    """Two grafts on different (overlapping) coordinates of the body, taken from ``ft``."""
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    a = Region(shapes, {names[0]: list(range(0, 40)), names[3]: [1, 5, 9]})
    b = Region(shapes, {names[0]: list(range(30, 70)), names[5]: [0, 2]})
    return Graft.from_models(pre, ft, a, {"task": "A"}), Graft.from_models(pre, ft, b, {"task": "B"})


def _state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(model, state):
    return all(torch.equal(p, state[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_applied_reverts_bit_exactly_after_an_exception(pair, error):
    from skillgraft.graft.graft import active_graft

    pre, ft, _ = pair
    g, _ = _two_grafts(pre, ft)
    before = _state(pre)
    with pytest.raises(error):
        with g.applied(pre) as model:
            assert model is pre and active_graft(pre) is g
            assert not _same(pre, before)
            raise error("boom")
    assert _same(pre, before) and active_graft(pre) is None
    with g.applied(pre, outside="zero"):
        assert not _same(pre, before)
    assert _same(pre, before)


def test_failed_apply_leaves_the_model_unchanged(pair):
    pre, ft, _ = pair
    g, _ = _two_grafts(pre, ft)
    before = _state(pre)
    bad_head = Graft(g.region, g.values, {**g.carried, "head.weight": torch.zeros(3, 32)}, g.base_model,
                     g.base_fingerprint)
    with pytest.raises(SkillgraftError, match="does not fit"):
        bad_head.apply(pre)
    assert _same(pre, before)
    # a failure while writing (after the checks passed): what was written is undone
    last = list(g.region.indices)[-1]
    broken = Graft(g.region, {**g.values, last: torch.empty(g.values[last].numel(), device="meta")}, g.carried,
                   g.base_model, g.base_fingerprint)
    with pytest.raises((RuntimeError, NotImplementedError)):
        broken.apply(pre)
    assert _same(pre, before)
    with pytest.raises(SkillgraftError, match="no graft is applied"):
        g.revert(pre)
    g.apply(pre)  # nothing is left marked as applied
    g.revert(pre)
    assert _same(pre, before)


def test_swap_skills_on_one_model(pair):
    pre, ft, _ = pair
    a, b = _two_grafts(pre, ft)
    before = _state(pre)
    with a.applied(pre):
        with_a = _state(pre)
        with pytest.raises(SkillgraftError, match="already applied"):
            b.apply(pre)
        with pytest.raises(SkillgraftError, match="another graft"):
            b.revert(pre)
    assert _same(pre, before)
    with b.applied(pre):
        with_b = _state(pre)
    assert _same(pre, before)
    with a.applied(pre):
        assert _same(pre, with_a)
    assert _same(pre, before) and not all(torch.equal(with_a[n], with_b[n]) for n in with_a)
    p_ft = dict(ft.named_parameters())
    for name, idx in b.region.indices.items():
        assert torch.equal(with_b[name].view(-1)[idx], p_ft[name].detach().view(-1)[idx])


def test_swaps_reuse_the_fingerprint_until_a_weight_changes(pair, monkeypatch):
    import skillgraft.graft.identity as identity_module

    pre, ft, _ = pair
    a, b = _two_grafts(pre, ft)
    calls = []
    real = identity_module.fingerprint
    monkeypatch.setattr(identity_module, "fingerprint", lambda s, *a: calls.append(1) or real(s, *a))
    identity_module.forget_fingerprint(pre)
    for g in (a, b, a, b):
        with g.applied(pre):
            pass
    assert len(calls) == 1  # computed once, then reused: a swap is a few index writes
    weight = dict(pre.named_parameters())[graftable_names(pre)[0]]
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.add_(0.5)  # the base changes in place: the cached fingerprint is no longer valid
    with pytest.raises(SkillgraftError, match="fingerprint"):
        a.apply(pre)
    assert len(calls) == 2
    with torch.no_grad():
        weight.copy_(saved)
    with a.applied(pre):
        pass
    assert len(calls) == 3


def test_save_pretrained_refuses_an_existing_folder(pair, tmp_path):
    pre, ft, _ = pair
    a, b = _two_grafts(pre, ft)
    a.save_pretrained(tmp_path / "g")
    with pytest.raises(SkillgraftError, match="already exists"):
        b.save_pretrained(tmp_path / "g")
    assert Graft.from_pretrained(tmp_path / "g").metadata.to_dict() == {"task": "A"}
    b.save_pretrained(tmp_path / "g", overwrite=True)
    assert Graft.from_pretrained(tmp_path / "g").metadata.to_dict() == {"task": "B"}


def test_a_changed_base_never_gets_a_stale_backup(pair):
    """The θ_pre values a graft backed up are reused only while the base is known unchanged."""
    pre, ft, _ = pair
    a, _ = _two_grafts(pre, ft)
    with a.applied(pre):
        pass
    weight = dict(pre.named_parameters())[next(iter(a.region.indices))]
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.add_(1.0)  # every coordinate of a region tensor changes
    changed = _state(pre)
    with a.applied(pre, force=True):
        pass
    assert _same(pre, changed)  # restored to the changed values, not to the first backup
    with torch.no_grad():
        weight.copy_(saved)


def test_backup_follows_region_changes_and_grafted_bases_are_refused(pair):
    pre, ft, _ = pair
    a, _ = _two_grafts(pre, ft)
    before = _state(pre)
    with a.applied(pre):
        with pytest.raises(SkillgraftError, match="has a graft applied"):
            Graft.from_models(pre, ft, a.region)  # its fingerprint would be the grafted model's
    name = next(iter(a.region.indices))
    a.region.indices[name].add_(1)  # moved in place: the cached θ_pre backup no longer matches
    with a.applied(pre):
        pass
    assert _same(pre, before)


def test_views_sharing_a_body_share_the_applied_state(tiny_bert):
    """Two task views of one multi-task body: a graft applied through one blocks the other (one body, one graft)."""
    from skillgraft.graft.graft import active_graft
    from skillgraft.train.multitask import MultiTaskScorer

    mt = MultiTaskScorer.build(str(tiny_bert), ["SST-2", "ag_news"], "head")
    sst, ag = mt.view("SST-2"), mt.view("ag_news")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=1)
    with torch.no_grad():
        for p in ft.model.parameters():
            p.add_(0.01)
    g, _ = _two_grafts(sst, ft)
    before = _state(ag)
    with g.applied(sst):
        assert active_graft(ag) is g
        with pytest.raises(SkillgraftError, match="already applied"):
            g.apply(ag)
    assert active_graft(ag) is None and _same(ag, before)
