"""Keep target: the smallest region that keeps a share of FT's score on a selection split.

A user knows how much of the fine-tuned skill they must keep, not which budget gives it. For a share τ:

    k*(τ) = min { k : score_sel(θ_pre + γ_k ⊙ Δ) ≥ τ · score_sel(θ_ft) },   γ_k = the top-k of one ranking r

where score_sel is the task metric on a *selection* split (never the test rows a report scores on) and the
regions γ_1 ⊂ γ_2 ⊂ … are one nested family: the top-k of a score-based localizer's scores, or of the learned
localizer's γ at the end of one trajectory (:func:`skillgraft.graft.localizers.learned.localize` with
``keep=``), so no size is learned from scratch. The score is monotone-ish in k, so a galloping search
(k = k₀, 4k₀, 16k₀, … up to |U|) brackets k*, and bisection on a log scale narrows the bracket until its
ends differ by less than a factor (1 + tolerance). Every probe (size, score, share, seconds) is kept; the
answer is the smallest probed size that reaches τ. When no size up to the whole universe reaches τ, the
result says so and gives the best share reached. Several targets share one cache of probes.

**With a stated confidence** (``confidence=c``, the default of :class:`KeepSpec`: 0.9) a size counts as reaching τ
only when a *lower confidence bound* on its share reaches τ, not its point estimate. For accuracy the bound is
exact: with a the FT accuracy, p = P(graft right | FT right) and q = P(graft right | FT wrong),

    share = acc(graft) / acc(FT) = p + q (1 − a) / a  ≥  p,

so the one-sided Clopper–Pearson lower bound of p (graft right on x of the n selection rows FT gets right) is a lower
bound of the share (:func:`agreement_bound`; it ignores what the graft gains on FT's wrong rows, so it is
conservative, never optimistic: with no miss at all it is (1 − c)^(1/n), not 1). For F1 (no such identity) it is
the (1 − c) quantile of a seeded paired bootstrap (:func:`share_bound` ``method="bootstrap"``; approximate).

The search is a fixed-sequence test (as in Learn then Test, Angelopoulos et al. 2021), in two stages that share the
risk 1 − c (each bound at 1 − (1 − c)/2): the coarse grid k₀, 4k₀, 16k₀, … , |U| walked down from the top, stopping
at the first size that fails; then, below the smallest passing grid size, a walk down by the factor
(1 + tolerance) (4^(1/m)), stopping at the first failure. The answer is the last size that passed. If the share
grows with k (nested regions), each stage wrongly passes a size below the true threshold with probability at most
(1 − c)/2, so the answer keeps τ with probability ≥ c. (Bisection would test several sizes near the threshold,
each a fresh chance of a lucky pass: the winner's curse again.) The result keeps the point estimate, the bound, the
confidence, the rows, the size the point estimate alone would choose, and how many selection rows would let the
bound confirm that size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.lazy import np
from skillgraft.lazy import torch
from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.graft.region import Region, numel_of
from skillgraft.graft.selection import Budget, as_list
from skillgraft.spec import Spec

Shapes = dict[str, tuple[int, ...]]
# The learned localizer's order (part of store keys: a change of it re-computes stored keep searches).
# 2: the rounded γ by drift, then the rest by |Δ|; 1 (never released): every coordinate by drift.
LEARNED_ORDER = 2
# The share's lower bound and the search's test order (part of store keys through KEEP_BOUND: a change re-computes).
# v3: the exact agreement bound (accuracy) and the two-stage fixed-sequence walk; v2 was the paired bootstrap for
# every metric with bisection below the coarse grid.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
KEEP_BOUND = f"v3-clopper-pearson-agreement-fixed-sequence;f1:paired-bootstrap-{BOOTSTRAP_RESAMPLES}-seed{BOOTSTRAP_SEED}"
BOUND_METHODS = ("exact", "bootstrap")


def check_share(value) -> float:
    """A keep share in (0, 1] (a number, or a string such as ``"0.95"``); one clear line otherwise."""
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise SkillgraftError(f"keep target {value!r} is not a number: give a share of FT's score in (0, 1], "
                              "e.g. 0.95") from None
    if isinstance(value, bool) or not math.isfinite(share) or not 0 < share <= 1:
        raise SkillgraftError(f"keep target {value!r} is impossible: give a share of FT's score in (0, 1], e.g. 0.95")
    return share


class KeepSpec(Spec):
    """Keep targets: ask for a share of FT's score, get the smallest region reaching it (see module doc)."""

    keep: list[float] | None = Field(None, description=(
        "shares of FT's score to keep, in (0, 1] (several allowed: 0.95,0.99): the smallest region of the localizer "
        "reaching each on a selection split (the data's dev split, else a held-out slice of the localization rows)"))
    keep_tolerance: float = Field(0.1, gt=0, le=1, description=(
        "keep search: stop when the smallest size reaching the target and the largest probed below it differ by "
        "less than this factor"))
    keep_from: Budget = Field(Budget.parse(1e-6), description=(
        "keep search: the first (smallest) size probed, a fraction of the graftable parameters or a count"))
    keep_holdout: float = Field(0.2, gt=0, lt=1, description=(
        "keep search on data without a dev split: the fraction of the localization rows held out as the selection "
        "split (the localizer learns on the rest)"))
    keep_confidence: float = Field(0.9, ge=0.5, lt=1, description=(
        "keep search: the confidence of the promise; a size reaches a target only when the lower confidence bound "
        "of its share of FT on the selection rows reaches it (exact for accuracy; docs/keep.md)"))
    keep_data: Path | None = Field(None, description=(
        "keep search: a file of labelled examples (.jsonl/.tsv/.csv, the task's layout) to choose the size on, "
        "instead of the dev split or a held-out slice; never the test rows"))

    @field_validator("keep", mode="before")
    @classmethod
    def _shares(cls, value):
        values = as_list(value)
        if values is None:
            return None
        try:
            return list(dict.fromkeys(check_share(v) for v in values))
        except SkillgraftError as e:
            raise ValueError(str(e)) from None

    @field_validator("keep_from", mode="before")
    @classmethod
    def _budget(cls, value):
        try:
            budget = Budget.parse(value)
        except SkillgraftError as e:
            raise ValueError(str(e)) from None
        if budget.rounding:
            raise ValueError("keep_from must be a fraction or a count, not 'round'")
        return budget


# ---------------------------------------------------------------------------------------------- the nested family
class Ranking:
    """A strict order over (a subset of) the graftable coordinates, best first: the nested family γ_k = first k.

    ``order`` holds flat positions in the universe (tensors in ``shapes`` order, row-major inside each).
    Ties follow the shared selection's rule (the earlier position wins), so ``region(k)`` equals
    ``select(scores, k)`` for the scores it was built from.
    """

    def __init__(self, shapes: Shapes, order: torch.Tensor):
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        self.order = order.reshape(-1).to(torch.int64).cpu()
        self.universe = sum(numel_of(s) for s in self.shapes.values())
        self._starts = torch.tensor([0] + [numel_of(s) for s in self.shapes.values()]).cumsum(0)

    @classmethod
    def from_keys(cls, shapes: Shapes, positions: torch.Tensor, keys: torch.Tensor, *,
                  first: torch.Tensor | None = None, then: torch.Tensor | None = None) -> Ranking:
        """Coordinates at flat ``positions`` ranked by ``keys`` (higher first; NaN highest; ties: earlier first).

        With a boolean ``first``, those coordinates come first (by ``keys``) and the rest follow by ``then``."""
        positions = positions.reshape(-1).to(torch.int64).cpu()
        if first is None:
            return cls(shapes, _order(positions, keys))
        first = first.reshape(-1).cpu().bool()
        then = keys if then is None else then
        return cls(shapes, torch.cat([_order(positions[first], keys.reshape(-1).cpu()[first]),
                                      _order(positions[~first], then.reshape(-1).cpu()[~first])]))

    @classmethod
    def from_scores(cls, scores: dict[str, torch.Tensor], shapes: Shapes | None = None) -> Ranking:
        """The ranking of a score-based localizer's scores (which may cover only some tensors of ``shapes``)."""
        shapes = {n: tuple(s.shape) for n, s in scores.items()} if shapes is None else dict(shapes)
        offsets, start = {}, 0
        for n, s in shapes.items():
            offsets[n] = start
            start += numel_of(s)
        for n, s in scores.items():
            if n not in shapes or tuple(shapes[n]) != tuple(s.shape):
                raise SkillgraftError(f"scores for {n!r} of shape {tuple(s.shape)} do not fit the universe "
                                      f"({shapes.get(n, 'absent')})")
        names = [n for n in shapes if n in scores]
        positions = torch.cat([torch.arange(numel_of(shapes[n])) + offsets[n] for n in names])
        keys = torch.cat([scores[n].reshape(-1).detach().cpu().to(torch.float64) for n in names])
        return cls.from_keys(shapes, positions, keys)

    def __len__(self) -> int:
        """How many coordinates the ranking orders (the largest region it gives)."""
        return int(self.order.numel())

    def region(self, k: int) -> Region:
        """γ_k: the first k coordinates of the ranking."""
        chosen = torch.sort(self.order[:max(0, min(k, len(self)))]).values
        which = torch.searchsorted(self._starts, chosen, right=True) - 1
        indices = {}
        for i, n in enumerate(self.shapes):
            part = chosen[which == i]
            if part.numel():
                indices[n] = part - self._starts[i]
        return Region(self.shapes, indices)


def _order(positions: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``positions`` sorted by ``keys``, higher first (NaN highest), ties by the smaller position."""
    keys = torch.nan_to_num(keys.reshape(-1).to(torch.float64), nan=float("inf"), posinf=float("inf"),
                            neginf=float("-inf"))
    by_position = torch.argsort(positions, stable=True)
    positions, keys = positions[by_position], keys[by_position]
    return positions[torch.argsort(-keys, stable=True)]


# ---------------------------------------------------------------------------------------------- the bound
@dataclass
class Outcome:
    """A model's score on the selection split and, where the metric has them, its per-row predictions.

    ``pred`` / ``labels``: the predicted and gold label index of every row (None: no per-row outcomes, e.g.
    open-ended token accuracy; then only the point estimate exists). ``metric``: ``accuracy`` or ``f1``."""

    score: float
    pred: np.ndarray | None = None
    labels: np.ndarray | None = None
    metric: str = "accuracy"
    positive: int = 1

    @property
    def rows(self) -> int | None:
        return None if self.pred is None else int(len(self.pred))

    def counts(self, weights: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Per resample (rows of ``weights``: how often each row is drawn): the metric's numerator and
        denominator (accuracy: correct rows, n; F1: 2·TP, 2·TP + FP + FN)."""
        pred, labels = self.pred, self.labels
        if self.metric == "f1":
            pos_pred, pos_gold = pred == self.positive, labels == self.positive
            tp = weights @ (pos_pred & pos_gold).astype(np.float64)
            wrong = weights @ (pos_pred ^ pos_gold).astype(np.float64)  # FP + FN
            return 2 * tp, 2 * tp + wrong
        return weights @ (pred == labels).astype(np.float64), weights.sum(1)


def as_outcome(value) -> Outcome:
    """An :class:`Outcome` (a bare number: a score without per-row outcomes)."""
    return value if isinstance(value, Outcome) else Outcome(float(value))


def resample_weights(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``[resamples, n]``: how often each of n rows is drawn in each bootstrap resample (seeded: deterministic)."""
    rng = np.random.default_rng(seed)
    weights = np.zeros((resamples, n))
    for b in range(resamples):
        weights[b] = np.bincount(rng.integers(0, n, n), minlength=n)
    return weights


def bootstrap_shares(graft: Outcome, ft: Outcome, weights: np.ndarray) -> np.ndarray:
    """The share metric(graft) / metric(FT) on each resample of the same rows (paired). F1 of a resample with
    no positives is 1 (as :func:`~skillgraft.evaluate.metrics.f1`); a resample where FT scores 0 counts as a
    share of 0 (conservative)."""
    (gn, gd), (fn, fd) = graft.counts(weights), ft.counts(weights)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(gd > 0, gn / np.where(gd > 0, gd, 1), 1.0)
        f = np.where(fd > 0, fn / np.where(fd > 0, fd, 1), 1.0)
        return np.where(f > 0, g / np.where(f > 0, f, 1), 0.0)


def agreement_bound(graft: Outcome, ft: Outcome, confidence: float) -> float:
    """The exact lower bound of an accuracy share: the one-sided Clopper–Pearson bound of p = P(graft right | FT
    right) from x graft-right rows among the n rows FT gets right (share = p + q(1 − a)/a ≥ p; module doc)."""
    from scipy.stats import beta  # noqa: PLC0415

    right = ft.pred == ft.labels
    n = int(right.sum())
    x = int((graft.pred[right] == graft.labels[right]).sum())
    return 0.0 if x == 0 else float(beta.ppf(1 - confidence, x, n - x + 1))


def share_bound(graft: Outcome, ft: Outcome, confidence: float, weights: np.ndarray | None = None,
                method: str = "exact") -> float | None:
    """The lower confidence bound of graft's share of FT's score on the same rows. ``exact`` (accuracy):
    :func:`agreement_bound`; ``bootstrap`` (and any F1): the (1 − confidence) quantile of the paired bootstrap shares
    (the smallest resampled share s with at least a 1 − confidence fraction of resamples ≤ s). None without
    per-row outcomes."""
    if graft.pred is None or ft.pred is None:
        return None
    if len(graft.pred) != len(ft.pred):
        raise SkillgraftError(f"graft and FT were scored on different rows ({len(graft.pred)} vs {len(ft.pred)})")
    if method not in BOUND_METHODS:
        raise SkillgraftError(f"unknown bound method {method!r}: one of {', '.join(BOUND_METHODS)}")
    if method == "exact" and ft.metric == "accuracy" and graft.metric == "accuracy":
        return agreement_bound(graft, ft, confidence)
    weights = resample_weights(len(ft.pred)) if weights is None else weights
    return float(np.quantile(bootstrap_shares(graft, ft, weights), 1 - confidence, method="inverted_cdf"))


def bound_prose(confidence: float) -> str:
    """How a size is judged at ``confidence``, in words for reports (one source for every report that shows it)."""
    return (f"with {confidence:.0%} confidence: a lower bound of its share (exact for accuracy: the Clopper–Pearson "
            "bound of how often the graft is right where FT is right; a seeded paired bootstrap for F1), in a "
            "fixed-sequence walk down the coarse grid ×4 and then by the tolerance, each stage at "
            f"{1 - (1 - confidence) / 2:.0%}, stopping at the first size that fails (docs/keep.md)")


def rows_needed(share: float, bound: float | None, rows: int | None, target: float) -> int | None:
    """Selection rows that would let an (approximately normal) bound reach ``target`` for a size whose point share
    is ``share`` and whose bound on ``rows`` rows is ``bound`` (the gap shrinks as 1/√rows). None when the point
    estimate itself is below the target (no number of rows confirms it)."""
    if bound is None or rows is None or not _reaches(share, target):
        return None
    if _reaches(bound, target):
        return rows
    if share <= target:  # exactly at the target: no finite number of rows lifts the bound to it
        return None
    return int(math.ceil(rows * ((share - bound) / (share - target)) ** 2))


def rows_needed_exact(graft: Outcome, ft: Outcome, target: float, confidence: float) -> int | None:
    """Selection rows that would let :func:`agreement_bound` reach ``target`` if the graft kept missing FT's right
    rows at the same rate (and FT were right as often): the smallest n_right with the Clopper–Pearson bound of
    ⌊p̂·n_right⌋ of n_right ≥ target, scaled by rows / (FT's right rows). None when p̂ ≤ target (then no number of
    rows confirms it: the graft must agree with FT on more of its right rows)."""
    from scipy.stats import beta  # noqa: PLC0415

    right = ft.pred == ft.labels
    n = int(right.sum())
    if not n:
        return None
    p = float((graft.pred[right] == graft.labels[right]).mean())
    if p <= target:
        return None

    def ok(m: int) -> bool:
        x = math.floor(p * m + 1e-9)
        return x > 0 and beta.ppf(1 - confidence, x, m - x + 1) >= target - 1e-12

    hi = max(n, 1)
    while not ok(hi):
        if hi > 10**9:
            return None
        hi *= 2
    lo = hi // 2 if hi > n else 0
    while hi - lo > 1:  # the smallest m that passes (ok is monotone up to the floor's steps)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return int(math.ceil(hi * len(ft.pred) / n))


def _reaches(value: float | None, target: float) -> bool:
    return value is not None and value >= target - 1e-12


# ---------------------------------------------------------------------------------------------- the search
@dataclass
class Probe:
    """One size tried: the selection score, its share of FT's score, its lower bound, and the seconds it took."""

    size: int
    score: float
    share: float
    seconds: float
    bound: float | None = None    # the share's lower confidence bound (None: point search, or no per-row outcomes)
    outcome: Outcome | None = field(default=None, repr=False, compare=False)  # per-row outcomes (rows_needed)

    def to_dict(self) -> dict:
        return {"size": self.size, "score": self.score, "share": self.share, "bound": self.bound,
                "seconds": self.seconds}


@dataclass
class KeepResult:
    """The answer for one keep target: the smallest probed size reaching it, or the best reached.

    With a confidence, "reaching" means the share's lower bound reaches the target (for this size and every
    larger probed size); without one (``confidence`` None), the point estimate does."""

    target: float
    reached: bool
    size: int | None          # the smallest probed size reaching the target (None: unreachable)
    share: float | None       # its selection share (the point estimate)
    best_size: int            # the size with the best selection share (bound) (unreachable: what to offer)
    best_share: float
    universe: int
    # every probe this target's search looked at, in order (sizes another target scored first included: their
    # seconds count once per target that used them)
    probes: list[Probe] = field(default_factory=list)
    region: Region | None = field(default=None, repr=False)  # γ of `size` (unreachable: of `best_size`)
    confidence: float | None = None  # the stated confidence (None: the point estimate chose)
    bound: float | None = None       # the lower bound of `size`'s share (unreachable: of best_size's)
    rows: int | None = None          # selection rows
    point_size: int | None = None    # the smallest probed size whose point share reaches the target
    rows_needed: int | None = None   # rows that would let the bound confirm point_size
    note: str = ""

    @property
    def density(self) -> float | None:
        return None if self.size is None else self.size / self.universe

    @property
    def seconds(self) -> float:
        return float(sum(p.seconds for p in self.probes))

    def to_dict(self) -> dict:
        return {"target": self.target, "reached": self.reached, "size": self.size, "density": self.density,
                "selection_share": self.share, "confidence": self.confidence, "bound": self.bound,
                "selection_rows": self.rows, "point_size": self.point_size, "rows_needed": self.rows_needed,
                "note": self.note, "best_size": self.best_size, "best_share": self.best_share,
                "universe": self.universe, "probes": [p.to_dict() for p in self.probes],
                "probe_count": len(self.probes), "search_seconds": self.seconds}

    def describe(self) -> str:
        """One line for a console or a report."""
        cost = f"{len(self.probes)} probes, {self.seconds:.0f} s"
        bound = ("" if self.confidence is None or self.bound is None else
                 f", {self.confidence:.0%} lower bound {self.bound:.3f} on {self.rows} rows")
        note = f"; {self.note}" if self.note else ""
        if self.reached:
            return (f"keep {self.target:g}: {self.size:,} coordinates (density {self.density:.2e}), selection share "
                    f"{self.share:.3f}{bound} ({cost}){note}")
        largest = max((p.size for p in self.probes), default=0)
        return (f"keep {self.target:g}: not reached by any size up to {largest:,} coordinates; best selection "
                f"share {self.best_share:.3f} at {self.best_size:,}{bound} ({cost}){note}")


def search_keep(score_at: Callable[[int], float | Outcome], reference: float | Outcome, targets: Sequence[float],
                largest: int, *, start: int = 1, tolerance: float = 0.1, factor: int = 4, universe: int | None = None,
                confidence: float | None = None, method: str = "exact") -> list[KeepResult]:
    """The smallest size k in [start, largest] whose share of ``reference`` reaches τ, for each τ (module doc).

    ``score_at(k)`` scores the family's region of size k on the selection split (a number, or an
    :class:`Outcome` with per-row predictions); each size is scored once, whatever the number of targets.
    ``reference`` is FT's score (Outcome) on the same rows (> 0). ``largest`` is the family's largest region (the
    whole universe, or fewer when the ranking covers only some coordinates); ``universe`` (default ``largest``)
    is what densities are fractions of. ``confidence`` None: the point estimate decides (gallop, stop at the
    first crossing, bisect); a number: the lower bound (``method``, :func:`share_bound`) decides, in the two-stage
    fixed-sequence walk, each stage's bound at 1 − (1 − confidence)/2.
    """
    ref = as_outcome(reference)
    if not ref.score or ref.score <= 0 or not math.isfinite(ref.score):
        raise SkillgraftError(f"FT's score on the selection split is {ref.score}: a share of it cannot be kept")
    if largest < 1:
        raise SkillgraftError("the ranking orders no coordinates: nothing to search")
    if confidence is not None and not 0 < confidence < 1:
        raise SkillgraftError(f"keep confidence {confidence} is not in (0, 1)")
    targets = [check_share(t) for t in targets]
    universe = universe or largest
    start = max(1, min(int(start), largest))
    cache: dict[int, Probe] = {}
    bounded = confidence is not None and ref.rows is not None
    stage = None if not bounded else 1 - (1 - confidence) / 2  # two stages share the risk 1 − confidence
    weights = resample_weights(ref.rows) if bounded and (method == "bootstrap" or ref.metric != "accuracy") else None

    def probe(k: int, seen: list[Probe]) -> Probe:
        if k not in cache:
            t0 = time.perf_counter()
            got = as_outcome(score_at(k))
            if bounded and got.pred is None:
                raise SkillgraftError("a keep search with a confidence needs per-row outcomes of every size scored "
                                      "(an Outcome), not a bare score")
            bound = share_bound(got, ref, stage, weights, method) if bounded else None
            cache[k] = Probe(k, got.score, got.score / ref.score, time.perf_counter() - t0, bound,
                             got if bounded else None)
        seen.append(cache[k])
        return cache[k]

    if bounded:
        grid, k = [], start
        while k < largest:
            grid.append(k)
            k *= factor
        grid.append(largest)
        steps = max(1, math.ceil(math.log(factor) / math.log1p(tolerance)))
        ratio = factor ** (1 / steps)  # the fine walk's factor: (1 + tolerance) or a little less
    out = []
    for tau in targets:
        seen: list[Probe] = []
        if bounded:
            passes = lambda p: _reaches(p.bound, tau)  # noqa: E731
            size = lo = None
            for k in reversed(grid):  # stage 1: the coarse grid from the top, to the first failure
                if not passes(probe(k, seen)):
                    lo = k
                    break
                size = k
            if size is not None and lo is not None:  # stage 2: down from it by `ratio`, to the first failure
                anchor, j = size, 1
                while True:
                    k = round(anchor / ratio ** j)
                    j += 1
                    if k >= size:
                        continue  # rounding repeated a size
                    if k <= lo or not passes(probe(k, seen)):
                        break
                    size = k
        else:
            passes = lambda p: _reaches(p.share, tau)  # noqa: E731
            k = start
            while True:  # gallop: start, 4·start, 16·start, … until τ is reached or the whole universe is tried
                if passes(probe(k, seen)) or k == largest:
                    break
                k = min(largest, k * factor)
            reached = sorted(p.size for p in cache.values() if passes(p))
            if reached:
                hi = reached[0]
                lo = max((s for s in cache if s < hi), default=None)
                while lo is not None and hi - lo > 1 and hi > lo * (1 + tolerance):  # bisect on a log scale
                    mid = min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))
                    if passes(probe(mid, seen)):
                        hi = mid
                    else:
                        lo = mid
            size = min((p.size for p in cache.values() if passes(p)), default=None)
        out.append(_result(tau, size, cache, seen, universe, confidence if bounded else None, ref, method, stage))
    return out


def _result(tau: float, size: int | None, cache: dict[int, Probe], seen: list[Probe], universe: int,
            confidence: float | None, ref: Outcome, method: str = "exact", stage: float | None = None
            ) -> KeepResult:
    rows = ref.rows
    key = (lambda p: (p.bound, p.share, -p.size)) if confidence is not None else (lambda p: (p.share, -p.size))
    best = max(cache.values(), key=key)
    point = min((p.size for p in cache.values() if _reaches(p.share, tau)), default=None)
    shown = cache[size] if size is not None else best
    result = KeepResult(tau, size is not None, size, shown.share if size is not None else None, best.size,
                        best.share, universe, list({p.size: p for p in seen}.values()), confidence=confidence,
                        bound=shown.bound, rows=rows, point_size=point)
    if confidence is None:
        if rows is None and point is not None:
            result.note = "point estimate (no per-row outcomes for a bound)"
        return result
    detail = ""
    if point is not None and (size is None or point < size):
        p = cache[point]
        exact = method == "exact" and ref.metric == "accuracy" and p.outcome is not None
        result.rows_needed = (rows_needed_exact(p.outcome, ref, tau, stage) if exact
                              else rows_needed(p.share, p.bound, rows, tau))
        detail = (f"the point estimate reaches {tau:g} at {point:,} coordinates (share {p.share:.3f}, bound "
                  f"{p.bound:.3f})" + (f": about {result.rows_needed:,} selection rows would confirm it at "
                                       f"{confidence:.0%}" if result.rows_needed else
                                       (": no number of rows confirms it (the graft misses more than "
                                        f"{1 - tau:.0%} of the rows FT gets right)" if exact else "")))
    if size is None:
        result.note = (f"the {rows} selection rows are too few for the {confidence:.0%} bound to reach {tau:g} at "
                       f"any size; {detail or 'no size reaches it in the point estimate either'}")
    elif size == max(cache) and detail:
        result.note = f"confirmed only by the largest region; {detail}"
    else:
        result.note = detail
    return result


# ---------------------------------------------------------------------------------------------- with models
def selection_outcome(scorer, examples, batch_size: int = 64) -> Outcome:
    """``scorer``'s task metric on ``examples`` with its per-row predictions (the bound's input)."""
    from skillgraft.evaluate.predict import evaluate  # noqa: PLC0415

    metrics, probs = evaluate(scorer, examples, batch_size=batch_size)
    return _outcome(scorer, examples, metrics, probs)


def _outcome(scorer, examples, metrics: dict, probs: np.ndarray) -> Outcome:
    task = scorer.task
    if probs.shape[-1] < 2 or "accuracy" not in metrics:  # open-ended token accuracy: no per-row outcome
        return Outcome(float(metrics["score"]))
    positive = task.labels.index(task.positive_label) if getattr(task, "positive_label", None) else 1
    metric = "f1" if "f1" in metrics else "accuracy"  # summarize() adds f1 only for an F1 task
    return Outcome(float(metrics["score"]), probs.argmax(-1), np.array([ex.label for ex in examples]), metric,
                   positive)


def selection_score(scorer, examples, batch_size: int = 64) -> float:
    """The task metric of ``scorer`` on ``examples`` (accuracy, F1, or token accuracy for generative data)."""
    return selection_outcome(scorer, examples, batch_size).score


def graft_outcome(pre, ft, examples, *, values: Callable | None = None, batch_size: int = 64
                  ) -> Callable[[Region], Outcome]:
    """outcome(region) = the metric and per-row predictions of θ_pre + γ⊙Δ on ``examples`` (θ_pre restored after
    each call). ``values(region)`` may replace θ_ft's values on the region (e.g. DARE's rescaled Δ)."""
    from skillgraft.graft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.scoring import evaluate_graft  # noqa: PLC0415

    def outcome(region: Region) -> Outcome:
        graft = Graft.from_models(pre, ft, region)
        if values is not None:
            graft = Graft(region, values(region), graft.carried, graft.base_model, graft.base_fingerprint)
        metrics, probs = evaluate_graft(pre, graft, examples, batch_size=batch_size)
        return _outcome(pre, examples, metrics, probs)

    return outcome


def graft_scorer(pre, ft, examples, *, values: Callable | None = None, batch_size: int = 64
                 ) -> Callable[[Region], float]:
    """score(region) = the metric of θ_pre + γ⊙Δ on ``examples`` (θ_pre restored after each call)."""
    outcome = graft_outcome(pre, ft, examples, values=values, batch_size=batch_size)
    return lambda region: outcome(region).score


def keep_search(pre, ft, ranking: Ranking, selection, keep: KeepSpec | Sequence[float], *,
                score: Callable[[Region], float | Outcome] | None = None) -> list[KeepResult]:
    """Search ``ranking``'s nested family for each keep target, scored on the ``selection`` examples, at the
    spec's confidence (``score`` defaults to :func:`graft_outcome`)."""
    spec = keep if isinstance(keep, KeepSpec) else KeepSpec.build({"keep": list(keep)}, where="keep")
    if not spec.keep:
        return []
    if not selection:
        raise SkillgraftError("a keep target needs a selection split (dev examples, distinct from the test rows)")
    if not len(ranking):
        raise SkillgraftError("the localizer ranked no coordinates: no region can keep anything")
    score = score or graft_outcome(pre, ft, selection)
    reference = selection_outcome(ft, selection)
    start = spec.keep_from.size(ranking.universe) if spec.keep_from.count is None else min(spec.keep_from.count,
                                                                                           len(ranking))
    results = search_keep(lambda k: score(ranking.region(k)), reference, spec.keep, len(ranking),
                          start=start, tolerance=spec.keep_tolerance, universe=ranking.universe,
                          confidence=spec.keep_confidence)
    for r in results:
        r.region = ranking.region(r.size if r.reached else r.best_size)
    return results
