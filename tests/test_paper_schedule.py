"""Issue 46: the paper recipe with its fine-tuning grid (batch × lr chosen on dev, best dev checkpoint, 16·n·k steps)
on a tiny random Gemma 3 (the GGUF path `gemma-3-270m` takes) in causal mode: grid → chosen point → graft rows, the
full-schedule grid reusing its chosen point, a screened grid, resumption from the store, bad grid settings."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tiny import write_sentiment_data

from skillgraft.errors import SkillgraftError
from skillgraft.pipeline.grid import GridSpec, pick
from skillgraft.pipeline.opening import from_run
from skillgraft.recipes import load_recipe, run_recipe
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.run import WEIGHTS_DROPPED

RECIPE = Path(__file__).resolve().parents[1] / "bench" / "fidelity" / "gemma-schedule-64.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_sentiment_data(tmp_path_factory.mktemp("sched-data"), n_train=80, n_test=16)


def overrides(gemma: Path, data: Path, grid: dict, **extra) -> dict:
    """The recipe file's settings with a tiny model and draw: k 4 → the 16·n·k schedule is 128 steps (capped here)."""
    return {"model": str(gemma), "data_dir": str(data), "k": 4, "tasks": ["SST-2"], "seeds": [13], "test_limit": 8,
            "finetune": {"optimizer": "sgd", "weight_decay": 1e-4, "freeze_embeddings": True, "steps": None,
                         "max_steps": 6, "eval_every": 3, "batch_size": 2, "lr": 1e-3},
            "grid": grid, "budgets": [1e-3, 1e-2],
            "localizers": [{"name": "learned", "label": "paper (learned)", "options": {"steps": 2, "eval_every": 1}},
                           {"name": "movement", "label": "top-|Δ|"}, {"name": "random", "label": "random"}],
            **extra}


def _ft_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith("ft-"))


def test_full_grid_chooses_on_dev_and_grafts_the_chosen_run(tiny_gemma, data, tmp_path):
    """The paper's shape (every point on the full schedule): the chosen point is Table 2's fine-tuning itself."""
    grid = {"batch_sizes": [2, 4], "lrs": [1e-2, 1e-3]}
    over = overrides(tiny_gemma, data, grid)
    out = run_recipe(RECIPE, tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    metrics = json.loads((out / "metrics.json").read_text())
    points = metrics["grid_rows"]
    assert [(r["batch_size"], r["lr"]) for r in points] == [(2, 1e-2), (2, 1e-3), (4, 1e-2), (4, 1e-3)]
    assert all(r["steps"] == 6 and not r["screen"] for r in points)
    chosen = [r for r in points if r["chosen"] is True]
    best = max(r["best_dev"] for r in points)
    assert len(chosen) == 1 and chosen[0] is next(r for r in points if r["best_dev"] == best)
    assert len(_ft_entries(tmp_path / "cache")) == 4  # no fifth fine-tuning: Table 2 grafts from the chosen point
    rows = metrics["rows"]
    ft = next(r for r in rows if r["model"] == "fine-tuned")
    assert ft["score"] == pytest.approx(chosen[0]["test_score"])  # the same run, the same 8 test rows
    assert [r["model"] for r in rows] == ["pre-trained", "fine-tuned"] + [
        f"{loc} {b}" for loc in ("paper (learned)", "top-|Δ|", "random") for b in ("0.001", "0.01")]
    for r in rows:
        assert {"score", "ece", "agreement", "share_of_ft", "params"} <= set(r)
    for r in rows[2:]:  # gap closed from the pre-trained model (causal mode: no head only), where FT moved
        assert ("gap_closed" in r) == (ft["score"] != rows[0]["score"])
    config = json.loads(next((tmp_path / "cache").glob("ft-*/run/config.json")).read_text())
    assert config["finetune"]["optimizer"] == "sgd" and config["finetune"]["freeze_embeddings"]
    report = (out / "report.md").read_text()
    assert "Fine-tuning grid (chosen on dev)" in report and "the full schedule" in report
    assert "Table 9" in report and "85.0 (0.9)" in report  # the paper's GPT-2 SST-2 FT beside ours
    assert (out / "grid.csv").read_text().count("\n") == 5


def test_screened_grid_resumes_from_the_store(tiny_gemma, data, tmp_path, monkeypatch):
    """A run stopped after its fine-tunings resumes there: the second run trains nothing and reports the same grid."""
    import skillgraft.pipeline.opening as setup_mod
    import skillgraft.recipes.paper as paper_mod

    grid = {"batch_sizes": [2], "lrs": [1e-2, 1e-3], "steps": 3, "eval_every": 1, "test_limit": 4}
    over = overrides(tiny_gemma, data, grid)
    real = paper_mod.learned_regions

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # the session ends during the localization

    monkeypatch.setattr(paper_mod, "learned_regions", stop)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(RECIPE, tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    assert not (tmp_path / "run").exists()
    done = _ft_entries(tmp_path / "cache")
    assert len(done) == 3  # two screened points and the chosen one on the full schedule
    runs = [tmp_path / "cache" / name / "run" for name in done]
    screens = [r for r in runs if json.loads((r / "config.json").read_text())["finetune"]["steps"] == 3]
    full = next(r for r in runs if r not in screens)
    assert len(screens) == 2 and (full / "model" / "model.safetensors").is_file()
    for r in screens:  # a screen's scores are kept, its weights are not
        assert not (r / "model").exists() and json.loads((r / "metrics.json").read_text())["best_dev"] is not None
    assert re.fullmatch(r"a screened grid point \(batch 2, lr .*, 3 steps\): its dev scores chose .* weights were "
                        r"dropped .*\n", (screens[0] / WEIGHTS_DROPPED).read_text())
    with pytest.raises(SkillgraftError, match=r"kept its scores, not its weights .* no model to open") as e:
        from_run(screens[0])
    assert "\n" not in str(e.value)
    # an entry stored with its weights (before they were dropped) loses them the next time the grid is read
    shutil.copytree(full / "model", screens[0] / "model")
    (screens[0] / WEIGHTS_DROPPED).unlink()

    def no_training(*args, **kwargs):
        raise AssertionError("a stored fine-tuning was trained again")

    monkeypatch.setattr(paper_mod, "learned_regions", real)
    monkeypatch.setattr(setup_mod, "run_finetune", no_training)
    out = run_recipe(RECIPE, tmp_path / "run", overrides=over, cache=tmp_path / "cache")
    assert _ft_entries(tmp_path / "cache") == done
    assert not (screens[0] / "model").exists() and (screens[0] / WEIGHTS_DROPPED).is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    points = [r for r in metrics["grid_rows"] if r["chosen"] != "used"]
    used = [r for r in metrics["grid_rows"] if r["chosen"] == "used"]
    assert [r["steps"] for r in points] == [3, 3] and [r["test_rows"] for r in points] == [4, 4]
    chosen = next(r for r in points if r["chosen"] is True)
    assert len(used) == 1 and (used[0]["batch_size"], used[0]["lr"], used[0]["steps"]) == (2, chosen["lr"], 6)
    assert next(r for r in metrics["rows"] if r["model"] == "fine-tuned")["score"] == pytest.approx(
        used[0]["test_score"])
    assert "screened on 3 steps" in (out / "report.md").read_text()


def test_ties_go_to_the_first_point():
    rows = [{"batch_size": b, "lr": lr, "best_dev": d, "chosen": False}
            for b, lr, d in [(2, 1e-2, 0.5), (2, 1e-3, 0.75), (4, 1e-2, 0.75), (4, 1e-3, None)]]
    chosen = pick(FinetuneConfig(lr=0.1, batch_size=8, steps=10), rows)
    assert (chosen.batch_size, chosen.lr, chosen.steps) == (2, 1e-3, 10)
    assert [r["chosen"] for r in rows] == [False, True, False, False]
    assert GridSpec().points()[:3] == [(2, 1e-2), (2, 5e-3), (2, 1e-3)] and len(GridSpec().points()) == 9


@pytest.mark.parametrize("grid, field", [({"lrs": [0]}, "grid.lrs"), ({"batch_sizes": []}, "grid.batch_sizes"),
                                          ({"steps": 0}, "grid.steps"), ({"lr": [1e-2]}, "grid.lr")])
def test_bad_grid_is_one_line_naming_the_field(grid, field):
    with pytest.raises(SkillgraftError) as e:
        load_recipe(RECIPE, {"grid": grid})
    assert field in str(e.value) and str(RECIPE) in str(e.value) and "\n" not in str(e.value).strip()


LARGE = RECIPE.with_name("gemma-schedule-1024.yaml")  # the 4096-shot schedule: dev_limit, OOD, a fixed trajectory


@pytest.mark.parametrize("recipe", [RECIPE, pytest.param(LARGE, marks=pytest.mark.slow)], ids=lambda p: p.stem)
def test_the_bench_runner_cell_by_cell(recipe, tiny_gemma, data, tmp_path):
    """bench/gemma_paper_schedule.py on the recipe file: --finetune-only (grid, full fine-tuning, zero-shot), --status
    from the store without training, then the cell's grafts and report."""
    import sys

    import yaml

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner

    values = yaml.safe_load(recipe.read_text())
    over = {**overrides(tiny_gemma, data, {"batch_sizes": [2], "lrs": [1e-2, 1e-3], "steps": 2, "eval_every": 1,
                                      "test_limit": 4}), "cache_dir": str(tmp_path / "cache")}
    if values.get("dev_limit"):
        over["dev_limit"] = 3
    if values.get("ood"):
        over["ood"] = []  # the tiny data has no imdb / yelp (tests/test_gemma_recipes.py runs the file's OOD)
    args = [str(recipe), "--override", json.dumps(over), "--out", str(tmp_path / "runs")]
    assert runner.main([*args, "--finetune-only"]) == 0
    assert runner.main([*args, "--status", str(tmp_path / "status.json")]) == 0
    cell = json.loads((tmp_path / "status.json").read_text())["cells"][0]
    assert [p["lr"] for p in cell["points"]] == [1e-2, 1e-3] and all("best_dev" in p for p in cell["points"])
    assert cell["chosen"]["done"] and cell["chosen"]["steps"] == 6
    assert cell["zero_shot"]["test"]["n"] == 8 and cell["zero_shot"]["dev"]["n"] == over.get("dev_limit", 8)
    assert cell["grafts"] == {"localize": {"done": False}, "rows": {"done": 0, "of": 2 + 3 * 2}}
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert runner.main(args) == 0  # the grafts: every fine-tuning from the store
    assert runner.main([*args, "--status", str(tmp_path / "status.json")]) == 0
    grafts = json.loads((tmp_path / "status.json").read_text())["cells"][0]["grafts"]
    assert grafts["localize"]["done"] and set(grafts["localize"]["best_step"]) == {"0.001", "0.01"}
    assert grafts["rows"] == {"done": 8, "of": 8}
    assert [n for n in sorted(p.name for p in (tmp_path / "cache").iterdir()) if n.startswith("ft-")] == \
        [n for n in entries if n.startswith("ft-")]
    report = (tmp_path / "runs" / f"{recipe.stem}-SST-2-13" / "report.md").read_text()
    zero = cell["zero_shot"]["test"]["score"]
    assert f"{100 * zero:.1f}" in report  # the pre-trained row of Table 2 is the stored zero-shot score


def test_the_bench_runner_restores_a_new_stores_grid_and_zero_shot_from_the_records(tiny_gemma, data, tmp_path,
                                                                                    capsys):
    """--restore RECORDS: a new machine's empty store gets back, from bench/gemma_records.py's folder, the stages a
    record holds whole — the screened grid points (scores, their weights dropped) and the zero-shot scores — never the
    chosen fine-tuning (weights); a record whose key is not the stage's is left out; the store's own entries stay."""
    import sys

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner
    import gemma_records

    over = {**overrides(tiny_gemma, data, {"batch_sizes": [2], "lrs": [1e-2, 1e-3], "steps": 2, "eval_every": 1,
                                           "test_limit": 4}), "cache_dir": str(tmp_path / "old")}
    args = [str(RECIPE), "--out", str(tmp_path / "runs")]
    assert runner.main([*args, "--override", json.dumps(over), "--finetune-only"]) == 0
    records = tmp_path / "records"
    gemma_records.keep(tmp_path / "old", records)
    new = json.dumps({**over, "cache_dir": str(tmp_path / "new")})
    status = [*args, "--override", new, "--status", str(tmp_path / "status.json")]
    assert runner.main([*status, "--restore", str(records)]) == 0
    cell = json.loads((tmp_path / "status.json").read_text())["cells"][0]
    assert runner.main([*args, "--override", json.dumps(over), "--status", str(tmp_path / "old.json")]) == 0
    before = json.loads((tmp_path / "old.json").read_text())["cells"][0]
    assert cell["points"] == before["points"]  # every point's dev history and choice, as scored on the old machine
    assert cell["zero_shot"] == before["zero_shot"]
    assert cell["chosen"]["done"] is False and before["chosen"]["done"] is True  # weights: not in a record
    restored = sorted(p.name for p in (tmp_path / "new").iterdir() if not p.name.startswith("gguf-"))
    assert len(restored) == 3 and sum(n.startswith("ft-") for n in restored) == 2
    for name in restored:
        assert (records / name / "key.json").read_text() == (tmp_path / "new" / name / "key.json").read_text()
    for name in (n for n in restored if n.startswith("ft-")):
        assert (tmp_path / "new" / name / "run" / WEIGHTS_DROPPED).is_file()
        assert not (tmp_path / "new" / name / "run" / "model").exists()
    assert "restored from" in capsys.readouterr().out
    # the store's own entries stay; a record under another key is not used
    assert runner.main([*status, "--restore", str(records)]) == 0
    assert "3 entries" not in capsys.readouterr().out
    shutil.rmtree(tmp_path / "new")
    zs = next(records.glob("zero-shot-*"))
    key = json.loads((zs / "key.json").read_text())
    (zs / "key.json").write_text(json.dumps({**key, "data_digest": "0" * 16}))
    assert runner.main([*status, "--restore", str(records)]) == 0
    out = capsys.readouterr().out
    assert "its key.json is not this stage's key" in out and "restored from" in out and "2 entries" in out
    assert "zero_shot" not in json.loads((tmp_path / "status.json").read_text())["cells"][0]
    # a screen as long as the schedule is a fine-tuning itself (the chosen one keeps its weights): never restored
    same = {**over, "cache_dir": str(tmp_path / "same"),
            "finetune": {**over["finetune"], "steps": 6, "max_steps": None},
            "grid": {**over["grid"], "steps": 6, "eval_every": None, "test_limit": 8}}
    assert runner.main([*args, "--override", json.dumps(same), "--finetune-only"]) == 0
    gemma_records.keep(tmp_path / "same", tmp_path / "records-same")
    again = json.dumps({**same, "cache_dir": str(tmp_path / "again")})
    capsys.readouterr()
    assert runner.main([*args, "--override", again, "--status", str(tmp_path / "s.json"), "--restore",
                        str(tmp_path / "records-same")]) == 0
    assert "1 entry\n  zero-shot-" in capsys.readouterr().out
    assert [p.get("done") for p in json.loads((tmp_path / "s.json").read_text())["cells"][0]["points"]] == [False] * 2
    assert runner.main([*args, "--override", again, "--finetune-only"]) == 0  # the chosen run trains, and opens


def test_the_bench_runner_checks_a_new_fine_tuning_against_its_record(tiny_gemma, data, tmp_path, capsys):
    """Issue 74 (4): where the store is gone the cell fine-tunes again; with --restore its test score and checkpoint
    are set beside the record of the same key, in one line: the same figures ("exactly"), or how far apart."""
    import sys

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner
    import gemma_records

    over = {**overrides(tiny_gemma, data, {"batch_sizes": [2], "lrs": [1e-2], "steps": 2, "eval_every": 1,
                                           "test_limit": 4}), "cache_dir": str(tmp_path / "old")}
    args = [str(RECIPE), "--out", str(tmp_path / "runs"), "--finetune-only", "--tasks", "SST-2", "--seeds", "13"]
    assert runner.main([*args, "--override", json.dumps(over)]) == 0
    gemma_records.keep(tmp_path / "old", tmp_path / "records")
    new = [*args, "--override", json.dumps({**over, "cache_dir": str(tmp_path / "new")}), "--restore",
           str(tmp_path / "records")]
    capsys.readouterr()
    assert runner.main(new) == 0
    said = [x for x in capsys.readouterr().out.splitlines() if "its record's" in x]
    assert len(said) == 1 and ": its record's, exactly" in said[0], said  # this machine, same threads: same bits
    for record in (tmp_path / "records").glob("ft-SST-2-*/run/metrics.json"):  # the chosen run's and the grid's
        old = json.loads(record.read_text())
        other = 0.25 if old["test"]["score"] != 0.25 else 0.75  # a proportion strictly inside (0, 1): a z is defined
        record.write_text(json.dumps({**old, "best_step": old["best_step"] + 100,
                                      "test": {**old["test"], "score": other, "accuracy": other}}))
    shutil.rmtree(tmp_path / "new")
    assert runner.main(new) == 0
    said = [x for x in capsys.readouterr().out.splitlines() if "its record's" in x]
    chosen = next(p for p in (tmp_path / "new").glob("ft-SST-2-*/run") if (p / "model").is_dir())
    got = json.loads((chosen / "metrics.json").read_text())["test"]["score"]
    other = json.loads((tmp_path / "records" / chosen.parent.name / "run" / "metrics.json").read_text())["test"][
        "score"]  # the chosen run's record, as made above
    assert len(said) == 1 and f"against its record's {other:.4g} (" in said[0]
    assert f"{100 * (got - other):+.1f} points" in said[0]
    assert "not the recorded fine-tuning" in said[0] and ", z " in said[0]


def test_the_bench_runner_runs_every_stage_under_the_recipes_placement(tiny_gemma, data, tmp_path, monkeypatch):
    """The grid, the full fine-tuning and the zero-shot scores run under the recipe's device and precision (as its
    grafts do under `skillgraft run`): on a GPU machine they compute there, and a bf16-mixed stage is keyed as one."""
    import sys

    import skillgraft.pipeline.opening as opening
    from skillgraft.models.placement import active

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner

    import skillgraft.evaluate.predict as predict

    seen, scored, train, evaluate = [], [], opening.run_finetune, predict.evaluate

    def spy(*a, **kw):
        seen.append(active())
        return train(*a, **kw)

    def spy_eval(*a, **kw):
        scored.append(active())
        return evaluate(*a, **kw)

    monkeypatch.setattr(opening, "run_finetune", spy)
    monkeypatch.setattr(predict, "evaluate", spy_eval)  # the zero-shot stage's scoring
    over = {**overrides(tiny_gemma, data, {"batch_sizes": [2], "lrs": [1e-2], "steps": 2, "eval_every": 1,
                                           "test_limit": 4}), "cache_dir": str(tmp_path / "cache"),
            "device": "cpu", "precision": "bf16-mixed"}
    over["finetune"]["max_steps"] = 2
    assert runner.main([str(RECIPE), "--override", json.dumps(over), "--out", str(tmp_path / "runs"),
                        "--finetune-only"]) == 0
    assert len(seen) == 2 and all(r is not None and str(r.device) == "cpu" and r.precision == "bf16-mixed"
                                  for r in seen)  # the screened point and the chosen run
    assert len(scored) == 2 and all(r is not None and r.precision == "bf16-mixed" for r in scored)  # test, dev
    keys = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*/key.json")]
    assert len(keys) == 3 and all(k.get("precision") == "bf16-mixed" for k in keys if k["kind"] == "ft")
    bad = {**over, "device": "tpu"}
    with pytest.raises(SkillgraftError, match="device"):
        runner.main([str(RECIPE), "--override", json.dumps(bad), "--finetune-only"])
    # from the command line: one line naming the field, no traceback, nothing written
    done = subprocess.run([sys.executable, str(RECIPE.parents[1] / "gemma_paper_schedule.py"), str(RECIPE),
                           "--override", json.dumps({**bad, "cache_dir": str(tmp_path / "bad")}), "--finetune-only"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "device" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


def test_docs_name_the_grid_and_its_fields():
    doc = (RECIPE.parents[2] / "docs" / "recipes.md").read_text()
    assert "`grid`" in doc
    for field in GridSpec.model_fields:
        assert field in doc, field


def test_the_bench_runner_stopped_by_a_signal_says_one_line(tiny_gemma, data, tmp_path, monkeypatch, capsys):
    """A chain's SIGTERM (a session's end) unwinds as Interrupted: the runner prints one line naming the signal and
    the store it resumes from, exits 128 + the signal's number, and leaves no traceback."""
    import signal
    import sys

    from skillgraft.signals import Interrupted

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner

    def stopped(*a, **k):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(runner, "cells", stopped)
    over = {**overrides(tiny_gemma, data, {"batch_sizes": [2], "lrs": [1e-2]}), "cache_dir": str(tmp_path / "cache")}
    assert runner.main([str(RECIPE), "--override", json.dumps(over)]) == 128 + signal.SIGTERM
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and str(tmp_path / "cache") in lines[0]
    assert "Traceback" not in out.err


def test_status_reads_a_stopped_localization_and_rows_from_their_saved_state(tmp_path):
    """--status of a cell stopped inside its grafts: the learned localization's saved step, its pace and the time
    left, and how many rows the stopped comparison had scored (the state files as skillgraft.resume writes them)."""
    import sys

    import torch

    from skillgraft.models.placement import Placement, using

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner

    _, spec = load_recipe(RECIPE, {})
    loc = tmp_path / ".regions-SST-2-64-13-learned-0123456789ab.resume"
    loc.mkdir()
    torch.save({"step": 40, "step_times": [30.0, 34.0]}, loc / "localize-0.pt")
    rows = tmp_path / ".paper-rows-SST-2-64-13-causal-0123456789ab.resume"
    rows.mkdir()
    torch.save({"done": {"fine-tuned": {}, "pre-trained": {}, "top-|Δ| 1e-05": {}}}, rows / "compare-0.pt")
    got = runner.grafts_progress(tmp_path, spec, "SST-2", 13)
    assert got["localize"] == {"done": False, "step": 40, "of": 100, "seconds_per_step": 32.0, "eta_seconds": 1920}
    assert got["rows"] == {"done": 3, "of": 2 + 3 * 4}
    assert runner.grafts_progress(tmp_path, spec, "SST-2", 42) == {"localize": {"done": False},
                                                                   "rows": {"done": 0, "of": 14}}
    # mpqa's OOD sets (the recipe's ood_localizers: the learned grafts beside pre-trained and FT): one stopped, one
    # finished
    ood = tmp_path / ".paper-ood-rows-mpqa-64-13-causal-SST-2-0123456789ab.resume"
    ood.mkdir()
    torch.save({"done": {"fine-tuned": {}, "pre-trained": {}}}, ood / "compare-0.pt")
    yelp = tmp_path / "paper-ood-rows-mpqa-64-13-causal-yelp_polarity-0123456789ab"
    yelp.mkdir()
    (yelp / "rows.json").write_text(json.dumps({"rows": [{}] * 6}))
    (yelp / "key.json").write_text("{}")  # finished: the store's mark
    assert runner.grafts_progress(tmp_path, spec, "mpqa", 13)["ood"] == {"SST-2": {"done": 2, "of": 2 + 4},
                                                                         "yelp_polarity": {"done": 6, "of": 6}}
    # a finished entry of another precision (same label, its key says bf16-mixed) is not this fp32 cell's; before the
    # cell's fine-tuning is done nothing counts, a stopped state included (its folder has no key to tell)
    (yelp / "key.json").write_text(json.dumps({"setup": {"precision": "bf16-mixed"}}))
    assert runner.grafts_progress(tmp_path, spec, "mpqa", 13)["ood"]["yelp_polarity"] == {"done": 0, "of": 6}
    with using(Placement.build({"precision": "bf16-mixed"})):
        assert runner.grafts_progress(tmp_path, spec, "mpqa", 13)["ood"]["yelp_polarity"] == {"done": 6, "of": 6}
    assert runner.grafts_progress(tmp_path, spec, "SST-2", 13, ft_done=False) == {"localize": {"done": False},
                                                                                  "rows": {"done": 0, "of": 14}}


def test_the_cell_queue_runs_each_cells_two_passes_in_order(tmp_path):
    """bench/gemma_schedule_cells.sh: per cell the fine-tuning pass (--finetune-only) then the grafts pass, cells in
    the order given, each on its recipe, each pass followed by the copy of the store's scores into RECORDS; a bad
    cell is refused before any pass; a pass stopped by a signal stops the queue (the same command resumes it)."""
    import os
    import subprocess

    script = RECIPE.parents[1] / "gemma_schedule_cells.sh"
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {calls}\n[[ "$*" == *QNLI* && "$*" != *finetune-only* ]] '
                    '&& exit 143\nexit 0\n')
    fake.chmod(0o755)
    env = {**os.environ, "SKILLGRAFT_CACHE": str(tmp_path / "store"), "PY": str(fake), "OUT": str(tmp_path / "out"),
           "RECORDS": str(tmp_path / "records")}
    bad = subprocess.run([script, "64:SST-2:13", "65:mr:13"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "65:mr:13" in bad.stderr and not calls.exists()
    done = subprocess.run([script, "64:SST-2:13", "1024:SST-2:13", "64-rest:QNLI:42", "64:mr:13"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 143
    lines = calls.read_text().splitlines()
    keeps = [line for line in lines if line.startswith("bench/gemma_records.py")]
    assert keeps == [f"bench/gemma_records.py --store {tmp_path / 'store'} --to {tmp_path / 'records'}"] * 6
    lines = [line for line in lines if line not in keeps]
    assert [(line.split()[1].rsplit("-", 1)[-1], line.split()[3], line.split()[5], "--finetune-only" in line)
            for line in lines] == [("64.yaml", "SST-2", "13", True), ("64.yaml", "SST-2", "13", False),
                                   ("1024.yaml", "SST-2", "13", True), ("1024.yaml", "SST-2", "13", False),
                                   ("rest.yaml", "QNLI", "42", True), ("rest.yaml", "QNLI", "42", False)]
    assert all(f"--out {tmp_path / 'out'}" in line and "--progress" in line for line in lines)  # a log that speaks
    # a fine-tuning pass first restores, from the records, what a new machine's store would otherwise redo
    assert all((f"--restore {tmp_path / 'records'}" in line) == ("--finetune-only" in line) for line in lines)
    assert not any("--override" in line for line in lines)
    # PRECISION lays the precision over every pass's recipe
    calls.unlink()
    run = subprocess.run([script, "64:mr:13"], env={**env, "PRECISION": "bf16-mixed"}, capture_output=True, text=True)
    lines = [line for line in calls.read_text().splitlines() if not line.startswith("bench/gemma_records.py")]
    assert run.returncode == 0 and len(lines) == 2
    assert all('--override {"precision": "bf16-mixed"}' in line for line in lines)


def test_status_line_says_where_each_cell_stands():
    """--status prints one line per cell: the grid's points done (a stopped point's step), the chosen fine-tuning
    (done: its test score; stopped: its step and time left), zero-shot, the localization, rows and OOD rows."""
    import sys

    sys.path.insert(0, str(RECIPE.parents[1]))
    import gemma_paper_schedule as runner

    points = [{"best_dev": 0.7}, {"best_dev": 0.6}, {"done": False, "saved": {"step": 138, "steps": 256}}]
    assert runner.status_line({"task": "RTE", "seed": 13, "points": points, "grafts": {"rows": {"done": 0, "of": 14}}}
                              ) == "RTE/13: grid 2/3 (a point at step 138/256); rows 0/14"
    grafts = {"localize": {"done": False, "step": 40, "of": 100, "seconds_per_step": 32.0, "eta_seconds": 1920},
              "rows": {"done": 0, "of": 14}, "ood": {"MNLI": {"done": 2, "of": 6}}}
    cell = {"task": "QNLI", "seed": 13, "points": points[:2], "grafts": grafts, "zero_shot": {"test": {"score": 0.481}},
            "chosen": {"lr": 0.01, "done": True, "test": {"score": 0.584}, "best_dev": 0.6641, "best_step": 500}}
    assert runner.status_line(cell) == ("QNLI/13: grid 2/2; FT lr 0.01: test 0.5840, best dev 0.6641 at step 500; "
                                        "zero-shot 0.4810; localizing step 40/100 (32.0 s a step, ~32 min left); "
                                        "rows 0/14; OOD MNLI 2/6")
    cell["chosen"] = {"lr": 0.01, "done": False, "saved": {"step": 5002, "steps": 16384, "eta_seconds": 19500}}
    assert "FT lr 0.01: step 5002/16384, ~325 min left" in runner.status_line(cell)


def test_drop_weights_keeps_the_scores_and_says_why(tmp_path):
    """A run's model folder goes (its byte count returned), its metrics stay, the reason is left beside them; a
    second drop (another process, or a later read of the grid) finds nothing to drop."""
    from skillgraft.train.run import drop_weights

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "model.safetensors").write_bytes(b"x" * 1000)
    (run / "model" / "config.json").write_text("{}")
    (run / "metrics.json").write_text('{"best_dev": 0.5}')
    assert drop_weights(run, "a screened grid point") == 1002
    assert sorted(p.name for p in run.iterdir()) == ["WEIGHTS-DROPPED.txt", "metrics.json"]
    assert (run / WEIGHTS_DROPPED).read_text() == "a screened grid point\n"
    assert drop_weights(run, "again") == 0 and (run / WEIGHTS_DROPPED).read_text() == "a screened grid point\n"
