"""Surgical fine-tuning recipe (Lodha et al.): train only K blocks chosen by FIM score, and compare.

For each task × data seed: the per-block FIM score of the pre-trained model over the k-shot training set
(:func:`skillgraft.fisher.fim_layer_scores`), then fine-tuning runs from θ_pre that differ only in what
trains: ``full`` (every block), ``fim-top-K`` / ``fim-bottom-K`` / ``random-K`` (K ∈ ``layers_k`` blocks,
+ the head), ``auto-rgn`` (every block, per-tensor lr ∝ ‖∇L‖/‖θ‖). Reported: test accuracy/F1, ECE,
trainable parameters (body, head excluded), mean (std) over seeds. Ranking stability: one full
fine-tuning run with checkpoints, the FIM ranking recomputed on each, Spearman/Kendall vs step 0.

Writes ``results.csv`` (one row per task × seed × method), ``summary.csv``, ``stability.csv``,
``surgical.png`` (accuracy per method), ``fim.png`` (FIM per block per task), ``report.md``.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from skillgraft.data import load_kshot  # noqa: E402
from skillgraft.errors import SkillgraftError  # noqa: E402
from skillgraft.evaluate.plots import save_figure  # noqa: E402
from skillgraft.evaluate.predict import evaluate  # noqa: E402
from skillgraft.fisher import FisherConfig, fim_layer_scores, ranking_stability  # noqa: E402
from skillgraft.fisher.plots import layer_scores_bar  # noqa: E402
from skillgraft.io import read_json, write_json  # noqa: E402
from skillgraft.models import build_scorer  # noqa: E402
from skillgraft.models.anatomy import is_carried  # noqa: E402
from skillgraft.recipes import common as C  # noqa: E402
from skillgraft.recipes.base import RunDir, config_hash, recipe  # noqa: E402
from skillgraft.train import AutoRGN, FinetuneConfig, Snapshots, finetune  # noqa: E402

METHODS = ("full", "fim-top", "fim-bottom", "random", "auto-rgn")
METRICS = ["score", "accuracy", "ece", "trainable_parameters"]


def fisher_config(cfg: dict) -> FisherConfig:
    spec = dict(cfg.get("fisher") or {})
    if cfg.get("fisher_examples") is not None:
        spec["n_examples"] = int(cfg["fisher_examples"])
    return C.dataclass_from(FisherConfig, spec, "recipe field 'fisher'")


def methods_of(cfg: dict) -> list[str]:
    methods = cfg.get("methods") or list(METHODS)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SkillgraftError(f"recipe field 'methods': unknown {bad}; known: {list(METHODS)}")
    return list(methods)


def selections(methods: list[str], layers_k: list[int], scores, n_blocks: int, seed: int) -> list[tuple[str, list | None]]:
    """(method label, blocks to train or None for all) in report order."""
    import random  # noqa: PLC0415

    out: list[tuple[str, list | None]] = []
    for m in methods:
        if m in ("full", "auto-rgn"):
            out.append((m, None))
            continue
        for k in layers_k:
            if not 1 <= k <= n_blocks:
                raise SkillgraftError(f"recipe field 'layers_k': {k} is not in 1..{n_blocks} (the model's blocks)")
            if m == "fim-top":
                out.append((f"fim-top-{k}", scores.top(k)))
            elif m == "fim-bottom":
                out.append((f"fim-bottom-{k}", scores.bottom(k)))
            else:
                out.append((f"random-{k}", sorted(random.Random(seed * 1000 + k).sample(range(n_blocks), k))))
    return out


def train_and_test(pre, data, test, config: FinetuneConfig, *, auto_rgn: bool, cache: Path, key: dict) -> dict:
    """Fine-tune a copy of ``pre`` and evaluate it on ``test``; the metrics are cached by ``key``."""
    path = Path(cache) / "surgical" / f"{key['task']}-{key['k']}-{key['seed']}-{config_hash(key)}.json"
    if path.is_file():
        return read_json(path)
    scorer = copy.deepcopy(pre)
    t0 = time.perf_counter()
    res = finetune(scorer, data.train, data.dev, config, k=data.k, progress=False,
                   callbacks=[AutoRGN()] if auto_rgn else [])
    seconds = time.perf_counter() - t0
    metrics, _ = evaluate(res.scorer, test)
    head = sum(p.numel() for n, p in res.scorer.named_parameters() if is_carried(n))
    out = {"score": metrics["score"], "accuracy": metrics["accuracy"], "ece": metrics["ece"],
           "trainable_parameters": res.trainable_parameters - head, "trainable_with_head": res.trainable_parameters,
           "best_dev": res.best_dev, "best_step": res.best_step, "train_seconds": round(seconds, 2)}
    write_json(path, out)
    return out


@recipe("surgical")
def surgical(cfg: dict, run: RunDir) -> dict:
    tasks = cfg.get("tasks") or ["SST-2"]
    seeds = C.seeds_of(cfg)
    k = int(cfg.get("k", 16))
    layers_k = [int(x) for x in cfg.get("layers_k", [1, 2, 3])]
    methods = methods_of(cfg)
    ft_cfg = C.finetune_config(cfg)
    fcfg = fisher_config(cfg)
    aggregate = cfg.get("fisher_aggregate", "sum")
    normalize = bool(cfg.get("fisher_normalize", False))
    mode, model, data_dir = cfg.get("mode", "head"), cfg.get("model"), cfg.get("data_dir")
    rows, fim_rows, fim_plot, timings = [], [], {}, []
    for task in tasks:
        for seed in seeds:
            data = load_kshot(task, k, seed, data_dir)
            test = C.sample(data.test, cfg.get("test_limit"), seed=0)
            pre = build_scorer(model, data.task, mode, pooling=cfg.get("pooling"),
                               max_length=int(cfg.get("max_length", 128)), head_seed=ft_cfg.seed)
            pre.eval()
            t0 = time.perf_counter()
            scores = fim_layer_scores(pre, data.train, aggregate=aggregate, normalize=normalize, config=fcfg)
            fim_seconds = time.perf_counter() - t0
            fim_rows.append({"task": data.task.name, "seed": seed, "ranking": scores.ranking(),
                             "scores": scores.scores, "seconds": round(fim_seconds, 2)})
            fim_plot.setdefault(data.task.name, scores)
            n_blocks = len(scores.scores)
            for label, layers in selections(methods, layers_k, scores, n_blocks, seed):
                config = ft_cfg.replace(layers=layers)
                key = {"task": data.task.name, "k": k, "seed": seed, "model": model, "mode": mode,
                       "pooling": cfg.get("pooling"), "finetune": config.to_dict(), "auto_rgn": label == "auto-rgn",
                       "test_limit": cfg.get("test_limit")}
                m = train_and_test(pre, data, test, config, auto_rgn=label == "auto-rgn", cache=run.cache, key=key)
                rows.append({"task": data.task.name, "seed": seed, "method": label,
                             "blocks": "all" if layers is None else ",".join(map(str, layers)), **m})
            timings.append({"task": data.task.name, "seed": seed, "fisher_seconds": round(fim_seconds, 2),
                            "train_seconds": sum(r["train_seconds"] for r in rows if r["task"] == data.task.name
                                                 and r["seed"] == seed)})
    stability = stability_rows(cfg, run, ft_cfg, fcfg, aggregate, normalize) if cfg.get("stability_steps") else []
    agg = C.aggregate(rows, ["task", "method"], METRICS)
    summary = C.summary_rows(agg, METRICS)
    run.csv("results.csv", rows)
    run.csv("summary.csv", summary)
    run.csv("fim.csv", [{**r, "ranking": " ".join(map(str, r["ranking"])),
                         "scores": " ".join(f"{s:.4g}" for s in r["scores"])} for r in fim_rows])
    if stability:
        run.csv("stability.csv", [{**r, "ranking": " ".join(map(str, r["ranking"]))} for r in stability])
    plot_methods(agg, run.file("surgical.png"))
    layer_scores_bar(fim_plot, run.file("fim.png"), title="FIM per block on the pre-trained model")
    run.report(report(cfg, seeds, agg, fim_rows, stability, timings))
    return {"rows": rows, "summary": summary, "fim": fim_rows, "stability": stability, "timings": timings}


def stability_rows(cfg: dict, run: RunDir, ft_cfg: FinetuneConfig, fcfg: FisherConfig, aggregate: str,
                   normalize: bool) -> list[dict]:
    """Full FT of the first task/seed with checkpoints; FIM ranking on each vs the pre-trained one."""
    task = (cfg.get("tasks") or ["SST-2"])[0]
    seed = C.seeds_of(cfg)[0]
    k = int(cfg.get("k", 16))
    data = load_kshot(task, k, seed, cfg.get("data_dir"))
    scorer = build_scorer(cfg.get("model"), data.task, cfg.get("mode", "head"), pooling=cfg.get("pooling"),
                          max_length=int(cfg.get("max_length", 128)), head_seed=ft_cfg.seed)
    config = ft_cfg.replace(eval_every=0, layers=None)  # no best-dev restore: the last checkpoint is the last step
    steps_total = config.resolved_steps(data.task.num_labels, k)
    wanted = sorted({int(s) for s in cfg["stability_steps"] if int(s) <= steps_total})
    snaps = Snapshots(scorer, [s for s in wanted if s < steps_total])
    finetune(scorer, data.train, None, config, k=k, progress=False, callbacks=[snaps])
    checkpoints = {s: snaps.scorer_at(s) for s in snaps.states}
    if steps_total in wanted:
        checkpoints[steps_total] = scorer
    rows, _ = ranking_stability(checkpoints, data.train, aggregate=aggregate, normalize=normalize, config=fcfg)
    return [{"task": data.task.name, "seed": seed, **r} for r in rows]


def plot_methods(agg: list[dict], path) -> None:
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


def report(cfg: dict, seeds: list[int], agg: list[dict], fim_rows: list[dict], stability: list[dict],
           timings: list[dict]) -> str:
    ft = C.finetune_config(cfg)
    lines = ["# Surgical fine-tuning by FIM score", "",
             C.sizes_line(cfg, seeds, f"fine-tuning {ft.optimizer} lr {ft.lr} for {ft.steps or 'default'} steps, "
                                      f"Fisher {fisher_config(cfg).kind} over "
                                      f"{fisher_config(cfg).n_examples or 'all'} training examples"),
             "",
             "Each method fine-tunes θ_pre with only the listed blocks trainable (+ the head; embeddings "
             "frozen as in full FT). *fim-top-K*: the K blocks of highest FIM score on the pre-trained model; "
             "*fim-bottom-K*: the K lowest; *random-K*: K blocks drawn per seed; *auto-rgn*: all blocks, "
             "per-tensor lr multiplier ‖∇L‖/‖θ‖ normalised by its maximum (Lee et al.). Test score is accuracy "
             "(F1 for MRPC/QQP); mean (std) over seeds; trainable parameters exclude the head.", ""]
    rows = []
    for g in agg:
        params = int(np.mean(g["trainable_parameters"])) if g["trainable_parameters"] else 0
        rows.append([g["task"], g["method"], C.pct(g["score"]), C.pct(g["accuracy"]), C.pct(g["ece"]),
                     f"{params:,}", g["n_seeds"]])
    lines += [C.md_table(["task", "method", "score %", "accuracy %", "ECE %", "trainable (body)", "seeds"], rows), ""]
    lines += ["## Average over tasks", "",
              "Per method: the mean over tasks of the per-task mean score and ECE; *tasks ≥ full* counts the tasks "
              "where the method's mean score is at least full fine-tuning's.", "",
              C.md_table(["method", "score %", "ECE %", "trainable (body)", "tasks ≥ full", "tasks"],
                         task_averages(agg)), ""]
    lines += ["## FIM ranking of the pre-trained model", "",
              C.md_table(["task", "seed", "ranking (high → low)", "scores by block (0, 1, …)", "seconds"],
                         [[r["task"], r["seed"], " ".join(map(str, r["ranking"])),
                           " ".join(f"{s:.3g}" for s in r["scores"]), r["seconds"]] for r in fim_rows]), ""]
    if stability:
        lines += ["## Ranking stability during fine-tuning", "",
                  "The FIM ranking recomputed on checkpoints of one full fine-tuning run "
                  f"({stability[0]['task']}, seed {stability[0]['seed']}); Spearman ρ / Kendall τ against step 0 "
                  "(the pre-trained model with the run's head initialisation) and against the previous checkpoint.",
                  "",
                  C.md_table(["step", "ranking", "Spearman vs step 0", "Kendall vs step 0", "Spearman vs prev",
                              "Kendall vs prev"],
                             [[r["step"], " ".join(map(str, r["ranking"])), f"{r['spearman_vs_first']:.3f}",
                               f"{r['kendall_vs_first']:.3f}", _f(r.get("spearman_vs_prev")),
                               _f(r.get("kendall_vs_prev"))] for r in stability]), ""]
    lines += ["## Time", "", C.md_table(["task", "seed", "Fisher s", "fine-tuning s (all methods)"],
                                         [[t["task"], t["seed"], t["fisher_seconds"], round(t["train_seconds"], 1)]
                                          for t in timings]), "",
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
