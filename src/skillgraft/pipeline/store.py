"""The one cache of finished stages: fine-tuned runs, learned regions, trained baselines, evaluations.

An entry is a folder ``<root>/<kind>-<label>-<hash>`` where the hash covers everything that determines
the result: the resolved specs, the content hashes of the data files, the model's identity and the
store's format version. Entries are written to a temporary sibling and renamed into place only when
complete (``key.json`` inside records the key), so an interrupted run leaves no half entry and a re-run
resumes from the last finished stage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skillgraft.digest import file_digest
from skillgraft.io import TargetExists, _remove, atomic_dir, env_path, sibling
from skillgraft.locking import locked
from skillgraft.resume import discard, resume_point
from skillgraft.spec import stable_hash

FORMAT_VERSION = 1
KEY_FILE = "key.json"
DEFAULT_ROOT = Path("runs") / "cache"
HASH_CHARS = len(stable_hash({}))  # an entry name's last part


class Store:
    """Finished stages keyed by what determines them (see the module doc)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else env_path("SKILLGRAFT_CACHE", DEFAULT_ROOT)  # empty: unset

    def path(self, kind: str, key: dict[str, Any], label: str = "") -> Path:
        """Where the entry for ``key`` lives (it may not exist yet)."""
        digest = stable_hash({"store_format": FORMAT_VERSION, "kind": kind, **key})
        name = "-".join(x for x in (kind, _slug(label), digest) if x)
        return self.root / name

    def resume_path(self, kind: str, key: dict[str, Any], label: str = "") -> Path:
        """Where the entry's long loops save their state while it is being computed (skillgraft.resume)."""
        return sibling(self.path(kind, key, label), "resume")

    def entries(self, kind: str, label: str, *, finished: bool = True) -> list[Path]:
        """Every entry of ``kind`` and ``label`` whatever its key, oldest first (reports, which know a stage's name but
        not its key), or with ``finished=False`` the resume folders of such entries still being computed. Names are
        matched whole (``<kind>-<label>-<hash>``): a longer label sharing the prefix is not taken for this one."""
        name = "-".join(x for x in (kind, _slug(label)) if x) + "-" + "?" * HASH_CHARS
        pattern = name if finished else sibling(self.root / name, "resume").name
        found = [p for p in self.root.glob(pattern) if p.is_dir() and (not finished or (p / KEY_FILE).is_file())]
        return sorted(found, key=lambda p: p.stat().st_mtime)

    def newest(self, kind: str, label: str, *, finished: bool = True) -> Path | None:
        """The most recently written of :meth:`entries`, or None."""
        found = self.entries(kind, label, finished=finished)
        return found[-1] if found else None

    def get(self, kind: str, key: dict[str, Any], label: str = "") -> Path | None:
        """The finished entry, or None."""
        path = self.path(kind, key, label)
        return path if (path / KEY_FILE).is_file() else None

    def fetch(self, kind: str, key: dict[str, Any], make: Callable[[Path], None], label: str = "") -> Path:
        """The finished entry for ``key``; if there is none, ``make(folder)`` writes it (atomically)."""
        found = self.get(kind, key, label)
        if found is not None:
            return found
        path = self.path(kind, key, label)
        # One process computes an entry at a time: another run on the same store (same key) waits, then finds it
        # finished. Before, both computed it, the first to finish deleted the other's resume folder, and the other
        # died when it next saved its state there.
        # (Not under a multi-process launch, whose ranks compute an entry together: a rank waiting for the lock
        # would leave the holder waiting for it in a collective.)
        world = os.environ.get("WORLD_SIZE", "1").strip()
        launched = world.isdigit() and int(world) > 1
        lock = contextlib.nullcontext() if launched else locked(
            sibling(path, "lock"), f"waiting for another process computing {path.name} in the store {self.root} …")
        with lock:
            found = self.get(kind, key, label)
            if found is not None:
                return found
            if os.path.lexists(path):  # only an unfinished (keyless) entry can be here (an old version's)
                _remove(path)
            resume = self.resume_path(kind, key, label)  # long loops' saved state: the same command resumes
            try:
                with resume_point(resume), atomic_dir(path) as tmp:
                    make(tmp)
                    (tmp / KEY_FILE).write_text(json.dumps({"kind": kind, **key}, indent=1, default=str) + "\n")
            except TargetExists:
                # another rank of a launch, or a skillgraft without this lock, finished the same entry meanwhile:
                # the same key, the same result; it stays (it may be being read) and ours is dropped
                if self.get(kind, key, label) is None:
                    raise
            discard(resume)
        return path


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in str(label))[:60]


def draw_key(model, data) -> dict:
    """What determines a run from θ_pre on one k-shot draw: a ModelSpec + the model's identity, a DataSpec + the
    data files' digest (the data root left out: the same files anywhere are the same draw)."""
    return {"model": model.to_dict(), "model_digest": model_digest(model.model),
            "data": data.to_dict() | {"data_dir": None}, "data_digest": data_digest(data.task, data.data_dir)}


def precision_key(placed) -> dict:
    """The part of a store key that says a run computed in bf16 or bf16-mixed. ``placed``: the run's placement (a
    Runtime, passed down) or what was placed by it (a Member); None or fp32: nothing, so fp32's keys are as they
    always were. The device is never part of a key."""
    precision = getattr(placed, "precision", None) or "fp32"
    return {"precision": precision} if precision != "fp32" else {}


def data_digest(task, data_dir=None) -> str:
    """Content hash of every split file of ``task`` found under its data root."""
    from skillgraft.data.loading import find_split_file, resolve_data_dir  # noqa: PLC0415
    from skillgraft.data.tasks import get_task  # noqa: PLC0415

    task = get_task(task)
    root = resolve_data_dir(data_dir, task)
    files = [f for split in ("train", "dev", "test") if (f := find_split_file(task, split, root)) is not None]
    kshot = root / "k-shot" / task.data_folder
    if kshot.is_dir():
        files += [f for f in kshot.rglob("*") if f.is_file()]
    return file_digest(files)


def model_digest(model: str | None) -> str:
    """Identity of a pre-trained model for cache keys: for a local folder its config and weight files
    (name, size, modification time; a folder converted from GGUF: the file's sha256), for the bundled MiniLM its
    package version, else the hub name."""
    from skillgraft.models.loading import model_reference  # noqa: PLC0415

    from skillgraft.models.gguf import SOURCE_FILE  # noqa: PLC0415

    ref = model_reference(model)
    folder = Path(ref.path)
    if not folder.is_dir():
        return ref.name
    h = hashlib.sha256(ref.name.encode())
    if (folder / SOURCE_FILE).is_file():  # converted from a GGUF file: the file's content is its identity
        h.update(json.loads((folder / SOURCE_FILE).read_text())["sha256"].encode())
        return h.hexdigest()[:16]
    for f in sorted(folder.iterdir()):
        if f.is_file() and (f.suffix in (".safetensors", ".bin", ".json") or f.name.startswith("tokenizer")):
            st = f.stat()
            h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]
