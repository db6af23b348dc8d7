"""Tiny versions of every Gemma recipe (bench/fidelity/gemma-*.yaml): each file is loaded as it is, its model swapped
for a tiny random Gemma 3 written as a GGUF file (the path `gemma-3-270m` takes: converted once into the store), its
k, steps, test subset and budgets shrunk, and run end to end to a report with the rows and columns the real run
would have — never the runs themselves. And the generative recipe (issue 33.5) on its own: SFT on the completion
loss, the share of the loss drop recovered, refusals before any work, resume from the store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from skillgraft.errors import SkillgraftError
from skillgraft.graft import Budget
from skillgraft.recipes import run_recipe
from skillgraft.recipes import load_recipe
from tiny import write_imdb_test, write_pair_data, write_sentiment_data, write_topic_data

ROOT = Path(__file__).resolve().parents[1]
GEMMA = sorted((ROOT / "bench" / "fidelity").glob("gemma-*.yaml"))
SCALE = 100  # budgets × SCALE: a tiny body of ~50k parameters holds a region of every size


@pytest.fixture(scope="module")
def gemma_data(tmp_path_factory) -> Path:
    """Toy data for every task the Gemma recipes name: sentiment sets, imdb (test only, neg/pos), a 4-topic ag_news,
    two entailment pair sets (RTE, QNLI), a paraphrase set (MRPC) and two three-way NLI test sets (MNLI, SNLI)."""
    root = tmp_path_factory.mktemp("gemma-data")
    for i, folder in enumerate(("SST-2", "mr", "mpqa", "cr", "yelp_polarity")):
        write_sentiment_data(root, folder=folder, n_train=80, n_test=24, seed=i)
    write_topic_data(root)
    for i, folder in enumerate(("RTE", "QNLI")):
        write_pair_data(root, folder=folder, seed=20 + i)
    write_pair_data(root, folder="MRPC", seed=22, labels=("0", "1"))  # a paraphrase pair task, scored by F1
    for i, folder in enumerate(("MNLI", "SNLI")):  # QNLI's OOD sets (three labels; neutral dropped by the map)
        write_pair_data(root, folder=folder, seed=30 + i, n_train=0, three_way=True)
    write_imdb_test(root, tmp_path_factory.mktemp("toy-imdb"), n_test=24, seed=9)
    return root


@pytest.fixture(scope="module")
def converted_gemma(tiny_gemma, tmp_path_factory) -> Path:
    """A store holding the tiny GGUF's conversion (what a recipe's first use of the file makes): each run below
    starts from a copy of it, so every run takes the `gemma-3-270m` path — the GGUF file, its converted folder found
    in the store — without converting the same file again (the conversion itself: tests/test_gemma.py)."""
    from skillgraft.models.gguf import converted_folder, in_store

    root = tmp_path_factory.mktemp("gemma-store")
    with in_store(root):
        converted_folder(tiny_gemma)
    return root


def _store_with_conversion(converted: Path, cache: Path) -> Path:
    import shutil

    shutil.copytree(converted, cache, symlinks=True)
    return cache


def tiny_overrides(values: dict, model: Path, data: Path) -> dict:
    """The file's settings shrunk: its first data seed, k 4, 4 fine-tuning steps, 8 test (and OOD) examples,
    budgets × SCALE, 2 localizer steps, a Fisher over 4 examples and stability checkpoints within the 4 steps; its
    tasks (one of each kind), localizers, methods, fine-tunings and OOD transfers as they are."""
    over = {"model": str(model), "data_dir": str(data), "k": 4, "test_limit": 8, "seeds": values["seeds"][:1],
            "finetune": {**values.get("finetune", {}), "steps": 4, "eval_every": 2}}
    if "budgets" in values:
        over["budgets"] = [float(b) * SCALE for b in values["budgets"]]
    if "localizers" in values:
        short = {"steps": 2, "eval_every": 1}
        over["localizers"] = [{**loc, "options": {**loc.get("options", {}),
                                                  **(short if loc["name"] == "learned" else {})}}
                              for loc in values["localizers"]]
    if len(values["tasks"]) > 3:  # RTE is QNLI's kind (a two-way entailment pair): the tiny run keeps one of each kind
        over["tasks"] = [t for t in values["tasks"] if t != "RTE"]
    if values.get("ood_limit"):  # 8 rows of each OOD set too
        over["ood_limit"] = 8
    if values.get("dev_limit"):  # a seeded part of the (tiny) dev split, as the real run scores
        over["dev_limit"] = 3
    if values.get("grid"):
        over["grid"] = {**values["grid"], "steps": 2, "eval_every": 1, "test_limit": 4}
    if values["recipe"] == "surgical":
        over["fisher"] = {**values.get("fisher", {}), "n_examples": 4}
        over["stability_steps"] = [0, 2, 4]
    return over


def _models(spec) -> list[str]:
    return ["pre-trained", "fine-tuned"] + [f"{loc.title} {b.label}" for loc in spec.localizers for b in spec.budgets]


# Run under SKILLGRAFT_SLOW=1 only (every file still validates in make test, below): table2-b and -c are table2-a's
# recipe on other tasks; gemma-schedule-64 runs end to end in make test through its own runner
# (tests/test_paper_schedule.py::test_the_bench_runner_cell_by_cell); the two -fit files are those cells' recipes with
# the learned localizer at its defaults (the fit schedule: tests/test_fit.py) in place of the paper's fixed one.
_RUN_ELSEWHERE = {"gemma-table2-b", "gemma-table2-c", "gemma-schedule-64", "gemma-schedule-1024",
                  "gemma-schedule-64-fit", "gemma-schedule-64-fit-rest"}


def test_the_large_data_schedule_is_the_papers_capped_one():
    """gemma-schedule-1024 (issue 46's 4096-shot row at the K the shared SST-2 allows): 16·n·512 = 16,384 SGD steps,
    dev scored on a seeded 512 rows, the localizer's fixed trajectory on 128 sampled rows (its tiny run: slow)."""
    _, spec = load_recipe(ROOT / "bench" / "fidelity" / "gemma-schedule-1024.yaml")
    assert spec.finetune.resolved_steps(2, spec.k) == 16 * 2 * 512 and spec.k == 1024
    assert spec.data_spec("SST-2", 13).dev_limit == 512
    learned = spec.options_of(next(loc for loc in spec.localizers if loc.name == "learned"))
    assert (learned.batch_size, learned.select_on, learned.steps, learned.eval_every) == (128, "last", 100, 100)


def test_the_rest_of_the_grid_follows_the_issues_test_rule():
    """gemma-schedule-64-rest (issue 46's AGNews, QNLI, RTE, MRPC): full test sets up to 2,000 rows, else a seeded
    1,000; 16·n·k steps (AGNews' 4 labels: 4,096); dev on a seeded 128 rows."""
    _, spec = load_recipe(ROOT / "bench" / "fidelity" / "gemma-schedule-64-rest.yaml")
    assert set(spec.tasks) == {"ag_news", "QNLI", "RTE", "MRPC"} and spec.k == 64
    assert spec.finetune.resolved_steps(4, spec.k) == 4096 and spec.finetune.resolved_steps(2, spec.k) == 2048
    data = spec.data_spec("ag_news", 13)
    assert (data.test_limit, data.dev_limit) == (1000, 128)


def test_every_gemma_recipe_validates():
    assert len(GEMMA) >= 7
    for path in GEMMA:
        load_recipe(path)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow if p.stem in _RUN_ELSEWHERE else ())
                                  for p in GEMMA], ids=lambda p: p.stem)
def test_every_gemma_recipe_runs_tiny(path, tiny_gemma, converted_gemma, gemma_data, tmp_path):
    values = yaml.safe_load(path.read_text())
    assert values["model"] == "gemma-3-270m" and values.get("mode", "causal") == "causal"
    over = tiny_overrides(values, tiny_gemma, gemma_data)
    _, spec = load_recipe(path, over)
    cache = _store_with_conversion(converted_gemma, tmp_path / "cache")
    converted = sorted(cache.glob("gguf-*"))
    out = run_recipe(path, tmp_path / "run", overrides=over, cache=cache)
    assert sorted(cache.glob("gguf-*")) == converted  # the conversion was found, not made again
    metrics = json.loads((out / "metrics.json").read_text())
    report = (out / "report.md").read_text()
    rows = metrics["rows"]
    draws = {(r["task"], r["seed"]) for r in rows}
    if values["recipe"] == "paper":
        assert draws == {(t, s) for t in spec.tasks for s in spec.seeds_of(t)}
        for task, seed in draws:
            mine = [r for r in rows if (r["task"], r["seed"]) == (task, seed)]
            assert [r["model"] for r in mine] == _models(spec)  # causal mode: no head-only row
            ft_score = next(r["score"] for r in mine if r["kind"] == "ft")
            for r in mine:  # a share of FT needs FT to score above 0 (a tiny MRPC's F1 can be 0: no "yes" said)
                assert {"score", "ece", "agreement", "params"} <= set(r) and ("share_of_ft" in r) == (ft_score > 0)
        assert "Table 2 side by side" in report and "Localizers at equal size" in report
        assert {(t["localizer"], t["budget"]) for t in metrics["localizers"]} == \
            {(loc.title, b.label) for loc in spec.localizers for b in spec.budgets}
        targets = {(tr.source, tg.task) for tr in spec.ood if tr.source in spec.tasks for tg in tr.targets}
        assert {(r["source"], r["eval"]) for r in metrics["ood_rows"]} == targets
        ood_models = ["pre-trained", "fine-tuned"] + [f"{loc.title} {b.label}" for loc in spec.localizers_ood()
                                                      for b in spec.budgets]
        assert {r["model"] for r in metrics["ood_rows"]} == (set(ood_models) if targets else set())  # ood_localizers
        if targets:
            assert "Table 7" in report and (out / "ood.csv").is_file()
        if spec.grid is not None:
            check_grid(spec, metrics["grid_rows"], report)
        tuned = {r["finetune"] for r in metrics["finetune_rows"]}
        assert tuned == set(spec.finetunes)
        if tuned:
            assert "Fig. 5" in report
    elif values["recipe"] == "surgical":
        methods = {"full"} | {f"{m}-{k}" for m in spec.methods if m != "full" for k in spec.layers_k}
        assert draws == {(t, s) for t in spec.tasks for s in spec.seeds}
        for task, seed in draws:
            assert {r["method"] for r in rows if (r["task"], r["seed"]) == (task, seed)} == methods
        assert [r["step"] for r in metrics["stability"]] == [0, 2, 4]
        assert "fim-top-3" in report and (out / "fim.csv").is_file()
    else:
        assert values["recipe"] == "generative"
        assert draws == {(t, s) for t in spec.tasks for s in spec.seeds}
        for task, seed in draws:
            mine = [r for r in rows if (r["task"], r["seed"]) == (task, seed)]
            assert [r["model"] for r in mine] == _models(spec)
            for r in mine:
                assert {"loss", "loss_recovered", "exact_match", "token_accuracy", "ece", "agreement"} <= set(r)
        assert "loss drop recovered" in report
    assert (out / "summary.csv").is_file()
    if values["recipe"] in ("paper", "generative"):
        check_diagnostics(path, over, spec, tmp_path)


def check_grid(spec, grid_rows: list[dict], report: str) -> None:
    """Every (task, seed): one row per grid point (one chosen, the best dev score, ties to the first), then the
    chosen (batch, lr) on the full schedule (a screened grid), in the report's grid section."""
    for task in spec.tasks:
        for seed in spec.seeds_of(task):
            mine = [r for r in grid_rows if (r["task"], r["seed"]) == (task, seed)]
            points = [r for r in mine if r["chosen"] != "used"]
            assert [(r["batch_size"], r["lr"]) for r in points] == spec.grid.points()
            best = max(r["best_dev"] for r in points)
            chosen = [r for r in points if r["chosen"] is True]
            assert len(chosen) == 1 and chosen[0] is next(r for r in points if r["best_dev"] == best)
            assert all(r["steps"] == spec.grid.steps for r in points)
            if spec.grid.steps is not None:
                used = [r for r in mine if r["chosen"] == "used"]
                assert len(used) == 1
                assert (used[0]["batch_size"], used[0]["lr"]) == (chosen[0]["batch_size"], chosen[0]["lr"])
                assert used[0]["steps"] == spec.finetune.resolved_steps(2, spec.k)
    assert "Fine-tuning grid (chosen on dev)" in report and "Table 9" in report


def check_diagnostics(path: Path, over: dict, spec, tmp_path: Path) -> None:
    """bench/gemma_diagnostics.py on the run's first draw, from the run's store: its numbers recomputed here."""
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import gemma_diagnostics as gd

    task, seed = spec.tasks[0], spec.seeds[0]
    extra = ["--finetune", "AdamW"] if getattr(spec, "finetunes", None) else []
    args = [str(path), "--cache", str(tmp_path / "cache"), "--override", json.dumps(over), "--tasks", task, "--seeds",
            str(seed), "--fractions", "1e-3,1e-2", "--out-dir", str(tmp_path / "diag"), "--name", "d", *extra]
    assert gd.main(args) == 0
    draw = json.loads((tmp_path / "diag" / "gemma_diagnostics-d.json").read_text())["draws"][0]
    assert (draw["task"], draw["seed"]) == (spec.tasks[0], seed)
    assert (tmp_path / "diag" / "gemma_diagnostics-d.md").is_file()
    name, spec2 = gd.open_spec(str(path), over)
    if extra:
        spec2 = spec2.replace(finetune=spec2.finetune_of("AdamW").to_dict())
    from skillgraft.pipeline.store import Store
    from skillgraft.pipeline.variants import universe

    from skillgraft.recipes.base import placement_of

    # in the recipe's precision (a bf16-mixed recipe's fine-tuning is its own store entry)
    member = gd.open_member(name, spec2, Store(tmp_path / "cache"), task, seed, placement_of(spec2).resolve())

    pre, ft = dict(member.pre.named_parameters()), dict(member.ft.named_parameters())
    delta = torch.cat([(ft[n] - pre[n]).detach().double().reshape(-1) for n in universe(member.pre)])
    base = torch.cat([pre[n].detach().double().reshape(-1) for n in universe(member.pre)])
    assert draw["relative"]["all:body"]["rel_norm"] == pytest.approx(float(delta.norm() / base.norm()), rel=1e-6)
    for label, fraction in (("0.001", 1e-3), ("0.01", 1e-2)):
        top = draw["top_mass"][label]
        kept = delta.abs().topk(top["entries"]).values.sum() / delta.abs().sum()
        assert top["entries"] == round(fraction * delta.numel()) and top["share_of_abs_delta"] == pytest.approx(
            float(kept), rel=1e-6)
        assert sum(draw["top_layout"][label]["layer"].values()) == pytest.approx(1.0)
    learned = draw["learned"]  # the reference localizer's regions were in the store (the run made them)
    assert set(learned) == {b.label for b in spec.budgets}
    assert all(0.0 <= v["overlap_with_top"] <= 1.0 and sum(v["module"].values()) == pytest.approx(1.0)
               for v in learned.values())
    know = draw["knowledge"]
    assert set(know) == {"pre-trained:dev", "pre-trained:test", "fine-tuned:dev", "fine-tuned:test"}
    assert know["pre-trained:test"]["n"] == len(member.test)
    assert all(0.0 < v["label_mass"] <= 1.0 and 0.0 <= v["accuracy"] <= 1.0 for v in know.values())


def test_a_bf16_generative_recipe_keys_its_fine_tuning_and_rows_apart(tiny_gemma, converted_gemma, gemma_data,
                                                                      tmp_path):
    """The generative recipe in bf16-mixed: its SFT and its rows are store entries of their own (keys naming the
    precision), never an fp32 run's found again; in fp32 the keys hold no precision (the entries a store has)."""
    path = ROOT / "bench" / "fidelity" / "gemma-generative.yaml"
    over = tiny_overrides(yaml.safe_load(path.read_text()), tiny_gemma, gemma_data)
    cache = _store_with_conversion(converted_gemma, tmp_path / "cache")
    precisions = {}
    for precision in ("fp32", "bf16-mixed"):
        run_recipe(path, tmp_path / precision, overrides={**over, "precision": precision}, cache=cache)
        for kind in ("generative-ft", "generative-rows"):
            keys = [json.loads((e / "key.json").read_text()) for e in sorted(cache.glob(f"{kind}-*"))]
            precisions[precision, kind] = sorted(
                str((k if kind == "generative-ft" else k["setup"]).get("precision")) for k in keys)
    assert precisions[("fp32", "generative-ft")] == precisions[("fp32", "generative-rows")] == ["None"]
    assert precisions[("bf16-mixed", "generative-ft")] == precisions[("bf16-mixed", "generative-rows")] == [
        "None", "bf16-mixed"]


def test_diagnostics_refuse_what_the_store_lacks(tiny_gemma, gemma_data, tmp_path, capsys):
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import gemma_diagnostics as gd

    path = ROOT / "bench" / "fidelity" / "gemma-table2-a.yaml"
    over = json.dumps(tiny_overrides(yaml.safe_load(path.read_text()), tiny_gemma, gemma_data))
    out = tmp_path / "diag"
    for args, message in (([str(path), "--cache", str(tmp_path / "empty"), "--override", over],
                           "holds no fine-tuning of SST-2"),
                          ([str(ROOT / "bench" / "fidelity" / "gemma-surgical.yaml")], "has no grafts to diagnose"),
                          ([str(path), "--override", over, "--tasks", "ag_news"], "not among the recipe's tasks"),
                          ([str(path), "--override", over, "--finetune", "AdamW"], "not among the recipe's finetunes"),
                          ([str(path), "--fractions", "2"], "fractions in (0, 1]")):
        assert gd.main([*args, "--out-dir", str(out)]) == 2
        # the tiny GGUF's one-time conversion (its note and progress bar) may precede it, as each test has its own
        # store; the refusal itself is one line, the last, with no traceback
        err = capsys.readouterr().err
        lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
        assert "Traceback" not in err and message in lines[-1], err
        assert all(ln.startswith(("skillgraft: converting", "Converting")) for ln in lines[:-1]), err
    assert not out.exists()  # nothing written, nothing trained
    # nothing trained: the store holds at most the tiny GGUF's conversion (into the store given, as a run's would)
    held = sorted(p.name for p in (tmp_path / "empty").iterdir()) if (tmp_path / "empty").exists() else []
    assert all(name.startswith(("gguf-", ".gguf-")) for name in held), held


# ---------------------------------------------------------------------------------------------- the generative recipe
def generative_overrides(model, data, **extra) -> dict:
    return {"recipe": "generative", "model": str(model), "data_dir": str(data), "k": 4, "tasks": ["SST-2"],
            "seeds": [13], "test_limit": 12, "budgets": [0.01, 0.05],
            "finetune": {"optimizer": "adamw", "lr": 3e-3, "steps": 6, "eval_every": 3},
            "localizers": [{"name": "learned", "label": "learned", "options": {"steps": 3, "eval_every": 1}},
                           {"name": "movement", "label": "top"}], **extra}


def _write(tmp_path, values) -> Path:
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_generative_recipe_recovers_a_share_of_the_loss_drop(tiny_models, gemma_data, tmp_path):
    values = generative_overrides(tiny_models["gemma3"], gemma_data, tasks=["SST-2", "ag_news"],
                                  prompts={"ag_news": "{text}\nTopic:"})
    out = run_recipe(_write(tmp_path, values), tmp_path / "run", cache=tmp_path / "cache")
    metrics = json.loads((out / "metrics.json").read_text())
    rows = {(r["task"], r["model"]): r for r in metrics["rows"]}
    for task in ("SST-2", "ag_news"):
        pre, ft = rows[(task, "pre-trained")], rows[(task, "fine-tuned")]
        assert ft["loss"] < pre["loss"]  # SFT lowers the held-out completion loss
        assert pre["loss_recovered"] == 0.0 and ft["loss_recovered"] == 1.0
        for name in ("learned 0.01", "learned 0.05", "top 0.01", "top 0.05"):
            r = rows[(task, name)]
            assert r["loss_recovered"] == pytest.approx((pre["loss"] - r["loss"]) / (pre["loss"] - ft["loss"]))
            assert r["params"] == Budget.parse(r["budget"]).size(round(r["params"] / r["density"]))
        assert 0.0 <= ft["exact_match"] <= 1.0 and ft["agreement"] == 1.0
    assert rows[("ag_news", "fine-tuned")]["density"] == pytest.approx(1.0)  # the body: embeddings (and the tied
    # head) frozen, not counted
    report = (out / "report.md").read_text()
    assert "Prompt '{text}\\nTopic:'" in report and "[' terrible', ' great']" in report
    assert "[' World', ' Sports', ' Business', ' Tech']" in report
    assert {t["localizer"] for t in metrics["localizers"]} == {"learned", "top"}
    # every stage from the store: a second run adds no entry and gives the same rows
    before = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert sum(n.startswith("generative-ft") for n in before) == 2
    again = run_recipe(_write(tmp_path, values), tmp_path / "again", cache=tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == before
    assert json.loads((again / "metrics.json").read_text())["rows"] == metrics["rows"]


def test_generative_pairs_follow_the_causal_template(gemma_data):
    from skillgraft.recipes.generative import GenerativeSpec, pair_data

    spec = GenerativeSpec.build(generative_overrides("m", gemma_data, tasks=["SST-2", "ag_news"],
                                                     completions={"SST-2": [" bad", " good"]}))
    data, pairs = pair_data(spec, "SST-2", 13)
    assert pairs == {"prompt": None, "completions": [" bad", " good"], "exact_match": True}
    assert data.task.kind == "generative" and data.task.labels == (" bad", " good")
    assert all(ex.text_a.endswith(" It was") and ex.text_b == [" bad", " good"][ex.label] for ex in data.train)
    assert len(data.train) == 8 and len(data.dev) == 8 and len(data.test) == 12
    topic, _ = pair_data(spec, "ag_news", 13)
    assert topic.train[0].text_a.endswith(" Topic:")
    assert topic.task.labels == (" World", " Sports", " Business", " Tech")
    open_ended, _ = pair_data(spec.replace(exact_match=False), "SST-2", 13)
    assert open_ended.task.labels == ()  # open-ended: token accuracy, no candidates ranked


@pytest.mark.parametrize("bad, message", [
    ({"completions": {"SST-2": [" yes"]}}, r"completions\.SST-2: needs 2 distinct"),
    ({"completions": {"SST-2": [" a", " a"]}}, r"completions\.SST-2: needs 2 distinct"),
    ({"prompts": {"SST-2": "{txt} It was"}}, r"prompts\.SST-2: .* must use \{text\}"),
    ({"prompts": {"mr": "{text}"}}, r"prompts\.mr: not among the recipe's tasks"),
    ({"mode": "prompt"}, r"gen\.yaml\.mode"),
    ({"budgets": ["round"]}, "budgets must be sizes"),
    ({"localizers": [{"name": "movement"}, {"name": "movement"}]}, "two share a label"),
    ({"tasks": ["nope"]}, "unknown task"),
])
def test_generative_spec_refuses_bad_fields_before_any_work(bad, message, gemma_data, tmp_path):
    path = _write(tmp_path, generative_overrides("no-such-model", gemma_data, **bad))
    with pytest.raises(SkillgraftError, match=message):
        run_recipe(path, tmp_path / "out", cache=tmp_path / "cache")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_the_fine_tuning_loss_of_a_generative_scorer_is_its_completion_loss(tiny_models, gemma_data):
    """train.core's objective on a generative batch equals Scorer.loss (docs/generative.md)."""
    import torch

    from skillgraft.models import build_scorer
    from skillgraft.recipes.generative import GenerativeSpec, pair_data
    from skillgraft.train.core import objective

    spec = GenerativeSpec.build(generative_overrides(tiny_models["gemma3"], gemma_data))
    data, _ = pair_data(spec, "SST-2", 13)
    scorer = build_scorer(str(tiny_models["gemma3"]), data.task, "generative")
    batch = scorer.collate(data.train)
    labels = batch.pop("labels")
    out = scorer(**batch)
    assert out.shape == (len(data.train),)
    assert torch.allclose(objective(scorer, out, labels), scorer.loss({**batch, "labels": labels}))
    assert math.isfinite(float(objective(scorer, out, labels).detach()))


def test_docs_name_every_field_of_the_generative_spec():
    from skillgraft.recipes.generative import GenerativeSpec

    doc = (ROOT / "docs" / "recipes.md").read_text()
    for field in GenerativeSpec.model_fields:
        assert f"`{field}`" in doc, field
