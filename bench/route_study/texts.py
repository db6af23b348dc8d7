import os
STUDY = os.environ.get("ROUTE_STUDY", "/work/store/route-serve-bench/k64-04c77ec3/study")  # caches
import json, random, sys
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from merge import rows_of, DATA
root = Path("/work/store/route-serve-bench/k64-04c77ec3")
tasks = "SST-2,ag_news,subj,trec,mr,cr,mpqa,QNLI".split(",")
EXTRA, DEV2 = 1024, 64
def join(r):
    return f"{r['text_a']} {r['text_b']}" if "text_a" in r else r["text"]
def unused(task, k=64, dev=16):
    pool = rows_of(DATA / task / "train.jsonl"); rng = random.Random(42); rng.shuffle(pool)
    labels = sorted({r["label"] for r in pool}); rest = []
    for lab in labels:
        rest += [r for r in pool if r["label"] == lab][k + dev:]
    random.Random(7).shuffle(rest)
    return rest
sets = {}
for t in tasks:
    rest = unused(t)
    used = {join(r) for s in ("train", "dev") for r in rows_of(root / "data" / t / f"{s}.jsonl")}
    test = {join(r) for r in rows_of(root / "data" / t / "test.jsonl")}
    rest = [r for r in rest if join(r) not in used and join(r) not in test]
    sets.setdefault("dev2", {})[t] = [join(r) for r in rest[:DEV2]]
    sets.setdefault("extra", {})[t] = [join(r) for r in rest[DEV2:DEV2 + EXTRA]]
    for s in ("train", "dev", "test"):
        sets.setdefault(s, {})[t] = [join(r) for r in rows_of(root / "data" / t / f"{s}.jsonl")]
json.dump({s: [x for t in tasks for x in by[t]] for s, by in sets.items()}, open(STUDY + "/texts.json", "w"))
