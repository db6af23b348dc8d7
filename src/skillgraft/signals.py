"""Stopping signals: :func:`handle_signals` (the CLI installs it) makes SIGTERM and SIGHUP — what schedulers,
``timeout`` and container stops send — unwind like Ctrl-C (an :class:`Interrupted`, a ``KeyboardInterrupt``), so
every ``finally`` and every atomic writer's cleanup runs on the way out; a signal that lands inside
:func:`_deferred` (an output renamed into place, skillgraft.io) waits until the block is done; :func:`written` says
which complete artifacts this process put in place."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path


class Interrupted(KeyboardInterrupt):
    """A stopping signal (SIGTERM, SIGHUP, Ctrl-C's SIGINT) raised in the main thread, so that every ``finally``
    and atomic writer's cleanup runs on the way out, as for Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_critical = 0                 # > 0 while an output is renamed into place
_pending: list[int] = []      # a signal that arrived meanwhile
_written: list[Path] = []     # complete artifacts this process put in place (not inside a temporary sibling)
_stopped_by: list[int] = []   # the signal that stopped this process


def _on_signal(signum: int, frame) -> None:
    for s in STOP_SIGNALS:  # once is enough: a second signal must not interrupt the cleanup
        signal.signal(s, signal.SIG_IGN)
    _stopped_by.append(signum)
    if _critical:
        _pending.append(signum)
        return
    raise Interrupted(signum)


def handle_signals() -> None:
    """SIGTERM, SIGHUP and SIGINT raise :class:`Interrupted` in the main thread (call it from the main thread,
    once per command: the record of what :func:`written` reports starts afresh)."""
    _written.clear()
    _stopped_by.clear()
    for s in STOP_SIGNALS:
        signal.signal(s, _on_signal)


@contextlib.contextmanager
def _deferred() -> Iterator[None]:
    """A stopping signal that lands in the block is raised only when the block is done (making a temporary
    sibling and remembering its name; renaming an output into place)."""
    global _critical
    _critical += 1
    try:
        yield
    finally:
        _critical -= 1
        if not _critical and _pending:
            raise Interrupted(_pending.pop())


def stopped_by() -> int | None:
    """The number of the stopping signal :func:`handle_signals` caught, or None."""
    return _stopped_by[0] if _stopped_by else None


def written() -> list[Path]:
    """The complete artifacts (outside any temporary sibling) this process has put in place and that are still
    there, in order: one written into a scratch folder (``tempfile.TemporaryDirectory``: merge measures a graft's
    file size that way) is gone once that folder is, and was never a result (issue 36: the "interrupted" line
    of a merge listed such folders as complete)."""
    return [p for p in dict.fromkeys(_written) if os.path.lexists(p)]
