"""DARE (Yu et al., 2024) as a reference beside regions: drop Δ at random and rescale what is left.

    θ = θ_pre + m ⊙ Δ / (1 − p),    density 1 − p = k / |U|

m is a uniform draw of exactly k coordinates of the graftable universe (the ``random`` localizer's region of
that size, so the draws of one seed are nested), i.e. DARE's Bernoulli(1 − p) mask conditioned on its size.
Unlike a graft, the kept coordinates carry Δ/(1 − p), not θ_ft: DARE is not a subset of Δ, and a report
lists it as a reference, never as a region.
"""

from __future__ import annotations

from collections.abc import Callable

from skillgraft.lazy import torch

from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region


def dare_values(pre, ft, universe: int) -> Callable[[Region], dict[str, torch.Tensor]]:
    """values(region) = θ_pre + Δ · |U| / |region| on the region's coordinates (DARE's rescaled Δ)."""
    p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())

    def values(region: Region) -> dict[str, torch.Tensor]:
        scale = universe / max(1, len(region))
        out = {}
        for n, idx in region.indices.items():
            a = p_pre[n].detach().reshape(-1)[idx.to(p_pre[n].device)].double()
            b = p_ft[n].detach().reshape(-1)[idx.to(p_ft[n].device)].double()
            out[n] = (a + (b - a) * scale).to(p_ft[n].dtype).cpu()
        return out

    return values


def dare_graft(pre, ft, region: Region, metadata: dict | None = None) -> Graft:
    """θ_pre + m ⊙ Δ/(1 − p) with m = ``region`` and 1 − p = |region| / |U| (the task head carried as usual)."""
    graft = Graft.from_models(pre, ft, region, metadata)
    values = dare_values(pre, ft, region.universe_size)(region)
    return Graft(region, values, graft.carried, graft.base_model, graft.base_fingerprint,
                 graft.metadata.updated(dare=True))
