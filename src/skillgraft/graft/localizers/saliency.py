"""First-order saliency: the coordinates whose movement matters most to the loss, not just the largest ones.

    gradient:  s_j = Σ_b |∂L_b/∂θ_j · Δ_j|      (micro-batches b; one batch: |∇L ⊙ Δ|)
    signed:    s_j = −∂L/∂θ_j · Δ_j              (first-order loss change of grafting / removing Δ_j)
    fisher:    s_j = F_jj · Δ_j²                  (diagonal Fisher; the second-order term of the same expansion)

with Δ = θ_ft − θ_pre and the gradient (or Fisher) taken at θ_ft (``at="ft"``) or at θ_pre wearing the
fine-tuned task head (``at="pre"``). Top-movement |Δ| ignores how sensitive the loss is to a coordinate;
these scores weigh the movement by it (a Taylor expansion of L(θ_pre + γ⊙Δ) around either end).
Only the training examples are used; neither model is changed (flags, grads and modes restored).
"""

from __future__ import annotations

from typing import Literal

from skillgraft.lazy import torch
from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal
from skillgraft.graft.localizers.machinery.base import Localizer, LocalizerOptions, examples_of
from skillgraft.graft.localizers.machinery.lending import lent_head, preserved
from skillgraft.models.anatomy import check_compatible, graftable_names
from skillgraft.spec import COUNT_MAX, Spec


class SaliencyConfig(Spec):
    """How a saliency score is computed (shared by the ``saliency`` localizer and learned variants' γ_base)."""

    at: Literal["ft", "pre"] = Field("ft", description=(
        "where the gradient / Fisher is taken: θ_ft, or θ_pre wearing the fine-tuned head"))
    kind: Literal["gradient", "fisher"] = Field("gradient", description=(
        "gradient: Σ_b |∂L_b/∂θ ⊙ Δ| over micro-batches; fisher: F_jj · Δ_j²"))
    signed: bool = Field(False, description="gradient kind: −∂L/∂θ ⊙ Δ (full batch) instead of its magnitude")
    micro_batch: int = Field(32, ge=1, le=COUNT_MAX, description=(
        "examples per backward pass (the b of Σ_b; ≥ n: one batch)"))
    fisher: FisherConfig = Field(default_factory=FisherConfig, description="the Fisher estimate (kind: fisher)")


class SaliencyOptions(LocalizerOptions, SaliencyConfig):
    """Options of the ``saliency`` localizer."""


def saliency_scores(pre, ft, train, config: SaliencyConfig, graftable="body", *,
                    progress: bool = False) -> dict[str, torch.Tensor]:
    """One saliency score per graftable coordinate (CPU float32), see the module doc."""
    if not train:
        raise SkillgraftError("the saliency scores need training examples")
    names = graftable_names(pre, graftable)
    check_compatible(pre, ft, names)
    p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
    signed_delta = {n: (p_ft[n].detach() - p_pre[n].detach()).float().cpu() for n in names}
    if config.at == "ft":
        scorer, context = ft, preserved(ft, [])
    else:
        scorer, context = pre, lent_head(pre, ft)
    with context, preserved(scorer, []):
        if config.kind == "fisher":
            fisher = fisher_diagonal(scorer, list(train), config.fisher, names=names, progress=progress)
            return {n: fisher[n].float().cpu() * signed_delta[n] ** 2 for n in names}
        return _gradient_scores(scorer, list(train), names, signed_delta, config)


def _gradient_scores(scorer, train, names, delta, config: SaliencyConfig) -> dict[str, torch.Tensor]:
    from skillgraft.models.scorer import batch_loss  # noqa: PLC0415

    params = dict(scorer.named_parameters())
    for p in scorer.parameters():
        p.requires_grad_(False)
    for n in names:
        params[n].requires_grad_(True)
        params[n].grad = None
    scorer.eval()
    device = params[names[0]].device
    out = {n: torch.zeros_like(delta[n]) for n in names}
    for start in range(0, len(train), config.micro_batch):
        batch = scorer.collate(train[start:start + config.micro_batch])
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = batch_loss(scorer, batch, reduction="sum") / len(train)  # generative: completion tokens
        loss.backward()
        with torch.no_grad():
            for n in names:
                g = params[n].grad
                if g is not None:
                    term = g.float().cpu() * delta[n]
                    out[n] += -term if config.signed else term.abs()
                params[n].grad = None
    return out


class Saliency(Localizer):
    """The top first-order saliency |∂L/∂θ ⊙ Δ| (or −∂L/∂θ ⊙ Δ, or Fisher·Δ²) coordinates."""

    Options = SaliencyOptions
    summary = "top |∂L/∂θ ⊙ Δ| (or Fisher·Δ²) at θ_ft or θ_pre"

    def needs_labels(self, options) -> str | None:
        return "kind 'fisher': the Fisher of log p(y|x) over the labels" if options.kind == "fisher" else None

    def scores(self, pre, ft, data, options, *, progress: bool = False) -> dict[str, torch.Tensor]:
        train, _ = examples_of(data)
        return saliency_scores(pre, ft, train, options, options.graftable, progress=progress)
