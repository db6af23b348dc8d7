"""Offline router study for issue 78: pooled states of every split + each dev/dev2 row scored under every skill."""
import os
STUDY = os.environ.get("ROUTE_STUDY", "/work/store/route-serve-bench/k64-04c77ec3/study")  # caches
import json, random, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from merge import rows_of, DATA
from skillgraft import RoutedSkills
import skillgraft.graft.router as R
torch.set_num_threads(1)
root = Path("/work/store/route-serve-bench/k64-04c77ec3")
out = root / "out" / "movement-0.02-auto-SST-2-ag_news-subj-trec-mr-cr-mpqa-QNLI"
tasks = "SST-2,ag_news,subj,trec,mr,cr,mpqa,QNLI".split(",")
skills = RoutedSkills.from_pretrained(out / "routed")
EXTRA, DEV2 = 1024, 64  # per task: router rows from the unused train pool; held-out dev2 rows (scored)

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
    sets.setdefault("dev2", {})[t] = rest[:DEV2]
    sets.setdefault("extra", {})[t] = rest[DEV2:DEV2 + EXTRA]
    for s in ("train", "dev", "test"):
        sets.setdefault(s, {})[t] = rows_of(root / "data" / t / f"{s}.jsonl")
feats, t0 = {}, time.perf_counter()
for s, by in sets.items():
    texts = [join(r) for t in tasks for r in by[t]]
    feats[s] = {"x": R.pooled(skills, texts, "all").half(), "y": torch.tensor([i for i, t in enumerate(tasks) for _ in by[t]]),
                "labels": [str(r["label"]) for t in tasks for r in by[t]]}
    print(s, len(texts), f"{time.perf_counter() - t0:.0f}s", flush=True)
torch.save(feats, STUDY + "/feats.pt")
# dev and dev2 rows under every skill: probabilities
scores = {}
for s in ("dev", "dev2"):
    scores[s] = {}
    for t in tasks:
        rows = sets[s][t]
        pair = "text_a" in rows[0]
        tx = [r["text_a"] if pair else r["text"] for r in rows]; px = [r["text_b"] for r in rows] if pair else None
        scores[s][t] = {}
        for k in tasks:
            got = skills.score(tx, k, pairs=px)
            scores[s][t][k] = [[g.label, g.probabilities] for g in got]
    print("scored", s, f"{time.perf_counter() - t0:.0f}s", flush=True)
json.dump(scores, open(STUDY + "/scores.json", "w"))
