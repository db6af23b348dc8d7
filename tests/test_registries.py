"""Conformance of every registry member (as PEFT's common tester runs one mixin over every method): exporters, merge
methods and localizers each honour their interface, so a new one gets these tests by registering."""

from __future__ import annotations

import json

import pytest
import torch

from skillgraft.errors import SkillgraftError
from skillgraft.export import EXPORTERS, SUMMARY_FILE, ExportSpec, Exporter, export_graft, get_exporter
from skillgraft.graft import Graft, Region, graftable_names
from skillgraft.graft.localizers import LOCALIZERS
from skillgraft.merge import MERGE_METHODS, MergeMethod, Mergekit, get_merge_method, merge_methods
from skillgraft.models import build_scorer
from skillgraft.spec import Spec

KINDS = {"info", "note", "hint", "warning"}


def tiny_graft(path, mode="prompt", count=30):
    pre = build_scorer(str(path), "SST-2", mode)
    ft = build_scorer(str(path), "SST-2", mode)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    params = dict(pre.named_parameters())
    names = [n for n in graftable_names(pre, "body") if n.endswith("weight") and "LayerNorm" not in n]
    shapes = {n: tuple(params[n].shape) for n in graftable_names(pre, "body")}
    idx = {n: torch.randperm(params[n].numel(), generator=gen)[:count] for n in names}
    return pre, Graft.from_models(pre, ft, Region(shapes, idx), {"task": "SST-2", "mode": mode})


# ---------------------------------------------------------------------------------------------- exporters
class ExporterConformance:
    """What every exporter must do: write its folder with a summary naming it, and say what to print of it."""

    name: str

    def test_registered_and_described(self):
        exporter = get_exporter(self.name)
        assert isinstance(exporter, Exporter) and exporter.name == self.name and exporter.summary
        assert ExportSpec(to=self.name).to == self.name

    def _graft(self, tiny_bert, tmp_path):
        """A graft this exporter writes, and its output path: any base (tiny BERT, a folder), or a GGUF base (a
        tiny GGUF, one file) for an exporter that writes GGUF files."""
        if get_exporter(self.name).base_kind == "gguf":
            from tiny import tiny_gguf_graft  # noqa: PLC0415

            _, graft, pre = tiny_gguf_graft(tmp_path / "base")
            return pre, graft, tmp_path / "out.gguf"
        return *tiny_graft(tiny_bert), tmp_path / "out"

    def test_exports_a_summary_it_can_print(self, tiny_bert, tmp_path):
        pre, graft, out = self._graft(tiny_bert, tmp_path)
        s = export_graft(graft, out, ExportSpec(to=self.name), base=pre)
        assert s["to"] == self.name and s["coordinates"] == graft.size
        if get_exporter(self.name).writes == "folder":
            assert json.loads((out / SUMMARY_FILE).read_text())["to"] == self.name
        else:
            assert out.is_file()
        lines = get_exporter(self.name).lines(s)
        assert all(kind in KINDS and isinstance(text, str) and text for kind, text in lines)

    def test_refuses_an_existing_folder_before_any_work(self, tiny_bert, tmp_path):
        pre, graft, out = self._graft(tiny_bert, tmp_path)
        out.mkdir()
        with pytest.raises(SkillgraftError, match="exists"):
            export_graft(graft, out, ExportSpec(to=self.name), base=pre)


@pytest.mark.parametrize("name", sorted(EXPORTERS))
class TestExporters(ExporterConformance):
    @pytest.fixture(autouse=True)
    def _name(self, name):
        self.name = name


def test_an_unknown_export_target_names_the_known_ones():
    with pytest.raises(ValueError, match="known: peft, hf, delta"):
        ExportSpec(to="onnx")
    with pytest.raises(SkillgraftError, match="unknown export target"):
        get_exporter("onnx")


# ---------------------------------------------------------------------------------------------- merge methods
class MergeMethodConformance:
    """What every merge method must do: typed options that are ``skillgraft merge`` options (one default each)."""

    name: str

    def test_options_are_merge_options(self):
        from skillgraft.verbs.merge import MergeSpec

        method = get_merge_method(self.name)
        assert isinstance(method, MergeMethod) and method.name == self.name and method.summary
        assert issubclass(method.Options, Spec)
        assert set(method.Options.model_fields) <= set(MergeSpec.model_fields)
        opts = method.options(MergeSpec())
        assert opts == method.Options()  # MergeSpec's defaults are the method's own
        assert isinstance(method.active(opts), bool)


@pytest.mark.parametrize("name", sorted(MERGE_METHODS))
class TestMergeMethods(MergeMethodConformance):
    @pytest.fixture(autouse=True)
    def _name(self, name):
        self.name = name


def test_mergekit_runner_is_injected_not_patched():
    def fake(config, work, seed):
        return {}

    methods = merge_methods(mergekit_runner=fake)
    assert methods["mergekit"].runner is fake and isinstance(methods["mergekit"], Mergekit)
    assert MERGE_METHODS["mergekit"].runner is not fake  # the registry is untouched
    with pytest.raises(SkillgraftError, match="unknown merge method"):
        get_merge_method("slerp")


# ---------------------------------------------------------------------------------------------- localizers
class LocalizerConformance:
    """What every localizer must do: declare its capabilities itself, build its options from their defaults, describe
    every option (``skillgraft localizers NAME``) and say where it runs (``refuse``), before any model loads."""

    name: str

    def test_declares_its_capabilities(self):
        """Whether it reads θ_ft from files and learns one trajectory per sparsity (no list of names outside it
        decides)."""
        loc = LOCALIZERS[self.name]
        assert isinstance(loc.reads_files, bool) and isinstance(loc.sparsity_trajectories, bool)
        assert not loc.sparsity_trajectories or "sparsity" in loc.Options.model_fields

    def test_default_options_and_their_table(self):
        from skillgraft.graft.localizers import options_table

        loc = LOCALIZERS[self.name]
        assert issubclass(loc.Options, Spec) and "graftable" in loc.Options.model_fields
        assert isinstance(loc.options(None), loc.Options)
        assert [row[0] for row in options_table(self.name)] == list(loc.Options.model_fields)

    def test_says_where_it_runs(self):
        from skillgraft.graft.localizers import support

        s = support(self.name)
        for verdict in (s.candidates, s.sharded, s.generative):
            assert verdict == "yes" or verdict.startswith("refused: "), verdict

    def test_unknown_option_is_refused_by_name(self):
        from skillgraft.pipeline.regions import localizer_options

        with pytest.raises(SkillgraftError, match="no_such_option"):
            localizer_options(self.name, {"no_such_option": 1})


@pytest.mark.parametrize("name", sorted(LOCALIZERS))
class TestLocalizers(LocalizerConformance):
    @pytest.fixture(autouse=True)
    def _name(self, name):
        self.name = name


def test_releasing_theta_ft_follows_the_capabilities():
    from skillgraft.verbs.graft import ReportSpec, releases_ft

    assert releases_ft(ReportSpec())  # learned + movement / random / bias read θ_ft from files
    assert not releases_ft(ReportSpec(localizer="fish"))


# ---------------------------------------------------------------------------------------------- model families
def test_the_family_table_gives_pooling_and_module_types(tiny_models):
    import transformers as tf

    from skillgraft.models.families import DECODER, FAMILIES, default_pooling, family, module_type

    for kind, pooling in (("bert", "mean"), ("roberta", "mean"), ("gpt2", "last"), ("llama", "last")):
        cfg = tf.AutoConfig.from_pretrained(tiny_models[kind])
        assert cfg.model_type in FAMILIES and default_pooling(cfg, "head") == pooling
        assert build_scorer(str(tiny_models[kind]), "SST-2", "head").pooling == pooling  # the Scorer reads the table
    assert default_pooling(tf.BertConfig(), "causal") == "last"
    assert family(tf.BertConfig(is_decoder=True, model_type="unheard-of")) in (DECODER, FAMILIES["bert"])
    assert module_type("model.layers.0.self_attn.q_proj.weight") == "attn.query"
    assert module_type("transformer.h.0.attn.c_attn.weight") == "attn.qkv"
