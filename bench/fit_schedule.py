"""Issue 74: does the learned localizer fit what it is asked to fit? Schedules and optimizers on one fine-tuned run.

For each localizer setting (a JSON object of LocalizeConfig fields, or ``NAME:{...}`` for another learned localizer's
options), learns the regions of the run's k-shot rows and prints per budget: FT's and the region's score on the
selection rows (the fit share), the step the region came from, where the trajectory stopped and why, and the graft's
test score ÷ FT's (the share of FT) with carry = test share ÷ fit share, and each graft's score on the k-shot training
rows and on the dev rows apart beside FT's (FT fits the rows it was trained on, often all of them: the selection rows'
gap can be memorization). Objectives beside the scorer's cross-entropy on the gold labels, as levers to try:
``--objective distill`` (the cross-entropy against FT's own predicted distribution on each row), ``--objective focal``
(each row's cross-entropy times (1 − p_gold)^γ, ``--gamma``), ``--objective hard`` (weight ``--hard-weight`` on the
rows the smallest budget's region, as last scored, gets wrong and FT gets right; refreshed at every scoring), and
``--pseudo N`` (N more rows of the task's training pool, none of the k-shot, dev or test rows, labelled by FT's own
prediction), ``--relabel`` (every training and dev row labelled by FT's prediction instead of its gold label: the
region is then stepped and selected toward FT's behaviour, no gold label read, and its fit share is its agreement
with FT on the selection rows). focal's and hard's row weights are scaled to mean 1 over each micro-batch (focal) or over the step's
rows (hard), so the step on S keeps its size and only its direction changes. ``--restarts N``: each setting run from N
seeds (its ``seed``, +1, …), each budget's region the restart that scores best on the selection rows.

    OMP_NUM_THREADS=1 python bench/fit_schedule.py --run runs/cache/ft-SST-2-64-42-head-*/run \\
        --budgets 1e-4,1e-3 --setting '{"steps": 100}' --setting '{"schedule": "fit", "steps": 1000}' \\
        --out bench/results/fit_schedule_minilm.json

``--precision bf16-mixed`` runs it all under autocast (issue 74 item 6: the localizer in bf16 beside its fp32 run on
one stored fine-tune); ``--resume DIR`` lets a long localization stop and go on where it saved.
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
    ap.add_argument("--objective", choices=["gold", "distill", "focal", "hard"], default="gold",
                    help="distill: each step's loss is the cross-entropy against FT's predicted distribution; focal: "
                    "each row's CE times (1 − p_gold)^gamma; hard: weight --hard-weight on the rows the region gets "
                    "wrong and FT right")
    ap.add_argument("--gamma", type=float, default=2.0, help="focal: the exponent γ of (1 − p_gold)^γ")
    ap.add_argument("--hard-weight", type=float, default=5.0, help="hard: the weight of a row the region gets wrong "
                    "and FT right (others 1; then scaled to mean 1)")
    ap.add_argument("--restarts", type=int, default=1, help="run each setting from this many seeds; keep per budget "
                    "the restart that scores best on the selection rows")
    ap.add_argument("--pseudo", type=int, default=0, help="this many unused training-pool rows, labelled by FT, "
                    "added to the rows the localizer steps and selects on")
    ap.add_argument("--relabel", action="store_true", help="label every training and dev row by FT's prediction "
                    "(the fit share becomes agreement with FT; no gold label is read by the localizer)")
    ap.add_argument("--precision", default=None, help="run everything (FT's scores, the localizations, the test "
                    "rows) in this precision, e.g. bf16-mixed (default: the placement's default, fp32)")
    ap.add_argument("--save-regions", default=None, metavar="DIR", help="write each setting's final regions under "
                    "DIR/<setting index>/<budget> (Region.save: what bench/fit_halves.py --against and a store entry read)")
    ap.add_argument("--resume", default=None, metavar="DIR", help="each localization saves its state under DIR every "
                    "few minutes and the same command, run again, resumes it (one sub-folder per setting and restart, "
                    "named by its options and precision; a finished one's folder is deleted)")
    args = ap.parse_args()
    from skillgraft.models.placement import Placement, using

    with using(Placement.build({"precision": args.precision}) if args.precision else None) as runtime:
        return run(args, runtime)


def run(args, runtime) -> int:
    import contextlib
    import hashlib

    from skillgraft.graft import Graft, get_localizer
    from skillgraft.graft.localizers.machinery.batches import accuracy
    from skillgraft.pipeline.opening import from_run
    from skillgraft.resume import discard, resume_point

    member = from_run(args.run, test_limit=args.test_limit, runtime=runtime)  # both models placed as they load
    pre, ft, data = member.pre, member.ft, member.data
    splits = {"train": data.train, "dev": data.dev or []}
    # FT's and θ_pre's scores, kept beside the resume states: a resumed run does not score the test rows again
    memo = Path(args.resume) / ("scores-" + hashlib.sha256(json.dumps(
        [args.run, args.test_limit, args.precision]).encode()).hexdigest()[:16] + ".json") if args.resume else None
    if memo is not None and memo.is_file():
        scores = json.loads(memo.read_text())
    else:
        scores = {"ft_test": accuracy(ft, member.test), "pre_test": accuracy(pre, member.test),
                  "ft_splits": {k: accuracy(ft, rows) for k, rows in splits.items() if rows}}
        if memo is not None:
            from skillgraft.io import write_json

            memo.parent.mkdir(parents=True, exist_ok=True)
            write_json(memo, scores)  # atomically: a run stopped while writing leaves none, not half of one
    ft_test, ft_splits = scores["ft_test"], scores["ft_splits"]
    where = f" ({runtime.describe()})" if runtime else ""
    print(f"{member.task} k={member.k} seed={member.seed}{where}: train {len(data.train)}, dev {len(data.dev or [])}, "
          f"test {len(member.test)}; FT test {ft_test:.4f}; pre test {scores['pre_test']:.4f}", flush=True)
    if args.objective == "distill":
        distill(ft)
    if args.pseudo:
        data = with_pseudo_rows(member, ft, args.pseudo)
    if args.relabel:
        data = relabelled(data, ft)
    hard = None
    if args.objective == "focal":
        focal(args.gamma)
    elif args.objective == "hard":
        hard = HardRows(pre, ft, [*data.train, *(data.dev or [])], args.hard_weight)
    results = []
    for setting in args.setting or ["{}"]:
        name = "learned"
        if not setting.lstrip().startswith("{"):  # NAME:{...}: another learned localizer's options
            name, setting = setting.split(":", 1)
        options = {"budgets": args.budgets, **json.loads(setting)}
        t0 = time.perf_counter()
        runs = []
        for r in range(args.restarts):
            seeded = {**options, "seed": options.get("seed", 0) + r} if args.restarts > 1 else options
            if hard is not None:
                hard.reset(len(str(options["budgets"]).split(",")) if not options.get("per_size") else 1)
            folder = None
            if args.resume:  # a state saved by other options or another precision sits in another sub-folder
                tag = json.dumps([args.run, name, seeded, args.precision, args.objective, args.pseudo]
                                 + (["relabel"] if args.relabel else []), sort_keys=True)
                folder = Path(args.resume) / hashlib.sha256(tag.encode()).hexdigest()[:16]
                folder.mkdir(parents=True, exist_ok=True)
            with resume_point(folder) if folder else contextlib.nullcontext():
                runs.append(get_localizer(name).run(pre, ft, data, seeded, progress=args.progress))
            if folder:
                discard(folder)
            if hard is not None:
                print(f"    hard rows (region wrong, FT right) at each scoring: {hard.counts}", flush=True)
            if args.restarts > 1:
                print(f"    restart {r} (seed {seeded['seed']}): " + "; ".join(
                    f"{b.key}: fit {(runs[-1].fit.get(b.key) or {}).get('share') or 0:.3f} (step "
                    f"{runs[-1].best_step.get(b)})" for b in runs[-1].regions)
                    + f"; {time.perf_counter() - t0:.0f} s", flush=True)
        loc = best_of(runs)
        seconds = time.perf_counter() - t0
        row = {"localizer": name, "setting": json.loads(setting), "seconds": seconds, "restarts": args.restarts,
               "restart_fits": [{b.key: (r.fit.get(b.key) or {}).get("share") for b in r.regions} for r in runs],
               "stopped": loc.stopped, "reference": loc.reference, "budgets": {}}
        for budget, region in loc.regions.items():
            if args.save_regions:
                folder = Path(args.save_regions) / str(len(results))
                folder.mkdir(parents=True, exist_ok=True)
                region.save(folder / budget.key)
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
                                              "relabel": args.relabel,
                                              "gamma": args.gamma, "hard_weight": args.hard_weight,
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


def best_of(runs: list):
    """One localization whose region per budget is the best restart's on the selection rows (its fit, best step
    and history with it: the history kept is the first budget's best restart's)."""
    if len(runs) == 1:
        return runs[0]
    tops = {b: max(runs, key=lambda r: r.best_score[b]) for b in runs[0].regions}  # read before any is changed
    out = runs[0]
    for b, top in tops.items():
        out.regions[b], out.best_step[b], out.best_score[b] = top.regions[b], top.best_step[b], top.best_score[b]
        out.fit[b.key] = top.fit[b.key]
    out.history = next(iter(tops.values())).history
    return out


def focal(gamma: float) -> None:
    """Every step's loss becomes the focal loss: each row's cross-entropy on its gold label times (1 − p_gold)^γ
    (Lin et al. 2017), the factor's mean over the micro-batch (held fixed) divided out so the step keeps its size:
    the rows the graft already gets right with confidence weigh little, the ones it gets wrong much."""
    import torch.nn.functional as F

    from skillgraft.graft.localizers.machinery import engine

    def loss(scorer, batch, reduction="mean"):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logp = F.log_softmax(scorer(**inputs).float(), -1).gather(1, batch["labels"].unsqueeze(1)).squeeze(1)
        w = (1 - logp.exp()).clamp(min=0).pow(gamma)
        rows = -w * logp / w.detach().mean().clamp(min=1e-12)
        return rows.sum() if reduction == "sum" else rows.mean()

    engine.batch_loss = loss


class HardRows:
    """The ``hard`` objective: each step's cross-entropy weighted per row, ``weight`` on the rows (of the step's and
    selection rows) that the smallest budget's region gets wrong at its last scoring while FT gets them right, 1
    elsewhere, scaled to mean 1 over the rows. The engine's scoring of a region (``accuracy_on``) is wrapped to read
    each row's hit; its step batches (``RunRows.batch``) to know which rows a micro-batch holds."""

    def __init__(self, pre, ft, rows: list, weight: float):
        import torch

        from skillgraft.graft.localizers.machinery import engine

        self.pre, self.rows, self.weight = pre, rows, weight
        self.ft_right = self._hits(ft, rows)
        self.per_scoring, self.calls, self.current, self.counts = 1, 0, None, []
        self.w = {ex: 1.0 for ex in rows}
        original_accuracy, outer = engine.accuracy_on, self

        def accuracy_on(scorer, examples, micro_batch, accelerator, lockstep=False):
            if scorer is not outer.pre or lockstep:
                return original_accuracy(scorer, examples, micro_batch, accelerator, lockstep)
            hits = outer._hits(scorer, examples, micro_batch)
            if outer.calls % outer.per_scoring == 0:  # the first budget scored at each scoring: the smallest
                outer.refresh(hits)
            outer.calls += 1
            return sum(hits.values()) / max(1, len(hits))

        class Rows(engine.RunRows):
            def batch(self, scorer, chunk, device):
                outer.current = [self.examples[int(i)] for i in chunk]
                return super().batch(scorer, chunk, device)

        def loss(scorer, batch, reduction="mean"):
            import torch.nn.functional as F

            inputs = {k: v for k, v in batch.items() if k != "labels"}
            ce = F.cross_entropy(scorer(**inputs).float(), batch["labels"], reduction="none")
            w = torch.tensor([outer.w.get(ex, 1.0) for ex in outer.current], dtype=ce.dtype, device=ce.device)
            rows = w * ce
            return rows.sum() if reduction == "sum" else rows.mean()

        engine.accuracy_on, engine.RunRows, engine.batch_loss = accuracy_on, Rows, loss

    def reset(self, per_scoring: int) -> None:
        """A new localization: ``per_scoring`` regions are scored at each scoring (the first one sets the weights)."""
        self.per_scoring, self.calls, self.counts = per_scoring, 0, []
        self.w = {ex: 1.0 for ex in self.rows}

    def refresh(self, hits: dict) -> None:
        raw = {ex: (self.weight if self.ft_right.get(ex) and not hits.get(ex, True) else 1.0) for ex in self.rows}
        mean = sum(raw.values()) / len(raw)
        self.w = {ex: v / mean for ex, v in raw.items()}
        self.counts.append(sum(v != 1.0 for v in raw.values()))

    @staticmethod
    def _hits(scorer, examples: list, micro_batch: int = 64) -> dict:
        """Each example's hit (argmax == gold) under ``scorer`` as it is now, in eval mode."""
        import torch

        out, was = {}, scorer.training
        scorer.eval()
        with torch.no_grad():
            for i in range(0, len(examples), micro_batch):
                part = examples[i:i + micro_batch]
                batch = scorer.collate(part)
                device = next(scorer.parameters()).device
                inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
                pred = scorer(**inputs).argmax(-1).cpu()
                for ex, p, y in zip(part, pred, batch["labels"]):
                    out[ex] = bool(p == y)
        scorer.train(was)
        return out


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


def relabelled(data, ft):
    """The run's data with every training and dev row's label replaced by FT's own prediction (argmax): what the
    localizer steps toward and selects on is then FT's behaviour on those rows, not the gold labels — the learned
    localizer's ``fit_to: ft`` (its :func:`answered_by`), here also over the ``--pseudo`` rows and for every setting."""
    import dataclasses

    from skillgraft.graft.localizers.machinery.fit import answered_by

    by_ft = answered_by(ft)
    train, dev = by_ft(data.train), by_ft(data.dev or [])
    moved = sum(a.label != b.label for a, b in zip([*data.train, *(data.dev or [])], [*train, *dev]))
    print(f"relabelled by FT: {len(train)} training and {len(dev)} dev rows, {moved} labels changed", flush=True)
    return dataclasses.replace(data, train=train, dev=dev or data.dev)


if __name__ == "__main__":
    raise SystemExit(main())
