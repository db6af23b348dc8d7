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
only when a *lower confidence bound* on its share reaches τ, not its point estimate: a paired bootstrap over the
selection rows (graft and FT scored on the same resampled rows, :data:`BOOTSTRAP_RESAMPLES` resamples drawn from
a fixed seed, so the bound is deterministic), the bound being the (1 − c) quantile of the resampled shares
(:func:`share_bound`). The search then does not stop at the first crossing: it scores the whole coarse grid
k₀, 4k₀, 16k₀, … , |U| and walks it down from the top (a fixed-sequence test: every larger grid size must pass
too), then bisects below the smallest passing grid size; the answer is the smallest probed size from which every
larger probed size passes. The result keeps the point estimate, the bound, the confidence, the rows, the size
the point estimate alone would choose, and how many selection rows would let the bound confirm that size.
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
# The paired bootstrap of a share's lower bound (part of store keys through KEEP_BOUND: a change re-computes).
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
KEEP_BOUND = f"paired-bootstrap-{BOOTSTRAP_RESAMPLES}-seed{BOOTSTRAP_SEED}"


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
        "of its share of FT (a seeded paired bootstrap over the selection rows) reaches it"))
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


def share_bound(graft: Outcome, ft: Outcome, confidence: float, weights: np.ndarray | None = None) -> float | None:
    """The lower confidence bound of graft's share of FT's score: the (1 − confidence) quantile of the paired
    bootstrap shares (the smallest resampled share s with at least a 1 − confidence fraction of resamples ≤ s).
    None without per-row outcomes."""
    if graft.pred is None or ft.pred is None:
        return None
    if len(graft.pred) != len(ft.pred):
        raise SkillgraftError(f"graft and FT were scored on different rows ({len(graft.pred)} vs {len(ft.pred)})")
    weights = resample_weights(len(ft.pred)) if weights is None else weights
    return float(np.quantile(bootstrap_shares(graft, ft, weights), 1 - confidence, method="inverted_cdf"))


def rows_needed(share: float, bound: float | None, rows: int | None, target: float) -> int | None:
    """Selection rows that would let the bound reach ``target`` for a size whose point share is ``share`` and
    whose bound on ``rows`` rows is ``bound`` (the bound's distance to the point estimate shrinks as 1/√rows).
    None when the point estimate itself is below the target (no number of rows confirms it)."""
    if bound is None or rows is None or not _reaches(share, target):
        return None
    if _reaches(bound, target):
        return rows
    if share <= target:  # exactly at the target: no finite number of rows lifts the bound to it
        return None
    return int(math.ceil(rows * ((share - bound) / (share - target)) ** 2))


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
                confidence: float | None = None) -> list[KeepResult]:
    """The smallest size k in [start, largest] whose share of ``reference`` reaches τ, for each τ (module doc).

    ``score_at(k)`` scores the family's region of size k on the selection split (a number, or an
    :class:`Outcome` with per-row predictions); each size is scored once, whatever the number of targets.
    ``reference`` is FT's score (Outcome) on the same rows (> 0). ``largest`` is the family's largest region (the
    whole universe, or fewer when the ranking covers only some coordinates); ``universe`` (default ``largest``)
    is what densities are fractions of. ``confidence`` None: the point estimate decides (gallop, stop at the
    first crossing, bisect); a number: the paired-bootstrap lower bound decides, and every larger probed size
    must pass too.
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
    weights = resample_weights(ref.rows) if confidence is not None and ref.rows else None

    def probe(k: int, seen: list[Probe]) -> Probe:
        if k not in cache:
            t0 = time.perf_counter()
            got = as_outcome(score_at(k))
            if weights is not None and got.pred is None:
                raise SkillgraftError("a keep search with a confidence needs per-row outcomes of every size scored "
                                      "(an Outcome), not a bare score")
            bound = None if weights is None else share_bound(got, ref, confidence, weights)
            cache[k] = Probe(k, got.score, got.score / ref.score, time.perf_counter() - t0, bound)
        seen.append(cache[k])
        return cache[k]

    bounded = weights is not None
    if bounded:  # the whole coarse grid, every target's first probes: no stop at the first (noisy) crossing
        grid, k = [], start
        while k < largest:
            grid.append(k)
            k *= factor
        grid.append(largest)
    out = []
    for tau in targets:
        seen: list[Probe] = []
        if bounded:
            passes = lambda p: _reaches(p.bound, tau)  # noqa: E731
            for k in reversed(grid):
                probe(k, seen)
            while True:  # the smallest probed size from which every larger probed size passes; bisect below it
                sizes = sorted(cache)
                failing = [s for s in sizes if not passes(cache[s])]
                hi = min((s for s in sizes if s > max(failing, default=0)), default=None)
                lo = max(failing, default=None)
                if hi is None or lo is None or hi - lo <= 1 or hi <= lo * (1 + tolerance):
                    break
                probe(min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi)))), seen)
            size = hi
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
        out.append(_result(tau, size, cache, seen, universe, confidence if bounded else None, ref.rows))
    return out


def _result(tau: float, size: int | None, cache: dict[int, Probe], seen: list[Probe], universe: int,
            confidence: float | None, rows: int | None) -> KeepResult:
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
        result.rows_needed = rows_needed(p.share, p.bound, rows, tau)
        detail = (f"the point estimate reaches {tau:g} at {point:,} coordinates (share {p.share:.3f}, bound "
                  f"{p.bound:.3f})" + (f": about {result.rows_needed:,} selection rows would confirm it at "
                                       f"{confidence:.0%}" if result.rows_needed else ""))
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
