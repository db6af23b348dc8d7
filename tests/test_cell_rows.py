"""bench/cell_rows.py (issue 74): a cell's test rows from a fine-tune and saved learned regions, beside top-|Δ| and
random of the same budgets — the recipe's rows for a cell localized through bench/fit_schedule.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_saved_regions_are_scored_as_the_localizer_that_made_them(trained_run, toy_data, tmp_path, monkeypatch):
    """Saved as 'learned', top-|Δ|'s own regions must score exactly as its rows do: the saved regions are loaded,
    applied and scored on the run's test rows, budget by budget, at the same sizes."""
    from skillgraft.graft import get_localizer
    from skillgraft.pipeline.opening import from_run

    monkeypatch.setenv("SKILLGRAFT_DATA", str(toy_data))
    member = from_run(trained_run)
    loc = get_localizer("movement").run(member.pre, member.ft, member.data, {"budgets": "0.01,0.05"}, progress=False)
    for budget, region in loc.regions.items():
        region.save(tmp_path / "regions" / budget.key)
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["cell_rows", str(trained_run), str(tmp_path / "regions"), "--out", str(out)])
    assert _bench("cell_rows").main() == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    assert {"pre-trained", "fine-tuned", "learned 0.01", "top-|Δ| 0.05", "random 0.01"} <= set(rows)
    for key in ("0.01", "0.05"):
        learned, top = rows[f"learned {key}"], rows[f"top-|Δ| {key}"]
        assert learned["size"] == top["size"] == rows[f"random {key}"]["size"] > 0
        assert (learned["score"], learned["ece"], learned["agreement"]) == (top["score"], top["ece"], top["agreement"])
    assert rows["fine-tuned"]["share_of_ft"] == 1.0 and rows["pre-trained"]["gap_closed"] == 0.0


def test_a_folder_without_saved_regions_is_one_line_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cell_rows", str(tmp_path / "run"), str(tmp_path / "none")])
    with pytest.raises(SystemExit) as stop:
        _bench("cell_rows").main()
    assert str(stop.value) == (f"{tmp_path / 'none'}: no saved regions (one folder per budget, as fit_schedule "
                               "--save-regions writes them)")


def test_pseudo_rows_are_unused_pool_rows_labelled_by_ft(trained_run, toy_data, monkeypatch):
    """fit_schedule --pseudo N (issue 74's lever for held-out fit): N more training rows, none of the run's k-shot,
    dev or test rows, each carrying FT's own prediction as its label (no gold label read)."""
    from skillgraft.data.loading import load_split
    from skillgraft.evaluate.predict import predict_probs
    from skillgraft.pipeline.opening import from_run

    monkeypatch.setenv("SKILLGRAFT_DATA", str(toy_data))
    member = from_run(trained_run)
    labeller = member.pre  # a model that disagrees with the gold labels, so a gold label read would show
    data = _bench("fit_schedule").with_pseudo_rows(member, labeller, 12)
    old = member.data
    assert data.train[:len(old.train)] == old.train and data.dev == old.dev
    added = data.train[len(old.train):]
    assert len(added) == 12
    used = {e.text_a for e in [*old.train, *(old.dev or []), *member.test]}
    assert not used & {e.text_a for e in added}
    assert [e.label for e in added] == [int(p.argmax()) for p in predict_probs(labeller, added)]
    gold = {e.text_a: e.label for e in load_split(member.task, "train")}
    assert any(gold[e.text_a] != e.label for e in added)


def test_rows_dev_scores_the_dev_rows_with_agreement(trained_run, toy_data, tmp_path, monkeypatch):
    """--rows dev: the selection rows' held-out half is scored instead of the test rows (FT's and θ_pre's scores are
    those of evaluate() on the dev rows), each region with its agreement with FT there."""
    from skillgraft.evaluate.predict import evaluate
    from skillgraft.graft import get_localizer
    from skillgraft.pipeline.opening import from_run

    monkeypatch.setenv("SKILLGRAFT_DATA", str(toy_data))
    member = from_run(trained_run)
    assert member.data.dev and len(member.data.dev) != len(member.test)
    loc = get_localizer("movement").run(member.pre, member.ft, member.data, {"budgets": "0.01"}, progress=False)
    for budget, region in loc.regions.items():
        region.save(tmp_path / "regions" / budget.key)
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["cell_rows", str(trained_run), str(tmp_path / "regions"), "--rows", "dev",
                                      "--out", str(out)])
    assert _bench("cell_rows").main() == 0
    saved = json.loads(out.read_text())
    rows = {r["model"]: r for r in saved["rows"]}
    ft_metrics, ft_probs = evaluate(member.ft, member.data.dev)
    assert saved["scored"] == "dev" and rows["fine-tuned"]["score"] == ft_metrics["score"]
    assert rows["pre-trained"]["score"] == evaluate(member.pre, member.data.dev, reference=ft_probs)[0]["score"]
    assert 0 <= rows["learned 0.01"]["agreement"] <= 1


def test_relabel_gives_every_training_and_dev_row_ft_s_prediction(trained_run, toy_data, monkeypatch):
    """fit_schedule --relabel: the localizer's rows carry the labeller's predictions (here θ_pre's, which disagree
    with the gold labels), so its fit share is agreement with that model; the texts and their order are kept."""
    from skillgraft.evaluate.predict import predict_probs
    from skillgraft.pipeline.opening import from_run

    monkeypatch.setenv("SKILLGRAFT_DATA", str(toy_data))
    member = from_run(trained_run)
    old, labeller = member.data, member.pre
    data = _bench("fit_schedule").relabelled(old, labeller)
    for before, after in ((old.train, data.train), (old.dev, data.dev)):
        assert [e.text_a for e in after] == [e.text_a for e in before]
        assert [e.label for e in after] == [int(p.argmax()) for p in predict_probs(labeller, before)]
    assert any(a.label != b.label for a, b in zip([*old.train, *old.dev], [*data.train, *data.dev]))
