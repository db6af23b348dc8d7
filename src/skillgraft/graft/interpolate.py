"""Weight-space interpolation: WiSE-FT and WiSE-graft.

WiSE-FT (Wortsman et al., 2022):     θ(α) = θ_pre + α·(θ_ft − θ_pre)
WiSE-graft (grafting paper, §4.2):   θ(α) = θ_pre + α·γ⊙(θ_ft − θ_pre)

Both are written into the pre-trained scorer in place and restored bit-exactly on exit. α = 0 gives
θ_pre and α = 1 gives θ_ft (resp. the graft) exactly (``torch.lerp`` is exact at both ends).

A new task head (head mode) does not exist in θ_pre: ``head="carry"`` (default) uses the fine-tuned head
at every α (as grafting does), so α = 0 is the "head only" model; ``head="interpolate"`` interpolates it
from the pre-trained scorer's (random) head too, so α = 0 is exactly the pre-trained scorer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.models.anatomy import check_compatible, is_carried

HeadPolicy = Literal["carry", "interpolate"]


def _lerp(start: torch.Tensor, end: torch.Tensor, alpha: float) -> torch.Tensor:
    if alpha == 0:
        return start.clone()
    if alpha == 1:
        return end.clone()
    return torch.lerp(start.float(), end.float(), alpha).to(start.dtype)


@contextlib.contextmanager
def interpolate(pre, target, alpha: float, *, head: HeadPolicy = "carry") -> Iterator:
    """Temporarily set ``pre`` to θ_pre + α·(θ_target − θ_pre); yields ``pre``.

    ``target`` is a fine-tuned Scorer (WiSE-FT) or a :class:`Graft` (WiSE-graft: only the region moves).
    """
    if not 0 <= float(alpha) <= 1:
        raise SkillgraftError(f"interpolation weight alpha must be in [0, 1], got {alpha}")
    if head not in ("carry", "interpolate"):
        raise SkillgraftError(f"head must be 'carry' or 'interpolate', got {head!r}")
    alpha = float(alpha)
    params = dict(pre.named_parameters())
    if isinstance(target, Graft):
        target._check_target(pre, force=False)
        ends: dict[str, tuple[torch.Tensor | None, torch.Tensor]] = {}
        for name, idx in target.region.indices.items():
            ends[name] = (idx, target.values[name])
        carried = dict(target.carried)
    else:
        check_compatible(pre, target)
        tparams = dict(target.named_parameters())
        ends = {n: (None, tparams[n].detach()) for n in params if not is_carried(n)}
        carried = {n: tparams[n].detach() for n in params if is_carried(n)}
    backup = {n: params[n].detach().clone() for n in [*ends, *carried]}
    try:
        with torch.no_grad():
            for name, (idx, end) in ends.items():
                p = params[name]
                if idx is None:
                    p.copy_(_lerp(p.detach(), end.to(p.device, p.dtype), alpha))
                else:
                    flat = p.detach().view(-1)  # shares the version counter: cached fingerprints see it
                    i = idx.to(p.device)
                    flat[i] = _lerp(flat[i], end.to(p.device, p.dtype), alpha)
            for name, t in carried.items():
                p = params[name]
                t = t.to(p.device, p.dtype)
                p.copy_(t if head == "carry" else _lerp(p.detach(), t, alpha))
        yield pre
    finally:
        with torch.no_grad():
            for name, old in backup.items():
                params[name].copy_(old)
