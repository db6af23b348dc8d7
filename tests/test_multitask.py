"""Multi-task fine-tuning, per-task views, joint-loss purification and forget-free continual learning."""

import json
import random

import pytest
import torch

from skillgraft.pipeline.continual import ContinualLearner
from skillgraft.verbs.continual import continual_add
from skillgraft.data import load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate import evaluate
from skillgraft.graft import Graft, LocalizeConfig, Region, get_localizer, localize
from skillgraft.train import FinetuneConfig
from skillgraft.train.multitask import JointScorer, MultiTaskScorer, finetune_region, multitask_finetune, tag

from tiny import FILLER, write_sentiment_data


def random_region(pre, budget, seed=0):
    return get_localizer("random").region(pre, None, None, budget, {"seed": seed})


TOPICS = {"1": ["war", "election"], "2": ["football", "tennis"], "3": ["market", "stocks"], "4": ["software", "chip"]}
FAST = FinetuneConfig(optimizer="adamw", lr=2e-3, steps=60, eval_every=30, freeze_embeddings=False, weight_decay=0.0)


def write_topic_data(root, folder="ag_news", n_train=160, n_test=80, seed=0):
    """A learnable toy 4-way topic task (labels 1..4, like ag_news)."""
    rng = random.Random(seed)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(root / folder / f"{split}.jsonl", "w") as f:
            for i in range(n):
                y = str(i % 4 + 1)
                words = rng.sample(FILLER, 4) + [rng.choice(TOPICS[y])]
                rng.shuffle(words)
                f.write(json.dumps({"text": " ".join(words), "label": y}) + "\n")
    return root



@pytest.fixture(scope="module")
def multi_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi-data")
    write_sentiment_data(root, "SST-2", seed=0)
    write_sentiment_data(root, "cr", seed=1)
    write_topic_data(root)
    return root


def kdata(root, task, k=8):
    d = load_kshot(task, k, 13, root, test_limit=40)
    return d


def test_views_share_one_body_and_round_trip(tiny_bert, tmp_path, multi_data):
    mt = MultiTaskScorer.build(str(tiny_bert), ["SST-2", "ag_news"], "head")
    assert mt["SST-2"].model is mt["ag_news"].model
    assert mt["ag_news"].head.out_features == 4
    names = [n for n, _ in mt.named_parameters()]
    assert "heads.SST-2.weight" in names and "heads.ag_news.weight" in names
    assert sum(n.startswith("model.") for n in names) == len(list(mt.model.parameters()))
    mt.save_pretrained(tmp_path / "mt")
    back = MultiTaskScorer.from_pretrained(tmp_path / "mt")
    assert back.tasks == ["SST-2", "ag_news"]
    ex = kdata(multi_data, "ag_news").test[:6]
    batch = mt["ag_news"].collate(ex)
    batch.pop("labels")
    with torch.no_grad():
        assert torch.allclose(mt["ag_news"](**batch), back["ag_news"](**batch))
    with pytest.raises(SkillgraftError, match="not in this multi-task model"):
        mt.view("QNLI")
    with pytest.raises(SkillgraftError, match="no multitask_config.json"):
        MultiTaskScorer.from_pretrained(tmp_path)


def test_multitask_loop_trains_both_tasks(tiny_bert, multi_data):
    mt = MultiTaskScorer.build(str(tiny_bert), ["SST-2", "ag_news"], "head")
    data = {t: kdata(multi_data, t) for t in ("SST-2", "ag_news")}
    heads = {t: mt[t].head.weight.detach().clone() for t in data}
    before = {t: evaluate(mt[t], data[t].test)[0]["accuracy"] for t in data}
    cfg = FAST.replace(steps=160, eval_every=80)
    res = multitask_finetune(mt, {t: (d.train, d.dev) for t, d in data.items()}, cfg, progress=False)
    assert set(res.task_steps) == {"SST-2", "ag_news"} and min(res.task_steps.values()) > 50
    assert sum(res.task_steps.values()) == 160
    for t in data:
        assert not torch.equal(heads[t], mt[t].head.weight)
        after = evaluate(mt[t], data[t].test)[0]["accuracy"]
        assert after > before[t] and after >= 0.6, (t, before[t], after)
    assert {"dev", "dev:SST-2", "dev:ag_news"} <= set(res.history[0])


def test_region_training_never_changes_other_coordinates(tiny_bert, multi_data):
    mt = MultiTaskScorer.build(str(tiny_bert), ["SST-2"], "head")
    d = kdata(multi_data, "SST-2")
    region = random_region(mt["SST-2"], 0.02, seed=1)
    start = {n: p.detach().clone() for n, p in mt["SST-2"].named_parameters()}
    cfg = FinetuneConfig(optimizer="sgd", lr=0.5, steps=20, eval_every=0, weight_decay=0.1)  # wd would move all
    finetune_region(mt, "SST-2", d.train, None, region, cfg, progress=False)
    masks = region.to_masks()
    moved_inside = 0
    for n, p in mt["SST-2"].named_parameters():
        if n.startswith("head."):
            assert not torch.equal(p, start[n])
            continue
        inside = masks[n] if n in masks else torch.zeros_like(p, dtype=torch.bool)
        assert torch.equal(p[~inside], start[n][~inside]), n  # bit-exact outside the region
        moved_inside += int((p[inside] != start[n][inside]).sum())
    assert moved_inside > 0.5 * len(region)


def test_joint_scorer_purifies_a_union(tiny_bert, multi_data):
    tasks = ["SST-2", "ag_news"]
    ft = MultiTaskScorer.build(str(tiny_bert), tasks, "head")
    data = {t: kdata(multi_data, t) for t in tasks}
    multitask_finetune(ft, {t: (d.train, None) for t, d in data.items()}, FAST, progress=False)
    pre = MultiTaskScorer.build(str(tiny_bert), tasks, "head")
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    joint_pre, joint_ft = JointScorer(pre, tasks), JointScorer(ft, tasks)
    train = [ex for t in tasks for ex in tag(t, data[t].train)]
    batch = joint_ft.collate(train[:3] + train[-3:])
    labels = batch.pop("labels")
    logits = joint_ft(**batch)
    assert logits.shape == (6, 4) and torch.isinf(logits[:3, 2:]).all() and torch.isfinite(logits[3:]).all()
    loss = torch.nn.functional.cross_entropy(logits, labels)
    assert torch.isfinite(loss)
    union = random_region(pre["SST-2"], 0.05, seed=0) | random_region(pre["SST-2"], 0.05, seed=1)
    res = localize(joint_pre, joint_ft, train, None, LocalizeConfig(steps=3, select_on="last"), base=union,
                   progress=False)
    assert res.base_size == len(union)
    assert res.history[0]["round:size"] == len(union)  # step 0 is the union itself
    assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters())  # working model restored


def test_continual_never_changes_coordinates_of_earlier_tasks(tiny_bert, multi_data, tmp_path):
    learner = ContinualLearner.create(str(tiny_bert), "head")
    tasks = ["ag_news", "SST-2", "cr"]
    data = {t: kdata(multi_data, t) for t in tasks}
    probe = learner._pre_view("ag_news")
    regions = {t: random_region(probe, 0.03, seed=i) for i, t in enumerate(tasks)}
    cfg = FinetuneConfig(optimizer="sgd", lr=0.5, steps=15, eval_every=0, weight_decay=0.1)
    snapshots, graft_values = [], []
    for t in tasks:
        learner.add_task(t, regions[t], data[t].train, data[t].dev, cfg, progress=False)
        snapshots.append({n: p.detach().clone() for n, p in learner.current.model.named_parameters()})
        graft_values.append({e["task"]: learner.graft(e["task"]).values for e in learner.entries})
    first_owned = learner.owned("ag_news").to_masks()
    for later in snapshots[1:]:
        for n, m in first_owned.items():
            name = n[len("model."):]
            assert torch.equal(later[name][m], snapshots[0][name][m]), n
    # every earlier task's inference graft is bit-identical after later tasks were learned
    for t in ("ag_news", "SST-2"):
        for name, v in graft_values[tasks.index(t)][t].items():
            assert torch.equal(v, graft_values[-1][t][name])
    assert learner.owned("SST-2") == regions["SST-2"] - regions["ag_news"]
    assert learner.union_through("cr") == regions["ag_news"] | regions["SST-2"] | regions["cr"]
    # outside every region the body is still pre-trained
    pre = dict(learner._pre_view("ag_news").named_parameters())
    all_regions = learner.union_through("cr").to_masks()
    for n, m in all_regions.items():
        assert torch.equal(dict(learner.current["ag_news"].named_parameters())[n][~m], pre[n][~m])
    learner.save(tmp_path / "state")
    back = ContinualLearner.load(tmp_path / "state")
    assert back.tasks == tasks and back.owned("cr") == learner.owned("cr")
    state = json.loads((tmp_path / "state" / "continual.json").read_text())
    assert [e["task"] for e in state["tasks"]] == tasks
    assert state["ownership"][1]["owned"] == len(learner.owned("SST-2"))
    assert (tmp_path / "state" / "owned" / "2-SST-2" / "region.safetensors").is_file()
    with pytest.raises(SkillgraftError, match="already learned"):
        back.add_task("cr", regions["cr"], data["cr"].train, None, cfg, progress=False)


def test_continual_add_learns_region_and_extends_state(tiny_bert, multi_data, tmp_path):
    state = tmp_path / "cl"
    loc = LocalizeConfig(sparsity=0.01, steps=3)
    kw = dict(k=8, seed=13, data_dir=multi_data, model=str(tiny_bert), finetune_config=FAST, localize_config=loc,
              test_limit=40, cache=tmp_path / "store", progress=False)
    e1 = continual_add(state, "ag_news", **kw)
    assert e1.order == 1 and e1.region_size > 0 and e1.test["n"] == 40 and e1.to_dict()["task"] == "ag_news"
    # γ comes from the store's stages (shared with `skillgraft graft` and the recipes): fine-tuning, then regions
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "store").iterdir()) == ["ft", "regions"]
    assert e1.entry["single_task"]["finetuned"].startswith("ft-ag_news-8-13-")
    Region.load(state / "regions" / "1-ag_news").save(tmp_path / "r")
    e2 = continual_add(state, "SST-2", region=tmp_path / "r", **kw)  # γ given: all of it owned by ag_news
    assert e2.owned_size == 0 and e2.shared_with_earlier == e1.region_size
    st = json.loads((state / "continual.json").read_text())
    hist = st["tasks"][0]["test_history"]
    assert [h["after"] for h in hist] == ["ag_news", "SST-2"] and hist[0]["score"] == hist[1]["score"]
    with pytest.raises(SkillgraftError, match="not a continual state"):
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "x").write_text("x")
        continual_add(tmp_path / "junk", "SST-2", **kw)
    g = ContinualLearner.load(state).graft("SST-2")
    assert isinstance(g, Graft) and len(g.region) == e1.region_size


def test_multitask_recipe_runs_end_to_end(tiny_bert, multi_data, tmp_path):
    import yaml

    from skillgraft.recipes import run_recipe

    cfg = {"recipe": "multitask", "model": str(tiny_bert), "tasks": ["SST-2", "cr", "ag_news"], "k": 8, "seed": 13,
           "data_dir": str(multi_data), "test_limit": 40,
           "finetune": {"optimizer": "adamw", "lr": 2e-3, "steps": 40, "eval_every": 20, "weight_decay": 0.0},
           "multitask": {"optimizer": "adamw", "lr": 2e-3, "steps": 90, "eval_every": 45, "weight_decay": 0.0},
           "localize": {"steps": 3, "eval_every": 1}, "bases": [0.0, 1.0e-3],
           "groups": [["SST-2", "cr"], ["ag_news"]], "purify": {"steps": 2}}
    (tmp_path / "mt.yaml").write_text(yaml.safe_dump(cfg))
    out = run_recipe(tmp_path / "mt.yaml", tmp_path / "run", cache=tmp_path / "cache")
    for f in ("report.md", "accuracy.csv", "matrices.csv", "unions.csv", "overlap_base-0.png",
              "relative_gain_base-0.001.png", "union_relative_gain.png", "purified_relative_gain.png"):
        assert (out / f).is_file(), f
    m = json.loads((out / "metrics.json").read_text())
    assert len(m["matrices"]) == 2 * 9 and len(m["unions"]) == 2 * 3
    diag = [r["overlap"] for r in m["matrices"] if r["region"] == r["task"] and r["base"] == 0.001]
    assert all(v == 1.0 for v in diag)
    assert "Relative gain" in (out / "report.md").read_text()


def test_continual_recipe_and_cli(tiny_bert, multi_data, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from skillgraft.cli import app
    from skillgraft.recipes import run_recipe

    fast = {"optimizer": "adamw", "lr": 2e-3, "steps": 30, "eval_every": 15, "weight_decay": 0.0}
    cfg = {"recipe": "continual", "model": str(tiny_bert), "tasks": ["ag_news", "SST-2"], "k": 8, "seed": 13,
           "data_dir": str(multi_data), "test_limit": 40, "finetune": fast, "continual_finetune": fast,
           "localize": {"sparsity": 0.01, "steps": 2}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = run_recipe(tmp_path / "c.yaml", tmp_path / "run", cache=tmp_path / "cache")
    m = json.loads((out / "metrics.json").read_text())
    methods = {r["method"] for r in m["rows"]}
    assert methods == {"single-task FT", "naive continual FT", "grafting continual"}
    for r in m["rows"]:
        if r["method"] == "grafting continual":  # forget-free: the score after all tasks = right after its own
            assert r["score_after_all"] == r["score_right_after_own_task"]
    assert "Table 4" in (out / "report.md").read_text() and (out / "state" / "continual.json").is_file()
    # the CLI extends the recipe's state with a new task, then shows it
    runner = CliRunner()
    res = runner.invoke(app, ["continual", "add", "--state", str(out / "state"), "--task", "cr", "--k", "8",
                              "--data-dir", str(multi_data), "--steps", "5", "--localize-steps", "2",
                              "--sparsity", "0.01", "--test-limit", "20"])
    assert res.exit_code == 0, res.output
    assert "as task #3" in res.output
    res = runner.invoke(app, ["continual", "show", str(out / "state")])
    assert res.exit_code == 0 and "cr" in res.output
    res = runner.invoke(app, ["continual", "show", str(tmp_path)])
    assert res.exit_code == 2 and "not a continual state" in res.output
    # `skillgraft run --progress` turns on every stage's progress bars; its stages come from the store
    res = runner.invoke(app, ["run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "again"),
                              "--cache", str(tmp_path / "cache"), "--progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "again" / "config.json").read_text())["progress"] is True
    assert json.loads((out / "config.json").read_text())["progress"] is False


def test_continual_recipe_resumes_each_step_from_the_store(tiny_bert, multi_data, tmp_path, monkeypatch):
    """Every continual stage is a store entry: a run interrupted in its second grafting step resumes there (the
    fine-tunings, regions, naive steps and the first grafting step are read back) and gives the same rows."""
    import shutil

    import yaml

    import skillgraft.pipeline.continual as pc
    import skillgraft.train.run as train_run
    from skillgraft.recipes import run_recipe

    fast = {"optimizer": "adamw", "lr": 2e-3, "steps": 6, "eval_every": 3, "weight_decay": 0.0}
    cfg = {"recipe": "continual", "model": str(tiny_bert), "tasks": ["ag_news", "SST-2"], "k": 8, "seed": 13,
           "data_dir": str(multi_data), "test_limit": 20, "finetune": fast, "continual_finetune": fast,
           "localize": {"sparsity": 0.01, "steps": 1}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    whole = json.loads((run_recipe(tmp_path / "c.yaml", tmp_path / "whole", cache=tmp_path / "a")
                        / "metrics.json").read_text())
    shutil.copytree(tmp_path / "a", tmp_path / "b",  # the fine-tunings, regions and naive steps are finished
                    ignore=lambda folder, names: [n for n in names if n.startswith("continual-graft")])
    real, trained = pc.finetune_region, []

    def interrupted(mt, task, *args, **kwargs):
        trained.append(task)
        if len(trained) == 2:
            raise KeyboardInterrupt
        return real(mt, task, *args, **kwargs)

    monkeypatch.setattr(pc, "finetune_region", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(tmp_path / "c.yaml", tmp_path / "run", cache=tmp_path / "b")
    assert not (tmp_path / "run").exists() and trained == ["ag_news", "SST-2"]
    steps = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "b").glob("continual-graft-*")
                   if (p / "key.json").is_file())
    assert steps == ["continual-graft-1-ag_news"]  # the interrupted step 2 left no entry

    def never(*args, **kwargs):
        raise AssertionError("a finished stage ran again")

    trained.clear()
    monkeypatch.setattr(pc, "finetune_region",
                        lambda mt, task, *a, **kw: trained.append(task) or real(mt, task, *a, **kw))
    monkeypatch.setattr(pc, "multitask_finetune", never)     # naive steps: from the store
    monkeypatch.setattr(train_run, "run_finetune", never)    # single-task fine-tunings: from the store
    resumed = json.loads((run_recipe(tmp_path / "c.yaml", tmp_path / "run", cache=tmp_path / "b")
                          / "metrics.json").read_text())
    assert trained == ["SST-2"]
    assert resumed["rows"] == whole["rows"] and resumed["ownership"] == whole["ownership"]


@pytest.mark.parametrize("name,bad,message", [
    ("multitask", {"group": [["SST-2"]]}, "multitask.yaml.group: unknown field"),
    ("multitask", {"purify": {"step": 3}}, "multitask.yaml.purify.step: unknown field"),
    ("multitask", {"multitask": {"lrr": 0.1}}, "multitask.yaml.multitask.lrr: unknown field"),
    ("multitask", {"groups": [["SST-2", "mr"]]}, "group ['SST-2', 'mr'] must name tasks of `tasks`"),
    ("multitask", {"tasks": ["SST-2", "nope"]}, "multitask.yaml.tasks: unknown task 'nope'"),
    ("multitask", {"tasks": ["SST-2"]}, "multitask.yaml.tasks"),
    ("multitask", {"localize": {"sparsity": 0.01}}, "localize.sparsity: set per γ_base"),
    ("continual", {"continual_fine_tune": {"lr": 0.1}}, "continual.yaml.continual_fine_tune: unknown field"),
    ("continual", {"localize": {"step": 3}}, "continual.yaml.localize.step: unknown field"),
    ("continual", {"init": "zero"}, "continual.yaml.init"),
    ("continual", {"tasks": ["SST-2", "sst-2"]}, "need distinct tasks"),
])
def test_multitask_and_continual_specs_refuse_bad_fields_before_any_work(tmp_path, name, bad, message):
    """A misspelt or bad field (top level or nested) is one line naming it; no output, no store entry."""
    import re

    from skillgraft.recipes import run_recipe

    with pytest.raises(SkillgraftError, match=re.escape(message)) as err:
        run_recipe(f"recipes/{name}.yaml", tmp_path / "out", cache=tmp_path / "cache",
                   overrides={"model": "/nonexistent/model", **bad})
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_recipe_finetune_sections_inherit_the_shared_finetune():
    """multitask / continual_finetune fields left out take `finetune`'s (multitask: not steps); one default lr."""
    from skillgraft.recipes.continual import ContinualSpec
    from skillgraft.recipes.multitask import MultitaskSpec

    ft = {"optimizer": "adamw", "steps": 30, "weight_decay": 0.0}
    mt = MultitaskSpec.build({"recipe": "multitask", "finetune": ft, "multitask": {"eval_every": 7}})
    assert mt.multitask.optimizer == "adamw" and mt.multitask.lr == FinetuneConfig(optimizer="adamw").lr
    assert mt.multitask.steps is None and mt.multitask.eval_every == 7 and mt.multitask.weight_decay == 0.0
    cl = ContinualSpec.build({"recipe": "continual", "finetune": ft})
    assert cl.continual_finetune == cl.finetune == FinetuneConfig(**ft)
    default = ContinualSpec.build({"recipe": "continual"})
    assert default.finetune.lr == default.continual_finetune.lr == FinetuneConfig().lr


def test_cli_continual_add_takes_its_settings_from_the_specs(monkeypatch, tmp_path):
    """One default per setting: no option given → FinetuneConfig() and LocalizeConfig(); bad values named."""
    from typer.testing import CliRunner

    import skillgraft.verbs.continual as continual_module
    from skillgraft.cli import app

    seen = {}

    def fake_add(state, task, **kw):
        seen.update(kw)
        return continual_module.ContinualResult.of({"task": task, "order": 1, "region_size": 3, "owned_size": 3,
                                                    "shared_with_earlier": 0, "test": {"score": 0.5}})

    monkeypatch.setattr(continual_module, "continual_add", fake_add)
    runner = CliRunner()
    base = ["continual", "add", "--state", str(tmp_path / "s"), "--task", "SST-2"]
    res = runner.invoke(app, base)
    assert res.exit_code == 0, res.output
    assert seen["finetune_config"] == FinetuneConfig() and seen["localize_config"] == LocalizeConfig()
    assert seen["cache"] is None  # the store: $SKILLGRAFT_CACHE or runs/cache
    res = runner.invoke(app, [*base, "--cache", str(tmp_path / "store")])
    assert res.exit_code == 0 and seen["cache"] == tmp_path / "store", res.output
    res = runner.invoke(app, [*base, "--optimizer", "adamw", "--steps", "7", "--localize-steps", "2",
                              "--sparsity", "0.01", "--localize-lr", "5"])
    assert res.exit_code == 0, res.output
    assert seen["finetune_config"] == FinetuneConfig(optimizer="adamw", steps=7)  # AdamW's own default lr
    assert seen["localize_config"] == LocalizeConfig(steps=2, sparsity=0.01, lr=5)
    for option, value in (("--lr", "-1"), ("--localize-steps", "-2"), ("--sparsity", "2")):
        res = runner.invoke(app, [*base, option, value])
        assert res.exit_code == 2 and option in res.output, res.output


def test_docs_name_every_field_of_the_multitask_and_continual_specs():
    from pathlib import Path

    from skillgraft.recipes.base import ExperimentSpec
    from skillgraft.recipes.continual import ContinualSpec
    from skillgraft.recipes.multitask import MultitaskSpec, PurifySpec

    doc = (Path(__file__).parents[1] / "docs" / "multitask.md").read_text()
    for spec in (MultitaskSpec, ContinualSpec, PurifySpec):
        for field in set(spec.model_fields) - set(ExperimentSpec.model_fields):
            assert f"`{field}`" in doc, (spec.__name__, field)


@pytest.mark.parametrize("recipe", ["continual", "multitask"])
def test_a_bf16_mixed_run_of_the_multi_task_recipes_keeps_its_own_store_entries(recipe, tiny_bert, multi_data,
                                                                                  tmp_path):
    """Run in fp32, then in bf16-mixed on the same store: the multi-task model and each continual step trained in
    bf16-mixed are entries of their own (keys naming the precision), never fp32's found again."""
    import yaml

    from skillgraft.recipes import run_recipe

    fast = {"optimizer": "adamw", "lr": 2e-3, "steps": 2, "eval_every": 0, "weight_decay": 0.0}
    cfg = {"recipe": recipe, "model": str(tiny_bert), "k": 8, "seed": 13, "data_dir": str(multi_data),
           "test_limit": 8, "finetune": fast}
    if recipe == "continual":
        cfg |= {"tasks": ["ag_news", "SST-2"], "continual_finetune": fast, "localize": {"sparsity": 0.01, "steps": 1}}
        kinds = ["continual-naive", "continual-graft"]
    else:
        cfg |= {"tasks": ["SST-2", "cr"], "multitask": fast, "localize": {"steps": 1, "eval_every": 1},
                "bases": [0.0], "groups": [["SST-2", "cr"]], "purify": {"steps": 1}}
        kinds = ["multitask"]
    for precision in ("fp32", "bf16-mixed"):
        (tmp_path / f"{precision}.yaml").write_text(yaml.safe_dump({**cfg, "precision": precision}))
        run_recipe(tmp_path / f"{precision}.yaml", tmp_path / precision, cache=tmp_path / "cache")
    for kind in kinds:
        keys = [json.loads((e / "key.json").read_text()) for e in (tmp_path / "cache").glob(f"{kind}-*")
                if (e / "key.json").is_file()]
        precisions = sorted(str(k.get("precision")) for k in keys if k.get("kind") == kind)
        assert precisions == (["None"] * 2 + ["bf16-mixed"] * 2 if recipe == "continual" else ["None", "bf16-mixed"])
