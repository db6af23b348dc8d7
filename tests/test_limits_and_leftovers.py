"""Limits and leftovers (docs/reliability.md §18): a valid long output name is written, options that do nothing
alone are refused, CSV labels as pandas writes them read as JSONL's, label words that leave the prompt no room are
one line, and model names derived from paths never lead outside the output."""

from __future__ import annotations

import json
import os

import pytest
from badinputs import invoke, refused

from skillgraft.errors import SkillgraftError


# ---------------------------------------------------------------------------------------------- long names
@pytest.mark.parametrize("length", [245, 255])
def test_an_output_folder_with_a_long_valid_name_is_written_and_replaced(length, tiny_graft, tiny_bert, tmp_path):
    """Its hidden siblings (the temporary folder, the old one moved aside) must fit the 255-byte name limit too:
    a valid 245-character folder was refused because its temporary sibling's name was longer than that."""
    out = tmp_path / ("a" * length)
    r = invoke("export", tiny_graft, "--model", tiny_bert, "--to", "peft", "--out", out)
    assert r.exit_code == 0, r.output
    assert (out / "adapter_config.json").is_file()
    r = invoke("export", tiny_graft, "--model", tiny_bert, "--to", "peft", "--out", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no sibling left


def test_hidden_siblings_of_a_long_name_fit_the_name_limit_and_stay_apart(tmp_path):
    from skillgraft.io import atomic_path, sibling, stem, sweep_leftovers

    long_a, long_b = "é" * 120 + "a", "é" * 120 + "b"  # 241 bytes each, one prefix
    for suffix in ("old", "resume", "lock"):
        assert len(os.fsencode(sibling(tmp_path / long_a, suffix).name)) <= 255
    assert stem(tmp_path / long_a) != stem(tmp_path / long_b) and stem(tmp_path / "short") == "short"
    with atomic_path(tmp_path / long_a) as tmp:
        assert len(os.fsencode(tmp.name)) <= 255
        tmp.write_text("x")
    (tmp_path / f".{stem(tmp_path / long_b)}.999999999-zz.tmp").write_text("a leftover of a dead process")
    sweep_leftovers(tmp_path / long_b)
    assert sorted(p.name for p in tmp_path.iterdir()) == [long_a]


# ---------------------------------------------------------------------------------------------- options alone
@pytest.mark.parametrize("extra, named", [
    (["--keep-confidence", 0.95], ["--keep-confidence", "--keep"]),
    (["--keep-data", "{tmp}/sel.jsonl"], ["--keep-data", "--keep"]),
    (["--keep-holdout", 0.3, "--keep-tolerance", 0.2], ["--keep-holdout", "--keep-tolerance"]),
    (["--keep-new-tokens", 8], ["--keep-new-tokens", "--keep"]),
])
def test_keep_options_without_keep_are_refused_before_any_work(extra, named, ft_run, toy_data, tmp_path):
    (tmp_path / "sel.jsonl").write_text('{"text": "fine", "label": "1"}\n')
    extra = [str(x).replace("{tmp}", str(tmp_path)) for x in extra]
    refused(tmp_path, ["graft", "--finetuned", ft_run, "--out", tmp_path / "g", "--data-dir", toy_data, *extra],
            *named, "only --keep or --keep-agreement starts")


@pytest.mark.parametrize("extra, named", [
    (["--text-field", "review"], ["--text-field", "--data"]),
    (["--labels", "bad,good", "--eval-fraction", 0.3], ["--eval-fraction", "--labels", "--data"]),
])
def test_data_file_options_without_data_are_refused_before_any_work(extra, named, ft_run, toy_data, tmp_path):
    refused(tmp_path, ["graft", "--finetuned", ft_run, "--out", tmp_path / "g", "--data-dir", toy_data, *extra],
            *named, "describe")


def test_merge_keep_confidence_without_keep_is_refused():
    from skillgraft.verbs.merge import MergeSpec

    with pytest.raises(SkillgraftError, match="--keep-confidence .* only --keep starts"):
        MergeSpec.build({"keep_confidence": 0.95})
    assert MergeSpec.build({"keep": 0.9, "keep_confidence": 0.95}).keep_confidence == 0.95


# ---------------------------------------------------------------------------------------------- labels
def test_csv_labels_written_as_floats_read_as_the_jsonl_labels(tmp_path):
    """pandas writes an integer label column read as floats as 0.0 / 1.0; JSONL's 1.0 was read as 1, CSV's refused."""
    from skillgraft.data.loading import read_file
    from skillgraft.data.tasks import get_task

    task = get_task("SST-2")
    (tmp_path / "train.csv").write_text("0.0,a dull film\n1.0,a fine film\n1,a good film\n")
    (tmp_path / "train.jsonl").write_text('{"label": 0.0, "text": "a dull film"}\n{"label": 1.0, "text": "a fine film"}\n'
                                          '{"label": 1, "text": "a good film"}\n')
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na dull film\t0.0\na fine film\t1.0\na good film\t1\n")
    rows = {s: [(e.text_a, e.label) for e in read_file(task, tmp_path / f"train.{s}")] for s in ("csv", "jsonl", "tsv")}
    assert rows["csv"] == rows["jsonl"] == rows["tsv"] == [("a dull film", 0), ("a fine film", 1), ("a good film", 1)]
    (tmp_path / "bad.csv").write_text("1.5,a film\n")
    with pytest.raises(SkillgraftError, match="unknown label '1.5'"):
        read_file(task, tmp_path / "bad.csv")


def test_user_csv_labels_written_as_floats_are_the_same_labels_as_jsonl(tmp_path):
    from skillgraft.data.spec import UserDataSpec

    rows = [("a dull film", 0), ("a fine film", 1)] * 6
    (tmp_path / "r.csv").write_text("text,label\n" + "".join(f"{t},{float(y)}\n" for t, y in rows))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": t, "label": float(y)}) + "\n" for t, y in rows))
    csv = UserDataSpec.build({"data": tmp_path / "r.csv"}).load()
    jsonl = UserDataSpec.build({"data": tmp_path / "r.jsonl"}).load()
    assert csv.task.labels == jsonl.task.labels == ("0", "1")
    assert [(e.text_a, e.label) for e in csv.train] == [(e.text_a, e.label) for e in jsonl.train]


def test_label_words_that_leave_the_prompt_no_position_are_one_line(tiny_models):
    """Causal scoring of multi-token label words: the prompt is cut to leave them room (before: the words went past
    max_length and past the model's positions, an IndexError), and words too long for any prompt are refused."""
    from skillgraft.data.loading import Example
    from skillgraft.data.tasks import register_task, task_from_dict
    from skillgraft.models.scorer import build_scorer

    words = " ".join(["wonderful"] * 60)
    register_task(task_from_dict({"name": "long-words", "kind": "single", "labels": ["0", "1"],
                                  "label_words": ["bad " + words, "good " + words],
                                  "template": "*cls**sent_0*_It_was*mask*."}, "test"), overwrite=True)
    scorer = build_scorer(str(tiny_models["gpt2"]), "long-words", "causal", max_length=128)  # 128 positions
    batch = scorer.collate([Example("a fine film " * 40, 0), Example("dull", 1)])
    assert batch["input_ids"].shape[1] <= 128
    assert scorer(**batch).shape == (2, 2)
    with pytest.raises(SkillgraftError, match="label word 'bad wonderful.* is 61 tokens .* max_length=20"):
        build_scorer(str(tiny_models["gpt2"]), "long-words", "causal", max_length=20)


# ---------------------------------------------------------------------------------------------- names from paths
def test_model_names_from_paths_with_dots_are_folder_names(tmp_path, monkeypatch):
    """`merge --finetuned x/..` named its model '..': grafts/.. lay outside the output, and the merge failed after
    all its work naming a temporary folder."""
    from skillgraft.verbs.merge_inputs import task_names

    (tmp_path / "sentiment" / "sub").mkdir(parents=True)
    (tmp_path / "topic").mkdir()
    monkeypatch.chdir(tmp_path / "topic")
    names = task_names(["../sentiment/sub/..", ".", "org/some-model", "../sentiment/sub/", "my model"])
    assert names == ["sentiment", "topic", "some-model", "sub", "my_model"]
    assert not any(n in (".", "..") or "/" in n for n in names)
