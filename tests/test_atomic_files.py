"""Outputs added to a folder the user keeps (``evaluate --out``, ``inspect``, ``fim``) join it in one step: a fault
or a kill at any point leaves the old set of the verb's files or the new one, never a mix (issue 49, gap a)."""

from __future__ import annotations

import errno
import os
import signal

import pytest

import skillgraft.io as sio
from skillgraft.errors import SkillgraftError
from skillgraft.io import atomic_files

NAMES = ("confidence.png", "metrics.json", "reliability.png")


def _folder(tmp_path):
    out = tmp_path / "eval"
    (out / "sub").mkdir(parents=True)
    for n in NAMES:
        (out / n).write_text("old")
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "keep.txt").write_text("mine too")
    return out


def _write(out):
    with atomic_files(out) as tmp:
        for n in NAMES:
            (tmp / n).write_text("new")


def _state(out):
    """'old' or 'new' (asserting the verb's files agree and the user's files are intact), or 'mixed'."""
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "keep.txt").read_text() == "mine too"
    seen = {(out / n).read_text() for n in NAMES}
    return seen.pop() if len(seen) == 1 else "mixed"


PRIMITIVES = ("replace", "rename", "link")


def _failing_after(monkeypatch, n, fail):
    """Make the n-th call of any renaming or linking primitive (and the exchange) call ``fail``."""
    calls = [0]

    def wrap(real):
        def f(*a, **k):
            calls[0] += 1
            if calls[0] == n:
                fail()
            return real(*a, **k)
        return f

    for name in PRIMITIVES:
        monkeypatch.setattr(sio.os, name, wrap(getattr(os, name)))
    if hasattr(sio, "exchange"):
        monkeypatch.setattr(sio, "exchange", wrap(sio.exchange))
    monkeypatch.setattr(sio, "rename_noreplace", wrap(sio.rename_noreplace))
    return calls


def _eio():
    raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "one-by-one"])
def test_an_error_between_two_moves_leaves_the_old_files_not_a_mix(fallback, tmp_path, monkeypatch):
    if fallback:  # a file system without RENAME_EXCHANGE: the files move one by one, and are put back on error
        monkeypatch.setattr(sio, "exchange", lambda a, b: _raise(errno.EINVAL), raising=False)
    out = _folder(tmp_path)
    n = 1
    while True:
        with monkeypatch.context() as m:
            calls = _failing_after(m, n, _eio)
            try:
                _write(out)
            except OSError:
                assert _state(out) == "old", f"failure at call {n}"
            else:
                assert calls[0] < n and _state(out) == "new"
                break
        n += 1
    assert n > 2  # more than one step was interrupted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval"]  # no temporary sibling left


def _raise(code):
    raise OSError(code, os.strerror(code))


def test_a_kill_at_any_step_of_the_commit_leaves_old_or_new_files(tmp_path, monkeypatch):
    """SIGKILL (no cleanup runs) at each call of a renaming primitive, in a forked child."""
    out = _folder(tmp_path)
    seen = set()
    for n in range(1, 12):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                _failing_after(monkeypatch, n, lambda: os.kill(os.getpid(), signal.SIGKILL))
                _write(out)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        state = _state(out)
        seen.add(state)
        assert state in ("old", "new"), f"kill at call {n}"
        if state == "new":
            for name in NAMES:
                (out / name).write_text("old")
    assert seen == {"old", "new"}


def test_files_join_a_new_folder_in_one_rename(tmp_path, monkeypatch):
    out = tmp_path / "a" / "eval"
    with monkeypatch.context() as m:
        _failing_after(m, 1, _eio)  # the one rename fails: nothing there
        with pytest.raises(OSError):
            _write(out)
    assert not out.exists()
    _write(out)
    assert sorted(os.listdir(out)) == sorted(NAMES)


def test_a_read_only_folder_is_not_written_into(tmp_path, monkeypatch):
    """The exchange renames the folder itself, which its own permissions do not forbid: asked first."""
    out = _folder(tmp_path)
    real = os.access
    monkeypatch.setattr(sio.os, "access", lambda p, mode: False if str(p) == str(out) else real(p, mode))
    with pytest.raises(OSError) as e:
        _write(out)
    assert e.value.errno == errno.EACCES and e.value.filename == str(out) and _state(out) == "old"


def test_the_current_folder_keeps_its_identity(tmp_path, monkeypatch):
    out = _folder(tmp_path)
    inode = out.stat().st_ino
    monkeypatch.chdir(out)
    _write(sio.Path("."))
    assert _state(out) == "new" and out.stat().st_ino == inode


def test_a_file_where_the_folder_should_be(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SkillgraftError, match="is a file, not a folder"):
        _write(tmp_path / "f")
