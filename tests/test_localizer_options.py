"""Each localizer runs with its own defaults: only the fields a user sets reach it (issue 22).

Before the fix, ``skillgraft graft --localizer prune`` ran prune with the learned localizer's lr 1e7, 100 steps,
eval_every 1 and select_on train+dev, because every field the two option classes share was copied, defaults
included. These tests resolve every registered localizer's options from the CLI and from a recipe and compare
them with the localizer's documented defaults plus exactly the fields the user set.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import skillgraft.pipeline.opening as pair_loading
import skillgraft.verbs.graft as graft_recipes
from skillgraft.cli import app
from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import LOCALIZERS, LocalizeConfig, get_localizer, support, support_table
from skillgraft.pipeline.regions import localizer_options
from skillgraft.recipes.graft import GraftRecipeSpec, graft_recipe

runner = CliRunner()


class Captured(SkillgraftError):
    """Raised by the stubbed regions stage once it has the resolved options (no work is done)."""


def fake_member():
    """What the stubbed pair loading gives: a Member with one tiny θ_pre and θ_ft, nothing deferred (the graft's
    Workbench of one member takes it as it is) and no inputs (the run stops before any data is read)."""
    from skillgraft.pipeline.member import Member

    return Member("SST-2", None, torch.nn.Linear(1, 1), torch.nn.Linear(1, 1))


@pytest.fixture
def capture(monkeypatch):
    """Stub the regions stage (and the pair loading) so a run stops with the options it would localize with."""
    seen: dict = {}

    def fake_regions(member, store, localizer, options, **_):
        seen["localizer"], seen["options"] = localizer, options
        raise Captured("captured")

    monkeypatch.setattr(graft_recipes, "learned_regions", fake_regions)
    monkeypatch.setattr(pair_loading, "from_pair", lambda *a, **k: fake_member())
    return seen


def user_fields(name: str) -> dict:
    """What the user sets in these tests: a budget, and a seed where the localizer has one."""
    fields = get_localizer(name).Options.model_fields
    return {"budgets": ["0.001"], **({"seed": 3} if "seed" in fields else {})}


def expected(name: str) -> dict:
    return get_localizer(name).options(user_fields(name)).to_dict()


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
def test_cli_resolves_each_localizers_own_defaults(name, capture, tmp_path):
    model = tmp_path / "ft"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = ["graft", "--pretrained", "base", "--finetuned", str(model), "--task", "SST-2", "--localizer", name,
            "--baselines", "", "--out", str(tmp_path / "out")]
    for k, v in user_fields(name).items():
        args += [f"--{k}", ",".join(v) if isinstance(v, list) else str(v)]
    result = runner.invoke(app, args)
    assert "captured" in result.output, result.output
    assert capture["localizer"] == name
    assert capture["options"].to_dict() == expected(name)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
def test_recipe_resolves_each_localizers_own_defaults(name, capture, monkeypatch, tmp_path):
    spec = GraftRecipeSpec.build({"recipe": "graft", "report": {"localizer": name, "baselines": []},
                                  "localize": user_fields(name)})
    monkeypatch.setattr(GraftRecipeSpec, "member", lambda self, *a, **k: fake_member())
    with pytest.raises(Captured):
        graft_recipe(spec, types.SimpleNamespace(store=None, path=tmp_path, runtime=None))
    assert capture["options"].to_dict() == expected(name)


def test_prune_keeps_its_schedule_not_the_learned_localizers():
    opts = localizer_options("prune", LocalizeConfig.build({"budgets": ["1e-4"]}))
    defaults = get_localizer("prune").options({})
    assert (opts.lr, opts.steps, opts.eval_every, opts.select_on) == (defaults.lr, defaults.steps,
                                                                      defaults.eval_every, defaults.select_on)
    assert opts.lr != LocalizeConfig().lr


def test_a_field_the_chosen_localizer_lacks_is_refused_by_name(tmp_path):
    with pytest.raises(SkillgraftError, match="localizer 'movement' has no option steps"):
        localizer_options("movement", LocalizeConfig.build({"steps": 10}))
    model = tmp_path / "ft"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = runner.invoke(app, ["graft", "--pretrained", "base", "--finetuned", str(model), "--task", "SST-2",
                                 "--localizer", "movement", "--steps", "10", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "has no option steps" in result.output


def test_replace_keeps_unset_fields_unset():
    cfg = LocalizeConfig.build({"steps": 7}).replace(budgets=["1e-3"])
    assert set(cfg.given()) == {"steps", "budgets"}
    assert cfg.lr == LocalizeConfig().lr


def test_a_localizers_own_options_are_on_the_command_line(capture, tmp_path):
    model = tmp_path / "ft"
    model.mkdir()
    (model / "config.json").write_text("{}")
    base = ["graft", "--pretrained", "base", "--finetuned", str(model), "--task", "SST-2", "--budgets", "1e-3",
            "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*base, "--localizer", "prune", "--anneal-from", "0.05", "--lr", "0.3"])
    assert "captured" in result.output, result.output
    assert (capture["options"].anneal_from, capture["options"].lr) == (0.05, 0.3)
    assert capture["options"].steps == get_localizer("prune").options({}).steps
    result = runner.invoke(app, [*base, "--localizer", "learned", "--anneal-from", "0.05"])
    assert result.exit_code == 2 and "localizer 'learned' has no option anneal_from" in result.output


def test_localizers_verb_lists_the_registry_and_one_localizers_defaults():
    result = runner.invoke(app, ["localizers"])
    assert result.exit_code == 0 and all(name in result.output for name in LOCALIZERS)
    result = runner.invoke(app, ["localizers", "prune"], terminal_width=200)
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if "--anneal-steps" in line)
    assert " 60 " in row  # prune's own schedule, not another localizer's default
    result = runner.invoke(app, ["localizers", "oracle"])
    assert result.exit_code == 2 and "unknown localizer 'oracle'" in result.output


def test_baselines_that_cannot_run_sharded_are_left_out_before_any_work(monkeypatch):
    """Under an FSDP launch the score-based baselines refuse; the report leaves them out with one warning naming
    each, before the learned localizer runs (they used to be skipped silently after it)."""
    from skillgraft.verbs.graft import ReportSpec, runnable_baselines

    from skillgraft.pipeline.member import PreState

    member = types.SimpleNamespace(pre=torch.nn.Linear(2, 2), pre_state=PreState.LOADED)
    report, options = ReportSpec(), LocalizeConfig()
    assert runnable_baselines(report, member, options).baselines == ["movement", "random", "bias"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.warns(UserWarning, match=r"movement \(localizer 'movement' does not run sharded.*random.*bias"):
        assert runnable_baselines(report, member, options).baselines == []
    with pytest.raises(SkillgraftError, match="nope"):
        runnable_baselines(ReportSpec(baselines=["nope"]), member, options)


# --- where each localizer runs: derived from the code, shown by `skillgraft localizers`, documented ---------------

def doc_support_rows() -> dict[str, tuple[bool, bool, bool]]:
    """docs/localizers.md's "What runs where" table: localizer → (candidates, sharded, generative) is "yes"."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "localizers.md").read_text()
    block = text.split("| | `--candidates` | sharded (FSDP2) | generative data |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.strip().splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        for name in re.findall(r"`([a-z-]+)`", cells[0]):
            rows[name] = tuple(c.startswith("yes") for c in cells[1:4])
    return rows


def test_docs_where_table_agrees_with_the_code():
    documented = doc_support_rows()
    assert set(documented) == set(LOCALIZERS), "docs/localizers.md 'What runs where' must list every localizer"
    for row in support_table():
        derived = tuple(v == "yes" for v in (row.candidates, row.sharded, row.generative))
        assert documented[row.name] == derived, (row.name, row)


def test_support_follows_refuse(monkeypatch):
    assert support("learned") == ("learned", "yes", "yes", "yes")
    loc = get_localizer("learned")

    def refuse(options, *, sharded=False, generative=False):
        if generative:
            raise SkillgraftError("localizer 'learned' refuses generative data (test)")

    monkeypatch.setattr(loc, "refuse", refuse)
    assert support("learned").generative == "refused: localizer 'learned' refuses generative data (test)"
    assert support("learned").sharded == "yes"
    assert support("movement").candidates.startswith("refused: localizer 'movement' has no option 'candidates'")


def test_cli_localizers_shows_where_each_runs():
    listing = runner.invoke(app, ["localizers"])
    assert listing.exit_code == 0, listing.output
    assert all(name in listing.output for name in LOCALIZERS)
    line = next(ln for ln in listing.output.splitlines() if "│ fish " in ln)
    assert line.count("refused") == 3
    one = runner.invoke(app, ["localizers", "prune"])
    assert one.exit_code == 0, one.output
    flat = re.sub(r"[\s│]+", "", one.output)  # the table wraps long reasons over lines
    assert "where'prune'runs" in flat
    assert "(relaxationstraight-through)doesnotrunsharded(FSDP)" in flat


def test_the_localizers_verb_gives_typed_rows_the_command_line_prints():
    """``skillgraft localizers`` prints typed results (verbs/localizers.py), read from the registry: one row per
    localizer in registration order, and one localizer's options and where it runs."""
    from skillgraft.verbs.localizers import localizer_info, localizer_rows

    rows = localizer_rows()
    assert [r.name for r in rows] == list(LOCALIZERS) and rows[0].document()["name"] == rows[0].name
    info = localizer_info("learned")
    assert [o.option for o in info.options] == list(get_localizer("learned").Options.model_fields)
    assert info.support.sharded == support("learned").sharded
    assert info.document()["support"] == {"candidates": info.support.candidates, "sharded": info.support.sharded,
                                          "generative": info.support.generative}
    with pytest.raises(SkillgraftError, match="unknown localizer"):
        localizer_info("oracle")
