"""data/sources.py: JSONL rows that json accepts but that are no text (issue 36: an unpaired surrogate escape
`"\\ud800"` in a text field was a tokenizer traceback in `graft --data`)."""

from __future__ import annotations

import json

import pytest
from badinputs import refused

from skillgraft.data.sources import jsonl_rows
from skillgraft.errors import SkillgraftError

ROWS = "".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]}) + "\n" for i in range(12))


def test_unpaired_surrogate_is_refused_naming_line_and_field(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(ROWS + '{"text": "bad \\ud800 film", "label": "bad"}\n')
    with pytest.raises(SkillgraftError, match=r"r\.jsonl:13: field 'text' holds an unpaired surrogate escape "
                                              r"'\\ud800' \(character 5\)"):
        jsonl_rows(f)
    f.write_text('{"meta": {"tags": ["ok", "\\udfff"]}, "text": "x", "label": "bad"}\n')
    with pytest.raises(SkillgraftError, match=r"field 'meta.tags\[1\]'"):
        jsonl_rows(f)


def test_a_full_surrogate_pair_is_text(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"text": "good \\ud83d\\ude00", "label": "good"}\n')  # json.dumps' escape of an emoji
    assert jsonl_rows(f)[0][1]["text"] == "good \U0001F600"


@pytest.mark.parametrize("verb", ["graft", "evaluate"])
def test_cli_refuses_a_lone_surrogate_before_any_work(verb, tiny_classifier, tiny_bert, tmp_path):  # noqa: F811
    f = tmp_path / "r.jsonl"
    f.write_text(ROWS + '{"text": "bad \\ud800 film", "label": "bad"}\n')
    args = (["graft", "--finetuned", tiny_classifier, "--pretrained", tiny_bert, "--out", tmp_path / "g"]
            if verb == "graft" else ["evaluate", tiny_classifier, "--out", tmp_path / "e"])
    refused(tmp_path, args + ["--data", f], "r.jsonl:13", "'text'", "unpaired surrogate")
