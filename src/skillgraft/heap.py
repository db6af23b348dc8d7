"""Give freed heap pages back to the operating system.

glibc keeps freed blocks below its (dynamic, up to 32 MB) mmap threshold in the heap, resident: a pass that
allocates and frees tensor-sized temporaries (building a candidate set, checking a checkpoint for non-finite
values in slices, scoring a model) leaves them counted in the process's memory until ``malloc_trim``.
"""

from __future__ import annotations

import ctypes


def release_freed_memory() -> None:
    """``malloc_trim(0)``: return the heap's free pages to the OS (a no-op without glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
