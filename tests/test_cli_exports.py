"""Outputs for plain transformers / peft users (issue 37): the default PEFT export of a classifier graft sized to
the graft (within 2× its file plus the head the base lacks), its README's labels, and ``Graft.apply`` on the
model a user loads with transformers."""

import json

import pytest
import torch
from typer.testing import CliRunner

from skillgraft.cli import app

runner = CliRunner()


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def topic_graft(classifiers, tmp_path_factory):  # noqa: F811
    """A 3-label classifier graft learned from a plain transformers checkpoint pair (its head carried)."""
    out = tmp_path_factory.mktemp("topic") / "g"
    cli("graft", "--pretrained", classifiers["base"], "--finetuned", classifiers["topic"][0], "--data",
        classifiers["topic"][1], "--budgets", "0.01", "--steps", 2, "--baselines", "", "--no-lottery-zero",
        "--out", out)
    return next((out / "grafts").iterdir())


def plain_base(classifiers, **labels):  # noqa: F811
    import transformers

    torch.manual_seed(0)  # weights the tiny base lacks initialise as skillgraft's do
    return transformers.AutoModelForSequenceClassification.from_pretrained(str(classifiers["base"]), **labels).eval()


def encoded(classifiers):  # noqa: F811
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(classifiers["base"]))
    return tok(["the market fell", "a goal in the last minute", "the senate votes"], return_tensors="pt",
               padding=True)


def test_tensors_peft_export_is_sized_to_the_graft(classifiers, topic_graft, tmp_path):  # noqa: F811
    """``--non-linear tensors`` (issue 37's size; since issue 80 opt-in: it writes its tensors into the base, the
    default stores their modules whole so that disabling the adapter gives the base: test_export.py)."""
    from peft import PeftModel

    from skillgraft.graft import Graft

    g = Graft.from_pretrained(topic_graft)
    cli("export", topic_graft, "--to", "peft", "--non-linear", "tensors", "--out", tmp_path / "a")
    cli("export", topic_graft, "--to", "peft", "--out", tmp_path / "whole")
    summary = json.loads((tmp_path / "a" / "skillgraft_export.json").read_text())
    graft_file = (topic_graft / "graft.safetensors").stat().st_size
    head = sum(t.numel() * t.element_size() for t in g.carried.values())
    size = (tmp_path / "a" / "adapter_model.safetensors").stat().st_size
    # SHiRA holds r·(m+n) entries per target Linear whatever the graft's count there (8 bytes each here: two int16
    # indices, one fp32 value): on this tiny model (m = n = 32) that zero padding is most of the adapter; beyond it
    # the adapter is within 2× the graft file plus the head the base lacks (the real MiniLM: bench/RESULTS.md)
    padding = 8 * summary["routes"]["shira"]["padding_entries"]
    assert g.carried and not summary["routes"]["modules_to_save"]["coordinates"]  # only the head stored whole
    assert size <= 2 * graft_file + head + padding, (size, graft_file, head, padding)
    assert size < (tmp_path / "whole" / "adapter_model.safetensors").stat().st_size
    # the README says how to load it with the labels; loading so gives the right labels and the graft's logits
    labels = summary["labels"]
    id2label = {int(k): v for k, v in labels["id2label"].items()}
    assert labels["num_labels"] == 3 and set(id2label.values()) == {"sport", "money", "vote"}
    readme = (tmp_path / "a" / "README.md").read_text()
    assert f"num_labels=3, id2label={id2label!r}" in readme and "LABEL_0" in readme
    enc = encoded(classifiers)
    model = PeftModel.from_pretrained(plain_base(classifiers, num_labels=3, id2label=id2label,
                                                 label2id={v: k for k, v in id2label.items()}), tmp_path / "a").eval()
    assert model.config.id2label == id2label
    with torch.no_grad():
        got = model(**enc).logits
        mine = plain_base(classifiers, num_labels=3)
        with g.applied(mine):
            want = mine(**enc).logits
    assert float((got - want).abs().max()) <= 1e-5


def test_graft_applies_to_a_plain_transformers_model(classifiers, topic_graft):  # noqa: F811
    from skillgraft.export import graft_task
    from skillgraft.graft import Graft
    from skillgraft.models import build_scorer

    g = Graft.from_pretrained(topic_graft)
    enc = encoded(classifiers)
    torch.manual_seed(0)
    scorer = build_scorer(str(classifiers["base"]), graft_task(g), "classifier")
    plain = plain_base(classifiers, num_labels=3)
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    with torch.no_grad(), g.applied(scorer):
        want = scorer.model(**enc).logits
    with torch.no_grad(), g.applied(plain) as m:  # no "learned on a different architecture"
        assert m is plain
        got = plain(**enc).logits
    assert torch.equal(got, want)
    assert all(torch.equal(before[k], v) for k, v in plain.state_dict().items())  # reverted bit for bit
    g.apply(plain)
    g.revert(plain)
    wrong = plain_base(classifiers, num_labels=2)
    with pytest.raises(Exception, match="does not fit"):
        g.apply(wrong)
