"""The one exception type users see (a clear, actionable message, never a deep traceback), and I/O errors said as
one line (:func:`describe_io_error`)."""

from __future__ import annotations

import errno
import os
import re


class SkillgraftError(Exception):
    """Bad input or an impossible request; the message names the file, field or setting at fault."""


# errno values that mean "this artifact could not be written here": an OSError carrying one of them but no
# file name is attributed to the artifact being written (a network error, say, is left alone).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                          errno.EFBIG, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOENT})
_OS_ERROR = re.compile(r"os error (\d+)")


def describe_io_error(e: BaseException) -> str | None:
    """``<path>: <reason>`` for an I/O error (``OSError``, a safetensors I/O error, undecodable text);
    None for anything else. Reasons are the errno names in lower case: "no space left on device"."""
    if isinstance(e, UnicodeDecodeError):
        return f"not {e.encoding.upper()} text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if isinstance(e, OSError):
        if e.errno:
            reason = e.strerror or os.strerror(e.errno)
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


def unexplained_write(tmp, path) -> OSError:
    """The cause of a write that failed without one (an ``OSError`` with no errno: numpy's ``tofile``, which
    gguf-py's writer uses, said ``[Errno None] None: None -> None``), found by looking: the process's file-size limit
    (``ulimit -f``) reached by ``tmp``, the disk full, else an I/O error; as an ``OSError`` naming ``path``."""
    import resource  # noqa: PLC0415

    try:
        files = [tmp] if tmp.is_file() else [f for f in tmp.rglob("*") if f.is_file()]
        largest = max((f.stat().st_size for f in files), default=0)
    except OSError:
        largest = 0
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and largest >= soft - (1 << 16):
        return OSError(errno.EFBIG, f"File too large (the file-size limit, ulimit -f, is {soft:,} bytes)", str(path))
    try:
        free = os.statvfs(path.parent)
        full = free.f_bavail * free.f_frsize < (1 << 20)
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return OSError(errno.EIO, "Input/output error (the writer gave no reason)", str(path))
