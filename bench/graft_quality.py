"""Grafting quality on MiniLM, SST-2 64-shot, data seeds 13/21/42 (issue 3's acceptance figures).

Usage: .venv/bin/python bench/graft_quality.py [--seeds 13,21,42] [--budgets 5e-5,1e-4,3e-4,1e-3]

Fine-tunes with the demo settings (in the store, runs/cache, shared with `make demo`), learns one localization trajectory per seed
with exact budgets (top-k of γ), scores grafts and matched top-movement / random regions on the full
test set, and prints a Markdown table; raw rows go to bench/results/graft_quality.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from skillgraft.recipes.base import RECIPES, run_spec
from skillgraft.recipes.graft import DEMO

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="13,21,42")
    ap.add_argument("--budgets", default="1e-4,3e-4,1e-3")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--aggregate", action="store_true", help="only aggregate the per-seed results already written")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    budgets = [float(b) for b in args.budgets.split(",")]
    config = DEMO.localize.replace(budgets=budgets, eval_every=args.eval_every)
    per_seed = {}
    (HERE / "results").mkdir(exist_ok=True)
    for seed in seeds:
        done = HERE / "results" / f"graft_quality-{seed}.json"
        if args.aggregate:
            per_seed[seed] = json.loads(done.read_text())
            continue
        t0 = time.perf_counter()
        # the demo's stages: seed 42 with the demo's budgets is exactly `make demo`, found in the store
        out = run_spec(RECIPES["graft"], DEMO.replace(seed=seed, localize=config, progress=False),
                       Path(f"runs/bench-graft-quality-{seed}"), overwrite=True)
        m = json.loads((out / "metrics.json").read_text())
        per_seed[seed] = {"rows": m["rows"], "seconds": time.perf_counter() - t0,
                          "step_seconds": m["localization"]["step_seconds"]}
        done.write_text(json.dumps(per_seed[seed], indent=2))
        print(f"seed {seed} done in {per_seed[seed]['seconds']:.0f}s", flush=True)
    (HERE / "results" / "graft_quality.json").write_text(json.dumps(per_seed, indent=2))

    def stat(model: str, key: str = "score") -> tuple[float, float]:
        vals = [next(r[key] for r in d["rows"] if r["model"] == model) for d in per_seed.values()]
        return float(np.mean(vals)), float(np.std(vals))

    names = ["pre-trained", "head only", "fine-tuned"]
    for b in budgets:
        label = f"graft {b:g}"
        names += [label, f"top-movement @ {label}", f"random @ {label}", f"lottery-ticket-zero @ {label}"]
    print("| model | params | accuracy mean (std) | ECE mean (std) | share of FT |")
    print("|---|---:|---:|---:|---:|")
    ft_mean = stat("fine-tuned")[0]
    for name in names:
        acc, ece = stat(name), stat(name, "ece")
        params = next(r["params"] for r in next(iter(per_seed.values()))["rows"] if r["model"] == name)
        print(f"| {name} | {params:,} | {acc[0]:.4f} ({acc[1]:.4f}) | {ece[0]:.4f} ({ece[1]:.4f}) | "
              f"{acc[0] / ft_mean:.3f} |")
    keep = [b for b in budgets if stat(f"graft {b:g}")[0] >= 0.95 * ft_mean]
    print(f"\nsmallest budget keeping ≥95% of FT accuracy (mean over seeds): {min(keep) if keep else 'none'}")


if __name__ == "__main__":
    main()
