"""Bad data files (data/): task files, user files and other tools' encodings.

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (docs/reliability.md; helpers: tests/badinputs.py)."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil

import pytest

from skillgraft.graft import Graft
from badinputs import as_other_tools_write, invoke, refused


# ---------------------------------------------------------------------------------------------- data files
GOOD_JSONL = b"".join(json.dumps({"text": f"good film {i}" if i % 2 else f"bad film {i}", "label": str(i % 2)})
                      .encode() + b"\n" for i in range(40))
GOOD_TSV = b"sentence\tlabel\n" + b"".join(f"film {i}\t{i % 2}\n".encode() for i in range(40))

DATA_CASES = {
    # id: (file under the data root, its bytes, culprits in the message)
    "jsonl-malformed-json": ("SST-2/train.jsonl", b'{"text": "good", "label": "1"}\n{"text": "bad", "label": \n',
                             ["train.jsonl:2", "malformed JSON"]),
    "jsonl-label-list": ("SST-2/train.jsonl", b'{"text": "good", "label": ["1"]}\n', ["train.jsonl:1", "'label'",
                                                                                      "list"]),
    "jsonl-label-dict": ("SST-2/train.jsonl", b'{"text": "good", "label": {"y": 1}}\n', ["'label'", "dict"]),
    "jsonl-label-null": ("SST-2/train.jsonl", b'{"text": "good", "label": null}\n', ["'label'", "null"]),
    "jsonl-row-not-object": ("SST-2/train.jsonl", b'["good", "1"]\n', ["train.jsonl:1", "expected a JSON object"]),
    "jsonl-text-missing": ("SST-2/train.jsonl", b'{"sentence": "good", "label": "1"}\n', ["'text'", "missing"]),
    "jsonl-text-number": ("SST-2/train.jsonl", b'{"text": 5, "label": "1"}\n', ["'text'", "must be a string"]),
    "jsonl-unknown-label": ("SST-2/train.jsonl", b'{"text": "good", "label": "positive"}\n',
                            ["unknown label 'positive'"]),
    "jsonl-binary": ("SST-2/train.jsonl", bytes(range(256)) * 4, ["train.jsonl:1", "NUL byte"]),
    "jsonl-latin1": ("SST-2/train.jsonl", '{"text": "café", "label": "1"}\n'.encode("latin-1"),
                     ["train.jsonl:1", "not UTF-8", "0xe9"]),
    "jsonl-empty": ("SST-2/train.jsonl", b"\n\n", ["train.jsonl", "empty"]),
    "jsonl-nan-label": ("SST-2/train.jsonl", b'{"text": "good", "label": "1"}\n{"text": "bad", "label": NaN}\n',
                        ["train.jsonl:2", "NaN", "non-finite"]),
    "jsonl-overflowing-number": ("SST-2/train.jsonl", b'{"text": "good", "label": 1e999}\n',
                                 ["train.jsonl:1", "1e999", "non-finite"]),
    "jsonl-utf16-broken": ("SST-2/train.jsonl", b"\xff\xfe{\x00\x00\xd8", ["train.jsonl", "UTF-16"]),
    "csv-unterminated-quote": ("original/SST-2/train.csv", b'1,"a good film"\n0,"a bad film\n',
                               ["train.csv:", "malformed CSV"]),
    "csv-nul-byte": ("original/SST-2/train.csv", b'1,"a good film"\n0,"a bad\x00 film"\n', ["train.csv:2", "NUL byte"]),
    "csv-latin1": ("original/SST-2/train.csv", "1,un film génial\n".encode("latin-1"), ["train.csv:1", "not UTF-8"]),
    "csv-one-column": ("original/SST-2/train.csv", b"1\n", ["train.csv:1", "'label,text'"]),
    "tsv-latin1": ("original/SST-2/train.tsv", "sentence\tlabel\ncafé\t1\n".encode("latin-1"),
                   ["train.tsv:2", "not UTF-8"]),
    "tsv-unknown-header": ("original/SST-2/train.tsv", b"text\tstars\ngood\t5\n", ["train.tsv", "TSV header"]),
    "tsv-missing-column": ("original/SST-2/train.tsv", b"sentence\tlabel\ngood\n", ["train.tsv:2", "columns"]),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_file(case, tiny_bert, tmp_path):
    rel, content, culprits = DATA_CASES[case]
    root = tmp_path / "data"
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_bytes(content)
    (root / rel).with_stem("test").write_bytes(GOOD_TSV if rel.endswith(".tsv") else GOOD_JSONL
                                               if rel.endswith(".jsonl") else b"1,good\n0,bad\n" * 20)
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--steps", 1,
                       "--data-dir", root, "--out", tmp_path / "run"], str(root / rel).split(":")[0], *culprits)


def test_folder_where_the_data_file_should_be(tiny_bert, tmp_path):
    (tmp_path / "data" / "SST-2" / "train.jsonl").mkdir(parents=True)
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--data-dir", tmp_path / "data",
                       "--out", tmp_path / "run"], str(tmp_path / "data" / "SST-2" / "train.jsonl"), "a folder")


def test_unreadable_data_file(tiny_bert, toy_data, tmp_path, monkeypatch):
    """A data file we may not read (injected: tests run as root) is one line naming it."""
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self.name == "train.jsonl":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--data-dir", toy_data,
                       "--out", tmp_path / "run"], str(toy_data / "SST-2" / "train.jsonl"), "permission denied")


def test_impossible_k(tiny_bert, toy_data, tmp_path):
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 500, "--model", tiny_bert, "--data-dir", toy_data,
                       "--out", tmp_path / "run"], "K=500")

# ---------------------------------------------------------------------------------------------- files from other tools
OTHER_TOOLS = ["bom", "crlf", "trailing-blank-lines", "bom-crlf-blank", "utf-16"]
GOOD_CSV = "".join(f'{i % 2},"film, {i}"\n' for i in range(40))


@pytest.mark.parametrize("how", OTHER_TOOLS)
@pytest.mark.parametrize("rel, text", [("SST-2/train.jsonl", GOOD_JSONL.decode()),
                                       ("original/SST-2/train.tsv", GOOD_TSV.decode()),
                                       ("original/SST-2/train.csv", GOOD_CSV)], ids=["jsonl", "tsv", "csv"])
def test_task_files_written_by_other_tools_read_as_any_other(rel, text, how, tmp_path):
    """A registered task's file (``--data-dir``) with a BOM, CRLF, trailing blank lines or in UTF-16 gives
    exactly the examples of the plain UTF-8 file."""
    from skillgraft.data import read_file
    from skillgraft.data.tasks import get_task

    plain, other = tmp_path / "plain" / rel, tmp_path / "other" / rel
    for path, content in ((plain, text.encode()), (other, as_other_tools_write(text, how))):
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
    assert read_file(get_task("SST-2"), other) == read_file(get_task("SST-2"), plain)


USER_ROWS = [{"review": f"a {'good' if i % 2 else 'bad'} film, really {i}", "stars": ["bad", "good"][i % 2]}
             for i in range(30)]


def _user_text(suffix: str) -> str:
    if suffix == ".jsonl":
        return "".join(json.dumps(r) + "\n" for r in USER_ROWS)
    sep = "\t" if suffix == ".tsv" else ","
    quote = (lambda v: v) if suffix == ".tsv" else (lambda v: f'"{v}"')
    return f"review{sep}stars\n" + "".join(f"{quote(r['review'])}{sep}{r['stars']}\n" for r in USER_ROWS)


@pytest.mark.parametrize("how", OTHER_TOOLS)
@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_user_files_written_by_other_tools_read_as_any_other(suffix, how, tmp_path):
    """``--data FILE`` (graft / evaluate a checkpoint) with a BOM (the header's first column too), CRLF,
    trailing blank lines or UTF-16: the same rows, labels and hold-out as the plain UTF-8 file."""
    from skillgraft.data.spec import UserDataSpec

    text = _user_text(suffix)
    plain, other = tmp_path / f"plain{suffix}", tmp_path / f"other{suffix}"
    plain.write_bytes(text.encode())
    other.write_bytes(as_other_tools_write(text, how))
    spec = {"text_field": "review", "label_field": "stars"}
    a, b = (UserDataSpec.build({"data": p, **spec}).load() for p in (plain, other))
    assert (b.train, b.test, b.task.labels) == (a.train, a.test, a.task.labels)
    assert len(a.train) + len(a.test) == len(USER_ROWS) and a.task.labels == ("bad", "good")


@pytest.mark.parametrize("how", ["bom-crlf-blank", "utf-16"])
def test_configs_written_by_other_tools_read_as_any_other(how, ft_run, tiny_graft, tmp_path):
    """A recipe, a run's config.json and a graft_config.json re-saved by a Windows editor read as before."""
    from skillgraft.recipes import load_recipe
    from skillgraft.train.run import read_run_config

    recipes = pathlib.Path(__file__).resolve().parents[1] / "recipes"
    (tmp_path / "r.yaml").write_bytes(as_other_tools_write((recipes / "calibration.yaml").read_text(), how))
    assert load_recipe(tmp_path / "r.yaml")[1] == load_recipe(recipes / "calibration.yaml")[1]
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    (run / "config.json").write_bytes(as_other_tools_write((ft_run / "config.json").read_text(), how))
    assert read_run_config(run) == read_run_config(ft_run)
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    (folder / "graft_config.json").write_bytes(as_other_tools_write((tiny_graft / "graft_config.json").read_text(),
                                                                     how))
    assert Graft.from_pretrained(folder).size == Graft.from_pretrained(tiny_graft).size


def test_evaluate_a_checkpoint_on_a_jsonl_with_a_byte_order_mark(tiny_classifier, tmp_path):
    """The issue's case: `skillgraft evaluate CKPT --data reviews.jsonl` on a file a Windows tool saved."""
    text = _user_text(".jsonl")
    (tmp_path / "plain.jsonl").write_bytes(text.encode())
    (tmp_path / "bom.jsonl").write_bytes(as_other_tools_write(text, "bom-crlf-blank"))
    outputs = []
    for name in ("plain.jsonl", "bom.jsonl"):
        r = invoke("evaluate", tiny_classifier, "--data", tmp_path / name, "--text-field", "review",
                   "--label-field", "stars")
        assert r.exit_code == 0, r.output
        outputs += [line.replace(name.split(".")[0], "") for line in r.output.splitlines() if " acc " in line]
    assert len(outputs) == 2 and outputs[0] == outputs[1] and f"(n={len(USER_ROWS)})" in outputs[0]


USER_CASES = {
    # id: (file name, its bytes, culprits in the message)
    "jsonl-nan": ("r.jsonl", b'{"review": "good", "stars": "good"}\n{"review": NaN, "stars": "bad"}\n',
                  ["r.jsonl:2", "NaN"]),
    "jsonl-latin1": ("r.jsonl", '{"review": "café", "stars": "good"}\n'.encode("latin-1"),
                     ["r.jsonl:1", "not UTF-8", "0xe9"]),
    "jsonl-binary": ("r.jsonl", bytes(range(256)), ["r.jsonl:1", "NUL byte"]),
    "csv-latin1": ("r.csv", "review,stars\ncafé,good\n".encode("latin-1"), ["r.csv:2", "not UTF-8"]),
    "csv-extra-field": ("r.csv", b"review,stars\ngood film,good\nbad, film,bad\n",
                        ["r.csv:3", "3 fields", "2 columns"]),
    "csv-repeated-column": ("r.csv", b"review,review,stars\na,b,good\n", ["r.csv:1", "'review' appears twice"]),
    "csv-unterminated-quote": ("r.csv", b'review,stars\n"good film,good\n', ["r.csv:", "malformed CSV"]),
    "tsv-header-only": ("r.tsv", b"review\tstars\r\n\r\n", ["r.tsv", "no rows"]),
}


@pytest.mark.parametrize("case", list(USER_CASES))
def test_bad_user_data_file(case, tiny_classifier, tmp_path):
    name, content, culprits = USER_CASES[case]
    (tmp_path / name).write_bytes(content)
    refused(tmp_path, ["evaluate", tiny_classifier, "--data", tmp_path / name, "--text-field", "review",
                       "--label-field", "stars", "--out", tmp_path / "eval"], str(tmp_path / name), *culprits)


def test_evaluate_a_skillgraft_run_on_data_rows_says_what_it_takes(ft_run, tmp_path):
    """`evaluate RUN --data FILE` (a careless user's first try) was `cannot tell how to score this checkpoint`."""
    (tmp_path / "r.jsonl").write_text('{"text": "good", "label": "1"}\n')
    refused(tmp_path, ["evaluate", ft_run, "--data", tmp_path / "r.jsonl", "--out", tmp_path / "ev"], str(ft_run),
            "a skillgraft model", "not on --data rows")
