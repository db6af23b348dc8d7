"""Surgical fine-tuning: which blocks to train (FIM score, random, explicit), Auto-RGN, ranking stability.

* ``fim:top-K``    — train the K blocks with the highest FIM score on the pre-trained model (Lodha et al.);
* ``fim:bottom-K`` — the K lowest (the control);
* ``random-K``     — K blocks drawn with the data seed;
* ``0,3,5``        — explicit block indices.
The head (and whatever the fine-tuning config leaves on) always trains; every other block is frozen.

Auto-RGN (Lee et al., ICLR 2023): each tensor's learning rate is multiplied by its relative gradient norm
RGN_t = ‖∇_t L‖ / ‖θ_t‖, normalised by the largest RGN of the step (so the multiplier is in (0, 1]).
"""

from __future__ import annotations

import copy
import random
import re

import torch

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.fisher.fisher import FisherConfig
from skillgraft.fisher.scores import LayerScores, block_names, fim_layer_scores, rank_correlation

_SPEC = re.compile(r"^(?:fim(?P<agg>-frob)?:(?P<end>top|bottom)-(?P<k>\d+)|random-(?P<rk>\d+))$")


def parse_spec(spec: str) -> tuple[str, int, str]:
    """``fim:top-2`` → ("top", 2, "sum"); ``fim-frob:bottom-1`` → ("bottom", 1, "frobenius");
    ``random-3`` → ("random", 3, "")."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise SkillgraftError(
            f"--layers {spec!r}: expected fim:top-K, fim:bottom-K, fim-frob:top-K, random-K or indices like '0,3,5'")
    if m["rk"] is not None:
        kind, k, agg = "random", int(m["rk"]), ""
    else:
        kind, k, agg = m["end"], int(m["k"]), "frobenius" if m["agg"] else "sum"
    if k < 1:
        raise SkillgraftError(f"--layers {spec!r}: K must be ≥ 1")
    return kind, k, agg


def resolve_layer_spec(spec: str, *, task=None, model: str | None = None, mode: str = "head", k: int = 16,
                       seed: int = 42, data_dir=None, pooling: str | None = None, scorer=None,
                       examples: list[Example] | None = None, fisher: FisherConfig | None = None,
                       normalize: bool = False) -> list[int]:
    """Block indices a layer spec selects (sorted). FIM specs score the pre-trained model on the k-shot
    training examples (``fisher.n_examples`` caps N); pass ``scorer``/``examples`` to reuse loaded ones."""
    spec = str(spec).strip()
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", spec):
        chosen = sorted({int(x) for x in spec.split(",")})
        n_blocks = _n_blocks(scorer, model, task, mode, pooling) if (scorer is not None or task is not None) else None
        if n_blocks is not None and chosen[-1] >= n_blocks:
            raise SkillgraftError(f"--layers {spec!r}: the model has blocks 0..{n_blocks - 1}")
        return chosen
    kind, count, agg = parse_spec(spec)
    if scorer is None:
        if task is None:
            raise SkillgraftError(f"--layers {spec!r} needs a task (and model) to resolve")
        from skillgraft.models import build_scorer  # noqa: PLC0415

        scorer = build_scorer(model, task, mode, pooling=pooling)
    n_blocks = len(block_names(scorer))
    if count > n_blocks:
        raise SkillgraftError(f"--layers {spec!r}: K={count} but the model has only {n_blocks} blocks")
    if kind == "random":
        return sorted(random.Random(seed).sample(range(n_blocks), count))
    if examples is None:
        from skillgraft.data import load_kshot  # noqa: PLC0415

        examples = load_kshot(scorer.task, k, seed, data_dir).train
    scores = fim_layer_scores(scorer, examples, aggregate=agg, normalize=normalize, config=fisher)
    return scores.top(count) if kind == "top" else scores.bottom(count)


def _n_blocks(scorer, model, task, mode, pooling) -> int:
    if scorer is None:
        from skillgraft.models import build_scorer  # noqa: PLC0415

        scorer = build_scorer(model, task, mode, pooling=pooling)
    return len(block_names(scorer))


# ---------------------------------------------------------------------------------------------- step hooks
class AutoRGN:
    """``finetune(..., step_hook=AutoRGN())``: per-tensor lr = base lr · RGN_t / max_t RGN_t.

    On its first call it splits the optimizer's parameter groups into one group per tensor (optimizer
    state is keyed by parameter, so nothing is lost). Tensors with ‖θ‖ = 0 (a zero-initialised bias)
    have no defined RGN: they keep the base learning rate and do not enter the maximum.
    """

    def __init__(self, record_every: int = 0, names: dict[int, str] | None = None):
        self.record_every = record_every
        self.names = names or {}
        self.base_lr: list[float] | None = None
        self.history: list[dict] = []

    def __call__(self, step: int, optimizer) -> None:
        groups = optimizer.param_groups
        if self.base_lr is None:
            split = [{**g, "params": [p]} for g in groups for p in g["params"]]
            groups[:] = split
            self.base_lr = [g["lr"] for g in groups]
        rgn = []
        with torch.no_grad():
            for g in groups:
                p = g["params"][0]
                w = float(p.detach().float().norm())
                gn = float(p.grad.detach().float().norm()) if p.grad is not None else 0.0
                rgn.append(gn / w if w > 0 else None)
        finite = [r for r in rgn if r is not None]
        top = max(finite) if finite and max(finite) > 0 else 1.0
        mult = [1.0 if r is None else r / top for r in rgn]
        for g, base, m in zip(groups, self.base_lr, mult):
            g["lr"] = base * m
        if self.record_every and step % self.record_every == 0:
            self.history.append({"step": step, "multipliers": {self.names.get(id(g["params"][0]), str(i)): m
                                                               for i, (g, m) in enumerate(zip(groups, mult))}})


class Snapshots:
    """``finetune(..., step_hook=Snapshots(scorer, [0, 50, 100]))``: copies of the weights after N updates."""

    def __init__(self, scorer, steps: list[int]):
        self.scorer = scorer
        self.steps = set(int(s) for s in steps)
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def __call__(self, step: int, optimizer) -> None:
        if step in self.steps:
            self.states[step] = {n: p.detach().to("cpu", copy=True) for n, p in self.scorer.named_parameters()}

    def scorer_at(self, step: int):
        """A copy of the scorer holding the weights after ``step`` updates."""
        if step not in self.states:
            raise SkillgraftError(f"no snapshot at step {step}; have {sorted(self.states)}")
        out = copy.deepcopy(self.scorer)
        with torch.no_grad():
            for n, p in out.named_parameters():
                p.copy_(self.states[step][n])
        out.eval()
        return out


def chain_hooks(*hooks):
    """One step hook calling several in order (None entries skipped)."""
    live = [h for h in hooks if h is not None]

    def hook(step, optimizer):
        for h in live:
            h(step, optimizer)

    return hook if live else None


def ranking_stability(scorers: dict[int, object], examples: list[Example], *, aggregate: str = "sum",
                      normalize: bool = False, config: FisherConfig | None = None) -> tuple[list[dict], dict[int, LayerScores]]:
    """FIM ranking on each checkpoint (``{step: scorer}``) and its Spearman/Kendall correlation with the
    first (lowest-step) checkpoint's and with the previous checkpoint's ranking."""
    if not scorers:
        raise SkillgraftError("ranking stability needs at least one checkpoint")
    scores = {s: fim_layer_scores(sc, examples, aggregate=aggregate, normalize=normalize, config=config)
              for s, sc in sorted(scorers.items())}
    steps = sorted(scores)
    rows, prev = [], None
    for s in steps:
        first = rank_correlation(scores[steps[0]], scores[s])
        row = {"step": s, "ranking": scores[s].ranking(), "top": scores[s].ranking()[0],
               "spearman_vs_first": first["spearman"], "kendall_vs_first": first["kendall"]}
        if prev is not None:
            c = rank_correlation(scores[prev], scores[s])
            row.update(spearman_vs_prev=c["spearman"], kendall_vs_prev=c["kendall"])
        rows.append(row)
        prev = s
    return rows, scores
