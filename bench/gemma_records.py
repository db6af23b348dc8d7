"""Issue 46: a store's scores, kept where git keeps them — a fresh machine starts with an empty store.

The paper-schedule cells take hours each on this CPU and their store (fine-tuned weights, resume states: gigabytes)
lives on the machine's disk, which a new machine does not have. This copies what a finished stage *measured* — every
JSON and CSV file (``key.json``, ``rows.json``, ``metrics.json`` with a run's dev history, ``test_probs.csv`` …) of
every finished entry of the scoring kinds — into a folder that is committed; never the weights (nor a model folder's
config and tokenizer files) or the plots::

    python bench/gemma_records.py --store "$SKILLGRAFT_CACHE" --to bench/results/gemma46

The copy has the store's layout (``<kind>-<label>-<hash>/…``), so ``bench/gemma_summary.py --store
bench/results/gemma46 --k 64`` reads it as it reads the store. Unfinished entries (no ``key.json``) and resume
states are skipped; a file over ``--max-bytes`` is skipped and named. Re-running copies only what changed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from skillgraft.io import atomic_path
from skillgraft.pipeline.store import KEY_FILE  # an entry is finished once its key file is there

# What a cell measured: its grid points and fine-tuning (ft: metrics, dev history), the zero-shot scores, the
# learned regions' step history, the scored rows in and out of distribution
KINDS = ("ft", "zero-shot", "regions", "paper-rows", "paper-ood-rows")
SUFFIXES = (".json", ".csv")  # scores, histories, per-row probabilities; not .safetensors, .png


def keep(store: Path, to: Path, kinds: tuple[str, ...] = KINDS, max_bytes: int = 1 << 20) -> tuple[list, list]:
    """Copy the JSON and CSV files of every finished entry of ``kinds`` in ``store`` to ``to`` (same relative paths).
    Returns (copied, skipped): the files written (new or changed) and the (file, reason) pairs left out."""
    copied, skipped = [], []
    for entry in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not entry.name.startswith(tuple(f"{k}-" for k in kinds)) or not (entry / KEY_FILE).is_file():
            continue
        for src in sorted(p for p in entry.rglob("*") if p.suffix in SUFFIXES):
            rel = src.relative_to(store)
            if src.is_symlink() or not src.is_file() or any(src.parent.glob("*.safetensors")):
                continue  # a model folder's config and tokenizer files: part of the weights, not a score
            size = src.stat().st_size
            if size > max_bytes:
                skipped.append((rel, f"{size:,} bytes > {max_bytes:,}"))
                continue
            dst = to / rel
            if dst.is_file() and dst.read_bytes() == src.read_bytes():
                continue
            with atomic_path(dst) as tmp:  # a stopped copy leaves the old file or none, never half of one
                shutil.copyfile(src, tmp)
            copied.append(rel)
    return copied, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True, help="the store the cells ran in (SKILLGRAFT_CACHE)")
    ap.add_argument("--to", type=Path, required=True, help="the committed folder (bench/results/gemma46)")
    ap.add_argument("--max-bytes", type=int, default=1 << 20, help="skip a JSON or CSV file larger than this")
    a = ap.parse_args(argv)
    if not a.store.is_dir():
        print(f"--store {a.store}: no such folder", file=sys.stderr)
        return 2
    if a.to.resolve().is_relative_to(a.store.resolve()):
        print(f"--to {a.to}: inside the store {a.store}", file=sys.stderr)
        return 2
    copied, skipped = keep(a.store, a.to, max_bytes=a.max_bytes)
    for rel, why in skipped:
        print(f"skipped {rel}: {why}", file=sys.stderr)
    print(f"{len(copied)} file(s) written to {a.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
