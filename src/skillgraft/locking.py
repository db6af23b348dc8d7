"""Exclusive locks between processes (``flock``): one process computes a store entry, one ``continual add`` changes
a state at a time (docs/reliability.md §17)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path


def open_lock_file(path: Path):
    """The lock file ``path`` opened for ``flock``, made if needed, never through a link: a link planted where the
    lock file should be (to a file outside the store, say) is removed, not followed (before, ``open(path, "a+")``
    made or opened its target)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        return os.fdopen(fd, "a+")


def _folder(folder: Path) -> None:
    """Make the folder a lock lives in; one named as a file, or under one, is one line saying so (before: only
    ``file exists`` / ``not a directory``, for a ``--cache`` or ``$SKILLGRAFT_CACHE`` that named a file)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        from skillgraft.errors import SkillgraftError  # noqa: PLC0415
        from skillgraft.io import path_problem  # noqa: PLC0415

        why = path_problem(folder, "folder") or "not a folder"
        raise SkillgraftError(f"{folder}: {why}; a folder is needed here (a store of finished stages, --cache or "
                              "$SKILLGRAFT_CACHE, is a folder)") from None


@contextlib.contextmanager
def locked(path: str | os.PathLike, waiting: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock named ``path`` (a hidden lock file; ``flock``, released by the kernel if the process
    dies) while the block runs; another process asking for it waits (saying ``waiting`` once, when given). The file
    is deleted on the way out, while still held; a waiter that then finds its file gone or replaced takes the new
    one, so two holders never overlap. A stopping signal that lands while the lock is being taken (the file made,
    not yet held, or held and not yet checked) leaves no lock file behind either (:func:`_let_go`)."""
    import fcntl  # noqa: PLC0415

    from skillgraft.signals import _deferred  # noqa: PLC0415

    path = Path(path)
    _folder(path.parent)
    said = False
    while True:
        f = None
        try:
            with _deferred():  # made and opened in one piece: a signal meanwhile is raised with ``f`` set
                f = open_lock_file(path)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting and not said:
                    import sys  # noqa: PLC0415

                    print(waiting, file=sys.stderr, flush=True)
                    said = True
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            if f is not None:
                _let_go(f, path)
            raise
        if same:
            break
        f.close()  # the holder before us deleted it: lock the current file
    try:
        yield
    finally:
        _let_go(f, path)


def _let_go(f, path: Path) -> None:
    """Delete the lock file ``path`` if this process holds its lock — or can take it now: no one holds it — and it
    is still the file ``f`` opened, then close ``f``. A file another process holds is left to that process."""
    import fcntl  # noqa: PLC0415

    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op when held already
        if os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
            os.unlink(path)
    except OSError:  # held by another process (BlockingIOError), or already gone
        pass
    finally:
        f.close()
