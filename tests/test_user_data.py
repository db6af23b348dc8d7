"""data/user.py: a label fault in the evaluation rows is blamed on them (issue 36: an unknown label in
`--eval-data FILE` was reported against `--data`)."""

from __future__ import annotations

import json

import pytest
from badinputs import refused

from skillgraft.data.spec import UserDataSpec
from skillgraft.errors import SkillgraftError


def _rows(labels) -> str:
    return "".join(json.dumps({"text": f"film {i}", "label": y}) + "\n" for i, y in enumerate(labels))


@pytest.mark.parametrize("verb", ["evaluate", "graft"])
def test_unknown_label_in_eval_data_names_the_eval_file_and_line(verb, tiny_classifier, tiny_bert, tmp_path):  # noqa: F811
    (tmp_path / "train.jsonl").write_text(_rows(["bad", "good"] * 6))
    (tmp_path / "held.jsonl").write_text(_rows(["bad", "good", "good", "meh"]))
    args = (["evaluate", tiny_classifier, "--out", tmp_path / "e"] if verb == "evaluate" else
            ["graft", "--finetuned", tiny_classifier, "--pretrained", tiny_bert, "--out", tmp_path / "g"])
    line = refused(tmp_path, args + ["--data", tmp_path / "train.jsonl", "--eval-data", tmp_path / "held.jsonl"],
                   f"{tmp_path / 'held.jsonl'}:4", "'meh'", "--eval-data")
    assert f"{tmp_path / 'train.jsonl'}" not in line


def test_a_label_fault_in_data_itself_still_names_data(tmp_path):
    (tmp_path / "train.jsonl").write_text(_rows(["bad", "good", "meh"] * 4))
    (tmp_path / "held.jsonl").write_text(_rows(["bad", "good"]))
    spec = UserDataSpec(data=tmp_path / "train.jsonl", eval_data=tmp_path / "held.jsonl")
    with pytest.raises(SkillgraftError, match=r"train\.jsonl: labels \['bad', 'good', 'meh'\] are neither"):
        spec.load(("bad", "good"))


def test_integer_labels_of_eval_rows_out_of_range(tmp_path):
    (tmp_path / "train.jsonl").write_text(_rows(["0", "1"] * 4))
    (tmp_path / "held.jsonl").write_text(_rows(["0", "5"]))
    spec = UserDataSpec(data=tmp_path / "train.jsonl", eval_data=tmp_path / "held.jsonl")
    with pytest.raises(SkillgraftError, match=r"held\.jsonl:2: unknown label '5' in the evaluation rows"):
        spec.load(("neg", "pos"))


# --template: how a user's row is put to a prompt or causal model (the builtin tasks' templates, readable)


def test_readable_templates_are_the_builtin_lm_bff_ones():
    from skillgraft.data.tasks import SENTIMENT, TOPIC_CAUSAL, from_readable

    assert from_readable("{text} It was {label}.") == SENTIMENT
    assert from_readable("{text} Topic: {label}") == TOPIC_CAUSAL
    pair = from_readable("{text} {text_pair} Answer: {label}.", pair=True)
    assert pair == "*cls**sent_0**+sent_1*_Answer:*mask*.*sep+*"
    assert from_readable("*cls**sent_0*_Topic:*mask**sep+*") == TOPIC_CAUSAL  # LM-BFF form passes as it is


def test_a_template_reaches_the_task_and_the_causal_prompt(tmp_path):
    from skillgraft.models.templates import template_text

    (tmp_path / "train.jsonl").write_text(_rows(["World", "Sports"] * 4))
    data = UserDataSpec(data=tmp_path / "train.jsonl", template="{text} Topic: {label}").load()
    assert data.task.label_words == ("Sports", "World")
    assert template_text(data.task.causal_template or data.task.template, data.train[0]).startswith("film ")
    assert template_text(data.task.template, data.train[0]).endswith(" Topic:")
    default = UserDataSpec(data=tmp_path / "train.jsonl").load()
    assert template_text(default.task.template, default.train[0]).endswith(" It was")


@pytest.mark.parametrize(("template", "needle"), [
    ("{text} {lab}", "unknown slot(s) {lab}"),
    ("{label}: {text}", "{label} must come after every text slot"),
    ("{text} It was", "needs {label} exactly once"),
    ("{text} {text_pair} {label}", "{text_pair} needs a pair field"),
    ("{text} so_called {label}", "reserved outside the slots"),
])
def test_a_bad_template_is_refused_in_one_line_before_any_work(template, needle, tiny_classifier, tiny_bert,
                                                                tmp_path):  # noqa: F811
    (tmp_path / "train.jsonl").write_text(_rows(["bad", "good"] * 6))
    out = tmp_path / "g"
    refused(tmp_path, ["graft", "--finetuned", tiny_classifier, "--pretrained", tiny_bert, "--out", out,
                       "--data", tmp_path / "train.jsonl", "--template", template], "--template", needle)
    assert not out.exists()


def test_a_template_is_refused_for_generative_rows(tmp_path):
    with pytest.raises(ValueError, match="generative rows carry their own prompts"):
        UserDataSpec(data=tmp_path / "x.jsonl", prompt_field="p", completion_field="c", template="{text} {label}")
