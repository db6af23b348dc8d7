"""Typed report rows (skillgraft.evaluate.rows): graft rows and merge rows derive share of FT the one way, and a merge
row's columns are merge.json's / results.csv's."""

import math

from skillgraft.evaluate.rows import TaskScores
from skillgraft.merge.base import MergeRow, Scored
from skillgraft.pipeline.variants import ResultRow, derive


def test_merge_row_columns_are_merge_json_columns():
    ft = Scored("fine-tuned", "own", dev={"a": 0.8, "b": 0.5}, test={"a": 0.9, "b": 0.6})
    s = Scored("stitch", "average", dev={"a": 0.4, "b": 0.5}, test={"a": 0.45, "b": 0.3},
               info={"scale": 1.0, "written": True, "chosen_on_dev": True})
    row = MergeRow.of(s, ft, {"a": 100, "b": 300})
    assert row.columns() == {
        "method": "stitch", "config": "average", "on_test": True, "chosen_on_dev": True,
        "dev_mean_normalized": (0.4 / 0.8 + 0.5 / 0.5) / 2, "mean_accuracy": (0.45 + 0.3) / 2,
        "mean_normalized": (0.45 / 0.9 + 0.3 / 0.6) / 2, "bytes_per_task": 200.0, "scale": 1.0, "written": True,
        "a:dev": 0.4, "a:test": 0.45, "a:normalized": 0.45 / 0.9, "a:bytes": 100,
        "b:dev": 0.5, "b:test": 0.3, "b:normalized": 0.3 / 0.6, "b:bytes": 300}
    assert dict(row) == row.columns() and row["mean_normalized"] == row.mean_normalized()
    assert s.normalized(ft) == {"a": 0.5, "b": 0.5} and s.mean_normalized(ft, "dev") == row.mean_normalized("dev")


def test_dev_only_and_failed_rows():
    ft = Scored("fine-tuned", "own", dev={"a": 0.8}, test={"a": 0.9})
    grid = MergeRow.of(Scored("mergekit ties", "λ=0.5", dev={"a": 0.6}), ft, {"a": 7})
    assert not grid.on_test and grid.mean_normalized() is None and grid["a:normalized"] is None
    assert grid["dev_mean_normalized"] == 0.6 / 0.8
    failed = MergeRow.of(Scored("mergekit ties", "λ=2", info={"error": "exit 1"}), ft, {"a": 7})
    assert failed.columns() == {"method": "mergekit ties", "config": "λ=2", "error": "exit 1"}
    no_ft = TaskScores(test=0.5, ft_test=None)
    assert math.isnan(no_ft.normalized())


def test_graft_and_merge_rows_share_one_derivation():
    graft_rows = derive([ResultRow("FT", "ft", 10, {"score": 0.9}), ResultRow("g", "graft", 1, {"score": 0.6})],
                        universe_size=100)
    merge_row = MergeRow.of(Scored("graft", "1e-3", test={"t": 0.6}), Scored("ft", "", test={"t": 0.9}), {"t": 1})
    assert graft_rows[1]["share_of_ft"] == merge_row.tasks["t"].normalized() == merge_row["t:normalized"]
