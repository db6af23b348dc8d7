"""Learned localizers beyond the paper's recipe: other γ_base, Adam on S, and a straight-through binary graft.

All optimise a mask m over a candidate set C (the top-c coordinates of the base score; S, Δ and θ_pre
live only there) with the working model θ(m) = θ_pre + m ⊙ Δ held inside θ_pre itself:

* ``sigmoid`` (paper Eq. 3–4): m = γ = σ(z), z₀ = ±(b − u) (u ~ U[0,1), + on γ_base = top-``sparsity`` of
  the base score), i.e. the paper's γ_base ⊙ (1 − σ(S − b)) + (1 − γ_base) ⊙ σ(S − b) with z = ±(b − S);
  the loss is taken at the continuous γ, ∂L/∂z = ∂L/∂θ ⊙ Δ ⊙ σ'(z). With SGD this is the paper's
  update; with Adam (``optimizer: adam``) the per-coordinate step no longer vanishes with σ'(z).
  Every budget's region is the exact top-k of z (one trajectory for all budgets).
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

The base score is |Δ| (``base: movement``) or a first-order saliency (``base: saliency``,
:mod:`skillgraft.graft.localizers.saliency`). The region kept for each budget is the best scored one on the
dev set (``select_on``; step 0 — the base region itself — included). θ_pre is restored bit-exactly in a
``finally`` (weights, the lent head, flags, grads, modes; also on Ctrl-C).
"""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_serializer, model_validator
from tqdm.auto import tqdm

from skillgraft.errors import SkillgraftError
from skillgraft.finite import check_loss
from skillgraft.graft.localizers.base import Localization, Localizer, LocalizerOptions, examples_of
from skillgraft.graft.localizers.lending import preserved
from skillgraft.graft.localizers.movement import movement
from skillgraft.graft.localizers.saliency import SaliencyConfig, saliency_scores
from skillgraft.graft.region import Region
from skillgraft.graft.selection import region_universe, top_k_flat, top_k_masks
from skillgraft.models.anatomy import carried_names, check_compatible, graftable_names
from skillgraft.spec import COUNT_MAX, FLOAT_MAX, SEED_MAX

DEFAULT_LR = {("sigmoid", "sgd"): 1e7, ("sigmoid", "adam"): 0.5, ("sigmoid", "nsgd"): 0.5,
              ("straight-through", "sgd"): 1e4, ("straight-through", "adam"): 0.05, ("straight-through", "nsgd"): 0.1,
              ("hard-concrete", "sgd"): 1e4, ("hard-concrete", "adam"): 1.0, ("hard-concrete", "nsgd"): 0.2}
Relaxation = Literal["sigmoid", "straight-through", "hard-concrete"]
# Hard-concrete constants (Louizos et al., 2018): temperature β and the stretch interval (γ, ζ).
HC_BETA, HC_LOW, HC_HIGH = 2 / 3, -0.1, 1.1


class RelaxedOptions(LocalizerOptions):
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

    @model_serializer(mode="wrap")
    def _only_fields_in_use(self, handler):
        """Settings a relaxation does not read are left out, so configs and store keys of the earlier
        relaxations stay what they were before those settings existed (stored regions are reused)."""
        data = handler(self)
        if self.anneal_from is None and self.anneal_steps == 0:
            data.pop("anneal_from", None)
            data.pop("anneal_steps", None)
        if self.relaxation != "hard-concrete":
            data.pop("l0_penalty", None)
        return data

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


class _Candidates:
    """The candidate coordinates of each tensor, θ_pre and Δ there, and writing θ_pre + m ⊙ Δ into the model."""

    def __init__(self, pre, ft, names: list[str], masks: dict[str, torch.Tensor], base_scores: dict[str, torch.Tensor]):
        p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
        self.names = [n for n in names if bool(masks[n].any())]
        self.params = {n: p_pre[n] for n in self.names}
        self.idx, pre_v, delta_v, score_v = {}, [], [], []
        for n in self.names:
            p = p_pre[n]
            idx = torch.nonzero(masks[n].reshape(-1), as_tuple=False).reshape(-1).to(p.device)
            self.idx[n] = idx
            pre_v.append(p.detach().reshape(-1)[idx].float())
            delta_v.append(p_ft[n].detach().to(p.device).reshape(-1)[idx].float() - pre_v[-1])
            score_v.append(base_scores[n].reshape(-1)[idx.cpu()].float().to(p.device))
        self.sizes = [len(self.idx[n]) for n in self.names]
        self.pre, self.delta, self.score = torch.cat(pre_v), torch.cat(delta_v), torch.cat(score_v)

    def __len__(self) -> int:
        return int(self.delta.numel())

    def ranks(self) -> torch.Tensor:
        """Each candidate's rank by the base score (0 = the highest; ties by position), as floats."""
        out = torch.empty(len(self), device=self.delta.device)
        out[torch.argsort(self.score, descending=True, stable=True)] = torch.arange(
            len(self), dtype=torch.float32, device=self.delta.device)
        return out

    @torch.no_grad()
    def hold(self, m: torch.Tensor) -> None:
        """Write θ_pre + m ⊙ Δ at the candidates (exact: from the saved θ_pre values, no drift)."""
        values = self.pre + m.float() * self.delta
        for n, v in zip(self.names, values.split(self.sizes)):
            p = self.params[n]
            p.detach().reshape(-1)[self.idx[n]] = v.to(p.dtype)

    def grad(self) -> torch.Tensor:
        """∂L/∂m = ∂L/∂θ ⊙ Δ at the candidates (zeros where a tensor got no gradient); clears the grads."""
        parts = []
        for n in self.names:
            p = self.params[n]
            parts.append(p.grad.reshape(-1)[self.idx[n]].float() if p.grad is not None
                         else torch.zeros(len(self.idx[n]), device=self.delta.device))
            p.grad = None
        return torch.cat(parts) * self.delta

    def region(self, mask: torch.Tensor, shapes: dict[str, tuple[int, ...]]) -> Region:
        chosen = {n: idx[m].cpu() for n, idx, m in zip(self.names, self.idx.values(), mask.bool().split(self.sizes))}
        return Region(shapes, chosen)


def base_scores(pre, ft, train, opts: RelaxedOptions, *, progress: bool = False) -> dict[str, torch.Tensor]:
    """The score γ_base and the candidate set are drawn from: |Δ| or the saliency."""
    if opts.base == "movement":
        return movement(pre, ft, opts.graftable)
    return saliency_scores(pre, ft, train, opts.saliency, opts.graftable, progress=progress)


@torch.no_grad()
def accuracy(scorer, examples, micro_batch: int) -> float:
    """Accuracy of ``scorer`` on ``examples``."""
    device = next(scorer.parameters()).device
    correct = 0
    for start in range(0, len(examples), micro_batch):
        batch = scorer.collate(examples[start:start + micro_batch])
        batch = {k: v.to(device) for k, v in batch.items()}
        labels = batch.pop("labels")
        correct += int((scorer(**batch).argmax(-1) == labels).sum())
    return correct / max(1, len(examples))


def relaxed_localize(pre, ft, data, opts: RelaxedOptions, *, progress: bool = False) -> Localization:
    """Regions of exactly each of ``opts.budgets``' sizes (see the module doc); ``pre`` restored bit-exactly."""
    train, dev = examples_of(data)
    if not train:
        raise SkillgraftError("a learned localizer needs training examples")
    if opts.select_on in ("dev", "train+dev") and not dev:
        raise SkillgraftError(f"select_on={opts.select_on!r} needs dev examples (data with .dev), or select_on 'train'")
    budgets = list(dict.fromkeys(opts.budgets or []))
    if not budgets or any(b.rounding for b in budgets):
        raise SkillgraftError("the relaxed localizers need budgets that are fractions or counts (exact sizes), "
                              "not 'round'")
    names = graftable_names(pre, opts.graftable)
    check_compatible(pre, ft, names)
    shapes = region_universe(pre, opts.graftable)
    universe = sum(math.prod(s) for s in shapes.values())
    sizes = {b: b.size(universe) for b in budgets}
    base_k = max(1, round(opts.sparsity * universe))
    t0 = time.perf_counter()
    scores = base_scores(pre, ft, train, opts, progress=progress)
    score_seconds = time.perf_counter() - t0
    c = universe if opts.candidates is None else min(universe, max(math.ceil(opts.candidates * universe),
                                                                   max(sizes.values()), base_k))
    start_k = None if opts.anneal_from is None else min(c, max(round(opts.anneal_from * universe), *sizes.values()))
    select = {"dev": dev, "train+dev": train + dev, "train": train, "last": []}[opts.select_on]
    with preserved(pre, names + carried_names(pre)):
        params, source = dict(pre.named_parameters()), dict(ft.named_parameters())
        with torch.no_grad():
            for n in carried_names(pre):  # θ_pre wears the fine-tuned task head (head mode)
                params[n].copy_(source[n])
        for p in pre.parameters():
            p.requires_grad_(False)
        cand = _Candidates(pre, ft, names, top_k_masks(scores, c), scores)
        for p in cand.params.values():
            p.requires_grad_(True)
            p.grad = None
        pre.eval()
        run = _Trajectory(pre, cand, train, select, opts, progress)
        if opts.relaxation == "sigmoid":
            found = run.sigmoid(sizes, base_k)
        else:
            found = {}
            for b, k in sizes.items():
                found |= (run.straight_through(b, k, start_k) if opts.relaxation == "straight-through"
                          else run.hard_concrete(b, k))
    regions = {b: cand.region(found[b]["mask"], shapes) for b in budgets}
    summary = {"budgets": [b.key for b in budgets], "config": opts.to_dict(), "candidates": len(cand),
               "base_size": base_k if opts.relaxation == "sigmoid" else None, "score_seconds": score_seconds,
               "best_step": {b.key: found[b]["step"] for b in budgets},
               "best_score": {b.key: found[b]["score"] for b in budgets},
               "step_seconds": float(np.median(run.step_times)) if run.step_times else 0.0, "history": run.history}
    return Localization(regions, summary)


class _Trajectory:
    """One optimisation of z on the candidates, scoring the exact-size regions every ``eval_every`` steps."""

    def __init__(self, pre, cand: _Candidates, train, select, opts: RelaxedOptions, progress: bool):
        self.pre, self.cand, self.train, self.select, self.opts = pre, cand, train, select, opts
        self.progress = progress
        self.history: list[dict] = []
        self.step_times: list[float] = []

    def _optimizer(self, z: torch.Tensor) -> torch.optim.Optimizer:
        cls = torch.optim.Adam if self.opts.optimizer == "adam" else torch.optim.SGD
        return cls([z], lr=self.opts.lr)

    def _step(self, optim, z: torch.Tensor, grad: torch.Tensor) -> None:
        if self.opts.optimizer == "nsgd":  # one scale per step: the gradient's RMS over the candidates
            grad = grad / grad.pow(2).mean().sqrt().clamp_min(1e-30)
        z.grad = grad
        optim.step()

    def _backward(self, rng: np.random.RandomState) -> torch.Tensor:
        """∂L/∂m on one step's batch at the mask the model currently holds."""
        n = min(self.opts.batch_size, len(self.train))
        order = rng.permutation(len(self.train))[:n] if n < len(self.train) else np.arange(len(self.train))
        device = self.cand.delta.device
        total = 0.0
        for start in range(0, len(order), self.opts.micro_batch):
            batch = self.pre.collate([self.train[i] for i in order[start:start + self.opts.micro_batch]])
            batch = {k: v.to(device) for k, v in batch.items()}
            labels = batch.pop("labels")
            loss = torch.nn.functional.cross_entropy(self.pre(**batch).float(), labels, reduction="sum") / n
            loss.backward()
            total = total + loss.detach()
        check_loss(total, "localization", len(self.step_times) + 1)  # before z moves: a NaN is never stored
        return self.cand.grad()

    def _score(self, mask: torch.Tensor) -> float:
        if not self.select:
            return 0.0
        self.cand.hold(mask)
        return accuracy(self.pre, self.select, self.opts.micro_batch)

    def _keep(self, best: dict, step: int, mask: torch.Tensor, label: str, row: dict) -> None:
        acc = self._score(mask)
        row[f"{label}:acc"] = acc
        if self.opts.select_on == "last" or acc > best["score"]:
            best.update(score=acc, step=step, mask=mask.clone())

    def sigmoid(self, sizes: dict, base_k: int) -> dict:
        """Paper Eq. 3–4 on the candidates: one trajectory, every budget's exact top-k of z scored."""
        opts, cand = self.opts, self.cand
        gen = torch.Generator().manual_seed(opts.seed)
        u = torch.rand(len(cand), generator=gen).to(cand.delta.device)
        on_base = top_k_flat(cand.score, base_k)
        z = torch.where(on_base, opts.sigmoid_bias - u, u - opts.sigmoid_bias).requires_grad_(True)
        optim = self._optimizer(z)
        best = {b: {"score": -1.0, "step": 0, "mask": None} for b in sizes}
        rng = np.random.RandomState(opts.seed)

        def score(step: int) -> None:
            row = {"step": step}
            for b, k in sizes.items():
                self._keep(best[b], step, top_k_flat(z.detach(), k).float(), b.label, row)
            self.history.append(row)

        score(0)
        bar = tqdm(range(1, opts.steps + 1), desc="localize (sigmoid)", disable=not self.progress)
        for step in bar:
            t0 = time.perf_counter()
            gamma = torch.sigmoid(z.detach())
            cand.hold(gamma)
            g = self._backward(rng)
            self._step(optim, z, g * gamma * (1 - gamma))
            self.step_times.append(time.perf_counter() - t0)
            if step % opts.eval_every == 0 or step == opts.steps:
                score(step)
        bar.close()
        return best

    def straight_through(self, budget, k: int, start_k: int | None = None) -> dict:
        """The binary graft of exactly k coordinates forward, ∂L/∂m backward (one trajectory per budget); with
        ``start_k`` the forward mask is pruned from start_k to k over ``anneal_steps`` first."""
        opts, cand = self.opts, self.cand
        ranks = cand.ranks()
        if start_k is None:
            z = top_k_flat(cand.score, k).float() + 1e-3 * (1 - ranks / len(cand))
        else:  # the base score's order, on the scale of one nsgd step per coordinate
            z = 1 - ranks / len(cand)
        z.requires_grad_(True)
        optim = self._optimizer(z)
        best = {"score": -1.0, "step": 0, "mask": None}
        rng = np.random.RandomState(opts.seed)
        label = budget.label
        first = opts.anneal_steps if start_k is not None else 0
        bar = tqdm(range(opts.steps + 1), desc=f"localize (straight-through {label})", disable=not self.progress)
        for step in bar:
            size = k if step >= first else round(math.exp(
                math.log(start_k) * (1 - step / first) + math.log(k) * step / first))
            mask = top_k_flat(z.detach(), size).float()
            if step >= first and (step % opts.eval_every == 0 or step in (first, opts.steps)):
                row = {"step": step, "budget": label}
                self._keep(best, step, mask, label, row)
                self.history.append(row)
            if step == opts.steps:
                break
            t0 = time.perf_counter()
            cand.hold(mask)
            self._step(optim, z, self._backward(rng))
            self.step_times.append(time.perf_counter() - t0)
        bar.close()
        return {budget: best}

    def hard_concrete(self, budget, k: int) -> dict:
        """L0 hard-concrete gates on the candidates, E‖z‖₀ held at k by a penalty; regions: top-k of log α."""
        opts, cand = self.opts, self.cand
        n = len(cand)
        device = cand.delta.device
        shift = HC_BETA * math.log(-HC_LOW / HC_HIGH)  # P(z > 0) = σ(log α − shift)
        p_off = min(0.5, 0.1 * k / max(1, n - k))
        on, off = math.log(0.95 / 0.05) - shift, math.log(p_off / (1 - p_off)) + shift
        # P(z = 1) = σ(log α + shift): 0.95 on the base region; P(z > 0) = p_off elsewhere (k/10 open gates)
        on_base = top_k_flat(cand.score, k)
        ranks = cand.ranks()
        log_alpha = torch.where(on_base, torch.full((n,), on, device=device), torch.full((n,), off, device=device))
        log_alpha = (log_alpha + 1e-3 * (1 - ranks / n)).requires_grad_(True)  # ties by the base score
        optim = self._optimizer(log_alpha)
        gen = torch.Generator(device=device).manual_seed(opts.seed)
        best = {"score": -1.0, "step": 0, "mask": None}
        rng = np.random.RandomState(opts.seed)
        label = budget.label
        bar = tqdm(range(opts.steps + 1), desc=f"localize (hard-concrete {label})", disable=not self.progress)
        for step in bar:
            if step % opts.eval_every == 0 or step == opts.steps:
                row = {"step": step, "budget": label,
                       "expected_size": float(torch.sigmoid(log_alpha.detach() - shift).sum())}
                self._keep(best, step, top_k_flat(log_alpha.detach(), k).float(), label, row)
                self.history.append(row)
            if step == opts.steps:
                break
            t0 = time.perf_counter()
            u = torch.rand(n, generator=gen, device=device).clamp(1e-6, 1 - 1e-6)
            s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / HC_BETA)
            z = (s * (HC_HIGH - HC_LOW) + HC_LOW).clamp(0, 1)
            cand.hold(z.detach())
            g = self._backward(rng)  # ∂L/∂z
            expected = torch.sigmoid(log_alpha - shift).sum()
            penalty = opts.l0_penalty * ((expected - k) / k) ** 2
            optim.zero_grad()
            torch.autograd.backward([z, penalty], [g, torch.ones_like(penalty)])
            if opts.optimizer == "nsgd":
                log_alpha.grad /= log_alpha.grad.pow(2).mean().sqrt().clamp_min(1e-30)
            optim.step()
            self.step_times.append(time.perf_counter() - t0)
        bar.close()
        return {budget: best}


class Relaxed(Localizer):
    """A learned localizer with a choice of relaxation, optimizer and base score (see the module doc)."""

    Options = RelaxedOptions
    summary = "learned mask: sigmoid (paper) or straight-through binary graft; SGD or Adam; |Δ| or saliency base"

    def run(self, pre, ft, data, options=None, *, progress: bool = False) -> Localization:
        return relaxed_localize(pre, ft, data, self.options(options), progress=progress)


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
