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


@contextlib.contextmanager
def locked(path: str | os.PathLike, waiting: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock named ``path`` (a hidden lock file; ``flock``, released by the kernel if the process
    dies) while the block runs; another process asking for it waits (saying ``waiting`` once, when given). The file
    is deleted on the way out, while still held; a waiter that then finds its file gone or replaced takes the new
    one, so two holders never overlap."""
    import fcntl  # noqa: PLC0415

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    said = False
    while True:
        f = open_lock_file(path)
        try:
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
            f.close()
            raise
        if same:
            break
        f.close()  # the holder before us deleted it: lock the current file
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        f.close()
