"""The learned localizer (paper Eq. 3–4): a sparse region γ learned with one forward/backward per step.

    γ = γ_base ⊙ (1 − σ(S)) + (1 − γ_base) ⊙ σ(S),    θ(γ) = θ_pre + γ ⊙ Δ,    Δ = θ_ft − θ_pre

γ_base is the top-k of |Δ| over the graftable tensors (k = sparsity · #graftable); S starts at
U[0, 1) and enters as σ(S − 10), so γ ≈ γ_base at first. Each step evaluates the loss at the
*continuous* γ and takes a plain gradient step on S with the chain rule written out:

    ∂L/∂S = ∂L/∂θ ⊙ Δ ⊙ (1 − 2γ_base) ⊙ σ'(S − 10)

The working model is the pre-trained scorer itself: its graftable tensors move by (γ_new − γ_old) ⊙ Δ
after each update (no per-step rebuild, no copies between devices). Everything is restored bit-exactly
in a ``finally`` (also on Ctrl-C): weights from an offloaded copy, the borrowed head, flags and modes.
Each budget selects its region from γ by the shared selection — ROUND: γ > 0.5; a fraction or count:
exactly the top-k of γ — and keeps the step whose region scores best on train (+ dev).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.base import Localizer, examples_of
from skillgraft.graft.localizers.lending import preserved
from skillgraft.graft.region import Region
from skillgraft.graft.selection import ROUND, Budget, Budgets, parse_budgets, select_masks, top_k_masks
from skillgraft.models.anatomy import Graftable, carried_names, check_compatible, graftable_names
from skillgraft.models.scorer import batch_hits, batch_loss
from skillgraft.spec import Spec


class LocalizeConfig(Spec):
    """Settings of the learned localizer (defaults: the reference implementation's)."""

    sparsity: float = Field(1e-4, ge=0, le=1, description="γ_base size as a fraction of graftable parameters")
    steps: int = Field(100, ge=0, description="gradient steps on S")
    lr: float = Field(1e7, gt=0, description="learning rate of plain gradient descent on S")
    sigmoid_bias: float = Field(10.0, description="γ uses σ(S − bias); S ~ U[0,1) at start")
    batch_size: int = Field(1024, ge=1, description="examples per step (full batch when smaller)")
    micro_batch: int = Field(64, ge=1, description="examples per forward/backward (accumulated)")
    graftable: Graftable = Field("body", description="the universe of a region: body | body+embeddings | all | bias")
    budgets: Budgets = Field(None, description=(
        "region sizes learned from one trajectory: fractions of graftable parameters in (0, 1] or counts ≥ 1 "
        "(exact top-k of γ), or 'round' (γ rounded at 0.5); default: round"))
    l1: float = Field(0.0, ge=0, description="λ of an L1 term λ·Σγ (as Localize-and-Stitch)")
    seed: int = Field(0, description="seed of S's initialisation and of the step batches")
    eval_every: int = Field(1, ge=1, description="score each budget's region every N steps")
    select_on: Literal["train+dev", "train", "last"] = Field("train+dev", description=(
        "which accuracy picks the best step (last: no selection)"))

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

    @property
    def region(self) -> Region:
        return next(iter(self.regions.values()))

    @property
    def summary(self) -> dict:
        """JSON-able: budgets by their exact key (``Budget.parse(key)`` gives them back)."""
        return {"budgets": [b.key for b in self.regions], "best_step": {b.key: s for b, s in self.best_step.items()},
                "best_score": {b.key: s for b, s in self.best_score.items()}, "base_size": self.base_size,
                "step_seconds": self.step_seconds, "history": self.history, "config": self.config}


class _Working:
    """The working model's graftable tensors with Δ, S and γ_base, and the incremental θ updates."""

    def __init__(self, pre, ft, names: list[str], config: LocalizeConfig, base: Region | None = None,
                 original: dict[str, torch.Tensor] | None = None):
        p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
        self.names = names
        self.params = {n: p_pre[n] for n in names}
        if original is None:  # offloaded θ_pre (the caller's copy when it already holds one)
            original = {n: p.detach().to("cpu", copy=True) for n, p in self.params.items()}
        self.original = original
        self.delta = {n: (p_ft[n].detach().to(p_pre[n].device) - p_pre[n].detach()) for n in names}
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
        gen = torch.Generator().manual_seed(config.seed)
        self.S = {n: torch.rand(d.shape, generator=gen).to(d.device) for n, d in self.delta.items()}
        self.bias = config.sigmoid_bias
        self.current = {n: self.gamma(n) for n in names}  # γ the working weights currently hold
        with torch.no_grad():
            for n in names:
                self.params[n].add_(self.current[n].to(self.params[n].dtype) * self.delta[n])

    def gamma(self, n: str) -> torch.Tensor:
        s = torch.sigmoid(self.S[n] - self.bias)
        return torch.where(self.base[n], 1 - s, s)

    @torch.no_grad()
    def hold(self, n: str, target: torch.Tensor) -> None:
        """Move tensor n's working weights from θ_pre + current⊙Δ to θ_pre + target⊙Δ."""
        change = target.to(self.delta[n].dtype) - self.current[n].to(self.delta[n].dtype)
        self.params[n].add_(change * self.delta[n])
        self.current[n] = target

    @torch.no_grad()
    def restore(self) -> None:
        for n, p in self.params.items():
            p.copy_(self.original[n].to(p.device))


def localize(pre, ft, train: list[Example], dev: list[Example] | None = None, config: LocalizeConfig | None = None,
             *, accelerator=None, progress: bool = True, base: Region | None = None) -> LocalizeResult:
    """Learn a sparse region γ such that θ_pre + γ⊙(θ_ft − θ_pre) keeps the fine-tuned skill.

    ``pre`` is used as the working model and restored bit-exactly on return, on an error or on Ctrl-C
    (weights, the new task head borrowed from ``ft`` for the duration, requires_grad flags, train/eval
    mode). ``base`` sets γ_base to that region instead of the top-``sparsity`` movement.
    """
    from accelerate import Accelerator  # noqa: PLC0415

    config = config or LocalizeConfig()
    if not train:
        raise SkillgraftError("localization needs training examples")
    accelerator = accelerator or Accelerator()
    names = graftable_names(pre, config.graftable)
    check_compatible(pre, ft, names)
    with preserved(pre, names + carried_names(pre)) as original:
        return _optimise(pre, ft, names, train, dev, config, accelerator, progress, base, original)


def _optimise(pre, ft, names, train, dev, config, accelerator, progress, base, original) -> LocalizeResult:
    """The optimisation of Eq. 3–4 on ``pre`` (which the caller restores)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    pre.to(accelerator.device).eval()
    ft_params = dict(ft.named_parameters())
    carried = set(carried_names(pre))
    with torch.no_grad():
        for n, p in pre.named_parameters():
            if n in carried:
                p.copy_(ft_params[n])
    for p in pre.parameters():
        p.requires_grad_(False)
    work = _Working(pre, ft, names, config, base, original={n: original[n] for n in names})
    for n in names:
        work.params[n].requires_grad_(True)
    keys = config.budget_list
    select = train + (dev or []) if config.select_on == "train+dev" else train
    batch_n = min(config.batch_size, len(train))
    rng = np.random.RandomState(config.seed)
    best: dict[Budget, tuple[float, int, Region | None]] = {k: (-1.0, 0, None) for k in keys}
    history: list[dict] = []
    step_times: list[float] = []

    def score(step: int) -> None:
        row = {"step": step}
        for key in keys:
            masks = select_masks({n: work.gamma(n) for n in names}, key, work.universe)
            continuous = dict(work.current)
            for n in names:
                work.hold(n, masks[n].to(continuous[n].dtype))
            acc = _accuracy(pre, select, config.micro_batch, accelerator)
            for n in names:
                work.hold(n, continuous[n])
            size = int(sum(int(m.sum()) for m in masks.values()))
            row[f"{key.label}:acc"], row[f"{key.label}:size"] = acc, size
            if config.select_on == "last" or acc > best[key][0]:
                best[key] = (acc, step, Region.from_masks({n: m.cpu() for n, m in masks.items()},
                                                          {n: tuple(work.delta[n].shape) for n in names}))
        history.append(row)

    score(0)
    bar = tqdm(range(1, config.steps + 1), desc="localize", disable=not (progress and accelerator.is_main_process))
    try:
        for step in bar:
            t0 = time.perf_counter()
            order = rng.permutation(len(train))[:batch_n] if batch_n < len(train) else np.arange(len(train))
            shard = order[rank::world]
            for start in range(0, len(shard), config.micro_batch):
                batch = pre.collate([train[i] for i in shard[start:start + config.micro_batch]])
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                loss = batch_loss(pre, batch, reduction="sum") / batch_n  # cross-entropy (generative: completion tokens)
                loss.backward()
            with torch.no_grad():
                for n in names:
                    p = work.params[n]
                    g = p.grad if p.grad is not None else torch.zeros_like(p)
                    if world > 1:
                        torch.distributed.all_reduce(g)
                    s = torch.sigmoid(work.S[n] - work.bias)
                    sign = 1 - 2 * work.base[n].to(s.dtype)
                    grad_s = (g.to(s.dtype) * work.delta[n].to(s.dtype) + config.l1) * sign * s * (1 - s)
                    work.S[n].sub_(config.lr * grad_s)
                    p.grad = None
                    work.hold(n, work.gamma(n))
            step_times.append(time.perf_counter() - t0)
            if step % config.eval_every == 0 or step == config.steps:
                score(step)
                bar.set_postfix({k.label: f"{history[-1][k.label + ':acc']:.3f}/{history[-1][k.label + ':size']}"
                                 for k in keys})
    finally:
        bar.close()
    return LocalizeResult({k: best[k][2] for k in keys}, {k: best[k][1] for k in keys},
                          {k: best[k][0] for k in keys}, history, work.base_size,
                          float(np.median(step_times)) if step_times else 0.0, config.to_dict())


@torch.no_grad()
def _accuracy(scorer, examples: list[Example], micro_batch: int, accelerator) -> float:
    """Accuracy of ``scorer`` on ``examples`` (sharded over processes, counts summed)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    mine = examples[rank::world]
    correct = torch.zeros(2, device=accelerator.device)
    for start in range(0, len(mine), micro_batch):
        batch = scorer.collate(mine[start:start + micro_batch])
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        hits, count = batch_hits(scorer, batch)  # labels right (generative: next completion tokens right)
        correct[0] += hits
        correct[1] += count
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
