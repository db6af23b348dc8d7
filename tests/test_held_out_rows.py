"""Where a report's evaluation rows came from (issue 80): every graft and merge report, its JSON and the command
line say it ("24 rows: a seeded 20% of --data (topic.jsonl) held out"), and a fine-tuned model scoring perfectly
on them is warned about (it has most likely been trained on them)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.pipeline.caveats import perfect_ft

runner = CliRunner()


def test_a_perfect_fine_tune_on_rows_held_out_of_its_data_is_warned():
    line = perfect_ft(1.0, "24 rows: a seeded 20% of --data (train.jsonl) held out", "the fine-tuned model")
    assert "1.000" in line and "trained on them" in line and "--eval-data" in line and "held out of --data" in line
    assert "held out of --data" not in perfect_ft(1.0, "48 rows: test.jsonl", "x")
    assert perfect_ft(0.98, "24 rows: …", "x") is None and perfect_ft(None, "", "x") is None


@pytest.mark.parametrize("eval_data", [False, True])
def test_graft_says_where_its_evaluation_rows_came_from(classifiers, tmp_path, eval_data):  # noqa: F811
    ft, data, test = classifiers["topic"]
    extra = ["--eval-data", test] if eval_data else []
    r = runner.invoke(app, [str(a) for a in ("graft", "--pretrained", classifiers["base"], "--finetuned", ft,
                                             "--data", data, *extra, "--budgets", "0.01", "--steps", 2,
                                             "--baselines", "", "--no-lottery-zero", "--out", tmp_path / "g")])
    assert r.exit_code == 0, r.output
    metrics = json.loads((tmp_path / "g" / "metrics.json").read_text())
    said = (f"48 rows: {test}" if eval_data else f"24 rows: a seeded 20% of --data ({data}) held out")
    assert metrics["evaluated_on"].startswith(said), metrics["evaluated_on"]
    assert f"Evaluated on {said}" in (tmp_path / "g" / "report.md").read_text()
    assert f"evaluated on {said}" in r.output
    ft_score = next(row["score"] for row in metrics["rows"] if row["kind"] == "ft")
    warned = any("a perfect score usually means it was trained on them" in c for c in metrics["caveats"])
    assert warned == (ft_score == 1.0)


def _member(note: str, n: int = 24):
    from types import SimpleNamespace as NS

    task = NS(name="topic", num_labels=3, labels=("sport", "money", "vote"), metric="accuracy")
    test = [NS(label=i % 3) for i in range(n)]
    return NS(task="topic", test=test, data=NS(task=task, test=test, dev=[0] * 40), inputs=NS(data_note=note))


def test_graft_and_merge_caveats_warn_of_a_perfect_fine_tune():
    """The report's caveats (and one warning line each) for FT at 1.000: graft's from its FT row, merge's per task."""
    from skillgraft.pipeline.caveats import evaluation_source, merge_caveats

    note = "learned on topic.jsonl, evaluated on a seeded 20% of --data (topic.jsonl) held out"
    member = _member(note)
    assert evaluation_source(member) == "24 rows: a seeded 20% of --data (topic.jsonl) held out"
    with pytest.warns(UserWarning, match="task topic: its fine-tuned model scores 1.000 on its evaluation rows"):
        caveats = merge_caveats({"topic": member}, {"topic": 1.0})
    assert any("held out of --data" in c for c in caveats)
    assert not merge_caveats({"topic": member}, {"topic": 0.9})
    registered = _member("")
    assert evaluation_source(registered) == ("24 rows of the topic test split (registered task: rows no k-shot draw "
                                             "takes)")
