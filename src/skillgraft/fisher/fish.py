"""FISH localizer (Sung et al., 2021): the k graftable coordinates with the largest Fisher on θ_pre.

    γ_FISH = top-k_j F_jj(θ_pre),     overlap with a learned region γ:  IoU = |γ_FISH ∩ γ| / |γ_FISH ∪ γ|

In head mode the pre-trained scorer's head is random; ``head_from`` lends it a trained head (e.g. the
fine-tuned model's) for the Fisher pass only, and restores it afterwards.
"""

from __future__ import annotations

import torch

from skillgraft.data.loading import Example
from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal
from skillgraft.graft.baselines import size_from
from skillgraft.models.anatomy import Graftable, carried_names, graftable_names
from skillgraft.graft.localize import top_k_masks
from skillgraft.graft.region import Region


def fish_scores(pre, examples: list[Example], *, graftable: Graftable = "body", config: FisherConfig | None = None,
                head_from=None, progress: bool | str = False) -> dict[str, torch.Tensor]:
    """Diagonal Fisher of the pre-trained scorer over its graftable tensors."""
    names = graftable_names(pre, graftable)
    backup = {}
    if head_from is not None:
        src = dict(head_from.named_parameters())
        with torch.no_grad():
            for n, p in pre.named_parameters():
                if n in carried_names(pre):
                    backup[n] = p.detach().clone()
                    p.copy_(src[n])
    try:
        return fisher_diagonal(pre, examples, config or FisherConfig(), names=names, progress=progress)
    finally:
        with torch.no_grad():
            params = dict(pre.named_parameters())
            for n, v in backup.items():
                params[n].copy_(v)


def fish_region(pre, examples: list[Example] | None = None, budget: float | int = 1e-4, *,
                graftable: Graftable = "body", config: FisherConfig | None = None, head_from=None,
                scores: dict[str, torch.Tensor] | None = None, progress: bool | str = False) -> Region:
    """Exactly k = size_from(budget) coordinates of top Fisher (pass ``scores`` to reuse a Fisher)."""
    if scores is None:
        scores = fish_scores(pre, examples or [], graftable=graftable, config=config, head_from=head_from,
                             progress=progress)
    k = size_from(budget, sum(s.numel() for s in scores.values()))
    return Region.from_masks(top_k_masks(scores, k))


def fish_iou(fish: Region, learned: Region) -> float:
    """|γ_FISH ∩ γ| / |γ_FISH ∪ γ| (paper Table 8)."""
    return fish.iou(learned)
