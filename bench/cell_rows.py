"""Issue 74: a paper-schedule cell's test rows from a stored fine-tune and the learned regions that
``bench/fit_schedule.py --save-regions`` wrote, beside top-|Δ| and random regions of the same budgets — the rows the
recipe's grafts pass gives (bench/gemma_paper_schedule.py), for a cell whose learned localization ran through
fit_schedule (e.g. in bf16-mixed on an fp32 fine-tune). Scores are the task's metric (F1 for MRPC, else accuracy) on
the run's own test rows, with ECE, the share of FT and the gap closed from the pre-trained model.

    SKILLGRAFT_CACHE=runs/store OMP_NUM_THREADS=1 python bench/cell_rows.py \\
        runs/store/ft-MRPC-64-13-causal-*/run runs/regions-mrpc13-bf16/0 --out bench/results/cell_rows_mrpc13.json

REGIONS holds one saved Region per budget, named by its key (``0.0001`` …, fit_schedule's layout): those budgets are
the ones top-|Δ| and random are drawn at. ``--precision`` scores every row in that precision (default fp32, the
recipe's scoring). ``--rows dev`` (or ``train``) scores the run's dev (k-shot training) rows instead of its test rows:
the selection rows' halves, where a fit share by accuracy can hide a region that agrees little with FT (each row's
``agreement`` is the share of rows on which it predicts what FT predicts).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the fine-tuning run folder")
    ap.add_argument("regions", help="a folder of the learned regions, one sub-folder per budget key")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--rows", choices=["test", "dev", "train"], default="test", help="the rows scored (default test)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    folders = sorted(p for p in Path(args.regions).glob("*") if p.is_dir()) if Path(args.regions).is_dir() else []
    if not folders:
        raise SystemExit(f"{args.regions}: no saved regions (one folder per budget, as fit_schedule --save-regions "
                         "writes them)")

    from skillgraft.models.placement import Placement, using

    with using(Placement.build({"precision": args.precision}) if args.precision else None) as runtime:
        return run(args, runtime)


def run(args, runtime) -> int:
    from skillgraft.evaluate.predict import evaluate
    from skillgraft.graft import Graft, get_localizer
    from skillgraft.graft.region import Region
    from skillgraft.graft.selection import Budget
    from skillgraft.io import write_json
    from skillgraft.pipeline.opening import from_run

    member = from_run(args.run, test_limit=args.test_limit, runtime=runtime)
    pre, ft = member.pre, member.ft
    scored = {"test": member.test, "dev": member.data.dev or [], "train": member.data.train}[args.rows]
    if not scored:
        raise SystemExit(f"{args.run}: no {args.rows} rows to score")
    ft_metrics, ft_probs = evaluate(ft, scored)
    pre_metrics, _ = evaluate(pre, scored, reference=ft_probs)
    ft_score, pre_score = ft_metrics["score"], pre_metrics["score"]

    def row(model: str, metrics: dict, size: int | None = None) -> dict:
        out = {"model": model, "score": metrics["score"], "ece": metrics["ece"], "size": size,
               "agreement": metrics.get("agreement")}
        if ft_score > 0:
            out["share_of_ft"] = metrics["score"] / ft_score
        if ft_score != pre_score:
            out["gap_closed"] = (metrics["score"] - pre_score) / (ft_score - pre_score)
        return out

    rows = [row("pre-trained", pre_metrics), row("fine-tuned", ft_metrics)]
    saved = {Budget.parse(p.name).key: Region.load(p) for p in Path(args.regions).iterdir() if p.is_dir()}
    regions = {"learned": saved}
    for name in ("movement", "random"):  # at the saved regions' own budgets
        loc = get_localizer(name).run(pre, ft, member.data, {"budgets": ",".join(saved)}, progress=False)
        regions[name] = {b.key: r for b, r in loc.regions.items()}
    for name, found in regions.items():
        for key, region in sorted(found.items(), key=lambda kv: float(kv[0])):
            graft = Graft.from_models(pre, ft, region, {})
            with graft.applied(pre):
                metrics, _ = evaluate(pre, scored, reference=ft_probs)
            rows.append(row(f"{'top-|Δ|' if name == 'movement' else name} {key}", metrics, len(region)))
    print(f"{member.task} k={member.k} seed={member.seed}: {len(scored)} {args.rows} rows ({ft.task.metric})")
    for r in rows:
        extra = "".join(f"  {k} {r[k]:.3f}" for k in ("share_of_ft", "gap_closed", "agreement") if r.get(k) is not None)
        size = f" ({r['size']:,} params)" if r["size"] else ""
        print(f"  {r['model']}{size}: {r['score']:.4f}  ECE {r['ece']:.3f}{extra}")
    if args.out:
        write_json(Path(args.out), {"run": args.run, "regions": args.regions, "task": member.task, "k": member.k,
                                    "seed": member.seed, "precision": args.precision, "scored": args.rows,
                                    "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
