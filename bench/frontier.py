"""Issue 25 figures: share of FT vs density against closed-form peers, and the density each needs for 95% / 99% of FT.

Three fine-tuned MiniLM SST-2 models (64-shot, data seed 42), all found in (or added to) the store
(``SKILLGRAFT_CACHE``):

* ``demo`` — the model ``make demo`` fine-tunes (head mode, SGD lr 0.1, 400 steps; recipes/graft.py DEMO), the very
  store entry the demo uses;
* ``adamw`` / ``adamw-l1`` — the plain-transformers AdamW classifier of bench/open_world.py (its
  ``finetune_minilm``: AutoModelForSequenceClassification, AdamW lr 1e-4, 80 steps of 16, optionally
  λ‖θ − θ_pre‖₁), trained here on the same k-shot draw as the demo (open_world.py draws its own 64 per
  label), grafted as a checkpoint pair (``classifier`` mode, its own head carried).

For each: ``pipeline.frontier.frontier_report`` — the learned localizer (one trajectory: best-step regions and its
order at the last step) against top-|Δ| per tensor (TIES trim), top-|Δ| global (L&S dataless), DARE and random at
densities 1e-5 … 1e-1, scored on a seeded subset of the SST-2 test set; keep densities for 95% / 99% searched on
the dev split (the next 64 per label).

    SKILLGRAFT_CACHE=/work/store python bench/frontier.py [--test-limit 300] [--steps 24] [--eval-every 12]
        [--models demo,adamw,adamw-l1] [--sparsities 1e-4,1e-2] [--out bench/results/frontier]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def demo_setup(store, test_limit: int):
    from skillgraft.pipeline.opening import finetuned_run, from_run
    from skillgraft.recipes.graft import DEMO

    ft_dir, seconds = finetuned_run(store, DEMO.model_spec(), DEMO.data_spec(DEMO.task, DEMO.seed), DEMO.finetune,
                                    progress=True)
    setup = from_run(ft_dir, test_limit=test_limit)
    return setup, {"fine_tuning": "skillgraft SGD lr 0.1, 400 steps, batch 8, head mode (make demo)",
                   "stage_seconds": seconds}


def adamw_setup(store, test_limit: int, l1: float, lr: float = 1e-4, steps: int = 80):
    from open_world import finetune_minilm

    from skillgraft.data import load_kshot
    from skillgraft.data.spec import DataSpec
    from skillgraft.models.loading import bundled_minilm_path
    from skillgraft.pipeline.opening import from_pair
    from skillgraft.pipeline.store import data_digest

    data = DataSpec(task="SST-2", k=64, seed=42)
    key = {"bench": "open_world.finetune_minilm", "lr": lr, "steps": steps, "l1": l1, "data": data.to_dict(),
           "data_digest": data_digest("SST-2")}
    t0 = time.perf_counter()

    def make(folder: Path) -> None:
        rows = [{"text": e.text_a, "label": e.label} for e in load_kshot("SST-2", 64, 42).train]
        finetune_minilm(bundled_minilm_path(), rows, folder / "model", lr=lr, steps=steps, l1=l1)

    entry = store.fetch("ft-hf", key, make, label=f"SST-2-64-42-adamw-l1-{l1:g}")
    seconds = time.perf_counter() - t0
    setup = from_pair("all-MiniLM-L6-v2", str(entry / "model"), data.replace(test_limit=test_limit), mode="classifier")
    return setup, {"fine_tuning": f"plain transformers AdamW lr {lr:g}, {steps} steps of 16, L1 λ={l1:g}",
                   "stage_seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="demo,adamw,adamw-l1")
    ap.add_argument("--test-limit", type=int, default=300)
    ap.add_argument("--steps", type=int, default=24, help="learned localizer steps (the demo's: 50)")
    ap.add_argument("--eval-every", type=int, default=12)
    ap.add_argument("--l1", type=float, default=1e-5, help="λ of the adamw-l1 model (bench/RESULTS.md issue 11: 1e-5)")
    ap.add_argument("--sparsities", default="1e-4,1e-2", help="γ_base sizes of the learned trajectories (one each; "
                    "each density uses the largest ≤ it)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "frontier")
    args = ap.parse_args()

    from skillgraft.keep.spec import KeepSpec
    from skillgraft.graft.localizers import LocalizeConfig
    from skillgraft.pipeline import RunDir, Store
    from skillgraft.pipeline.frontier import FrontierSpec, frontier_markdown, frontier_report

    store = Store()
    spec = FrontierSpec(frontier=True, frontier_sparsities=[float(x) for x in args.sparsities.split(",")])
    keep = KeepSpec(keep_from=1e-5)
    localize = LocalizeConfig(sparsity=1e-4, steps=args.steps, eval_every=args.eval_every)
    summary = {"command": " ".join(sys.argv), "test_limit": args.test_limit, "localize": localize.to_dict(),
               "frontier": spec.to_dict(),
               "keep": keep.to_dict(), "models": {}}
    for name in args.models.split(","):
        t0 = time.perf_counter()
        if name == "demo":
            setup, info = demo_setup(store, args.test_limit)
        elif name in ("adamw", "adamw-l1"):
            setup, info = adamw_setup(store, args.test_limit, args.l1 if name == "adamw-l1" else 0.0)
        else:
            raise SystemExit(f"unknown model {name!r}: demo, adamw, adamw-l1")
        t1 = time.perf_counter()
        run = RunDir(args.out / name, store)
        result = frontier_report(setup, run, spec, "learned", localize, keep, progress=True)
        (args.out / name / "frontier.md").write_text("\n".join(frontier_markdown(result)) + "\n")
        summary["models"][name] = {**info, "setup_seconds": t1 - t0, "frontier_seconds": time.perf_counter() - t1,
                                   **{k: v for k, v in result.items() if k != "rows"}}
        print(f"## {name}: FT {result['ft_score']:.4f} ({time.perf_counter() - t0:.0f} s)")
        print("\n".join(frontier_markdown(result)), flush=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))


if __name__ == "__main__":
    main()
