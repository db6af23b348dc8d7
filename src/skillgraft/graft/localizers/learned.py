"""The learned localizer (paper Eq. 3–4): a sparse region γ learned with one forward/backward per step.

    γ = γ_base ⊙ (1 − σ(S)) + (1 − γ_base) ⊙ σ(S),    θ(γ) = θ_pre + γ ⊙ Δ,    Δ = θ_ft − θ_pre

γ_base is the top-k of |Δ| over the graftable tensors (k = sparsity · #graftable); S starts at
U[0, 1) and enters as σ(S − 10), so γ ≈ γ_base at first. Each step evaluates the loss at the
*continuous* γ and takes a plain gradient step on S with the chain rule written out:

    ∂L/∂S = ∂L/∂θ ⊙ Δ ⊙ (1 − 2γ_base) ⊙ σ'(S − 10)

Each budget selects its region from γ by the shared selection — ROUND: γ > 0.5; a fraction or count:
exactly the top-k of γ — and keeps the step whose region scores best on train (+ dev). By default every budget is
read off one trajectory from the ``sparsity`` γ_base; ``per_size`` runs the paper's protocol instead, a trajectory
per budget from the top-|Δ| of that budget's own size.

This module is the registry entry and its options: the optimisation is the engine's (:mod:`.engine`) with
the sigmoid relaxation and SGD, on the dense layout (``candidates=None``) or the candidate-restricted one
(``candidates=c``, :mod:`.candidates`: S, Δ and θ_pre only on the top-c |Δ|, memory O(c·N); c = 1 is
bit-identical to dense), which also runs sharded under FSDP2 (:mod:`.sharded`).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Literal

from skillgraft.lazy import torch
from pydantic import Field, model_validator

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery import engine
from skillgraft.graft.localizers.machinery.base import Localization, Localizer, examples_of
from skillgraft.graft.localizers.machinery.fit import ScheduleOptions, answered_by, fit_apart
from skillgraft.graft.localizers.machinery.relaxations import Sigmoid
from skillgraft.graft.ranking import Ranking
from skillgraft.graft.region import Region
from skillgraft.graft.selection import ROUND, Budget, Budgets, parse_budgets
from skillgraft.keep.scoring import keep_search
from skillgraft.keep.search import KeepResult
from skillgraft.keep.spec import KeepSpec
from skillgraft.models.anatomy import Graftable
from skillgraft.spec import COUNT_MAX, FLOAT_MAX, OMITTED_AT_DEFAULT, SEED_MAX, Spec


LOCALIZE_LR = {"sgd": 1e7, "nsgd": 0.5, "adam": 0.5}  # the default lr on S of each optimizer
LOCALIZE_STEPS = {"fixed": 100, "fit": 150}  # the default steps of each schedule (fixed: the paper's; fit: the cap)


class LocalizeConfig(ScheduleOptions):
    """Settings of the learned localizer (defaults: the reference implementation's, but for the schedule: by
    default a trajectory runs until its regions fit — ``schedule: fixed`` with 100 steps is the paper's protocol)."""

    schedule: Literal["fixed", "fit"] = Field("fit", description=(
        "when a trajectory stops: fit = once every budget's region reaches fit_target of FT's score on the "
        "selection rows, or no budget improved for `patience` steps, with `steps` as the cap; fixed = exactly "
        "`steps` (the paper's protocol)"))
    sparsity: float = Field(1e-4, ge=0, le=1, description="γ_base size as a fraction of graftable parameters")
    steps: int | None = Field(None, ge=0, le=COUNT_MAX, description=(
        "gradient steps on S: the cap of a fit schedule, the count of a fixed one (default: "
        + ", ".join(f"{k} {v}" for k, v in LOCALIZE_STEPS.items()) + ")"))
    optimizer: Literal["sgd", "nsgd", "adam"] = Field("sgd", description=(
        "the update of S: sgd = plain gradient descent (the paper's); nsgd = gradient descent on ∂L/∂S ÷ its RMS over "
        "the universe (one scale per step, the gradients' ranking kept: the step no longer depends on the size of Δ, "
        "e.g. an AdamW fine-tune's small one); adam = torch's Adam (a per-coordinate scale)"),
        json_schema_extra=OMITTED_AT_DEFAULT)  # sgd runs keep their store keys
    lr: float | None = Field(None, gt=0, le=FLOAT_MAX, description=(
        "learning rate on S (" + ", ".join(f"{k} {v:g}" for k, v in LOCALIZE_LR.items()) + ")"))
    sigmoid_bias: float = Field(10.0, ge=0, le=FLOAT_MAX, description="γ uses σ(S − bias); S ~ U[0,1) at start")
    init: Literal["uniform", "movement"] = Field("uniform", description=(
        "S at start: uniform = U[0,1) (the paper's); movement = |Δ| ÷ max |Δ|, so every budget's region at step 0 "
        "is the top-|Δ| of its size (one trajectory then starts each size from top-|Δ|, as the paper's per-size "
        "protocol does)"), json_schema_extra=OMITTED_AT_DEFAULT)  # uniform runs keep their store keys
    batch_size: int = Field(1024, ge=1, le=COUNT_MAX, description="examples per step (full batch when smaller)")
    micro_batch: int = Field(64, ge=1, le=COUNT_MAX, description="examples per forward/backward (accumulated)")
    graftable: Graftable = Field("body", description="the universe of a region: body | body+embeddings | all | bias")
    budgets: Budgets = Field(None, description=(
        "region sizes learned from one trajectory: fractions of graftable parameters in (0, 1] or counts ≥ 1 "
        "(exact top-k of γ), or 'round' (γ rounded at 0.5); default: round"))
    l1: float = Field(0.0, ge=0, le=FLOAT_MAX, description="λ of an L1 term λ·Σγ (as Localize-and-Stitch)")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of S's initialisation and of the step batches")
    eval_every: int = Field(5, ge=1, le=COUNT_MAX, description=(
        "score each budget's region every N steps (and at the first and last) on the selection rows (1 = the "
        "reference code's; a scoring costs about a step on MiniLM, so every step doubled a localization's time)"))
    select_on: Literal["train+dev", "train", "last"] = Field("train+dev", description=(
        "which accuracy picks the best step (last: no selection, the last step's regions; they are still scored "
        "on the training rows every eval_every steps for the history, so on a large training set raise eval_every "
        "to `steps` to score only the first and last)"))
    candidates: Annotated[float, Field(gt=0, le=1)] | Literal["auto"] | None = Field(None, description=(
        "keep S, Δ and the saved θ_pre only on the top-c fraction of graftable parameters by |θ_ft − θ_pre| "
        "(memory O(c·N); c ≥ sparsity and ≥ every fractional budget; 1 = every parameter, same result as "
        "dense); auto: dense when the memory plan says it fits, else 0.01 (docs/scale.md); default: dense, or "
        "auto's choice where dense does not fit"), json_schema_extra=OMITTED_AT_DEFAULT)  # dense keeps its keys
    per_size: bool = Field(False, description=(
        "a trajectory per budget, each from γ_base = the top-|Δ| of that budget's own size (the paper's protocol: "
        "its graft at sparsity s starts from the top-s |Δ|; 'round' starts from `sparsity`); default: one "
        "trajectory from `sparsity` for every budget (one optimisation instead of one per budget)"),
        json_schema_extra=OMITTED_AT_DEFAULT)  # runs at the default keep their store keys
    gradient_checkpointing: bool = Field(False, description=(
        "recompute each transformer block's activations in the backward pass (less memory; each block's "
        "forward runs twice)"), json_schema_extra=OMITTED_AT_DEFAULT)
    fit_to: Literal["labels", "ft"] = Field("labels", description=(
        "what the region is stepped toward and selected on: labels = the rows' gold labels (the paper's); ft = the "
        "fine-tuned model's own answer on each training and dev row (no gold label read; the fit share is then the "
        "region's agreement with FT: where FT is near chance, its score can be matched by a region that answers "
        "otherwise, and the agreement is what carries to test). Label classifiers, with FT loaded"),
        json_schema_extra=OMITTED_AT_DEFAULT)  # runs at the default keep their store keys
    compile: bool = Field(False, json_schema_extra=OMITTED_AT_DEFAULT, description=(
        "torch.compile the transformer body for the localization's steps and scorings (equal to eager within "
        "rounding; pays a compile at the start and at new batch shapes: for long runs)"))

    @model_validator(mode="after")
    def _candidates_hold_the_budgets(self) -> LocalizeConfig:
        if self.lr is None:  # the optimizer's own default, resolved here: configs and store keys hold a number
            object.__setattr__(self, "lr", LOCALIZE_LR[self.optimizer])
        if self.steps is None:  # the schedule's own default, resolved here as lr is
            object.__setattr__(self, "steps", LOCALIZE_STEPS[self.schedule])
        c = self.candidates
        if c is None or c == "auto":  # auto: resolved to a number (or dense) before any work
            return self
        if c < self.sparsity:
            raise ValueError(f"candidates={c:g} is smaller than sparsity={self.sparsity:g}: γ_base must lie in the "
                             "candidate set")
        larger = [b for b in self.budgets or [] if b.fraction is not None and b.fraction > c]
        if larger:
            raise ValueError(f"candidates={c:g} is smaller than budget {larger[0]}: every region lies in the "
                             "candidate set")
        return self

    @property
    def budget_list(self) -> list[Budget]:
        """The budgets to learn, in order, without repeats (ROUND when none is given)."""
        return list(dict.fromkeys(self.budgets or [ROUND]))


LocalizeResult = Localization  # the one result type (kept under its earlier name)


def localize(pre, ft, train: list[Example], dev: list[Example] | None = None, config: LocalizeConfig | None = None,
             *, accelerator=None, progress: bool = True, base: Region | None = None,
             candidates: Region | None = None, keep: KeepSpec | float | list[float] | None = None,
             selection: list[Example] | None = None, ranked: bool = False) -> LocalizeResult:
    """Learn a sparse region γ such that θ_pre + γ⊙(θ_ft − θ_pre) keeps the fine-tuned skill.

    ``ft`` is the fine-tuned scorer, or the folder it was saved to (read lazily, tensor by tensor). ``pre``
    is used as the working model and restored bit-exactly on return, on an error or on Ctrl-C (weights,
    the new task head borrowed from ``ft`` for the duration, requires_grad flags, train/eval mode, grads).
    ``base`` sets γ_base to that region instead of the top-``sparsity`` movement; ``candidates`` restricts
    the optimisation to that region (chosen by any scorer) instead of the top-``config.candidates`` |Δ|.
    Under ``accelerate launch`` with an FSDP2 config, or with a ``fully_shard``-ed ``pre``, each process
    works on its own shards (``pre`` stays sharded afterwards; its values are restored).

    ``keep`` (a share of FT's score such as 0.95, several, or a :class:`~skillgraft.keep.spec.KeepSpec`): after
    the trajectory, the smallest region of its learned order (``result.ranking``) whose score on ``selection``
    (default: ``dev``) is at least that share of FT's score there (``result.keep``; :mod:`skillgraft.keep.search`).
    ``ranked``: return that order (``result.ranking``) without a keep target.
    """
    config = config or LocalizeConfig()
    if not train:
        raise SkillgraftError("localization needs training examples")
    if keep is not None and not isinstance(keep, KeepSpec):
        keep = KeepSpec.build({"keep": keep}, where="keep")
    keep = keep if keep is not None and keep.any else None
    selection = dev if selection is None else selection
    if config.per_size and base is not None:
        raise SkillgraftError("per_size starts each budget from the top-|Δ| of its own size: give base= or per_size, "
                              "not both")
    if config.fit_to == "ft":  # FT's own answers as the rows' labels (refused here, before any work)
        answered = answered_by(ft, accelerator)
        selection = answered(dev) if selection is dev else selection
        train, dev = answered(train), answered(dev) if dev else dev
    rows = config.step_examples(train, dev)  # each step's gradient rows (refused here, before any work)
    if keep is not None or ranked:
        refuse_unordered(config)
    if keep is not None:
        if not selection:
            raise SkillgraftError("a keep target needs a selection split: pass dev examples (or selection=), "
                                  "distinct from the test rows")
        if not isinstance(ft, torch.nn.Module):
            raise SkillgraftError("a keep target scores grafts of the fine-tuned model: pass it loaded, not as a "
                                  "folder")
    if config.candidates == "auto":
        config = config.replace(candidates=auto_candidates(config, pre))
    select = train + (dev or []) if config.select_on == "train+dev" else train
    result = engine.run(pre, ft, rows, select, plan(config, base, candidates), accelerator=accelerator,
                        progress=progress, ranked=ranked or keep is not None)
    if config.fit_to == "ft" and result.reference:  # the fit line says whose labels: FT's own answers
        result.reference = {**result.reference, "of": "its own answers"}
    if config.select_on == "train+dev":
        fit_apart(pre, ft, result, train, dev, config.micro_batch, accelerator)
    if keep is not None:  # θ_pre is itself again: score grafts of the learned order on the selection split
        result.keep = keep_search(pre, ft, result.ranking, selection, keep)
    return result


def auto_candidates(config: LocalizeConfig, pre) -> float | None:
    """``candidates='auto'`` in a library call: None (dense) when the dense localizer's plan fits the free memory of
    ``pre``'s device (:mod:`skillgraft.models.memory`), else 0.01 (at least sparsity and every fractional budget).
    The verbs resolve it earlier, from the checkpoint's files (``pipeline/memory_plan.py``)."""
    from skillgraft.models.memory import Work, free_memory, localization_terms, shape_of_model  # noqa: PLC0415
    from skillgraft.models.placement import device_of  # noqa: PLC0415

    shape = shape_of_model(pre)
    d = shape.stored_bytes
    work = Work(config.micro_batch, 128, config.gradient_checkpointing, d)
    need = sum(t.bytes for t in localization_terms(shape, weight_bytes=d, candidates=None, work=work,
                                                   ft_resident=False)[1:])  # θ_pre is already in memory
    if need <= free_memory(str(device_of(pre))).bytes:
        return None
    fractions = [b.fraction for b in config.budgets or [] if b.fraction is not None]
    return max([1e-2, config.sparsity, *fractions])


def refuse_unordered(config: LocalizeConfig) -> None:
    """One line for a keep target or a ranking asked of ``per_size``: a trajectory per budget has no one order."""
    if config.per_size:
        raise SkillgraftError("per_size (--per-size) learns a trajectory per budget, so the learned localizer gives no "
                              "one order of the coordinates for a keep target (--keep) or a ranking: drop --per-size")


def plan(config: LocalizeConfig, base: Region | None = None, candidates: Region | None = None) -> engine.Plan:
    """The engine run of the paper's localizer: the sigmoid relaxation, SGD on S, γ_base = top-sparsity |Δ|."""
    c = config.candidates
    return engine.Plan(
        relaxation=partial(Sigmoid, config.sigmoid_bias, config.l1, init=config.init), optimizer=config.optimizer,
        lr=config.lr,
        steps=config.steps, budgets=config.budget_list, batch_size=config.batch_size,
        micro_batch=config.micro_batch, eval_every=config.eval_every, last=config.select_on == "last",
        seed=config.seed, graftable=config.graftable,
        candidates=None if c is None else (lambda universe: Budget.parse(c).size(universe)), chosen=candidates,
        base=base, base_size=lambda universe: int(round(config.sparsity * universe)), base_per_budget=config.per_size,
        gradient_checkpointing=config.gradient_checkpointing, compile=config.compile, config=config.to_dict(),
        schedule=config.stopping)


class Learned(Localizer):
    """Paper Eq. 3–4: γ learned on train (+ dev) from γ_base = top-``sparsity`` |Δ|; all budgets in one run."""

    Options = LocalizeConfig
    summary = "learned γ (paper Eq. 3–4); takes 'round' too"
    reads_files = True
    sparsity_trajectories = True

    def run(self, pre, ft, data, options=None, *, progress: bool = False) -> LocalizeResult:
        train, dev = examples_of(data)
        opts = self.options(options)
        self.check(pre, opts)
        return localize(pre, ft, train, dev, opts, progress=progress)

    def check_ranked(self, options=None) -> None:
        """``per_size`` learns a trajectory per budget: no one order for a keep target."""
        super().check_ranked(options)
        if options is not None:
            refuse_unordered(self.options(options))

    def refuse(self, options, *, sharded: bool = False, generative: bool = False) -> None:
        """Runs everywhere: dense, candidates, sharded (FSDP2), every scorer kind (generative included)."""

    def regions(self, pre, ft, data, budgets, options=None, *, progress: bool = False) -> dict[Budget, Region]:
        config = self.options(options).replace(budgets=parse_budgets(budgets) or None)
        return self.run(pre, ft, data, config, progress=progress).regions

    def trajectory(self, pre, ft, data, options=None, *, ranked: bool = False,
                   progress: bool = False) -> LocalizeResult:
        """One trajectory at ``options``' γ_base sparsity, its budgets' regions (with ``ranked``, also the learned
        order at its end): what the frontier runs once per sparsity (``sparsity_trajectories``; so ``per_size``, which
        would split it per budget, is dropped)."""
        train, dev = examples_of(data)
        return localize(pre, ft, train, dev, self.options(options).replace(per_size=False), ranked=ranked,
                        progress=progress)

    def ranking(self, pre, ft, data, options=None, *, progress: bool = False) -> Ranking:
        """The learned order at the end of one trajectory (the rounded γ by the learned drift, then |Δ|)."""
        train, dev = examples_of(data)
        return localize(pre, ft, train, dev, self.options(options), ranked=True, progress=progress).ranking

    def keep(self, pre, ft, data, keep, options=None, *, selection=None, progress: bool = False) -> list[KeepResult]:
        """Keep targets searched on the learned order at the end of one trajectory (see :func:`localize`)."""
        train, dev = examples_of(data)
        return localize(pre, ft, train, dev, self.options(options), keep=keep, selection=selection,
                        progress=progress).keep
