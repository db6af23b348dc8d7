"""Bad inputs and faults: each gets a one-line error naming the culprit, before any work, and nothing that
existed before is touched, nothing half-written is left behind (docs/reliability.md lists the guarantees and
this catalogue).

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (no output, no ``.name.*.tmp`` sibling, inputs untouched).
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import tempfile

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.graft import Graft, Region, graftable_names
from skillgraft.models import build_scorer

runner = CliRunner()


def enospc() -> OSError:
    """What a write on a full disk raises (no file name: os.write knows only a descriptor)."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(root: pathlib.Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones included) with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def one_line(r, *culprits: str) -> str:
    """Exit 2, no traceback, exactly one ``error:`` line, naming every culprit; returns that line."""
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), f"{type(r.exception).__name__}: {r.exception}"
    assert "Traceback" not in r.output
    lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.output
    for c in culprits:
        assert str(c) in lines[0], f"{c!r} not in {lines[0]!r}"
    return lines[0]


def usage_error(r, *culprits: str) -> None:
    """click's usage error (bad choice or range of an option): exit 2, no traceback, naming the option."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())
    for c in culprits:
        assert str(c) in text, f"{c!r} not in {text!r}"


def refused(root: pathlib.Path, args, *culprits: str, usage: bool = False) -> str | None:
    """Run ``args``; it fails naming ``culprits`` and leaves ``root`` exactly as it was."""
    before = snapshot(root)
    r = invoke(*args)
    line = usage_error(r, *culprits) if usage else one_line(r, *culprits)
    after = snapshot(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k, 0) != after.get(k, 0))
    assert not changed, f"the failed command changed files: {changed}"
    return line


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny_graft(tiny_bert, tmp_path_factory):
    """A small graft on the tiny BERT (task SST-2, head mode), saved to a folder."""
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=1)
    with torch.no_grad():
        for p in ft.model.parameters():
            p.add_(0.01)
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    region = Region(shapes, {names[0]: [0, 3, 5, 17], names[2]: [1, 2]})
    folder = tmp_path_factory.mktemp("graft") / "g"
    Graft.from_models(pre, ft, region, {"task": "SST-2", "mode": "head"}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def ft_run(tiny_bert, toy_data, tmp_path_factory):
    """A fine-tuning run directory of the tiny BERT (a few steps; enough to graft from)."""
    out = tmp_path_factory.mktemp("ft") / "run"
    r = invoke("finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", tiny_bert, "--optimizer", "adamw",
               "--lr", 1e-3, "--steps", 6, "--eval-every", 3, "--data-dir", toy_data, "--test-limit", 8, "--out", out)
    assert r.exit_code == 0, r.output
    return out


def graft_args(ft_run, toy_data, out, store, *extra):
    """A quick `skillgraft graft` (2 localization steps, one budget, no baselines, 8 test examples)."""
    return ("graft", "--finetuned", ft_run, "--out", out, "--cache", store, "--budgets", "0.05", "--steps", 2,
            "--test-limit", 8, "--baselines", "", "--no-lottery-zero", "--data-dir", toy_data, *extra)


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
def _as_other_tools_write(text: str, how: str) -> bytes:
    """``text`` as Windows tools save it: a UTF-8 byte-order mark, CRLF line ends, trailing blank lines, or
    UTF-16 with its byte-order mark (Notepad's "Unicode", PowerShell 5's ``>``)."""
    crlf = text.replace("\n", "\r\n")
    return {"bom": codecs.BOM_UTF8 + text.encode(),
            "crlf": crlf.encode(),
            "trailing-blank-lines": text.encode() + b"\n\n \n",
            "bom-crlf-blank": codecs.BOM_UTF8 + crlf.encode() + b"\r\n\r\n",
            "utf-16": crlf.encode("utf-16")}[how]


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
    for path, content in ((plain, text.encode()), (other, _as_other_tools_write(text, how))):
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
    other.write_bytes(_as_other_tools_write(text, how))
    spec = {"text_field": "review", "label_field": "stars"}
    a, b = (UserDataSpec.build({"data": p, **spec}).load() for p in (plain, other))
    assert (b.train, b.test, b.task.labels) == (a.train, a.test, a.task.labels)
    assert len(a.train) + len(a.test) == len(USER_ROWS) and a.task.labels == ("bad", "good")


@pytest.mark.parametrize("how", ["bom-crlf-blank", "utf-16"])
def test_configs_written_by_other_tools_read_as_any_other(how, ft_run, tiny_graft, tmp_path):
    """A recipe, a run's config.json and a graft_config.json re-saved by a Windows editor read as before."""
    from skillgraft.recipes.base import load_recipe
    from skillgraft.train.run import read_run_config

    recipes = pathlib.Path(__file__).resolve().parents[1] / "recipes"
    (tmp_path / "r.yaml").write_bytes(_as_other_tools_write((recipes / "calibration.yaml").read_text(), how))
    assert load_recipe(tmp_path / "r.yaml")[1] == load_recipe(recipes / "calibration.yaml")[1]
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    (run / "config.json").write_bytes(_as_other_tools_write((ft_run / "config.json").read_text(), how))
    assert read_run_config(run) == read_run_config(ft_run)
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    (folder / "graft_config.json").write_bytes(_as_other_tools_write((tiny_graft / "graft_config.json").read_text(),
                                                                     how))
    assert Graft.from_pretrained(folder).size == Graft.from_pretrained(tiny_graft).size


@pytest.fixture(scope="module")
def tiny_classifier(tiny_bert, tmp_path_factory):
    """A plain Hugging Face sequence classifier (the tiny BERT with a fresh 2-label head)."""
    import transformers as tf

    out = tmp_path_factory.mktemp("clf") / "clf"
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        tiny_bert, num_labels=2, id2label={0: "bad", 1: "good"}, label2id={"bad": 0, "good": 1})
    model.save_pretrained(out)
    tf.AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(out)
    return out


def test_evaluate_a_checkpoint_on_a_jsonl_with_a_byte_order_mark(tiny_classifier, tmp_path):
    """The issue's case: `skillgraft evaluate CKPT --data reviews.jsonl` on a file a Windows tool saved."""
    text = _user_text(".jsonl")
    (tmp_path / "plain.jsonl").write_bytes(text.encode())
    (tmp_path / "bom.jsonl").write_bytes(_as_other_tools_write(text, "bom-crlf-blank"))
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


# ---------------------------------------------------------------------------------------------- CLI options
OPTION_CASES = {
    # id: (verb and options after the common ones, culprits, is click's usage error)
    "finetune-k-zero": (["finetune", "--k", 0], ["--k", "got 0"], False),
    "finetune-k-negative": (["finetune", "--k", -1], ["--k", "got -1"], False),
    "finetune-lr-zero": (["finetune", "--lr", 0], ["--lr", "got 0.0"], False),
    "finetune-steps-negative": (["finetune", "--steps", -5], ["--steps", "got -5"], False),
    "finetune-batch-size-zero": (["finetune", "--batch-size", 0], ["--batch-size", "got 0"], False),
    "finetune-max-length-zero": (["finetune", "--max-length", 0], ["--max-length", "got 0"], False),
    "finetune-test-limit-zero": (["finetune", "--test-limit", 0], ["--test-limit", "got 0"], False),
    "finetune-unknown-optimizer": (["finetune", "--optimizer", "adagrad"], ["--optimizer", "adagrad"], True),
    "finetune-unknown-mode": (["finetune", "--mode", "seq2seq"], ["--mode", "seq2seq"], True),
    "finetune-bad-layers": (["finetune", "--layers", "a,b"], ["--layers", "'a,b'"], False),
    "finetune-unknown-task": (["finetune", "--task", "SST-9"], ["unknown task 'SST-9'"], False),
    "graft-budgets-zero-and-fraction": (["graft", "--budgets", "0,2.5"], ["--budgets", "budget 0 ", "budget 2.5"],
                                        False),
    "graft-budgets-not-a-number": (["graft", "--budgets", "abc"], ["--budgets", "'abc'"], False),
    "graft-test-limit-zero": (["graft", "--test-limit", 0], ["--test-limit", "got 0"], False),
    "graft-steps-negative": (["graft", "--steps", -3], ["--steps", "got -3"], False),
    "graft-lr-negative": (["graft", "--lr", -1], ["--lr", "got -1"], False),
    "graft-sparsity-above-one": (["graft", "--sparsity", 2], ["--sparsity", "got 2"], False),
    "graft-unknown-localizer": (["graft", "--localizer", "oracle"], ["oracle"], False),
    "graft-unknown-baseline": (["graft", "--baselines", "oracle"], ["oracle"], False),
    "sweep-level-zero": (["sweep", "--levels", "0,0.5"], ["--levels", "budget 0 "], False),
    "evaluate-limit-zero": (["evaluate", "{run}", "--limit", 0], ["--limit", "greater than or equal to 1"], True),
    "evaluate-limit-negative": (["evaluate", "{run}", "--limit", -1], ["--limit", "greater than or equal to 1"], True),
    "evaluate-unknown-split": (["evaluate", "{run}", "--split", "validation"], ["'validation'"], False),
    "apply-limit-zero": (["apply", "{graft}", "--limit", 0], ["--limit", "greater than or equal to 1"], True),
    "export-unknown-target": (["export", "{graft}", "--out", "{tmp}/e", "--to", "onnx"], ["--to", "onnx"], True),
    "fim-n-zero": (["fim", "--task", "SST-2", "--n", 0], ["--n", "got 0"], False),
    "fim-unknown-kind": (["fim", "--task", "SST-2", "--kind", "exact"], ["--kind", "'exact'"], True),
    "continual-sparsity-negative": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--sparsity", -1],
                                    ["--sparsity", "got -1"], False),
    "continual-steps-negative": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--steps", -1],
                                 ["--steps", "got -1"], False),
    # numbers out of range: seeds in [0, 2**32 - 1], counts up to 2**31 - 1, floats finite and within float32
    "finetune-seed-negative": (["finetune", "--seed", -1], ["--seed", "greater than or equal to 0", "got -1"], False),
    "finetune-seed-too-large": (["finetune", "--seed", 2**32], ["--seed", "less than or equal to 4294967295"],
                                False),
    "finetune-model-seed-negative": (["finetune", "--model-seed", -1], ["--model-seed", "got -1"], False),
    "finetune-lr-nan": (["finetune", "--lr", "nan"], ["--lr", "finite number"], False),
    "finetune-lr-overflow": (["finetune", "--lr", 1e39], ["--lr", "less than or equal to"], False),
    "finetune-weight-decay-overflow": (["finetune", "--weight-decay", 1e308], ["--weight-decay", "less than"], False),
    "finetune-steps-huge": (["finetune", "--steps", 2**64], ["--steps", "less than or equal to 2147483647"], False),
    "finetune-max-length-huge": (["finetune", "--max-length", 2**64], ["--max-length", "less than or equal"], False),
    "finetune-max-length-beyond-positions": (["finetune", "--max-length", 129],
                                             ["--max-length 129", "128 positions", "at most 128"], False),
    "graft-seed-negative": (["graft", "--seed", -1], ["--seed", "got -1"], False),
    "graft-steps-huge": (["graft", "--steps", 2**64], ["--steps", "less than or equal"], False),
    "graft-sigmoid-bias-inf": (["graft", "--sigmoid-bias", "inf"], ["--sigmoid-bias", "finite number"], False),
    "graft-lr-overflow": (["graft", "--lr", 1e308], ["--lr", "less than or equal"], False),
    "graft-max-length-zero": (["graft", "--max-length", 0], ["--max-length"], True),
    "sweep-seed-too-large": (["sweep", "--seed", 2**40], ["--seed", "less than or equal"], False),
    "fim-fisher-seed-negative": (["fim", "--task", "SST-2", "--fisher-seed", -1], ["--fisher-seed", "got -1"], False),
    "fim-seed-negative": (["fim", "--task", "SST-2", "--seed", -1], ["--seed", "got -1"], False),
    "continual-seed-negative": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--seed", -1],
                                ["--seed", "greater than or equal to 0"], True),
    "continual-k-zero": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--k", 0], ["--k"], True),
    "demo-seed-negative": (["demo", "--seed", -1], ["--seed", "greater than or equal to 0"], True),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_bad_option(case, ft_run, tiny_graft, tiny_bert, toy_data, tmp_path):
    args, culprits, usage = OPTION_CASES[case]
    names = {"run": ft_run, "graft": tiny_graft, "tmp": tmp_path}
    args = [str(a).format(**names) for a in args]
    verb = args[0] if args[0] != "continual" else "continual add"
    common = {"finetune": ["--task", "SST-2", "--model", tiny_bert, "--out", tmp_path / "run"],
              "graft": ["--finetuned", ft_run, "--out", tmp_path / "g", "--cache", tmp_path / "store"],
              "sweep": ["--finetuned", ft_run, "--out", tmp_path / "s", "--cache", tmp_path / "store"],
              "fim": ["--model", tiny_bert, "--out", tmp_path / "fim"],
              "continual add": ["--model", tiny_bert],
              "demo": ["--out", tmp_path / "demo", "--cache", tmp_path / "store"]}.get(verb, [])
    n = len(verb.split())
    args = [*args[:n], *common, *args[n:]]  # the case's own options come last, so they win
    if verb != "export":
        args += ["--data-dir", toy_data]
    before = snapshot(ft_run)
    refused(tmp_path, args, *culprits, usage=usage)
    assert snapshot(ft_run) == before


# ---------------------------------------------------------------------------------------------- run directories
def _edit_config(change):
    def edit(run):
        cfg = json.loads((run / "config.json").read_text())
        change(cfg)
        (run / "config.json").write_text(json.dumps(cfg))
    return edit


def _edit_json(rel, change):
    def edit(run):
        cfg = json.loads((run / rel).read_text())
        change(cfg)
        (run / rel).write_text(json.dumps(cfg))
    return edit


def _edit_tensors(rel, change, metadata=None):
    """Rewrite a safetensors file with ``change`` applied to its tensors."""
    def edit(run):
        tensors = load_file(str(run / rel))
        change(tensors)
        save_file(tensors, str(run / rel), metadata=metadata)
    return edit


def _truncate(rel, keep):
    def edit(run):
        path = run / rel
        path.write_bytes(path.read_bytes()[:keep])
    return edit


RUN_CASES = {
    # id: (damage done to a copy of a good run, culprits)
    "no-model-folder": (lambda run: shutil.rmtree(run / "model"), ["no model/ folder"]),
    "no-config": (lambda run: (run / "config.json").unlink(), ["config.json", "not found"]),
    "config-not-json": (lambda run: (run / "config.json").write_text("{'k': 8"), ["config.json", "not valid JSON"]),
    "config-a-list": (lambda run: (run / "config.json").write_text("[8, 13]"), ["config.json", "JSON object",
                                                                                 "list"]),
    "config-binary": (lambda run: (run / "config.json").write_bytes(b"\x80\x00\x01"), ["config.json:1", "NUL byte"]),
    "config-latin1": (lambda run: (run / "config.json").write_bytes('{"model": "café"}'.encode("latin-1")),
                      ["config.json:1", "not UTF-8 text"]),
    "config-without-model": (_edit_config(lambda c: c.pop("model")), ["config.json", "'model'"]),
    "config-without-max-length": (_edit_config(lambda c: c.pop("max_length")), ["config.json", "'max_length'"]),
    "config-without-head-seed": (_edit_config(lambda c: c["finetune"].pop("seed")), ["config.json", "finetune.seed"]),
    "config-k-a-string": (_edit_config(lambda c: c.update(k="eight")), ["config.json", "'k'", "'eight'"]),
    "config-unknown-mode": (_edit_config(lambda c: c.update(mode="seq2seq")), ["config.json", "mode", "'seq2seq'"]),
    "truncated-head": (_truncate("model/head.safetensors", 60), ["head.safetensors"]),
    "truncated-weights": (_truncate("model/model.safetensors", 1000), ["run/model", "deserializing"]),
    "no-scorer-config": (lambda run: (run / "model" / "scorer_config.json").unlink(), ["scorer_config.json"]),
    "scorer-config-a-list": (lambda run: (run / "model" / "scorer_config.json").write_text("[1]"),
                             ["scorer_config.json", "expected a JSON object, got list"]),
    "scorer-config-max-length-a-string": (_edit_json("model/scorer_config.json", lambda c: c.update(max_length="x")),
                                          ["scorer_config.json", "'max_length'", "'x'"]),
    "head-nan": (_edit_tensors("model/head.safetensors", lambda t: t["bias"].__setitem__(1, float("nan"))),
                 ["run/model", "'head.bias'[1] is nan"]),
    "weights-inf": (_edit_tensors("model/model.safetensors", lambda t: t[sorted(t)[3]].view(-1).__setitem__(
        0, float("inf")), metadata={"format": "pt"}), ["run/model", "[0] is inf"]),
}


def test_evaluating_a_model_with_nan_weights_is_refused(ft_run, toy_data, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    _edit_tensors("model/head.safetensors", lambda t: t["weight"].view(-1).__setitem__(3, float("nan")))(run)
    refused(tmp_path, ["evaluate", run, "--data-dir", toy_data, "--limit", 4, "--out", tmp_path / "ev"],
            str(run), "'head.weight'[3] is nan", "meaningless")


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_bad_run_directory(case, ft_run, toy_data, tmp_path):
    damage, culprits = RUN_CASES[case]
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    damage(run)
    line = refused(tmp_path, ["graft", "--finetuned", run, "--out", tmp_path / "g", "--cache", tmp_path / "store",
                              "--data-dir", toy_data], *culprits)
    assert str(run) in line


def test_run_directory_that_is_not_one(toy_data, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    refused(tmp_path, ["graft", "--finetuned", tmp_path / "missing", "--data-dir", toy_data],
            str(tmp_path / "missing"), "not found")
    refused(tmp_path, ["graft", "--finetuned", tmp_path / "notes.txt", "--out", tmp_path / "g",
                       "--data-dir", toy_data], str(tmp_path / "notes.txt"), "not a fine-tuning run directory")


# ---------------------------------------------------------------------------------------------- graft files
def _graft_config(change):
    def edit(folder):
        cfg = json.loads((folder / "graft_config.json").read_text())
        change(cfg)
        (folder / "graft_config.json").write_text(json.dumps(cfg))
    return edit


def _graft_tensors(change):
    """Rewrite graft.safetensors with ``change`` applied and its checksum updated (so the deeper check is hit)."""
    def edit(folder):
        path = folder / "graft.safetensors"
        tensors = load_file(str(path))
        change(tensors)
        save_file(tensors, str(path))
        _graft_config(lambda c: c.update(weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest()))(folder)
    return edit


def _flip(folder):
    path = folder / "graft.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def _duplicate(t):
    idx = t["indices"].clone()
    idx[2] = idx[1]
    t["indices"] = idx


GRAFT_CASES = {
    # id: (damage to a copy of a good graft folder, verb, culprits)
    "truncated": (_truncate("graft.safetensors", 100), "apply", ["graft.safetensors", "truncated or corrupted"]),
    "bit-flipped": (_flip, "inspect", ["graft.safetensors"]),
    "shapes-removed": (_graft_config(lambda c: c.pop("shapes")), "export", ["graft_config.json", "'shapes'"]),
    "size-removed": (_graft_config(lambda c: c.pop("size")), "apply", ["graft_config.json", "'size'"]),
    "config-not-json": (lambda f: (f / "graft_config.json").write_text("{"), "inspect",
                        ["graft_config.json", "not valid JSON"]),
    "weights-missing": (lambda f: (f / "graft.safetensors").unlink(), "apply", ["not a graft folder"]),
    "indices-shuffled": (_graft_tensors(lambda t: t.update(indices=t["indices"][[1, 0, 2, 3, 4, 5]].contiguous())),
                         "apply", ["graft.safetensors", "'indices'[1]", "sorted and unique"]),
    "indices-duplicated": (_graft_tensors(_duplicate), "inspect", ["'indices'[2]", "duplicated"]),
    "size-mismatch": (_graft_config(lambda c: c.update(size=5, density=c["density"] * 5 / c["size"])), "apply",
                      ["holds 6 positions", "declares 5"]),
    "fingerprint-removed": (_graft_config(lambda c: c.pop("base_fingerprint")), "apply", ["base_fingerprint",
                                                                                          "--force"]),
    "fingerprint-removed-export": (_graft_config(lambda c: c.pop("base_fingerprint")), "export",
                                   ["base_fingerprint", "--force"]),
    # non-finite values with a matching checksum (a buggy writer, another tool): refused, never applied
    "values-nan": (_graft_tensors(lambda t: t["values"].__setitem__(4, float("nan"))), "apply",
                   ["graft.safetensors", "'values'[4] is nan", "coordinate 1 of", "finite"]),
    "values-inf": (_graft_tensors(lambda t: t["values"].__setitem__(0, float("inf"))), "export",
                   ["graft.safetensors", "'values'[0] is inf", "coordinate 0 of"]),
    "values-minus-inf": (_graft_tensors(lambda t: t["values"].__setitem__(5, float("-inf"))), "inspect",
                         ["graft.safetensors", "'values'[5] is -inf"]),
    "carried-nan": (_graft_tensors(lambda t: t["carried::head.weight"].view(-1).__setitem__(7, float("nan"))),
                    "apply", ["graft.safetensors", "carried tensor 'head.weight'[7] is nan"]),
}


@pytest.mark.parametrize("case", list(GRAFT_CASES))
def test_bad_graft_file(case, tiny_graft, tiny_bert, toy_data, tmp_path):
    damage, verb, culprits = GRAFT_CASES[case]
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    damage(folder)
    args = {"apply": ["apply", folder, "--model", tiny_bert, "--data-dir", toy_data, "--export", tmp_path / "x"],
            "inspect": ["inspect", folder],
            "export": ["export", folder, "--model", tiny_bert, "--to", "delta", "--out", tmp_path / "x"]}[verb]
    line = refused(tmp_path, args, *culprits)
    assert str(folder) in line


def test_missing_fingerprint_is_accepted_with_force(tiny_graft, tiny_bert, toy_data, tmp_path):
    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    _graft_config(lambda c: c.pop("base_fingerprint"))(folder)
    r = invoke("apply", folder, "--model", tiny_bert, "--data-dir", toy_data, "--limit", 4, "--force")
    assert r.exit_code == 0, r.output


def test_graft_with_nan_is_never_exported(tiny_graft, tiny_bert, toy_data, tmp_path):
    """The issue's case: a NaN in graft.safetensors with a matching weights_sha256. `apply --export` is refused
    before any model is written; `Graft.from_pretrained` refuses it too (nothing to apply)."""
    from skillgraft.errors import SkillgraftError

    folder = tmp_path / "g"
    shutil.copytree(tiny_graft, folder)
    _graft_tensors(lambda t: t["values"].__setitem__(2, float("nan")))(folder)
    refused(tmp_path, ["apply", folder, "--model", tiny_bert, "--data-dir", toy_data, "--export", tmp_path / "x",
                       "--force"], "'values'[2] is nan")
    with pytest.raises(SkillgraftError, match=r"graft\.safetensors: tensor 'values'\[2\] is nan"):
        Graft.from_pretrained(folder)


def test_a_graft_with_non_finite_values_is_never_written(tiny_graft, tmp_path):
    from skillgraft.errors import SkillgraftError

    g = Graft.from_pretrained(tiny_graft)
    name = next(iter(g.values))
    g.values[name][1] = float("nan")
    with pytest.raises(SkillgraftError, match=r"tensor 'values'\[1\] is nan"):
        g.save_pretrained(tmp_path / "g")
    assert list(tmp_path.iterdir()) == []


def _first_float(position, value):
    """Set ``position`` of the first floating-point tensor (by name) to ``value``."""
    def edit(tensors):
        key = next(k for k, t in sorted(tensors.items()) if t.is_floating_point())
        tensors[key].view(-1)[position] = value
    return edit


ADAPTER_CASES = {
    # id: (damage to a copy of a SHiRA adapter exported from the tiny graft, culprits)
    "weights-nan": (_edit_tensors("adapter_model.safetensors", _first_float(1, float("nan"))),
                    ["adapter_model.safetensors", "[1] is nan"]),
    "weights-inf": (_edit_tensors("adapter_model.safetensors", _first_float(0, float("inf"))),
                    ["adapter_model.safetensors", "[0] is inf"]),
    "head-nan": (_edit_tensors("skillgraft_head.safetensors", _first_float(1, float("nan"))),
                 ["skillgraft_head.safetensors", "[1] is nan"]),
    "weights-truncated": (_truncate("adapter_model.safetensors", 50), ["adapter_model.safetensors", "truncated"]),
}


@pytest.fixture(scope="module")
def tiny_adapter(tiny_graft, tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapter") / "a"
    assert invoke("export", tiny_graft, "--model", tiny_bert, "--to", "peft", "--out", out).exit_code == 0
    return out


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_bad_peft_adapter(case, tiny_adapter, tiny_bert, tmp_path):
    """An imported PEFT adapter (`inspect ADAPTER`, `--compare ADAPTER`) holding NaN / ±Inf, or truncated."""
    damage, culprits = ADAPTER_CASES[case]
    folder = tmp_path / "a"
    shutil.copytree(tiny_adapter, folder)
    damage(folder)
    refused(tmp_path, ["inspect", folder, "--model", tiny_bert, "--out", tmp_path / "i"], str(folder), *culprits)


def test_fim_of_a_model_with_an_inf_weight_is_refused(tiny_bert, toy_data, tmp_path):
    model = tmp_path / "bert"
    shutil.copytree(tiny_bert, model)
    _edit_tensors("model.safetensors", lambda t: t[sorted(t)[2]].view(-1).__setitem__(4, float("-inf")),
                  metadata={"format": "pt"})(model)
    refused(tmp_path, ["fim", "--task", "SST-2", "--k", 4, "--model", model, "--n", 4, "--data-dir", toy_data,
                       "--out", tmp_path / "f"], str(model), "[4] is -inf", "Fisher scores would be meaningless")


def test_fine_tuning_whose_loss_turns_non_finite_stops(tiny_bert, toy_data, tmp_path):
    """SGD at lr 1e30 sends the weights to ±Inf after one step: one line naming the step, no run directory."""
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--steps", 4, "--lr", 1e30,
                       "--test-limit", 4, "--data-dir", toy_data, "--out", tmp_path / "run"],
            "fine-tuning stopped at step 2", "the loss is nan", "--lr")


def test_a_checkpoint_with_nan_weights_is_refused_before_grafting(ft_run, toy_data, tmp_path):
    """A run whose model holds a NaN (a diverged fine-tuning saved by an older version, a damaged file)."""
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    path = run / "model" / "model.safetensors"
    tensors = load_file(str(path))
    key = sorted(k for k in tensors if k.endswith("attention.self.query.weight"))[0]
    tensors[key].view(-1)[5] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    line = refused(tmp_path, graft_args(run, toy_data, tmp_path / "g", tmp_path / "store"), f"{run}/model",
                   "[5] is nan", "cannot be grafted")
    assert "query.weight" in line


@pytest.mark.parametrize("localizer", ["learned", "straight-through"])
def test_localization_whose_loss_turns_non_finite_stores_nothing(localizer, ft_run, toy_data, tmp_path, monkeypatch):
    """A loss that turns NaN mid-localization (injected at its second step) stops it with one line; no region
    reaches the store, no report folder."""
    from skillgraft.graft.localizers import engine

    calls = {"n": 0}

    def poisoned(loss):
        calls["n"] += 1
        return loss * float("nan") if calls["n"] > 1 else loss

    real_batch_loss = engine.batch_loss  # every learned localizer's loss (one engine)
    monkeypatch.setattr(engine, "batch_loss", lambda *a, **k: poisoned(real_batch_loss(*a, **k)))
    store = tmp_path / "store"
    store.mkdir()  # stays empty: no regions entry
    refused(tmp_path, [*graft_args(ft_run, toy_data, tmp_path / "g", store), "--localizer", localizer],
            "localization stopped at step 2", "the loss is nan")


# ------------------------------------------------------------------------------------------- region and state folders
def _region_tensors(change):
    return _edit_tensors("region.safetensors", lambda t: change(t[sorted(t)[0]]))


REGION_CASES = {
    # id: (damage to a region folder (`continual add --region DIR`), culprits)
    "json-broken": (lambda d: (d / "region.json").write_text("{"), ["region.json", "not valid JSON"]),
    "json-a-list": (lambda d: (d / "region.json").write_text("[]"), ["region.json", "expected a JSON object"]),
    "no-shapes": (_edit_json("region.json", lambda m: m.pop("shapes")), ["region.json", "'shapes'"]),
    "weights-truncated": (_truncate("region.safetensors", 30), ["region.safetensors", "truncated or corrupted"]),
    "weights-missing": (lambda d: (d / "region.safetensors").unlink(), ["no region.safetensors"]),
    "index-out-of-range": (_region_tensors(lambda t: t.__setitem__(0, 10**9)),
                           ["region.safetensors", "[0] = 1000000000 is out of range"]),
    "index-negative": (_region_tensors(lambda t: t.__setitem__(0, -5)), ["region.safetensors", "[0] = -5"]),
    "float-indices": (_edit_tensors("region.safetensors", lambda t: t.update({k: v.float() for k, v in t.items()})),
                      ["region.safetensors", "dtype torch.float32", "int32 or int64"]),
    "size-mismatch": (_edit_json("region.json", lambda m: m.update(size=m["size"] + 1)),
                      ["region.safetensors", "'size' declares"]),
}


@pytest.mark.parametrize("case", list(REGION_CASES))
def test_bad_region_folder(case, tiny_graft, tiny_bert, toy_data, tmp_path):
    damage, culprits = REGION_CASES[case]
    folder = tmp_path / "region"
    Graft.from_pretrained(tiny_graft).region.save(folder)
    damage(folder)
    refused(tmp_path, ["continual", "add", "--state", tmp_path / "state", "--task", "SST-2", "--k", 4, "--model",
                       tiny_bert, "--region", folder, "--steps", 1, "--test-limit", 4, "--data-dir", toy_data],
            str(folder), *culprits)


@pytest.mark.parametrize("content, says", [("[]", "expected a JSON object, got list"),
                                           ('{"format": "skillgraft.continual"}', "missing field(s) ['tasks']")])
def test_bad_continual_state(content, says, tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "continual.json").write_text(content)
    refused(tmp_path, ["continual", "show", tmp_path / "state"], str(tmp_path / "state" / "continual.json"), says)


# ---------------------------------------------------------------------------------------------- output targets
def test_existing_output_folder_is_refused_and_untouched(ft_run, toy_data, tmp_path):
    out = tmp_path / "g"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    refused(tmp_path, graft_args(ft_run, toy_data, out, tmp_path / "store"), str(out), "already exists", "--overwrite")


def test_output_under_a_file(ft_run, toy_data, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "a-file" / "g"
    refused(tmp_path, graft_args(ft_run, toy_data, out, tmp_path / "store"), str(out), "is a file, not a folder")
    refused(tmp_path, ["evaluate", ft_run, "--data-dir", toy_data, "--limit", 4, "--out", out / "eval"],
            str(tmp_path / "a-file"), "not a directory")


def test_read_only_parent_refused_before_any_work(ft_run, toy_data, tmp_path, monkeypatch):
    """A read-only folder (injected through os.access: tests run as root) is refused up front."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p).startswith(str(ro)) else real(p, mode, **kw))
    refused(tmp_path, graft_args(ft_run, toy_data, ro / "g", tmp_path / "store"), str(ro), "not writable")


def test_permission_denied_at_the_write(tiny_graft, tiny_bert, tmp_path, monkeypatch):
    """The folder turns read-only after the up-front check (PermissionError injected where the folder is made)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = tempfile.mkdtemp

    def mkdtemp(suffix=None, prefix=None, dir=None):
        if dir is not None and str(dir).startswith(str(ro)):  # as mkdir(2) reports it: the name it tried
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(dir, f"{prefix}x1y2{suffix}"))
        return real(suffix, prefix, dir)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    line = refused(tmp_path, ["export", tiny_graft, "--model", tiny_bert, "--to", "delta", "--out", ro / "e"],
                   f"{ro / 'e'}: permission denied")
    assert ".tmp" not in line  # the path asked for, never the temporary sibling's


def test_export_onto_an_existing_file(tiny_graft, tiny_bert, tmp_path):
    (tmp_path / "e").write_text("precious")
    refused(tmp_path, ["export", tiny_graft, "--model", tiny_bert, "--to", "delta", "--out", tmp_path / "e"],
            str(tmp_path / "e"), "already exists (file)")


def test_finetune_refuses_an_existing_run_before_training(tiny_bert, toy_data, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{}")
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--data-dir", toy_data,
                       "--steps", 100000, "--out", tmp_path / "run"], str(tmp_path / "run"), "already exists")


def test_export_never_deletes_an_existing_folder(tiny_graft, tiny_bert, toy_data, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    r = invoke("apply", tiny_graft, "--model", tiny_bert, "--export", target, "--evaluate-on", "",
               "--data-dir", toy_data)
    assert r.exit_code == 2, r.output
    assert "already exists" in r.output and str(target) in r.output.replace("\n", "")
    assert "Traceback" not in r.output
    assert (target / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in target.iterdir()) == ["precious.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine")]  # no partial sibling left behind
    # with --overwrite the folder is replaced whole by a complete checkpoint
    r = invoke("apply", tiny_graft, "--model", tiny_bert, "--export", target, "--evaluate-on", "", "--overwrite",
               "--data-dir", toy_data)
    assert r.exit_code == 0, r.output
    assert (target / "config.json").is_file() and not (target / "precious.txt").exists()


def test_library_export_refuses_existing_folder(tiny_graft, tiny_bert, tmp_path):
    from skillgraft.errors import SkillgraftError

    target = tmp_path / "out"
    target.mkdir()
    (target / "other.bin").write_bytes(b"\x00\x01")
    g = Graft.from_pretrained(tiny_graft)
    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    with pytest.raises(SkillgraftError, match="already exists"):
        g.export(pre, target)
    assert (target / "other.bin").read_bytes() == b"\x00\x01"
    assert all((p == before[n]).all() for n, p in pre.named_parameters())  # model untouched after the refusal


# ---------------------------------------------------------------------------------------------- I/O faults
def _fail_writes(monkeypatch, method: str, match):
    """Make ``pathlib.Path.<method>`` fail as on a full disk for paths whose name satisfies ``match``."""
    real = getattr(pathlib.Path, method)

    def write(self, *a, **kw):
        if match(self.name):
            raise enospc()
        return real(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, method, write)


def test_disk_full_while_writing_a_graft(ft_run, toy_data, tmp_path, monkeypatch):
    """ENOSPC while the report writes its graft file: one line naming the graft folder (not a temporary path);
    no report folder, no temporaries; the store keeps only complete entries."""
    _fail_writes(monkeypatch, "write_bytes", lambda name: name == "graft.safetensors")
    out, store = tmp_path / "g", tmp_path / "store"
    line = one_line(invoke(*graft_args(ft_run, toy_data, out, store)), str(out / "grafts"), "no space left on device")
    assert ".tmp" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no report folder, no temporary sibling
    entries = list(store.iterdir())
    assert entries and all((p / "key.json").is_file() for p in entries)  # the regions entry was finished


def test_disk_full_in_the_store(ft_run, toy_data, tmp_path, monkeypatch):
    """A real full disk surfaces from safetensors as its own error type ("os error 28"): one line naming the
    store entry, and no partial entry."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*a, **kw):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    store = tmp_path / "store"
    store.mkdir()
    line = refused(tmp_path, graft_args(ft_run, toy_data, tmp_path / "g", store), str(store / "regions-"),
                   "no space left on device")
    assert ".tmp" not in line


def test_disk_full_while_replacing_a_report_keeps_the_old_one(ft_run, toy_data, tmp_path, monkeypatch):
    out, store = tmp_path / "g", tmp_path / "store"
    assert invoke(*graft_args(ft_run, toy_data, out, store)).exit_code == 0
    _fail_writes(monkeypatch, "write_text", lambda name: name.startswith(".report.md."))
    refused(tmp_path, graft_args(ft_run, toy_data, out, store, "--overwrite"), str(out / "report.md"),
            "no space left on device")


def test_disk_full_while_replacing_an_export_keeps_the_old_one(tiny_graft, tiny_bert, tmp_path, monkeypatch):
    out = tmp_path / "adapter"
    args = ["export", tiny_graft, "--model", tiny_bert, "--to", "peft", "--out", out]
    assert invoke(*args).exit_code == 0
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **kw: (_ for _ in ()).throw(enospc()))
    refused(tmp_path, [*args, "--overwrite"], str(out), "no space left on device")


def test_disk_full_while_writing_metrics(ft_run, toy_data, tmp_path, monkeypatch):
    _fail_writes(monkeypatch, "write_text", lambda name: name.startswith(".metrics.json."))
    refused(tmp_path, ["evaluate", ft_run, "--data-dir", toy_data, "--limit", 4, "--out", tmp_path / "eval"],
            str(tmp_path / "eval" / "metrics.json"), "no space left on device")


def test_disk_full_while_writing_a_run_directory(tiny_bert, toy_data, tmp_path, monkeypatch):
    _fail_writes(monkeypatch, "write_text", lambda name: name.startswith(".config.json."))
    refused(tmp_path, ["finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--steps", 2, "--eval-every", 2,
                       "--test-limit", 4, "--data-dir", toy_data, "--out", tmp_path / "run"],
            str(tmp_path / "run" / "config.json"), "no space left on device")


# ---------------------------------------------------------------------------------------------- recipes
RECIPE_CASES = {
    "a-list": (b"- calibration\n- ood\n", ["expected a mapping"]),
    "a-string": (b"calibration\n", ["expected a mapping"]),
    "binary": (bytes(range(256)), ["r.yaml:1", "NUL byte"]),
    "bad-yaml": (b"recipe: [calibration\n", ["not valid YAML"]),
    "no-recipe": (b"tasks: [SST-2]\n", ["'recipe:'"]),
    "unknown-recipe": (b"recipe: alchemy\n", ["unknown recipe 'alchemy'"]),
    "misspelt-field": (b"recipe: calibration\nseedz: [13]\n", ["seedz", "unknown field"]),
    "seed-negative": (b"recipe: calibration\nseeds: [13, -1]\n", ["r.yaml.seeds.1", "greater than or equal to 0"]),
    "seed-too-large": (b"recipe: graft\nseed: 4294967296\n", ["r.yaml.seed", "less than or equal to 4294967295"]),
    "lr-nan": (b"recipe: calibration\nfinetune: {lr: .nan}\n", ["r.yaml.finetune.lr", "finite number"]),
    "steps-huge": (b"recipe: calibration\nlocalize: {steps: 99999999999}\n", ["r.yaml.localize.steps",
                                                                              "less than or equal to 2147483647"]),
    "k-zero": (b"recipe: wise\nk: 0\n", ["r.yaml.k", "greater than or equal to 1"]),
}


@pytest.mark.parametrize("case", list(RECIPE_CASES))
def test_bad_recipe(case, tmp_path):
    content, culprits = RECIPE_CASES[case]
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    refused(tmp_path, ["run", path, "--out", tmp_path / "out"], str(path), *culprits)


TASK_YAML = ('name: MyTask\nkind: single\nlabels: ["0", "1"]\nlabel_words: [bad, good]\n'
             'template: "*cls**sent_0*_It_was*mask*.*sep+*"\n')


@pytest.mark.parametrize("content, culprits", [
    ("name: café\n".encode("latin-1"), ["t.yaml:1", "not UTF-8 text (byte 0xe9"]),  # was: no file named
    (b"name: [MyTask\n", ["t.yaml", "not valid YAML"]),
], ids=["latin-1", "bad-yaml"])
def test_bad_task_file(content, culprits, tmp_path):
    (tmp_path / "t.yaml").write_bytes(content)
    refused(tmp_path, ["tasks", "--task-file", tmp_path / "t.yaml"], str(tmp_path / "t.yaml"), *culprits)


def test_task_file_written_by_other_tools(toy_data, tmp_path):
    (tmp_path / "t.yaml").write_bytes(_as_other_tools_write(TASK_YAML, "utf-16"))
    r = invoke("tasks", "--task-file", tmp_path / "t.yaml", "--data-dir", toy_data)
    assert r.exit_code == 0 and "MyTask" in r.output, r.output


@pytest.mark.parametrize("args, says", [
    (["graft", "--bogus"], "No such option: --bogus"),
    (["graft"], "Missing option '--finetuned'"),
])
def test_usage_errors_from_the_installed_command_are_one_line(args, says):
    """click's own usage errors (before any verb runs) get the same one-line contract, exit code 2."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "skillgraft.cli", *args], capture_output=True, text=True, timeout=120)
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and says in lines[0] and "Traceback" not in lines[0]
