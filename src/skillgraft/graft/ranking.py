"""A nested family of regions from one ranking: γ_k = the first k coordinates of a strict order over the graftable
coordinates (a score-based localizer's scores, or the learned localizer's order at the end of a trajectory). The keep
search (:mod:`skillgraft.keep.search`) walks it."""

from __future__ import annotations

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.region import Region, numel_of

Shapes = dict[str, tuple[int, ...]]


class Ranking:
    """A strict order over (a subset of) the graftable coordinates, best first: the nested family γ_k = first k.

    ``order`` holds flat positions in the universe (tensors in ``shapes`` order, row-major inside each).
    Ties follow the shared selection's rule (the earlier position wins), so ``region(k)`` equals
    ``select(scores, k)`` for the scores it was built from.
    """

    def __init__(self, shapes: Shapes, order: torch.Tensor):
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        self.order = order.reshape(-1).to(torch.int64).cpu()
        self.universe = sum(numel_of(s) for s in self.shapes.values())
        self._starts = torch.tensor([0] + [numel_of(s) for s in self.shapes.values()]).cumsum(0)

    @classmethod
    def from_keys(cls, shapes: Shapes, positions: torch.Tensor, keys: torch.Tensor, *,
                  first: torch.Tensor | None = None, then: torch.Tensor | None = None) -> Ranking:
        """Coordinates at flat ``positions`` ranked by ``keys`` (higher first; NaN highest; ties: earlier first).

        With a boolean ``first``, those coordinates come first (by ``keys``) and the rest follow by ``then``."""
        positions = positions.reshape(-1).to(torch.int64).cpu()
        if first is None:
            return cls(shapes, _order(positions, keys))
        first = first.reshape(-1).cpu().bool()
        then = keys if then is None else then
        return cls(shapes, torch.cat([_order(positions[first], keys.reshape(-1).cpu()[first]),
                                      _order(positions[~first], then.reshape(-1).cpu()[~first])]))

    @classmethod
    def from_scores(cls, scores: dict[str, torch.Tensor], shapes: Shapes | None = None) -> Ranking:
        """The ranking of a score-based localizer's scores (which may cover only some tensors of ``shapes``)."""
        shapes = {n: tuple(s.shape) for n, s in scores.items()} if shapes is None else dict(shapes)
        offsets, start = {}, 0
        for n, s in shapes.items():
            offsets[n] = start
            start += numel_of(s)
        for n, s in scores.items():
            if n not in shapes or tuple(shapes[n]) != tuple(s.shape):
                raise SkillgraftError(f"scores for {n!r} of shape {tuple(s.shape)} do not fit the universe "
                                      f"({shapes.get(n, 'absent')})")
        names = [n for n in shapes if n in scores]
        positions = torch.cat([torch.arange(numel_of(shapes[n])) + offsets[n] for n in names])
        keys = torch.cat([scores[n].reshape(-1).detach().cpu().to(torch.float64) for n in names])
        return cls.from_keys(shapes, positions, keys)

    def __len__(self) -> int:
        """How many coordinates the ranking orders (the largest region it gives)."""
        return int(self.order.numel())

    def region(self, k: int) -> Region:
        """γ_k: the first k coordinates of the ranking."""
        chosen = torch.sort(self.order[:max(0, min(k, len(self)))]).values
        which = torch.searchsorted(self._starts, chosen, right=True) - 1
        indices = {}
        for i, n in enumerate(self.shapes):
            part = chosen[which == i]
            if part.numel():
                indices[n] = part - self._starts[i]
        return Region(self.shapes, indices)


def _order(positions: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``positions`` sorted by ``keys``, higher first (NaN highest), ties by the smaller position."""
    keys = torch.nan_to_num(keys.reshape(-1).to(torch.float64), nan=float("inf"), posinf=float("inf"),
                            neginf=float("-inf"))
    by_position = torch.argsort(positions, stable=True)
    positions, keys = positions[by_position], keys[by_position]
    return positions[torch.argsort(-keys, stable=True)]
