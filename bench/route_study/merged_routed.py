"""A fair merge baseline for issue 78: the written merge's per-task heads (one merged body) with each test row's head
picked by the study's probe-layers router (`auto`'s router: 64-shot rows, every layer, the pair rule; not told the
task), beside the same merge told the task. Needs feats.pt (feats.py).

    SKILLGRAFT_CACHE=<the store> OMP_NUM_THREADS=1 PYTHONPATH=src python bench/route_study/merged_routed.py
"""
import json

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from common import OUT, ROOT, TASKS, rows_of
from study import X, feats, fit_probe, shape_mask, train_set

torch.set_num_threads(1)
MERGED = ROOT / "out" / "baselines-0.02-SST-2-ag_news-subj-trec-mr-cr-mpqa-QNLI" / "tasks"  # the written merge
ft = next(r for r in json.load(open(OUT / "merge.json"))["rows"] if r["method"] == "fine-tuned")
x, y = train_set(0)
probe = fit_probe(x.flatten(1), y)
pred = shape_mask(probe(X("test").flatten(1)), "test").argmax(-1).tolist()  # test rows in TASKS order, 200 each
assert feats["test"]["y"].tolist() == [i for i in range(len(TASKS)) for _ in range(200)]
tok = AutoTokenizer.from_pretrained(MERGED / TASKS[0])
models = {t: AutoModelForSequenceClassification.from_pretrained(MERGED / t).eval() for t in TASKS}


@torch.no_grad()
def labels(task, rows):
    m, out = models[task], []
    for i in range(0, len(rows), 32):
        batch = rows[i:i + 32]
        if "text_a" in batch[0]:
            enc = tok([r["text_a"] for r in batch], [r["text_b"] for r in batch], truncation=True, max_length=128,
                      padding=True, return_tensors="pt")
        else:
            enc = tok([r["text"] for r in batch], truncation=True, max_length=128, padding=True, return_tensors="pt")
        out += [m.config.id2label[int(k)] for k in m(**enc).logits.argmax(-1)]
    return out


told, routed, hit = {}, {}, {}
for t in TASKS:
    rows = rows_of(ROOT / "data" / t / "test.jsonl")
    gold = [str(r["label"]) for r in rows]
    picks = [TASKS[k] for k in pred[TASKS.index(t) * 200:(TASKS.index(t) + 1) * 200]]
    told[t] = sum(a == b for a, b in zip(labels(t, rows), gold)) / len(rows)
    got = {}
    for k in set(picks):
        idx = [i for i, p in enumerate(picks) if p == k]
        for i, lab in zip(idx, labels(k, [rows[i] for i in idx])):
            got[i] = lab
    routed[t] = sum(got[i] == g for i, g in enumerate(gold)) / len(rows)
    hit[t] = sum(p == t for p in picks) / len(rows)
    print(f"{t:8s} routing {hit[t]:.3f}  merged told {told[t]:.3f}  merged routed {routed[t]:.3f}  "
          f"(FT {ft[f'{t}:test']:.3f})", flush=True)
norm = lambda acc: sum(acc[t] / ft[f"{t}:test"] for t in TASKS) / len(TASKS)  # noqa: E731
print(f"mean normalized: merged told the task {norm(told):.4f}, merged with the router's heads {norm(routed):.4f}")
