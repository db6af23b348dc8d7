"""What a model folder may do to us (issues 77 and 81; docs/reliability.md §19): no code of its own runs, whatever
stdin holds; no pickle that runs code; no config or tokenizer file that lies; a GGUF file converted with its own
tokenizer only. Each is refused in one line naming the file and field, before any weights load (models/vet.py)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from badinputs import one_line, refused
from typer.testing import CliRunner

from skillgraft.cli import app


def _rows(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]}) + "\n"
                            for i in range(12)))
    return path


def _edit(path: Path, change) -> None:
    obj = json.loads(path.read_text()) if path.is_file() else {}
    change(obj)
    path.write_text(json.dumps(obj))


CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the model folder's code ran")
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast
class EvilConfig(BertConfig):
    model_type = "skillgraft-evil"
class EvilModel(BertForSequenceClassification):
    config_class = EvilConfig
class EvilTokenizer(BertTokenizerFast):
    pass
"""


@pytest.mark.parametrize("where", ["config-unknown-type", "config-known-type", "tokenizer-config"])
def test_a_folder_with_its_own_code_is_refused_whatever_stdin_holds(where, tiny_classifier, tmp_path):
    """transformers asks "run the custom code? [y/N]" on stdin: `yes | skillgraft …` ran the folder's code."""
    clf = tmp_path / "clf"
    shutil.copytree(tiny_classifier, clf)
    marker = tmp_path / "ran.txt"
    (clf / "evil.py").write_text(CODE.format(marker=str(marker)))
    if where == "tokenizer-config":
        culprit = clf / "tokenizer_config.json"
        _edit(culprit, lambda c: c.update(auto_map={"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}))
    else:
        culprit = clf / "config.json"
        kind = "skillgraft-evil" if where == "config-unknown-type" else "bert"
        _edit(culprit, lambda c: c.update(model_type=kind, auto_map={
            "AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel",
            "AutoModelForSequenceClassification": "evil.EvilModel"}))
    args = ["evaluate", clf, "--data", _rows(tmp_path / "r.jsonl"), "--mode", "classifier"]
    r = CliRunner().invoke(app, [str(a) for a in args], input="y\n" * 50)
    line = one_line(r, culprit, "never runs code from a model folder")
    assert "auto_map" in line or "model_type" in line
    assert "custom code" not in r.output and "[y/N]" not in r.output
    assert not marker.exists(), "the model folder's code ran"


def test_transformers_never_asks_on_stdin_even_past_the_check(tiny_classifier, tmp_path, monkeypatch):
    """A second layer: with the folder check bypassed, transformers refuses instead of prompting (its prompt's
    timeout set to 0), so the folder's code still never runs."""
    from skillgraft.models import loading, vet

    clf = tmp_path / "clf"
    shutil.copytree(tiny_classifier, clf)
    marker = tmp_path / "ran.txt"
    (clf / "evil.py").write_text(CODE.format(marker=str(marker)))
    _edit(clf / "config.json", lambda c: c.update(model_type="skillgraft-evil", auto_map={
        "AutoConfig": "evil.EvilConfig", "AutoModelForSequenceClassification": "evil.EvilModel"}))
    vet.vet_folder(tiny_classifier)  # (sets the timeout, as every load does)
    monkeypatch.setattr(loading, "vet_folder", lambda *_a, **_k: None)
    monkeypatch.setattr(vet, "vet_folder", lambda *_a, **_k: None)
    args = ["evaluate", clf, "--data", _rows(tmp_path / "r.jsonl"), "--mode", "classifier"]
    r = CliRunner().invoke(app, [str(a) for a in args], input="y\n" * 50)
    assert "[y/N]" not in r.output and not marker.exists(), r.output


class _Planted:
    def __reduce__(self):
        return (Path.touch, (Path(_Planted.marker),))


@pytest.fixture(scope="module")
def pickle_only(tiny_classifier, tmp_path_factory):
    """The tiny classifier with its weights only as pickles: one whose unpickling runs code, one plain state dict."""
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("pickles")
    planted, plain = root / "planted", root / "plain"
    for folder in (planted, plain):
        shutil.copytree(tiny_classifier, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    _Planted.marker = str(root / "ran.txt")
    state = load_file(str(tiny_classifier / "model.safetensors"))
    torch.save({**state, "planted": _Planted()}, planted / "pytorch_model.bin")
    torch.save(state, plain / "pytorch_model.bin")
    return {"planted": planted, "plain": plain, "marker": root / "ran.txt"}


def test_pickle_only_folders_are_one_line_in_every_verb_never_advising_unsafe_loading(pickle_only, tiny_graft,
                                                                                      tiny_bert, tmp_path):
    planted = pickle_only["planted"]
    data = _rows(tmp_path / "r.jsonl")
    bin_file = str(planted / "pytorch_model.bin")
    for args in (["evaluate", planted, "--data", data, "--mode", "classifier"],
                 ["apply", tiny_graft, "--model", planted],
                 ["export", tiny_graft, "--model", planted, "--to", "hf", "--out", tmp_path / "e"],
                 ["merge", "--finetuned", planted, "--finetuned", pickle_only["plain"], "--pretrained", tiny_bert,
                  "--data", data, "--data", data, "--out", tmp_path / "m"]):
        r = CliRunner().invoke(app, [str(a) for a in args])
        line = one_line(r, bin_file, "refused, not read")
        assert "weights_only" not in r.output, line
        assert not (tmp_path / "e").exists() and not (tmp_path / "m").exists()
    assert not pickle_only["marker"].exists()


def test_a_plain_pickled_state_dict_still_loads_weights_only(pickle_only, tmp_path, monkeypatch):
    """A folder saved as pytorch_model.bin of tensors only is read as before (weights-only, under torch's floor)."""
    from skillgraft import untrusted
    from skillgraft.models.loading import load_classifier

    model, _ = load_classifier(str(pickle_only["plain"]), ("bad", "good"))
    assert model.config.num_labels == 2
    monkeypatch.setattr(untrusted, "TORCH_FLOOR", (99, 0))  # a torch older than the floor reads no pickle
    from skillgraft.errors import SkillgraftError
    from skillgraft.models import vet

    vet._VETTED.clear()
    with pytest.raises(SkillgraftError, match="older than 99.0"):
        vet.vet_folder(pickle_only["plain"])


LIES = {  # what the folder says → (file, field named)
    "fewer-layers-than-weights": ("config.json", lambda c: c.update(num_hidden_layers=1), "num_hidden_layers"),
    "more-layers-than-weights": ("config.json", lambda c: c.update(num_hidden_layers=3), "num_hidden_layers"),
    "vocab-2-31": ("config.json", lambda c: c.update(vocab_size=2**31), "vocab_size"),
    "zero-heads": ("config.json", lambda c: c.update(num_attention_heads=0), "num_attention_heads"),
    "string-hidden-size": ("config.json", lambda c: c.update(hidden_size="32"), "hidden_size"),
    "id2label-a-list": ("config.json", lambda c: c.update(id2label=["bad", "good"]), "id2label"),
    "pad-id-past-vocab": ("config.json", lambda c: c.update(pad_token_id=10**9), "pad_token_id"),
    "tokenizer-class-a-number": ("tokenizer_config.json", lambda c: c.update(tokenizer_class=5), "tokenizer_class"),
    "pad-token-a-list": ("tokenizer_config.json", lambda c: c.update(pad_token=["[PAD]"]), "pad_token"),
    "special-tokens-map-a-number": ("special_tokens_map.json", lambda c: c.update(unk_token=7), "unk_token"),
}


@pytest.mark.parametrize("case", sorted(LIES))
def test_a_model_folder_that_lies_is_one_line_naming_file_and_field(case, tiny_classifier, tmp_path):
    """Before: a config of 1 layer over weights of 2 was scored as the smaller model (exit 0), a vocab_size of 2³¹
    tried to allocate 256 GB, and wrong JSON types were ZeroDivisionError / KeyError / TypeError tracebacks."""
    name, change, field = LIES[case]
    clf = tmp_path / "clf"
    shutil.copytree(tiny_classifier, clf)
    _edit(clf / name, change)
    refused(tmp_path, ["evaluate", clf, "--data", _rows(tmp_path / "r.jsonl"), "--mode", "classifier"],
            clf / name, field)


@pytest.mark.parametrize("how", ["a-list", "model-a-number", "nested-100000"])
def test_a_tokenizer_json_of_the_wrong_shape_is_one_line(how, tiny_classifier, tmp_path):
    clf = tmp_path / "clf"
    shutil.copytree(tiny_classifier, clf)
    tok = clf / "tokenizer.json"
    if how == "a-list":
        tok.write_text("[]")
    elif how == "model-a-number":
        _edit(tok, lambda t: t.update(model=5))
    else:
        tok.write_text("[" * 100_000 + "]" * 100_000)
    line = refused(tmp_path, ["evaluate", clf, "--data", _rows(tmp_path / "r.jsonl"), "--mode", "classifier"], tok)
    assert ("model" in line) if how != "nested-100000" else ("nested" in line)


def test_a_gguf_beside_another_models_tokenizer_is_converted_with_its_own(tiny_bert, tmp_path, capsys):
    """Before: transformers took the foreign tokenizer files lying beside the GGUF (a traceback, or a wrong
    conversion cached under the GGUF's digest)."""
    from tiny import GGUF_WORDS, write_tiny_gguf

    from skillgraft.models.loading import load_tokenizer, model_reference

    folder = tmp_path / "downloads"
    folder.mkdir()
    path, _ = write_tiny_gguf(folder / "tiny.gguf", quantize=None, layers=3)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "config.json"):
        if (tiny_bert / name).is_file():
            shutil.copy(tiny_bert / name, folder / name)
    converted = Path(model_reference(str(path)).path)
    note = capsys.readouterr().err
    assert "tokenizer.json" in note and "not read" in note
    vocab = load_tokenizer(str(converted)).get_vocab()
    assert "\u2581" + GGUF_WORDS[3] in vocab and "[CLS]" not in vocab and len(vocab) < 100
