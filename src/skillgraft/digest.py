"""Content digests of files: the same bytes under the same names give the same digest, wherever they lie."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_digest(paths: list[str | os.PathLike]) -> str:
    """sha256 of the files' names and contents, in name order (data files in cache keys: other rows → another key;
    a tokenizer's files: the same bytes load the same tokenizer)."""
    from skillgraft.untrusted import regular  # noqa: PLC0415

    h = hashlib.sha256()
    for p in sorted(Path(x) for x in paths):
        regular(p)  # a FIFO would block the read, a device never end
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]
