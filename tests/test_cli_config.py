"""``--config FILE`` (issue 37): graft and merge from a YAML file (merge in mergekit's shape); the dev-chosen
mergekit configuration saved for re-use."""

import json

import yaml
from userland import invoke


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
    from userland import fake_mergekit

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


# ------------------------------------------------------------------------- config files that mislead or exhaust
def _alias_bomb() -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**9 (387 million) strings."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for p, q in zip("abcdefgh", "bcdefghi"):
        text += f"{q}: &{q} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
    return text


def usage_error(r, *culprits: str) -> None:
    """click's usage error for --config: exit 2, no traceback, naming each culprit (the framed box of the test
    runner may wrap a line anywhere, so spaces and frame characters are left out of the comparison)."""
    import re

    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    text = re.sub(r"[\s│╭╮╰╯─]", "", r.output)
    for c in culprits:
        assert re.sub(r"\s", "", str(c)) in text, f"{c!r} not in {r.output!r}"


def _written(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_a_yaml_alias_bomb_is_refused_by_name_before_it_is_built(tmp_path):
    from badinputs import one_line

    bomb = _alias_bomb()
    assert len(bomb) < 400
    usage_error(invoke("graft", "--config", _written(tmp_path, "c.yaml", bomb)), "c.yaml:", "alias bomb")
    one_line(invoke("run", _written(tmp_path, "r.yaml", "recipe: graft\n" + bomb)), "r.yaml:", "alias bomb")
    one_line(invoke("tasks", "--task-file", _written(tmp_path, "t.yaml", bomb)), "t.yaml:", "alias bomb")
    one_line(invoke("run", _written(tmp_path, "loop.yaml", "recipe: graft\nx: &x [1, *x]\n")), "loop.yaml:2",
             "refers to the value that holds it")


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    from badinputs import one_line

    usage_error(invoke("graft", "--config", _written(tmp_path, "c.yaml", "steps: 2\nout: x\nsteps: 5\n")),
                "c.yaml:3", "'steps' is given twice", "first on line 1")
    usage_error(invoke("graft", "--config", _written(tmp_path, "d.yaml", "eval-every: 2\neval_every: 5\n")),
                "d.yaml", "'eval_every' is given twice")
    one_line(invoke("run", _written(tmp_path, "r.yaml", "recipe: graft\nk: 4\nfinetune: {lr: 0.1, lr: 0.2}\n")),
             "r.yaml:3", "'lr' is given twice")
    one_line(invoke("tasks", "--task-file", _written(tmp_path, "t.yaml", "name: x\nlabels: [a, b]\nname: y\n")),
             "t.yaml:3", "'name' is given twice")


def test_a_yaml_merge_key_may_be_overridden(tmp_path):
    from skillgraft.untrusted import load_yaml

    doc = load_yaml(_written(tmp_path, "m.yaml", "base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  x: 5\n"))
    assert doc["m"] == {"x": 5, "y": 2}


def test_a_value_of_the_wrong_shape_for_its_option_is_refused_naming_it(tmp_path):
    
    for text, says in (("out: [a, b]\n", "option 'out' takes one value"),
                       ("steps: [1, 2]\n", "option 'steps' takes one value"),
                       ("budgets: {a: 1}\n", "option 'budgets' takes a value, not a mapping"),
                       ("baselines: [[movement]]\n", "not a nested list"),
                       ("steps: true\n", "option 'steps' takes a number, not true/false")):
        usage_error(invoke("graft", "--config", _written(tmp_path, "c.yaml", text)), "c.yaml", says)
    assert not (tmp_path / "a,b").exists()


def test_a_config_saved_by_other_tools_reads_as_any_other_and_bad_bytes_name_the_file(tmp_path):
    from badinputs import as_other_tools_write

    for how in ("utf-16", "bom-crlf-blank"):
        (tmp_path / "c.yaml").write_bytes(as_other_tools_write("finetuned: x\nbudgts: [0.1]\n", how))
        usage_error(invoke("graft", "--config", tmp_path / "c.yaml"), "unknown option 'budgts'")  # read, then judged
    (tmp_path / "l.yaml").write_bytes("finetuned: caf\xe9\n".encode("latin-1"))
    usage_error(invoke("graft", "--config", tmp_path / "l.yaml"), "l.yaml:1", "not UTF-8 text")
    (tmp_path / "folder.yaml").mkdir()
    usage_error(invoke("graft", "--config", tmp_path / "folder.yaml"), "folder.yaml", "a folder, not a file")


def test_a_json_key_given_twice_is_refused_naming_the_file(tiny_graft, tmp_path):
    """JSON parsers keep the last of two equal keys silently; configs, states and data rows refuse them."""
    import shutil

    import pytest

    from skillgraft.data.sources import jsonl_rows
    from skillgraft.errors import SkillgraftError
    from skillgraft.graft.graft import Graft
    from skillgraft.untrusted import read_json

    (tmp_path / "c.json").write_text('{"tasks": [], "model": "a", "model": "b"}')
    with pytest.raises(SkillgraftError, match=r"c\.json: key 'model' is given twice"):
        read_json(tmp_path / "c.json", required=("tasks",))
    (tmp_path / "d.jsonl").write_text('{"text": "good", "label": "1"}\n{"text": "a", "label": "0", "text": "b"}\n')
    with pytest.raises(SkillgraftError, match=r"d\.jsonl:2: key 'text' is given twice"):
        jsonl_rows(tmp_path / "d.jsonl")
    shutil.copytree(tiny_graft, tmp_path / "g")
    cfg = tmp_path / "g" / "graft_config.json"
    cfg.write_text(cfg.read_text().replace('"size":', '"size": 1, "size":', 1))
    with pytest.raises(SkillgraftError, match=r"graft_config\.json: key 'size' is given twice"):
        Graft.from_pretrained(tmp_path / "g")


def test_values_nested_without_end_are_refused_naming_the_file(tmp_path):
    """Fifty thousand nested brackets exhausted the parsers' recursion: a RecursionError traceback."""
    from badinputs import one_line

    deep = "[" * 50000 + "]" * 50000
    usage_error(invoke("graft", "--config", _written(tmp_path, "c.yaml", f"budgets: {deep}\n")), "c.yaml",
                "nested deeper")
    one_line(invoke("run", _written(tmp_path, "r.yaml", f"recipe: graft\nk: {deep}\n")), "r.yaml", "nested deeper")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "continual.json").write_text('{"tasks": ' + deep + "}")
    one_line(invoke("continual", "show", tmp_path / "state"), "continual.json", "nested deeper")


def test_a_task_file_field_of_the_wrong_type_is_refused_naming_it(tmp_path):
    from badinputs import one_line

    base = "name: t1\nkind: single\ntemplate: '*cls**sent_0*_It_was*mask*.'\n"
    for text, says in (("labels: positive\nlabel_words: [a, b]\n", "field 'labels' must be a list"),
                       ("labels: [a, b]\nlabel_words: {a: good}\n", "names no word for label(s) ['b']"),
                       ("labels: [a, b]\nlabel_words: [x, [y]]\n", "field 'label_words' must be a list of words"),
                       ("labels: [a, b]\nlabel_words: [x, y]\nhas_train: 'no'\n", "'has_train' must be true or false")):
        one_line(invoke("tasks", "--task-file", _written(tmp_path, "t.yaml", base + text)), "t.yaml", says)


def test_a_mergekit_config_path_of_the_wrong_shape_is_refused_naming_it(tmp_path):
    for text, says in (("base_model: [a, b]\n", "'base_model' must be one path"),
                       ("models: [{model: [a, b]}, {model: c}]\n", "'models.model' must be one path"),
                       ("models: [{model: a, data: {x: 1}}, {model: c}]\n", "'models.data' must be one path")):
        usage_error(invoke("merge", "--config", _written(tmp_path, "m.yaml", text)), "m.yaml:", says)


def test_true_or_false_for_a_number_in_a_recipe_is_refused_naming_the_field(tmp_path):
    """pydantic reads a bool as 0 or 1: `steps: true` was one step."""
    from badinputs import one_line

    one_line(invoke("run", _written(tmp_path, "r.yaml", "recipe: graft\nk: 4\nfinetune: {steps: true}\n")),
             "r.yaml", "finetune.steps", "expected a number, got true/false")
