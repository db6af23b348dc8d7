"""Top-movement: the coordinates that moved most in fine-tuning (γ_base of Eq. 3).

    s_j = |θ_ft,j − θ_pre,j|
"""

from __future__ import annotations

from collections.abc import Iterator

from skillgraft.lazy import torch

from skillgraft.graft.localizers.machinery.base import Localizer, LocalizerOptions
from skillgraft.graft.localizers.machinery.source import SafetensorsFolder, fine_tuned, row_slices
from skillgraft.models.anatomy import Graftable, graftable_names


def movement(pre, ft, graftable: Graftable = "body") -> dict[str, torch.Tensor]:
    """|θ_ft − θ_pre| per graftable tensor (on the CPU); ``ft`` a scorer or its folder (read tensor by tensor)."""
    return dict(movement_stream(pre, ft, graftable))


def movement_stream(pre, ft, graftable: Graftable = "body") -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`movement` one tensor at a time, in universe order; a folder's tensor is read in row slices into its
    |Δ| (no tensor-sized copy of θ_ft beside it)."""
    names = graftable_names(pre, graftable)
    b, a = fine_tuned(ft, pre, names), dict(pre.named_parameters())
    for n in names:
        theta = a[n].detach()
        if not isinstance(b, SafetensorsFolder) or not theta.dim():
            yield n, (b.rows(n).to(theta.device) - theta).abs().cpu()
            continue
        out = None
        for start, rows in row_slices(b, n):
            part = (rows.to(theta.device) - theta[start:start + len(rows)]).abs_().cpu()
            if out is None:
                out = torch.empty(theta.shape, dtype=part.dtype)
            out[start:start + len(rows)] = part
            del rows, part
        yield n, out


class Movement(Localizer):
    """The top-|θ_ft − θ_pre| coordinates."""

    reads_files = True

    Options = LocalizerOptions
    summary = "top |θ_ft − θ_pre|"

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """|θ_ft − θ_pre| per graftable coordinate (γ_base of paper Eq. 3)."""
        return movement(pre, ft, options.graftable)

    def score_stream(self, pre, ft, data, options, *, progress: bool = False):
        return movement_stream(pre, ft, options.graftable)


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

    def score_stream(self, pre, ft, data, options, *, progress: bool = False):
        return ((n, next(iter(per_tensor_quantiles({n: m}).values())))
                for n, m in movement_stream(pre, ft, options.graftable))
