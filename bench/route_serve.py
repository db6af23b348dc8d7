"""Issue 78 figures: routed skills that route themselves, on MiniLM classifiers of ../shared/data tasks.

1. Per task (``--tasks``): K rows per label to fine-tune on, the next ``--dev`` per label as dev rows, a seeded
   ``--test`` sample of test (bench/merge.py's ``prepare``); a plain-transformers AdamW fine-tune of the bundled
   all-MiniLM-L6-v2 (bench/merge.py's ``finetune``), kept under ``--root``.
2. ``skillgraft merge --routed`` (top-|Δ| at ``--budget``, no stitch, no mergekit): routed/ with each task's graft
   and the router (``--router``, default auto: centroid or probe, chosen on the dev rows).
3. On every task's test rows: routing accuracy (the router's skill = the row's task), accuracy with the task named
   (oracle) and with ``skill="auto"`` (the rows of all tasks shuffled into mixed batches), each ÷ the task's own
   fine-tuned model (merge.json) = normalized accuracy, and the mean over tasks. The router is the one stored in
   routed/ unless ``--refit`` (default): then every router kind is fitted afresh (this code) on the stored train
   rows, ``auto``'s choice made on the dev rows, and each kind's routing and share of the oracle are reported
   beside the stored router's (``before``), from each test row scored under every skill (the diagnosis: the
   confusion and each task's accuracy under each skill, ``cross``); the chosen router then scores the mixed batches.
4. With ``--baselines`` (default; ``--baselines-only`` stops there): a second merge of the stored grafts — the
   stitch (one model, the grafts' union), dense mergekit task arithmetic and TIES, EMR and T-Switch at the grafts'
   bytes — each method's test mean normalized accuracy beside ``auto``'s.
5. Throughput on one core, requests of ``--batch`` rows: single-skill traffic (every request names one skill),
   mixed-skill traffic (each request names a random skill: a swap whenever it changes), and mixed ``auto`` batches
   (each request's rows from random tasks, routed and grouped); rows/s and the swap's share of the time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/route_serve.py [--tasks SST-2,ag_news,subj,trec,mr,cr,mpqa,QNLI]

Writes bench/results/route_serve.json and prints a summary (bench/RESULTS.md § *Routed skills that route
themselves*).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from merge import finetune, prepare, rows_of, run_merge  # noqa: E402  (bench/merge.py's data and fine-tuning)


def test_rows(root: Path, task: str) -> list[dict]:
    return rows_of(root / "data" / task / "test.jsonl")


def texts_of(rows: list[dict]) -> tuple[list[str], list[str] | None]:
    if "text_a" in rows[0]:
        return [r["text_a"] for r in rows], [r["text_b"] for r in rows]
    return [r["text"] for r in rows], None


def accuracy(skills, rows: list[dict], skill: str) -> float:
    texts, pairs = texts_of(rows)
    out = []
    for start in range(0, len(texts), 32):
        out += skills.score(texts[start:start + 32], skill,
                            pairs=pairs[start:start + 32] if pairs else None)
    return sum(o.label == str(r["label"]) for o, r in zip(out, rows)) / len(rows)


BASELINES = ["--mergekit", "task_arithmetic,ties", "--scales", "0.3,0.5,1", "--densities", "0.2",
             "--rules", "average", "--stitch-scales", "1,2,4", "--peers", "emr,tswitch",
             "--tswitch-densities", "0.4"]


def merge_baselines(root: Path, tasks: list[str], out: Path, args) -> dict:
    """The routed skills' grafts merged into one model (the stitch, λ chosen on dev: the grafts' union, at most
    their total bytes), dense mergekit merges (task arithmetic, TIES; λ chosen on dev) and the task-aware peers at
    one graft's bytes per task (EMR, T-Switch: the task named); each method's test mean normalized accuracy."""
    base = out.parent / f"baselines-{args.budget}-{'-'.join(tasks)}"
    if not (base / "merge.json").is_file():
        cli = ["merge", "--pretrained", "all-MiniLM-L6-v2", "--out", base, "--overwrite", "--localizer", "movement",
               "--budgets", args.budget, *BASELINES]
        for task in tasks:
            cli += ["--grafts", out / "grafts" / task, "--finetuned", root / "ft" / task,
                    "--data", root / "data" / task / "spec.yaml", "--dev-data", root / "data" / task / "dev.jsonl",
                    "--names", task]
        run_merge(cli)
    summary = json.loads((base / "merge.json").read_text())
    rows = [r for r in summary["rows"] if r.get("on_test", True)]
    return {"folder": str(base), "rows": [{k: r.get(k) for k in ("method", "config", "chosen_on_dev",
                                                                   "dev_mean_normalized", "mean_normalized",
                                                                   "bytes_per_task")} for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="SST-2,ag_news,subj,trec,mr,cr,mpqa,QNLI")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--dev", type=int, default=16)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--budget", default="0.02")
    ap.add_argument("--router", default="auto")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--refit", action=argparse.BooleanOptionalAction, default=True,
                    help="fit the routers afresh on the stored rows (this code), compare with the stored one")
    ap.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                    help="also one merged model of the same grafts (the stitch) and dense mergekit merges, and the "
                         "task-aware peers at the grafts' bytes (a second merge of the stored grafts)")
    ap.add_argument("--baselines-only", action="store_true", help="run the baseline merge and stop")
    ap.add_argument("--root", type=Path, default=Path("/work/store/route-serve-bench"))
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "route_serve.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from skillgraft import RoutedSkills
    from skillgraft.graft.routed import switch_seconds
    from skillgraft.graft.router import ROUTERS, fit_router
    from skillgraft.models.loading import bundled_minilm_path

    tasks = args.tasks.split(",")
    key = [args.k, args.dev, args.test, args.lr, args.epochs]
    root = args.root / f"k{args.k}-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:8]}"
    t0 = time.perf_counter()
    for task in tasks:
        data = prepare(task, args.k, args.dev, args.test, root)
        if not (root / "ft" / task).is_dir():
            print(f"fine-tuned {task}: {finetune(bundled_minilm_path(), data, root / 'ft' / task, lr=args.lr, epochs=args.epochs)}",
                  flush=True)
    t_ft = time.perf_counter() - t0
    out = root / "out" / f"movement-{args.budget}-{args.router}-{'-'.join(tasks)}"
    if not (out / "merge.json").is_file():
        cli = ["merge", "--pretrained", "all-MiniLM-L6-v2", "--out", out, "--overwrite", "--localizer", "movement",
               "--budgets", args.budget, "--mergekit", "", "--no-stitch", "--routed", "--router", args.router]
        for task in tasks:
            cli += ["--finetuned", root / "ft" / task, "--data", root / "data" / task / "spec.yaml",
                    "--dev-data", root / "data" / task / "dev.jsonl", "--names", task]
        run_merge(cli)
    t_merge = time.perf_counter() - t0 - t_ft
    baselines = merge_baselines(root, tasks, out, args) if args.baselines or args.baselines_only else None
    if args.baselines_only:
        print(json.dumps(baselines, indent=2))
        return
    summary = json.loads((out / "merge.json").read_text())
    ft = next(r for r in summary["rows"] if r["method"] == "fine-tuned" and r.get(f"{tasks[0]}:test") is not None)
    skills = RoutedSkills.from_pretrained(out / "routed")
    rows = {t: test_rows(root, t) for t in tasks}
    ft_test = {t: ft[f"{t}:test"] for t in tasks}
    mixed = [(t, r) for t in tasks for r in rows[t]]
    random.Random(0).shuffle(mixed)
    texts = [" ".join(texts_of([r])[0] + (texts_of([r])[1] or [])) for _, r in mixed]
    paired = ["text_a" in r for _, r in mixed]

    def routed(router) -> list:
        skills.router = router
        got = []
        for start in range(0, len(texts), 64):
            got += skills.route(texts[start:start + 64], paired=paired[start:start + 64])
        return got

    compare, cross, before = {}, None, skills.router
    import skillgraft.graft.router as router_module
    plain_pooled, memo = router_module.pooled, {}

    def pooled(skills_, texts_, layers="last", batch_size=32):  # each text's states once, whichever kind asks
        key = tuple(texts_)
        if key not in memo:
            memo[key] = plain_pooled(skills_, texts_, "all", batch_size)
        return memo[key] if layers == "all" else memo[key][:, -1:]

    if args.refit:
        router_module.pooled = pooled
        # each test row under every skill: the cross matrix (diagnosis) and any router's accuracy kept, by lookup;
        # kept beside the merge (keyed by the skills' digests), so a rerun does not score them again
        stored = out / f"cross-test{args.test}.json"
        hit = json.loads(stored.read_text()) if stored.is_file() else {}
        if hit.get("digests") != skills.digests:
            hit = {"digests": skills.digests}
            for t in tasks:
                tx, px = texts_of(rows[t])
                hit[t] = {}
                for s in tasks:
                    got = []
                    for start in range(0, len(tx), 32):
                        got += skills.score(tx[start:start + 32], s, pairs=px[start:start + 32] if px else None)
                    hit[t][s] = [g.label == str(r["label"]) for g, r in zip(got, rows[t])]
            stored.write_text(json.dumps(hit))
        cross = {t: {s: sum(hit[t][s]) / len(rows[t]) for s in tasks} for t in tasks}
        where = {id(r): i for t in tasks for i, r in enumerate(rows[t])}

        def kept(routes) -> dict:
            acc = {t: 0 for t in tasks}
            for (t, r), ro in zip(mixed, routes):
                acc[t] += ro.skill in hit[t] and hit[t][ro.skill][where[id(r)]]
            norm = {t: acc[t] / len(rows[t]) / ft_test[t] for t in tasks}
            oracle_norm = sum(cross[t][t] / ft_test[t] for t in tasks) / len(tasks)
            return {"routing": sum(ro.skill == t for (t, _), ro in zip(mixed, routes)) / len(mixed),
                    "mean_normalized": sum(norm.values()) / len(tasks),
                    "share_of_oracle": sum(norm.values()) / len(tasks) / oracle_norm}

        compare["before (stored)"] = {"kind": before.kind, **kept(routed(before))}
        fit_rows = {split: {t: [" ".join(texts_of([r])[0] + (texts_of([r])[1] or []))
                                for r in rows_of(root / "data" / t / f"{split}.jsonl")] for t in tasks}
                    for split in ("train", "dev")}
        shapes = {t: "text_a" in rows[t][0] for t in tasks}
        for kind in (*ROUTERS.members, "auto"):
            fitted = fit_router(skills, fit_rows["train"], fit_rows["dev"], kind, pairs=shapes)
            compare[kind] = {"kind": fitted.kind, "dev": fitted.info["accuracy"][fitted.kind]["dev"],
                             **kept(routed(fitted))}
            compare[kind + " (no pair rule)"] = {"kind": fitted.kind, **kept(routed(
                type(fitted)(fitted.kind, fitted.tasks, fitted.params, fitted.threshold, fitted.info)))}
        skills.router = fitted  # auto's choice, made on dev, scores the mixed batches below
    router_record = {"kind": skills.router.kind, **skills.router.info, "pairs": skills.router.pairs}

    # routing accuracy and auto vs oracle
    routes = routed(skills.router)
    routing = {t: sum(ro.skill == t for (tt, _), ro in zip(mixed, routes) if tt == t) / len(rows[t]) for t in tasks}
    confusion = {t: {} for t in tasks}
    for (t, _), ro in zip(mixed, routes):
        confusion[t][ro.skill] = confusion[t].get(ro.skill, 0) + 1
    router_module.pooled = plain_pooled  # nothing cached from here on: the rates below pay for routing
    oracle = {t: accuracy(skills, rows[t], t) for t in tasks}
    auto_hits = {t: 0 for t in tasks}
    for start in range(0, len(mixed), args.batch):  # mixed batches of every task's rows, skill="auto"
        part = mixed[start:start + args.batch]
        singles = [p for p in part if "text_a" not in p[1]]
        pairs = [p for p in part if "text_a" in p[1]]
        for group in (singles, pairs):
            if not group:
                continue
            tx, px = texts_of([r for _, r in group])
            got = skills.score(tx, "auto", pairs=px)
            for (t, r), g in zip(group, got):
                auto_hits[t] += g.label == str(r["label"])
    auto = {t: auto_hits[t] / len(rows[t]) for t in tasks}
    norm = {name: {t: acc[t] / ft_test[t] for t in tasks} for name, acc in (("oracle", oracle), ("auto", auto))}
    mean = {name: sum(v.values()) / len(v) for name, v in norm.items()}

    # throughput: single-skill vs mixed-skill traffic vs mixed auto batches
    rng = random.Random(1)
    singles = [t for t in tasks if "text_a" not in rows[t][0]]

    def request(task: str) -> list[str]:
        return [r["text"] for r in rng.sample(rows[task], args.batch)]

    def timed(plan) -> tuple[float, int]:
        swaps = skills.swaps
        t1 = time.perf_counter()
        for skill, batch in plan:
            skills.score(batch, skill)
        return time.perf_counter() - t1, skills.swaps - swaps

    one = singles[0]
    plans = {
        "single-skill": [(one, request(one)) for _ in range(args.requests)],
        "mixed-skill": [(t, request(t)) for t in (rng.choice(singles) for _ in range(args.requests))],
        "mixed auto": [("auto", [r["text"] for r in (rng.choice(rows[rng.choice(singles)])
                                                     for _ in range(args.batch))]) for _ in range(args.requests)],
    }
    timed(plans["single-skill"][:3])  # warm-up
    switch = switch_seconds(skills)
    throughput = {}
    for name, plan in plans.items():
        seconds, swaps = timed(plan)
        throughput[name] = {"rows_per_s": len(plan) * args.batch / seconds, "seconds": seconds, "swaps": swaps,
                            "swap_share": swaps * switch / seconds}
    ratio = {k: throughput[k]["rows_per_s"] / throughput["single-skill"]["rows_per_s"]
             for k in ("mixed-skill", "mixed auto")}
    record = {"settings": vars(args) | {"root": str(args.root), "results": str(args.results)},
              "router": router_record, "routers": compare, "baselines": baselines, "cross": cross,
              "routing_accuracy": routing,
              "routing_accuracy_mean": sum(routing.values()) / len(tasks), "confusion": confusion,
              "ft_test": ft_test, "oracle": oracle, "auto": auto, "normalized": norm, "mean_normalized": mean,
              "auto_share_of_oracle": mean["auto"] / mean["oracle"], "switch_ms": 1e3 * switch,
              "throughput": throughput, "throughput_vs_single": ratio,
              "seconds": {"finetune": t_ft, "merge": t_merge, "total": time.perf_counter() - t0}}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2))
    print(json.dumps({k: record[k] for k in ("routing_accuracy_mean", "mean_normalized", "auto_share_of_oracle",
                                             "throughput_vs_single", "switch_ms", "seconds")}, indent=2))
    print("router:", {k: v for k, v in (record["router"] or {}).items() if k in ("kind", "accuracy")})
    for name, c in compare.items():
        print(f"{name:>28}: {c['kind']:>15} dev {c.get('dev') or float('nan'):.3f}  test routing {c['routing']:.3f}  "
              f"share of oracle {c['share_of_oracle']:.4f}")
    if cross:
        print("accuracy of each skill (column) on each task's rows, ÷ its own skill's:")
        print(" " * 9 + "".join(f"{s:>8}" for s in tasks))
        for t in tasks:
            print(f"{t:>8} " + "".join(f"{cross[t][s] / max(cross[t][t], 1e-9):8.2f}" for s in tasks))
    for t in tasks:
        print(f"{t:>8}: routed {routing[t]:.3f}  oracle {norm['oracle'][t]:.3f}  auto {norm['auto'][t]:.3f}  "
              f"confusion {confusion[t]}")
    for k, v in throughput.items():
        print(f"{k:>13}: {v['rows_per_s']:.1f} rows/s, {v['swaps']} swaps, swap share {v['swap_share']:.3f}")


if __name__ == "__main__":
    main()
