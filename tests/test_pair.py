"""models/pair.py: a checkpoint's config read as one line on any fault (issue 36: a config.json without
`model_type` was a ValueError traceback in `evaluate --mode classifier` and in `graft` of a pair)."""

from __future__ import annotations

import json
import shutil

import pytest
from badinputs import refused


@pytest.fixture
def no_model_type(tiny_classifier, tmp_path):  # noqa: F811
    folder = tmp_path / "clf"
    shutil.copytree(tiny_classifier, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]})
                                              + "\n" for i in range(12)))
    return folder


@pytest.mark.parametrize("mode", ["classifier", None])
def test_evaluate_a_checkpoint_without_model_type(mode, no_model_type, tmp_path):
    args = ["evaluate", no_model_type, "--data", tmp_path / "r.jsonl", "--out", tmp_path / "eval"]
    refused(tmp_path, args + (["--mode", mode] if mode else []), f"{no_model_type}/config.json", "'model_type'")


def test_graft_a_pair_whose_base_lacks_model_type(no_model_type, tiny_classifier, tmp_path):  # noqa: F811
    refused(tmp_path, ["graft", "--finetuned", tiny_classifier, "--pretrained", no_model_type, "--data",
                       tmp_path / "r.jsonl", "--out", tmp_path / "g"], f"{no_model_type}/config.json", "'model_type'",
            "--pretrained")


def test_labels_config_that_is_not_json(no_model_type, tmp_path):
    (no_model_type / "config.json").write_text("{not json")
    refused(tmp_path, ["evaluate", no_model_type, "--data", tmp_path / "r.jsonl", "--mode", "classifier"],
            f"{no_model_type}/config.json", "not valid JSON")
