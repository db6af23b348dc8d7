"""Paths in words and names: why a path is no file or folder we can open (``path_problem``), what a special file
is, the hidden siblings' names of an output (``stem``, ``sibling``, ``old_sibling``), a path made absolute as far
as it exists, and a path from the environment (``env_path``: empty is unset)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from skillgraft.errors import _lower_first

_STEM_MAX = 200      # the longest name kept whole in a hidden sibling's name (the rest: pid, random, suffix)


def stem(path: str | os.PathLike) -> str:
    """``path``'s name as its hidden siblings carry it (``.<stem>.<pid>-<random>.tmp``, ``.<stem>.old``,
    ``.<stem>.resume``): the name itself, or — for a name too long to leave room for the rest within the
    255-byte limit of a file name — its first bytes, ``~`` and a digest of the whole name (a valid 245-character
    output folder was refused: its temporary sibling's name was longer than the system allows)."""
    name = Path(path).name
    raw = os.fsencode(name)
    if len(raw) <= _STEM_MAX:
        return name
    import hashlib  # noqa: PLC0415

    head = os.fsdecode(raw[: _STEM_MAX - 9].decode("utf-8", errors="ignore").encode())  # whole characters only
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:8]}"


def sibling(path: str | os.PathLike, suffix: str) -> Path:
    """The hidden sibling ``.<stem>.<suffix>`` of ``path`` (:func:`stem`)."""
    return Path(path).with_name(f".{stem(path)}.{suffix}")


def old_sibling(path: str | os.PathLike) -> Path:
    """Where a replaced output waits (``.<stem>.old``) until its replacement is in place."""
    return sibling(path, "old")


def absolute(path: str | os.PathLike) -> Path:
    """``path`` made absolute with its links resolved as far as it exists (``..`` folded), without requiring it."""
    try:
        return Path(os.path.realpath(os.path.abspath(path)))
    except (OSError, ValueError):
        return Path(os.path.abspath(path))


def same_file(a: Path, b: Path) -> bool:
    """Whether two existing paths are one file (a hard link: another name, the same bytes)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def env_path(name: str, default: str | os.PathLike) -> Path:
    """The path an environment variable names, ``default`` when it is unset or empty (``SKILLGRAFT_CACHE=`` in a
    script: an empty value was read as the current folder, and store entries were written there). One rule for every
    path skillgraft takes from the environment, as XDG's variables: empty means unset."""
    value = os.environ.get(name, "")
    return Path(value) if value.strip() else Path(default)


def path_problem(path: str | os.PathLike, want: str = "file") -> str | None:
    """Why ``path`` is no ``want`` ("file" or "folder") we can open, in words; None when it is one. Only a path
    that does not exist is "not found": a folder where a file should be, a link loop, a broken link or a parent
    we may not enter say so (before, each was called "not found")."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop (it never reaches a file)"
        if e.errno == errno.ENOENT and os.path.islink(path):
            return f"a broken symbolic link (to {os.readlink(path)}, which does not exist)"
        if e.errno == errno.ENOENT:
            return "not found"
        if e.errno == errno.ENOTDIR:
            return "not found (a folder on its path is a file)"
        if e.errno == errno.EACCES:
            return "cannot be reached (permission denied on a folder on its path)"
        return _lower_first(os.strerror(e.errno)) if e.errno else str(e)
    import stat  # noqa: PLC0415

    if want == "file" and stat.S_ISDIR(st.st_mode):
        return "a folder, not a file"
    if want == "folder" and not stat.S_ISDIR(st.st_mode):
        return "a file, not a folder"
    if want == "file" and not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({special_kind(st.st_mode)})"
    return None


def special_kind(mode: int) -> str:
    """What a file that is neither a regular file nor a folder is, in words (its ``st_mode``)."""
    import stat  # noqa: PLC0415

    for test, words in ((stat.S_ISFIFO, "a named pipe, FIFO"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "a device, socket or pipe"
