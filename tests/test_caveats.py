"""pipeline/caveats.py: results that mean nothing are said so, in one warning line and in the report (issue 36:
FT at or below chance gave "share of FT 1.050" / "normalized 2.857", one-label evaluation rows passed silently, a
change mostly outside the graftable body showed density 5.57e+01 unflagged)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from badinputs import invoke

from skillgraft.data.loading import Example
from skillgraft.pipeline.caveats import chance_level, merge_caveats


def _rows(labels) -> str:
    return "".join(json.dumps({"text": f"film {i}", "label": y}) + "\n" for i, y in enumerate(labels))


def _classifier(src, out, change):
    import transformers as tf

    model = tf.AutoModelForSequenceClassification.from_pretrained(src)
    with torch.no_grad():
        change(model)
    model.save_pretrained(out)
    tf.AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def _warnings(recwarn) -> list[str]:
    """The warning lines the CLI printed (``warning: …``; pytest records the warnings instead of printing them)."""
    return [str(w.message) for w in recwarn.list if issubclass(w.category, UserWarning)]


def _graft(ft, base, data, out, *extra):
    r = invoke("graft", "--finetuned", ft, "--pretrained", base, "--data", data, "--out", out, "--budgets", "0.05",
               "--steps", 2, "--baselines", "", "--no-lottery-zero", *extra)
    assert r.exit_code == 0, r.output
    return r.output, (out / "report.md").read_text(), json.loads((out / "metrics.json").read_text())


def test_ft_at_chance_is_warned_and_noted(tiny_classifier, tiny_bert, tmp_path, recwarn):  # noqa: F811
    """A classifier whose head is zero predicts one label for every row: accuracy 0.5 on balanced rows."""
    ft = _classifier(tiny_classifier, tmp_path / "ft",
                     lambda m: (m.classifier.weight.zero_(), m.classifier.bias.zero_()))
    (tmp_path / "r.jsonl").write_text(_rows(["bad", "good"] * 10))
    (tmp_path / "held.jsonl").write_text(_rows(["bad", "good"] * 4))
    output, report, metrics = _graft(ft, tiny_bert, tmp_path / "r.jsonl", tmp_path / "g", "--eval-data",
                                     tmp_path / "held.jsonl")
    said = [w for w in _warnings(recwarn) if "at or below chance" in w]
    assert len(said) == 1 and "scores 0.500" in said[0] and "1/2 = 0.500" in said[0], output
    assert "## Caveats" in report and "at or below chance" in report
    assert any("at or below chance" in c for c in metrics["caveats"])


def test_change_mostly_outside_the_body_is_warned(tiny_classifier, tiny_bert, tmp_path, recwarn):  # noqa: F811
    def change(m):
        gen = torch.Generator().manual_seed(0)
        m.bert.embeddings.word_embeddings.weight.add_(torch.randn(m.bert.embeddings.word_embeddings.weight.shape,
                                                                  generator=gen))
        for p in m.bert.encoder.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=gen))

    ft = _classifier(tiny_classifier, tmp_path / "ft", change)
    (tmp_path / "r.jsonl").write_text(_rows(["bad", "good"] * 10))
    output, report, _ = _graft(ft, tiny_bert, tmp_path / "r.jsonl", tmp_path / "g")
    said = [w for w in _warnings(recwarn) if "outside the graftable body" in w]
    assert len(said) == 1 and "word_embeddings" in said[0], output
    assert "outside the graftable body" in report


def test_a_change_inside_the_body_is_not_flagged(tiny_classifier, tiny_bert, tmp_path, recwarn):  # noqa: F811
    def change(m):
        gen = torch.Generator().manual_seed(0)
        for p in m.bert.encoder.parameters():
            p.add_(1e-2 * torch.randn(p.shape, generator=gen))

    ft = _classifier(tiny_classifier, tmp_path / "ft", change)
    (tmp_path / "r.jsonl").write_text(_rows(["bad", "good"] * 10))
    output, report, metrics = _graft(ft, tiny_bert, tmp_path / "r.jsonl", tmp_path / "g")
    assert not [w for w in _warnings(recwarn) if "outside the graftable body" in w]
    assert not any("outside" in c for c in metrics["caveats"])


def test_evaluation_rows_of_one_label_are_warned(tiny_classifier, tmp_path, recwarn):  # noqa: F811
    (tmp_path / "good.jsonl").write_text(_rows(["good"] * 6))
    r = invoke("evaluate", tiny_classifier, "--data", tmp_path / "good.jsonl")
    assert r.exit_code == 0, r.output
    said = [w for w in _warnings(recwarn) if "evaluation rows" in w]
    assert len(said) == 1 and "good.jsonl: all 6 evaluation rows hold one label ('good')" in said[0], r.output


def test_chance_level():
    assert chance_level([0, 1, 0, 1], 2) == (0.5, "1/2 = 0.500")
    assert chance_level([0, 0, 0, 1], 2)[0] == 0.75  # always the majority label
    assert chance_level([0, 1, 2], 3)[0] == pytest.approx(1 / 3)


def test_merge_caveats_name_the_task(recwarn):
    task = SimpleNamespace(num_labels=2, labels=("neg", "pos"), metric="accuracy", name="t")
    setups = {"sent": SimpleNamespace(data=SimpleNamespace(task=task), test=[Example("a", 0), Example("b", 1)]),
              "one": SimpleNamespace(data=SimpleNamespace(task=task), test=[Example("a", 1), Example("b", 1)])}
    out = merge_caveats(setups, {"sent": 0.35, "one": 1.0})
    assert len(out) == 4 and out[0].startswith("task sent: its fine-tuned model scores 0.350")
    assert "normalized accuracy" in out[0]
    assert "majority label's share of the test rows, 1.000" in out[1]  # one label: always predicting it scores 1.0
    assert out[2].startswith("task one: its fine-tuned model scores 1.000 on its evaluation rows (2 rows of the t "
                             "test split")  # a perfect score (issue 80): most likely rows it was trained on
    assert "task one test: all 2 evaluation rows hold one label ('pos')" in out[3]
    assert len(recwarn) == 4
