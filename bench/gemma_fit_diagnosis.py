"""Issue 46: is a learned graft short of FT because it cannot fit what FT fits, or because its fit does not carry?

The learned localizer picks each budget's region by its accuracy on the cell's train + dev rows (the paper's
selection; with ``select_on: last``, as K = 1,024's recipe, nothing is selected and the last step's regions are scored
on the training rows only). This reads, for every cell of ``--k`` shots whose fine-tuned weights are in the store, FT's
own accuracy on those rows (train and dev apart) and puts it beside the region's (``regions-…-learned/summary.json``:
its best score) and the test shares (``paper-rows-…/rows.json``):

* fit share = region's train + dev accuracy ÷ FT's: under 1, the region does not reproduce FT even where it was
  chosen (capacity at that size, or 100 steps of the paper's optimiser);
* carry = (region's test accuracy ÷ FT's) ÷ fit share: under 1, what the region fits carries to the test rows
  less than FT's fit does.

Accuracy throughout (the localizer's objective; MRPC's F1 shares are in docs/fidelity.md).

    SKILLGRAFT_CACHE=runs/store SKILLGRAFT_DATA=../shared/data \\
        python bench/gemma_fit_diagnosis.py --records bench/results/gemma46 --out bench/results/gemma46_fit.json
    (K = 1,024: add --k 1024 --out bench/results/gemma46_fit_1024.json)

Reads FT from the store (the weights are not in ``--records``); the rows and regions from ``--records`` (or the
store). One forward pass per train and dev row for each cell (≈ 1–2 min a cell on one thread).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

CELL_SPARSITY = 1e-4  # the cells' learned trajectory: γ_base = top-1e-4 |Δ| (bench/fidelity/gemma-schedule-*)


def full_finetunes(store: Path, k: int = 64) -> list[Path]:
    """The store's full-schedule fine-tunings of the cells of ``k`` shots (not the grid's screened points): the run
    whose ``steps`` is the schedule's (16·n·k), one per (task, seed)."""
    out = {}
    for folder in sorted(store.glob(f"ft-*-{k}-*-causal-*")):
        metrics = folder / "run" / "metrics.json"
        if not (folder / "key.json").is_file() or not metrics.is_file() or not (folder / "run" / "model").is_dir():
            continue
        m = json.loads(metrics.read_text())
        if m["steps"] > 256:  # a grid point is 256 steps
            out[(m["task"], m["seed"])] = folder / "run"
    return [out[k] for k in sorted(out)]


def one(records: Path, task: str, seed: int, kind: str, k: int = 64) -> Path | None:
    """The record of ``kind`` of a cell: its learned regions (``regions``: the cell's own trajectory, γ_base at 1e-4 —
    not a per-size trajectory run beside it) or its scored rows (``paper-rows``)."""
    from skillgraft.pipeline.store import Store

    store = Store(records)  # the records keep the store's layout
    if kind == "regions":
        found = [p for p in store.entries("regions", f"{task}-{k}-{seed}-learned")
                 if json.loads((p / "key.json").read_text())["options"].get("sparsity") == CELL_SPARSITY]
    else:
        found = store.entries(kind, f"{task}-{k}-{seed}-causal")
    return found[0] if found else None


def budget_rows(best_score: dict[str, float], table: dict[str, dict], ft_fit: float) -> dict[str, dict]:
    """Per budget: the region's selection accuracy, its share of FT's (``ft_fit``: FT on the same rows), its test
    accuracy's share of FT's (``table``: the cell's rows by model label), and carry = test share ÷ fit share."""
    ft_test = table["fine-tuned"]["accuracy"]
    out = {}
    for budget, score in best_score.items():
        test = table.get(f"paper (learned) {budget}", {}).get("accuracy")
        fit_share = score / ft_fit
        share = test / ft_test if test is not None else None
        out[budget] = {"region_train_dev": score, "fit_share": fit_share, "test_share": share,
                       "carry": share / fit_share if share is not None else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("SKILLGRAFT_CACHE"), help="the store with the FT weights")
    ap.add_argument("--records", default="bench/results/gemma46", help="rows and regions (a store's layout)")
    ap.add_argument("--out", default=None, help="also write the table as JSON here")
    ap.add_argument("--k", type=int, default=64, help="the cells' shots per label (64; 1024: the K = 1,024 cell)")
    args = ap.parse_args()
    if not args.store:
        ap.error("--store (or SKILLGRAFT_CACHE) names the store holding the fine-tuned weights")

    from skillgraft.evaluate.metrics import accuracy
    from skillgraft.evaluate.predict import labels_of, predict_probs
    from skillgraft.io import write_json
    from skillgraft.pipeline.opening import from_run

    records, out = Path(args.records), []
    for run in full_finetunes(Path(args.store), args.k):
        m = json.loads((run / "metrics.json").read_text())
        task, seed = m["task"], m["seed"]
        learned, rows = one(records, task, seed, "regions", args.k), one(records, task, seed, "paper-rows", args.k)
        if not (learned and rows):
            print(f"{task}/{seed}: not grafted yet, skipped", flush=True)
            continue
        member = from_run(run)
        data = member.inputs.data
        # the regions were scored on train + dev, or (select_on last: nothing selected) on the training rows only
        last = json.loads((learned / "key.json").read_text())["options"].get("select_on") == "last"
        scored = {split: getattr(data, split) for split in (("train",) if last else ("train", "dev"))}
        fit = {split: accuracy(predict_probs(member.ft, rows_, batch_size=16), labels_of(rows_))
               for split, rows_ in scored.items()}
        both = sum(fit[s] * len(scored[s]) for s in scored) / sum(len(r) for r in scored.values())
        summary = json.loads((learned / "summary.json").read_text())
        table = {r["model"]: r for r in json.loads((rows / "rows.json").read_text())["rows"]}
        cell = {"task": task, "seed": seed, "ft_train": fit["train"], "ft_dev": fit.get("dev"), "ft_train_dev": both,
                "ft_test": table["fine-tuned"]["accuracy"], "budgets": budget_rows(summary["best_score"], table, both)}
        out.append(cell)
        b = cell["budgets"].get("0.0001", {})
        dev = f"{fit['dev']:.3f}" if "dev" in fit else "– (not scored)"
        print(f"{task}/{seed}: FT train {fit['train']:.3f} dev {dev} (train+dev {both:.3f}); region at "
              f"1e-4 {b.get('region_train_dev', float('nan')):.3f} → fit share {b.get('fit_share', float('nan')):.3f}, "
              f"test share {b.get('test_share') or float('nan'):.3f}, carry {b.get('carry') or float('nan'):.3f}",
              flush=True)
        del member
    if args.out:
        write_json(args.out, out)  # atomically
    print("\n| cell | FT train / dev | budget | region train+dev | fit share | test share | carry |")
    print("|---|---|---|---:|---:|---:|---:|")
    for c in out:
        for budget, b in c["budgets"].items():
            ts = f"{b['test_share']:.3f}" if b["test_share"] is not None else "–"
            ca = f"{b['carry']:.3f}" if b["carry"] is not None else "–"
            dev = f"{c['ft_dev']:.3f}" if c["ft_dev"] is not None else "–"
            print(f"| {c['task']}/{c['seed']} | {c['ft_train']:.3f} / {dev} | {budget} | "
                  f"{b['region_train_dev']:.3f} | {b['fit_share']:.3f} | {ts} | {ca} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
