"""Where a region's parameters sit: counts per layer × module type (paper Figs. 9/10)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from skillgraft.evaluate.rows import Row
from skillgraft.graft.region import Region, module_type

_LAYER = re.compile(r"\.(?:layer|layers|h|block|blocks)\.(\d+)\.")


def layer_of(name: str) -> str:
    """``layer 3`` for a parameter inside block 3 (delimited match: ``layer.1.`` never matches ``layer.10.``)."""
    m = _LAYER.search(name)
    return f"layer {int(m.group(1))}" if m else ("embeddings" if module_type(name) == "embeddings" else "other")


def kind_of(name: str) -> str:
    kind = module_type(name)
    if name.endswith("bias") and kind not in ("layernorm",):
        return f"{kind} (bias)"
    return kind


@dataclass
class Distribution(Row):
    """Where a region sits (distribution.json): its size, the module types, and per layer each module type's
    grafted coordinates (``table``) and parameters (``universe``); layers and module types are data keys."""

    size: int
    module_types: list[str]
    table: dict[str, dict[str, int]]
    universe: dict[str, dict[str, int]]

    def columns(self) -> dict:
        return {"size": self.size, "module_types": self.module_types, "table": self.table, "universe": self.universe}


@dataclass
class Comparison(Row):
    """A region (A) against another (B): shared coordinates, |A∩B|/|B|, |A∩B|/|A| and IoU."""

    shared: int
    overlap: float
    overlap_of_self: float
    iou: float

    @classmethod
    def of(cls, a: Region, b: Region) -> Comparison:
        return cls(len(a & b), a.overlap(b), b.overlap(a), a.iou(b))

    def columns(self) -> dict:
        return {"shared": self.shared, "overlap": self.overlap, "overlap_of_self": self.overlap_of_self,
                "iou": self.iou}


def distribution(region: Region) -> Distribution:
    """Coordinates of ``region`` per layer × module type, and the parameters there (:class:`Distribution`)."""
    table: dict[str, dict[str, int]] = {}
    universe: dict[str, dict[str, int]] = {}
    for name, shape in region.shapes.items():
        layer, kind = layer_of(name), kind_of(name)
        n = int(np.prod(shape))
        universe.setdefault(layer, {}).setdefault(kind, 0)
        universe[layer][kind] += n
        table.setdefault(layer, {}).setdefault(kind, 0)
        table[layer][kind] += int(region.indices[name].numel()) if name in region.indices else 0
    order = sorted(table, key=lambda s: (s != "embeddings", s.startswith("other"),
                                         int(s.split()[1]) if s.startswith("layer ") else 0))
    kinds = sorted({k for row in table.values() for k in row})
    return Distribution(len(region), kinds, {k: table[k] for k in order}, {k: universe[k] for k in order})


def plot_distribution(dist: Distribution, path: str | os.PathLike, title: str = "") -> Path:
    """Heatmap of grafted parameters per layer × module type (share of that cell's parameters)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from skillgraft.evaluate.plots import save_figure  # noqa: PLC0415

    layers, kinds = list(dist.table), dist.module_types
    counts = np.array([[dist.table[l].get(k, 0) for k in kinds] for l in layers], dtype=float)
    sizes = np.array([[dist.universe[l].get(k, 0) for k in kinds] for l in layers], dtype=float)
    share = np.divide(counts, sizes, out=np.zeros_like(counts), where=sizes > 0)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(kinds), 1.0 + 0.45 * len(layers)))
    im = ax.imshow(share, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(kinds)), kinds, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(layers)), layers, fontsize=8)
    for i in range(len(layers)):
        for j in range(len(kinds)):
            if counts[i, j]:
                ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, ax=ax, label="share of parameters grafted")
    ax.set_title(title or "graft distribution", fontsize=10)
    return save_figure(fig, path)
