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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.graft.region import Region, numel_of
from skillgraft.graft.selection import Budget, as_list
from skillgraft.spec import Spec

Shapes = dict[str, tuple[int, ...]]
# The learned localizer's order (part of store keys: a change of it re-computes stored keep searches).
# 2: the rounded γ by drift, then the rest by |Δ|; 1 (never released): every coordinate by drift.
LEARNED_ORDER = 2


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


# ---------------------------------------------------------------------------------------------- the search
@dataclass
class Probe:
    """One size tried: the selection score, its share of FT's score, and the seconds it took."""

    size: int
    score: float
    share: float
    seconds: float

    def to_dict(self) -> dict:
        return {"size": self.size, "score": self.score, "share": self.share, "seconds": self.seconds}


@dataclass
class KeepResult:
    """The answer for one keep target: the smallest probed size reaching it, or the best reached."""

    target: float
    reached: bool
    size: int | None          # the smallest probed size whose share ≥ target (None: unreachable)
    share: float | None       # its selection share
    best_size: int            # the size with the best selection share (unreachable targets: what to offer)
    best_share: float
    universe: int
    # every probe this target's search looked at, in order (sizes another target scored first included: their
    # seconds count once per target that used them)
    probes: list[Probe] = field(default_factory=list)
    region: Region | None = field(default=None, repr=False)  # γ of `size` (unreachable: of `best_size`)

    @property
    def density(self) -> float | None:
        return None if self.size is None else self.size / self.universe

    @property
    def seconds(self) -> float:
        return float(sum(p.seconds for p in self.probes))

    def to_dict(self) -> dict:
        return {"target": self.target, "reached": self.reached, "size": self.size, "density": self.density,
                "selection_share": self.share, "best_size": self.best_size, "best_share": self.best_share,
                "universe": self.universe, "probes": [p.to_dict() for p in self.probes],
                "probe_count": len(self.probes), "search_seconds": self.seconds}

    def describe(self) -> str:
        """One line for a console or a report."""
        cost = f"{len(self.probes)} probes, {self.seconds:.0f} s"
        if self.reached:
            return (f"keep {self.target:g}: {self.size:,} coordinates (density {self.density:.2e}), selection share "
                    f"{self.share:.3f} ({cost})")
        largest = max((p.size for p in self.probes), default=0)
        return (f"keep {self.target:g}: not reached by any size up to {largest:,} coordinates; best selection "
                f"share {self.best_share:.3f} at {self.best_size:,} ({cost})")


def search_keep(score_at: Callable[[int], float], reference: float, targets: Sequence[float], largest: int, *,
                start: int = 1, tolerance: float = 0.1, factor: int = 4, universe: int | None = None
                ) -> list[KeepResult]:
    """The smallest size k in [start, largest] with score_at(k) ≥ τ·reference, for each τ (see module doc).

    ``score_at(k)`` scores the family's region of size k on the selection split; each size is scored once,
    whatever the number of targets. ``reference`` is FT's score on the same split (> 0). ``largest`` is the
    family's largest region (the whole universe, or fewer when the ranking covers only some coordinates);
    ``universe`` (default ``largest``) is what densities are fractions of.
    """
    if not reference or reference <= 0 or not math.isfinite(reference):
        raise SkillgraftError(f"FT's score on the selection split is {reference}: a share of it cannot be kept")
    if largest < 1:
        raise SkillgraftError("the ranking orders no coordinates: nothing to search")
    universe = universe or largest
    start = max(1, min(int(start), largest))
    cache: dict[int, Probe] = {}

    def probe(k: int, seen: list[Probe]) -> Probe:
        if k not in cache:
            t0 = time.perf_counter()
            score = float(score_at(k))
            cache[k] = Probe(k, score, score / reference, time.perf_counter() - t0)
        seen.append(cache[k])
        return cache[k]

    out = []
    for tau in (check_share(t) for t in targets):
        seen: list[Probe] = []
        k = start
        while True:  # gallop: start, 4·start, 16·start, … until τ is reached or the whole universe is tried
            if probe(k, seen).share >= tau or k == largest:
                break
            k = min(largest, k * factor)
        reached = sorted(p.size for p in cache.values() if p.share >= tau)
        if reached:
            hi = reached[0]
            lo = max((s for s in cache if s < hi), default=None)
            while lo is not None and hi - lo > 1 and hi > lo * (1 + tolerance):  # bisect on a log scale
                mid = min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))
                if probe(mid, seen).share >= tau:
                    hi = mid
                else:
                    lo = mid
        best = max(cache.values(), key=lambda p: (p.share, -p.size))
        size = min((p.size for p in cache.values() if p.share >= tau), default=None)
        out.append(KeepResult(tau, size is not None, size, cache[size].share if size is not None else None,
                              best.size, best.share, universe, list({p.size: p for p in seen}.values())))
    return out


# ---------------------------------------------------------------------------------------------- with models
def selection_score(scorer, examples, batch_size: int = 64) -> float:
    """The task metric of ``scorer`` on ``examples`` (accuracy, F1, or token accuracy for generative data)."""
    from skillgraft.evaluate.predict import evaluate  # noqa: PLC0415

    return float(evaluate(scorer, examples, batch_size=batch_size)[0]["score"])


def graft_scorer(pre, ft, examples, *, values: Callable | None = None, batch_size: int = 64
                 ) -> Callable[[Region], float]:
    """score(region) = the metric of θ_pre + γ⊙Δ on ``examples`` (θ_pre restored after each call).

    ``values(region)`` may replace θ_ft's values on the region (e.g. DARE's rescaled Δ)."""
    from skillgraft.graft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.scoring import evaluate_graft  # noqa: PLC0415

    def score(region: Region) -> float:
        graft = Graft.from_models(pre, ft, region)
        if values is not None:
            graft = Graft(region, values(region), graft.carried, graft.base_model, graft.base_fingerprint)
        return float(evaluate_graft(pre, graft, examples, batch_size=batch_size)[0]["score"])

    return score


def keep_search(pre, ft, ranking: Ranking, selection, keep: KeepSpec | Sequence[float], *,
                score: Callable[[Region], float] | None = None) -> list[KeepResult]:
    """Search ``ranking``'s nested family for each keep target, scored on the ``selection`` examples."""
    spec = keep if isinstance(keep, KeepSpec) else KeepSpec.build({"keep": list(keep)}, where="keep")
    if not spec.keep:
        return []
    if not selection:
        raise SkillgraftError("a keep target needs a selection split (dev examples, distinct from the test rows)")
    if not len(ranking):
        raise SkillgraftError("the localizer ranked no coordinates: no region can keep anything")
    score = score or graft_scorer(pre, ft, selection)
    reference = selection_score(ft, selection)
    start = spec.keep_from.size(ranking.universe) if spec.keep_from.count is None else min(spec.keep_from.count,
                                                                                           len(ranking))
    results = search_keep(lambda k: score(ranking.region(k)), reference, spec.keep, len(ranking),
                          start=start, tolerance=spec.keep_tolerance, universe=ranking.universe)
    for r in results:
        r.region = ranking.region(r.size if r.reached else r.best_size)
    return results
