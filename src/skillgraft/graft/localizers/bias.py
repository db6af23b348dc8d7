"""Bias-only regions: the bias coordinates that moved most (a BitFit-shaped region).

    s_j = |θ_ft,j − θ_pre,j| for j in a bias tensor of the universe; other coordinates are never chosen.

A fractional budget is a fraction of the whole universe (``graftable``), as for every localizer; use
``graftable="bias"`` to make the biases the universe.
"""

from __future__ import annotations

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery.base import Localizer, LocalizerOptions
from skillgraft.graft.localizers.movement import movement


class Bias(Localizer):
    """The bias coordinates with the largest |θ_ft − θ_pre|."""

    reads_files = True

    Options = LocalizerOptions
    summary = "biases with the largest |θ_ft − θ_pre|"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """|θ_ft − θ_pre| on the bias tensors only (other tensors are not scored)."""
        scores = {n: s for n, s in movement(pre, ft, options.graftable).items() if n.endswith("bias")}
        if not scores:
            raise SkillgraftError(f"this model has no bias parameters in its {options.graftable!r} tensors")
        return scores
