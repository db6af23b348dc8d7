"""Issue 33: the fine-tuning learning rate for Gemma-3-270M in causal prompt mode, chosen on dev rows.

Usage: SKILLGRAFT_CACHE=/work/store .venv/bin/python bench/gemma_lr.py [--lrs 1e-3,5e-3,1e-2] [--task SST-2]
       [--seed 13] [--steps 64] [--k 16] [--test-limit 200]      (needs `make gemma`)

The paper's grid (Appendix A: SGD, batch 8, lr ∈ {1e-2, 5e-3, 1e-3}, weight decay 1e-4, embeddings and the LM head
frozen; Gemma's head is tied to its embeddings) on one k-shot draw; each fine-tuning is a stage of the store,
keyed exactly as the Table 2 recipe (bench/fidelity/gemma-table2-*.yaml) keys its own, so the chosen run is reused
there. Selection: the best dev accuracy (the draw's next K per label) over the run's evaluations; the test
accuracy is printed beside it, never used. Writes bench/results/gemma_lr.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lrs", default="1e-3,5e-3,1e-2")
    ap.add_argument("--task", default="SST-2")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=16)
    ap.add_argument("--test-limit", type=int, default=200)
    ap.add_argument("--out", default=str(HERE / "results" / "gemma_lr.json"))
    args = ap.parse_args()

    from skillgraft.data.spec import DataSpec
    from skillgraft.models.spec import ModelSpec
    from skillgraft.pipeline import Store
    from skillgraft.pipeline.opening import finetuned_run
    from skillgraft.train.config import FinetuneConfig

    store = Store()
    model = ModelSpec(model="gemma-3-270m", mode="causal")
    data = DataSpec(task=args.task, k=args.k, seed=args.seed, data_dir=DATA, test_limit=args.test_limit)
    rows = []
    for lr in (float(x) for x in args.lrs.split(",")):
        config = FinetuneConfig(lr=lr, steps=args.steps, eval_every=args.eval_every)
        run, seconds = finetuned_run(store, model, data, config, progress=True)
        m = json.loads((run / "metrics.json").read_text())
        rows.append({"lr": lr, "best_dev": m["best_dev"], "best_step": m["best_step"],
                     "test_accuracy": m["test"]["accuracy"], "test_ece": m["test"]["ece"],
                     "train_seconds": m["train_seconds"], "run": str(run)})
        print(f"lr {lr:g}: dev {m['best_dev']:.4f} (step {m['best_step']}), test {m['test']['accuracy']:.4f}, "
              f"ECE {m['test']['ece']:.4f}, {m['train_seconds']:.0f} s", flush=True)
    best = max(rows, key=lambda r: (r["best_dev"], -r["lr"]))
    print(f"chosen on dev: lr {best['lr']:g}")
    Path(args.out).write_text(json.dumps({"command": " ".join(["bench/gemma_lr.py", *sys.argv[1:]]),
                                          "settings": vars(args), "rows": rows, "chosen_lr": best["lr"]},
                                         indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
