"""Bad run directories (pipeline/opening.py: from_run) and non-finite checkpoints.

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (docs/reliability.md; helpers: tests/badinputs.py)."""

from __future__ import annotations

import shutil

import pytest

from badinputs import edit_json, edit_tensors, refused, truncate


# ---------------------------------------------------------------------------------------------- run directories
def _edit_config(change):
    return edit_json("config.json", change)


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
    "truncated-head": (truncate("model/head.safetensors", 60), ["head.safetensors"]),
    "truncated-weights": (truncate("model/model.safetensors", 1000), ["run/model/model.safetensors", "truncated or corrupted"]),
    "no-scorer-config": (lambda run: (run / "model" / "scorer_config.json").unlink(), ["scorer_config.json"]),
    "scorer-config-a-list": (lambda run: (run / "model" / "scorer_config.json").write_text("[1]"),
                             ["scorer_config.json", "expected a JSON object, got list"]),
    "scorer-config-max-length-a-string": (edit_json("model/scorer_config.json", lambda c: c.update(max_length="x")),
                                          ["scorer_config.json", "'max_length'", "'x'"]),
    "head-nan": (edit_tensors("model/head.safetensors", lambda t: t["bias"].__setitem__(1, float("nan"))),
                 ["run/model", "'head.bias'[1] is nan"]),
    "weights-inf": (edit_tensors("model/model.safetensors", lambda t: t[sorted(t)[3]].view(-1).__setitem__(
        0, float("inf")), metadata={"format": "pt"}), ["run/model", "[0] is inf"]),
}


def test_evaluating_a_model_with_nan_weights_is_refused(ft_run, toy_data, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ft_run, run)
    edit_tensors("model/head.safetensors", lambda t: t["weight"].view(-1).__setitem__(3, float("nan")))(run)
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
