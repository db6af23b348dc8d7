"""Atomic writes: an artifact is either complete or absent, never half-written; I/O errors as one line.

An I/O fault inside :func:`atomic_path` / :func:`atomic_dir` (no space, permission denied, a read-only file
system, …) removes the temporary sibling and is re-raised as an ``OSError`` naming the path the caller asked
for, never the temporary one; :func:`describe_io_error` turns it into ``<path>: <reason>`` (the CLI's one line).

The output-target checks (``check_target``, ``check_apart``, ``roll_back``, ``TargetExists``: skillgraft.targets),
the one-step renames (skillgraft.renames) and paths in words (``path_problem``, ``env_path``, ``sibling``:
skillgraft.paths) are re-exported here, where every writer imports them.

Signals (skillgraft.signals, re-exported here): a stopping signal unwinds like Ctrl-C, so every temporary sibling
is deleted on the way out; one that lands while an output is renamed into place waits until the rename is done.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from skillgraft.signals import (STOP_SIGNALS, Interrupted, _deferred, _written,  # noqa: F401
                                handle_signals, stopped_by, written)
from skillgraft.errors import (WRITE_ERRNOS, SkillgraftError, _lower_first, _OS_ERROR,  # noqa: F401 - re-exported
                               describe_io_error, unexplained_write)
from skillgraft.paths import (absolute, env_path, old_sibling, path_problem, sibling,  # noqa: F401 - re-exported
                              special_kind, stem)
from skillgraft.renames import exchange, rename_noreplace
from skillgraft.targets import TargetExists, check_apart, check_target, roll_back  # noqa: F401 - re-exported


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _located(e: BaseException, tmp: Path, path: Path) -> BaseException | None:
    """The I/O error ``e`` (raised while writing ``tmp``, the stand-in for ``path``) made to name ``path``:
    the same ``OSError`` with its file names moved from the temporary sibling to ``path`` (or ``path`` added
    when it names none), a new ``OSError`` for a safetensors I/O error; None when ``e`` is no I/O error."""
    if isinstance(e, OSError):
        if not e.errno and e.filename is None:  # numpy's tofile (gguf-py's writer) loses errno and file
            return unexplained_write(tmp, path)
        if e.filename is None and e.errno in WRITE_ERRNOS:
            e.filename = str(path)
        else:
            e.filename = _moved(e.filename, tmp, path)
            e.filename2 = _moved(e.filename2, tmp, path)
        return e
    if type(e).__name__ == "SafetensorError" and (code := _OS_ERROR.search(str(e))):
        n = int(code.group(1))
        return OSError(n, os.strerror(n), str(path))
    return None


def crash_point(point: str, path: Path) -> None:
    """Fault injection for the kill tests (tests/test_kill.py), inert unless set:
    ``SKILLGRAFT_CRASH_AT=<point>:<glob>`` makes this process SIGKILL itself the first time it reaches ``point``
    for a target whose name matches ``glob``; ``SKILLGRAFT_WAIT_AT=<point>:<glob>`` makes it wait there (up to
    10 minutes) for a signal sent from outside. Points: ``dir-opened`` (the temporary sibling just made),
    ``file-written`` / ``dir-written`` (complete temporary sibling, not yet renamed), ``dir-swapped`` (an
    existing target moved aside, the new one not yet in place), ``dir-renamed`` (in place)."""
    for var in ("SKILLGRAFT_CRASH_AT", "SKILLGRAFT_WAIT_AT"):
        spec = os.environ.get(var)
        if not spec:
            continue
        import fnmatch  # noqa: PLC0415

        want, _, glob = spec.partition(":")
        if want == point and fnmatch.fnmatchcase(Path(path).name, glob or "*"):
            if var == "SKILLGRAFT_CRASH_AT":
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(0.02)


@contextlib.contextmanager
def _committing(path: Path) -> Iterator[None]:
    """Put ``path`` in place (the block) without a signal in between, and record it as written."""
    with _deferred():
        yield
        if not any(_TMP_NAME.fullmatch(part) for part in Path(path).parts[:-1]):
            _written.append(Path(path))


_TMP_NAME = re.compile(r"\..+\.\d+-[^/]*\.tmp")


def _moved(name, tmp: Path, path: Path):
    if not isinstance(name, (str, os.PathLike)):
        return name
    text, prefix = os.fspath(name), os.fspath(tmp)
    if not isinstance(text, str):
        return name
    if text == prefix or text.startswith(prefix + os.sep):
        return os.fspath(path) + text[len(prefix):]
    if os.path.basename(text).startswith(f".{stem(path)}.") and text.endswith(".tmp"):
        return os.fspath(path)  # the temporary sibling could not even be made
    return name


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; it replaces ``path`` only if the block succeeds. With
    ``replace=False`` (an output without ``--overwrite``) it never replaces anything: a ``path`` that appeared
    meanwhile (another process's export) is :class:`TargetExists` and stays as it is."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(path)
        with _deferred():
            fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
            os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file ordinary permissions
        crash_point("file-written", path)
        with _committing(path):
            if replace:
                os.replace(tmp, path)
            else:
                try:
                    rename_noreplace(tmp, path)
                except FileExistsError:
                    raise TargetExists(path) from None
    except BaseException as e:
        located = _located(e, Path(tmp) if tmp else path, path)
        if located is None or located is e:
            raise
        raise located from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def _tmp_prefix(path: Path) -> str:
    return f".{stem(path)}.{os.getpid()}-"  # the writer's pid: a sibling whose writer is gone is a leftover


def sweep_leftovers(path: Path) -> None:
    """Delete temporary siblings of ``path`` whose writing process no longer runs (a kill -9 leaves them)."""
    pattern = re.compile(rf"\.{re.escape(stem(path))}\.(\d+)-[^/]*\.tmp")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if m and not _running(int(m.group(1))):
            with contextlib.suppress(OSError):
                _remove(path.parent / name)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists but is not ours
    return True


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; it becomes ``path`` only if the block succeeds.

    An existing ``path`` is an error unless ``overwrite``; then it is replaced only after success (moved aside
    to ``.<name>.old``, the new folder renamed in, the old one deleted). Without ``overwrite`` the final rename
    never replaces anything: a ``path`` that appeared meanwhile (a concurrent writer) is :class:`TargetExists`
    and stays as it is. The temporary sibling is
    ``.<name>.<pid>-<random>.tmp``: deleted on any error, and by a later write of ``path`` once its pid is gone.
    """
    path = check_target(path, overwrite)
    with _tmp_dir(path) as tmp:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        crash_point("dir-written", path)
        old = old_sibling(path)
        with _committing(path):
            if overwrite and os.path.lexists(path):
                _remove(old)
                os.replace(path, old)
                crash_point("dir-swapped", path)  # a kill here: the old one in `old`, the new in `tmp`
                os.replace(tmp, path)
            else:  # never replaces: `path` may have appeared since check_target (another process, the user)
                try:
                    rename_noreplace(tmp, path)
                except FileExistsError:
                    raise TargetExists(path) from None
            _remove(old)
        crash_point("dir-renamed", path)


@contextlib.contextmanager
def atomic_files(folder: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder; when the block succeeds its files join ``folder`` (made if needed) in one step,
    replacing files of the same names and leaving other files alone: for outputs added to a folder the user
    keeps (``evaluate --out``, ``inspect``, ``fim``). On failure ``folder`` is not touched (nor created).

    One step: a new ``folder`` is the temporary folder renamed; an existing one is mirrored beside itself
    (hard links: nothing is copied or moved out of it), the new files put in the mirror, and the two exchanged by
    one ``renameat2(RENAME_EXCHANGE)``, so a kill at any point leaves the old set of files or the new one, never
    a mix (before, the files were moved in one by one). Where that cannot be done (a file system without hard
    links or the exchange, the current folder inside ``folder``) the files move one by one and an error between
    two moves puts the old ones back (:func:`_move_in`)."""
    folder = Path(folder)
    if os.path.lexists(folder) and not folder.is_dir():
        raise SkillgraftError(f"{folder} is a file, not a folder")
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    with _tmp_dir(folder) as tmp:
        yield tmp
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~_umask())
        crash_point("dir-written", folder)
        with _committing(folder):
            if not os.path.lexists(folder):
                os.chmod(tmp, 0o777 & ~_umask())
                try:
                    rename_noreplace(tmp, folder)
                    return
                except FileExistsError:
                    pass  # made meanwhile (by the user?): add the files to it as to any existing folder
            if not _swap_in(tmp, folder):
                _move_in(tmp, folder)
        crash_point("dir-renamed", folder)


# errnos meaning "this file system cannot": hard links / a mirror of the folder, an atomic exchange of two folders
_NO_LINKS = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)
_NO_EXCHANGE = (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EBUSY)


def _swap_in(tmp: Path, folder: Path) -> bool:
    """Put ``tmp``'s files into ``folder`` by exchanging ``folder`` with a hard-linked mirror of it that holds them
    (one rename); False, ``folder`` untouched, where that cannot be done here."""
    cwd = absolute(os.getcwd())
    target = absolute(folder)
    if target == cwd or target in cwd.parents:
        return False  # the shell's current folder would become the deleted old one
    mirror = tmp / ".mirror"

    def mirrored() -> None:
        _link_tree(folder, mirror)
        for f in tmp.iterdir():
            if f != mirror:
                _remove(mirror / f.name)
                os.link(f, mirror / f.name)  # linked, not moved: tmp keeps them should this not be done
        os.chmod(mirror, os.stat(folder).st_mode & 0o7777)

    for step, point, unsupported in ((mirrored, "dir-mirrored", _NO_LINKS), (lambda: exchange(mirror, folder),
                                                                             "dir-exchanged", _NO_EXCHANGE)):
        try:
            step()
        except OSError as e:
            if e.errno in unsupported:  # not possible here: the caller moves the files one by one instead
                _restore(tmp, mirror)
                return False
            raise
        crash_point(point, folder)
    _remove(mirror)  # the old folder, now beside; its files live on in the new one
    return True


def _restore(tmp: Path, mirror: Path) -> None:
    """Undo :func:`_swap_in`'s preparation: the mirror deleted (``tmp`` still holds the new files)."""
    shutil.rmtree(mirror, ignore_errors=True)


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` made a copy of ``src`` in which every file is a hard link to ``src``'s (folders made, links copied as
    links): nothing is copied or moved, ``src`` is not changed."""
    os.mkdir(dst)
    for entry in os.scandir(src):
        target = dst / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            _link_tree(Path(entry.path), target)
            os.chmod(target, entry.stat(follow_symlinks=False).st_mode & 0o7777)
        else:
            os.link(entry.path, target, follow_symlinks=False)


def _move_in(tmp: Path, folder: Path) -> None:
    """Move ``tmp``'s files into ``folder`` one by one; an error between two moves puts back the files moved so far
    (the old ones, kept as hard links, or none), so ``folder`` keeps its old set of files."""
    done: list[tuple[Path, Path | None]] = []
    keep = tmp / ".old"
    keep.mkdir(exist_ok=True)
    try:
        for f in sorted(p for p in tmp.iterdir() if p.name not in (keep.name, ".mirror")):
            dest = folder / f.name
            old = None
            if os.path.lexists(dest) and not dest.is_dir():
                old = keep / f.name
                os.link(dest, old, follow_symlinks=False)
            os.replace(f, dest)
            done.append((dest, old))
            crash_point("file-moved", dest)
    except BaseException:
        for dest, old in reversed(done):
            with contextlib.suppress(OSError):
                if old is None:
                    os.unlink(dest)
                else:
                    os.replace(old, dest)
        raise


@contextlib.contextmanager
def _tmp_dir(path: Path) -> Iterator[Path]:
    """A temporary folder beside ``path`` (its parents made), deleted when the block ends; an I/O error
    raised in the block names ``path``, not the temporary folder (:func:`_located`)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(path)
        with _deferred():
            tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent))
        crash_point("dir-opened", path)
        yield tmp
    except BaseException as e:
        located = _located(e, tmp or path, path)
        if located is None or located is e:
            raise
        raise located from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _remove(path: Path) -> None:
    """Delete a file or folder if it is there (never following a link into a folder)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as indented JSON atomically (tensors and numpy values become numbers)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    return Path(path)


def _jsonable(x):
    if isinstance(x, Mapping):  # a typed row read as its columns (pipeline.variants.ResultRow)
        return dict(x)
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
