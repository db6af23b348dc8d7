"""graft/export.py reading PEFT SHiRA adapters back (`inspect ADAPTER`, `--compare ADAPTER`): issue 36, an adapter
exported from a graft of a checkpoint pair (classifier mode) failed with `unknown scorer mode 'classifier'`, and
an adapter whose index lies outside its weight was accepted."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from badinputs import invoke, refused


@pytest.fixture(scope="module")
def pair_graft(tiny_classifier, tiny_bert, tmp_path_factory):  # noqa: F811
    """A classifier-mode graft of a checkpoint pair: the tiny classifier with a changed body, on its base."""
    import transformers as tf

    root = tmp_path_factory.mktemp("pair")
    ft = root / "ft"
    model = tf.AutoModelForSequenceClassification.from_pretrained(tiny_classifier)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.bert.encoder.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(ft)
    tf.AutoTokenizer.from_pretrained(tiny_classifier).save_pretrained(ft)
    data = root / "r.jsonl"
    data.write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]}) + "\n"
                            for i in range(16)))
    r = invoke("graft", "--finetuned", ft, "--pretrained", tiny_bert, "--data", data, "--out", root / "g",
               "--budgets", "0.05", "--steps", 2, "--baselines", "", "--no-lottery-zero")
    assert r.exit_code == 0, r.output
    graft = next((root / "g" / "grafts").iterdir())
    r = invoke("export", graft, "--to", "peft", "--out", root / "adapter")
    assert r.exit_code == 0, r.output
    return graft, root / "adapter"


def test_inspect_an_adapter_of_a_checkpoint_pair_graft(pair_graft, tmp_path):
    graft, adapter = pair_graft
    r = invoke("inspect", adapter, "--out", tmp_path / "i")
    assert r.exit_code == 0, r.output
    g = invoke("inspect", graft, "--out", tmp_path / "j", "--compare", adapter)
    assert g.exit_code == 0, g.output
    size = lambda out: re.search(r"([\d,]+) grafted parameters.*carried ([\d,]+)", " ".join(out.split())).groups()  # noqa: E731
    assert size(r.output) == size(g.output)  # the same region, and the classifier head carried (not grafted)
    assert "IoU 1.0000" in g.output


def _edit_adapter(folder, change):
    path = folder / "adapter_model.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata=meta)


@pytest.fixture(scope="module")
def tuned_adapter(tiny_graft, tiny_bert, tmp_path_factory):
    """``tuned_adapter(tuner)``: the tiny graft exported with ``--tuner tuner``, built once per run (read-only)."""
    from conftest import built_once

    def make(tuner):
        def build(folder):
            assert invoke("export", tiny_graft, "--model", tiny_bert, "--to", "peft", "--tuner", tuner, "--out",
                          folder / "a").exit_code == 0

        return built_once(tmp_path_factory, f"adapter-{tuner}", build) / "a"

    return make


def _indices_key(tensors, suffix="shira_indices"):
    return next(k for k in sorted(tensors) if k.endswith(suffix))


@pytest.mark.parametrize("case, culprits", [
    ("row-out-of-range", ["[0, 0] = 1000 is out of range", "rows"]),
    ("column-negative", ["[1, 0] = -1 is out of range", "columns"]),
    ("float-indices", ["dtype torch.float32", "integer"]),
    ("fewer-indices-than-values", ["positions but its shira_weight holds"]),
])
def test_shira_index_outside_its_weight_is_refused(case, culprits, tuned_adapter, tiny_bert, tmp_path):
    folder = tmp_path / "a"
    shutil.copytree(tuned_adapter("shira"), folder)

    def change(t):
        key = _indices_key(t)
        if case == "row-out-of-range":
            t[key][0, 0] = 1000
        elif case == "column-negative":
            t[key][1, 0] = -1
        elif case == "float-indices":
            t[key] = t[key].float()
        else:
            t[key] = t[key][:, :-1].contiguous()

    _edit_adapter(folder, change)
    refused(tmp_path, ["inspect", folder, "--model", tiny_bert, "--out", tmp_path / "i"],
            f"{folder}/adapter_model.safetensors", "shira_indices", *culprits)


@pytest.mark.parametrize("case, culprits", [
    ("past-the-end", ["[0] = 999999 is out of range", "values (shape"]),
    ("negative", ["[0] = -1 is out of range"]),
    ("float-indices", ["dtype torch.float32", "integer flat positions"]),
    ("fewer-indices-than-values", ["one flat position per stored value"]),
])
def test_supertuning_index_outside_its_weight_is_refused(case, culprits, tuned_adapter, tiny_bert, tmp_path):
    """A Supertuning adapter's flat positions are checked as SHiRA's pairs are: one line naming file and tensor."""
    folder = tmp_path / "a"
    shutil.copytree(tuned_adapter("supertuning"), folder)

    def change(t):
        key = _indices_key(t, "supertuning_indices")
        if case == "past-the-end":
            t[key][0] = 999999
        elif case == "negative":
            t[key][0] = -1
        elif case == "float-indices":
            t[key] = t[key].float()
        else:
            t[key] = t[key][:-1].contiguous()

    _edit_adapter(folder, change)
    refused(tmp_path, ["inspect", folder, "--model", tiny_bert, "--out", tmp_path / "i"],
            f"{folder}/adapter_model.safetensors", "supertuning_indices", *culprits)
