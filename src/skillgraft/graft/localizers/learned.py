"""The learned localizer (paper Eq. 3–4): a sparse region γ learned with one forward/backward per step.

    γ = γ_base ⊙ (1 − σ(S)) + (1 − γ_base) ⊙ σ(S),    θ(γ) = θ_pre + γ ⊙ Δ,    Δ = θ_ft − θ_pre

γ_base is the top-k of |Δ| over the graftable tensors (k = sparsity · #graftable); S starts at
U[0, 1) and enters as σ(S − 10), so γ ≈ γ_base at first. Each step evaluates the loss at the
*continuous* γ and takes a plain gradient step on S with the chain rule written out:

    ∂L/∂S = ∂L/∂θ ⊙ Δ ⊙ (1 − 2γ_base) ⊙ σ'(S − 10)

The working model is the pre-trained scorer itself: its graftable tensors move by (γ_new − γ_old) ⊙ Δ
after each update (no per-step rebuild, no copies between devices). Everything is restored bit-exactly
in a ``finally`` (also on Ctrl-C): weights, the borrowed head, flags and modes.
Each budget selects its region from γ by the shared selection — ROUND: γ > 0.5; a fraction or count:
exactly the top-k of γ — and keeps the step whose region scores best on train (+ dev).

Two layouts of the same optimisation (docs/scale.md):

* dense (``candidates=None``): S, Δ, γ_base and an offloaded θ_pre over every graftable coordinate;
* candidate-restricted (``candidates=c``, :mod:`.candidates`): all of it only on the top-c |Δ|, gradients
  gathered per tensor by hooks, θ_ft read lazily from safetensors; memory O(c·N). c = 1 is bit-identical
  to dense. It is also what runs sharded under FSDP2 (:mod:`.sharded`), with a distributed exact top-k.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_serializer, model_validator
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.finite import check_loss
from skillgraft.graft.localizers.base import Localizer, examples_of
from skillgraft.graft.localizers.candidates import Candidates, Holding
from skillgraft.graft.localizers.checkpointing import activation_checkpointing
from skillgraft.graft.localizers.lending import preserved
from skillgraft.graft.localizers.sharded import (Group, fsdp_requested, is_sharded, pieces, reshard, shard,
                                                 sum_gradients)
from skillgraft.graft.localizers.source import FineTuned, InMemory, fine_tuned
from skillgraft.graft.keep import KeepResult, KeepSpec, Ranking, keep_search
from skillgraft.graft.region import Region
from skillgraft.graft.selection import ROUND, Budget, Budgets, parse_budgets, select_masks, top_k_masks
from skillgraft.models.anatomy import Graftable, carried_names, graftable_names
from skillgraft.models.scorer import batch_hits, batch_loss
from skillgraft.spec import COUNT_MAX, FLOAT_MAX, SEED_MAX, Spec


class LocalizeConfig(Spec):
    """Settings of the learned localizer (defaults: the reference implementation's)."""

    sparsity: float = Field(1e-4, ge=0, le=1, description="γ_base size as a fraction of graftable parameters")
    steps: int = Field(100, ge=0, le=COUNT_MAX, description="gradient steps on S")
    lr: float = Field(1e7, gt=0, le=FLOAT_MAX, description="learning rate of plain gradient descent on S")
    sigmoid_bias: float = Field(10.0, ge=0, le=FLOAT_MAX, description="γ uses σ(S − bias); S ~ U[0,1) at start")
    batch_size: int = Field(1024, ge=1, le=COUNT_MAX, description="examples per step (full batch when smaller)")
    micro_batch: int = Field(64, ge=1, le=COUNT_MAX, description="examples per forward/backward (accumulated)")
    graftable: Graftable = Field("body", description="the universe of a region: body | body+embeddings | all | bias")
    budgets: Budgets = Field(None, description=(
        "region sizes learned from one trajectory: fractions of graftable parameters in (0, 1] or counts ≥ 1 "
        "(exact top-k of γ), or 'round' (γ rounded at 0.5); default: round"))
    l1: float = Field(0.0, ge=0, le=FLOAT_MAX, description="λ of an L1 term λ·Σγ (as Localize-and-Stitch)")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of S's initialisation and of the step batches")
    eval_every: int = Field(1, ge=1, le=COUNT_MAX, description="score each budget's region every N steps")
    select_on: Literal["train+dev", "train", "last"] = Field("train+dev", description=(
        "which accuracy picks the best step (last: no selection)"))
    candidates: float | None = Field(None, gt=0, le=1, description=(
        "keep S, Δ and the saved θ_pre only on the top-c fraction of graftable parameters by |θ_ft − θ_pre| "
        "(memory O(c·N); c ≥ sparsity and ≥ every fractional budget; 1 = every parameter, same result as "
        "dense); default: dense"))
    gradient_checkpointing: bool = Field(False, description=(
        "recompute each transformer block's activations in the backward pass (less memory; each block's "
        "forward runs twice)"))

    @model_serializer(mode="wrap")
    def _scale_fields_only_when_set(self, handler):
        """The memory settings appear only when set, so configs, summaries and store keys of dense runs stay
        what they were before these fields existed (stored regions are reused, not recomputed)."""
        data = handler(self)
        if self.candidates is None:
            data.pop("candidates", None)
        if not self.gradient_checkpointing:
            data.pop("gradient_checkpointing", None)
        return data

    @model_validator(mode="after")
    def _candidates_hold_the_budgets(self) -> LocalizeConfig:
        c = self.candidates
        if c is None:
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


@dataclass
class LocalizeResult:
    regions: dict[Budget, Region]     # best region per budget
    best_step: dict[Budget, int]
    best_score: dict[Budget, float]
    history: list[dict]               # per scored step: "<budget label>:acc" / ":size"
    base_size: int
    step_seconds: float               # median time of one localization step (forward/backward + S update)
    config: dict
    candidate_size: int | None = None  # |C| when candidate-restricted
    step_times: list[float] = field(default_factory=list)  # seconds of each step (benchmarks)
    ranking: Ranking | None = None    # the learned order at the last step (keep targets; see graft.keep)
    keep: list[KeepResult] = field(default_factory=list)  # one per keep target

    @property
    def region(self) -> Region:
        return next(iter(self.regions.values()))

    @property
    def summary(self) -> dict:
        """JSON-able: budgets by their exact key (``Budget.parse(key)`` gives them back)."""
        out = {"budgets": [b.key for b in self.regions], "best_step": {b.key: s for b, s in self.best_step.items()},
               "best_score": {b.key: s for b, s in self.best_score.items()}, "base_size": self.base_size,
               "step_seconds": self.step_seconds, "history": self.history, "config": self.config}
        if self.candidate_size is not None:
            out["candidate_size"] = self.candidate_size
        if self.keep:
            out["keep"] = [r.to_dict() for r in self.keep]
        return out


class _Working(Holding):
    """The dense layout: the working model's graftable tensors with Δ, S and γ_base, and the θ updates."""

    def __init__(self, pre, source: FineTuned | torch.nn.Module, names: list[str], config: LocalizeConfig,
                 base: Region | None = None):
        source = source if isinstance(source, FineTuned) else InMemory(source)
        p_pre = dict(pre.named_parameters())
        self.names = names
        self.params = {n: p_pre[n] for n in names}
        self.delta = {n: (source.rows(n).to(p_pre[n].device) - p_pre[n].detach()) for n in names}
        self.universe = sum(d.numel() for d in self.delta.values())
        if base is None:
            k = int(round(config.sparsity * self.universe))
            self.base = top_k_masks({n: d.abs() for n, d in self.delta.items()}, k)
        else:  # an explicit γ_base (e.g. a union of task regions to purify, paper §5.1)
            bad = [n for n in base.indices if n not in self.delta]
            if bad or any(tuple(self.delta[n].shape) != s for n, s in base.shapes.items() if n in self.delta):
                raise SkillgraftError(f"base region does not fit the graftable tensors (e.g. {bad[:2]})")
            masks = base.to_masks()
            self.base = {n: (masks[n].to(self.delta[n].device) if n in masks
                             else torch.zeros_like(self.delta[n], dtype=torch.bool)) for n in names}
            k = int(sum(int(m.sum()) for m in self.base.values()))
        self.base_size = k
        self.size = None
        self.S = self._draw_S(config.seed)
        self.bias = config.sigmoid_bias
        self.current = {n: self.gamma(n) for n in names}  # γ the working weights currently hold

    def _draw_S(self, seed: int) -> dict[str, torch.Tensor]:
        """S ~ U[0, 1): one seeded stream over the tensors in order."""
        gen = torch.Generator().manual_seed(seed)
        return {n: torch.rand(d.shape, generator=gen).to(d.device) for n, d in self.delta.items()}

    def ranking(self, seed: int) -> Ranking:
        """The learned order of every graftable coordinate (:meth:`Holding.ranking_keys`)."""
        keys, region, moved = (torch.cat([t[n].reshape(-1) for n in self.names]) for t in self.ranking_keys(seed))
        shapes = {n: tuple(self.delta[n].shape) for n in self.names}
        return Ranking.from_keys(shapes, torch.arange(self.universe), keys, first=region, then=moved)

    @torch.no_grad()
    def apply(self) -> None:
        for n in self.names:
            self.params[n].add_(self.current[n].to(self.params[n].dtype) * self.delta[n])

    @torch.no_grad()
    def hold(self, n: str, target: torch.Tensor) -> None:
        """Move tensor n's working weights from θ_pre + current⊙Δ to θ_pre + target⊙Δ."""
        change = target.to(self.delta[n].dtype) - self.current[n].to(self.delta[n].dtype)
        self.params[n].add_(change * self.delta[n])
        self.current[n] = target

    def restore(self) -> None:
        """Nothing to do: the caller's ``preserved`` snapshot holds the whole of θ_pre."""

    def watch(self) -> None:
        """Gradients of the graftable tensors, kept dense in ``.grad`` until :meth:`update`."""
        for p in self.params.values():
            p.requires_grad_(True)

    def close(self) -> None:
        pass

    @torch.no_grad()
    def update(self, lr: float, l1: float, group: Group) -> None:
        for n in self.names:
            p = self.params[n]
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            group.sum_(g)
            s = torch.sigmoid(self.S[n] - self.bias)
            sign = 1 - 2 * self.base[n].to(s.dtype)
            grad_s = (g.to(s.dtype) * self.delta[n].to(s.dtype) + l1) * sign * s * (1 - s)
            self.S[n].sub_(lr * grad_s)
            p.grad = None
            self.hold(n, self.gamma(n))

    def choose(self, budget: Budget) -> dict[str, torch.Tensor]:
        return select_masks({n: self.gamma(n) for n in self.names}, budget, self.universe)

    def count(self, masks: dict[str, torch.Tensor]) -> int:
        return int(sum(int(m.sum()) for m in masks.values()))

    def region(self, masks: dict[str, torch.Tensor]) -> Region:
        return Region.from_masks({n: m.cpu() for n, m in masks.items()},
                                 {n: tuple(self.delta[n].shape) for n in self.names})


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

    ``keep`` (a share of FT's score such as 0.95, several, or a :class:`~skillgraft.graft.keep.KeepSpec`): after
    the trajectory, the smallest region of its learned order (``result.ranking``) whose score on ``selection``
    (default: ``dev``) is at least that share of FT's score there (``result.keep``; :mod:`skillgraft.graft.keep`).
    ``ranked``: return that order (``result.ranking``) without a keep target.
    """
    from accelerate import Accelerator  # noqa: PLC0415

    config = config or LocalizeConfig()
    if not train:
        raise SkillgraftError("localization needs training examples")
    if keep is not None and not isinstance(keep, KeepSpec):
        keep = KeepSpec.build({"keep": keep}, where="keep")
    keep = keep if keep is not None and keep.keep else None
    selection = dev if selection is None else selection
    if keep is not None:
        if not selection:
            raise SkillgraftError("a keep target needs a selection split: pass dev examples (or selection=), "
                                  "distinct from the test rows")
        if not isinstance(ft, torch.nn.Module):
            raise SkillgraftError("a keep target scores grafts of the fine-tuned model: pass it loaded, not as a "
                                  "folder")
    accelerator = accelerator or Accelerator()
    names = graftable_names(pre, config.graftable)
    carried = carried_names(pre)
    source = fine_tuned(ft, pre, names + [n for n in carried if n not in names])
    sharded = is_sharded(pre) or fsdp_requested(accelerator)
    group = Group(accelerator.num_processes, accelerator.process_index, sharded, accelerator.device)
    lean = sharded or config.candidates is not None or candidates is not None
    if sharded:
        if not is_sharded(pre):
            shard(pre, accelerator)
        sum_gradients(pre)
    with preserved(pre, carried if lean else names + carried):
        result = _optimise(pre, source, names, carried, train, dev, config, accelerator, group, progress, base,
                           candidates, lean, ranked or keep is not None)
    if keep is not None:  # θ_pre is itself again: score grafts of the learned order on the selection split
        result.keep = keep_search(pre, ft, result.ranking, selection, keep)
    return result


def _optimise(pre, source, names, carried, train, dev, config, accelerator, group, progress, base, chosen,
              lean, ranked: bool = False) -> LocalizeResult:
    """The optimisation of Eq. 3–4 on ``pre`` (whose flags, modes and head the caller restores)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    if not group.sharded:
        pre.to(accelerator.device)
    pre.eval()
    for p in pre.parameters():
        p.grad = None
    with torch.no_grad():  # lend θ_pre the fine-tuned task head
        for n, part in pieces(pre, carried, group).items():
            part.values().copy_(source.rows(n, part.start, part.stop).reshape(-1))
    for p in pre.parameters():
        p.requires_grad_(False)
    if lean:
        work = Candidates(pieces(pre, names, group), source, config, group, base=base, chosen=chosen)
    else:
        work = _Working(pre, source, names, config, base)
    checkpointing = config.gradient_checkpointing or (
        group.sharded and os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true")
    try:
        work.apply()
        with activation_checkpointing(pre, checkpointing):
            result = _steps(pre, work, train, dev, config, accelerator, group, progress, world, rank)
            if ranked:
                result.ranking = work.ranking(config.seed)
            return result
    finally:
        work.close()
        work.restore()


def _steps(pre, work, train, dev, config, accelerator, group, progress, world, rank) -> LocalizeResult:
    work.watch()
    keys = config.budget_list
    select = train + (dev or []) if config.select_on == "train+dev" else train
    batch_n = min(config.batch_size, len(train))
    rng = np.random.RandomState(config.seed)
    best: dict[Budget, tuple[float, int, Region | None]] = {k: (-1.0, 0, None) for k in keys}
    history: list[dict] = []
    step_times: list[float] = []
    lockstep = group.sharded and world > 1  # every process runs every forward (FSDP gathers in each)

    previous: dict[Budget, Region] = {}

    def score(step: int) -> None:
        row = {"step": step}
        for key in keys:
            masks = work.choose(key)
            continuous = work.hold_choice(masks)
            acc = _accuracy(pre, select, config.micro_batch, accelerator, lockstep)
            work.release(continuous)
            size = work.count(masks)
            row[f"{key.label}:acc"], row[f"{key.label}:size"] = acc, size
            region = work.region(masks)
            if key in previous:  # how much the region still moves: IoU with the last scored step's region
                row[f"{key.label}:iou_prev"] = round(region.iou(previous[key]), 6)
            previous[key] = region
            if config.select_on == "last" or acc > best[key][0]:
                best[key] = (acc, step, region)
        history.append(row)

    score(0)
    bar = tqdm(range(1, config.steps + 1), desc="localize", disable=not (progress and accelerator.is_main_process))
    try:
        for step in bar:
            t0 = time.perf_counter()
            order = rng.permutation(len(train))[:batch_n] if batch_n < len(train) else np.arange(len(train))
            total = 0.0
            for chunk, weight in _micro_batches(order[rank::world], config.micro_batch,
                                                math.ceil(len(order) / world) if lockstep else None):
                batch = pre.collate([train[i] for i in chunk])
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                # cross-entropy (generative: completion tokens)
                loss = batch_loss(pre, batch, reduction="sum") / batch_n
                (loss if weight == 1 else loss * weight).backward()
                total = total + loss.detach() * weight
            check_loss(group.sum_(total), "localization", step)  # before S moves: a NaN is never stored
            work.update(config.lr, config.l1, group)
            step_times.append(time.perf_counter() - t0)
            if step % config.eval_every == 0 or step == config.steps:
                score(step)
                bar.set_postfix({k.label: f"{history[-1][k.label + ':acc']:.3f}/{history[-1][k.label + ':size']}"
                                 for k in keys})
    finally:
        bar.close()
    return LocalizeResult({k: best[k][2] for k in keys}, {k: best[k][1] for k in keys},
                          {k: best[k][0] for k in keys}, history, work.base_size,
                          float(np.median(step_times)) if step_times else 0.0, config.to_dict(), work.size,
                          step_times)


def _micro_batches(mine: np.ndarray, micro_batch: int, lockstep: int | None):
    """(example indices, loss weight) per forward. ``lockstep``: every process runs ⌈lockstep/micro⌉ of them,
    a process without examples left running one weighted 0 (FSDP needs every rank in every forward)."""
    count = math.ceil((lockstep if lockstep is not None else len(mine)) / micro_batch)
    for i in range(count):
        chunk = mine[i * micro_batch:(i + 1) * micro_batch]
        yield (chunk, 1) if len(chunk) else (np.zeros(1, dtype=np.int64), 0.0)


@torch.no_grad()
def _accuracy(scorer, examples: list[Example], micro_batch: int, accelerator, lockstep: bool = False) -> float:
    """Accuracy of ``scorer`` on ``examples`` (sharded over processes, counts summed)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    mine = examples[rank::world]
    correct = torch.zeros(2, device=accelerator.device)
    slots = math.ceil(len(examples) / world) if lockstep else len(mine)
    for start in range(0, slots, micro_batch):
        part = mine[start:start + micro_batch]
        batch = scorer.collate(part or examples[:1])
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        hits, count = batch_hits(scorer, batch)  # labels right (generative: next completion tokens right)
        if part:
            correct[0] += hits
            correct[1] += count
    if lockstep:
        reshard(scorer)  # a no-grad forward may leave gathered parameters behind; the next edit must show
    if world > 1:
        torch.distributed.all_reduce(correct)
    return float(correct[0] / correct[1].clamp(min=1))


class Learned(Localizer):
    """Paper Eq. 3–4: γ learned on train (+ dev) from γ_base = top-``sparsity`` |Δ|; all budgets in one run."""

    Options = LocalizeConfig
    summary = "learned γ (paper Eq. 3–4); takes 'round' too"

    def run(self, pre, ft, data, options=None, *, progress: bool = False) -> LocalizeResult:
        train, dev = examples_of(data)
        return localize(pre, ft, train, dev, self.options(options), progress=progress)

    def regions(self, pre, ft, data, budgets, options=None, *, progress: bool = False) -> dict[Budget, Region]:
        config = self.options(options).replace(budgets=parse_budgets(budgets) or None)
        return self.run(pre, ft, data, config, progress=progress).regions

    def ranking(self, pre, ft, data, options=None, *, progress: bool = False) -> Ranking:
        """The learned order at the end of one trajectory (the rounded γ by the learned drift, then |Δ|)."""
        train, dev = examples_of(data)
        return localize(pre, ft, train, dev, self.options(options), ranked=True, progress=progress).ranking

    def keep(self, pre, ft, data, keep, options=None, *, selection=None, progress: bool = False) -> list[KeepResult]:
        """Keep targets searched on the learned order at the end of one trajectory (see :func:`localize`)."""
        train, dev = examples_of(data)
        return localize(pre, ft, train, dev, self.options(options), keep=keep, selection=selection,
                        progress=progress).keep
