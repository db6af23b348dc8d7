"""Offline router study for issue 78: pooled states of every split + each dev/dev2 row scored under every skill."""
import json
import sys
import time

import torch

from common import OUT, STUDY, TASKS as tasks, join, row_sets
from skillgraft import RoutedSkills
import skillgraft.graft.router as R

torch.set_num_threads(1)
skills = RoutedSkills.from_pretrained(OUT / "routed")
sets = row_sets()
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
