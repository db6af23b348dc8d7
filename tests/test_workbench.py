"""The Workbench: θ_pre once whatever N is, members loaded then released, a released θ_ft read back on demand."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from skillgraft.models import build_scorer
from skillgraft.models.anatomy import carried_names
from skillgraft.pipeline.setup import FineTunedFiles, from_pair
from skillgraft.pipeline.workbench import Workbench, share_parameters


@pytest.fixture(scope="module")
def classifier_pair(tiny_bert, tmp_path_factory):
    """(base, a "fine-tuned" sequence classifier of it: perturbed body and a head, its data file)."""
    import json

    import transformers as tf

    root = tmp_path_factory.mktemp("pair")
    model = tf.BertForSequenceClassification.from_pretrained(str(tiny_bert), num_labels=2,
                                                             id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.01)
    model.save_pretrained(root / "ft")
    tf.AutoTokenizer.from_pretrained(str(tiny_bert)).save_pretrained(root / "ft")
    rows = [{"text": f"a {'good' if i % 2 else 'bad'} movie {i}", "label": ["neg", "pos"][i % 2]} for i in range(20)]
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tiny_bert, root / "ft", root / "d.jsonl"


def test_share_parameters_points_the_body_at_one_copy_and_keeps_the_head(tiny_bert):
    a = build_scorer(str(tiny_bert), "SST-2", "classifier")
    b = build_scorer(str(tiny_bert), "ag_news", "classifier")  # another head shape
    head = set(carried_names(b))
    old = weakref.ref(dict(b.named_parameters())["model.bert.embeddings.word_embeddings.weight"])
    n = share_parameters(b, a, head)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert n and all(pb[k] is pa[k] for k in pb if k not in head)
    assert all(pb[k] is not pa.get(k) for k in head)
    gc.collect()
    assert old() is None  # the duplicate body is freed


def test_a_bench_holds_theta_pre_once_and_releases_each_member(classifier_pair, tmp_path):
    from skillgraft.data.spec import UserDataSpec

    base, ft, data = classifier_pair
    bench = Workbench()
    setups = []
    for name in ("a", "b"):
        setup = from_pair(str(base), str(ft), UserDataSpec(data=str(data)), share_pre=bench.share)
        bench.add(name, setup, loader=lambda s=setup: build_scorer(str(ft), s.data.task, "classifier"))
        setups.append(setup)
        assert bench.states[name] == "loaded"
        bench.release(name)
        assert bench.states[name] == "released" and isinstance(setup.ft, FineTunedFiles)
    body = [n for n in dict(bench.pre.named_parameters()) if n not in set(carried_names(bench.pre))]
    second = dict(setups[1].pre.named_parameters())
    assert all(second[n] is dict(bench.pre.named_parameters())[n] for n in body)  # θ_pre in memory once
    assert bench.heads["a"] and all(torch.is_tensor(t) for t in bench.heads["a"].values())
    with bench.finetuned("b") as model:  # read back from its files for the block
        assert dict(model.named_parameters())[next(iter(bench.heads["b"]))].shape == next(iter(
            bench.heads["b"].values())).shape
