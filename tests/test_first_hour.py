"""A newcomer's first hour (issue 50): a mistyped path is a local path, an unreachable Hub fails in one line, errors
that point the way, results a user can use."""

from __future__ import annotations

import time

import pytest
from badinputs import invoke, one_line


# ------------------------------------------------------------------ 1. local paths and an unreachable Hub, at once
@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """The Hub endpoint is a closed local port and the Hugging Face cache is empty: what an offline laptop sees."""
    from huggingface_hub import constants

    from skillgraft.models import loading

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(loading, "_REACHABLE", {})
    return constants


@pytest.mark.parametrize("name", ["./ft-sst3", "../ft-sst3", "/nonexistent/ft-sst3", "~/no-such-ft-sst3",
                                  "sub/ft-sst3"])
def test_a_path_like_name_is_local_and_refused_at_once(name, tiny_bert, tmp_path, monkeypatch, no_hub):
    (tmp_path / "sub").mkdir()  # an existing parent: sub/ft-sst3 is a path here, not the Hub id of user "sub"
    (tmp_path / "d.jsonl").write_text('{"text": "a b", "label": "0"}\n')
    monkeypatch.chdir(tmp_path)
    for mode in ([], ["--mode", "classifier"]):
        t = time.perf_counter()
        r = invoke("graft", "--pretrained", tiny_bert, "--finetuned", name, "--data", "d.jsonl", *mode)
        line = one_line(r, "--finetuned", "model checkpoint not found", "no such folder")
        assert name.lstrip("~") in line and time.perf_counter() - t < 10
    r = invoke("evaluate", name, "--data", "d.jsonl")
    one_line(r, "model checkpoint not found")


def test_an_unreachable_hub_fails_in_one_line(tiny_bert, tmp_path, monkeypatch, no_hub):
    (tmp_path / "d.jsonl").write_text('{"text": "a b", "label": "0"}\n')
    monkeypatch.chdir(tmp_path)
    t = time.perf_counter()
    r = invoke("graft", "--pretrained", tiny_bert, "--finetuned", "someone/ft-sst3", "--data", "d.jsonl")
    one_line(r, "'someone/ft-sst3'", "not in the Hugging Face cache", "http://127.0.0.1:9 cannot be reached",
             "HF_HUB_OFFLINE=1")
    assert time.perf_counter() - t < 10  # not minutes of retries
    no_hub.HF_HUB_OFFLINE = True
    r = invoke("graft", "--pretrained", "ft-base", "--finetuned", tiny_bert, "--data", "d.jsonl")
    one_line(r, "--pretrained", "'ft-base'", "HF_HUB_OFFLINE is set", "./ft-base")


def test_hub_ids_in_the_cache_and_folders_still_load(tiny_bert, monkeypatch, tmp_path, no_hub):
    from skillgraft.models.loading import looks_local, model_reference

    assert not looks_local("bert-base-uncased") and not looks_local("org/model")
    assert looks_local("C:\\models\\x") and looks_local("a/b/c")
    assert model_reference(str(tiny_bert)).path == str(tiny_bert)
    assert model_reference("sentence-transformers/all-MiniLM-L6-v2").name == "all-MiniLM-L6-v2"  # bundled
    # a Hub id already in the cache is not refused, reachable or not
    snap = tmp_path / "hf-cache" / "models--org--cached" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hf-cache" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "hf-cache" / "models--org--cached" / "refs" / "main").write_text("abc")
    assert model_reference("org/cached").path == "org/cached"
