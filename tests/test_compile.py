"""``--compile`` (issue 75): the transformer body compiled for a fine-tuning or localization run, what dynamo makes of
it counted with its ``eager`` backend (tracing only: seconds, not inductor's minutes), and inductor's result against
eager in slow tests. Timings are bench/overhead.py's (bench/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch

from skillgraft.data import load_kshot
from skillgraft.graft import get_localizer
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.models import build_scorer
from skillgraft.train import FinetuneConfig, SingleTask, fit

LOCALIZE = {"steps": 4, "eval_every": 4, "batch_size": 8, "micro_batch": 8, "sparsity": 0.01, "budgets": [0.005],
            "select_on": "last", "schedule": "fixed"}


@pytest.fixture(scope="module")
def decoder(tiny_models, toy_data):
    return str(tiny_models["llama"]), load_kshot("SST-2", 16, 13, toy_data)


def pair(path):
    pre, ft = build_scorer(path, "SST-2", "causal"), build_scorer(path, "SST-2", "causal")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ft.model.model.layers.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-2)
    return pre, ft


@pytest.fixture
def traced(monkeypatch):
    """``nn.Module.compile`` with dynamo's eager backend; yields dynamo's counters (graphs made, graph breaks)."""
    from torch._dynamo.utils import counters

    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real(self, backend="eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


@pytest.mark.slow  # dynamo traces the decoder (no inductor): ~10 s of CPU
def test_a_compiled_finetuning_run_makes_two_graphs_and_breaks_none(decoder, traced):
    """The toy rows' batches are 7–10 tokens wide: one graph for the first width, one dynamic graph for the rest (a
    batch cut from the tokenized rows as a view made a third: its strides differed), and no graph break."""
    path, data = decoder
    scorer = build_scorer(path, "SST-2", "causal")
    fit(scorer, SingleTask(data.train, None, batch_size=8, steps=8, seed=0),
        FinetuneConfig(batch_size=8, steps=8, eval_every=0, compile=True), progress=False)
    assert traced["stats"]["unique_graphs"] == 2 and not traced["graph_break"], (dict(traced["stats"]),
                                                                                   dict(traced["graph_break"]))


@pytest.mark.slow  # dynamo traces the decoder (no inductor): ~10 s of CPU
def test_a_compiled_localization_makes_a_graph_per_grad_mode_and_kind_of_shape_and_breaks_none(decoder, traced):
    """The steps' two graphs (as fine-tuning's: the first width, then dynamic) and one no-grad graph for the scorings
    (dynamic from the start: dynamo keeps which dimensions varied); no graph break."""
    path, data = decoder
    pre, ft = pair(path)
    get_localizer("learned").run(pre, ft, data, LOCALIZE | {"compile": True})
    assert traced["stats"]["unique_graphs"] == 3 and not traced["graph_break"], (dict(traced["stats"]),
                                                                                   dict(traced["graph_break"]))


def test_compile_compiles_the_body_for_a_localization_run_and_is_kept_out_of_keys_at_its_default(decoder,
                                                                                                  monkeypatch):
    """``compile`` of the learned localizer: the decoder stack (its head runs outside, hooked) compiled in place for
    the run's steps and scorings, eager again afterwards; the field is left out of stored specs at its default."""
    path, data = decoder
    assert "compile" not in LocalizeConfig().to_dict() and LocalizeConfig(compile=True).to_dict()["compile"] is True
    compiled, seen = [], []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(self) or setattr(
        self, "_compiled_call_impl", lambda *a, **k: seen.append(1) or self._call_impl(*a, **k)))
    pre, ft = pair(path)
    get_localizer("learned").run(pre, ft, data, LOCALIZE | {"compile": True})
    assert compiled == [pre.model.model] and pre.model.model._compiled_call_impl is None
    # each step's forward, and the first and last scorings' of the 32 rows in micro-batches of 8
    assert len(seen) == LOCALIZE["steps"] + 2 * 32 // LOCALIZE["micro_batch"]
    calls = len(seen)
    get_localizer("learned").run(pre, ft, data, LOCALIZE)  # compile off: the body as it was
    assert len(compiled) == 1 and len(seen) == calls


@pytest.mark.slow  # inductor's first compile of even a 2-layer decoder takes minutes on a 2-core CI machine
def test_a_compiled_localization_equals_the_eager_one_within_rounding(decoder):
    path, data = decoder
    masks = {}
    for compile_ in (False, True):
        pre, ft = pair(path)
        out = get_localizer("learned").run(pre, ft, data, LOCALIZE | {"compile": compile_, "budgets": ["round"]})
        masks[compile_] = out
    eager, compiled = masks[False], masks[True]
    assert [h.scores for h in compiled.history] == [h.scores for h in eager.history]
