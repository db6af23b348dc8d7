"""Resumable long runs: a stage of the store (fine-tuning, localization) saves its state every few minutes and the
same command, run again, resumes from it to the same result as an uninterrupted run, bit for bit.

:meth:`Store.fetch <skillgraft.pipeline.store.Store.fetch>` opens a :func:`resume_point` beside the entry it is
writing, ``<store>/.<entry>.resume/``, keyed like the entry itself (the same specs, data and models; anything
else is another entry). Inside it, each long loop asks for a :func:`checkpoint` (``localize-0``, ``finetune-0``,
… in the order the stage runs them), loads the state it finds there (:meth:`Checkpoint.load`; a state saved by
other settings, recorded in its fingerprint, is ignored with one line) and saves its state at the end of a step
once ``SKILLGRAFT_CHECKPOINT_SECONDS`` (default 180) have passed since the last save (:meth:`Checkpoint.due`).
The state is everything the next step depends on — parameters, optimizer moments, random generators, the
working weights, the best step so far and the history — written atomically (``io.atomic_path``). A loop run by
several processes (sharded by FSDP2, or replicated) saves one file per rank and a manifest last
(:class:`Sharded`); a resume by another number of processes starts over. When the entry is complete the folder
is deleted.

The files are written by ``torch.save`` and read back with ``torch.load(weights_only=True)``: tensors, numbers,
strings and containers of them, nothing that runs code (a planted pickle is refused, the file named, and the loop
starts over).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
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
    if os.path.islink(folder):  # ours is always a real folder: a link (to a folder outside, say) is not followed
        print(f"{folder}: a symbolic link where a resume folder should be (planted?); removed, not followed: "
              "nothing is read or saved through it", file=sys.stderr, flush=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder)
    token = _point.set((Path(folder), {"": key}))
    try:
        yield Path(folder)
    finally:
        _point.reset(token)


def current() -> Path | None:
    """The folder of the innermost open :func:`resume_point` (None outside one)."""
    point = _point.get()
    return None if point is None else point[0]


def discard(folder: str | os.PathLike) -> None:
    """Delete a resume folder (its stage is complete)."""
    shutil.rmtree(folder, ignore_errors=True)


class Checkpoint:
    """One loop's saved state: :meth:`load` it at the start, :meth:`save` it when :meth:`due`."""

    def __init__(self, path: Path, fingerprint: str):
        self.path, self.fingerprint = path, fingerprint
        self.manifest = path.with_suffix(".json")  # a multi-process save's (:class:`Sharded`)
        self.every = interval()
        self.last = time.monotonic()

    def load(self) -> dict | None:
        """The state saved by the same loop with the same settings, or None (with one line saying why, when a
        state is there but not used)."""
        if not self.path.is_file():
            if self.manifest.is_file():
                saved = _read_manifest(self.manifest)
                note(self.manifest, f"saved by {saved['world']} processes, this run has 1" if saved else "damaged")
            return None
        state, why = _read(self.path)
        if state is None or state.get("fingerprint") != self.fingerprint:
            note(self.path, why or "saved with other settings")
            return None
        return state

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every

    def save(self, state: dict) -> None:
        """Write ``state`` (plus the fingerprint) atomically; the previous one stays until it is complete."""
        _write(self.path, {**state, "fingerprint": self.fingerprint})
        self.last = time.monotonic()


class Sharded(Checkpoint):
    """The checkpoint of a loop run by ``world`` processes (FSDP shards, or replicas): each rank saves its own state
    (its shards, optimizer moments, random generators) to ``<loop>.rank<r>.<n>.pt``, the n-th save; once every rank's
    file is complete, rank 0 writes the manifest ``<loop>.json`` (n, the step, the world size, the fingerprint).
    Only the save the manifest names is loaded, by every rank at once, so a save cut short (a rank killed while
    writing, the manifest not yet written) is never read: the previous complete one is, or none. Every method is
    collective: all ranks call it at the same point of the loop (:meth:`due` is rank 0's clock, broadcast when it
    may have run out, not at every step)."""

    def __init__(self, path: Path, fingerprint: str, world: int, rank: int, device):
        super().__init__(path, fingerprint)
        self.world, self.rank, self.device = world, rank, device
        self.serial = 0  # the save the manifest names (0: none yet)

    def file(self, rank: int, serial: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.rank{rank}.{serial}.pt")

    def load(self) -> dict | None:
        import torch.distributed as dist  # noqa: PLC0415

        found: list = [None]
        if self.rank == 0:
            found[0] = _read_manifest(self.manifest) if self.manifest.is_file() else "none"
        dist.broadcast_object_list(found, src=0)
        saved, state, why = found[0], None, None
        if saved == "none":
            if self.rank == 0 and self.path.is_file():
                note(self.path, f"saved by 1 process, this run has {self.world}")
            return None
        if saved is None:
            why = (self.manifest, "damaged")
        elif saved["world"] != self.world:
            why = (self.manifest, f"saved by {saved['world']} processes, this run has {self.world}")
        elif self.rank == 0 and saved["fingerprint"] != self.fingerprint:
            why = (self.manifest, "saved with other settings")
        else:
            path = self.file(self.rank, saved["serial"])
            state, problem = _read(path)
            if state is None:
                why = (path, problem or "missing or damaged")
            elif state.get("fingerprint") != self.fingerprint or state.get("serial") != saved["serial"]:
                why = (path, "saved with other settings")
        if saved is not None:  # our saves are numbered after it: it never names one of them, used or not
            self.serial = int(saved["serial"])
        reasons: list = [None] * self.world
        dist.all_gather_object(reasons, why)
        first = next((r for r in reasons if r), None)
        if first is not None:
            if self.rank == 0:
                note(*first)
            return None
        return state

    def due(self) -> bool:
        """Rank 0's clock, agreed on without a collective at every step (a broadcast and a read per step would stall
        every step of a GPU run): when not yet due, rank 0 also says how many more calls (steps) to skip — 90 % of
        the steps its clock says fit in the time left, at least one — and every rank skips them alike."""
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        self.calls = getattr(self, "calls", 0) + 1
        if self.calls < getattr(self, "next_call", 0):
            return False
        elapsed = time.monotonic() - self.last
        due = elapsed >= self.every
        skip = 0
        if not due and self.rank == 0:
            since = self.calls - getattr(self, "saved_at", 0)  # steps taken in ``elapsed``
            skip = int(0.9 * (self.every - elapsed) / max(elapsed / max(since, 1), 1e-9))
        flag = torch.tensor([int(due), min(skip, 1000)], device=self.device)  # at most 1,000 steps between checks
        dist.broadcast(flag, src=0)
        due, skip = flag.tolist()
        self.next_call = self.calls + 1 + max(skip, 0)
        return bool(due)

    def save(self, state: dict) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        from skillgraft.io import atomic_path  # noqa: PLC0415

        serial = self.serial + 1
        _write(self.file(self.rank, serial), {**state, "fingerprint": self.fingerprint, "serial": serial})
        dist.barrier()  # every rank's file is complete
        if self.rank == 0:
            with atomic_path(self.manifest) as tmp:
                tmp.write_text(json.dumps({"serial": serial, "step": state.get("step"), "world": self.world,
                                           "fingerprint": self.fingerprint}) + "\n")
        dist.barrier()  # the manifest names the new save: the older files are no longer needed
        for old in self.path.parent.glob(f"{self.path.stem}.rank{self.rank}.*.pt"):
            if old != self.file(self.rank, serial):
                old.unlink(missing_ok=True)
        self.serial, self.last = serial, time.monotonic()
        self.saved_at = getattr(self, "calls", 0)


def note(path: Path, reason: str) -> None:
    """The one line saying that a saved state is there but not used."""
    print(f"{path}: {reason}; not resuming from it, the loop starts over", file=sys.stderr, flush=True)


def saved_state(path: str | os.PathLike) -> dict | None:
    """A loop's saved state as a resume reads it (a planted pickle refused, never run), its tensors memory-mapped
    rather than read: for a status report of where a stopped loop stands. None: no usable state there."""
    return _read(Path(path), mmap=True)[0]


def _read(path: Path, mmap: bool = False) -> tuple[dict | None, str | None]:
    """The state saved at ``path`` and None, or None and why it is not used (None: there is none). Read with
    ``weights_only=True``: a file that would run code when unpickled (a planted pickle) is refused, never run."""
    if not path.is_file():
        return None, None
    from skillgraft.untrusted import PICKLE_REFUSED, refused_pickle, torch_load  # noqa: PLC0415

    try:
        state = torch_load(path, mmap=mmap)  # weights only, under torch's floor (untrusted.TORCH_FLOOR)
    except SkillgraftError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged state is ignored: the stage starts over
        return None, PICKLE_REFUSED if refused_pickle(e) else "damaged"
    if not isinstance(state, dict):
        return None, "damaged (not a saved state)"
    try:
        return _restored(state), None
    except (TypeError, ValueError, KeyError, SkillgraftError):
        return None, "damaged (a saved value does not read back)"


def _read_manifest(path: Path) -> dict | None:
    try:
        saved = json.loads(path.read_text())
        fields = isinstance(saved, dict) and {"serial", "world", "fingerprint"} <= saved.keys()
        return saved if fields and all(type(saved[k]) is int and saved[k] > 0 for k in ("serial", "world")) else None
    except (OSError, ValueError):
        return None


def _write(path: Path, state: dict) -> None:
    import torch  # noqa: PLC0415

    from skillgraft.io import atomic_path  # noqa: PLC0415

    with atomic_path(path) as tmp:
        torch.save(_plain(state), tmp)


# A state holds, beside tensors and plain Python values, NumPy arrays (a RandomState's) and the values of types a
# layer registers a codec for (graft's budgets, dict keys, and regions); they are written as tagged plain values,
# so that ``weights_only=True`` reads the file back.
_BUILTIN_TAGS = ("__ndarray__", "__items__")
_CODECS: dict[str, tuple[type, object, object]] = {}  # tag → (type, encode, decode), in registration order


def register_codec(tag: str, kind: type, encode, decode) -> None:
    """Save values of ``kind`` in a resumable state as ``{tag: encode(value)}`` and read them back with
    ``decode``: how a layer above (graft: ``Budget``, ``Region``) puts its types into a state without this module
    importing it. ``encode`` returns plain values (dicts, lists, numbers, strings, tensors)."""
    if tag in _BUILTIN_TAGS or not (tag.startswith("__") and tag.endswith("__")):
        raise ValueError(f"codec tag {tag!r}: a new __name__")
    _CODECS[tag] = (kind, encode, decode)


def _tags() -> tuple[str, ...]:
    return _BUILTIN_TAGS + tuple(_CODECS)


def _plain(x):
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if x is None or isinstance(x, (bool, int, float, str, bytes, torch.Tensor)):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        if arr.dtype.hasobject:
            raise TypeError("a NumPy array of Python objects cannot be saved in a resumable state")
        return {"__ndarray__": arr.tobytes(), "dtype": arr.dtype.str, "shape": list(arr.shape),
                "scalar": isinstance(x, np.generic)}
    if isinstance(x, dict):
        tags = _tags()
        if all(isinstance(k, str) and k not in tags for k in x):
            return {k: _plain(v) for k, v in x.items()}
        return {"__items__": [[_plain(k), _plain(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    for tag, (kind, encode, _) in _CODECS.items():
        if isinstance(x, kind):
            return {tag: encode(x)}
    raise TypeError(f"a resumable state cannot hold a {type(x).__name__}")


def _restored(x):
    """The inverse of :func:`_plain` (the tagged values checked as they are rebuilt)."""
    if isinstance(x, list):
        return [_restored(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_restored(v) for v in x)
    if not isinstance(x, dict):
        return x
    if "__ndarray__" in x:
        import numpy as np  # noqa: PLC0415

        dtype = np.dtype(str(x["dtype"]))
        if dtype.hasobject:
            raise ValueError("object arrays are not read")
        arr = np.frombuffer(x["__ndarray__"], dtype=dtype).reshape([int(d) for d in x["shape"]]).copy()
        return arr[()] if x.get("scalar") else arr
    if "__items__" in x:
        return {_hashable(_restored(k)): _restored(v) for k, v in x["__items__"]}
    for tag, (_, _, decode) in _CODECS.items():
        if tag in x:
            return decode(x[tag])
    return {k: _restored(v) for k, v in x.items()}


def _hashable(k):
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def checkpoint(kind: str, settings, *, world: int = 1, rank: int = 0, device="cpu") -> Checkpoint | None:
    """The checkpoint of the next ``kind`` loop of the current stage (None outside a :func:`resume_point`).
    ``settings``: what the loop's result depends on beyond the stage's key (hashed into the fingerprint);
    ``world`` processes run it (``rank``: this one; ``device``: where its collectives' tensors live)."""
    point = _point.get()
    if point is None:
        return None
    from skillgraft.spec import stable_hash  # noqa: PLC0415

    folder, counters = point
    index = counters.get(kind, 0)
    counters[kind] = index + 1
    path, fingerprint = folder / f"{kind}-{index}.pt", stable_hash({"stage": counters[""], "loop": settings})
    return Sharded(path, fingerprint, world, rank, device) if world > 1 else Checkpoint(path, fingerprint)


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
