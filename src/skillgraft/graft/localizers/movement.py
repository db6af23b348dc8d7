"""Top-movement: the coordinates that moved most in fine-tuning (γ_base of Eq. 3).

    s_j = |θ_ft,j − θ_pre,j|
"""

from __future__ import annotations

import torch

from skillgraft.graft.localizers.base import Localizer, LocalizerOptions
from skillgraft.models.anatomy import Graftable, check_compatible, graftable_names


def movement(pre, ft, graftable: Graftable = "body") -> dict[str, torch.Tensor]:
    """|θ_ft − θ_pre| per graftable tensor (on the CPU)."""
    names = graftable_names(pre, graftable)
    check_compatible(pre, ft, names)
    a, b = dict(pre.named_parameters()), dict(ft.named_parameters())
    return {n: (b[n].detach() - a[n].detach()).abs().cpu() for n in names}


class Movement(Localizer):
    """The top-|θ_ft − θ_pre| coordinates."""

    Options = LocalizerOptions
    summary = "top |θ_ft − θ_pre|"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """|θ_ft − θ_pre| per graftable coordinate (γ_base of paper Eq. 3)."""
        return movement(pre, ft, options.graftable)
