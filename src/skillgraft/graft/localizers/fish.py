"""FISH (Sung et al., 2021): the coordinates with the largest diagonal Fisher of θ_pre.

    s_j = F_jj(θ_pre) = E_x E_y [(∂ log p(y|x; θ_pre) / ∂θ_j)²]

In head mode θ_pre's head is random; by default the fine-tuned head is lent to θ_pre for the Fisher
pass only (``head="ft"``) and θ_pre is restored afterwards. Overlap with a learned region: Region.iou.
"""

from __future__ import annotations

from typing import Literal

from skillgraft.lazy import torch
from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal
from skillgraft.graft.localizers.machinery.base import Localizer, LocalizerOptions, examples_of
from skillgraft.graft.localizers.machinery.lending import lent_head
from skillgraft.models.anatomy import graftable_names


class FishOptions(LocalizerOptions):
    """Options of the FISH localizer: the universe, budgets, the Fisher estimate and whose head to lend."""
    head: Literal["ft", "pre"] = Field("ft", description=(
        "whose task head θ_pre wears for the Fisher pass: the fine-tuned model's (ft) or its own (pre)"))
    fisher: FisherConfig = Field(default_factory=FisherConfig, description="how the diagonal Fisher is estimated")


class Fish(Localizer):
    """The top diagonal-Fisher coordinates of θ_pre (over the training examples)."""

    Options = FishOptions
    summary = "top diagonal Fisher of θ_pre (Sung et al., 2021)"

    def needs_labels(self, options) -> str | None:
        return "the Fisher of log p(y|x) over the label set"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """Diagonal Fisher F_jj(θ_pre) over the graftable tensors (the fine-tuned head lent for the pass)."""
        train, _ = examples_of(data)
        if not train:
            raise SkillgraftError("the fish localizer needs training examples for its Fisher pass")
        if options.head == "ft" and ft is None:
            raise SkillgraftError("the fish localizer lends θ_pre the fine-tuned head: give ft, or head='pre'")
        names = graftable_names(pre, options.graftable)
        with lent_head(pre, ft if options.head == "ft" else None):
            return fisher_diagonal(pre, train, options.fisher, names=names, progress=progress)
