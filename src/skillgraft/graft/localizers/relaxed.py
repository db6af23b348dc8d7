"""Learned localizers beyond the paper's recipe: other γ_base, Adam on S, and a straight-through binary graft.

Each is the engine (:mod:`.engine`) with one relaxation (:mod:`.relaxations`), one optimizer and a base score,
on the candidate layout: a candidate set C (the top-c coordinates of the base score; S, Δ and θ_pre live only
there) inside θ_pre itself, θ(m) = θ_pre + m ⊙ Δ:

* ``sigmoid`` (paper Eq. 3–4): the learned localizer's γ and S (its arithmetic; S₀ drawn as one stream over
  C), γ_base the top-``sparsity`` of the base score; with SGD this is the paper's update; with Adam
  (``optimizer: adam``) the per-coordinate step no longer vanishes with σ'(S). Every budget's region is the
  exact top-k of γ's logit (one trajectory for all budgets).
* ``straight-through``: the forward pass uses the *binary* graft m = top-k(z) at the budget's exact
  size, the backward pass treats m as continuous: ∂L/∂z := ∂L/∂m = ∂L/∂θ ⊙ Δ (the first-order loss
  change of flipping each coordinate). z₀ = 1 on the top-k of the base score (0 elsewhere, ties by base
  score), so the search starts at that region and swaps coordinates when the gradient keeps asking for it.
  One trajectory per budget. With ``anneal_from`` it is a *continuation*: the forward mask starts as the top
  ``anneal_from`` fraction of the universe (a nearly full graft, where the skill and its gradients are) and
  shrinks geometrically to the budget over ``anneal_steps`` steps, k_t = k₀^(1−t/T)·k^(t/T), before the
  steps at the exact size (movement pruning, Sanh et al. 2020, applied to Δ).
* ``hard-concrete`` (L0, Louizos et al. 2018): stochastic gates z = min(1, max(0, σ((log u − log(1−u) +
  log α)/β)·(ζ − γ) + γ)), u ~ U(0,1), β = 2/3, γ = −0.1, ζ = 1.1, so z is exactly 0 or 1 with positive
  probability; the loss is L(θ_pre + z ⊙ Δ) + ρ·((E‖z‖₀ − k)/k)² with E‖z‖₀ = Σ σ(log α − β·log(−γ/ζ)),
  Adam on log α. log α starts so that the top-k of the base score is open (P(z = 1) = 0.95) and the rest
  holds k/10 open gates in expectation (log α ≈ 4.5 vs ≈ −8.5 for k = 1e-4 of 1% candidates); Adam's default lr
  1.0 moves log α by about 1 per step, so a closed gate can overtake the open ones within ~13 steps (at 0.2
  the top-k never changed in 50 steps on MiniLM SST-2). The region is the exact top-k of log α. One trajectory
  per budget.

The base score is |Δ| (``base: movement``; C then comes from the streamed top-c of the candidate layout, θ_ft
may be a saved folder) or a first-order saliency (``base: saliency``,
:mod:`skillgraft.graft.localizers.saliency`). The region kept for each budget is the best scored one on the
dev set (``select_on``; step 0 — the base region itself — included). θ_pre is restored bit-exactly in a
``finally`` (weights, the lent head, flags, grads, modes; also on Ctrl-C). Sharded (FSDP) runs: the sigmoid
relaxation from |Δ| only; straight-through and hard-concrete rank C in one process and refuse.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Literal

from skillgraft.lazy import torch
from pydantic import Field, model_validator

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery import engine
from skillgraft.graft.localizers.machinery.base import Localization, Localizer, LocalizerOptions, examples_of
from skillgraft.graft.localizers.machinery.batches import accuracy  # noqa: F401 - what a region is scored by
from skillgraft.graft.localizers.machinery.fit import ScheduleOptions, fit_apart
from skillgraft.graft.localizers.learned import LOCALIZE_LR
from skillgraft.graft.localizers.movement import movement
from skillgraft.graft.localizers.machinery import relaxations
from skillgraft.graft.localizers.saliency import SaliencyConfig, saliency_scores
from skillgraft.graft.region import Region
from skillgraft.graft.selection import region_universe, top_k_masks
from skillgraft.spec import COUNT_MAX, FLOAT_MAX, SEED_MAX

DEFAULT_LR = {**{("sigmoid", k): lr for k, lr in LOCALIZE_LR.items()},  # the learned localizer's, said once
              ("straight-through", "sgd"): 1e4, ("straight-through", "adam"): 0.05, ("straight-through", "nsgd"): 0.1,
              ("hard-concrete", "sgd"): 1e4, ("hard-concrete", "adam"): 1.0, ("hard-concrete", "nsgd"): 0.2}
Relaxation = Literal["sigmoid", "straight-through", "hard-concrete"]


class RelaxedOptions(ScheduleOptions, LocalizerOptions):
    """Options of the relaxed learned localizers (``learned-adam``, ``learned-saliency``, ``straight-through``)."""

    relaxation: Relaxation = Field("sigmoid", description=(
        "sigmoid: the paper's continuous γ = σ(z); straight-through: the binary top-k graft forward, ∂L/∂m back; "
        "hard-concrete: stochastic L0 gates with a penalty holding E‖z‖₀ at the budget"))
    optimizer: Literal["sgd", "adam", "nsgd"] = Field("adam", description=(
        "update of z: plain gradient descent, Adam (per-coordinate scale), or nsgd (gradient descent on the gradient "
        "divided by its RMS over the candidates: one scale per step, magnitudes kept)"))
    lr: float | None = Field(None, gt=0, le=FLOAT_MAX, description=(
        "learning rate on z (default: sigmoid 1e7 SGD (the paper's) / 0.5 Adam or nsgd; straight-through 1e4 SGD / "
        "0.05 Adam / 0.1 nsgd; hard-concrete 1.0 Adam / 0.2 nsgd on log α)"))
    steps: int = Field(50, ge=0, le=COUNT_MAX, description=(
        "gradient steps (per budget for straight-through and hard-concrete)"))
    anneal_from: float | None = Field(None, gt=0, le=1, description=(
        "straight-through: start from the top fraction of the base score this large and prune geometrically to "
        "each budget over `anneal_steps` (a continuation from a nearly full graft); null: start at the budget"))
    anneal_steps: int = Field(0, ge=0, le=COUNT_MAX, description=(
        "straight-through with anneal_from: steps of the pruning schedule, part of `steps`; regions are scored "
        "only once the mask has the budget's size"))
    l0_penalty: float = Field(1.0, ge=0, le=FLOAT_MAX, description=(
        "hard-concrete: ρ of the size penalty ρ·((E‖z‖₀ − k)/k)²"))
    base: Literal["movement", "saliency"] = Field("movement", description=(
        "base score of γ_base and of the candidate set: |Δ| or a first-order saliency"))
    saliency: SaliencyConfig = Field(default_factory=SaliencyConfig, description="the saliency (base: saliency)")
    sparsity: float = Field(1e-4, gt=0, le=1, description="sigmoid: γ_base size as a fraction of the universe")
    sigmoid_bias: float = Field(10.0, gt=0, le=FLOAT_MAX, description="sigmoid: z₀ = ±(bias − u), u ~ U[0,1)")
    candidates: float | None = Field(1e-2, gt=0, le=1, description=(
        "candidate set: the top fraction of the universe by the base score (at least the largest budget and "
        "γ_base; null: the whole universe); S, Δ and θ_pre are kept only there"))
    batch_size: int = Field(1024, ge=1, le=COUNT_MAX, description="examples per step (full batch when smaller)")
    micro_batch: int = Field(64, ge=1, le=COUNT_MAX, description="examples per forward/backward (accumulated)")
    eval_every: int = Field(5, ge=1, le=COUNT_MAX, description="score each budget's region every N steps")
    select_on: Literal["dev", "train+dev", "train", "last"] = Field("dev", description=(
        "which accuracy picks the best step (last: no selection)"))
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of z's initialisation and of the step batches")

    def _left_out(self) -> set[str]:
        """Settings a relaxation does not read are left out, so configs and store keys of the earlier
        relaxations stay what they were before those settings existed (stored regions are reused)."""
        out = super()._left_out()
        if self.anneal_from is None and self.anneal_steps == 0:
            out |= {"anneal_from", "anneal_steps"}
        if self.relaxation != "hard-concrete":
            out.add("l0_penalty")
        return out

    @model_validator(mode="after")
    def _default_lr(self):
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR[(self.relaxation, self.optimizer)])
        if self.anneal_from is not None and self.relaxation != "straight-through":
            raise ValueError("anneal_from applies to relaxation 'straight-through' only")
        if self.anneal_steps > self.steps:
            raise ValueError(f"anneal_steps={self.anneal_steps} is more than steps={self.steps}: the schedule must "
                             "end at the budget within the run")
        if self.anneal_from is not None and self.candidates is not None and self.anneal_from > self.candidates:
            raise ValueError(f"anneal_from={self.anneal_from:g} is larger than candidates={self.candidates:g}: the "
                             "starting graft must lie in the candidate set")
        return self


def base_scores(pre, ft, train, opts: RelaxedOptions, *, progress: bool = False) -> dict[str, torch.Tensor]:
    """The score γ_base and the candidate set are drawn from: |Δ| or the saliency."""
    if opts.base == "movement":
        return movement(pre, ft, opts.graftable)
    return saliency_scores(pre, ft, train, opts.saliency, opts.graftable, progress=progress)


def relaxed_localize(pre, ft, data, opts: RelaxedOptions, *, accelerator=None, progress: bool = False
                     ) -> Localization:
    """Regions of exactly each of ``opts.budgets``' sizes (see the module doc); ``pre`` restored bit-exactly."""
    train, dev = examples_of(data)
    if not train:
        raise SkillgraftError("a learned localizer needs training examples")
    if opts.select_on in ("dev", "train+dev") and not dev:
        raise SkillgraftError(f"select_on={opts.select_on!r} needs dev examples (data with .dev), or select_on 'train'")
    rows = opts.step_examples(train, dev)  # each step's gradient rows (refused here, before any work)
    budgets = list(dict.fromkeys(opts.budgets or []))
    if not budgets or any(b.rounding for b in budgets):
        raise SkillgraftError("the relaxed localizers need budgets that are fractions or counts (exact sizes), "
                              "not 'round'")
    shapes = region_universe(pre, opts.graftable)
    universe = sum(math.prod(s) for s in shapes.values())
    sizes = [b.size(universe) for b in budgets]
    base_k = max(1, round(opts.sparsity * universe))
    c = universe if opts.candidates is None else min(universe, max(math.ceil(opts.candidates * universe), *sizes,
                                                                   base_k))
    t0 = time.perf_counter()
    scores = chosen = None
    if opts.base == "saliency":  # C = the top-c saliency (the candidate layout takes the top-c |Δ| by itself)
        scores = base_scores(pre, ft, train, opts, progress=progress)
        chosen = Region.from_masks(top_k_masks(scores, c), shapes)
    score_seconds = time.perf_counter() - t0
    start_k = None if opts.anneal_from is None else min(c, max(round(opts.anneal_from * universe), *sizes))
    relaxation = {"sigmoid": partial(relaxations.Sigmoid, opts.sigmoid_bias, draw="candidates", select="logit"),
                  "straight-through": partial(relaxations.StraightThrough, start_k, opts.anneal_steps),
                  "hard-concrete": partial(relaxations.HardConcrete, opts.l0_penalty)}[opts.relaxation]
    plan = engine.Plan(
        relaxation=relaxation, optimizer=opts.optimizer, lr=opts.lr, steps=opts.steps, budgets=budgets,
        batch_size=opts.batch_size, micro_batch=opts.micro_batch, eval_every=opts.eval_every,
        last=opts.select_on == "last", seed=opts.seed, graftable=opts.graftable,
        candidates=None if chosen is not None else (lambda _: c), chosen=chosen,
        base_size=(lambda _: base_k) if opts.relaxation == "sigmoid" else None, scores=scores, config=opts.to_dict(),
        schedule=opts.stopping)
    select = {"dev": dev, "train+dev": train + dev, "train": train, "last": []}[opts.select_on]
    result = engine.run(pre, ft, rows, select, plan, accelerator=accelerator, progress=progress)
    if opts.select_on == "train+dev":
        fit_apart(pre, ft, result, train, dev, opts.micro_batch, accelerator)
    result.extra["score_seconds"] = score_seconds
    return result


class Relaxed(Localizer):
    """A learned localizer with a choice of relaxation, optimizer and base score (see the module doc)."""

    Options = RelaxedOptions
    summary = "learned mask: sigmoid (paper) or straight-through binary graft; SGD or Adam; |Δ| or saliency base"

    def run(self, pre, ft, data, options=None, *, progress: bool = False) -> Localization:
        opts = self.options(options)
        self.check(pre, opts)
        return relaxed_localize(pre, ft, data, opts, progress=progress)

    def refuse(self, options, *, sharded: bool = False, generative: bool = False) -> None:
        """Sharded: the sigmoid relaxation from |Δ| only; generative data: any but a Fisher saliency base."""
        if sharded and options.relaxation != "sigmoid":
            raise SkillgraftError(f"localizer {self.name!r} (relaxation {options.relaxation}) does not run sharded "
                                  "(FSDP): its start ranks every candidate by the base score in one process; run it "
                                  "without an FSDP config, or use learned / learned-adam")
        if sharded and options.base == "saliency":
            raise SkillgraftError(f"localizer {self.name!r} with base 'saliency' does not run sharded (FSDP): the "
                                  "saliency needs both models whole in one process; use base 'movement'")
        super().refuse(options, generative=generative)

    def needs_labels(self, options) -> str | None:
        if options.base == "saliency" and options.saliency.kind == "fisher":
            return "its saliency base is a Fisher of log p(y|x) over the labels"
        return None


class AdamOptions(RelaxedOptions):
    """``learned-adam``: paper Eq. 3–4 (sigmoid relaxation, |Δ| γ_base) with Adam on S."""


class LearnedAdam(Relaxed):
    """Paper Eq. 3–4 with Adam on S (exact budgets, selection on dev)."""

    Options = AdamOptions
    summary = "paper Eq. 3–4 with Adam on S; selected on dev"


class SaliencyBaseOptions(RelaxedOptions):
    """``learned-saliency``: paper Eq. 3–4 with γ_base the top saliency |∂L/∂θ ⊙ Δ| instead of |Δ|."""

    optimizer: Literal["sgd", "adam", "nsgd"] = Field("sgd", description="update of z (see RelaxedOptions)")
    base: Literal["movement", "saliency"] = Field("saliency", description=(
        "base score of γ_base and of the candidate set: |Δ| or a first-order saliency"))


class LearnedSaliency(Relaxed):
    """Paper Eq. 3–4 (SGD) from a saliency γ_base (exact budgets, selection on dev)."""

    Options = SaliencyBaseOptions
    summary = "paper Eq. 3–4 from γ_base = top |∂L/∂θ ⊙ Δ|; selected on dev"


class StraightThroughOptions(RelaxedOptions):
    """``straight-through``: the binary graft at the exact budget forward, ∂L/∂m backward, Adam on z."""

    relaxation: Relaxation = Field("straight-through", description="sigmoid | straight-through | hard-concrete")


class StraightThrough(Relaxed):
    """Optimise the binary graft at its exact size (straight-through estimator, Adam)."""

    Options = StraightThroughOptions
    summary = "binary top-k graft forward, ∂L/∂m = ∂L/∂θ ⊙ Δ backward (straight-through); selected on dev"


class PruneOptions(RelaxedOptions):
    """``prune``: straight-through from a nearly full graft (top ``anneal_from`` of |Δ|) pruned to each budget."""

    relaxation: Relaxation = Field("straight-through", description="sigmoid | straight-through | hard-concrete")
    optimizer: Literal["sgd", "adam", "nsgd"] = Field("nsgd", description="update of z (see RelaxedOptions)")
    steps: int = Field(90, ge=0, le=COUNT_MAX, description=(
        "gradient steps per budget: the pruning schedule, then the exact size"))
    anneal_from: float | None = Field(0.1, gt=0, le=1, description=(
        "the starting graft: the top fraction of |Δ| (0.1: about FT's accuracy on MiniLM SST-2)"))
    anneal_steps: int = Field(60, ge=0, le=COUNT_MAX, description=(
        "steps of the geometric pruning schedule (part of `steps`)"))
    candidates: float | None = Field(None, gt=0, le=1, description=(
        "candidate set: the top fraction of the universe by |Δ| (null: the whole universe); at least anneal_from"))


class Prune(Relaxed):
    """Continuation: the straight-through binary graft pruned from a nearly full graft down to the budget."""

    Options = PruneOptions
    summary = "straight-through binary graft pruned from the top 10% of |Δ| to the budget; selected on dev"


class HardConcreteOptions(RelaxedOptions):
    """``hard-concrete``: L0 gates (Louizos et al. 2018) on the candidates, E‖z‖₀ held at each budget."""

    relaxation: Relaxation = Field("hard-concrete", description="sigmoid | straight-through | hard-concrete")


class HardConcrete(Relaxed):
    """Stochastic hard-concrete (L0) gates; the region is the exact top-k of log α, selected on dev."""

    Options = HardConcreteOptions
    summary = "hard-concrete L0 gates, E‖z‖₀ held at the budget, top-k of log α; selected on dev"
