"""Grafting end to end: learn regions from a fine-tuning run, compare them with baselines, write a report.

``run_graft(ft_dir, out_dir)`` reuses one localization trajectory for several budgets, builds every
graft, scores each on the test set beside the pre-trained model, the head-only baseline (standard FT),
the fine-tuned model and matched-size baselines (top-movement, random, bias-only, lottery-ticket-zero),
and writes ``grafts/<name>/`` (graft files), ``metrics.json``, ``results.csv``, plots and ``report.md``.
Finished stages are reused: the localization result is cached in ``out_dir/.cache``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from skillgraft.data.sampling import load_kshot
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.metrics import summarize
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram
from skillgraft.evaluate.predict import evaluate, labels_of
from skillgraft.graft.graft import Graft
from skillgraft.graft.localizers import LocalizeConfig, get_localizer, localize
from skillgraft.graft.region import Region
from skillgraft.graft.scoring import evaluate_graft
from skillgraft.graft.selection import Budget
from skillgraft.io import atomic_path, read_json, write_json


def _region_cache(out_dir: Path, key: dict) -> Path:
    from skillgraft.io import config_hash  # noqa: PLC0415

    return out_dir / ".cache" / f"localize-{config_hash(key)}"


def learn_regions(pre, ft, data, config: LocalizeConfig, cache_dir: Path | None = None,
                  progress: bool = True) -> tuple[dict[Budget, Region], dict]:
    """Localize once (or load the cached result); returns regions by budget and a summary."""
    if cache_dir is not None and (cache_dir / "summary.json").is_file():
        summary = read_json(cache_dir / "summary.json")  # keys: Budget.key ("budget=…" in older caches)
        return {Budget.parse(k.removeprefix("budget=")): Region.load(cache_dir / k) for k in summary["keys"]}, summary
    t0 = time.perf_counter()
    res = localize(pre, ft, data.train, data.dev, config, progress=progress)
    found = res.summary
    summary = {"keys": found["budgets"], "best_step": found["best_step"], "best_train_dev_acc": found["best_score"],
               "base_size": res.base_size, "step_seconds": res.step_seconds,
               "seconds": time.perf_counter() - t0, "history": res.history, "config": config.to_dict()}
    if cache_dir is not None:
        for k, region in res.regions.items():
            region.save(cache_dir / k.key)
        write_json(cache_dir / "summary.json", summary)
    return res.regions, summary


def graft_label(key: Budget) -> str:
    return "graft (rounded γ)" if key.rounding else f"graft {key.label}"


def run_graft(ft_dir: str | os.PathLike, out_dir: str | os.PathLike, *, config: LocalizeConfig | None = None,
              data_dir: str | None = None, test_limit: int | None = None, baselines: bool = True,
              progress: bool = True) -> dict:
    """Learn grafts from the fine-tuning run ``ft_dir`` and compare them; returns the metrics."""
    from skillgraft.train.run import load_finetuned  # noqa: PLC0415

    config = config or LocalizeConfig()
    out_dir = Path(out_dir)
    ft, pre, ft_cfg = load_finetuned(ft_dir)
    task = ft.task
    data = load_kshot(task, ft_cfg["k"], ft_cfg["seed"], data_dir or ft_cfg.get("data_dir"), test_limit=test_limit)
    key = {"ft": str(Path(ft_dir).resolve()), "ft_metrics_mtime": os.path.getmtime(Path(ft_dir) / "metrics.json"),
           "localize": config.to_dict()}
    regions, summary = learn_regions(pre, ft, data, config, _region_cache(out_dir, key), progress)
    labels = labels_of(data.test)
    positive = task.labels.index(task.positive_label) if task.positive_label else 1

    def score(probs: np.ndarray, reference: np.ndarray | None) -> dict:
        return summarize(probs, labels, metric=task.metric, positive=positive, reference=reference)

    rows: list[dict] = []
    probs_by: dict[str, np.ndarray] = {}
    ft_metrics, ft_probs = evaluate(ft, data.test, progress="fine-tuned")
    pre_metrics, pre_probs = evaluate(pre, data.test, progress="pre-trained")
    total = sum(p.numel() for p in pre.model.parameters())
    universe = next(iter(regions.values())).universe_size
    rows.append({"model": "pre-trained", "params": 0, **score(pre_probs, ft_probs)})
    rows.append({"model": "fine-tuned", "params": universe, **ft_metrics, "agreement": 1.0})
    probs_by["fine-tuned"] = ft_probs
    empty = Region.empty(next(iter(regions.values())).shapes)
    head_only = None
    if ft.mode == "head":
        head_only = Graft.from_models(pre, ft, empty)
        m, _ = evaluate_graft(pre, head_only, data.test, reference=ft_probs, progress="head only")
        rows.append({"model": "head only", "params": 0, **m})
    grafts_dir = out_dir / "grafts"
    for key_name, region in regions.items():
        label = graft_label(key_name)
        meta = {"task": task.name, "mode": ft.mode, "k": ft_cfg["k"], "seed": ft_cfg["seed"], "localizer": "learned",
                "region": key_name.key, "localize": config.to_dict(), "finetuned_run": str(ft_dir)}
        graft = Graft.from_models(pre, ft, region, meta)
        folder = "round" if key_name.rounding else f"budget-{key_name.label}"
        path = graft.save_pretrained(grafts_dir / folder, overwrite=True)  # re-runs
        m, probs = evaluate_graft(pre, graft, data.test, reference=ft_probs, progress=label)
        probs_by[label] = probs
        rows.append({"model": label, "params": len(region), "file_bytes": (path / "graft.safetensors").stat().st_size,
                     **m})
        if not baselines:
            continue
        size = len(region)
        candidates = {"top-movement": lambda: get_localizer("movement").region(pre, ft, None, size,
                                                                                {"graftable": config.graftable}),
                      "random": lambda: get_localizer("random").region(pre, ft, None, size,
                                                                        {"graftable": config.graftable,
                                                                         "seed": config.seed}),
                      "bias-only": lambda: get_localizer("bias").region(pre, ft, None, size)}
        for base_name, make in candidates.items():
            try:
                base_region = make()
            except SkillgraftError:
                continue  # e.g. more coordinates than the model has biases
            m, _ = evaluate_graft(pre, Graft.from_models(pre, ft, base_region), data.test, reference=ft_probs,
                                  progress=f"{base_name} @{size}")
            rows.append({"model": f"{base_name} @ {label}", "params": size, **m})
        m, _ = evaluate_graft(pre, graft, data.test, reference=ft_probs, outside="zero", progress="lottery-zero")
        rows.append({"model": f"lottery-ticket-zero @ {label}", "params": size, **m})
    head_score = next((r["score"] for r in rows if r["model"] == "head only"), None)
    for r in rows:
        r["density"] = r["params"] / universe if universe else 0.0
        r["share_of_ft"] = r["score"] / ft_metrics["score"] if ft_metrics["score"] else 0.0
        if head_score is not None and ft_metrics["score"] != head_score:
            r["gap_closed"] = (r["score"] - head_score) / (ft_metrics["score"] - head_score)
    metrics = {"task": task.name, "k": ft_cfg["k"], "seed": ft_cfg["seed"], "test_n": len(data.test),
               "graftable_parameters": universe, "total_parameters": total, "localization": summary,
               "carried_parameters": head_only.carried_size if head_only else 0, "rows": rows}
    write_json(out_dir / "metrics.json", metrics)
    _write_csv(out_dir / "results.csv", rows)
    confidence_histogram(probs_by, out_dir / "confidence.png", title=f"{task.name} test: confidence")
    reliability_diagram({k: (v, labels) for k, v in probs_by.items()}, out_dir / "reliability.png",
                        title=f"{task.name} test: reliability")
    _size_plot(rows, out_dir / "accuracy_vs_size.png", task.metric)
    with atomic_path(out_dir / "report.md") as tmp:
        tmp.write_text(report_markdown(metrics))
    return metrics


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv  # noqa: PLC0415

    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def _size_plot(rows: list[dict], path: Path, metric: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from skillgraft.evaluate.plots import save_figure  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    groups: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["params"] and r["model"] != "fine-tuned":
            kind = r["model"].split(" @ ")[0] if " @ " in r["model"] else "learned graft"
            groups.setdefault(kind, []).append((r["params"], r["score"]))
    for kind, pts in groups.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=kind)
    for r in rows:
        if r["model"] in ("fine-tuned", "head only", "pre-trained"):
            ax.axhline(r["score"], ls="--", lw=1, color={"fine-tuned": "k", "head only": "gray"}.get(r["model"], "r"),
                       label=r["model"])
    ax.set_xscale("log")
    ax.set_xlabel("grafted parameters")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def report_markdown(metrics: dict) -> str:
    """The grafting report: one table (score, ECE, agreement with FT, parameters, file size) and plots."""
    metric = "F1" if any("f1" in r for r in metrics["rows"]) else "accuracy"
    loc = metrics["localization"]
    lines = [f"# Grafting report — {metrics['task']}, {metrics['k']}-shot, data seed {metrics['seed']}", "",
             f"Test examples: {metrics['test_n']}. Graftable parameters (body): {metrics['graftable_parameters']:,} "
             f"of {metrics['total_parameters']:,}. Carried task head: {metrics['carried_parameters']:,} parameters "
             "(travels whole with every graft; counted separately).", "",
             f"Localization: {loc['config']['steps']} steps, lr {loc['config']['lr']:g}, base patch "
             f"{loc['base_size']:,} coordinates (sparsity {loc['config']['sparsity']:g}), "
             f"{loc['step_seconds']:.2f} s/step, best step {loc['best_step']}.", "",
             f"| model | params | density | {metric} | share of FT | gap closed | ECE | agreement w/ FT | file |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in metrics["rows"]:
        gap = f"{r['gap_closed']:.2f}" if "gap_closed" in r else "-"
        size = f"{r['file_bytes'] / 1024:.1f} KiB" if r.get("file_bytes") else "-"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['density']:.2e} | {r['score']:.4f} | "
                     f"{r['share_of_ft']:.3f} | {gap} | {r['ece']:.4f} | {r.get('agreement', 1.0):.3f} | {size} |")
    lines += ["", "*share of FT* = score ÷ fine-tuned score; *gap closed* = (score − head-only) ÷ (FT − head-only); "
              "ECE: 10 equal-width bins over the max probability (Guo et al.).", "",
              "![confidence](confidence.png)", "", "![reliability](reliability.png)", "",
              "![accuracy vs size](accuracy_vs_size.png)", ""]
    return "\n".join(lines)

