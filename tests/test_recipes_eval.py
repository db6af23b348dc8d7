"""Calibration / OOD / WiSE / PEFT recipes on a tiny model and toy data, plus their library pieces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tiny import write_sentiment_data

from skillgraft.data import Example, load_kshot
from skillgraft.data.label_map import check_label_map, map_examples
from skillgraft.errors import SkillgraftError
from skillgraft.graft import Graft, get_localizer
from skillgraft.graft.interpolate import interpolate
from skillgraft.models import build_scorer
from skillgraft.recipes import run_recipe
from skillgraft.train import FinetuneConfig, finetune

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TINY_FT = {"optimizer": "adamw", "lr": 3e-3, "steps": 16, "eval_every": 8, "freeze_embeddings": False}
TINY_LOC = {"sparsity": 0.01, "steps": 2, "eval_every": 1, "budgets": [0.01, 0.1], "micro_batch": 32}
SHORT = {**TINY_FT, "steps": 4, "eval_every": 0}



@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    """Toy SST-2 plus toy OOD sets: 'imdb' (labels neg/pos) and 'mpqa' (0/1), same word rule."""
    import json as _json

    root = write_sentiment_data(tmp_path_factory.mktemp("toy-ood"))
    write_sentiment_data(root, folder="mpqa", seed=1)
    other = write_sentiment_data(tmp_path_factory.mktemp("toy-imdb"), folder="imdb", seed=2)
    (root / "imdb").mkdir()
    with open(other / "imdb" / "test.jsonl") as f, open(root / "imdb" / "test.jsonl", "w") as out:
        for line in f:
            row = _json.loads(line)
            row["label"] = "pos" if row["label"] == "1" else "neg"
            out.write(_json.dumps(row) + "\n")
    return root


def tiny_overrides(tiny_bert, toy_root, **extra) -> dict:
    return {"model": str(tiny_bert), "data_dir": str(toy_root), "k": 8, "seeds": [13, 21], "test_limit": 40,
            "finetune": TINY_FT, "localize": TINY_LOC, **extra}


def test_calibration_recipe_tiny(tiny_bert, toy_root, tmp_path):
    over = tiny_overrides(tiny_bert, toy_root, tasks=["SST-2"],
                          retrain={"budget": 0.1, "finetune": SHORT}, bitfit={"finetune": SHORT})
    out = run_recipe(RECIPES / "calibration.yaml", tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    metrics = json.loads((out / "metrics.json").read_text())
    kinds = {r["kind"] for r in metrics["rows"]}
    assert {"pre", "head-only", "ft", "graft", "retrain", "bitfit"} <= kinds
    assert len(metrics["rows"]) == 2 * 7  # 2 seeds × (pre, head only, FT, 2 grafts, retrain, BitFit)
    ft = [r for r in metrics["rows"] if r["kind"] == "ft"]
    assert all(r["agreement"] == 1.0 for r in ft)
    report = (out / "report.md").read_text()
    assert "90.5 (0.4)" in report and "ECE reduction" in report  # paper's Table 2 SST-2 FT accuracy beside ours
    for f in ("metrics.csv", "summary.csv", "confidence_SST-2.png", "reliability_SST-2.png", "config.json"):
        assert (out / f).is_file(), f
    # second run reuses the cached fine-tuned models, regions and trained baselines
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    run_recipe(RECIPES / "calibration.yaml", tmp_path / "run2", overrides=over, cache=tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached
    assert any(n.startswith("regions-") for n in cached) and any(n.startswith("trained-retrain") for n in cached)


@pytest.fixture(scope="module")
def ft_pair(tiny_bert, toy_root):
    data = load_kshot("SST-2", 8, 13, toy_root, test_limit=40)
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head")
    finetune(ft, data.train, data.dev, FinetuneConfig(**TINY_FT), progress=False)
    return pre, ft, data


def _state(scorer):
    return {n: p.detach().clone() for n, p in scorer.named_parameters()}


def test_wise_endpoints_are_exact_and_restored(ft_pair):
    pre, ft, data = ft_pair
    before = _state(pre)
    ft_state = _state(ft)
    with interpolate(pre, ft, 1.0, head="interpolate") as s:
        assert all(torch.equal(p, ft_state[n]) for n, p in s.named_parameters())
    with interpolate(pre, ft, 0.0, head="interpolate") as s:
        assert all(torch.equal(p, before[n]) for n, p in s.named_parameters())
    with interpolate(pre, ft, 0.0) as s:  # head carried: α=0 is "head only"
        assert all(torch.equal(p, ft_state[n] if n.startswith("head.") else before[n]) for n, p in s.named_parameters())
    with interpolate(pre, ft, 0.5, head="interpolate") as s:
        n = "head.weight"
        assert torch.allclose(dict(s.named_parameters())[n], (before[n] + ft_state[n]) / 2, atol=1e-6)
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())  # restored exactly
    graft = Graft.from_models(pre, ft, get_localizer("movement").region(pre, ft, None, 0.05))
    graft.apply(pre)
    grafted = _state(pre)
    graft.revert(pre)
    with interpolate(pre, graft, 1.0) as s:
        assert all(torch.equal(p, grafted[n]) for n, p in s.named_parameters())
    with interpolate(pre, graft, 0.0, head="interpolate") as s:
        assert all(torch.equal(p, before[n]) for n, p in s.named_parameters())
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())
    with pytest.raises(SkillgraftError, match="alpha"):
        with interpolate(pre, ft, 1.5):
            pass


def test_masked_retraining_moves_only_the_region(ft_pair):
    from skillgraft.train.masked import finetune_masked

    pre, ft, data = ft_pair
    region = get_localizer("movement").region(pre, ft, None, 0.02)
    import copy

    scorer = copy.deepcopy(pre)
    for p in scorer.parameters():
        p.requires_grad_(True)
    before = _state(scorer)
    cfg = FinetuneConfig(optimizer="adamw", lr=1e-2, steps=6, eval_every=3, weight_decay=0.1, l1=1e-3,
                         freeze_embeddings=False)
    res = finetune_masked(scorer, data.train, data.dev, cfg, region=region, progress=False)
    masks = region.to_masks()
    moved_inside = 0
    for n, p in scorer.named_parameters():
        if n.startswith("head."):
            continue
        keep = ~masks[n] if n in masks else torch.ones_like(p, dtype=torch.bool)
        assert torch.equal(p[keep], before[n][keep]), n  # weight decay, momentum, L1: nothing outside moves
        if n in masks:
            moved_inside += int((p[masks[n]] != before[n][masks[n]]).sum())
    assert moved_inside > 0.5 * len(region)
    assert not torch.equal(scorer.head.weight, before["head.weight"])
    assert res.trainable_parameters == len(region)


def test_label_map_refusals():
    check_label_map("SST-2", "imdb", {"neg": "0", "pos": "1"})
    with pytest.raises(SkillgraftError, match="not mapped"):
        check_label_map("SST-2", "imdb", {"neg": "0"})
    with pytest.raises(SkillgraftError, match="not labels of imdb"):
        check_label_map("SST-2", "imdb", {"negative": "0", "pos": "1", "neg": "0"})
    with pytest.raises(SkillgraftError, match="not labels of SST-2"):
        check_label_map("SST-2", "imdb", {"neg": "negative", "pos": "1"})
    with pytest.raises(SkillgraftError, match="label names differ"):
        check_label_map("SST-2", "imdb", None)
    with pytest.raises(SkillgraftError, match="at least two"):
        check_label_map("QNLI", "MNLI", {"entailment": "entailment", "contradiction": None, "neutral": None})
    exs = [Example("a", 0, "b"), Example("c", 1, "d"), Example("e", 2, "f")]  # MNLI: contradiction, entailment, neutral
    mapped = map_examples("QNLI", "MNLI", exs, {"entailment": "entailment", "contradiction": "not_entailment",
                                                 "neutral": "not_entailment"})
    assert [e.label for e in mapped] == [0, 1, 0]  # QNLI labels: not_entailment, entailment
    dropped = map_examples("QNLI", "MNLI", exs, {"entailment": "entailment", "contradiction": "not_entailment",
                                                  "neutral": None})
    assert len(dropped) == 2
    with pytest.raises(SkillgraftError, match="pair task"):
        map_examples("SST-2", "MNLI", exs, {"entailment": "1", "contradiction": "0", "neutral": None})


def test_ood_recipe_refuses_unmappable_pair_before_training(tiny_bert, toy_root, tmp_path):
    over = tiny_overrides(tiny_bert, toy_root, transfers=[{"source": "SST-2", "targets": [
        {"task": "imdb", "labels": {"neg": "0", "positive": "1"}}]}])
    with pytest.raises(SkillgraftError, match="transfers\\[0\\].targets\\[0\\].*positive"):
        run_recipe(RECIPES / "ood.yaml", tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_ood_recipe_tiny(tiny_bert, toy_root, tmp_path):
    over = tiny_overrides(tiny_bert, toy_root, seeds=[13], transfers=[
        {"source": "SST-2", "targets": [{"task": "imdb", "labels": {"neg": "0", "pos": "1"}}, "mpqa"]}],
        retrain=None, bitfit=None, ood_limit=30)
    out = run_recipe(RECIPES / "ood.yaml", tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    rows = json.loads((out / "metrics.json").read_text())["rows"]
    assert {r["eval"] for r in rows} == {"SST-2 (ID)", "imdb", "mpqa"}
    assert {r["kind"] for r in rows} == {"pre", "head-only", "ft", "graft"}
    assert {(r["eval"], r["n"]) for r in rows} == {("SST-2 (ID)", 40), ("imdb", 30), ("mpqa", 30)}
    report = (out / "report.md").read_text()
    assert "imdb acc" in report and "81.5 (0.7)" in report  # Table 3 SST-2 → IMDb grafting, quoted


@pytest.mark.figures("wise_*.png")  # the two WiSE figures are drawn (their size); the others: placeholders
def test_wise_recipe_tiny(tiny_bert, toy_root, tmp_path):
    over = tiny_overrides(tiny_bert, toy_root, seeds=[13], alphas=[0, 0.5, 1], graft_budgets=[0.1],
                          transfers=[{"source": "SST-2", "targets": [{"task": "imdb",
                                                                      "labels": {"neg": "0", "pos": "1"}}]},
                                     {"source": "mpqa", "targets": ["SST-2"]}])
    out = run_recipe(RECIPES / "wise.yaml", tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    m = json.loads((out / "metrics.json").read_text())
    curves = {(r["curve"], r["alpha"]) for r in m["curves"] if r["source"] == "SST-2"}
    assert curves == {(c, a) for c in ("WiSE-FT", "WiSE-graft 0.1") for a in (0.0, 0.5, 1.0)}
    pts = {(p["curve"], p["alpha"]): p for p in m["points"] if p["source"] == "SST-2"}
    # α = 0 is the same model (head only) on both curves
    assert pts[("WiSE-FT", 0.0)]["imdb:score"] == pts[("WiSE-graft 0.1", 0.0)]["imdb:score"]
    assert (out / "wise_SST-2_to_imdb.png").stat().st_size > 1000
    assert (out / "wise_mpqa_to_SST-2.png").stat().st_size > 1000  # a second source with other eval sets
    assert (out / "points.csv").is_file() and "WiSE-graft" in (out / "report.md").read_text()


def test_peft_recipe_tiny(tiny_bert, toy_root, tmp_path):
    over = tiny_overrides(tiny_bert, toy_root, seeds=[13], lora_ranks=[1, 2], lora_finetune=SHORT,
                          ia3_finetune=SHORT, bitfit={"finetune": SHORT},
                          transfers=[{"source": "SST-2", "targets": ["mpqa"]}])
    out = run_recipe(RECIPES / "peft-baselines.yaml", tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    rows = json.loads((out / "metrics.json").read_text())["rows"]
    by = {r["model"]: r for r in rows if r["eval"] == "SST-2 (ID)"}
    assert {"LoRA r=1", "LoRA r=2", "IA3", "BitFit", "graft 0.01", "fine-tuned", "head only"} <= set(by)
    hidden, layers = 32, 2
    assert by["LoRA r=1"]["params"] == layers * 2 * 1 * (hidden + hidden)  # A and B on query and value
    assert by["LoRA r=2"]["params"] == 2 * by["LoRA r=1"]["params"]
    assert 0 < by["IA3"]["params"] < by["LoRA r=2"]["params"] * 10
    assert "Table 6" in (out / "report.md").read_text()


def test_peft_adapter_keeps_scorer_interface(tiny_bert):
    from skillgraft.pipeline.trained import delta_graft
    from skillgraft.train.adapters import AdapterConfig, add_adapter, merged_state

    scorer = build_scorer(str(tiny_bert), "SST-2", "head")
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    names = add_adapter(scorer, AdapterConfig(method="lora", r=2))
    assert names and all("lora_" in n for n in names)
    with torch.no_grad():
        for n, p in scorer.named_parameters():
            if "lora_B" in n:
                p.normal_()
    batch = scorer.collate([Example("good film", 1), Example("bad film", 0)])
    batch.pop("labels")
    out = scorer(**batch)
    graft = delta_graft(pre, merged_state(scorer))
    assert set(graft.region.indices) and all("query" in n or "value" in n for n in graft.region.indices)
    graft.apply(pre)
    assert torch.allclose(pre(**batch), out, atol=1e-5)  # merged delta reproduces the adapter model
    graft.revert(pre)
    with pytest.raises(SkillgraftError, match="lora or ia3|'lora' or 'ia3'"):
        add_adapter(scorer, AdapterConfig.build({"method": "houlsby"}))


def test_every_recipe_yaml_validates_against_its_spec():
    from skillgraft.recipes import ExperimentSpec, load_recipe

    files = sorted(RECIPES.glob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        _, spec = load_recipe(path)
        assert isinstance(spec, ExperimentSpec), path
        assert type(spec).build(spec.to_dict()) == spec  # the resolved spec reads back as itself


@pytest.mark.parametrize("name, nested, where", [
    ("calibration", {"retrain": {"budget": 1e-3, "finetune": {"stepz": 3}}}, r"retrain\.finetune\.stepz"),
    ("calibration", {"bitfit": {"finetun": {"lr": 0.1}}}, r"bitfit\.finetun"),
    ("ood", {"transfers": [{"source": "SST-2", "targets": [{"task": "imdb", "lables": {}}]}]},
     r"transfers\.0\.targets\.0\.lables"),
    ("ood", {"localize": {"budget": [1e-3]}}, r"localize\.budget"),
    ("wise", {"localize": {"stepz": 3}}, r"localize\.stepz"),
    ("peft-baselines", {"lora": {"rank": 4}}, r"lora\.rank"),
    ("peft-baselines", {"ia3_finetune": {"learning_rate": 1e-3}}, r"ia3_finetune\.learning_rate"),
])
def test_unknown_nested_field_is_refused_by_name(name, nested, where, tmp_path):
    import yaml

    from skillgraft.recipes import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load((RECIPES / f"{name}.yaml").read_text()), **nested}))
    with pytest.raises(SkillgraftError, match=rf"r\.yaml\.{where}: unknown field"):
        load_recipe(path)


def test_recipe_specs_resolve_their_defaults():
    from skillgraft.recipes.calibration import CalibrationSpec
    from skillgraft.recipes.ood import OodSpec
    from skillgraft.recipes.peft_baselines import PeftSpec
    from skillgraft.recipes.wise import WiseSpec

    cal = CalibrationSpec.build({"recipe": "calibration", "finetune": {"lr": 0.05, "steps": 40},
                                 "localize": {"budgets": [1e-3, 1e-2]},
                                 "retrain": {"finetune": {"steps": 20}}, "bitfit": True})
    assert cal.retrain.finetune == FinetuneConfig(lr=0.05, steps=20)  # the recipe's finetune, changed
    assert cal.retrain.budget is None and cal.finetune.lr == 0.05
    assert cal.bitfit.finetune == FinetuneConfig(optimizer="adamw", lr=1e-3, steps=400, eval_every=100,
                                                 weight_decay=0.0)  # BitFit's own defaults
    assert CalibrationSpec.build({"recipe": "calibration", "bitfit": {"finetune": {"steps": 7}}}).bitfit.finetune \
        == FinetuneConfig(optimizer="adamw", lr=1e-3, steps=7, eval_every=100, weight_decay=0.0)
    assert CalibrationSpec.build({"recipe": "calibration"}).finetune == FinetuneConfig()  # lr 0.1: one default
    with pytest.raises(SkillgraftError, match=r"x: retrain\.budget: 0\.5 is not among localize\.budgets"):
        CalibrationSpec.build({"recipe": "calibration", "localize": {"budgets": [1e-3]},
                               "retrain": {"budget": 0.5}}, where="x")

    transfers = [{"source": "sst-2", "targets": ["mpqa", {"task": "imdb", "labels": {"neg": 0, "pos": 1},
                                                          "limit": 5}]}]
    ood = OodSpec.build({"recipe": "ood", "test_limit": 40, "transfers": transfers})
    assert ood.ood_limit == 40 and [t.limit for t in ood.transfers[0].targets] == [40, 5]
    assert ood.transfers[0].source == "SST-2" and ood.transfers[0].targets[1].labels == {"neg": "0", "pos": "1"}
    assert OodSpec.build({"recipe": "ood", "test_limit": 40, "ood_limit": None, "transfers": transfers}).ood_limit \
        is None
    with pytest.raises(SkillgraftError, match=r"transfers\[0\]\.targets\[0\]: .*pair task|transfers\[0\].*cannot"):
        OodSpec.build({"recipe": "ood", "transfers": [{"source": "QNLI", "targets": ["SST-2"]}]})
    with pytest.raises(SkillgraftError, match=r"transfers\.0\.source: .*unknown task"):
        OodSpec.build({"recipe": "ood", "transfers": [{"source": "nope", "targets": ["SST-2"]}]})

    wise = WiseSpec.build({"recipe": "wise", "alphas": [1, 0, 0.5, 0.5], "transfers": transfers,
                           "localize": {"budgets": [1e-3, 7e-3]}, "graft_budgets": [7e-3]})
    assert wise.alphas == [0.0, 0.5, 1.0]
    with pytest.raises(SkillgraftError, match=r"graft_budgets: \['0\.002'\] are not among"):
        wise.replace(graft_budgets=[2e-3])
    with pytest.raises(SkillgraftError, match=r"alphas\.0: .*less than or equal to 1"):
        wise.replace(alphas=[1.5])

    peft = PeftSpec.build({"recipe": "peft-baselines", "transfers": transfers, "bitfit": False,
                           "lora_finetune": {"steps": 9}})
    assert peft.bitfit is None and peft.lora_finetune.lr == 5e-4 and peft.lora_finetune.steps == 9
    assert peft.ia3_finetune.lr == 3e-3 and peft.replace() == peft
    with pytest.raises(SkillgraftError, match=r"lora\.r: the LoRA ranks are `lora_ranks`"):
        PeftSpec.build({"recipe": "peft-baselines", "transfers": transfers, "lora": {"r": 4}})


def test_ood_sets_use_the_one_sampler(toy_root):
    from skillgraft.data import eval_subset, load_split
    from skillgraft.pipeline.ood import TargetSpec, ood_examples

    target = TargetSpec.build({"task": "imdb", "labels": {"neg": "0", "pos": "1"}, "limit": 30})
    got = ood_examples("SST-2", target, toy_root)
    raw = load_split("imdb", "test", toy_root)
    expected = eval_subset(map_examples("SST-2", "imdb", raw, {"neg": "0", "pos": "1"}), 30)
    assert got == expected and len(got) == 30 and {e.label for e in got} == {0, 1}


def test_docs_name_every_field_of_these_recipes():
    from skillgraft.recipes.calibration import CalibrationSpec
    from skillgraft.recipes.ood import OodSpec
    from skillgraft.recipes.peft_baselines import PeftSpec
    from skillgraft.recipes.wise import WiseSpec

    doc = (RECIPES.parent / "docs" / "recipes.md").read_text()
    for spec in (CalibrationSpec, OodSpec, WiseSpec, PeftSpec):
        for field in spec.model_fields:
            assert f"`{field}`" in doc, (spec.__name__, field)
