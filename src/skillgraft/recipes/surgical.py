"""Surgical fine-tuning recipe (Lodha et al.): train only K blocks chosen by FIM score, and compare.

For each task × data seed: the per-block FIM score of the pre-trained model over the k-shot training set
(:func:`skillgraft.fisher.fim_layer_scores`), then fine-tuning runs from θ_pre that differ only in what
trains: ``full`` (every block), ``fim-top-K`` / ``fim-bottom-K`` / ``random-K`` (K ∈ ``layers_k`` blocks,
+ the head), ``auto-rgn`` (every block, per-tensor lr ∝ ‖∇L‖/‖θ‖). Reported: test accuracy/F1, ECE,
trainable parameters (body, head excluded), mean (std) over seeds. Ranking stability: one full
fine-tuning run with checkpoints, the FIM ranking recomputed on each, Spearman/Kendall vs step 0.

Every fine-tuning's test metrics (kind ``surgical``) and the stability rows (``surgical-stability``) live
in the store, keyed by the resolved model, data and fine-tuning specs, so a re-run only re-reports.
Writes ``results.csv`` (one row per task × seed × method), ``summary.csv``, ``fim.csv``,
``stability.csv``, ``surgical.png`` (accuracy per method), ``fim.png`` (FIM per block per task), ``report.md``.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.plots import save_figure
from skillgraft.evaluate.predict import evaluate
from skillgraft.fisher import FisherConfig, block_names, fim_layer_scores, ranking_stability
from skillgraft.fisher.plots import layer_scores_bar
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.models.anatomy import is_carried
from skillgraft.pipeline.report import RunDir, md_table, pct, setting_line
from skillgraft.pipeline.store import Store, draw_key, precision_key
from skillgraft.recipes.base import ExperimentSpec, SeedsMixin, recipe
from skillgraft.spec import COUNT_MAX
from skillgraft.train import AutoRGN, FinetuneConfig, Snapshots, finetune

METHODS = ("full", "fim-top", "fim-bottom", "random", "auto-rgn")
Method = Literal["full", "fim-top", "fim-bottom", "random", "auto-rgn"]
METRICS = ["score", "accuracy", "ece", "trainable_parameters"]


class SurgicalSpec(ExperimentSpec, SeedsMixin):
    """Which blocks train (FIM top/bottom-K, random-K, all, Auto-RGN), how the FIM is computed, stability."""

    layers_k: list[Annotated[int, Field(ge=1, le=COUNT_MAX)]] = Field(
        default_factory=lambda: [1, 2, 3], min_length=1,
        description="K: number of blocks trained by fim-top / fim-bottom / random (each ≤ the model's blocks)")
    methods: list[Method] = Field(default_factory=lambda: list(METHODS), min_length=1, description=(
        "full (every block) | fim-top | fim-bottom | random (K blocks + the head) | auto-rgn (every block, "
        "per-tensor lr ∝ ‖∇L‖/‖θ‖)"))
    fisher: FisherConfig = Field(default_factory=FisherConfig,
                                 description="the FIM of the pre-trained model over the k-shot training set")
    fisher_aggregate: Literal["sum", "frobenius"] = Field(
        "sum", description="block score: sum (of Fisher entries; the definition) | frobenius (the reference code)")
    fisher_normalize: bool = Field(False, description="divide each block's score by its parameter count")
    stability_steps: list[Annotated[int, Field(ge=0, le=COUNT_MAX)]] = Field(default_factory=list, description=(
        "FIM ranking recomputed on these checkpoints of one full FT run of the first task and seed (empty: none)"))


def selections(methods: list[str], layers_k: list[int], scores, n_blocks: int,
               seed: int) -> list[tuple[str, list | None]]:
    """(method label, blocks to train or None for all) in report order; random-K blocks drawn per seed."""
    out: list[tuple[str, list | None]] = []
    for m in methods:
        if m in ("full", "auto-rgn"):
            out.append((m, None))
            continue
        for k in layers_k:
            if m == "fim-top":
                out.append((f"fim-top-{k}", scores.top(k)))
            elif m == "fim-bottom":
                out.append((f"fim-bottom-{k}", scores.bottom(k)))
            else:
                out.append((f"random-{k}", sorted(random.Random(seed * 1000 + k).sample(range(n_blocks), k))))
    return out


def train_and_test(store: Store, key: dict, pre, data, config: FinetuneConfig, *, auto_rgn: bool,
                   label: str) -> dict:
    """Fine-tune a copy of ``pre`` and evaluate it on ``data.test``; the metrics live in the store."""

    def make(folder: Path) -> None:
        scorer = copy.deepcopy(pre)
        t0 = time.perf_counter()
        res = finetune(scorer, data.train, data.dev, config, k=data.k, progress=False,
                       callbacks=[AutoRGN()] if auto_rgn else [])
        seconds = time.perf_counter() - t0
        metrics, _ = evaluate(res.scorer, data.test)
        head = sum(p.numel() for n, p in res.scorer.named_parameters() if is_carried(n))
        write_json(folder / "metrics.json", {
            "score": metrics["score"], "accuracy": metrics["accuracy"], "ece": metrics["ece"],
            "trainable_parameters": res.trainable_parameters - head, "trainable_with_head": res.trainable_parameters,
            "best_dev": res.best_dev, "best_step": res.best_step, "train_seconds": round(seconds, 2)})

    entry = store.fetch("surgical", {**key, "finetune": config.to_dict(), "auto_rgn": auto_rgn}, make, label=label)
    return read_json(entry / "metrics.json")


@recipe("surgical", SurgicalSpec)
def surgical(spec: SurgicalSpec, run: RunDir) -> dict:
    model = spec.model_spec()
    rows, fim_rows, fim_plot, timings = [], [], {}, []
    for task in spec.tasks:
        for seed in spec.seeds:
            data_spec = spec.data_spec(task, seed)
            data = data_spec.load()
            pre = model.scorer(data.task, head_seed=spec.finetune.seed).eval()
            n_blocks = len(block_names(pre))
            if max(spec.layers_k) > n_blocks:
                raise SkillgraftError(f"recipe field 'layers_k': {max(spec.layers_k)} is not in 1..{n_blocks} "
                                      "(the model's blocks)")
            t0 = time.perf_counter()
            scores = fim_layer_scores(pre, data.train, aggregate=spec.fisher_aggregate,
                                      normalize=spec.fisher_normalize, config=spec.fisher)
            fim_seconds = time.perf_counter() - t0
            fim_rows.append({"task": data.task.name, "seed": seed, "ranking": scores.ranking(),
                             "scores": scores.scores, "seconds": round(fim_seconds, 2)})
            fim_plot.setdefault(data.task.name, scores)
            key = {**draw_key(model, data_spec), **precision_key(run.runtime)}  # a bf16 run: its own entries
            for label, layers in selections(spec.methods, spec.layers_k, scores, n_blocks, seed):
                m = train_and_test(run.store, key, pre, data, spec.finetune.replace(layers=layers),
                                   auto_rgn=label == "auto-rgn", label=f"{data.task.name}-{spec.k}-{seed}-{label}")
                rows.append({"task": data.task.name, "seed": seed, "method": label,
                             "blocks": "all" if layers is None else ",".join(map(str, layers)), **m})
            timings.append({"task": data.task.name, "seed": seed, "fisher_seconds": round(fim_seconds, 2),
                            "train_seconds": sum(r["train_seconds"] for r in rows if r["task"] == data.task.name
                                                 and r["seed"] == seed)})
    stability = stability_rows(spec, run) if spec.stability_steps else []
    agg, summary = run.seed_tables("results.csv", rows, ["task", "method"], METRICS)
    run.csv("fim.csv", [{**r, "ranking": " ".join(map(str, r["ranking"])),
                         "scores": " ".join(f"{s:.4g}" for s in r["scores"])} for r in fim_rows])
    if stability:
        run.csv("stability.csv", [{**r, "ranking": " ".join(map(str, r["ranking"]))} for r in stability])
    plot_methods(agg, run.file("surgical.png"))
    layer_scores_bar(fim_plot, run.file("fim.png"), title="FIM per block on the pre-trained model")
    run.report(report(spec, agg, fim_rows, stability, timings))
    return {"rows": rows, "summary": summary, "fim": fim_rows, "stability": stability, "timings": timings}


def stability_rows(spec: SurgicalSpec, run: RunDir) -> list[dict]:
    """Full FT of the first task/seed with checkpoints; FIM ranking on each vs the pre-trained one."""
    model, seed = spec.model_spec(), spec.seeds[0]
    data_spec = spec.data_spec(spec.tasks[0], seed)
    config = spec.finetune.replace(eval_every=0, layers=None)  # no best-dev restore: the last checkpoint = last step
    key = {**draw_key(model, data_spec), **precision_key(run.runtime), "finetune": config.to_dict(),
           "steps": sorted(set(spec.stability_steps)),
           "fisher": spec.fisher.to_dict(), "aggregate": spec.fisher_aggregate, "normalize": spec.fisher_normalize}

    def make(folder: Path) -> None:
        data = data_spec.load()
        scorer = model.scorer(data.task, head_seed=config.seed)
        steps_total = config.resolved_steps(data.task.num_labels, data.k)
        wanted = [s for s in key["steps"] if s <= steps_total]
        snaps = Snapshots(scorer, [s for s in wanted if s < steps_total])
        finetune(scorer, data.train, None, config, k=data.k, progress=False, callbacks=[snaps])
        checkpoints = {s: snaps.scorer_at(s) for s in snaps.states}
        if steps_total in wanted:
            checkpoints[steps_total] = scorer
        rows, _ = ranking_stability(checkpoints, data.train, aggregate=spec.fisher_aggregate,
                                    normalize=spec.fisher_normalize, config=spec.fisher)
        write_json(folder / "rows.json", [{"task": data.task.name, "seed": seed, **r} for r in rows])

    entry = run.store.fetch("surgical-stability", key, make, label=f"{spec.tasks[0]}-{spec.k}-{seed}")
    return read_json(entry / "rows.json")


def plot_methods(agg: list[dict], path) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    tasks = list(dict.fromkeys(g["task"] for g in agg))
    methods = list(dict.fromkeys(g["method"] for g in agg))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(tasks) * len(methods) / 3 + 2), 3.6))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        means, stds = [], []
        for t in tasks:
            g = next((g for g in agg if g["task"] == t and g["method"] == m), None)
            vals = np.asarray(g["score"] if g else [np.nan], dtype=float) * 100
            means.append(vals.mean())
            stds.append(vals.std() if vals.size > 1 else 0.0)
        ax.bar(np.arange(len(tasks)) + (j - (len(methods) - 1) / 2) * width, means, width, yerr=stds, label=m,
               capsize=2)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("test score (%)")
    ax.set_title("Surgical fine-tuning: which blocks train", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    save_figure(fig, path)


def report(spec: SurgicalSpec, agg: list[dict], fim_rows: list[dict], stability: list[dict],
           timings: list[dict]) -> str:
    ft = spec.finetune
    lines = ["# Surgical fine-tuning by FIM score", "",
             setting_line(spec, f"fine-tuning {ft.optimizer} lr {ft.lr} for {ft.steps or 'default'} "
                                            f"steps, Fisher {spec.fisher.kind} over {spec.fisher.n_examples or 'all'} "
                                            "training examples"),
             "",
             "Each method fine-tunes θ_pre with only the listed blocks trainable (+ the head; embeddings "
             "frozen as in full FT). *fim-top-K*: the K blocks of highest FIM score on the pre-trained model; "
             "*fim-bottom-K*: the K lowest; *random-K*: K blocks drawn per seed; *auto-rgn*: all blocks, "
             "per-tensor lr multiplier ‖∇L‖/‖θ‖ normalised by its maximum (Lee et al.). Test score is accuracy "
             "(F1 for MRPC/QQP); mean (std) over seeds; trainable parameters exclude the head.", ""]
    rows = []
    for g in agg:
        params = int(np.mean(g["trainable_parameters"])) if g["trainable_parameters"] else 0
        rows.append([g["task"], g["method"], pct(g["score"]), pct(g["accuracy"]), pct(g["ece"]),
                     f"{params:,}", g["n_seeds"]])
    lines += [md_table(["task", "method", "score %", "accuracy %", "ECE %", "trainable (body)", "seeds"], rows), ""]
    lines += ["## Average over tasks", "",
              "Per method: the mean over tasks of the per-task mean score and ECE; *tasks ≥ full* counts the tasks "
              "where the method's mean score is at least full fine-tuning's.", "",
              md_table(["method", "score %", "ECE %", "trainable (body)", "tasks ≥ full", "tasks"],
                       task_averages(agg)), ""]
    lines += ["## FIM ranking of the pre-trained model", "",
              md_table(["task", "seed", "ranking (high → low)", "scores by block (0, 1, …)", "seconds"],
                       [[r["task"], r["seed"], " ".join(map(str, r["ranking"])),
                         " ".join(f"{s:.3g}" for s in r["scores"]), r["seconds"]] for r in fim_rows]), ""]
    if stability:
        lines += ["## Ranking stability during fine-tuning", "",
                  "The FIM ranking recomputed on checkpoints of one full fine-tuning run "
                  f"({stability[0]['task']}, seed {stability[0]['seed']}); Spearman ρ / Kendall τ against step 0 "
                  "(the pre-trained model with the run's head initialisation) and against the previous checkpoint.",
                  "",
                  md_table(["step", "ranking", "Spearman vs step 0", "Kendall vs step 0", "Spearman vs prev",
                            "Kendall vs prev"],
                           [[r["step"], " ".join(map(str, r["ranking"])), f"{r['spearman_vs_first']:.3f}",
                             f"{r['kendall_vs_first']:.3f}", _f(r.get("spearman_vs_prev")),
                             _f(r.get("kendall_vs_prev"))] for r in stability]), ""]
    lines += ["## Time", "", md_table(["task", "seed", "Fisher s", "fine-tuning s (all methods)"],
                                       [[t["task"], t["seed"], t["fisher_seconds"], round(t["train_seconds"], 1)]
                                        for t in timings]), "",
              "Fine-tuning seconds are those of the run that filled the store entry. "
              "Files: results.csv, summary.csv, fim.csv, stability.csv, surgical.png, fim.png."]
    return "\n".join(lines) + "\n"


def task_averages(agg: list[dict]) -> list[list]:
    """One row per method: mean over tasks of (mean score, mean ECE, trainable parameters), tasks ≥ full."""
    methods = list(dict.fromkeys(g["method"] for g in agg))
    full = {g["task"]: float(np.mean(g["score"])) for g in agg if g["method"] == "full"}
    out = []
    for m in methods:
        groups = [g for g in agg if g["method"] == m]
        scores = {g["task"]: float(np.mean(g["score"])) for g in groups}
        at_least = sum(1 for t, v in scores.items() if t in full and v >= full[t] - 1e-12)
        out.append([m, f"{100 * np.mean(list(scores.values())):.1f}",
                    f"{100 * np.mean([np.mean(g['ece']) for g in groups]):.1f}",
                    f"{int(np.mean([np.mean(g['trainable_parameters']) for g in groups])):,}",
                    f"{at_least}/{len(full)}" if full else "-", len(groups)])
    return out


def _f(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3f}"
