"""Resumable long runs: a stage of the store (fine-tuning, localization) saves its state every few minutes and the
same command, run again, resumes from it to the same result as an uninterrupted run, bit for bit.

:meth:`Store.fetch <skillgraft.pipeline.store.Store.fetch>` opens a :func:`resume_point` beside the entry it is
writing, ``<store>/.<entry>.resume/``, keyed like the entry itself (the same specs, data and models; anything
else is another entry). Inside it, each long loop asks for a :func:`checkpoint` (``localize-0``, ``finetune-0``,
… in the order the stage runs them), loads the state it finds there (:meth:`Checkpoint.load`; a state saved by
other settings, recorded in its fingerprint, is ignored) and saves its state at the end of a step once
``SKILLGRAFT_CHECKPOINT_SECONDS`` (default 180) have passed since the last save (:meth:`Checkpoint.due`). The
state is everything the next step depends on — parameters, optimizer moments, random generators, the working
weights, the best step so far and the history — written atomically (``io.atomic_path``). When the entry is
complete the folder is deleted.

The files are pickles (``torch.save``) in the user's own store, read back only from there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from skillgraft.errors import SkillgraftError

DEFAULT_SECONDS = 180.0
_point: ContextVar[tuple[Path, dict[str, int]] | None] = ContextVar("skillgraft_resume_point", default=None)


def interval() -> float:
    """Seconds between saves: ``SKILLGRAFT_CHECKPOINT_SECONDS`` (0: after every step; default 180)."""
    raw = os.environ.get("SKILLGRAFT_CHECKPOINT_SECONDS")
    if raw is None or raw == "":
        return DEFAULT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise SkillgraftError(f"SKILLGRAFT_CHECKPOINT_SECONDS={raw!r}: expected a number of seconds") from None
    if not value >= 0:
        raise SkillgraftError(f"SKILLGRAFT_CHECKPOINT_SECONDS={raw!r}: expected a number of seconds ≥ 0")
    return value


@contextlib.contextmanager
def resume_point(folder: str | os.PathLike, key=None) -> Iterator[Path]:
    """Long loops run in the block save and resume their state in ``folder`` (see the module doc). ``key``:
    what determines the stage's result when ``folder`` alone does not (a run directory's models and data)."""
    token = _point.set((Path(folder), {"": key}))
    try:
        yield Path(folder)
    finally:
        _point.reset(token)


def discard(folder: str | os.PathLike) -> None:
    """Delete a resume folder (its stage is complete)."""
    shutil.rmtree(folder, ignore_errors=True)


class Checkpoint:
    """One loop's saved state: :meth:`load` it at the start, :meth:`save` it when :meth:`due`."""

    def __init__(self, path: Path, fingerprint: str):
        self.path, self.fingerprint = path, fingerprint
        self.every = interval()
        self.last = time.monotonic()

    def load(self) -> dict | None:
        """The state saved by the same loop with the same settings, or None."""
        if not self.path.is_file():
            return None
        import torch  # noqa: PLC0415

        try:
            state = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - a damaged state is ignored: the stage starts over
            return None
        if not isinstance(state, dict) or state.get("fingerprint") != self.fingerprint:
            return None
        return state

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every

    def save(self, state: dict) -> None:
        """Write ``state`` (plus the fingerprint) atomically; the previous one stays until it is complete."""
        import torch  # noqa: PLC0415

        from skillgraft.io import atomic_path  # noqa: PLC0415

        with atomic_path(self.path) as tmp:
            torch.save({**state, "fingerprint": self.fingerprint}, tmp)
        self.last = time.monotonic()


def checkpoint(kind: str, settings) -> Checkpoint | None:
    """The checkpoint of the next ``kind`` loop of the current stage (None outside a :func:`resume_point`).
    ``settings``: what the loop's result depends on beyond the stage's key (hashed into the fingerprint)."""
    point = _point.get()
    if point is None:
        return None
    from skillgraft.spec import stable_hash  # noqa: PLC0415

    folder, counters = point
    index = counters.get(kind, 0)
    counters[kind] = index + 1
    return Checkpoint(folder / f"{kind}-{index}.pt", stable_hash({"stage": counters[""], "loop": settings}))


def cpu(x):
    """A detached CPU copy of a tensor, or of the tensors in a dict/list (what a state holds)."""
    import torch  # noqa: PLC0415

    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(cpu(v) for v in x)
    return x
