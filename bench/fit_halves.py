"""Issue 74: a learned localization's best regions so far — read from its resume state, while it runs or after it was
stopped — scored on the k-shot training rows and on the dev rows apart, beside FT's (the halves of the selection rows
its fit share is measured on; a finished localization's report gives them itself).

    SKILLGRAFT_CACHE=runs/store46 OMP_NUM_THREADS=1 python bench/fit_halves.py \\
        runs/store46/.regions-QNLI-64-13-learned-*.resume/localize-0.pt runs/store46/ft-QNLI-64-13-causal-*/run \\
        --out bench/results/fit_halves_qnli13.json

Copy a running job's state first (it is replaced at each save). Gemma-3-270M: ≈ 4 min for FT and three regions on
one thread (128 + 128 rows each). ``--save-regions DIR`` writes the state's best regions instead (for
bench/cell_rows.py: a stopped run's test rows so far). ``--against ENTRY``: a stored localization of the same run (a store's
``regions-…`` folder, e.g. the same settings in another precision): each budget's IoU with its region there.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("state", help="a learned localization's resume state (localize-0.pt)")
    ap.add_argument("run", help="the fine-tuning run folder the localization grafts")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--against", default=None, metavar="ENTRY", help="a stored regions entry of the same run: each "
                    "budget's IoU with its region there")
    ap.add_argument("--out", default=None)
    ap.add_argument("--save-regions", default=None, metavar="DIR", help="write the state's best regions under "
                    "DIR/<budget key> (fit_schedule --save-regions' layout, what bench/cell_rows.py reads) and stop")
    args = ap.parse_args()

    import torch

    from skillgraft.graft import Graft
    from skillgraft.graft.localizers.machinery.batches import accuracy
    from skillgraft.graft.region import Region, _region_of_state
    from skillgraft.graft.selection import Budget
    from skillgraft.pipeline.opening import from_run

    state = torch.load(args.state, mmap=True, weights_only=False)
    best = [(Budget.model_validate(b["__budget__"]), score, step, _region_of_state(r["__region__"]))
            for b, (score, step, r) in state["best"]["__items__"]]
    out = {"state_step": state["step"], "run": args.run, "budgets": {}}
    del state
    if args.save_regions:  # a stopped localization's best regions so far, for the test rows of bench/cell_rows.py
        for budget, score, step, region in best:
            region.save(Path(args.save_regions) / budget.key)
            print(f"{budget}: best {score:.3f} at step {step} → {Path(args.save_regions) / budget.key}", flush=True)
        return 0
    t0 = time.perf_counter()
    member = from_run(args.run)
    halves = {"train": list(member.inputs.data.train), "dev": list(member.inputs.data.dev or [])}
    out["ft"] = ft = {k: accuracy(member.ft, rows, args.micro_batch) for k, rows in halves.items() if rows}
    print(f"state at step {out['state_step']}; FT " + ", ".join(f"{k} {v:.3f} ({len(halves[k])} rows)"
                                                            for k, v in ft.items()), flush=True)
    for budget, score, step, region in best:
        with Graft.from_models(member.pre, member.ft, region, {}).applied(member.pre):
            mine = {k: accuracy(member.pre, rows, args.micro_batch) for k in ft for rows in [halves[k]]}
        row = out["budgets"][str(budget)] = {"best_score": score, "best_step": step, "size": len(region), **mine}
        if args.against:  # the stored region of the same budget (its folder is named by the budget's key)
            row["iou_against"] = region.iou(Region.load(Path(args.against) / budget.key))
        print(f"{budget}: best {score:.3f} at step {step}; " + ", ".join(
            f"{k} {mine[k]:.3f} = {mine[k] / ft[k]:.3f} of FT" for k in mine if ft[k]) +
            (f"; IoU {row['iou_against']:.3f} with {Path(args.against).name}" if args.against else "") +
            f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
