"""Composing N grafts into one, with a declared policy where their regions overlap (never silent).

All grafts must share a base model (same fingerprint). The composed region is built per coordinate
from the grafts that cover it (its *coverage* c ≥ 1):

* ``error``     — any coordinate with c ≥ 2 is an error (the default: nothing is decided for you).
* ``first``     — the first graft in the list that covers a coordinate gives its value.
* ``average``   — the mean of the covering grafts' values (Localize-and-Stitch's rule for overlaps).
* ``consensus`` — keep only coordinates covered by ≥ ``min_agree`` grafts (default 2), with the mean of
  their values; coordinates only one task marked as significant ("selfish" weights) are dropped. This
  is the consensus mask of TALL masks / Consensus Merging (Wang et al., 2024), with "task t finds this
  coordinate significant" read as "the coordinate is in γ_t".
* ``disjoint``  — keep only coordinates covered by exactly one graft; contested ones (c ≥ 2) stay θ_pre.
* ``max-delta`` — the covering graft with the largest |θ_ft − θ_pre| gives the value (ties: the earlier
  graft); needs ``base``, the θ_pre tensors (a TIES-style "strongest task wins" per coordinate).

Carried tensors (new heads) that collide with different values follow ``carried``: ``error``, ``first``
or ``drop``. What happened (coverage counts, dropped coordinates) is in ``metadata.compose``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region

Policy = Literal["error", "first", "average", "consensus", "disjoint", "max-delta"]
POLICIES = ("error", "first", "average", "consensus", "disjoint", "max-delta")


def compose(grafts: Sequence[Graft], policy: Policy = "error", *, min_agree: int = 2,
            carried: Literal["error", "first", "drop"] = "error",
            base: Mapping[str, torch.Tensor] | None = None) -> Graft:
    """One graft from ``grafts`` (same base model) under an overlap ``policy``; see the module doc.

    ``base``: θ_pre per tensor name (whole tensors), needed by ``max-delta`` only.
    """
    grafts = list(grafts)
    if not grafts:
        raise SkillgraftError("compose needs at least one graft")
    if policy not in POLICIES:
        raise SkillgraftError(f"unknown overlap policy {policy!r}; choose one of {list(POLICIES)}")
    if carried not in ("error", "first", "drop"):
        raise SkillgraftError(f"carried must be error, first or drop, got {carried!r}")
    if policy == "consensus" and not 2 <= min_agree <= max(2, len(grafts)):
        raise SkillgraftError(f"consensus needs 2 ≤ min_agree ≤ {len(grafts)} (number of grafts), got {min_agree}")
    if policy == "max-delta" and base is None:
        raise SkillgraftError("the max-delta overlap policy needs the base model's tensors (base=...)")
    prints = {g.base_fingerprint for g in grafts if g.base_fingerprint}
    if len(prints) > 1:
        raise SkillgraftError(f"grafts learned on different base models cannot be composed "
                              f"(fingerprints {sorted(prints)})")

    shapes: dict[str, tuple[int, ...]] = {}
    for g in grafts:
        for name, shape in g.region.shapes.items():
            if shapes.setdefault(name, shape) != shape:
                raise SkillgraftError(f"grafts disagree on the shape of {name!r}: {shapes[name]} vs {shape}")

    indices, values = {}, {}
    overlap = dropped = 0
    for name in shapes:
        parts = [(i, g.region.indices[name], g.values[name]) for i, g in enumerate(grafts) if name in g.region.indices]
        if not parts:
            continue
        dtype = parts[0][2].dtype
        all_idx = torch.cat([p[1] for p in parts])
        uniq, inverse, counts = torch.unique(all_idx, return_inverse=True, return_counts=True)
        shared = int((counts > 1).sum())
        overlap += shared
        if shared and policy == "error":
            raise SkillgraftError(f"grafts overlap on {shared} coordinate(s) of {name!r}; declare an overlap policy: "
                                  "first, average, consensus, disjoint or max-delta")
        if policy == "max-delta":
            vals = torch.cat([p[2].to(dtype) for p in parts])
            gap = (vals.double() - base[name].detach().reshape(-1).cpu().double()[all_idx]).abs()
            best = torch.full((uniq.numel(),), -1.0, dtype=torch.float64).scatter_reduce(0, inverse, gap, "amax")
            winner = torch.full((uniq.numel(),), all_idx.numel(), dtype=torch.long)
            hits = torch.nonzero(gap == best[inverse]).reshape(-1)  # earliest entry of the largest |Δ| wins
            winner.scatter_reduce_(0, inverse[hits], hits, "amin")
            out, keep = vals[winner], torch.ones(uniq.numel(), dtype=torch.bool)
        elif policy == "first":
            out = torch.empty(uniq.numel(), dtype=dtype)
            start = all_idx.numel()
            for _, idx, val in reversed(parts):  # earlier grafts write last, so they win
                start -= idx.numel()
                out[inverse[start:start + idx.numel()]] = val.to(dtype)
            keep = torch.ones(uniq.numel(), dtype=torch.bool)
        else:
            total = torch.zeros(uniq.numel(), dtype=torch.float64)
            total.index_add_(0, inverse, torch.cat([p[2].double() for p in parts]))
            out = (total / counts.double()).to(dtype)
            keep = counts >= (min_agree if policy == "consensus" else 1)
            if policy == "disjoint":
                keep = counts == 1
        dropped += int((~keep).sum())
        if keep.any():
            indices[name], values[name] = uniq[keep], out[keep]

    merged_carried: dict[str, torch.Tensor] = {}
    conflicts: list[str] = []
    for g in grafts:
        for name, t in g.carried.items():
            if name not in merged_carried:
                merged_carried[name] = t
            elif merged_carried[name].shape != t.shape or not torch.equal(merged_carried[name], t):
                conflicts.append(name)
    if conflicts and carried == "error":
        raise SkillgraftError(f"grafts carry different values for {sorted(set(conflicts))} (e.g. heads of different "
                              "tasks); choose carried='first' (first graft's) or carried='drop'")
    if carried == "drop":
        for name in set(conflicts):
            merged_carried.pop(name, None)

    region = Region(shapes, indices)
    report = {"policy": policy, "grafts": len(grafts), "sizes": [g.size for g in grafts], "size": len(region),
              "overlapping_coordinates": overlap, "dropped_coordinates": dropped,
              "carried_conflicts": sorted(set(conflicts)), "carried_policy": carried}
    if policy == "consensus":
        report["min_agree"] = min_agree
    first = grafts[0]
    return Graft(region, values, merged_carried, first.base_model, first.base_fingerprint,
                 {"composed_of": [g.metadata.to_dict() for g in grafts], "overlap_policy": policy, "compose": report})


def coverage(regions: Sequence[Region]) -> dict[int, int]:
    """How many coordinates are covered by exactly c of ``regions`` (c → count)."""
    if not regions:
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for r in regions:
        shapes.update(r.shapes)
    out: dict[int, int] = {}
    for name in shapes:
        idx = [r.indices[name] for r in regions if name in r.indices]
        if not idx:
            continue
        _, counts = torch.unique(torch.cat(idx), return_counts=True)
        for c, n in zip(*torch.unique(counts, return_counts=True)):
            out[int(c)] = out.get(int(c), 0) + int(n)
    return dict(sorted(out.items()))
