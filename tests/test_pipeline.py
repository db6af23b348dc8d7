"""The pipeline layer: typed specs, the one store, the one test sampler, CLI options generated from specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from skillgraft.cli.options import Options, from_specs
from skillgraft.data import DataSpec, eval_subset, load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.models import ModelSpec
from skillgraft.pipeline import Store
from skillgraft.pipeline.store import data_digest
from skillgraft.recipes import load_recipe, run_recipe


def test_unknown_recipe_field_is_refused_by_name_before_any_work(tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("recipe: calibration\ntasks: [SST-2]\nlocalise:\n  steps: 3\n")
    out = tmp_path / "out"
    with pytest.raises(SkillgraftError, match=r"typo\.yaml\.localise: unknown field"):
        run_recipe(recipe, out, cache=tmp_path / "cache")
    assert not out.exists() and not (tmp_path / "cache").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_nested_unknown_field_and_bad_value_are_named(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe: calibration\nfinetune:\n  lr: 0.1\n  stepz: 3\n")
    with pytest.raises(SkillgraftError, match=r"r\.yaml\.finetune\.stepz: unknown field"):
        load_recipe(recipe)
    recipe.write_text("recipe: calibration\nk: 0\n")
    with pytest.raises(SkillgraftError, match=r"r\.yaml\.k: .*greater than or equal to 1"):
        load_recipe(recipe)


def test_existing_recipe_output_is_refused_before_any_work(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe: calibration\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("x")
    with pytest.raises(SkillgraftError, match="already exists"):
        run_recipe(recipe, out, cache=tmp_path / "cache")
    assert (out / "mine.txt").read_text() == "x" and not (tmp_path / "cache").exists()


def test_one_sampler_for_every_runner(toy_data):
    """The same (task, k, seed, test limit) gives the same test examples whoever asks."""
    full = load_kshot("SST-2", 8, 13, toy_data).test
    a = load_kshot("SST-2", 8, 13, toy_data, test_limit=30).test
    b = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, test_limit=30).load().test
    c = eval_subset(full, 30)
    assert a == b == c and len(a) == 30
    assert {ex.label for ex in a} == {0, 1}  # not a one-sided head of a label-sorted file
    assert eval_subset(full, None) == full and eval_subset(full, 10_000) == full


def test_store_entries_are_atomic_and_keyed(tmp_path):
    store = Store(tmp_path / "cache")
    calls = []

    def make(folder: Path) -> None:
        calls.append(folder)
        (folder / "x.txt").write_text("done")

    a = store.fetch("thing", {"a": 1}, make, label="demo")
    b = store.fetch("thing", {"a": 1}, make, label="demo")
    assert a == b and len(calls) == 1 and (a / "x.txt").read_text() == "done"
    assert store.fetch("thing", {"a": 2}, make, label="demo") != a and len(calls) == 2

    def broken(folder: Path) -> None:
        (folder / "half.txt").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        store.fetch("thing", {"a": 3}, broken)
    assert store.get("thing", {"a": 3}) is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([a.name, store.path("thing", {"a": 2},
                                                                                                 "demo").name])


def test_data_digest_follows_the_rows(tmp_path, toy_data):
    import shutil

    other = tmp_path / "data"
    shutil.copytree(toy_data, other)
    assert data_digest("SST-2", other) == data_digest("SST-2", toy_data)
    with open(other / "SST-2" / "train.jsonl", "a") as f:
        f.write('{"text": "a new row", "label": "1"}\n')
    assert data_digest("SST-2", other) != data_digest("SST-2", toy_data)


def test_cli_options_come_from_the_specs():
    app = typer.Typer()
    seen = {}

    @app.command()
    @from_specs(data=Options(DataSpec, skip=("data_dir",)), model=Options(ModelSpec))
    def verb(out: Path = typer.Option(Path("x"), help="output"), *, data: DataSpec, model: ModelSpec):
        seen.update(out=out, data=data, model=model)

    @app.command()
    def other():
        pass

    runner = CliRunner()
    r = runner.invoke(app, ["verb", "--task", "mr", "--k", "8", "--mode", "prompt"])
    assert r.exit_code == 0, r.output
    assert seen["data"] == DataSpec(task="mr", k=8) and seen["model"] == ModelSpec(mode="prompt")
    helptext = runner.invoke(app, ["verb", "--help"]).output
    for field, info in {**DataSpec.model_fields, **ModelSpec.model_fields}.items():
        if field != "data_dir":
            assert "--" + field.replace("_", "-") in helptext
    assert "--data-dir" not in helptext
    assert DataSpec.model_fields["k"].description.split(";")[0] in " ".join(helptext.split())
    r = runner.invoke(app, ["verb", "--k", "0"])
    assert isinstance(r.exception, SkillgraftError) and "--k:" in str(r.exception)


def test_cli_graft_and_recipe_see_the_same_examples_and_numbers(tiny_bert, toy_data, tmp_path):
    """`skillgraft finetune` + `skillgraft graft --test-limit N` and the `graft` recipe with the same settings
    evaluate the same test examples and produce the same rows."""
    import json

    from skillgraft.cli import app
    from skillgraft.graft.localizers import LocalizeConfig
    from skillgraft.recipes.base import RECIPES, run_spec
    from skillgraft.recipes.graft import GraftRecipeSpec
    from skillgraft.train import FinetuneConfig

    runner = CliRunner()
    ft = FinetuneConfig(optimizer="adamw", lr=1e-3, steps=20, eval_every=10)
    loc = LocalizeConfig(steps=3, eval_every=1, budgets=[1e-3])
    r = runner.invoke(app, [str(a) for a in ("finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", tiny_bert,
                                             "--optimizer", "adamw", "--lr", 1e-3, "--steps", 20, "--eval-every", 10,
                                             "--data-dir", toy_data, "--out", tmp_path / "ft")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [str(a) for a in ("graft", "--finetuned", tmp_path / "ft", "--out", tmp_path / "g",
                                             "--budgets", "0.001", "--steps", 3, "--eval-every", 1, "--test-limit", 30,
                                             "--baselines", "movement", "--no-lottery-zero", "--data-dir", toy_data)])
    assert r.exit_code == 0, r.output
    spec = GraftRecipeSpec(recipe="graft", task="SST-2", k=8, seed=13, model=str(tiny_bert), data_dir=toy_data,
                           test_limit=30, finetune=ft, localize=loc,
                           report={"baselines": ["movement"], "lottery_zero": False})
    run_spec(RECIPES["graft"], spec, tmp_path / "recipe", cache=tmp_path / "store")
    cli_rows = json.loads((tmp_path / "g" / "metrics.json").read_text())["rows"]
    recipe_rows = json.loads((tmp_path / "recipe" / "metrics.json").read_text())["rows"]
    assert [r["model"] for r in cli_rows] == [r["model"] for r in recipe_rows]
    for a, b in zip(cli_rows, recipe_rows):
        assert a["n"] == b["n"] == 30
        assert a["score"] == b["score"] and a["ece"] == b["ece"] and a["params"] == b["params"]
