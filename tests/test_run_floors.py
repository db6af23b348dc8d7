"""One graft run walks down the floors (issue 79): each model resolved into its reference once, when the run opens,
and passed down."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from skillgraft.data.spec import DataSpec
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.verbs.graft import GraftInputs, ReportSpec, graft

OPTIONS = {"budgets": ["0.01"], "steps": 2, "eval_every": 1}


@pytest.fixture
def resolutions(monkeypatch) -> Counter:
    """Counts how often each model name is resolved into a reference (``models.loading.model_reference`` called with a
    name, not with a reference passed down), wherever the resolver was imported."""
    import skillgraft.models.loading as loading

    original, seen = loading.model_reference, Counter()

    def counting(name):
        if not isinstance(name, loading.ModelRef):
            seen[str(name)] += 1
        return original(name)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("skillgraft") and \
                getattr(module, "model_reference", None) is original:
            monkeypatch.setattr(module, "model_reference", counting)
    return seen


@pytest.fixture(scope="module")
def llama_pair(tiny_models, tmp_path_factory) -> tuple[Path, Path]:
    """(A, B): the tiny Llama and a copy whose body moved, both saved by plain transformers."""
    import transformers as tf

    a = tiny_models["llama"]
    b = tmp_path_factory.mktemp("floors") / "ft"
    model = tf.AutoModelForCausalLM.from_pretrained(a)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(b)
    tf.AutoTokenizer.from_pretrained(a).save_pretrained(b)
    return a, b


def test_a_graft_run_resolves_its_base_model_once(ft_run, tiny_bert, toy_data, tmp_path, resolutions):
    graft(GraftInputs(str(ft_run), data=DataSpec(data_dir=str(toy_data))),
          report=ReportSpec(baselines=["movement"], lottery_zero=False), localize=LocalizeConfig(**OPTIONS),
          out=tmp_path / "g", cache=tmp_path / "store")
    assert dict(resolutions) == {str(tiny_bert): 1}


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "both-loaded"])
def test_a_graft_run_on_a_pair_resolves_each_model_once(llama_pair, toy_data, tmp_path, resolutions, lean):
    a, b = llama_pair
    report = ReportSpec(baselines=[] if lean else ["movement"], lottery_zero=not lean)
    graft(GraftInputs(str(b), pretrained=str(a), task="SST-2", data=DataSpec(data_dir=str(toy_data))),
          report=report, localize=LocalizeConfig(**OPTIONS), keep=None, out=tmp_path / "g", cache=tmp_path / "store")
    assert dict(resolutions) == {str(a): 1, str(b): 1}
