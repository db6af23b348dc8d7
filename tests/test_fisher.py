import json
import re

import pytest
import torch

from skillgraft.data import load_kshot
from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.fisher import (aggregate_layers, block_names, fim_layer_scores, fisher_diagonal, rank_correlation,
                               ranking_stability, resolve_layer_spec)
from skillgraft.graft import get_localizer, graftable_names
from skillgraft.models import build_scorer
from skillgraft.train import AutoRGN, FinetuneConfig, Snapshots, finetune




EXAMPLES = [Example("the movie was great", 1), Example("bad plot really boring it is a film", 0),
            Example("fine", 1), Example("it is a dull story", 0), Example("lovely acting", 1)]


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    scale = max(float(t.abs().max()) for t in b.values())
    assert scale > 0
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=1e-3, atol=1e-6 * scale), n


@pytest.mark.parametrize("kind,mode", [("bert", "head"), ("bert", "prompt"), ("gpt2", "causal"), ("gpt2", "head")])
@pytest.mark.parametrize("fisher_kind", ["empirical", "true"])
def test_vectorised_fisher_equals_loop(tiny_models, kind, mode, fisher_kind):
    scorer = build_scorer(str(tiny_models[kind]), "SST-2", mode)
    fast = fisher_diagonal(scorer, EXAMPLES, kind=fisher_kind, chunk_size=2)  # several padded chunks
    ref = fisher_diagonal(scorer, EXAMPLES, kind=fisher_kind, method="loop")
    _close(fast, ref)
    assert all(n.startswith("model.") for n in fast)  # default: every tensor of scorer.model
    assert sum(float(t.sum()) for t in fast.values()) > 0
    assert scorer.model.config._attn_implementation != "skillgraft_vmap"  # attention restored
    # per-example gradients from one batched backward + layer hooks (Linear/LayerNorm/Conv1D tensors)
    layered = [n for n in ref if ".layer." in n or ".h." in n]  # the transformer blocks
    hooked = fisher_diagonal(scorer, EXAMPLES, kind=fisher_kind, method="hooks", chunk_size=2, names=layered)
    _close(hooked, {n: ref[n] for n in layered})


@pytest.mark.parametrize("kind", ["bert", "roberta", "gpt2", "llama", "llama3", "qwen3"])
def test_hooks_fisher_covers_the_whole_body(tiny_models, kind, monkeypatch):
    """Closed-form per-example gradients for every body tensor: Linear/Conv1D, LayerNorm/RMSNorm and the
    embedding tables (word, position — shared [1, T] position ids included — and token type)."""
    import skillgraft.fisher.fisher as F

    scorer = build_scorer(str(tiny_models[kind]), "SST-2", "head")
    ref = fisher_diagonal(scorer, EXAMPLES, kind="true", method="loop")
    monkeypatch.setattr(F, "_fisher_vmap", lambda *a, **k: pytest.fail("fell back to vmap"))
    hooked = fisher_diagonal(scorer, EXAMPLES, kind="true", method="hooks", chunk_size=3)
    _close(hooked, ref)
    embeddings = [n for n in ref if "embed" in n or ".wte." in n or ".wpe." in n]
    assert embeddings and all(float(hooked[n].sum()) > 0 for n in embeddings)


def test_hooks_fisher_refuses_tied_weights_and_auto_falls_back(tiny_bert):
    scorer = build_scorer(str(tiny_bert), "SST-2", "prompt")  # MLM decoder tied to the word embeddings
    with pytest.raises(SkillgraftError, match="tied"):
        fisher_diagonal(scorer, EXAMPLES, method="hooks")
    _close(fisher_diagonal(scorer, EXAMPLES, method="auto", chunk_size=2),
           fisher_diagonal(scorer, EXAMPLES, method="loop"))


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_fisher_traces_equal_the_summed_loop_diagonal(tiny_models, kind, monkeypatch):
    import skillgraft.fisher.fisher as F

    scorer = build_scorer(str(tiny_models[kind]), "SST-2", "head")
    ref = fisher_diagonal(scorer, EXAMPLES, method="loop")
    monkeypatch.setattr(F, "_fisher_vmap", lambda *a, **k: pytest.fail("fell back to vmap"))
    traces = F.fisher_traces(scorer, EXAMPLES, F.FisherConfig(chunk_size=2))
    assert traces.keys() == ref.keys()
    for n, t in ref.items():
        assert traces[n] == pytest.approx(float(t.double().sum()), rel=1e-3, abs=1e-9), n
    scores = fim_layer_scores(scorer, EXAMPLES)  # sum aggregation: from the traces
    assert scores.scores == pytest.approx(aggregate_layers(ref, scorer).scores, rel=1e-3)
    with pytest.raises(SkillgraftError, match="diagonal"):
        aggregate_layers(traces, scorer, aggregate="frobenius")


@pytest.mark.parametrize("tokens", [3, 40])  # Gram form (T² (in+out) < in·out) and the explicit product
def test_per_example_squares_of_a_linear_layer(tokens):
    from skillgraft.fisher.fisher import _accumulate_squares

    layer = torch.nn.Linear(16, 24)
    x, delta = torch.randn(5, tokens, 16), torch.randn(5, tokens, 24)
    grads = torch.einsum("bto,bti->boi", delta, x)
    diag = {"weight": torch.zeros(24, 16), "bias": torch.zeros(24)}
    _accumulate_squares(layer, x, delta, diag)
    assert torch.allclose(diag["weight"], grads.pow(2).sum(0), rtol=1e-4)
    assert torch.allclose(diag["bias"], delta.sum(1).pow(2).sum(0), rtol=1e-4)
    trace = {"weight": torch.zeros(()), "bias": torch.zeros(())}
    _accumulate_squares(layer, x, delta, trace, trace=True)
    assert float(trace["weight"]) == pytest.approx(float(grads.pow(2).sum()), rel=1e-4)
    assert float(trace["bias"]) == pytest.approx(float(diag["bias"].sum()), rel=1e-4)


def test_true_fisher_is_expectation_and_sampled_is_seeded(tiny_bert):
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    names = [n for n, _ in scorer.named_parameters() if "layer.0.output.dense" in n]
    # with two labels, E_y[(∇log p_y)²] = Σ_y p_y (∇log p_y)²; check against the explicit formula
    true = fisher_diagonal(scorer, EXAMPLES[:2], kind="true", names=names, method="loop")
    manual = {n: torch.zeros_like(t) for n, t in true.items()}
    scorer.eval()
    for ex in EXAMPLES[:2]:
        for y in (0, 1):
            e = Example(ex.text_a, y)
            with torch.no_grad():
                p = torch.softmax(scorer(**{k: v for k, v in scorer.collate([e]).items() if k != "labels"}), -1)[0, y]
            emp = fisher_diagonal(scorer, [e], kind="empirical", names=names, method="loop")
            for n in names:
                manual[n] += float(p) * emp[n] / 2
    _close(true, manual)
    a = fisher_diagonal(scorer, EXAMPLES, kind="sampled", names=names, seed=3)
    b = fisher_diagonal(scorer, EXAMPLES, kind="sampled", names=names, seed=3)
    _close(a, b)


def test_fisher_leaves_model_state_alone(tiny_bert):
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    scorer.train()
    scorer.model.eval()  # a mixed state must come back exactly
    before = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    flags = {n: p.requires_grad for n, p in scorer.named_parameters()}
    fisher_diagonal(scorer, EXAMPLES)
    assert scorer.training and not scorer.model.training
    assert flags == {n: p.requires_grad for n, p in scorer.named_parameters()}
    assert all(torch.equal(before[n], p) for n, p in scorer.named_parameters())


def test_fisher_bad_input(tiny_bert):
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    with pytest.raises(SkillgraftError, match="kind"):
        fisher_diagonal(scorer, EXAMPLES, kind="exact")
    with pytest.raises(SkillgraftError, match="unknown parameter"):
        fisher_diagonal(scorer, EXAMPLES, names=["model.nope"])
    with pytest.raises(SkillgraftError, match="no examples"):
        fisher_diagonal(scorer, [])
    with pytest.raises(SkillgraftError, match="unknown option"):
        fisher_diagonal(scorer, EXAMPLES, chunk=3)


@pytest.fixture(scope="module")
def bert12(tmp_path_factory):
    from tiny import build_tiny

    return build_tiny("bert", tmp_path_factory.mktemp("bert12") / "bert12", layers=12, mlm_head=False)


def test_layer_name_collision_cannot_happen(bert12, toy_data):
    scorer = build_scorer(str(bert12), "SST-2", "head")
    blocks = block_names(scorer)
    assert len(blocks) == 12
    assert all(".layer.1." in n for n in blocks[1]) and not any(".layer.10." in n for n in blocks[1])
    scores = aggregate_layers({n: torch.ones_like(p) for n, p in scorer.named_parameters()}, scorer)
    assert len(set(scores.num_parameters)) == 1  # block 1 holds exactly one block's tensors
    # a FIM selection of block 1 trains nothing of blocks 10/11
    before = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    data = load_kshot("SST-2", 4, 13, toy_data)
    fake = {n: torch.full_like(p, 5.0 if n in blocks[1] else 1.0) for n, p in scorer.named_parameters()}
    layers = aggregate_layers(fake, scorer).top(1)
    assert layers == [1]
    finetune(scorer, data.train, None, FinetuneConfig(steps=3, eval_every=0, layers=layers, lr=0.5), progress=False)
    moved = {n for n, p in scorer.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all(n in blocks[1] or n.startswith("head.") for n in moved)
    assert any(n in blocks[1] for n in moved)


def test_fim_ranking_shape_and_order(tiny_bert):
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    s = fim_layer_scores(scorer, EXAMPLES)
    assert len(s.scores) == 2 and len(s.num_parameters) == 2 and all(x > 0 for x in s.scores)
    assert sorted(s.ranking()) == [0, 1]
    assert s.scores[s.ranking()[0]] >= s.scores[s.ranking()[1]]
    assert set(s.top(1)) | set(s.bottom(1)) == {0, 1}
    f = fim_layer_scores(scorer, EXAMPLES, aggregate="frobenius", normalize=True)
    assert f.aggregate == "frobenius" and f.normalize and len(f.scores) == 2
    # aggregation by hand: sum of entries vs sum of per-tensor Frobenius norms
    fisher = fisher_diagonal(scorer, EXAMPLES)
    blocks = block_names(scorer)
    assert aggregate_layers(fisher, scorer).scores[0] == pytest.approx(sum(float(fisher[n].sum()) for n in blocks[0]))
    assert aggregate_layers(fisher, scorer, aggregate="frobenius").scores[1] == pytest.approx(
        sum(float(fisher[n].norm()) for n in blocks[1]), rel=1e-6)
    with pytest.raises(SkillgraftError, match="aggregate"):
        aggregate_layers(fisher, scorer, aggregate="max")
    assert rank_correlation([1, 2, 3], [1, 2, 3]) == {"spearman": 1.0, "kendall": 1.0}
    assert rank_correlation([1, 2, 3], [3, 2, 1])["spearman"] == pytest.approx(-1.0)


def fish_region(pre, examples, budget):
    """The FISH localizer on θ_pre with its own head."""
    return get_localizer("fish").region(pre, None, examples, budget, {"head": "pre"})


def test_fish_region_has_exactly_k_coords(tiny_bert):
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    region = fish_region(pre, EXAMPLES, 37)
    assert len(region) == 37
    assert set(region.shapes) == set(graftable_names(pre, "body"))
    frac = fish_region(pre, EXAMPLES, 0.01)
    assert len(frac) == round(0.01 * frac.universe_size)
    assert fish_region(pre, EXAMPLES, 37).iou(region) == 1.0
    with pytest.raises(SkillgraftError, match="budget"):
        fish_region(pre, EXAMPLES, 0.0)


def test_resolve_layer_spec(tiny_bert, toy_data):
    kw = dict(task="SST-2", model=str(tiny_bert), mode="head", k=4, seed=13, data_dir=toy_data)
    top = resolve_layer_spec("fim:top-1", **kw)
    bottom = resolve_layer_spec("fim:bottom-1", **kw)
    assert len(top) == 1 and len(bottom) == 1 and set(top) | set(bottom) == {0, 1}
    assert resolve_layer_spec("fim:top-2", **kw) == [0, 1]
    assert resolve_layer_spec("fim-frob:top-1", **kw)[0] in (0, 1)
    r = resolve_layer_spec("random-1", **kw)
    assert r == resolve_layer_spec("random-1", **kw) and r[0] in (0, 1)
    assert resolve_layer_spec("1, 0", **kw) == [0, 1]
    for bad in ("fim:top-3", "fim:middle-1", "random-0", "fim:top-x", "5", "bogus:1"):
        with pytest.raises(SkillgraftError, match="layers"):
            resolve_layer_spec(bad, **kw)


def test_auto_rgn_sets_per_tensor_learning_rates(tiny_bert, toy_data):
    data = load_kshot("SST-2", 4, 13, toy_data)
    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    rgn = AutoRGN(record_every=1)
    snaps = Snapshots(scorer, [0, 2])
    finetune(scorer, data.train, None, FinetuneConfig(steps=3, eval_every=0), progress=False, callbacks=[rgn, snaps])
    mults = list(rgn.history[-1]["multipliers"].values())
    assert len(mults) > 10 and max(mults) == pytest.approx(1.0) and min(mults) < 0.5
    assert sorted(snaps.states) == [0, 2]
    rows, scores = ranking_stability({s: snaps.scorer_at(s) for s in (0, 2)}, EXAMPLES)
    assert [r["step"] for r in rows] == [0, 2] and rows[0]["spearman_vs_first"] == pytest.approx(1.0)
    assert len(scores[2].scores) == 2


def test_cli_fim_and_finetune_fim_layers(tiny_bert, toy_data, tmp_path):
    from typer.testing import CliRunner

    from skillgraft.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["fim", "--task", "SST-2", "--model", str(tiny_bert), "--k", "4", "--seed", "13",
                              "--data-dir", str(toy_data), "--out", str(tmp_path / "fim")])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "fim" / "fim.json").read_text())
    assert sorted(saved["ranking"]) == [0, 1] and (tmp_path / "fim" / "fim.png").stat().st_size > 0
    res = runner.invoke(app, ["fim", "--task", "SST-2", "--model", str(tiny_bert), "--k", "4", "--seed", "13",
                              "--data-dir", str(toy_data), "--method", "loop", "--out", str(tmp_path / "fim-loop")])
    assert res.exit_code == 0, res.output
    loop = json.loads((tmp_path / "fim-loop" / "fim.json").read_text())
    assert loop["fisher"]["method"] == "loop" and saved["fisher"]["method"] == "auto"
    assert loop["scores"] == pytest.approx(saved["scores"], rel=1e-3)
    res = runner.invoke(app, ["finetune", "--task", "SST-2", "--model", str(tiny_bert), "--k", "4", "--seed", "13",
                              "--data-dir", str(toy_data), "--layers", "fim:top-1", "--steps", "2",
                              "--eval-every", "0", "--out", str(tmp_path / "ft")])
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert cfg["finetune"]["layers"] == [saved["ranking"][0]]
    res = runner.invoke(app, ["fim", "--task", "SST-2", "--model", str(tiny_bert), "--k", "4",
                              "--data-dir", str(toy_data), "--aggregate", "max", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "aggregate" in res.output


def test_surgical_recipe_tiny(tiny_bert, toy_data, tmp_path):
    from skillgraft.recipes import run_recipe

    out = run_recipe("recipes/surgical.yaml", tmp_path / "surgical", cache=tmp_path / "cache", overrides={
        "model": str(tiny_bert), "data_dir": str(toy_data), "tasks": ["SST-2"], "seeds": [13], "k": 4,
        "layers_k": [1], "methods": ["full", "fim-top", "fim-bottom", "random", "auto-rgn"],
        "finetune": {"steps": 4, "eval_every": 0, "batch_size": 4}, "test_limit": 20, "fisher": {"n_examples": 8},
        "stability_steps": [0, 2, 4]})
    metrics = json.loads((out / "metrics.json").read_text())
    assert {r["method"] for r in metrics["rows"]} == {"full", "fim-top-1", "fim-bottom-1", "random-1", "auto-rgn"}
    full = next(r for r in metrics["rows"] if r["method"] == "full")
    top = next(r for r in metrics["rows"] if r["method"] == "fim-top-1")
    assert top["trainable_parameters"] < full["trainable_parameters"]
    assert metrics["stability"] and "spearman_vs_first" in metrics["stability"][0]
    report = (out / "report.md").read_text()
    assert "fim-top-1" in report and "Spearman" in report
    from skillgraft.recipes.surgical import task_averages

    agg = [{"task": t, "method": m, "score": [v], "ece": [0.1], "trainable_parameters": [p]}
           for t, m, v, p in [("a", "full", 0.8, 10), ("b", "full", 0.6, 10), ("a", "top", 0.9, 2),
                              ("b", "top", 0.5, 2)]]
    assert task_averages(agg) == [["full", "70.0", "10.0", "10", "2/2", 2], ["top", "70.0", "10.0", "2", "1/2", 2]]
    assert "## Average over tasks" in report
    assert (out / "results.csv").is_file() and (out / "surgical.png").is_file()


def test_fish_recipe_tiny(tiny_bert, toy_data, tmp_path):
    from skillgraft.recipes import run_recipe

    out = run_recipe("recipes/fish.yaml", tmp_path / "fish", cache=tmp_path / "cache", overrides={
        "model": str(tiny_bert), "data_dir": str(toy_data), "tasks": ["SST-2"], "seeds": [13], "k": 4,
        "finetune": {"steps": 6, "eval_every": 0, "batch_size": 4, "lr": 0.5}, "test_limit": 20,
        "sparsities": [0.01, 0.05], "localize": {"steps": 2}, "fisher": {"n_examples": 8},
        "heatmap_tasks": ["SST-2"], "tracking": {"task": "SST-2", "steps": [2, 4, 6], "learn_at": 4}})
    metrics = json.loads((out / "metrics.json").read_text())
    rows = metrics["rows"]
    assert {r["sparsity"] for r in rows} == {0.01, 0.05}
    assert all(0.0 <= r["iou_fish_learned"] <= 1.0 for r in rows)
    assert all(r["fish_size"] == r["learned_size"] == r["random_size"] for r in rows)
    assert [r["step"] for r in metrics["tracking"]] == [2, 4, 6]
    assert "IoU" in (out / "report.md").read_text()
    for f in ("fish.csv", "heatmap.png", "tracking.png", "tracking.csv"):
        assert (out / f).is_file(), f


@pytest.mark.parametrize("name,bad,message", [
    ("surgical", {"layer_k": [1]}, "surgical.yaml.layer_k: unknown field"),
    ("surgical", {"fisher": {"kindd": "true"}}, "surgical.yaml.fisher.kindd: unknown field"),
    ("surgical", {"finetune": {"lrr": 0.1}}, "surgical.yaml.finetune.lrr: unknown field"),
    ("surgical", {"methods": ["full", "fim-middle"]}, "surgical.yaml.methods.1"),
    ("surgical", {"layers_k": [0]}, "surgical.yaml.layers_k.0"),
    ("fish", {"sparsity": [0.1]}, "fish.yaml.sparsity: unknown field"),
    ("fish", {"tracking": {"steps": [2], "lern_at": 2}}, "fish.yaml.tracking.lern_at: unknown field"),
    ("fish", {"tracking": {"steps": [2, 4], "learn_at": 3}}, "learn_at=3 must be one of steps"),
    ("fish", {"localize": {"budgets": [0.1]}}, "localize.budgets: set by `sparsities`"),
    ("fish", {"sparsities": [0.0]}, "fish.yaml.sparsities.0"),
])
def test_surgical_and_fish_specs_refuse_bad_fields_before_any_work(tmp_path, name, bad, message):
    """A misspelt or bad field (top level or nested) is one line naming it; no output, no store entry."""
    from skillgraft.recipes import run_recipe

    with pytest.raises(SkillgraftError, match=re.escape(message)) as err:
        run_recipe(f"recipes/{name}.yaml", tmp_path / "out", cache=tmp_path / "cache",
                   overrides={"model": "/nonexistent/model", **bad})
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_docs_name_every_field_of_the_surgical_and_fish_specs():
    from pathlib import Path

    from skillgraft.recipes.base import ExperimentSpec, SeedsMixin
    from skillgraft.recipes.fish import FishSpec, TrackingSpec
    from skillgraft.recipes.surgical import SurgicalSpec

    doc = (Path(__file__).parents[1] / "docs" / "fisher.md").read_text()
    shared = set(ExperimentSpec.model_fields) | set(SeedsMixin.model_fields)
    for spec in (SurgicalSpec, FishSpec, TrackingSpec):
        for field in set(spec.model_fields) - shared:
            assert f"`{field}`" in doc, (spec.__name__, field)


def _precisions_by_kind(cache, kinds) -> dict:
    """Each store kind's entries' precision (None: fp32's key, which names none), sorted."""
    out = {}
    for kind in kinds:
        keys = [json.loads((e / "key.json").read_text()) for e in cache.glob(f"{kind}-*") if (e / "key.json").is_file()]
        out[kind] = sorted(str(k.get("precision")) for k in keys if k.get("kind") == kind)
    return out


@pytest.mark.parametrize("name", ["surgical", "fish"])
def test_a_bf16_mixed_recipe_run_keeps_its_own_store_entries(name, tiny_bert, toy_data, tmp_path):
    """Run in fp32, then in bf16-mixed on the same store: every stage of the second run is an entry of its own (its
    key names the precision), never the fp32 run's found again; fp32's keys name none."""
    from skillgraft.recipes import run_recipe

    base = {"model": str(tiny_bert), "data_dir": str(toy_data), "tasks": ["SST-2"], "seeds": [13], "k": 4,
            "test_limit": 8, "fisher": {"n_examples": 4}}
    if name == "surgical":
        over = {**base, "layers_k": [1], "methods": ["full"], "finetune": {"steps": 2, "eval_every": 0, "batch_size": 4},
                "stability_steps": [0, 2]}
        kinds = ["surgical", "surgical-stability"]
    else:
        over = {**base, "finetune": {"steps": 2, "eval_every": 0, "batch_size": 4}, "sparsities": [0.01],
                "localize": {"steps": 1}, "heatmap_tasks": [], "tracking": {"task": "SST-2", "steps": [2], "learn_at": 2}}
        kinds = ["fish-tracking"]
    for precision in ("fp32", "bf16-mixed"):
        run_recipe(f"recipes/{name}.yaml", tmp_path / precision, cache=tmp_path / "cache",
                   overrides={**over, "precision": precision})
    assert _precisions_by_kind(tmp_path / "cache", kinds) == {kind: ["None", "bf16-mixed"] for kind in kinds}
