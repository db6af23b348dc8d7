"""Learning a skill region (paper Eq. 3–4) with one forward/backward per step.

    γ = γ_base ⊙ (1 − σ(S)) + (1 − γ_base) ⊙ σ(S),    θ(γ) = θ_pre + γ ⊙ Δ,    Δ = θ_ft − θ_pre

γ_base is the top-k of |Δ| over the graftable tensors (k = sparsity · #graftable); S starts at
U[0, 1) and enters as σ(S − 10), so γ ≈ γ_base at first. Each step evaluates the loss at the
*continuous* γ and takes a plain gradient step on S with the chain rule written out:

    ∂L/∂S = ∂L/∂θ ⊙ Δ ⊙ (1 − 2γ_base) ⊙ σ'(S − 10)

The working model is the pre-trained scorer itself: its graftable tensors move by (γ_new − γ_old) ⊙ Δ
after each update (no per-step rebuild, no copies between devices), and are restored bit-exactly from
an offloaded copy at the end. The binary region is γ rounded at 0.5 (or the top-k of γ for an exact
budget); the best step is chosen by the rounded graft's accuracy on train (+ dev).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.models.anatomy import Graftable, carried_names, check_compatible, graftable_names
from skillgraft.graft.region import Region


@dataclass
class LocalizeConfig:
    """Settings of the learned localizer (defaults: the reference implementation's)."""

    sparsity: float = field(default=1e-4, metadata={"help": "γ_base size as a fraction of graftable parameters"})
    steps: int = field(default=100, metadata={"help": "gradient steps on S"})
    lr: float = field(default=1e7, metadata={"help": "learning rate of plain gradient descent on S"})
    sigmoid_bias: float = field(default=10.0, metadata={"help": "γ uses σ(S − bias); S ~ U[0,1) at start"})
    batch_size: int = field(default=1024, metadata={"help": "examples per step (full batch when smaller)"})
    micro_batch: int = field(default=64, metadata={"help": "examples per forward/backward (accumulated)"})
    graftable: Graftable = field(default="body", metadata={"help": "body | body+embeddings | all | bias"})
    budgets: list[float] | None = field(default=None, metadata={
        "help": "exact region sizes (fractions of graftable) taken as top-k of γ, instead of rounding at 0.5"})
    l1: float = field(default=0.0, metadata={"help": "λ of an L1 term λ·Σγ (as Localize-and-Stitch)"})
    seed: int = field(default=0, metadata={"help": "seed of S's initialisation"})
    eval_every: int = field(default=1, metadata={"help": "score the rounded graft every N steps"})
    select_on: Literal["train+dev", "train", "last"] = field(default="train+dev", metadata={
        "help": "which accuracy picks the best step (last: no selection)"})

    def validate(self) -> None:
        if not 0 <= self.sparsity <= 1:
            raise SkillgraftError(f"sparsity must be in [0, 1] (a fraction of graftable parameters), got {self.sparsity}")
        for b in self.budgets or []:
            if not 0 < b <= 1:
                raise SkillgraftError(f"budget {b} is impossible: a budget is a fraction of graftable parameters in (0, 1]")
        if self.steps < 0 or self.lr <= 0 or self.batch_size <= 0 or self.micro_batch <= 0 or self.eval_every <= 0:
            raise SkillgraftError("steps ≥ 0, and lr, batch_size, micro_batch, eval_every > 0 are required")
        if self.select_on not in ("train+dev", "train", "last"):
            raise SkillgraftError(f"select_on must be train+dev, train or last, got {self.select_on!r}")


@dataclass
class LocalizeResult:
    regions: dict[str, Region]        # "round" or "budget=<b>" → best region
    best_step: dict[str, int]
    best_score: dict[str, float]
    history: list[dict]
    base_size: int
    step_seconds: float               # median time of one localization step (forward/backward + S update)
    config: dict

    @property
    def region(self) -> Region:
        return next(iter(self.regions.values()))


def top_k_masks(scores: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Boolean masks of exactly the k largest entries over all tensors (ties broken by position)."""
    if k <= 0:
        return {n: torch.zeros_like(s, dtype=torch.bool) for n, s in scores.items()}
    flat = torch.cat([s.reshape(-1).float() for s in scores.values()])
    k = min(k, flat.numel())
    chosen = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    chosen[torch.topk(flat, k, sorted=False).indices] = True
    out, start = {}, 0
    for n, s in scores.items():
        out[n] = chosen[start:start + s.numel()].view(s.shape)
        start += s.numel()
    return out


class _Working:
    """The working model's graftable tensors with Δ, S and γ_base, and the incremental θ updates."""

    def __init__(self, pre, ft, names: list[str], config: LocalizeConfig, base: Region | None = None):
        p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
        self.names = names
        self.params = {n: p_pre[n] for n in names}
        self.original = {n: p.detach().to("cpu", copy=True) for n, p in self.params.items()}  # offloaded θ_pre
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

    ``pre`` is used as the working model and restored exactly on return. A new task head (head mode)
    is copied from ``ft`` for the duration (it travels whole with the graft). ``base`` sets γ_base to
    that region instead of the top-``sparsity`` movement (config.sparsity is then ignored).
    """
    from accelerate import Accelerator  # noqa: PLC0415

    config = config or LocalizeConfig()
    config.validate()
    if not train:
        raise SkillgraftError("localization needs training examples")
    accelerator = accelerator or Accelerator()
    world, rank = accelerator.num_processes, accelerator.process_index
    names = graftable_names(pre, config.graftable)
    check_compatible(pre, ft, names)
    pre.to(accelerator.device).eval()
    ft_params = dict(ft.named_parameters())
    head_backup = {n: p.detach().clone() for n, p in pre.named_parameters() if n in carried_names(pre)}
    with torch.no_grad():
        for n, p in pre.named_parameters():
            if n in head_backup:
                p.copy_(ft_params[n])
    for p in pre.parameters():
        p.requires_grad_(False)
    work = _Working(pre, ft, names, config, base)
    for n in names:
        work.params[n].requires_grad_(True)
    keys = ["round"] if not config.budgets else [f"budget={b:g}" for b in config.budgets]
    budget_k = {f"budget={b:g}": max(1, int(round(b * work.universe))) for b in config.budgets or []}
    select = train + (dev or []) if config.select_on == "train+dev" else train
    batch_n = min(config.batch_size, len(train))
    rng = np.random.RandomState(config.seed)
    best = {k: (-1.0, 0, None) for k in keys}
    history: list[dict] = []
    step_times: list[float] = []

    def region_masks(key: str) -> dict[str, torch.Tensor]:
        if key == "round":
            return {n: work.gamma(n) > 0.5 for n in names}
        return top_k_masks({n: work.gamma(n) for n in names}, budget_k[key])

    def score(step: int) -> None:
        row = {"step": step}
        for key in keys:
            masks = region_masks(key)
            continuous = dict(work.current)
            for n in names:
                work.hold(n, masks[n].to(continuous[n].dtype))
            acc = _accuracy(pre, select, config.micro_batch, accelerator)
            for n in names:
                work.hold(n, continuous[n])
            size = int(sum(int(m.sum()) for m in masks.values()))
            row[f"{key}:acc"], row[f"{key}:size"] = acc, size
            if config.select_on == "last" or acc > best[key][0]:
                best[key] = (acc, step, Region.from_masks({n: m.cpu() for n, m in masks.items()},
                                                          {n: tuple(work.delta[n].shape) for n in names}))
        history.append(row)

    score(0)
    bar = tqdm(range(1, config.steps + 1), desc="localize", disable=not (progress and accelerator.is_main_process))
    for step in bar:
        t0 = time.perf_counter()
        order = rng.permutation(len(train))[:batch_n] if batch_n < len(train) else np.arange(len(train))
        shard = order[rank::world]
        for start in range(0, len(shard), config.micro_batch):
            batch = pre.collate([train[i] for i in shard[start:start + config.micro_batch]])
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            labels = batch.pop("labels")
            loss = torch.nn.functional.cross_entropy(pre(**batch).float(), labels, reduction="sum") / batch_n
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
            bar.set_postfix({k: f"{history[-1][k + ':acc']:.3f}/{history[-1][k + ':size']}" for k in keys})
    for p in pre.parameters():
        p.requires_grad_(False)
    work.restore()
    with torch.no_grad():
        for n, p in pre.named_parameters():
            if n in head_backup:
                p.copy_(head_backup[n])
    return LocalizeResult({k: best[k][2] for k in keys}, {k: best[k][1] for k in keys},
                          {k: best[k][0] for k in keys}, history, work.base_size,
                          float(np.median(step_times)) if step_times else 0.0, asdict(config))


@torch.no_grad()
def _accuracy(scorer, examples: list[Example], micro_batch: int, accelerator) -> float:
    """Accuracy of ``scorer`` on ``examples`` (sharded over processes, counts summed)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    mine = examples[rank::world]
    correct = torch.zeros(2, device=accelerator.device)
    for start in range(0, len(mine), micro_batch):
        batch = scorer.collate(mine[start:start + micro_batch])
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        labels = batch.pop("labels")
        correct[0] += (scorer(**batch).argmax(-1) == labels).sum()
        correct[1] += len(labels)
    if world > 1:
        torch.distributed.all_reduce(correct)
    return float(correct[0] / correct[1].clamp(min=1))
