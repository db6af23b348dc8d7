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


def _damaged_header(path, how):
    """Rewrite a safetensors file's header: claiming 1 TiB, two tensors on one byte range, or data past the end."""
    import struct

    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    if how == "header-claims-1-tib":
        path.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])
        return
    header = json.loads(raw[8:8 + n])
    names = sorted(k for k in header if k != "__metadata__")
    if how == "offsets-overlap":
        header[names[1]]["data_offsets"] = header[names[0]]["data_offsets"]
    else:  # data past the end
        header[names[1]]["data_offsets"][1] += 1 << 40
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


@pytest.mark.parametrize("role", ["--pretrained", "--finetuned"])
@pytest.mark.parametrize("how", ["header-claims-1-tib", "offsets-overlap", "data-past-the-end"])
def test_a_damaged_weight_file_is_named_with_its_role_before_any_weights_load(how, role, tiny_classifier, tiny_bert,
                                                                               tmp_path):
    shutil.copytree(tiny_classifier, tmp_path / "ft")
    shutil.copytree(tiny_bert, tmp_path / "pre")
    damaged = (tmp_path / ("pre" if role == "--pretrained" else "ft")) / "model.safetensors"
    _damaged_header(damaged, how)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]})
                                              + "\n" for i in range(12)))
    who = "pre-trained model (--pretrained)" if role == "--pretrained" else "fine-tuned model (--finetuned)"
    refused(tmp_path, ["graft", "--finetuned", tmp_path / "ft", "--pretrained", tmp_path / "pre", "--data",
                       tmp_path / "r.jsonl", "--out", tmp_path / "g"], f"{who} {damaged}", "not a readable safetensors")


def test_a_damaged_weight_file_of_a_checkpoint_names_the_file(tiny_classifier, tmp_path):
    shutil.copytree(tiny_classifier, tmp_path / "clf")
    _damaged_header(tmp_path / "clf" / "model.safetensors", "offsets-overlap")
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]})
                                              + "\n" for i in range(12)))
    refused(tmp_path, ["evaluate", tmp_path / "clf", "--data", tmp_path / "r.jsonl", "--mode", "classifier"],
            str(tmp_path / "clf" / "model.safetensors"), "overlaps that of")  # named by models/headers.py
