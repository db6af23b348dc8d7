"""The CLI end to end on a tiny model: finetune → graft → inspect → apply → sweep, and clear errors."""

import json

from userland import invoke


def test_tasks_lists_data(toy_data):
    r = invoke("tasks", "--data-dir", toy_data)
    assert r.exit_code == 0 and "SST-2" in r.output and "80" in r.output


def test_graft_inspect_apply(trained_run, toy_data, tmp_path):
    out = tmp_path / "g"
    r = invoke("graft", "--finetuned", trained_run, "--out", out, "--budgets", "0.001,0.01", "--steps", 4,
               "--eval-every", 2, "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    models = [row["model"] for row in metrics["rows"]]
    assert {"pre-trained", "fine-tuned", "head only", "graft 0.001", "graft 0.01"} <= set(models)
    assert any(m.startswith("top-movement @") for m in models) and any(m.startswith("random @") for m in models)
    assert any(m.startswith("lottery-ticket-zero @") for m in models)
    for f in ("report.md", "results.csv", "confidence.png", "reliability.png", "accuracy_vs_size.png"):
        assert (out / f).is_file(), f
    graft_dir = out / "grafts" / "budget-0.01"
    r = invoke("inspect", graft_dir, "--out", tmp_path / "dist")
    assert r.exit_code == 0, r.output
    assert "grafted parameters" in r.output and (tmp_path / "dist" / "distribution.png").is_file()
    dist = json.loads((tmp_path / "dist" / "distribution.json").read_text())
    assert {"layer 0", "layer 1"} <= set(dist["table"])
    assert sum(sum(row.values()) for row in dist["table"].values()) == dist["size"]
    r = invoke("apply", graft_dir, "--model", trained_run / ".." / "nope", "--data-dir", toy_data)
    assert r.exit_code == 2 and "not found" in r.output
    exported = tmp_path / "exported"
    r = invoke("apply", graft_dir, "--data-dir", toy_data, "--export", exported)
    assert r.exit_code == 0, r.output
    assert (exported / "config.json").is_file() and "acc" in r.output
    # an existing report folder is refused before any work; --overwrite re-runs from the stored regions
    args = ["graft", "--finetuned", trained_run, "--out", out, "--budgets", "0.001,0.01", "--steps", 4,
            "--eval-every", 2, "--data-dir", toy_data]
    r2 = invoke(*args)
    assert r2.exit_code == 2 and "already exists" in r2.output
    r2 = invoke(*args, "--overwrite")
    assert r2.exit_code == 0, r2.output
    assert json.loads((out / "metrics.json").read_text())["rows"] == metrics["rows"]


def test_sweep(trained_run, toy_data, tmp_path):
    r = invoke("sweep", "--finetuned", trained_run, "--out", tmp_path / "s", "--levels", "0.001,0.1,1", "--steps", 2,
               "--eval-every", 1, "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    lines = (tmp_path / "s" / "sweep.csv").read_text().splitlines()
    assert len(lines) == 1 + 3 * 2 + 1  # top-movement + random at 3 levels, learned at 0.001
    assert (tmp_path / "s" / "sweep.png").is_file()


def test_errors_are_one_line(tmp_path, toy_data):
    r = invoke("graft", "--finetuned", tmp_path)
    assert r.exit_code == 2 and "not a fine-tuning run directory" in r.output
    r = invoke("finetune", "--task", "nope", "--data-dir", toy_data)
    assert r.exit_code == 2 and "unknown task" in r.output
    r = invoke("finetune", "--task", "SST-2", "--k", 500, "--data-dir", toy_data, "--out", tmp_path / "x")
    assert r.exit_code == 2 and "has only" in r.output and not (tmp_path / "x").exists()
    r = invoke("apply", tmp_path)
    assert r.exit_code == 2 and "not a graft folder" in r.output
    r = invoke("finetune", "--task", "SST-2", "--k", 8, "--model", tmp_path / "missing", "--data-dir", toy_data)
    assert r.exit_code == 2 and "not found" in r.output
