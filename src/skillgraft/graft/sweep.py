"""Sparsity sweep (paper Figs. 2/4): test score of grafted regions from 1e-5 to all graftable parameters."""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.data.sampling import load_kshot
from skillgraft.evaluate.predict import evaluate
from skillgraft.graft.graft import Graft
from skillgraft.graft.localizers import LocalizeConfig, get_localizer
from skillgraft.graft.run import _region_cache, _write_csv, learn_regions
from skillgraft.graft.scoring import evaluate_graft
from skillgraft.graft.selection import Budget

LEARNED_MAX = 1e-2  # learned regions beyond this size are top-movement in all but name


def run_sweep(ft_dir: str | os.PathLike, out_dir: str | os.PathLike, *, levels: list[float] | None = None,
              learned: bool = True, steps: int = 100, eval_every: int = 10, sparsity: float = 1e-4,
              test_limit: int | None = None, data_dir: str | None = None, progress: bool = True) -> list[dict]:
    """Score learned, top-movement and random regions at each level; writes ``sweep.csv`` and ``sweep.png``."""
    from skillgraft.train.run import load_finetuned  # noqa: PLC0415

    levels = sorted(levels or [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0])
    out_dir = Path(out_dir)
    ft, pre, cfg = load_finetuned(ft_dir)
    data = load_kshot(ft.task, cfg["k"], cfg["seed"], data_dir or cfg.get("data_dir"), test_limit=test_limit)
    ft_metrics, ft_probs = evaluate(ft, data.test, progress="fine-tuned")
    rows = []
    learned_regions = {}
    small = [lv for lv in levels if lv <= LEARNED_MAX]
    if learned and small:
        config = LocalizeConfig(sparsity=sparsity, steps=steps, budgets=small, eval_every=eval_every)
        key = {"ft": str(Path(ft_dir).resolve()), "sweep": True, "localize": str(config)}
        learned_regions, _ = learn_regions(pre, ft, data, config, _region_cache(out_dir, key), progress)
    for level in levels:
        regions = {"top-movement": get_localizer("movement").region(pre, ft, None, level),
                   "random": get_localizer("random").region(pre, ft, None, level)}
        if Budget.parse(level) in learned_regions:
            regions["learned"] = learned_regions[Budget.parse(level)]
        for name, region in regions.items():
            m, _ = evaluate_graft(pre, Graft.from_models(pre, ft, region), data.test, reference=ft_probs,
                                  progress=f"{name} {level:g}")
            rows.append({"localizer": name, "level": level, "params": len(region), "score": m["score"],
                         "ece": m["ece"], "agreement": m["agreement"], "ft_score": ft_metrics["score"]})
    _write_csv(out_dir / "sweep.csv", rows)
    _plot(rows, ft_metrics["score"], out_dir / "sweep.png", ft.task.name)
    return rows


def _plot(rows: list[dict], ft_score: float, path: Path, task: str) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from skillgraft.evaluate.plots import save_figure  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name in ("learned", "top-movement", "random"):
        pts = sorted((r["level"], r["score"]) for r in rows if r["localizer"] == name)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    ax.axhline(ft_score, color="k", ls="--", lw=1, label="fine-tuned")
    ax.set_xscale("log")
    ax.set_xlabel("region size (fraction of graftable parameters)")
    ax.set_ylabel("test score")
    ax.set_title(f"{task}: graft score vs sparsity")
    ax.legend(fontsize=8)
    save_figure(fig, path)
