"""docs/architecture.md's "how to add": each plug-in family takes a new member as one definition plus one
registration line, and the real code path then runs it. Each test registers a throwaway member on the tiny BERT,
uses it, and unregisters it (the merge-method one is tests/test_merge_methods.py)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from skillgraft.errors import SkillgraftError


# ---------------------------------------------------------------------------------------------- localizer
def test_a_throwaway_localizer_runs_through_graft(tiny_bert):
    from skillgraft.graft.localizers import LOCALIZERS, Localizer, LocalizerOptions, get_localizer, register_localizer
    from skillgraft.graft.selection import Budget
    from skillgraft.models import build_scorer

    class FirstCoordinates(Localizer):
        """The first coordinates of the universe (a stand-in for a new localizer)."""

        Options = LocalizerOptions
        summary = "the universe's first coordinates (a throwaway localizer)"

        def scores(self, pre, ft, data, options, *, progress=False):
            from skillgraft.graft.localizers.machinery.base import region_universe

            shapes = region_universe(pre, options.graftable)
            sizes = [torch.Size(s).numel() for s in shapes.values()]
            rank = torch.arange(sum(sizes), 0, -1, dtype=torch.float64)
            return {n: r.view(s) for (n, s), r in zip(shapes.items(), rank.split(sizes))}

    register_localizer("first")(FirstCoordinates)  # the one registration line
    try:
        pre = build_scorer(str(tiny_bert), "SST-2", "head")
        loc = get_localizer("first").run(pre, pre, None, {"budgets": [Budget.parse(5)]})
        (region,) = loc.regions.values()
        first = next(iter(region.shapes))
        assert region.size == 5 and region.indices[first].tolist() == [0, 1, 2, 3, 4]
    finally:
        LOCALIZERS.pop("first")
    with pytest.raises(SkillgraftError, match="unknown localizer 'first'"):
        get_localizer("first")


# ---------------------------------------------------------------------------------------------- exporter
def test_a_throwaway_exporter_is_an_export_target(tiny_graft, tiny_bert, tmp_path):
    from skillgraft.cli import app
    from skillgraft.export import EXPORTERS, Exporter, register_exporter

    class Count(Exporter):
        """The graft's coordinates per tensor as one JSON file (a stand-in for a new format)."""

        summary = "coordinates per tensor (a throwaway exporter)"
        writes = "file"
        suffix = ".count.json"  # `apply --export FILE.count.json` writes with it

        def export(self, graft, base, out, spec):
            counts = {n: len(i) for n, i in graft.region.indices.items()}
            out.write_text(json.dumps(counts))
            return {"to": self.name, "out": str(out), "coordinates": sum(counts.values())}

    register_exporter("count")(Count)  # the one registration line
    try:
        out = tmp_path / "g.json"
        r = CliRunner().invoke(app, ["export", str(tiny_graft), "--to", "count", "--out", str(out),
                                     "--model", str(tiny_bert)])
        assert r.exit_code == 0, r.output
        assert sum(json.loads(out.read_text()).values()) == 6 and "6 grafted coordinates as count" in r.output
        # apply --export reaches it too: the registry gives the exporter that claims the file's suffix
        applied = tmp_path / "applied.count.json"
        r = CliRunner().invoke(app, ["apply", str(tiny_graft), "--model", str(tiny_bert), "--export", str(applied),
                                     "--evaluate-on", "", "--json"])
        assert r.exit_code == 0, r.output
        assert sum(json.loads(applied.read_text()).values()) == 6
        assert json.loads(r.stdout)["export"]["to"] == "count"
        r = CliRunner().invoke(app, ["apply", str(tiny_graft), "--model", str(tiny_bert), "--export",
                                     str(tmp_path / "plain"), "--evaluate-on", ""])
        assert r.exit_code == 0 and "head mode has no Hugging Face class" in r.output  # any other name: hf
        assert (tmp_path / "plain" / "config.json").is_file()
    finally:
        EXPORTERS.pop("count")
    r = CliRunner().invoke(app, ["export", str(tiny_graft), "--to", "count", "--out", str(tmp_path / "again")])
    assert r.exit_code == 2 and "unknown export target 'count'" in r.output


# ---------------------------------------------------------------------------------------------- model family
def test_a_throwaway_family_changes_how_a_model_is_read(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    from skillgraft.models.families import FAMILIES, Family, default_pooling, head_names

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert), num_labels=2)
    model.config.model_type = "throwaway"  # an architecture the table does not know: the encoder default
    assert default_pooling(model.config, "head") == "mean" and head_names(model) == {"classifier.weight",
                                                                                      "classifier.bias"}
    FAMILIES["throwaway"] = Family(decoder=True, head=("bert.pooler",), prefix="bert")  # the one registration line
    try:
        assert default_pooling(model.config, "head") == "last"
        assert head_names(model) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    finally:
        FAMILIES.pop("throwaway")
    assert default_pooling(model.config, "head") == "mean"


# ---------------------------------------------------------------------------------------------- verb
def count_coordinates(graft_dir) -> dict:
    """A throwaway verb: a typed call, a result (the graft's size per tensor); no printing."""
    from skillgraft.graft import Graft

    g = Graft.from_pretrained(graft_dir)
    return {n: len(i) for n, i in g.region.indices.items()}


def test_a_throwaway_verb_is_one_function_and_one_command(tiny_graft):
    import typer

    from skillgraft.cli import app
    from skillgraft.cli.output import friendly, report

    def count(graft_dir: str = typer.Argument(..., help="a graft folder")) -> None:
        """Coordinates per tensor of a graft."""
        report({"counts": count_coordinates(graft_dir)})  # the command parses and prints; the verb works

    app.command("count")(friendly(count))  # the one registration line
    try:
        r = CliRunner().invoke(app, ["count", str(tiny_graft), "--json"])
        assert r.exit_code == 0, r.output
        assert sum(json.loads(r.output)["counts"].values()) == 6
    finally:
        app.registered_commands.pop()
    assert CliRunner().invoke(app, ["count", str(tiny_graft)]).exit_code == 2
