"""The Workbench: θ_pre once whatever N is, members loaded then released, a released θ_ft read back on demand."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from skillgraft.models import build_scorer
from skillgraft.models.anatomy import carried_names
from skillgraft.pipeline.member import FineTunedFiles
from skillgraft.pipeline.opening import from_pair
from skillgraft.pipeline.workbench import MemberState, PreState, Workbench, share_parameters


@pytest.fixture(scope="module")
def classifier_pair(tiny_bert, tmp_path_factory):
    """(base, a "fine-tuned" sequence classifier of it: perturbed body and a head, its data file)."""
    import json

    import transformers as tf

    root = tmp_path_factory.mktemp("pair")
    model = tf.BertForSequenceClassification.from_pretrained(
        str(tiny_bert), num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
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
    members = []
    for name in ("a", "b"):
        member = from_pair(str(base), str(ft), UserDataSpec(data=str(data)), share_pre=bench.share)
        bench.add(name, member)
        members.append(member)
        assert bench.states[name] == "loaded" and bench.members[name].pre_state == PreState.LOADED
        bench.scored(name)
        assert bench.states[name] is MemberState.SCORED and not bench.members[name].released
        bench.release(name)
        assert bench.states[name] == "released" and isinstance(member.ft, FineTunedFiles)
        assert bench.members[name].released and bench.members[name] is member
    body = [n for n in dict(bench.pre.named_parameters()) if n not in set(carried_names(bench.pre))]
    second = dict(members[1].pre.named_parameters())
    assert all(second[n] is dict(bench.pre.named_parameters())[n] for n in body)  # θ_pre in memory once
    assert bench.heads["a"] and all(torch.is_tensor(t) for t in bench.heads["a"].values())


def test_releasing_a_member_frees_its_model_without_a_full_collection(classifier_pair, monkeypatch):
    """θ_ft holds no reference cycle: dropping it frees it at once, so release() runs no gc.collect() (≈ 0.3 s in a
    process that imported torch and transformers), nor does share() when a second θ_pre's copies are dropped (also
    after release_pre(), when the bench takes their tensors back first); an object a cycle keeps alive is
    collected."""
    from skillgraft.data.spec import UserDataSpec
    from skillgraft.heap import collect_if_alive

    base, ft, data = classifier_pair
    bench = Workbench()
    member = from_pair(str(base), str(ft), UserDataSpec(data=str(data)), share_pre=bench.share)
    bench.add("a", member)
    model = weakref.ref(member.ft)
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or 0)
    bench.release("a")
    assert model() is None and collections == []  # freed by reference counting alone
    copies = []

    def watched(pre):  # a second θ_pre: its body's parameters become the bench's, its own copies freed
        head = set(carried_names(pre))
        copies.extend(weakref.ref(p) for n, p in pre.named_parameters() if n not in head)
        return bench.share(pre)

    second = from_pair(str(base), str(ft), UserDataSpec(data=str(data)), share_pre=watched)
    mine, theirs = dict(second.pre.named_parameters()), dict(bench.pre.named_parameters())
    assert all(mine[n] is theirs[n] for n in mine if n not in set(carried_names(second.pre)))
    assert copies and all(ref() is None for ref in copies) and collections == []
    bench.release_pre()  # θ_pre's tensors dropped (one collection): the next θ_pre gives its tensors back first
    collections.clear()
    copies.clear()
    third = from_pair(str(base), str(ft), UserDataSpec(data=str(data)), share_pre=watched)
    assert bench.pre_state == PreState.LOADED and third.pre is not bench.pre
    assert copies and all(ref() is None for ref in copies) and collections == []

    class Node:
        pass

    cycle = Node()
    cycle.me = cycle
    ref = weakref.ref(cycle)
    del cycle
    monkeypatch.undo()
    collect_if_alive(ref)
    assert ref() is None  # only a collection frees a cycle


@pytest.fixture(scope="module")
def llama_pair(tiny_models, tmp_path_factory):
    """(A, B): the tiny Llama and a copy whose body moved, both saved by plain transformers."""
    import transformers as tf

    a = tiny_models["llama"]
    b = tmp_path_factory.mktemp("bench-lean") / "ft"
    model = tf.AutoModelForCausalLM.from_pretrained(a)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    model.save_pretrained(b)
    tf.AutoTokenizer.from_pretrained(a).save_pretrained(b)
    return a, b


def test_lean_members_hold_one_model_and_give_theta_pre_back(llama_pair, toy_data):
    """A lean member (``release_pre`` → θ_ft loaded, released to its files → θ_pre given back through ``share``):
    θ_pre's tensors are dropped while θ_ft is in memory, every member's θ_pre is the bench's again afterwards, with
    θ_pre's values and fingerprint, and the store keys are those of a member loaded with both models."""
    from skillgraft.data.spec import DataSpec
    from skillgraft.graft.identity import cached_fingerprint
    from skillgraft.models.anatomy import fingerprint

    a, b = llama_pair
    spec = DataSpec.build({"task": "SST-2", "k": 16, "seed": 42, "data_dir": str(toy_data)}, where="test")
    both = from_pair(str(a), str(b), spec, data_dir=toy_data)
    bench = Workbench()
    for name in ("a", "b"):
        bench.release_pre()
        if bench.pre is not None:
            assert bench.pre_state == "released"
            assert all(p.numel() == 0 for p in bench.pre.parameters())  # no θ_pre beside the coming θ_ft
        member = from_pair(str(a), str(b), spec, data_dir=toy_data, lean=True, share_pre=bench.share)
        member = bench.add(name, member)
        assert member.pre_state == PreState.DEFERRED
        assert member.pre is None and bench.release_to_files(name) and isinstance(member.ft, FineTunedFiles)
        assert member.state is MemberState.LAZY  # files holding exactly θ_ft, read tensor by tensor
        bench.load_pre(name)
        assert bench.pre_state == "loaded" and member.identity() == both.identity()  # the same store keys
    mine, ref = dict(bench.pre.named_parameters()), dict(both.pre.named_parameters())
    assert all(torch.equal(mine[n], ref[n]) for n in ref)
    first = dict(bench.members["a"].pre.named_parameters())
    assert all(first[n] is p for n, p in dict(bench.members["b"].pre.named_parameters()).items())
    assert cached_fingerprint(bench.pre) == fingerprint(both.pre) == cached_fingerprint(bench.members["b"].pre)


def test_a_bench_carries_its_placement_explicitly():
    """The bench's runtime is the one its verb gives it (nothing ambient is copied: a bench made under ``using``
    without one has none); ``placed()`` activates it for a caller's loads, and the report names it before anything
    loads."""
    from skillgraft.models.placement import Placement, Runtime, active, using

    assert Workbench().runtime is None and Workbench().placement == "nothing loaded"
    with using(Placement(device="cpu", precision="bf16")) as runtime:
        assert Workbench().runtime is None
        bench = Workbench(runtime=runtime)
    assert bench.runtime == Runtime(torch.device("cpu"), "bf16") and bench.placement == "cpu, bf16"
    assert active() is None
    with bench.placed() as runtime:
        assert active() is runtime is bench.runtime
    assert active() is None
