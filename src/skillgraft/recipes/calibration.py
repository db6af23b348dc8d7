"""Calibration recipe (paper Table 1/2, Fig. 6): fine-tuned model vs grafts at several sparsities.

For each task and data seed: fine-tune (from the store), learn regions at the configured budgets (the one
regions cache, :func:`skillgraft.pipeline.regions.learned_regions`), then compare pre-trained, head only, FT,
each graft, optionally graft re-training (Table 1) and BitFit on the test subset
(:func:`skillgraft.pipeline.variants.compare`): accuracy/F1, ECE (10 equal-width bins), agreement with FT,
share of FT, gap closed. Writes ``metrics.csv`` (one row per task × seed × model), ``summary.csv``
(mean/std over seeds), confidence histograms and reliability diagrams (FT vs grafts side by side, first
seed) and ``report.md`` with the paper's numbers beside ours. ECE reduction = 1 − ECE / ECE_FT.
"""

from __future__ import annotations

import time

from skillgraft.data import get_task
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram
from skillgraft.evaluate.predict import labels_of
from skillgraft.pipeline.paper_numbers import PAPER_NOTE, TABLE1_4096, TABLE2_64
from skillgraft.pipeline.regions import model_variants
from skillgraft.pipeline.report import RunDir, md_table, pct, setting_line
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.variants import Variant, compare, rows_of
from skillgraft.recipes.base import ExperimentSpec, GraftVariantsMixin, SeedsMixin, recipe

METRICS = ["score", "accuracy", "ece", "agreement", "mean_confidence"]


class CalibrationSpec(ExperimentSpec, SeedsMixin, GraftVariantsMixin):
    """Calibration of grafts vs FT (paper Table 1/2, Fig. 6)."""


@recipe("calibration", CalibrationSpec)
def calibration(spec: CalibrationSpec, run: RunDir) -> dict:
    rows, timings = [], []
    for task in spec.tasks:
        for seed in spec.seeds:
            t0 = time.perf_counter()
            member = spec.member(run, task, seed)
            variants, summary = model_variants(member, spec, run)
            found, probs = compare(member, variants)
            rows += rows_of(member, found)
            if seed == spec.seeds[0]:
                _plots(run, member, probs, variants)
            timings.append({"task": member.task, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
                            "localize_seconds": summary.get("seconds")})
    ft_ece = {(r["task"], r["seed"]): r["ece"] for r in rows if r["kind"] == "ft"}
    for r in rows:
        e = ft_ece.get((r["task"], r["seed"]))
        r["ece_reduction"] = (1 - r["ece"] / e) if e else None
    columns = METRICS + ["ece_reduction", "params", "params_pct"]
    agg, summary = run.seed_tables("metrics.csv", rows, ["task", "model", "kind"], columns)
    run.report(_report(spec, agg, timings))
    return {"rows": rows, "summary": summary, "timings": timings}


def _plots(run: RunDir, member: Member, probs: dict, variants: list[Variant]) -> None:
    shown = [v.name for v in variants if v.kind in ("ft", "graft", "retrain", "bitfit", "head-only")]
    labels = labels_of(member.test)
    tag = member.task.replace("/", "_")
    confidence_histogram({n: probs[n] for n in shown}, run.file(f"confidence_{tag}.png"),
                         title=f"{member.task} test, k={member.k}, seed {member.seed}: top-label confidence")
    reliability_diagram({n: (probs[n], labels) for n in shown}, run.file(f"reliability_{tag}.png"),
                        title=f"{member.task} test, k={member.k}, seed {member.seed}")


def _report(spec: CalibrationSpec, agg: list[dict], timings: list[dict]) -> str:
    lines = ["# Calibration: fine-tuning vs grafting (paper Table 1/2, Fig. 6)", "",
             setting_line(spec), "",
             "Score is accuracy (F1 for MRPC/QQP); ECE with 10 equal-width bins; agreement = share of test "
             "examples where the model predicts the same label as FT; ECE reduction = 1 − ECE/ECE_FT. Params = "
             "body parameters changed or trained (the new head, which every non-pre model carries, not counted), "
             "% of all model parameters. All numbers in %, mean (std) over data seeds.", ""]
    for task in spec.tasks:
        group = [g for g in agg if g["task"] == get_task(task).name]
        if not group:
            continue
        name = group[0]["task"]
        lines += [f"## {name}", "", md_table(
            ["model", "params", "params %", "score", "ECE", "ECE reduction vs FT", "agreement w/ FT", "mean conf."],
            [[g["model"], int(g["params"][0]) if g["params"] else "-", f"{g['params_pct'][0]:.4f}",
              pct(g["score"]), pct(g["ece"]), pct(g["ece_reduction"]) if g["kind"] != "ft" else "-",
              pct(g["agreement"]), pct(g["mean_confidence"])] for g in group]), ""]
        lines += [f"![confidence]({'confidence_' + name}.png)", "", f"![reliability]({'reliability_' + name}.png)", ""]
        paper = []
        if name in TABLE2_64:
            fa, fe, ga, ge = TABLE2_64[name]
            paper.append(f"- Table 2 (64-shot, graft ≤ 0.01%): FT {fa} acc / {fe} ECE; graft {ga} acc / {ge} ECE.")
        if name in TABLE1_4096:
            paper.append("- Table 1 (4096-shot, 0.01%): " + "; ".join(
                f"{m} {a} acc / {e} ECE" for m, (a, e) in TABLE1_4096[name].items()) + ".")
        if paper:
            lines += ["Paper's numbers for this task:", "", *paper, ""]
    lines += ["## Reading it", "",
              "The paper reports 40–90% lower ECE for grafts whose accuracy is within 5% of FT. The 'ECE reduction "
              "vs FT' column is that quantity for our runs; compare a graft's score with both FT and 'head only' "
              "(the pre-trained body with the fine-tuned head), since in head mode the head alone already carries "
              "part of the skill.", "", PAPER_NOTE, "", "## Time", "",
              md_table(["task", "seed", "seconds (incl. cached steps)", "localization seconds (when run)"],
                       [[t["task"], t["seed"], t["seconds"], t["localize_seconds"]] for t in timings]), ""]
    return "\n".join(lines)
