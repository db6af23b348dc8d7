"""One-step renames the system offers (Linux ``renameat2``): a rename that never replaces (``rename_noreplace``)
and the exchange of two paths (``exchange``)."""

from __future__ import annotations

import errno
import os

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_UNSET = object()
_renameat2_fn = _UNSET  # libc's renameat2, looked up on first use (None: this system has none)


def _renameat2():
    try:
        import ctypes  # noqa: PLC0415
        import ctypes.util  # noqa: PLC0415

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError, ImportError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def rename_noreplace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (``FileExistsError``), in one step where the system can
    (Linux ``renameat2(RENAME_NOREPLACE)``); elsewhere a check just before the rename. A plain ``rename(2)``
    would silently replace an empty folder or a file at ``dst``."""
    global _renameat2_fn
    if _renameat2_fn is _UNSET:
        _renameat2_fn = _renameat2()
    if _renameat2_fn is not None:
        import ctypes  # noqa: PLC0415

        if _renameat2_fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), os.fspath(src), None, os.fspath(dst))
        # a file system without RENAME_NOREPLACE: check, then rename
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
    os.rename(src, dst)


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> None:
    """Swap the paths ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``OSError(ENOSYS)``
    where the system has no such call."""
    global _renameat2_fn
    if _renameat2_fn is _UNSET:
        _renameat2_fn = _renameat2()
    if _renameat2_fn is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), os.fspath(b))
    import ctypes  # noqa: PLC0415

    if _renameat2_fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), os.fspath(a), None, os.fspath(b))
