"""The lower confidence bound of a graft's share of FT's score on the same rows (the keep search's promise).

For accuracy it is exact. With a = FT's accuracy, p = P(graft right | FT right), q = P(graft right | FT wrong):

    share = acc(graft) / acc(FT) = p + q (1 − a) / a  ≥  p,

so the one-sided Clopper–Pearson lower bound of p — the graft right on x of the n rows FT gets right, x ~ Bin(n, p)
— bounds the share from below (:func:`agreement_bound`). Conservative, never optimistic: it ignores the graft's wins
on FT's wrong rows, and no miss at all gives (1 − c)^(1/n), not 1. For F1 (no such identity) the bound is the
(1 − c) quantile of a seeded paired bootstrap (approximate). :mod:`skillgraft.graft.keep` searches with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skillgraft.errors import SkillgraftError
from skillgraft.lazy import np

# The share's lower bound and the search's test order (part of store keys through KEEP_BOUND: a change re-computes).
# v3: the exact agreement bound (accuracy) and the two-stage fixed-sequence walk; v2 was the paired bootstrap for
# every metric with bisection below the coarse grid.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
KEEP_BOUND = ("v3-clopper-pearson-agreement-fixed-sequence;"
              f"f1:paired-bootstrap-{BOOTSTRAP_RESAMPLES}-seed{BOOTSTRAP_SEED}")
BOUND_METHODS = ("exact", "bootstrap")


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


def is_exact(ft: Outcome) -> bool:
    """Whether a share of ``ft``'s metric has the exact bound (accuracy with per-row outcomes; F1 has the bootstrap)."""
    return ft.pred is not None and ft.metric == "accuracy"


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
    if method == "exact" and is_exact(ft) and graft.metric == "accuracy":
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
    if bound is None or rows is None or not reaches(share, target):
        return None
    if reaches(bound, target):
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
    if reaches(agreement_bound(graft, ft, confidence), target):
        return len(ft.pred)  # the rows at hand already confirm it
    p = float((graft.pred[right] == graft.labels[right]).mean())
    if p <= target:
        return None

    def ok(m: int) -> bool:
        x = math.floor(p * m + 1e-9)
        return x > 0 and beta.ppf(1 - confidence, x, m - x + 1) >= target - 1e-12

    hi = n
    while not ok(hi):
        if hi > 10**9:
            return None
        hi *= 2
    lo = max(n, hi // 2)  # ok(lo) is false: n failed above, and hi // 2 failed in the doubling
    while hi - lo > 1:  # the smallest m that passes (ok is monotone up to the floor's steps)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return int(math.ceil(hi * len(ft.pred) / n))


def reaches(value: float | None, target: float) -> bool:
    return value is not None and value >= target - 1e-12
