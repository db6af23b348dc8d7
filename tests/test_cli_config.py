"""``--config FILE`` (issue 37): graft and merge from a YAML file (merge in mergekit's shape); the dev-chosen
mergekit configuration saved for re-use."""

import json

import yaml
from typer.testing import CliRunner

from skillgraft.cli import app
from test_merge import classifiers  # noqa: F401 - the two tiny classifiers of one base (a fixture)

runner = CliRunner()


def invoke(*args, obj=None):
    return runner.invoke(app, [str(a) for a in args], obj=obj)


def test_graft_from_a_config_file(tiny_bert, toy_data, tmp_path):
    r = invoke("finetune", "--task", "SST-2", "--k", 16, "--seed", 13, "--model", tiny_bert, "--optimizer", "adamw",
               "--lr", 1e-3, "--steps", 10, "--eval-every", 5, "--data-dir", toy_data, "--out", tmp_path / "ft")
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "graft.yaml"
    cfg.write_text(yaml.safe_dump({"finetuned": str(tmp_path / "ft"), "out": str(tmp_path / "from-file"),
                                   "budgets": [0.01, 0.02], "steps": 2, "eval-every": 1, "baselines": ["movement"],
                                   "lottery_zero": False, "data_dir": str(toy_data)}))
    r = invoke("graft", "--config", cfg, "--out", tmp_path / "cli-wins")  # the command line wins over the file
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "from-file").exists()
    metrics = json.loads((tmp_path / "cli-wins" / "metrics.json").read_text())
    models = {row["model"] for row in metrics["rows"]}
    assert {"graft 0.01", "graft 0.02"} <= models and not any(m.startswith("random") for m in models)
    assert not any(m.startswith("lottery") for m in models)


def test_bad_config_files_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("finetuned: x\nbudgts: [0.1]\n")
    r = invoke("graft", "--config", bad)
    assert r.exit_code == 2 and "unknown option 'budgts'" in r.output and "budgets" in r.output
    assert "Traceback" not in r.output
    r = invoke("graft", "--config", tmp_path / "missing.yaml")
    assert r.exit_code == 2 and "not found" in r.output
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    r = invoke("merge", "--config", tmp_path / "list.yaml")
    assert r.exit_code == 2 and "mapping" in r.output
    (tmp_path / "mk.yaml").write_text("models: [{model: a, weights: 2}]\n")
    r = invoke("merge", "--config", tmp_path / "mk.yaml")
    assert r.exit_code == 2 and "unknown key 'weights'" in r.output


def test_merge_from_a_mergekit_shaped_config(classifiers, tmp_path):  # noqa: F811
    from safetensors.torch import load_file
    from test_merge import fake_mergekit

    c = classifiers
    cfg = {"base_model": str(c["base"]), "merge_method": "ties", "parameters": {"lambda": [0.5, 1.0]},
           "models": [{"model": str(c[n][0]), "data": str(c[n][1]), "eval_data": str(c[n][2]), "name": f"my-{n}",
                       "parameters": {"weight": 1.0, "density": 0.5}} for n in ("sentiment", "topic")],
           "dtype": "float32", "out": str(tmp_path / "m"), "localizer": "movement", "budget": 0.05,
           "rules": "average"}
    (tmp_path / "merge.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = invoke("merge", "--config", tmp_path / "merge.yaml", obj={"mergekit_runner": fake_mergekit})
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "m" / "merge.json").read_text())
    assert summary["settings"]["mergekit"] == ["ties"] and summary["settings"]["scales"] == [0.5, 1.0]
    assert summary["settings"]["densities"] == [0.5] and set(summary["tasks"]) == {"my-sentiment", "my-topic"}
    # the dev-chosen ties configuration, saved for mergekit-yaml on the user's own checkpoints
    saved = (tmp_path / "m" / "mergekit" / "ties.yaml").read_text()
    mk = yaml.safe_load(saved)
    chosen = next(row for row in summary["rows"] if row["method"] == "mergekit ties" and row["chosen_on_dev"])
    assert mk["merge_method"] == "ties" and mk["base_model"] == str(c["base"].resolve())
    assert [m["model"] for m in mk["models"]] == [str(c[n][0].resolve()) for n in ("sentiment", "topic")]
    assert mk["parameters"]["lambda"] == chosen["global"]["lambda"]
    assert all(m["parameters"]["density"] == 0.5 for m in mk["models"])
    for m in mk["models"]:  # the checkpoints it names are the user's own, readable as mergekit reads them
        assert load_file(f"{m['model']}/model.safetensors")


def test_former_option_names_warn(tmp_path):
    """merge's --budget is --budgets now, as graft's; the old name still works and warns."""
    r = invoke("merge", "--budget", "0.05", "--budgets", "0.05", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "--budget is the former name of --budgets" in r.output
    import pytest

    with pytest.warns(UserWarning, match="--budget is renamed --budgets"):  # the command prints it on stderr
        r = invoke("merge", "--budget", "0.05", "--out", tmp_path / "m")  # fails later, on the missing models
    assert r.exit_code == 2 and "at least two fine-tuned models" in r.output
    r = invoke("merge", "--budgets", "0.05", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "renamed" not in r.output
