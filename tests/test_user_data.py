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
