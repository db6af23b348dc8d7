"""Issue 33: the Gemma-3-270M rows of docs/fidelity.md, read from the store the Gemma recipes filled.

Every finished (task, seed) of ``bench/fidelity/gemma-table2-{a,b,c}.yaml`` / ``gemma-fig5.yaml`` is a store entry
("paper-rows", and "paper-ood-rows" per OOD set) whatever run wrote it, so this script reads those entries — not a
run folder, which is written only when its whole recipe ends — and prints, per task (mean over the seeds found):

* Table 2 / 9: pre-trained, FT and each localizer at each budget — accuracy, share of FT (acc / acc_FT), gap closed
  from the pre-trained model ((acc − acc_pre) / (acc_FT − acc_pre)), ECE, over-confidence (mean confidence −
  accuracy: the sign says which way ECE errs), agreement with FT;
* the pooled mean over tasks of share of FT and gap closed per localizer × budget (the headline rows);
* OOD (Tables 3 / 7): per source → target and seed, FT beside each learned graft (:func:`ood_verdicts`); then per
  source → target, the same columns as Table 2;
* Fig. 5: the rows of each fine-tuning label (SGD / AdamW / AdamW+L1) from the finished runs of
  ``gemma-fig5.yaml`` (``--runs``: their ``metrics.json``, whose rows name the fine-tuning; its store entries do
  not, and with one localizer they are left out of Table 2, which compares learned, top-|Δ| and random).

    python bench/gemma_summary.py [--store /work/store] [--runs runs] [--pretrained-digest DIGEST] [--json OUT]
    python bench/gemma_summary.py --store <issue 46's store> --k 64      # the paper-schedule cells (K = 1024 apart)
    python bench/gemma_summary.py --store bench/results/gemma46 --k 64   # the same, from their committed scores

With ``--k``, a first table gives issue 46's tests per (task, seed) cell (:func:`verdicts`).

Only entries of the converted Gemma (its model digest, printed by ``--list``) at causal mode are read.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import mean

# score: the task's metric (accuracy, F1 for MRPC / QQP), what share_of_ft and gap_closed are of; accuracy beside it
COLUMNS = ("score", "accuracy", "share_of_ft", "gap_closed", "ece", "over_confidence", "agreement")
LEARNED, TOP, RANDOM = "paper (learned)", "top-|Δ|", "random"  # the Gemma recipes' localizer labels
# The paper's GPT-2 small FT (Table 9; accuracy, F1 for MRPC / QQP), the bar of issue 46's "within 8 points"
GPT2_FT = {64: {"SST-2": 0.850, "cr": 0.874, "mr": 0.802, "mpqa": 0.852, "ag_news": 0.872, "subj": 0.895,
                "QNLI": 0.539, "SNLI": 0.560, "MNLI": 0.451, "RTE": 0.518, "MRPC": 0.811, "QQP": 0.568},
           4096: {"SST-2": 0.906, "cr": 0.873, "mr": 0.867, "mpqa": 0.884, "ag_news": 0.922, "subj": 0.958,
                  "QNLI": 0.819, "SNLI": 0.807, "MNLI": 0.723, "RTE": 0.667, "MRPC": 0.852, "QQP": 0.761}}


def over_confidence(rows: list[dict]) -> list[dict]:
    """Mean confidence − accuracy on each row: > 0 over-confident (what ECE mostly measures here)."""
    for r in rows:
        if r.get("mean_confidence") is not None and r.get("accuracy") is not None:
            r["over_confidence"] = r["mean_confidence"] - r["accuracy"]
    return rows


def fig5_rows(runs: Path) -> list[dict]:
    """The Fig. 5 rows (one per fine-tuning label × model) of every finished Fig. 5 run under ``runs``; a
    (label, task, seed) found in two runs counts once."""
    out, seen = [], set()
    for path in sorted(runs.glob("gemma-fig5*/metrics.json")):
        for r in json.loads(path.read_text()).get("finetune_rows", []):
            key = (r["finetune"], r["task"], r["seed"], r["model"])
            if key not in seen:
                seen.add(key)
                out.append(r)
    return over_confidence(out)


def entries(store: Path, kind: str, digest: str | None, k: int | None = None) -> list[tuple[dict, list[dict]]]:
    """(key, rows) of every finished ``kind`` entry in causal mode (of the model ``digest`` and of k-shot draws of ``k``
    per label, if given)."""
    out = []
    for folder in sorted(store.glob(f"{kind}-*")):
        key_file, rows_file = folder / "key.json", folder / "rows.json"
        if not (key_file.is_file() and rows_file.is_file()):
            continue
        key = json.loads(key_file.read_text())
        setup = key.get("setup", {})
        if setup.get("mode") != "causal" or (digest and setup.get("pretrained") != digest):
            continue
        if k is not None and (setup.get("data") or {}).get("k") != k:
            continue
        out.append((key, over_confidence(json.loads(rows_file.read_text())["rows"])))
    return out


def fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def table(rows: list[dict], group: tuple[str, ...]) -> list[dict]:
    """Mean of COLUMNS per ``group`` + model (first over seeds within a task, then as given)."""
    acc: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        acc[(*(r.get(g) for g in group), r["model"])].append(r)
    out = []
    for k, rs in acc.items():
        row = dict(zip((*group, "model"), k, strict=True))
        row["seeds"] = sorted({r["seed"] for r in rs})
        for c in COLUMNS:
            vals = [r[c] for r in rs if r.get(c) is not None]
            row[c] = mean(vals) if vals else None
        out.append(row)
    return out


def markdown(rows: list[dict], group: tuple[str, ...]) -> str:
    head = [*group, "model", "seeds", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[g]) for g in group] + [r["model"], ",".join(map(str, r["seeds"]))]
        cells = [c.replace("|", "\\|") for c in cells] + [fmt(r[c]) for c in COLUMNS]  # top-|Δ| in a table cell
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pooled(rows: list[dict]) -> list[dict]:
    """Per model: mean over tasks of each task's seed mean (tasks weigh alike, as the paper averages)."""
    per_task = table(rows, ("task",))
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in per_task:
        by_model[r["model"]].append(r)
    out = []
    for model, rs in by_model.items():
        row = {"model": model, "seeds": sorted({s for r in rs for s in r["seeds"]}),
               "tasks": sorted(r["task"] for r in rs)}
        for c in COLUMNS:
            vals = [r[c] for r in rs if r[c] is not None]
            row[c] = mean(vals) if vals else None
        out.append(row)
    return out


def points(d: float) -> str:
    """A difference of scores in points, rounded half away from zero (0.7025 − 0.532 → +17.1, not float's +17.0)."""
    return f"{round(100 * d + (1e-9 if d >= 0 else -1e-9), 1):+.1f}"


def z_of(a: dict, b: dict) -> float | None:
    """(a − b) over its standard error, the two scores read as proportions of their test rows (unpaired, so
    conservative for two models on the same rows); None without row counts."""
    if not a.get("n") or not b.get("n"):
        return None
    pa, pb = a["score"], b["score"]
    se = math.sqrt(pa * (1 - pa) / a["n"] + pb * (1 - pb) / b["n"])
    return (pa - pb) / se if se > 0 else None


def verdicts(rows: list[dict], k: int | None) -> str:
    """Issue 46's tests, one line per (task, seed) cell: FT − zero-shot (≥ 15 points; with its z, and where z < 2
    the shares of FT are marked as saying nothing: FT is not told apart from the pre-trained model on these rows, so
    any region "keeps" it) and FT − the paper's GPT-2 FT (within 8; K ≥ 512 against its 4096-shot column), the
    learned graft's share of FT at ≤ 1e-4 (Table 2) and at ≤ 5e-4 (Table 9) of the body (the best budget within
    each), learned > top-|Δ| > random per budget (G5), and the budgets whose learned graft has a lower ECE than FT
    (G12 / G13)."""
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        cells[(r["task"], r["seed"])][r["model"]] = r
    paper = GPT2_FT[4096 if (k or 0) >= 512 else 64]
    head = ["task", "seed", "FT", "zero-shot", "FT − ZS (z)", "FT − GPT-2", "learned ≤ 1e-4", "learned ≤ 5e-4",
            "learned (L) vs top-\\|Δ\\| (T) vs random (R), ≫: > 1 point", "learned ECE < FT's"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, seed), by in sorted(cells.items()):
        ft, zs = by.get("fine-tuned"), by.get("pre-trained")
        if ft is None or zs is None:
            continue
        grafts = [r for r in by.values() if r.get("kind") == "graft" and r.get("budget") is not None]
        budgets = sorted({float(r["budget"]) for r in grafts})

        def of(label: str, b: float) -> dict | None:
            return next((r for r in grafts if r["localizer"] == label and float(r["budget"]) == b), None)

        z = z_of(ft, zs)
        trivial = z is not None and z < 2

        def best_share(limit: float) -> str:
            shares = [(r["share_of_ft"], r["budget"]) for b in budgets if b <= limit and (r := of(LEARNED, b))]
            if not shares:
                return "–"
            return "{:.1f} % ({}){}".format(100 * max(shares)[0], max(shares)[1], " (FT ≈ ZS: says nothing)"
                                            if trivial else "")

        def apart(a: dict, b: dict) -> str:  # "≫": more than a point apart (a test row or two is not a difference)
            d = a["score"] - b["score"]
            return "≫" if d > 0.01 else "≪" if d < -0.01 else "≈"

        order, calibrated = [], []
        for b in budgets:
            learned, top, rand = of(LEARNED, b), of(TOP, b), of(RANDOM, b)
            if learned and top and rand:
                order.append(f"{b:g} L{apart(learned, top)}T{apart(top, rand)}R")
            if learned and learned.get("ece") is not None and learned["ece"] < ft["ece"]:
                calibrated.append(f"{b:g}")
        bar = paper.get(task)
        lines.append("| " + " | ".join([
            task, str(seed), f"{ft['score']:.4f}", f"{zs['score']:.4f}",
            points(ft["score"] - zs["score"]) + ("" if z is None else f" (z {z:.1f})"),
            "–" if bar is None else points(ft["score"] - bar), best_share(1e-4), best_share(5e-4),
            "; ".join(order) or "–", ", ".join(calibrated) or "none"]) + " |")
    return "\n".join(lines)


def ood_verdicts(ood: list[dict]) -> str:
    """Issue 46's OOD test (paper §4.2, Tables 3 / 7, Fig. 7), one line per (source → target, seed): the pre-trained
    and fine-tuned models' scores on the OOD set, each learned graft's score with its difference from FT in points
    (and z), and the budgets where the graft scores at least FT's ("≥ FT"; the paper: grafts ≥ FT, by ≥ 5 points on
    a large shift)."""
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in ood:
        cells[(r["source"], r["eval"], r["seed"])][r["model"]] = r
    head = ["source → target", "seed", "rows", "zero-shot", "FT", "learned graft (− FT, z) per budget", "≥ FT at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (source, target, seed), by in sorted(cells.items()):
        ft, zs = by.get("fine-tuned"), by.get("pre-trained")
        if ft is None:
            continue
        learned = sorted((float(r["budget"]), r) for r in by.values()
                         if r.get("kind") == "graft" and r.get("localizer") == LEARNED and r.get("budget") is not None)
        per, at_least = [], []
        for b, r in learned:
            z = z_of(r, ft)
            per.append(f"{b:g}: {r['score']:.4f} ({points(r['score'] - ft['score'])}"
                       + ("" if z is None else f", z {z:.1f}") + ")")
            if r["score"] >= ft["score"]:
                at_least.append(f"{b:g}")
        lines.append("| " + " | ".join([
            f"{source} → {target}", str(seed), str(ft.get("n", "–")), "–" if zs is None else f"{zs['score']:.4f}",
            f"{ft['score']:.4f}", "; ".join(per) or "–", ", ".join(at_least) or "none"]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=Path("/work/store"))
    ap.add_argument("--runs", type=Path, default=Path("runs"), help="folder of the finished Fig. 5 runs")
    ap.add_argument("--pretrained-digest", default=None, help="only entries of this base (default: any causal)")
    ap.add_argument("--json", type=Path, default=None, help="also write every table as JSON here")
    ap.add_argument("--k", type=int, default=None, help="only k-shot draws of K per label (default: any)")
    a = ap.parse_args()

    # Table 2 entries compare several localizers; a Fig. 5 entry (one learned localizer per fine-tuning) is not one
    main_rows = [r for key, rows in entries(a.store, "paper-rows", a.pretrained_digest, a.k)
                 if len(key.get("localizers", [])) > 1 for r in rows]
    fig5 = fig5_rows(a.runs)
    ood = [r for _, rows in entries(a.store, "paper-ood-rows", a.pretrained_digest, a.k) for r in rows]
    found = sorted({(r["task"], r["seed"]) for r in main_rows})
    print(f"Table 2 cells found (task, seed): {found}\n")
    print("Issue 46's tests per cell (score: accuracy, F1 for MRPC / QQP; shares are of FT's score):\n")
    print(verdicts(main_rows, a.k), "\n")
    per_task = table(main_rows, ("task",))
    print(markdown(per_task, ("task",)), "\n")
    pool = pooled(main_rows)
    tasks = sorted({r["task"] for r in main_rows})
    print(f"Pooled over {len(tasks)} tasks ({', '.join(tasks)}):\n")
    print(markdown(pool, ()), "\n")
    ood_t = table(ood, ("source", "eval"))
    if ood_t:
        print("OOD, per cell (issue 46: grafts ≥ FT on the large shift):\n")
        print(ood_verdicts(ood), "\n")
        print("OOD, mean over seeds:\n")
        print(markdown(ood_t, ("source", "eval")), "\n")
    fig5_t = table(fig5, ("task", "finetune"))
    if fig5_t:
        print("Fig. 5:\n")
        print(markdown(fig5_t, ("task", "finetune")), "\n")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"cells": found, "per_task": per_task, "pooled": pool, "ood": ood_t,
                                      "fig5": fig5_t}, indent=1))


if __name__ == "__main__":
    main()
