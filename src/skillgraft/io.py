"""Atomic writes: an artifact is either complete or absent, never half-written; I/O errors as one line.

An I/O fault inside :func:`atomic_path` / :func:`atomic_dir` (no space, permission denied, a read-only file
system, …) removes the temporary sibling and is re-raised as an ``OSError`` naming the path the caller asked
for, never the temporary one; :func:`describe_io_error` turns it into ``<path>: <reason>`` (the CLI's one line).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from skillgraft.errors import SkillgraftError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# errno values that mean "this artifact could not be written here": an OSError carrying one of them but no
# file name is attributed to the artifact being written (a network error, say, is left alone).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                          errno.EFBIG, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOENT})
_OS_ERROR = re.compile(r"os error (\d+)")


def describe_io_error(e: BaseException) -> str | None:
    """``<path>: <reason>`` for an I/O error (``OSError``, a safetensors I/O error, undecodable text);
    None for anything else. Reasons are the errno names in lower case: "no space left on device"."""
    if isinstance(e, UnicodeDecodeError):
        return f"not {e.encoding} text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if isinstance(e, OSError):
        if e.errno:
            reason = os.strerror(e.errno)
        else:
            reason = e.strerror or (str(e).splitlines() or [""])[0] or type(e).__name__
        reason = _lower_first(reason)
        where = e.filename if e.filename2 is None else f"{e.filename} → {e.filename2}"
        return f"{where}: {reason}" if where is not None else reason
    if type(e).__name__ == "SafetensorError":
        code = _OS_ERROR.search(str(e))
        if code:
            return _lower_first(os.strerror(int(code.group(1))))
        return (str(e).splitlines() or [type(e).__name__])[0]
    return None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _located(e: BaseException, tmp: Path, path: Path) -> BaseException | None:
    """The I/O error ``e`` (raised while writing ``tmp``, the stand-in for ``path``) made to name ``path``:
    the same ``OSError`` with its file names moved from the temporary sibling to ``path`` (or ``path`` added
    when it names none), a new ``OSError`` for a safetensors I/O error; None when ``e`` is no I/O error."""
    if isinstance(e, OSError):
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


def _moved(name, tmp: Path, path: Path):
    if not isinstance(name, (str, os.PathLike)):
        return name
    text, prefix = os.fspath(name), os.fspath(tmp)
    if isinstance(text, str) and (text == prefix or text.startswith(prefix + os.sep)):
        return os.fspath(path) + text[len(prefix):]
    return name


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException as e:
        located = _located(e, Path(tmp) if tmp else path, path)
        if located is None or located is e:
            raise
        raise located from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def check_target(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse an existing output ``path`` unless ``overwrite``, and one that cannot be created (a file where
    a folder should be, a folder we may not write into): call it before any work."""
    path = Path(path)
    if os.path.lexists(path) and not overwrite:
        what = "folder" if path.is_dir() else "file"
        raise SkillgraftError(f"{path} already exists ({what}); refusing to replace it. Pass --overwrite to "
                              "replace it whole, or choose another output path")
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent  # the nearest existing ancestor: where the first new folder will be made
    if not parent.is_dir():
        raise SkillgraftError(f"cannot create {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SkillgraftError(f"cannot create {path}: {parent} is not writable (permission denied or a "
                              "read-only file system)")
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; it becomes ``path`` only if the block succeeds.

    An existing ``path`` is an error unless ``overwrite``; then it is replaced only after success.
    """
    path = check_target(path, overwrite)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        if os.path.lexists(path):
            old = path.with_name(f".{path.name}.old")
            _remove(old)
            os.replace(path, old)  # a kill here leaves no `path`: the old one is in `old`, the new one in `tmp`
            os.replace(tmp, path)
            _remove(old)
        else:
            os.replace(tmp, path)
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
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    return Path(path)


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def read_json(path: str | os.PathLike, *, required: tuple[str, ...] = (), what: str = "file") -> dict:
    """A JSON object from ``path``; missing file, bad JSON or a missing ``required`` key → one clear error."""
    path = Path(path)
    if not path.is_file():
        raise SkillgraftError(f"{what} not found: {path}" + (" (a folder)" if path.is_dir() else ""))
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SkillgraftError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SkillgraftError(f"{path}: cannot read {what}: {describe_io_error(e).removeprefix(f'{path}: ')}") \
            from None
    if required and not isinstance(obj, dict):
        raise SkillgraftError(f"{path}: unreadable {what} (expected a JSON object, got {type(obj).__name__})")
    missing = [k for k in required if k not in obj]
    if missing:
        raise SkillgraftError(f"{path}: unreadable {what} (missing field(s) {missing})")
    return obj


def config_hash(obj) -> str:
    """Short stable hash of a JSON-able config (cache keys)."""
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]
