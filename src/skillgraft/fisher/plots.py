"""PNG plots for Fisher analyses: per-layer FIM bar charts and region heatmaps."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from skillgraft.lazy import plt

from skillgraft.evaluate.plots import save_figure
from skillgraft.fisher.scores import LayerScores


def layer_scores_bar(scores: LayerScores | dict[str, LayerScores], path: str | os.PathLike, *, title: str = "") -> Path:
    """Bar chart of FIM score per block (one group of bars per entry when a dict is given)."""
    series = scores if isinstance(scores, dict) else {"FIM": scores}
    n = len(next(iter(series.values())).scores)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * n + 2), 3.4))
    width = 0.8 / len(series)
    for j, (name, s) in enumerate(series.items()):
        x = np.arange(n) + (j - (len(series) - 1) / 2) * width
        ax.bar(x, s.scores, width=width, label=name)
    ax.set_xticks(range(n))
    ax.set_xlabel("transformer block")
    first = next(iter(series.values()))
    ax.set_ylabel(f"FIM score ({first.aggregate}{', per parameter' if first.normalize else ''})")
    if len(series) > 1:
        ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)


def heatmap(matrix: np.ndarray, rows: list[str], cols: list[str], path: str | os.PathLike, *, title: str = "",
            cbar: str = "") -> Path:
    """A labelled heatmap (rows × columns), e.g. graft parameters per layer × module type."""
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(cols) + 2), max(2.5, 0.35 * len(rows) + 1.5)))
    im = ax.imshow(matrix, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    fig.colorbar(im, ax=ax, label=cbar)
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, path)
