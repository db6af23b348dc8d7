"""Atomic writes: an artifact is either complete or absent, never half-written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from skillgraft.errors import SkillgraftError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file ordinary permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_target(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse an existing output ``path`` unless ``overwrite``: call it before any work."""
    path = Path(path)
    if path.exists() and not overwrite:
        what = "folder" if path.is_dir() else "file"
        raise SkillgraftError(f"{path} already exists ({what}); refusing to replace it. Pass --overwrite to "
                              "replace it whole, or choose another output path")
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; it becomes ``path`` only if the block succeeds.

    An existing ``path`` is an error unless ``overwrite``; then it is replaced only after success.
    """
    path = check_target(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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
        raise SkillgraftError(f"{what} not found: {path}")
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SkillgraftError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    missing = [k for k in required if not isinstance(obj, dict) or k not in obj]
    if missing:
        raise SkillgraftError(f"{path}: unreadable {what} (missing field(s) {missing})")
    return obj


def config_hash(obj) -> str:
    """Short stable hash of a JSON-able config (cache keys)."""
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]
