"""Paths and row sets shared by the study's scripts: the route_serve bench's store (under $SKILLGRAFT_CACHE) and the
study's caches ($ROUTE_STUDY, default the store's `study/`)."""
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ (merge.py's row readers)
from merge import DATA, rows_of  # noqa: E402

ROOT = Path(os.environ.get("SKILLGRAFT_CACHE", "runs/cache")) / "route-serve-bench" / "k64-04c77ec3"
OUT = ROOT / "out" / "movement-0.02-auto-SST-2-ag_news-subj-trec-mr-cr-mpqa-QNLI"
STUDY = os.environ.get("ROUTE_STUDY", str(ROOT / "study"))
TASKS = "SST-2,ag_news,subj,trec,mr,cr,mpqa,QNLI".split(",")
EXTRA, DEV2 = 1024, 64  # per task: router rows from the unused train pool; held-out dev2 rows (scored)


def join(r):
    return f"{r['text_a']} {r['text_b']}" if "text_a" in r else r["text"]


def unused(task, k=64, dev=16):
    """The task's training rows no 64-shot draw took (the bench's draw: seed 42 shuffle, k + dev per label)."""
    pool = rows_of(DATA / task / "train.jsonl")
    random.Random(42).shuffle(pool)
    rest = []
    for lab in sorted({r["label"] for r in pool}):
        rest += [r for r in pool if r["label"] == lab][k + dev:]
    random.Random(7).shuffle(rest)
    return rest


def row_sets():
    """{split: {task: rows}} for train / dev / test (the bench's) and dev2 / extra (unused rows, none in test)."""
    sets = {}
    for t in TASKS:
        used = {join(r) for s in ("train", "dev") for r in rows_of(ROOT / "data" / t / f"{s}.jsonl")}
        test = {join(r) for r in rows_of(ROOT / "data" / t / "test.jsonl")}
        rest = [r for r in unused(t) if join(r) not in used and join(r) not in test]
        sets.setdefault("dev2", {})[t] = rest[:DEV2]
        sets.setdefault("extra", {})[t] = rest[DEV2:DEV2 + EXTRA]
        for s in ("train", "dev", "test"):
            sets.setdefault(s, {})[t] = rows_of(ROOT / "data" / t / f"{s}.jsonl")
    return sets
