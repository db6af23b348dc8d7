"""Issue 77's smaller classes (docs/reliability.md §19): a memory limit ends in one line and leaves nothing
half-written; options of another export target or a keep search that cannot confirm are refused up front; a
non-UTF-8 locale prints; a store that is a file is named as such."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from badinputs import one_line, refused
from userland import invoke

ROOT = Path(__file__).resolve().parents[1]


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_memory_limit_below_the_libraries_is_one_line_before_any_import(tiny_graft, tiny_bert, tmp_path):
    """Under `ulimit -v` too low for torch the imports failed: a traceback, or an abort (C++ std::bad_alloc)."""
    limit = 256 << 20
    r = subprocess.run([sys.executable, "-m", "skillgraft", "export", str(tiny_graft), "--model", str(tiny_bert),
                        "--to", "hf", "--out", str(tmp_path / "e")], capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("error: not enough memory") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "e").exists() and not _hidden(tmp_path)


@pytest.mark.skipif(sys.platform != "linux", reason="fork and /proc")
def test_a_command_left_too_little_memory_by_its_limit_is_one_line(tiny_graft, tiny_bert, tmp_path):
    """The real entry point in a forked child (its libraries imported) whose limit leaves 16 MiB beyond them."""
    from processes import fork_call

    def limited():
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (16 << 20), resource.RLIM_INFINITY))
        sys.argv = ["skillgraft", "export", str(tiny_graft), "--model", str(tiny_bert), "--to", "hf", "--out",
                    str(tmp_path / "e")]
        from skillgraft.cli import main

        main()

    err = tmp_path / "stderr"
    assert fork_call(limited, err).wait() == 2, err.read_text()[-2000:]
    text = err.read_text()
    assert text.startswith("error: not enough memory for a skillgraft command") and "Traceback" not in text, text
    assert not (tmp_path / "e").exists() and not _hidden(tmp_path)


@pytest.mark.parametrize("fault", [MemoryError(), RuntimeError("can't start new thread"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                                "4096 bytes")])
def test_running_out_of_memory_while_writing_is_one_line_and_leaves_nothing(fault, tiny_graft, tiny_bert, tmp_path,
                                                                            monkeypatch):
    """Before: a MemoryError or a thread that could not start was a traceback."""
    import safetensors.torch

    def full(*_a, **_k):
        raise fault

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(safetensors.torch, "save", full)
    out = tmp_path / "e"
    line = one_line(invoke("export", tiny_graft, "--model", tiny_bert, "--to", "hf", "--out", out), "out of memory")
    assert str(out) not in line.split("nothing")[-1]  # not named as written
    assert not out.exists() and not _hidden(tmp_path)


def test_a_weight_file_that_cannot_be_mapped_is_not_blamed_as_corrupted(tiny_classifier, tmp_path, monkeypatch):
    import safetensors

    def no_room(*_a, **_k):
        raise RuntimeError("Error while mmapping the file: Cannot allocate memory (os error 12)")

    monkeypatch.setattr(safetensors, "safe_open", no_room)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": ["bad", "good"][i % 2]})
                                              + "\n" for i in range(8)))
    line = one_line(invoke("evaluate", tiny_classifier, "--data", tmp_path / "r.jsonl", "--mode", "classifier"),
                    "out of memory", "model.safetensors")
    assert "corrupt" not in line and "truncated" not in line


def test_an_option_of_another_export_target_is_refused(tiny_graft, tmp_path):
    """Before: `--to peft --gguf-type Q8_0` wrote an adapter at the graft's own precision, exit 0."""
    refused(tmp_path, ["export", tiny_graft, "--to", "peft", "--gguf-type", "Q8_0", "--out", tmp_path / "a"],
            "--gguf-type", "--to gguf", "--to peft")


@pytest.mark.parametrize("target, rows, culprit", [("1", None, "an agreement of 1 can never be confirmed"),
                                                   ("0", None, "impossible"),
                                                   ("0.9", 1, "cannot be confirmed")])
def test_keep_agreement_gets_the_up_front_checks_keep_has(target, rows, culprit, ft_run, toy_data, tmp_path):
    """Before: a one-row selection file was accepted, and a target of 1 answered with a density-1.0 "graft"."""
    from badinputs import graft_args

    extra = ["--keep-agreement", target]
    if rows:
        keep = tmp_path / "keep.jsonl"
        keep.write_text("".join(json.dumps({"text": f"a fine film {i}", "label": "1"}) + "\n" for i in range(rows)))
        extra += ["--keep-data", keep]
    refused(tmp_path, graft_args(ft_run, toy_data, tmp_path / "out", tmp_path / "store", *extra),
            "--keep-agreement", culprit)


def test_inspect_prints_in_a_locale_that_is_not_utf8(tiny_graft, tmp_path):
    """Before: printing × or → to an ASCII stdout (LANG=C without UTF-8, PYTHONIOENCODING=ascii) crashed inspect
    after it had written its files (UnicodeEncodeError)."""
    import shutil

    from typer.testing import CliRunner

    from skillgraft.cli import app

    g = tmp_path / "g"
    shutil.copytree(tiny_graft, g)
    r = CliRunner(charset="ascii").invoke(app, ["inspect", str(g)])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "\\u2192" in r.output or "\\xd7" in r.output  # → and × written as escapes


def test_a_store_that_is_a_file_is_named_as_such(tmp_path, monkeypatch):
    from tiny import write_tiny_gguf

    (tmp_path / "m").mkdir()
    path, _ = write_tiny_gguf(tmp_path / "m" / "tiny.gguf", quantize=None, layers=3)
    store = tmp_path / "store.txt"
    store.write_text("not a folder")
    monkeypatch.setenv("SKILLGRAFT_CACHE", str(store))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": f"film {i}", "label": "1"}) + "\n"
                                              for i in range(8)))
    line = refused(tmp_path, ["evaluate", path, "--data", tmp_path / "r.jsonl"], store, "a file, not a folder")
    assert "file exists" not in line
