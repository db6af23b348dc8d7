"""``--json`` (issue 37): every verb that reports prints one JSON document on stdout, and nothing else there."""

import json

import pytest
from typer.testing import CliRunner

from skillgraft.cli import app

runner = CliRunner()


def doc(*args, obj=None, stderr=None):
    """The verb's JSON document (stdout only: warnings and progress go to stderr, appended to ``stderr``)."""
    r = runner.invoke(app, [str(a) for a in args], obj=obj)
    assert r.exit_code == 0, r.output
    if stderr is not None:
        stderr.append(r.stderr)
    return json.loads(r.stdout)


def test_listing_verbs(toy_data):
    tasks = doc("tasks", "--data-dir", toy_data, "--json")
    sst = next(t for t in tasks if t["name"] == "SST-2")
    assert sst["labels"] == 2 and int(sst["sizes"]["train"]) > 0
    assert {r["name"] for r in doc("localizers", "--json")} >= {"learned", "movement", "random"}
    one = doc("localizers", "learned", "--json")
    assert one["name"] == "learned" and any(o["option"] == "sparsity" for o in one["options"])


def test_graft_family(tiny_bert, toy_data, tmp_path):
    ft = doc("finetune", "--task", "SST-2", "--k", 16, "--seed", 13, "--model", tiny_bert, "--optimizer", "adamw",
             "--lr", 1e-3, "--steps", 10, "--eval-every", 5, "--data-dir", toy_data, "--out", tmp_path / "ft", "--json")
    assert ft["task"] == "SST-2" and "accuracy" in ft["test"]
    g = doc("graft", "--finetuned", tmp_path / "ft", "--out", tmp_path / "g", "--budgets", "0.01", "--steps", 2,
            "--eval-every", 1, "--baselines", "movement", "--no-lottery-zero", "--data-dir", toy_data, "--json")
    assert g["out"] == str(tmp_path / "g") and any(r["model"] == "graft 0.01" for r in g["rows"])
    graft_dir = tmp_path / "g" / "grafts" / "budget-0.01"
    i = doc("inspect", graft_dir, "--json")
    assert i["size"] > 0 and sum(sum(row.values()) for row in i["distribution"]["table"].values()) == i["size"]
    a = doc("apply", graft_dir, "--data-dir", toy_data, "--limit", 8, "--json")
    assert a["metrics"]["n"] == 8 and 0 <= a["metrics"]["accuracy"] <= 1
    e = doc("export", graft_dir, "--to", "delta", "--out", tmp_path / "d", "--json")
    assert e["to"] == "delta" and e["coordinates"] == i["size"]
    s = doc("sweep", "--finetuned", tmp_path / "ft", "--out", tmp_path / "s", "--levels", "0.01", "--steps", 1,
            "--eval-every", 1, "--data-dir", toy_data, "--json")
    assert {r["localizer"] for r in s["rows"]} >= {"top-movement", "random"}
    ev = doc("evaluate", tmp_path / "ft", "--limit", 8, "--data-dir", toy_data, "--json")
    assert ev["metrics"]["n"] == 8


def test_json_is_off_after_a_json_run(toy_data):
    doc("localizers", "--json")
    r = runner.invoke(app, ["localizers"])
    assert r.exit_code == 0 and "options and reasons" in r.output
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.stdout)


def test_merge(classifiers, tmp_path):
    from userland import fake_mergekit, merge_args

    m = doc(*merge_args(classifiers, tmp_path / "m", "--localizer", "movement", "--budget", "0.05", "--mergekit",
                        "task_arithmetic", "--scales", "1", "--rules", "average", "--json"),
            obj={"mergekit_runner": fake_mergekit}, stderr=(progress := []))
    assert m["out"] == str(tmp_path / "m") and m["mode"] == "classifier"
    for phase in ("load, score, localize", "mergekit grid", "merge methods"):  # no long phase without a word
        assert phase in progress[0], phase
    assert any(r.get("on_test") for r in m["rows"])
