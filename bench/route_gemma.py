"""Issue 78 on the second model set: routed skills on Gemma-3-270M's four routed tasks (causal prompt mode).

1. The Table 2 fine-tunes (bench/fidelity/gemma-table2-{a,b,c}.yaml: K = 16 per label, data seed 13, SGD lr 1e-3 ×
   64 steps, frozen embeddings), made by the recipes' own fine-tuning stage (``pipeline.opening.finetuned_run`` with
   the recipe's specs, so the store keys them as the recipe does and bench/merge_gemma.py's ``find_ft`` finds them);
   no localizer runs. Already in the store: nothing trains.
2. One ``skillgraft merge --mode causal --routed`` over them at a fixed top-|Δ| budget (``--budget``, no ``--keep``),
   with the stitch of the same grafts and dense task arithmetic as the one-model baselines at equal bytes (no peers);
   data as bench/merge_gemma.py's ``prepare`` writes it (label words as labels, the task's causal template).
3. Through ``RoutedSkills`` as a user would: every task's test rows scored with the task named (oracle) and with
   ``skill="auto"`` (all tasks' rows shuffled into mixed batches, routed and grouped), the stored router's routing
   accuracy, each ÷ the task's own fine-tuned model (merge.json) = normalized accuracy; the baselines' test rows.

    SKILLGRAFT_CACHE=/work/store/gemma78 OMP_NUM_THREADS=1 PYTHONPATH=src python bench/route_gemma.py [--finetune-only]

Writes bench/results/route_gemma.json (bench/RESULTS.md § *Routed skills on Gemma-3-270M: the four causal tasks
routed, named, merged*). Resumes: fine-tunes from the store (each
resumable step by step), a finished merge from its folder; only the scoring reruns.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from merge_gemma import find_ft, prepare  # noqa: E402  (the Table 2 fine-tunes' rows and store keys)
from route_serve import texts_of, test_rows  # noqa: E402

# the one-model baselines of the same merge: the stitch of the same grafts (λ chosen on dev), dense task arithmetic
BASELINES = ["--mergekit", "task_arithmetic", "--scales", "0.5,1", "--stitch-scales", "1,2", "--rules", "average"]
RECIPES = {"SST-2": "gemma-table2-a", "mr": "gemma-table2-a", "mpqa": "gemma-table2-b", "ag_news": "gemma-table2-c"}


def finetune(store: Path, task: str, seed: int) -> float:
    """The Table 2 recipe's fine-tuning stage of ``task`` (only that stage), into ``store``; its seconds."""
    from skillgraft.models.gguf import in_store
    from skillgraft.pipeline.opening import finetuned_run
    from skillgraft.pipeline.store import Store
    from skillgraft.recipes import load_recipe
    from skillgraft.recipes.base import placement_of
    from skillgraft.models.placement import using

    _, spec = load_recipe(ROOT / "bench" / "fidelity" / f"{RECIPES[task]}.yaml")
    assert task in spec.tasks and seed in spec.seeds
    with in_store(store), using(placement_of(spec)) as runtime:
        _, seconds = finetuned_run(Store(store), spec.model_spec(), spec.data_spec(task, seed), spec.finetune,
                                   progress=True, runtime=runtime)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="SST-2,mr,mpqa,ag_news")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--dev", type=int, default=32, help="dev rows per label (the router's choice, the grids)")
    ap.add_argument("--test-limit", type=int, default=200)
    ap.add_argument("--budget", default="1e-3")
    ap.add_argument("--batch", type=int, default=16, help="rows per mixed auto batch")
    ap.add_argument("--finetune-only", action="store_true")
    ap.add_argument("--root", type=Path, default=Path("/work/store/gemma78-route"))
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "route_gemma.json")
    args = ap.parse_args()
    store = Path(os.environ.get("SKILLGRAFT_CACHE", "runs/cache"))
    tasks = args.tasks.split(",")
    t0 = time.perf_counter()
    seconds = {"finetune": {t: finetune(store, t, args.seed) for t in tasks}}
    for t in tasks:
        print(f"fine-tuned {t}: {find_ft(store, t, args.k, args.seed)} ({seconds['finetune'][t]:.0f} s)", flush=True)
    if args.finetune_only:
        return
    from skillgraft.data import load_kshot
    from skillgraft.data.tasks import get_task
    from skillgraft.graft.router import example_text

    root = args.root / f"k{args.k}-s{args.seed}"
    out = root / "out" / f"movement-{args.budget}-{'-'.join(tasks)}"
    t1 = time.perf_counter()
    if not (out / "merge.json").is_file():
        cli = ["merge", "--pretrained", "gemma-3-270m", "--out", out, "--overwrite", "--mode", "causal",
               "--localizer", "movement", "--budgets", args.budget, *BASELINES, "--routed", "--cache", store,
               "--dev-limit", args.dev * 4]
        for task in tasks:
            data = prepare(task, args.k, args.seed, args.dev, args.test_limit, root)
            cli += ["--finetuned", find_ft(store, task, args.k, args.seed), "--names", task, "--data",
                    data / "spec.yaml", "--dev-data", data / "dev.jsonl"]
        subprocess.run([sys.executable, "-m", "skillgraft", *map(str, cli)], check=True)
    seconds["merge"] = time.perf_counter() - t1
    summary = json.loads((out / "merge.json").read_text())
    row = lambda method: next(r for r in summary["rows"] if r["method"] == method and r.get("on_test"))  # noqa: E731
    ft_test = {t: row("fine-tuned")[f"{t}:test"] for t in tasks}

    # every task's test rows as a request holds them (the prompt up to the label, as the router was fitted on)
    from skillgraft import RoutedSkills

    t2 = time.perf_counter()
    skills = RoutedSkills.from_pretrained(out / "routed")
    rows = {}
    for t in tasks:
        task = get_task(t)
        rows[t] = [(example_text(e, task, "causal"), task.label_words[e.label])
                   for e in load_kshot(task, args.k, args.seed, test_limit=args.test_limit).test]
    oracle = {}
    for t in tasks:
        got = skills.score([p for p, _ in rows[t]], skill=t, batch_size=args.batch)
        oracle[t] = sum(g.label == w for g, (_, w) in zip(got, rows[t])) / len(rows[t])
    seconds["oracle"] = time.perf_counter() - t2
    mixed = [(t, p, w) for t in tasks for p, w in rows[t]]
    random.Random(0).shuffle(mixed)
    t3 = time.perf_counter()
    hits, routed = {t: 0 for t in tasks}, {t: {} for t in tasks}
    for start in range(0, len(mixed), args.batch):  # mixed batches of every task's rows, skill="auto"
        part = mixed[start:start + args.batch]
        for (t, _, w), g in zip(part, skills.score([p for _, p, _ in part], skill="auto", batch_size=args.batch)):
            hits[t] += g.label == w
            routed[t][g.skill] = routed[t].get(g.skill, 0) + 1
    seconds["auto"] = time.perf_counter() - t3
    auto = {t: hits[t] / len(rows[t]) for t in tasks}
    routing = {t: routed[t].get(t, 0) / len(rows[t]) for t in tasks}
    norm = {name: {t: acc[t] / ft_test[t] for t in tasks} for name, acc in (("oracle", oracle), ("auto", auto))}
    mean = {name: sum(v.values()) / len(tasks) for name, v in norm.items()}
    baselines = [{k: r.get(k) for k in ("method", "config", "chosen_on_dev", "dev_mean_normalized", "mean_normalized",
                                        "bytes_per_task")} | {t: r.get(f"{t}:normalized") for t in tasks}
                 for r in summary["rows"] if r.get("on_test") and r["method"] != "fine-tuned"]
    seconds["total"] = time.perf_counter() - t0
    record = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "store": str(store), "merge": str(out), "router": summary["routed"].get("router"),
              "routed_bytes_per_task": summary["routed"]["bytes_per_task"], "ft_test": ft_test,
              "graft_row_test": {t: row("graft")[f"{t}:test"] for t in tasks},  # the merge's own oracle scoring
              "routing_accuracy": routing, "routing_accuracy_mean": sum(routing.values()) / len(tasks),
              "confusion": routed, "oracle": oracle, "auto": auto, "normalized": norm, "mean_normalized": mean,
              "auto_share_of_oracle": mean["auto"] / mean["oracle"], "baselines": baselines, "seconds": seconds,
              "load_average": os.getloadavg()}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2))
    print("router:", {k: v for k, v in (record["router"] or {}).items() if k in ("kind", "accuracy")})
    for t in tasks:
        print(f"{t:>8}: FT {ft_test[t]:.3f}  graft row {record['graft_row_test'][t]:.3f}  oracle acc {oracle[t]:.3f}  routed {routing[t]:.3f}  oracle {norm['oracle'][t]:.3f}  "
              f"auto {norm['auto'][t]:.3f}  confusion {routed[t]}")
    print(f"    mean: routed {record['routing_accuracy_mean']:.3f}  oracle {mean['oracle']:.4f}  auto "
          f"{mean['auto']:.4f}  auto ÷ oracle {record['auto_share_of_oracle']:.4f}")
    for b in baselines:
        print(f"{b['method']:>26} {b['config']:<32} dev {b['dev_mean_normalized'] or float('nan'):.4f}  test "
              f"{b['mean_normalized'] or float('nan'):.4f}{'  (chosen on dev)' if b['chosen_on_dev'] else ''}")
    print(json.dumps(seconds))


if __name__ == "__main__":
    main()
