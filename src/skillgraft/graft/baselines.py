"""Baseline localizers: regions of a given size built without learning.

* ``top_movement`` — the k coordinates with the largest |θ_ft − θ_pre| (γ_base of Eq. 3).
* ``random_region`` — k coordinates drawn uniformly from the graftable universe.
* ``bias_region`` — the k bias coordinates that moved most (all biases when k is None).
Lottery-ticket-zero is not a region but a way to apply one: ``Graft.apply(model, outside="zero")``.
"""

from __future__ import annotations

import torch

from skillgraft.errors import SkillgraftError
from skillgraft.models.anatomy import Graftable, check_compatible, graftable_names
from skillgraft.graft.localize import top_k_masks
from skillgraft.graft.region import Region


def size_from(budget: float | int, universe: int) -> int:
    """A region size from a fraction of the universe (float in (0, 1]) or a count (int ≥ 1)."""
    if isinstance(budget, bool):
        raise SkillgraftError("budget must be a number")
    if isinstance(budget, int) and budget >= 1:
        if budget > universe:
            raise SkillgraftError(f"budget {budget} exceeds the {universe} graftable parameters")
        return budget
    if not 0 < float(budget) <= 1:
        raise SkillgraftError(f"budget {budget} is impossible: give a fraction in (0, 1] or a count ≥ 1")
    return max(1, int(round(float(budget) * universe)))


def movement(pre, ft, graftable: Graftable = "body") -> dict[str, torch.Tensor]:
    """|θ_ft − θ_pre| per graftable tensor."""
    names = graftable_names(pre, graftable)
    check_compatible(pre, ft, names)
    a, b = dict(pre.named_parameters()), dict(ft.named_parameters())
    return {n: (b[n].detach() - a[n].detach()).abs().cpu() for n in names}


def top_movement(pre, ft, budget: float | int, graftable: Graftable = "body") -> Region:
    move = movement(pre, ft, graftable)
    k = size_from(budget, sum(m.numel() for m in move.values()))
    return Region.from_masks(top_k_masks(move, k))


def random_region(pre, budget: float | int, graftable: Graftable = "body", seed: int = 0) -> Region:
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in set(graftable_names(pre, graftable))}
    universe = sum(torch.Size(s).numel() for s in shapes.values())
    k = size_from(budget, universe)
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(universe, generator=gen)[:k].sort().values
    out, start = {}, 0
    for n, s in shapes.items():
        size = torch.Size(s).numel()
        sel = chosen[(chosen >= start) & (chosen < start + size)] - start
        out[n] = sel
        start += size
    return Region(shapes, out)


def bias_region(pre, ft, budget: float | int | None = None) -> Region:
    """Bias coordinates: all of them, or the ``budget`` that moved most (BitFit-shaped region)."""
    move = movement(pre, ft, "bias")
    if not move:
        raise SkillgraftError("this model has no bias parameters")
    if budget is None:
        return Region.full({n: tuple(m.shape) for n, m in move.items()})
    return Region.from_masks(top_k_masks(move, size_from(budget, sum(m.numel() for m in move.values()))))


def region_universe(pre, graftable: Graftable = "body") -> dict[str, tuple[int, ...]]:
    names = set(graftable_names(pre, graftable))
    return {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
