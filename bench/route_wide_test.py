"""Issue 78: `auto` ÷ oracle of bench/route_serve.py's stored routed skills on more test rows than its 200 per task.

The 200-row sample gave 0.985 with a bootstrap 95 % interval of 0.970–1.001: too wide to say whether the router keeps
99 % of the oracle. This scores the same stored skills, and the router route_serve.py measured (fitted on the stored
training rows, its kind chosen on dev), (nothing chosen on test) on a larger
seeded sample of each task's test split (``--test`` rows per task; the tasks with fewer: all of them): each task's
fine-tuned model (plain transformers, its own tokenizer: the normalizer), each task's graft with the task named
(oracle) and ``skill="auto"`` on all tasks' rows shuffled into mixed batches; the mean normalized accuracy of each,
their ratio and its bootstrap interval (rows resampled within each task). Each row is also marked *shared* when its
text (both texts of a pair, joined; compared lower-cased and stripped) occurs verbatim in another routed task's data
(any split of ../shared/data), and the ratio is given again on the rows no other task holds: a router over the text
alone has no way to route a shared row by its content.

    OMP_NUM_THREADS=1 .venv/bin/python bench/route_wide_test.py [--test 1000]

Writes bench/results/route_wide_test.json (bench/RESULTS.md § *`auto` on 1,000 test rows per task*).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
STORE = Path("/work/store/route-serve-bench/k64-04c77ec3")
TASKS = "SST-2,ag_news,subj,trec,mr,cr,mpqa,QNLI"


def rows_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def split(rows: list[dict]) -> tuple[list[str], list[str] | None]:
    if "text_a" in rows[0]:
        return [r["text_a"] for r in rows], [r["text_b"] for r in rows]
    return [r["text"] for r in rows], None


def key(row: dict) -> str:
    """A row's text as the router sees it (a pair's two texts joined), compared case-folded and stripped."""
    return (" ".join([row["text_a"], row["text_b"]]) if "text_a" in row else row["text"]).strip().lower()


def shared_texts(tasks: list[str]) -> dict[str, set[str]]:
    """Per task, the texts of every other routed task's rows (all splits on disk)."""
    own = {t: {key(r) for part in ("train", "dev", "test") if (DATA / t / f"{part}.jsonl").exists()
               for r in rows_of(DATA / t / f"{part}.jsonl")} for t in tasks}
    return {t: set().union(*(own[u] for u in tasks if u != t)) for t in tasks}


def ft_hits(folder: Path, rows: list[dict]) -> list[bool]:
    """The fine-tuned classifier read by plain transformers: right or wrong per row. (On route_serve.py's 200 test
    rows per task it gives merge.json's fine-tuned accuracy on all eight tasks, to the row.)"""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    texts, pairs = split(rows)
    hits = []
    with torch.no_grad():
        for s in range(0, len(texts), 32):
            enc = tok(texts[s:s + 32], pairs[s:s + 32] if pairs else None, truncation=True, max_length=128,
                      padding=True, return_tensors="pt")
            pred = model(**enc).logits.argmax(-1).tolist()
            hits += [model.config.id2label[p] == str(r["label"]) for p, r in zip(pred, rows[s:s + 32])]
    return hits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--store", type=Path, default=STORE)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "route_wide_test.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from skillgraft import RoutedSkills

    t0 = time.perf_counter()
    tasks = args.tasks.split(",")
    # the merge of exactly these tasks (route_serve.py names its output folder by them)
    merged = sorted((args.store / "out").glob(f"movement-*-auto-{'-'.join(tasks)}"))
    if not merged:
        raise SystemExit(f"{args.store / 'out'}: no routed merge of {', '.join(tasks)} (run bench/route_serve.py "
                         f"--tasks {args.tasks} first)")
    routed = merged[0] / "routed"
    skills = RoutedSkills.from_pretrained(routed)
    # the router bench/route_serve.py measured (its --refit default): every kind fitted by this code on the stored
    # training rows, auto's choice made on the dev rows (the stored routed/ keeps an older router)
    from skillgraft.graft.router import fit_router

    def joined(path: Path) -> list[str]:
        return [" ".join([r["text_a"], r["text_b"]]) if "text_a" in r else r["text"] for r in rows_of(path)]

    fit = {part: {t: joined(args.store / "data" / t / f"{part}.jsonl") for t in tasks} for part in ("train", "dev")}
    shapes = {t: "text_a" in rows_of(args.store / "data" / t / "dev.jsonl")[0] for t in tasks}
    skills.router = fit_router(skills, fit["train"], fit["dev"], "auto", pairs=shapes)
    print(f"router: {skills.router.kind} (dev {skills.router.info['accuracy'][skills.router.kind]['dev']:.3f})",
          flush=True)
    rows = {}
    for t in tasks:
        pool = rows_of(DATA / t / "test.jsonl")
        rows[t] = random.Random(7).sample(pool, min(args.test, len(pool)))
    ft, oracle, auto = {}, {}, {t: [False] * len(rows[t]) for t in tasks}
    for t in tasks:
        ft[t] = ft_hits(args.store / "ft" / t, rows[t])
        texts, pairs = split(rows[t])
        got = []
        for s in range(0, len(texts), 32):
            got += skills.score(texts[s:s + 32], t, pairs=pairs[s:s + 32] if pairs else None)
        oracle[t] = [g.label == str(r["label"]) for g, r in zip(got, rows[t])]
        print(f"{t}: {len(rows[t])} rows, FT {np.mean(ft[t]):.3f}, oracle {np.mean(oracle[t]):.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    mixed = [(t, i) for t in tasks for i in range(len(rows[t]))]
    random.Random(0).shuffle(mixed)
    routed_to = {t: {} for t in tasks}
    for s in range(0, len(mixed), args.batch):
        part = mixed[s:s + args.batch]
        for group in ([p for p in part if "text_a" not in rows[p[0]][p[1]]],
                      [p for p in part if "text_a" in rows[p[0]][p[1]]]):
            if not group:
                continue
            texts, pairs = split([rows[t][i] for t, i in group])
            for (t, i), g in zip(group, skills.score(texts, "auto", pairs=pairs)):
                auto[t][i] = g.label == str(rows[t][i]["label"])
                routed_to[t][g.skill] = routed_to[t].get(g.skill, 0) + 1
    print(f"auto scored ({time.perf_counter() - t0:.0f} s)", flush=True)

    def share(keep: dict[str, np.ndarray]) -> tuple[float, float, float]:
        """Oracle's and auto's mean normalized accuracy and their ratio, over the rows ``keep`` indexes per task
        (each task normalized by FT on the same rows)."""
        norm = {name: np.mean([np.asarray(h[t])[keep[t]].mean() / np.asarray(ft[t])[keep[t]].mean() for t in tasks])
                for name, h in (("oracle", oracle), ("auto", auto))}
        return norm["oracle"], norm["auto"], norm["auto"] / norm["oracle"]

    def interval(keep: dict[str, np.ndarray], seed: int = 0) -> tuple[float, float, float]:
        """The ratio's bootstrap 95 % interval (rows resampled within each task) and the share of resamples ≥ 0.99."""
        rng = np.random.default_rng(seed)
        boot = np.array([share({t: rng.choice(keep[t], len(keep[t])) for t in tasks})[2] for _ in range(2000)])
        lo, hi = np.quantile(boot, [0.025, 0.975])
        return float(lo), float(hi), float(np.mean(boot >= 0.99))

    everything = {t: np.arange(len(rows[t])) for t in tasks}
    o, a, r = share(everything)
    lo, hi, above = interval(everything)
    others = shared_texts(tasks)
    shared = {t: np.array([key(row) in others[t] for row in rows[t]]) for t in tasks}
    alone = {t: np.flatnonzero(~shared[t]) for t in tasks}
    o1, a1, r1 = share(alone)
    lo1, hi1, above1 = interval(alone)
    per_task = {t: {"rows": len(rows[t]), "ft": float(np.mean(ft[t])), "oracle": float(np.mean(oracle[t])),
                    "auto": float(np.mean(auto[t])), "routed_to": routed_to[t],
                    "shared_rows": int(shared[t].sum()),
                    "unshared": {"ft": float(np.mean(np.asarray(ft[t])[alone[t]])),
                                 "oracle": float(np.mean(np.asarray(oracle[t])[alone[t]])),
                                 "auto": float(np.mean(np.asarray(auto[t])[alone[t]]))}} for t in tasks}
    out = {"store": str(args.store), "routed": str(routed), "router": skills.router.kind, "test_per_task": args.test,
           "per_task": per_task, "oracle_mean_normalized": o, "auto_mean_normalized": a, "auto_share_of_oracle": r,
           "bootstrap_95": [lo, hi], "bootstrap_at_least_0.99": above,
           "unshared": {"rows": int(sum(len(v) for v in alone.values())), "oracle_mean_normalized": o1,
                        "auto_mean_normalized": a1, "auto_share_of_oracle": r1, "bootstrap_95": [lo1, hi1],
                        "bootstrap_at_least_0.99": above1},
           "seconds": time.perf_counter() - t0}
    args.results.write_text(json.dumps(out, indent=2))
    for t, v in per_task.items():
        print(f"{t:8} FT {v['ft']:.3f} oracle {v['oracle']:.3f} auto {v['auto']:.3f} → {v['routed_to']}; "
              f"{v['shared_rows']} rows verbatim in another task's data")
    print(f"oracle {o:.4f}, auto {a:.4f}: auto ÷ oracle {r:.4f} (95 % {lo:.4f}–{hi:.4f}; {above:.0%} of resamples ≥ 0.99)")
    print(f"rows no other task holds ({out['unshared']['rows']}): oracle {o1:.4f}, auto {a1:.4f}: auto ÷ oracle "
          f"{r1:.4f} (95 % {lo1:.4f}–{hi1:.4f}; {above1:.0%} of resamples ≥ 0.99)")


if __name__ == "__main__":
    sys.exit(main())
