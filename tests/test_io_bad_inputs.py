"""Output targets and I/O faults (io.py: atomic writes).

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (docs/reliability.md; helpers: tests/badinputs.py)."""

from __future__ import annotations

import errno
import os
import pathlib
import tempfile

import pytest

from skillgraft.graft import Graft
from skillgraft.models import build_scorer
from badinputs import enospc, graft_args, invoke, one_line, refused


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
