"""The paper recipe (Table 2 setting) on a tiny BERT in prompt mode: rows, gap from pre-trained, the paper's
numbers beside ours, localizers compared at equal size, resume from the store, validation before any work; the
Table 7 OOD rows and the Fig. 5 fine-tunings beside Table 2 without changing its store entries."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from skillgraft.errors import SkillgraftError
from skillgraft.graft import Budget
from skillgraft.graft.selection import region_universe
from skillgraft.models import build_scorer
from skillgraft.recipes import run_recipe
from skillgraft.recipes import load_recipe
from skillgraft.recipes.paper import PaperSpec, ood_section
from skillgraft.train.config import DEFAULT_LR
from tiny import write_imdb_test, write_sentiment_data

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TINY_FT = {"optimizer": "adamw", "lr": 3e-3, "steps": 16, "eval_every": 8, "freeze_embeddings": False}
LOCALIZERS = [{"name": "learned", "label": "paper", "options": {"sparsity": 0.01, "steps": 2, "micro_batch": 32}},
              {"name": "straight-through", "options": {"steps": 2, "eval_every": 1, "micro_batch": 32}},
              {"name": "learned-adam", "label": "adam", "options": {"steps": 2, "budgets": [0.05], "sparsity": 0.01}}]


def overrides(tiny_bert, toy_data, **extra) -> dict:
    """Table 2 only (no OOD sets, no other fine-tunings) unless ``extra`` says otherwise."""
    return {"model": str(tiny_bert), "data_dir": str(toy_data), "k": 8, "tasks": ["SST-2"], "seeds": [13],
            "test_limit": 40, "finetune": TINY_FT, "budgets": [0.01, 0.05], "localizers": LOCALIZERS, "ood": [],
            "finetunes": {}, **extra}


@pytest.fixture(scope="module")
def ood_data(tmp_path_factory) -> Path:
    """Toy SST-2 plus the paper's SST-2 OOD sets: 'imdb' (labels neg/pos, test only) and 'yelp_polarity' (0/1)."""
    root = write_sentiment_data(tmp_path_factory.mktemp("toy-paper-ood"))
    write_sentiment_data(root, folder="yelp_polarity", seed=3)
    write_imdb_test(root, tmp_path_factory.mktemp("toy-imdb"), seed=2)
    return root


def test_paper_recipe_tiny(tiny_bert, toy_data, tmp_path):
    over = overrides(tiny_bert, toy_data)
    out = run_recipe(RECIPES / "paper.yaml", tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    metrics = json.loads((out / "metrics.json").read_text())
    rows = metrics["rows"]
    assert [r["model"] for r in rows] == ["pre-trained", "fine-tuned", "paper 0.01", "paper 0.05",
                                          "straight-through 0.01", "straight-through 0.05",
                                          "adam 0.05"]  # prompt mode: no head only; adam at its one budget
    universe = sum(math.prod(s) for s in region_universe(build_scorer(str(tiny_bert), "SST-2", "prompt")).values())
    ft, pre = rows[1]["score"], rows[0]["score"]
    for r in rows[2:]:
        assert r["params"] == Budget.parse(r["budget"]).size(universe)  # exact budgets for every localizer
        assert r["share_of_ft"] == pytest.approx(r["score"] / ft)
        if ft != pre:  # gap closed from the pre-trained model in prompt mode
            assert r["gap_closed"] == pytest.approx((r["score"] - pre) / (ft - pre))
    table = {(t["localizer"], t["budget"]): t for t in metrics["localizers"]}
    assert table[("paper", "0.01")]["vs_reference_points"] == 0.0
    st = table[("straight-through", "0.01")]
    assert st["vs_reference_points"] == pytest.approx(100 * (rows[4]["share_of_ft"] - rows[2]["share_of_ft"]))
    report = (out / "report.md").read_text()
    assert "90.5 (0.4)" in report and "89.7 (0.2)" in report  # the paper's SST-2 FT and graft accuracy beside ours
    assert "graft: paper at 0.05" not in report and "(graft: paper at 0.01)" in report  # largest ≤ 1e-4 … here 0.01
    assert "Localizers at equal size" in report and "Wall time" in report
    for f in ("metrics.csv", "summary.csv", "localizers.csv", "config.json"):
        assert (out / f).is_file(), f
    assert metrics["timings"][0]["evaluation"] >= 0 and "regions straight-through" in metrics["timings"][0]
    # a second run reads every stage back from the store: no new entries, the same rows
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert sum(n.startswith("regions-") for n in cached) == 3 and any(n.startswith("paper-rows") for n in cached)
    again = run_recipe(RECIPES / "paper.yaml", tmp_path / "run2", overrides=over, cache=tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached
    assert json.loads((again / "metrics.json").read_text())["rows"] == rows
    # a run stopped after its regions resumes there: only the rows are computed again
    for p in (tmp_path / "cache").iterdir():
        if p.name.startswith("paper-rows"):
            shutil.rmtree(p)
    third = run_recipe(RECIPES / "paper.yaml", tmp_path / "run3", overrides=over, cache=tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached
    assert json.loads((third / "metrics.json").read_text())["rows"] == rows


def test_paper_spec_checks_before_any_work(tiny_bert, toy_data, tmp_path):
    _, spec = load_recipe(RECIPES / "paper.yaml")
    assert spec.mode == "prompt" and spec.finetune.optimizer == "sgd" and spec.k == 64
    assert [b.label for b in spec.budgets] == ["1e-05", "0.0001", "0.001"]
    assert spec.seeds_of("SST-2") == [13, 21, 42] and spec.seeds_of("RTE") == [13]
    assert spec.localizers[0].name == "learned" and len(spec.localizers) >= 3
    # Table 7 and Fig. 5 as committed: the paper's transfers, SGD (= `finetune`) vs AdamW vs AdamW + L1
    assert spec.ood_limit == spec.test_limit and [t.source for t in spec.ood] == ["SST-2", "mpqa", "QNLI"]
    assert [tg.task for t in spec.ood for tg in t.targets] == ["imdb", "yelp_polarity", "SST-2", "yelp_polarity",
                                                               "MNLI", "SNLI"]
    assert all(tg.limit == spec.test_limit for t in spec.ood for tg in t.targets)
    assert spec.ood == PaperSpec.build({"recipe": "paper", "test_limit": spec.test_limit}).ood  # the spec's default
    _, ood = load_recipe(RECIPES / "ood.yaml")  # the OOD recipe measures the same transfers with the same label maps
    assert [(t.source, [(tg.task, tg.labels) for tg in t.targets]) for t in ood.transfers] == \
        [(t.source, [(tg.task, tg.labels) for tg in t.targets]) for t in spec.ood]
    assert list(spec.finetunes) == ["SGD", "AdamW", "AdamW+L1"] and spec.finetune_tasks == ["SST-2"]
    assert spec.finetune_of("SGD") == spec.finetune
    adamw, l1 = spec.finetune_of("AdamW"), spec.finetune_of("AdamW+L1")
    assert adamw.optimizer == "adamw" and adamw.lr == DEFAULT_LR["adamw"] and adamw.l1 == 0  # not SGD's lr
    assert l1 == adamw.replace(l1=l1.l1) and l1.l1 > 0
    bad = [{"localizers": [{"name": "straight-through", "options": {"stepz": 3}}]},
           {"localizers": [{"name": "lottery"}]}, {"budgets": ["round"]}, {"tasks": ["SST-3"]},
           {"localizers": [{"name": "learned"}, {"name": "learned"}]}, {"budget": [0.1]},
           {"localizers": [{"name": "movement", "options": {"budgets": [0.5]}}]},
           {"ood": [{"source": "SST-2", "targets": ["imdbx"]}]},
           {"ood": [{"source": "SST-2", "targets": [{"task": "imdb", "labels": {"neg": "0", "positive": "1"}}]}]},
           {"ood": [{"source": "SST-2", "targets": ["MNLI"]}]},
           {"finetunes": {"AdamW": {"optimzer": "adamw"}}}, {"finetunes": {"AdamW": {"optimizer": "adam"}}},
           {"finetunes": {"SGD": "sgd"}}, {"finetune_tasks": ["SST-3"]},
           {"ood": None},  # the default transfers: SST-2 → imdb, but the toy data has no imdb
           {"ood_localizers": ["learned"]},  # a name, not a label
           ]
    for extra, match in zip(bad, ["stepz", "unknown localizer 'lottery'", "round", "SST-3", "share a label",
                                  "budget", "among the recipe's budgets", "imdbx",
                                  r"ood\[0\]\.targets\[0\]: \['positive'\] are not labels of imdb",
                                  "single task but MNLI is a pair task", r"finetunes\.AdamW\.optimzer: unknown field",
                                  r"finetunes\.AdamW\.optimizer", "finetunes.SGD", "SST-3", "imdb",
                                  r"ood_localizers: 'learned' is not the label of a localizer \(labels: \['paper'"],
                                 strict=True):
        over = overrides(tiny_bert, toy_data, **extra)
        if extra == {"ood": None}:
            over.pop("ood")
        with pytest.raises(SkillgraftError, match=match) as e:
            run_recipe(RECIPES / "paper.yaml", tmp_path / "never", overrides=over, cache=tmp_path / "cache")
        assert "\n" not in str(e.value), str(e.value)  # one line
        assert not (tmp_path / "never").exists() and not (tmp_path / "cache").exists()


def test_paper_recipe_ood_and_optimizers(tiny_bert, ood_data, tmp_path):
    """Table 7 rows on the default transfers' SST-2 sets and a second fine-tuning, beside Table 2's unchanged
    store entries: a Table 2 run first, then the same settings with OOD and `finetunes` on the same store."""
    cache = tmp_path / "cache"
    table2 = overrides(tiny_bert, ood_data, localizers=LOCALIZERS[:2])
    first = run_recipe(RECIPES / "paper.yaml", tmp_path / "run", overrides=table2, cache=cache)
    before = {p.name: (p / "key.json").stat().st_mtime_ns for p in cache.iterdir()}
    rows = json.loads((first / "metrics.json").read_text())["rows"]
    over = {**table2, "ood_limit": 30, "finetunes": {"main": {}, "SGD": {"optimizer": "sgd", "lr": 0.05}},
            "ood_localizers": ["paper"]}  # OOD: the pre-trained and fine-tuned models and the paper's grafts
    over.pop("ood")  # the default: the paper's transfers; SST-2 → imdb, yelp_polarity run (mpqa, QNLI: not in tasks)
    out = run_recipe(RECIPES / "paper.yaml", tmp_path / "run2", overrides=over, cache=cache)
    after = {p.name: (p / "key.json").stat().st_mtime_ns for p in cache.iterdir()}
    # Table 2's fine-tuning, regions and rows are the same entries, read back, not rewritten
    assert {n: after[n] for n in before} == before
    new = sorted(n.rsplit("-", 1)[0] for n in set(after) - set(before))
    assert new == ["ft-SST-2-8-13-prompt", "paper-ood-rows-SST-2-8-13-prompt-imdb",
                   "paper-ood-rows-SST-2-8-13-prompt-yelp_polarity", "paper-rows-SST-2-8-13-prompt",
                   "regions-SST-2-8-13-learned"]  # the SGD fine-tuning, its reference regions and rows; 2 OOD sets
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["rows"] == rows
    ood = metrics["ood_rows"]
    models = [r["model"] for r in rows if not r["model"].startswith("straight-through")]
    assert len(models) < len(rows) and {"pre-trained", "fine-tuned", "paper 0.01", "paper 0.05"} <= set(models)
    assert [r["model"] for r in ood] == models * 2 and {r["source"] for r in ood} == {"SST-2"}
    assert [(r["eval"], r["n"]) for r in ood] == [("imdb", 30)] * len(models) + [("yelp_polarity", 30)] * len(models)
    assert all(r["agreement"] == 1.0 for r in ood if r["kind"] == "ft") and {r["seed"] for r in ood} == {13}
    tuned = metrics["finetune_rows"]
    by = {(r["finetune"], r["model"]): r for r in tuned}
    assert set(by) == {(f, m) for f in ("main", "SGD")
                       for m in ("pre-trained", "fine-tuned", "paper 0.01", "paper 0.05")}  # reference localizer only
    assert {k: v for k, v in by[("main", "paper 0.05")].items() if k not in ("finetune", "optimizer", "lr", "l1")} \
        == rows[3]  # Table 2's own rows
    assert by[("SGD", "fine-tuned")]["optimizer"] == "sgd" and by[("SGD", "fine-tuned")]["lr"] == 0.05
    assert by[("main", "fine-tuned")]["optimizer"] == "adamw"
    sgd_ft = next(json.loads(p.joinpath("key.json").read_text()) for p in cache.iterdir()
                  if p.name.startswith("ft-") and p.name not in before)
    assert sgd_ft["finetune"]["optimizer"] == "sgd" and sgd_ft["finetune"]["lr"] == 0.05  # another FT model
    assert by[("SGD", "pre-trained")]["score"] == by[("main", "pre-trained")]["score"]
    report = (out / "report.md").read_text()
    assert "## Table 7 (and Table 3): out of distribution" in report and "### Source: SST-2" in report
    assert "imdb acc" in report and "yelp_polarity ECE" in report and "4096-shot" in report
    assert "81.5 (0.7)" in report  # the paper's Table 3 SST-2 → imdb grafting, quoted
    assert "## Fig. 5: the fine-tuning optimizer" in report and "sgd lr 0.05" in report and "(Table 2's)" in report
    assert (out / "ood.csv").is_file() and (out / "finetunes.csv").is_file()
    # a re-run reads the OOD rows back too
    again = run_recipe(RECIPES / "paper.yaml", tmp_path / "run3", overrides=over, cache=cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted(after)
    assert json.loads((again / "metrics.json").read_text())["ood_rows"] == ood


def test_paper_ood_table_quotes_table7_beside_matching_models():
    """mpqa → SST-2: the paper's 4096-shot 'Grafting 0.01%' beside the reference graft at 1e-4, FT beside FT."""
    spec = PaperSpec.build({"recipe": "paper", "tasks": ["mpqa"], "budgets": [1e-4, 1e-3],
                            "ood": [{"source": "mpqa", "targets": ["SST-2"]}]})
    ref = spec.localizers[0].title
    base = [{"model": "fine-tuned", "kind": "ft"}, {"model": f"{ref} 0.0001", "kind": "graft", "localizer": ref,
                                                   "budget": "0.0001"}]
    rows = [{**r, "task": "mpqa", "seed": 13, "score": 0.8, "ece": 0.1, "n": 1000} for r in base]
    ood = [{**r, "source": "mpqa", "eval": "SST-2", "score": 0.7, "n": 689} for r in rows]
    text = "\n".join(ood_section(spec, rows, ood))
    assert "Rows scored (per data seed): mpqa (ID) 1000, SST-2 689." in text  # fewer than the limit: said so
    line = {ln.split(" | ")[0].strip("| "): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert "paper mpqa (ID) | paper SST-2" in line["model"]
    assert line[f"{ref} 0.0001"].endswith("| 88.1 (0.4) | 84.6 (0.6) |")  # Table 7, Grafting 0.01%
    assert line["fine-tuned"].endswith("| 88.9 (0.6) | 77.6 (4.9) |")  # Table 7, Grafting 100% (FT)
    assert "| 80.0 | 70.0 |" in line["fine-tuned"] and "4096-shot" in text


@pytest.mark.parametrize("path", sorted((RECIPES.parent / "bench" / "paper").glob("*.yaml")), ids=lambda p: p.stem)
def test_bench_paper_files_are_narrowed_paper_recipes(path):
    """bench/paper/*.yaml (the configs behind bench/RESULTS.md) still load, and share paper.yaml's settings, so
    their stages are the store entries the full recipe would use."""
    _, full = load_recipe(RECIPES / "paper.yaml")
    _, spec = load_recipe(path)
    assert isinstance(spec, PaperSpec) and set(spec.tasks) <= set(full.tasks)
    assert spec.k == full.k
    if spec.model == full.model:
        assert spec.finetune == full.finetune
    else:  # paper-mlm: MiniLM + a fitted MLM head, which it freezes as the paper freezes RoBERTa's; nothing else
        assert spec.finetune == full.finetune.model_copy(update={"freeze_head": True})
    assert spec.localizers[0] == full.localizers[0]  # the paper's localizer is every file's reference
    assert {b.label for b in spec.budgets} <= {b.label for b in full.budgets}
