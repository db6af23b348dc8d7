"""Random regions: k coordinates drawn uniformly (without replacement) from the graftable universe.

The draw is one seeded permutation π of the universe, so the region of size k is {π_1, …, π_k}:
regions of several sizes from one seed are nested. As scores: s_{π_i} = |U| − i.
"""

from __future__ import annotations

from skillgraft.lazy import torch
from pydantic import Field

from skillgraft.graft.localizers.machinery.base import Localizer, LocalizerOptions
from skillgraft.graft.selection import region_universe
from skillgraft.spec import SEED_MAX


class RandomOptions(LocalizerOptions):
    """Options of the random localizer: the universe, budgets and the draw's seed."""
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of the permutation the coordinates are drawn from")


_CHUNK = 1 << 22  # ranks written 4M at a time (the permutation and the ranks are the only full-size tensors)


class Random(Localizer):
    """k uniformly random graftable coordinates (a seeded permutation's first k)."""

    reads_files = True

    Options = RandomOptions
    summary = "uniformly random coordinates (seeded)"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """A seeded random rank per coordinate: the top-k is a uniform draw of k coordinates."""
        shapes = region_universe(pre, options.graftable)
        sizes = [torch.Size(s).numel() for s in shapes.values()]
        universe = sum(sizes)
        order = torch.randperm(universe, generator=torch.Generator().manual_seed(options.seed))
        rank = torch.empty(universe, dtype=torch.float64)  # exact for universes below 2**53
        for start in range(0, universe, _CHUNK):  # rank[order] = universe … 1, without a third full-size tensor
            stop = min(start + _CHUNK, universe)
            rank[order[start:stop]] = torch.arange(universe - start, universe - stop, -1, dtype=torch.float64)
        del order
        return {n: r.view(s) for (n, s), r in zip(shapes.items(), rank.split(sizes))}
