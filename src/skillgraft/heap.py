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


ROOM = 16 << 20  # address space a load needs beyond its weights' bytes (the readers' own buffers), at the least
START_ROOM = 64 << 20  # address space a command needs beyond what its imports mapped, at the least
# the address space torch, transformers and the command line map when imported (CPU torch 2.13: ≈ 900 MiB of
# VmSize; under a limit below it the imports fail, some by aborting in C++: std::bad_alloc), at the least
IMPORTS_ROOM = 900 << 20


def headroom() -> int | None:
    """Bytes this process may still map under its address-space limit (``ulimit -v``, RLIMIT_AS): the limit less
    what is mapped now (``VmSize``); None without a limit."""
    import resource  # noqa: PLC0415

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return soft - mapped


def require_limit(floor: int = IMPORTS_ROOM) -> None:
    """Refuse, before importing anything large, an address-space limit (``ulimit -v``) below ``floor``: importing
    torch under it fails, and not always in a way Python can catch."""
    import resource  # noqa: PLC0415

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < floor:
        from skillgraft.errors import SkillgraftError  # noqa: PLC0415

        raise SkillgraftError(f"not enough memory: this process's memory limit (ulimit -v) is {soft / 2**20:,.0f} MiB, "
                              f"and skillgraft's libraries (torch, transformers) alone map about {floor >> 20:,} MiB; "
                              "raise the limit. Nothing was written")


def require_room(need: int, what: str, room: int = ROOM) -> None:
    """Refuse, in one line before any of it is read, a load whose ``need`` bytes (the weights it maps, and
    :data:`ROOM`) cannot fit under the process's address-space limit: it would fail part-way (a MemoryError, a
    thread that cannot start, a reader aborting) instead."""
    left = headroom()
    if left is not None and left < need + room:
        from skillgraft.errors import SkillgraftError  # noqa: PLC0415

        needs = f"it maps {need / 2**20:,.0f} MiB (+ {room >> 20} MiB to read it)" if need else \
            f"it needs at least {room >> 20} MiB beyond its imports"
        raise SkillgraftError(f"not enough memory for {what}: {needs}, and this process's memory limit (ulimit -v) "
                              f"leaves {max(left, 0) / 2**20:,.0f} MiB; raise the limit, or use a machine with more "
                              "memory. Nothing was written")
