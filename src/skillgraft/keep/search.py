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
only when a *lower confidence bound* on its share reaches τ, not its point estimate (:mod:`skillgraft.keep.stats.bound`:
exact for accuracy — by default the paired test of acc(graft) − τ·acc(FT) ≥ 0, which counts the graft's wins on FT's
wrong rows, or (``keep_bound="exact"``) Clopper–Pearson on share ≥ P(graft right | FT right); a paired bootstrap for
F1). **Agreement targets** (``keep_agreement``) ask instead for the smallest region whose predictions agree with FT's
on a share τ of the rows (Clopper–Pearson; no label read; open-ended generative data: :mod:`.agreement`).

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

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from skillgraft.errors import SkillgraftError
from skillgraft.graft.region import Region
from skillgraft.keep.spec import check_share
from skillgraft.keep.stats.bound import (Outcome, as_outcome, betting_bound, betting_test, is_exact, paired_bound,
                                         paired_test, reaches, resample_weights, rows_needed, rows_needed_betting,
                                         rows_needed_exact, rows_needed_paired, share_bound)
from skillgraft.spec import TOLERANCE_MIN


@dataclass
class Probe:
    """One size tried: the selection score, its share of FT's score, its lower bound, and the seconds it took."""

    size: int
    score: float
    share: float
    seconds: float
    bound: float | None = None    # the share's lower confidence bound (None: point search, no per-row outcomes, or
    #                               the paired test, which decides per target: `passed`)
    outcome: Outcome | None = field(default=None, repr=False, compare=False)  # per-row outcomes (rows_needed)
    passed: dict[float, bool] = field(default_factory=dict)  # the paired test's verdict per target tested

    def to_dict(self) -> dict:
        out = {"size": self.size, "score": self.score, "share": self.share, "bound": self.bound,
               "seconds": self.seconds}
        if self.passed:
            out["passed"] = {f"{t:g}": v for t, v in self.passed.items()}
        return out


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
    kind: str = "share"              # "share" (of FT's score) or "agreement" (with FT's predictions; label-free)
    method: str | None = None        # the bound that decided (bound.BOUND_NAMES); None: the point estimate
    next_size: int | None = None     # the next smaller size probed, which failed (None: none below `size`)
    next_rows: int | None = None     # selection rows that would let the bound confirm next_size (None: none would)

    @property
    def key(self) -> str:
        """The target's name in stores and reports: ``0.95`` for a share, ``agreement-0.95`` for agreement."""
        return repr(self.target) if self.kind == "share" else f"agreement-{self.target!r}"

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
                "probe_count": len(self.probes), "search_seconds": self.seconds, "kind": self.kind,
                "bound_method": self.method, "next_size": self.next_size, "next_rows": self.next_rows}

    def describe(self) -> str:
        """One line for a console or a report."""
        cost = f"{len(self.probes)} probes, {self.seconds:.0f} s"
        bound = ("" if self.confidence is None or self.bound is None else
                 f", {self.confidence:.0%} lower bound {self.bound:.3f} on {self.rows} rows ({self.method})")
        note = f"; {self.note}" if self.note else ""
        what = "keep" if self.kind == "share" else "keep-agreement"
        quantity = "selection share" if self.kind == "share" else "agreement with FT"
        if self.reached:
            return (f"{what} {self.target:g}: {self.size:,} coordinates (density {self.density:.2e}), {quantity} "
                    f"{self.share:.3f}{bound} ({cost}){note}")
        largest = max((p.size for p in self.probes), default=0)
        return (f"{what} {self.target:g}: not reached by any size up to {largest:,} coordinates; best {quantity} "
                f"{self.best_share:.3f} at {self.best_size:,}{bound} ({cost}){note}")


def coarse_grid(start: int, largest: int, factor: int = 4) -> list[int]:
    """The bounded search's first stage (walked down from the top): start·factorⁱ below ``largest``, then it."""
    count = next(i for i in itertools.count() if start * factor ** i >= largest)
    return [start * factor ** i for i in range(count)] + [largest]


def search_keep(score_at: Callable[[int], float | Outcome], reference: float | Outcome, targets: Sequence[float],
                largest: int, *, start: int = 1, tolerance: float = 0.1, factor: int = 4, universe: int | None = None,
                confidence: float | None = None, method: str = "paired", kind: str = "share") -> list[KeepResult]:
    """The smallest size k in [start, largest] whose share of ``reference`` reaches τ, for each τ (module doc).

    ``score_at(k)`` scores the family's region of size k on the selection split (a number, or an
    :class:`Outcome` with per-row predictions); each size is scored once, whatever the number of targets.
    ``reference`` is FT's score (Outcome) on the same rows (> 0). ``largest`` is the family's largest region (the
    whole universe, or fewer when the ranking covers only some coordinates); ``universe`` (default ``largest``)
    is what densities are fractions of. ``confidence`` None: the point estimate decides (gallop, stop at the
    first crossing, bisect); a number: the bound decides, in the two-stage fixed-sequence walk, each stage at
    1 − (1 − confidence)/2. ``method`` (accuracy with per-row outcomes): ``paired`` — the exact paired test of
    acc(graft) − τ·acc(FT) ≥ 0 (:func:`~skillgraft.keep.stats.bound.paired_test`), run at each target itself;
    ``exact`` — the Clopper–Pearson bound of the graft's hits on FT's right rows. F1 always uses the paired
    bootstrap; a reference of metric ``mean`` (per-row values in [0, 1]) the betting test. ``kind`` names the
    quantity in the results (``agreement``: the reference's labels are FT's own predictions).
    """
    ref = as_outcome(reference)
    if not ref.score or ref.score <= 0 or not math.isfinite(ref.score):
        raise SkillgraftError(f"FT's score on the selection split is {ref.score}: a share of it cannot be kept")
    if largest < 1:
        raise SkillgraftError("the ranking orders no coordinates: nothing to search")
    if confidence is not None and not (0 < confidence < 1 and TOLERANCE_MIN <= tolerance <= 1):  # a walk that ends
        raise SkillgraftError(f"keep confidence {confidence} / tolerance {tolerance:g}: not in (0, 1) / [0.01, 1]")
    if method not in ("paired", "exact"):
        raise SkillgraftError(f"unknown keep bound {method!r}: paired or exact")
    targets = [check_share(t) for t in targets]
    universe = universe or largest
    start = max(1, min(int(start), largest))
    cache: dict[int, Probe] = {}
    bounded = confidence is not None and ref.rows is not None
    stage = None if not bounded else 1 - (1 - confidence) / 2  # two stages share the risk 1 − confidence
    mean = bounded and ref.metric == "mean"  # per-row values in [0, 1]: the betting test of their mean
    paired = bounded and method == "paired" and is_exact(ref)
    used = None if not bounded else ("betting" if mean else "paired" if paired else "exact" if is_exact(ref)
                                     else "bootstrap")
    if used == "exact" and kind == "agreement":
        used = "agreement"  # Clopper–Pearson of the agreement with FT's predictions
    tested = used in ("paired", "betting")  # decided by a test at each target itself (the bound only reported)
    weights = resample_weights(ref.rows) if bounded and not (is_exact(ref) or mean) else None  # F1's bootstrap

    def probe(k: int, seen: list[Probe]) -> Probe:
        if k not in cache:
            t0 = time.perf_counter()
            got = as_outcome(score_at(k))
            if bounded and got.pred is None:
                raise SkillgraftError("a keep search with a confidence needs per-row outcomes of every size scored "
                                      "(an Outcome), not a bare score")
            bound = share_bound(got, ref, stage, weights) if bounded and not tested else None
            cache[k] = Probe(k, got.score, got.score / ref.score, time.perf_counter() - t0, bound,
                             got if bounded else None)
        seen.append(cache[k])
        return cache[k]

    def confirmed(p: Probe, tau: float) -> bool:
        if not tested:
            return reaches(p.bound, tau)
        if tau not in p.passed:
            t0 = time.perf_counter()
            p.passed[tau] = (betting_test(p.outcome.pred, tau, stage) if mean else
                             paired_test(p.outcome, ref, tau, stage))
            p.seconds += time.perf_counter() - t0
        return p.passed[tau]

    if bounded:
        grid = coarse_grid(start, largest, factor)
        steps = max(1, math.ceil(math.log(factor) / math.log1p(tolerance)))
        ratio = factor ** (1 / steps)  # the fine walk's factor: (1 + tolerance) or a little less
    out = []
    for tau in targets:
        seen: list[Probe] = []
        below = None  # the size probed just below the answer, which failed
        if bounded:
            passes = lambda p: confirmed(p, tau)  # noqa: E731
            size = lo = None
            for k in reversed(grid):  # stage 1: the coarse grid from the top, to the first failure
                if not passes(probe(k, seen)):
                    lo = k
                    break
                size = k
            below = lo if size is not None else None
            if size is not None and lo is not None:  # stage 2: down from it by `ratio`, to the first failure
                anchor, j = size, 1
                while True:
                    k = round(anchor / ratio ** j)
                    j += 1
                    if k >= size:
                        continue  # rounding repeated a size
                    if k <= lo:
                        break
                    if not passes(probe(k, seen)):
                        below = k
                        break
                    size = k
        else:
            passes = lambda p: reaches(p.share, tau)  # noqa: E731
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
        result = _result(tau, size, cache, seen, universe, confidence if bounded else None, ref, stage, used,
                         below)
        result.kind = kind
        out.append(result)
    return out


def _paired_shown(p: Probe, ref: Outcome, stage: float, tau: float) -> float:
    """A tested probe's bound (paired, betting) for a report (computed once), never below τ where τ was confirmed."""
    if p.bound is None:
        p.bound = (betting_bound(p.outcome.pred, stage) if ref.metric == "mean" else
                   paired_bound(p.outcome, ref, stage))
    return max(p.bound, tau) if p.passed.get(tau) else p.bound


def _needed(p: Probe, ref: Outcome, tau: float, stage: float, method: str) -> int | None:
    """Selection rows that would let ``method``'s bound confirm τ at probe ``p`` (None: no number of rows would)."""
    if method == "paired":
        return rows_needed_paired(p.outcome, ref, tau, stage)
    if method == "betting":
        return rows_needed_betting(p.outcome.pred, tau, stage)
    if method in ("exact", "agreement"):
        return rows_needed_exact(p.outcome, ref, tau, stage)
    return rows_needed(p.share, p.bound, ref.rows, tau)


def _result(tau: float, size: int | None, cache: dict[int, Probe], seen: list[Probe], universe: int,
            confidence: float | None, ref: Outcome, stage: float | None = None, method: str | None = None,
            below: int | None = None) -> KeepResult:
    rows = ref.rows
    paired = method in ("paired", "betting")  # decided by a test at τ; the bound is only shown
    if confidence is None or (paired and size is not None):
        best = max(cache.values(), key=lambda p: (p.share, -p.size))
    elif paired:  # unreached: the best paired bound among the three best point shares
        top = sorted(cache.values(), key=lambda p: (p.share, -p.size))[-3:]
        best = max(top, key=lambda p: (_paired_shown(p, ref, stage, tau), p.share, -p.size))
    else:
        best = max(cache.values(), key=lambda p: (p.bound, p.share, -p.size))
    point = min((p.size for p in cache.values() if reaches(p.share, tau)), default=None)
    shown = cache[size] if size is not None else best
    bound = _paired_shown(shown, ref, stage, tau) if paired else shown.bound
    result = KeepResult(tau, size is not None, size, shown.share if size is not None else None, best.size,
                        best.share, universe, list({p.size: p for p in seen}.values()), confidence=confidence,
                        bound=bound, rows=rows, point_size=point, method=method)
    if confidence is None:
        if rows is None and point is not None:
            result.note = "point estimate (no per-row outcomes for a bound)"
        return result
    detail = ""
    if point is not None and (size is None or point < size):
        p = cache[point]
        result.rows_needed = _needed(p, ref, tau, stage, method)
        shown_bound = ("" if paired else f", bound {p.bound:.3f}")
        detail = (f"the point estimate reaches {tau:g} at {point:,} coordinates (share {p.share:.3f}{shown_bound})"
                  + (f": about {result.rows_needed:,} selection rows would confirm it at {confidence:.0%}"
                     if result.rows_needed else
                     (": no number of rows confirms it (the graft misses more than "
                      f"{1 - tau:.0%} of the rows FT gets right)" if method in ("exact", "agreement") else "")))
    if below is not None and size is not None:
        p = cache[below]
        result.next_size, result.next_rows = below, _needed(p, ref, tau, stage, method)
        nxt = (f"the next smaller size probed, {below:,} coordinates (share {p.share:.3f}), would need "
               + (f"about {result.next_rows:,} selection rows" if result.next_rows else
                  "more than any number of rows (its share is not above the target)"))
        detail = f"{detail}; {nxt}" if detail else nxt
    if size is None:
        result.note = (f"the {rows} selection rows are too few for the {confidence:.0%} bound to reach {tau:g} at "
                       f"any size; {detail or 'no size reaches it in the point estimate either'}")
    elif size == max(cache) and detail:
        result.note = f"confirmed only by the largest region; {detail}"
    else:
        result.note = detail
    return result
