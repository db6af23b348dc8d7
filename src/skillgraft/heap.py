"""Give freed heap memory back to the operating system.

glibc serves a block of at least its mmap threshold with a mapping of its own, returned to the OS on free; but
the threshold is dynamic: each such block freed raises it to that block's size (up to 32 MiB), and from then
on blocks of that size come from the heap and stay resident after they are freed. Passes that allocate and
free tensor-sized temporaries (building a candidate set, checking a checkpoint for non-finite values in slices,
scoring a model, the first backward of a localization) leave them counted in the process's memory.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def collect_if_alive(*dropped: weakref.ref) -> None:
    """A full ``gc.collect()`` only when an object just dropped is still alive: held by a reference cycle (or by a
    caller). Reference counting frees a model without one at its last ``del``, while a full collection in a process
    that imported torch and transformers costs ≈ 0.3 s, whatever the model's size."""
    if any(ref() is not None for ref in dropped):
        gc.collect()


def release_freed_memory() -> None:
    """``malloc_trim(0)``: return the heap's free pages to the OS (a no-op without glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def return_large_blocks(threshold: int = 4 << 20) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process: every block that large is mapped on its
    own and returned to the OS when freed, whatever was freed before (no dynamic threshold). Returns whether it was
    set (False without glibc). Process-wide: for a program that owns its process (the command line)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False
