"""The typed results keep their documents: a tiny graft run's ``--json`` and metrics.json have the same keys, in the
same order, with the same kinds of values as before the verbs returned typed results (issue 79). The byte-for-byte
check old against new is done on ``make demo`` and one merge at the change; this test keeps the shape."""

import json
from pathlib import Path

from typer.testing import CliRunner

from skillgraft.cli import app

PINNED = Path(__file__).with_name("graft_result_shape.json")  # the shapes and rows of the run before issue 79


def shape(value):
    """A JSON value's shape: a dict's keys in order with their shapes, a list's distinct element shapes, a leaf's
    type (a float and an int are both numbers: a score may be 1)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        seen = []
        for v in value:
            if shape(v) not in seen:
                seen.append(shape(v))
        return seen
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def graft_json(trained_run, toy_data, out):
    r = CliRunner().invoke(app, [str(a) for a in (
        "graft", "--finetuned", trained_run, "--out", out, "--budgets", "0.01,0.05", "--steps", 2, "--eval-every", 1,
        "--baselines", "movement,random", "--data-dir", toy_data, "--json")])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_graft_json_and_metrics_keep_their_shape(trained_run, toy_data, tmp_path):
    doc = graft_json(trained_run, toy_data, tmp_path / "g")
    metrics = json.loads((tmp_path / "g" / "metrics.json").read_text())
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))
    assert shape(doc) == pinned["doc"]
    assert shape(metrics) == pinned["metrics"]
    assert [(r["model"], r["kind"]) for r in doc["rows"]] == [tuple(m) for m in pinned["models"]]
    assert doc["rows"] == metrics["rows"]


def test_a_graft_run_resolves_its_localizer_options_once(trained_run, toy_data, tmp_path, monkeypatch):
    """The flags the user set are resolved once as the chosen localizer's options (by the command line, whose errors
    name the flags) and travel down typed (the CLI, the verb and the report each resolved them: 3 calls)."""
    import skillgraft.pipeline.regions as regions

    calls = []
    real = regions.localizer_options

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(regions, "localizer_options", counted)  # the verb's resolve_once calls it there
    r = CliRunner().invoke(app, [str(a) for a in (
        "graft", "--finetuned", trained_run, "--out", tmp_path / "g", "--budgets", "0.01", "--steps", 2,
        "--eval-every", 1, "--baselines", "", "--no-lottery-zero", "--lr", "1e6", "--data-dir", toy_data)])
    assert r.exit_code == 0, r.output
    assert calls == ["learned"]
    config = json.loads((tmp_path / "g" / "metrics.json").read_text())["localization"]["config"]
    assert config["lr"] == 1e6 and config["steps"] == 2  # the flags the user set reached the localizer


def test_report_rows_are_read_by_their_typed_identity_not_their_names():
    """A row's localizer and budget are fields: the report's curves and sizes read them, never its display name
    (``top-movement @ graft 0.01`` was split on " @ " to find its curve)."""
    from skillgraft.pipeline.variants import ResultRow
    from skillgraft.verbs.graft_output import GraftReport, matched_label

    row = ResultRow("any display name", "baseline", 3, {"score": 0.5, "ece": 0.1}, localizer="movement", budget="0.01")
    assert matched_label(row) == "top-movement" and row.budget == "0.01" and row.split == "test"
    assert matched_label(ResultRow("x @ y", "graft", 3, {"score": 0.5}, localizer="learned")) is None
    assert "localizer" not in row.columns() and list(row.columns())[:3] == ["model", "kind", "params"]
    report = GraftReport("SST-2", 8, 13, 10, "test", 100, 120, 130, "learned", {}, 0, [row], {})
    assert list(report)[-2:] == ["placement", "caveats"]  # the optional sections only when made
    report.fit = {"lines": ["a line"]}
    assert list(report)[-1] == "fit" and report.fit_lines == ["a line"] and report["rows"] == [row]
