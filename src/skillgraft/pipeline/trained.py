"""Baselines trained from θ_pre — graft re-training, BitFit, LoRA, IA³ — stored as grafts in the Store.

Any model trained from θ_pre that keeps θ_pre's tensor names (a re-trained region, BitFit, a merged
adapter) is a weight delta: :func:`delta_graft` stores exactly the coordinates it changed (+ its new
head) as a :class:`Graft`, so it is cached, applied and reverted like any graft. Entries live in the
one :class:`~skillgraft.pipeline.store.Store` (kind ``trained``), keyed by the member's identity, the
method and its resolved settings.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from skillgraft.lazy import torch
from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.models.anatomy import fingerprint, is_carried
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.store import Store
from skillgraft.pipeline.variants import Variant
from skillgraft.spec import Spec
from skillgraft.train import FinetuneConfig
from skillgraft.train.adapters import AdapterConfig

# Each method's usual optimizer settings (a partial ``finetune`` mapping is merged onto these).
BITFIT_FINETUNE = {"optimizer": "adamw", "lr": 1e-3, "steps": 400, "eval_every": 100, "weight_decay": 0.0}
LORA_FINETUNE = {"optimizer": "adamw", "lr": 5e-4, "steps": 400, "eval_every": 100, "weight_decay": 0.0}
IA3_FINETUNE = {**LORA_FINETUNE, "lr": 3e-3}


def with_defaults(defaults: dict, value):
    """A partial ``finetune`` mapping merged onto a method's defaults (anything else passes through)."""
    if value is None:
        return dict(defaults)
    return {**defaults, **value} if isinstance(value, dict) else value


class RetrainSpec(Spec):
    """Graft re-training (paper Table 1): from θ_pre, train only one learned region (+ a new head)."""

    budget: Budget | None = Field(None, description="which learned region to re-train (null: the first budget)")
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description=(
        "its training (in a recipe: the recipe's `finetune` with these fields changed)"))


class BitFitSpec(Spec):
    """BitFit (Ben Zaken et al., 2022): from θ_pre, train only the biases (+ the new head)."""

    finetune: FinetuneConfig = Field(default_factory=lambda: FinetuneConfig(**BITFIT_FINETUNE), description=(
        "its training; fields not given: AdamW, lr 1e-3, 400 steps, eval every 100, no weight decay"))

    @field_validator("finetune", mode="before")
    @classmethod
    def _bitfit_defaults(cls, v):
        return with_defaults(BITFIT_FINETUNE, v)


# ---------------------------------------------------------------------------------------------- storage
def delta_graft(pre, state: dict[str, torch.Tensor], metadata: dict | None = None) -> Graft:
    """A Graft holding exactly the coordinates where ``state`` differs from ``pre`` (+ its new head)."""
    params = dict(pre.named_parameters())
    shapes, indices, values, carried = {}, {}, {}, {}
    for name, t in state.items():
        if name not in params:
            raise SkillgraftError(f"trained state has tensor {name!r} that the pre-trained model lacks")
        if is_carried(name):
            carried[name] = t.detach().cpu().clone()
            continue
        base = params[name].detach()
        changed = torch.nonzero((t.to(base.device) != base).reshape(-1)).reshape(-1).cpu()
        if changed.numel():
            shapes[name] = tuple(base.shape)
            indices[name] = changed
            values[name] = t.detach().reshape(-1)[changed.to(t.device)].cpu().clone()
    return Graft(Region(shapes, indices), values, carried, getattr(pre, "base_model", ""), fingerprint(pre),
                 dict(metadata or {}))


def trained_graft(member: Member, store: Store, method: str, settings: dict,
                  train: Callable[[], tuple[dict, dict]]) -> tuple[Graft, dict]:
    """A baseline trained from θ_pre (``train() -> (state, info)``) as a delta graft, from the store or
    trained once."""
    key = {"setup": member.identity(), "method": method, "settings": settings}

    def make(folder: Path) -> None:
        t0 = time.perf_counter()
        state, info = train()
        delta_graft(member.pre, state, {"method": method, **settings}).save_pretrained(folder / "graft")
        write_json(folder / "info.json", {**info, "seconds": round(time.perf_counter() - t0, 2)})

    entry = store.fetch("trained", key, make, label=f"{method}-{member.task}-{member.k}-{member.seed}")
    return Graft.from_pretrained(entry / "graft"), read_json(entry / "info.json")


def fresh_pre(member: Member):
    """A trainable copy of the pre-trained scorer (same head initialisation) to train a baseline in."""
    scorer = copy.deepcopy(member.pre)
    for p in scorer.parameters():
        p.requires_grad_(True)
    return scorer


def region_digest(region: Region) -> str:
    """Content hash of a region's coordinates (part of a re-training key)."""
    h = hashlib.sha256()
    for name in sorted(region.indices):
        h.update(name.encode())
        h.update(region.indices[name].numpy().tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- variants
def retrain_variant(member: Member, store: Store, region: Region, config: FinetuneConfig, *, label: str,
                    budget: float | None = None) -> Variant:
    """Graft re-training (Table 1): from θ_pre, θ = θ_pre + γ⊙u with only u (+ a new head) trained."""
    from skillgraft.train.masked import finetune_masked  # noqa: PLC0415

    def train():
        scorer = fresh_pre(member)
        res = finetune_masked(scorer, member.data.train, member.data.dev, config, region=region, k=member.k,
                              progress=False)
        return ({n: p.detach() for n, p in scorer.named_parameters()},
                {"trainable": res.trainable_parameters, "best_dev": res.best_dev, "steps": res.steps})

    settings = {"region_size": len(region), "region": region_digest(region), "finetune": config.to_dict()}
    graft, info = trained_graft(member, store, "retrain", settings, train)
    return Variant(label, "retrain", len(region), graft, budget, info=info)


def bitfit_variant(member: Member, store: Store, config: FinetuneConfig) -> Variant:
    """BitFit: from θ_pre, train only the biases (+ the new head)."""
    from skillgraft.train import finetune  # noqa: PLC0415

    config = config.replace(bias_only=True)

    def train():
        scorer = fresh_pre(member)
        res = finetune(scorer, member.data.train, member.data.dev, config, k=member.k, progress=False)
        body = res.trainable_parameters - sum(p.numel() for n, p in scorer.named_parameters() if is_carried(n))
        return ({n: p.detach() for n, p in scorer.named_parameters()},
                {"trainable": body, "best_dev": res.best_dev, "steps": res.steps})

    graft, info = trained_graft(member, store, "bitfit", {"finetune": config.to_dict()}, train)
    return Variant("BitFit", "bitfit", int(info["trainable"]), graft, info=info)


def adapter_variant(member: Member, store: Store, adapter: AdapterConfig, config: FinetuneConfig) -> Variant:
    """A peft adapter (LoRA / IA³) trained from θ_pre with the new head, merged and stored as a delta."""
    from skillgraft.train.adapters import adapter_parameter_count, add_adapter, merged_state  # noqa: PLC0415
    from skillgraft.train.masked import finetune_masked  # noqa: PLC0415

    def train():
        scorer = fresh_pre(member)
        names = set(add_adapter(scorer, adapter))
        count = adapter_parameter_count(scorer, list(names))
        res = finetune_masked(scorer, member.data.train, member.data.dev, config, trainable=names.__contains__,
                              k=member.k, progress=False)
        return merged_state(scorer), {"trainable": count, "best_dev": res.best_dev, "steps": res.steps}

    settings = {"adapter": adapter.to_dict(), "finetune": config.to_dict()}
    graft, info = trained_graft(member, store, adapter.method, settings, train)
    return Variant(adapter.label, adapter.method, int(info["trainable"]), graft, info=info)
