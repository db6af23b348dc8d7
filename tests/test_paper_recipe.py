"""The paper recipe (Table 2 setting) on a tiny BERT in prompt mode: rows, gap from pre-trained, the paper's
numbers beside ours, localizers compared at equal size, resume from the store, validation before any work."""

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
from skillgraft.recipes.base import load_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TINY_FT = {"optimizer": "adamw", "lr": 3e-3, "steps": 16, "eval_every": 8, "freeze_embeddings": False}
LOCALIZERS = [{"name": "learned", "label": "paper", "options": {"sparsity": 0.01, "steps": 2, "micro_batch": 32}},
              {"name": "straight-through", "options": {"steps": 2, "eval_every": 1, "micro_batch": 32}},
              {"name": "learned-adam", "label": "adam", "options": {"steps": 2, "budgets": [0.05], "sparsity": 0.01}}]


def overrides(tiny_bert, toy_data, **extra) -> dict:
    return {"model": str(tiny_bert), "data_dir": str(toy_data), "k": 8, "tasks": ["SST-2"], "seeds": [13],
            "test_limit": 40, "finetune": TINY_FT, "budgets": [0.01, 0.05], "localizers": LOCALIZERS, **extra}


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
    assert "Localizers at equal size" in report and "Wall time" in report and "QQP: not run" in report
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
    bad = [{"localizers": [{"name": "straight-through", "options": {"stepz": 3}}]},
           {"localizers": [{"name": "lottery"}]}, {"budgets": ["round"]}, {"tasks": ["SST-3"]},
           {"localizers": [{"name": "learned"}, {"name": "learned"}]}, {"budget": [0.1]},
           {"localizers": [{"name": "movement", "options": {"budgets": [0.5]}}]}]
    for extra, match in zip(bad, ["stepz", "unknown localizer 'lottery'", "round", "SST-3", "share a label",
                                  "budget", "among the recipe's budgets"]):
        with pytest.raises(SkillgraftError, match=match):
            run_recipe(RECIPES / "paper.yaml", tmp_path / "never", overrides=overrides(tiny_bert, toy_data, **extra),
                       cache=tmp_path / "cache")
        assert not (tmp_path / "never").exists() and not (tmp_path / "cache").exists()
