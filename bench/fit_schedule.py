"""Issue 74: does the learned localizer fit what it is asked to fit? Schedules and optimizers on one fine-tuned run.

For each localizer setting (a JSON object of LocalizeConfig fields, or ``NAME:{...}`` for another learned localizer's
options), learns the regions of the run's k-shot rows and prints per budget: FT's and the region's score on the
selection rows (the fit share), the step the region came from, where the trajectory stopped and why, and the graft's
test score ÷ FT's (the share of FT) with carry = test share ÷ fit share, and each graft's score on the k-shot training
rows and on the dev rows apart beside FT's (FT fits the rows it was trained on, often all of them: the selection rows'
gap can be memorization). Two objectives beside the scorer's cross-entropy on the gold labels, as levers to try:
``--objective distill`` (the cross-entropy against FT's own predicted distribution on each row) and ``--pseudo N``
(N more rows of the task's training pool, none of the k-shot, dev or test rows, labelled by FT's own prediction).

    OMP_NUM_THREADS=1 python bench/fit_schedule.py --run runs/cache/ft-SST-2-64-42-head-*/run \\
        --budgets 1e-4,1e-3 --setting '{"steps": 100}' --setting '{"schedule": "fit", "steps": 1000}' \\
        --out bench/results/fit_schedule_minilm.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a skillgraft fine-tuning run folder")
    ap.add_argument("--budgets", default="1e-4,1e-3")
    ap.add_argument("--setting", action="append", default=[], help="LocalizeConfig fields as JSON (repeatable); "
                    "NAME:{...} for another learned localizer's options (e.g. learned-adam:{\"steps\": 200})")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--progress", action="store_true", help="the localizers' progress bars (on stderr)")
    ap.add_argument("--objective", choices=["gold", "distill"], default="gold",
                    help="distill: each step's loss is the cross-entropy against FT's predicted distribution")
    ap.add_argument("--pseudo", type=int, default=0, help="this many unused training-pool rows, labelled by FT, "
                    "added to the rows the localizer steps and selects on")
    args = ap.parse_args()

    from skillgraft.graft import Graft, get_localizer
    from skillgraft.graft.localizers.machinery.batches import accuracy
    from skillgraft.pipeline.opening import from_run

    member = from_run(args.run, test_limit=args.test_limit)
    pre, ft, data = member.pre, member.ft, member.data
    ft_test = accuracy(ft, member.test)
    print(f"{member.task} k={member.k} seed={member.seed}: train {len(data.train)}, dev {len(data.dev or [])}, "
          f"test {len(member.test)}; FT test {ft_test:.4f}; pre test {accuracy(pre, member.test):.4f}", flush=True)
    splits = {"train": data.train, "dev": data.dev or []}
    ft_splits = {k: accuracy(ft, rows) for k, rows in splits.items() if rows}
    if args.objective == "distill":
        distill(ft)
    if args.pseudo:
        data = with_pseudo_rows(member, ft, args.pseudo)
    results = []
    for setting in args.setting or ["{}"]:
        name = "learned"
        if not setting.lstrip().startswith("{"):  # NAME:{...}: another learned localizer's options
            name, setting = setting.split(":", 1)
        options = {"budgets": args.budgets, **json.loads(setting)}
        t0 = time.perf_counter()
        loc = get_localizer(name).run(pre, ft, data, options, progress=args.progress)
        seconds = time.perf_counter() - t0
        row = {"localizer": name, "setting": json.loads(setting), "seconds": seconds,
               "stopped": loc.stopped, "reference": loc.reference, "budgets": {}}
        for budget, region in loc.regions.items():
            graft = Graft.from_models(pre, ft, region, {})
            with graft.applied(pre):
                test = accuracy(pre, member.test)
                apart = {k: accuracy(pre, rows) for k, rows in splits.items() if rows}
            fit = loc.fit.get(budget.key, {})
            share = test / ft_test
            row["budgets"][budget.key] = {**fit, "best_step": loc.best_step.get(budget), "size": len(region),
                                          "test": test, "test_share": share, "apart": apart, "ft_apart": ft_splits,
                                          "carry": share / fit["share"] if fit.get("share") else None}
            print(f"  {name} {setting}: {budget.key}: fit {fit.get('share') or 0:.3f} (FT {fit.get('ft') or 0:.3f}, "
                  f"region {fit.get('region') or 0:.3f}) best step {loc.best_step.get(budget)} rising "
                  f"{fit.get('rising')}; test {test:.4f} = {share:.3f} of FT; {seconds:.0f} s; "
                  f"stopped {loc.stopped[-1] if loc.stopped else '-'}", flush=True)
            print("      " + "; ".join(f"{k}: region {apart[k]:.3f} vs FT {ft_splits[k]:.3f} = {apart[k] / ft_splits[k]:.3f}"
                                       for k in apart if ft_splits.get(k)), flush=True)
        row["history"] = [h.columns() for h in loc.history]
        for b in loc.regions:  # the fit share along the trajectory, every scored step
            pts = [(h.step, h.scores[b.label].fit) for h in loc.history if b.label in h.scores]
            print(f"    {b.key}: " + " ".join(f"{s}:{f:.3f}" for s, f in pts if f is not None), flush=True)
        results.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"run": args.run, "task": member.task, "k": member.k,
                                              "objective": args.objective, "pseudo": args.pseudo,
                                              "seed": member.seed, "ft_test": ft_test, "results": results},
                                             indent=1))
    return 0


def distill(ft) -> None:
    """Every localization step's loss becomes the cross-entropy against FT's predicted distribution on the step's
    rows (FT run alongside, no gradient): the region is fitted to FT's outputs, not to the gold labels."""
    import torch
    import torch.nn.functional as F

    from skillgraft.graft.localizers.machinery import engine

    def loss(scorer, batch, reduction="mean"):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            target = F.softmax(ft(**inputs).float(), -1)
        return F.cross_entropy(scorer(**inputs).float(), target, reduction=reduction)

    engine.batch_loss = loss


def with_pseudo_rows(member, ft, n: int):
    """The run's data with ``n`` more training rows: a seeded draw of the task's training pool less the k-shot,
    dev and test rows, each labelled by FT's own prediction (no gold label is read)."""
    import dataclasses
    import random

    from skillgraft.data.loading import load_split
    from skillgraft.evaluate.predict import predict_probs

    data = member.data
    seen = {e.text_a for e in [*data.train, *(data.dev or []), *member.test]}
    pool = [e for e in load_split(member.task, "train") if e.text_a not in seen]
    random.Random(0).shuffle(pool)
    rows = pool[:n]
    probs = predict_probs(ft, rows)
    rows = [dataclasses.replace(e, label=int(p.argmax())) for e, p in zip(rows, probs)]
    print(f"+ {len(rows)} pool rows labelled by FT (FT's agreement with their gold labels "
          f"{sum(int(p.argmax()) == e.label for e, p in zip(pool[:n], probs)) / max(1, len(rows)):.3f})", flush=True)
    return dataclasses.replace(data, train=[*data.train, *rows])


if __name__ == "__main__":
    raise SystemExit(main())
