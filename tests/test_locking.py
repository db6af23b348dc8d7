"""The store's lock (skillgraft.locking.locked): a stopping signal while the lock is being taken leaves no lock
file behind, and never deletes a lock file another holder has (found by test_kill under load: a SIGTERM that
landed between the lock file's creation and its cleanup being armed left `.regions-….lock` in the store)."""

import fcntl
import os

import pytest

from skillgraft import locking
from skillgraft.locking import locked
from skillgraft.signals import Interrupted


def _interrupt_call(monkeypatch, target, name: str, on_call: int):
    """``target.name`` raises a stopping signal's exception on its ``on_call``-th call (1-based), as a SIGTERM landing
    there would."""
    real = getattr(target, name)
    calls = []

    def fake(*args, **kwargs):
        calls.append(1)
        if len(calls) == on_call:
            raise Interrupted(15)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, fake)
    return calls


@pytest.mark.parametrize("where", ["opened", "flock", "checked"])
def test_a_signal_while_taking_the_lock_leaves_no_lock_file(tmp_path, monkeypatch, where):
    path = tmp_path / ".entry.lock"
    if where == "opened":  # the file made and opened, before the lock is asked for
        real_open = locking.open_lock_file

        def opened_then_stopped(p):
            f = real_open(p)
            assert p.exists()
            from skillgraft.signals import _pending

            _pending.append(15)  # what _on_signal records inside a deferred block
            return f

        monkeypatch.setattr(locking, "open_lock_file", opened_then_stopped)
    elif where == "flock":  # the file made, the lock not yet held
        _interrupt_call(monkeypatch, fcntl, "flock", 1)
    else:  # the lock held, the file not yet checked to be the current one
        _interrupt_call(monkeypatch, os, "fstat", 1)
    with pytest.raises(Interrupted):
        with locked(path):
            pytest.fail("the block must not run")
    monkeypatch.undo()
    assert not path.exists(), where
    with locked(path):  # and the lock is free
        assert path.exists()
    assert not path.exists()


def test_a_signal_while_waiting_leaves_the_holders_lock_file(tmp_path, monkeypatch):
    """Interrupted while another holder has the lock: its file stays (deleting it would let a third process lock a
    new file while the holder still works), and the holder still deletes it when done."""
    path = tmp_path / ".entry.lock"
    holder = locking.open_lock_file(path)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file description: the waiter's non-blocking try fails
    _interrupt_call(monkeypatch, fcntl, "flock", 2)  # the blocking wait is where the signal lands
    with pytest.raises(Interrupted):
        with locked(path):
            pytest.fail("the block must not run")
    monkeypatch.undo()
    assert path.exists()
    with pytest.raises(BlockingIOError):  # still held by the holder
        fcntl.flock(locking.open_lock_file(path), fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.close()


def test_the_lock_file_is_gone_after_the_block_and_after_an_error_in_it(tmp_path):
    path = tmp_path / ".entry.lock"
    with locked(path):
        assert path.exists()
    assert not path.exists()
    with pytest.raises(ValueError):
        with locked(path):
            raise ValueError("inside")
    assert not path.exists()
