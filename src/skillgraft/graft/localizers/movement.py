"""Top-movement: the coordinates that moved most in fine-tuning (γ_base of Eq. 3).

    s_j = |θ_ft,j − θ_pre,j|
"""

from __future__ import annotations

import torch

from skillgraft.graft.localizers.base import Localizer, LocalizerOptions
from skillgraft.graft.localizers.source import fine_tuned
from skillgraft.models.anatomy import Graftable, graftable_names


def movement(pre, ft, graftable: Graftable = "body") -> dict[str, torch.Tensor]:
    """|θ_ft − θ_pre| per graftable tensor (on the CPU); ``ft`` a scorer or its folder (read tensor by tensor)."""
    names = graftable_names(pre, graftable)
    b, a = fine_tuned(ft, pre, names), dict(pre.named_parameters())
    return {n: (b.rows(n).to(a[n].device) - a[n].detach()).abs().cpu() for n in names}


class Movement(Localizer):
    """The top-|θ_ft − θ_pre| coordinates."""

    reads_files = True

    Options = LocalizerOptions
    summary = "top |θ_ft − θ_pre|"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """|θ_ft − θ_pre| per graftable coordinate (γ_base of paper Eq. 3)."""
        return movement(pre, ft, options.graftable)


def per_tensor_quantiles(moved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each coordinate's quantile of |Δ| within its own tensor, in (0, 1] (float64; ties: the later position
    ranks higher inside a tensor, so the global top-k of the quantiles keeps the earliest)."""
    out = {}
    for n, m in moved.items():
        flat = m.reshape(-1).double()
        q = torch.empty_like(flat)
        q[torch.argsort(flat, stable=True)] = torch.arange(1, flat.numel() + 1, dtype=torch.float64) / flat.numel()
        out[n] = q.view(m.shape)
    return out


class TiesTrim(Localizer):
    """TIES's trim as mergekit and PEFT apply it: every tensor keeps its own top fraction of |Δ|.

    s_j = quantile of |Δ_j| within its tensor, so the top-k over the universe keeps ≈ k/|U| of each tensor
    (the original TIES code and Localize-and-Stitch's dataless mask rank |Δ| over the whole flattened task
    vector instead: that is ``movement``).
    """

    reads_files = True

    Options = LocalizerOptions
    summary = "top |θ_ft − θ_pre| within each tensor (TIES trim as mergekit/PEFT apply it)"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        return per_tensor_quantiles(movement(pre, ft, options.graftable))
