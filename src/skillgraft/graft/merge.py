"""Merging several fine-tuned models of one base by stitching their localized regions (Localize-and-Stitch).

Each task t has a graft: a region γ_t and θ_ft,t on it. The stitched body is

    θ_merged = θ_pre + Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t,      τ_t = θ_ft,t − θ_pre        (He et al., 2024, Eq. 4)

i.e. θ_pre outside ∪γ_t, θ_ft,t where only task t claims a coordinate, and an overlap *rule* where several
do (:mod:`skillgraft.graft.compose`): ``average`` (the equation above), ``max-delta`` (the task with the
largest |τ_t| wins), ``disjoint`` (contested coordinates stay θ_pre), ``consensus``, ``first``. Each task
keeps its own head (carried tensors): the merged model is one shared body plus one head per task.

:func:`scaled` gives the stitch a strength λ, as task arithmetic has one (L&S's "sparse task arithmetic"):

    θ_merged(λ) = θ_pre + λ Σ_t (γ_t ⊘ Σ_s γ_s) ⊙ τ_t                          (λ = 1: Eq. 4)

This module is core (no pipeline imports): the stitch, a task's view of it, and :func:`swapped`, which runs a
model with another body (a stitched or a mergekit-merged one) and restores it bit-exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from skillgraft.lazy import torch
from skillgraft.lazy import nn

from skillgraft.errors import SkillgraftError
from skillgraft.graft.compose import compose
from skillgraft.graft.graft import Graft
from skillgraft.graft.graft_file import GraftMetadata

RULES = ("average", "max-delta", "disjoint", "consensus", "first")


def stitch(grafts: Sequence[Graft], rule: str = "average", *, base: Mapping[str, torch.Tensor] | None = None) -> Graft:
    """The stitched body of ``grafts`` (their regions' union, overlaps resolved by ``rule``), without heads.

    ``base``: θ_pre per graft tensor name, needed by ``max-delta``. The stitch's metadata records the rule,
    each graft's size and how many coordinates were contested / dropped.
    """
    if rule not in RULES:
        raise SkillgraftError(f"unknown overlap rule {rule!r}; choose one of {', '.join(RULES)}")
    if len(grafts) < 2:
        raise SkillgraftError(f"stitching needs at least two grafts, got {len(grafts)}")
    bodies = [Graft(g.region, g.values, {}, g.base_model, g.base_fingerprint, g.metadata, g.source) for g in grafts]
    merged = compose(bodies, rule, base=base)
    merged.metadata = GraftMetadata(stitch=merged.metadata.compose | {"rule": rule},
                                    tasks=[g.metadata.merge_task or g.metadata.task for g in grafts])
    return merged


def scaled(body: Graft, scale: float, base: Mapping[str, torch.Tensor]) -> Graft:
    """``body`` with strength λ = ``scale``: θ_pre + λ (v − θ_pre) on its region (``base``: θ_pre per tensor name).

    λ = 1 returns ``body`` itself; the metadata records λ as ``stitch["scale"]``.
    """
    if not scale > 0:
        raise SkillgraftError(f"a stitch's scale must be > 0, got {scale}")
    if scale == 1:
        return body
    missing = [n for n in body.region.indices if n not in base]
    if missing:
        raise SkillgraftError(f"scaling a stitch needs θ_pre of every region tensor; missing {missing[:3]}")
    values = {}
    for name, idx in body.region.indices.items():
        pre = base[name].detach().reshape(-1).cpu()[idx].double()
        values[name] = (pre + scale * (body.values[name].double() - pre)).to(body.values[name].dtype)
    meta = body.metadata.updated(stitch={**(getattr(body.metadata, "stitch", None) or {}), "scale": scale})
    return Graft(body.region, values, body.carried, body.base_model, body.base_fingerprint, meta, body.source)


def task_view(body: Graft, graft: Graft) -> Graft:
    """The stitched ``body`` with the head ``graft`` carries: what task ``graft`` runs on the merged model."""
    return Graft(body.region, body.values, graft.carried, body.base_model, body.base_fingerprint,
                 body.metadata.updated(task=graft.metadata.task, mode=graft.metadata.mode))


@contextlib.contextmanager
def swapped(module: nn.Module, state: Mapping[str, torch.Tensor]) -> Iterator[nn.Module]:
    """Run ``module`` with the tensors of ``state`` (its own names) written in; restored bit-exactly on exit.

    Every name must be a parameter or buffer of ``module`` with the same shape (checked before any write).
    """
    own = module.state_dict(keep_vars=True)
    unknown = [n for n in state if n not in own]
    if unknown:
        raise SkillgraftError(f"{len(unknown)} merged tensor(s) are not in the model, e.g. {unknown[:3]}")
    bad = [n for n, t in state.items() if tuple(t.shape) != tuple(own[n].shape)]
    if bad:
        raise SkillgraftError(f"merged tensor {bad[0]!r} has shape {tuple(state[bad[0]].shape)}, the model's "
                              f"{tuple(own[bad[0]].shape)}")
    saved: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name, t in state.items():
                target = own[name].detach()
                saved[name] = target.clone()
                target.copy_(t.to(target.device, target.dtype))
        yield module
    finally:
        with torch.no_grad():
            for name, old in saved.items():
                own[name].detach().copy_(old)
