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

Writes bench/results/route_gemma.json (bench/RESULTS.md § *Routed skills on Gemma-3-270M*). Resumes from the store.
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


if __name__ == "__main__":
    main()
