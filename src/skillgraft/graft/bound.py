"""The lower confidence bound of a graft's share of FT's score on the same rows (the keep search's promise).

For accuracy it is exact. With a = FT's accuracy, p = P(graft right | FT right), q = P(graft right | FT wrong):

    share = acc(graft) / acc(FT) = p + q (1 − a) / a  ≥  p,

so the one-sided Clopper–Pearson lower bound of p — the graft right on x of the n rows FT gets right, x ~ Bin(n, p)
— bounds the share from below (:func:`agreement_bound`). Conservative, never optimistic: it ignores the graft's wins
on FT's wrong rows, and no miss at all gives (1 − c)^(1/n), not 1. For F1 (no such identity) the bound is the
(1 − c) quantile of a seeded paired bootstrap (approximate). :mod:`skillgraft.graft.keep` searches with it.

**The paired bound** (``paired``, the default for accuracy since issue 48) also counts the graft's wins on FT's wrong
rows. Per row Z = 1[graft right] − τ·1[FT right] ∈ {−τ, 0, 1 − τ, 1}, and share ≥ τ ⇔ E[Z] ≥ 0. Up to
PAIRED_MAX_ROWS rows :func:`z_pvalue` tests E[Z] ≤ 0 exactly: the four cells' counts are multinomial; the statistic
is the studentized mean of Z made monotone (never falling when a row's Z rises), so the null's largest tail sits on
E[Z] = 0; that sup is taken over the null distributions whose FT accuracy lies in a Clopper–Pearson band (Berger &
Boos 1994: the band's risk is added to the p-value), on a grid of the null face refined by a local search — an exact
unconditional test in the sense of Barnard, as for matched-pair ratios (Nam & Blackwelder 2002; Tang, Tang & Chan
2003). Above PAIRED_MAX_ROWS (the lattice grows as n³) a conditional test: given FT's right/wrong pattern the graft's
hits are two binomials, x_r ~ Bin(n_r, p) and x_w ~ Bin(n_w, q), share = p + q·(1 − a)/a ≥ p + q·w_lo with w_lo from
the Clopper–Pearson upper bound of a at PAIRED_ACCURACY_RISK of the risk (Bonferroni), and p + w_lo·q ≤ τ is tested
exactly (:func:`paired_pvalue`). :func:`paired_bound` inverts either for the report. docs/keep.md argues both.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from skillgraft.errors import SkillgraftError
from skillgraft.lazy import np

# The share's lower bound and the search's test order (part of store keys through KEEP_BOUND: a change re-computes).
# v3: the exact agreement bound (accuracy) and the two-stage fixed-sequence walk; v2 was the paired bootstrap for
# every metric with bisection below the coarse grid.
# The paired bound: the share of the risk spent on FT's accuracy (a Bonferroni split), and the nuisance grid.
PAIRED_ACCURACY_RISK = 0.1
PAIRED_GRID = 256
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
KEEP_BOUND = ("v3-clopper-pearson-agreement-fixed-sequence;"
              f"f1:paired-bootstrap-{BOOTSTRAP_RESAMPLES}-seed{BOOTSTRAP_SEED};"
              f"v4-paired:accuracy-risk-{PAIRED_ACCURACY_RISK}-grid{PAIRED_GRID}")
BOUND_METHODS = ("paired", "exact", "bootstrap")


@dataclass
class Outcome:
    """A model's score on the selection split and, where the metric has them, its per-row predictions.

    ``pred`` / ``labels``: the predicted and gold label index of every row (None: no per-row outcomes, e.g.
    open-ended token accuracy; then only the point estimate exists). ``metric``: ``accuracy``, ``f1``, or ``mean``
    (``pred`` holds a value in [0, 1] per row, e.g. a generative row's share of tokens agreeing with FT; no labels).
    ``tokens``: open-ended generative data, each row's top next-token ids at its completion positions."""

    score: float
    pred: np.ndarray | None = None
    labels: np.ndarray | None = None
    metric: str = "accuracy"
    positive: int = 1
    tokens: list | None = None

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


def _paired_counts(graft: Outcome, ft: Outcome) -> tuple[int, int, int, int]:
    """(x_r, n_r, x_w, n_w): the graft's right rows among FT's n_r right rows and among its n_w wrong rows."""
    right = ft.pred == ft.labels
    hit = graft.pred == graft.labels
    return int(hit[right].sum()), int(right.sum()), int(hit[~right].sum()), int((~right).sum())


def accuracy_upper(n_r: int, n: int, risk: float) -> float:
    """The one-sided Clopper–Pearson upper bound of an accuracy from n_r right of n rows, at ``risk``."""
    from scipy.stats import beta  # noqa: PLC0415

    return 1.0 if n_r >= n else float(beta.ppf(1 - risk, n_r + 1, n - n_r))


def _monotone_statistic(n_r: int, n_w: int, w: float, target: float) -> np.ndarray:
    """[n_r + 1, n_w + 1]: (p̂ + w q̂ − τ)/sd per outcome (sd from the add-½ estimates, never 0), replaced by the least
    value at any outcome with at least as many hits on both sides, so that it is nondecreasing in both counts."""
    xr = np.arange(n_r + 1)[:, None]
    num = xr / max(n_r, 1) - target
    pt = (xr + 0.5) / (n_r + 1)
    var = pt * (1 - pt) / max(n_r, 1)
    if n_w and w > 0:
        xw = np.arange(n_w + 1)[None, :]
        qt = (xw + 0.5) / (n_w + 1)
        num = num + w * xw / n_w
        var = var + w * w * qt * (1 - qt) / n_w
    stat = np.broadcast_to(num / np.sqrt(var), (n_r + 1, n_w + 1)).copy()
    stat = np.minimum.accumulate(stat[::-1], axis=0)[::-1]
    return np.minimum.accumulate(stat[:, ::-1], axis=1)[:, ::-1]


def paired_pvalue(x_r: int, n_r: int, x_w: int, n_w: int, w: float, target: float) -> float:
    """The exact p-value of H0: p + w·q ≤ τ against the observed hits (x_r of n_r, x_w of n_w; independent
    binomials): sup over the boundary p = τ − w q, q ∈ [0, min(1, τ/w)], of P(T ≥ T_obs), T the monotone statistic.
    T nondecreasing in both counts makes the tail nondecreasing in p and q, so the boundary holds the supremum. It is
    taken on a grid of PAIRED_GRID + 1 values of q, refined around the best one (a bounded scalar search)."""
    from scipy.optimize import minimize_scalar  # noqa: PLC0415
    from scipy.stats import binom  # noqa: PLC0415

    stat = _monotone_statistic(n_r, n_w, w, target)
    mask = (stat >= stat[x_r, x_w] - 1e-12).astype(np.float64)
    kr, kw = np.arange(n_r + 1), np.arange(n_w + 1)
    q_max = 0.0 if not n_w or w <= 0 else min(1.0, target / w)

    def tail(q: np.ndarray) -> np.ndarray:
        q = np.atleast_1d(np.clip(q, 0.0, q_max))
        p = np.clip(target - w * q, 0.0, 1.0)
        pr = binom.pmf(kr[None, :], n_r, p[:, None])
        pw = binom.pmf(kw[None, :], n_w, q[:, None])
        return ((pr @ mask) * pw).sum(1)

    if q_max == 0:
        return float(min(1.0, tail(np.zeros(1))[0]))
    grid = np.linspace(0.0, q_max, PAIRED_GRID + 1)
    values = tail(grid)
    i = int(values.argmax())
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    best = minimize_scalar(lambda q: -tail(np.array([q]))[0], bounds=(lo, hi), method="bounded",
                           options={"xatol": 1e-7})
    return float(min(1.0, max(values[i], -best.fun)))


# ------------------------------------------------------ the exact paired test on Z = 1[graft right] − τ·1[FT right]
# Cells, in the order of Z: 10 (graft right, FT wrong: Z = 1), 11 (1 − τ), 00 (0), 01 (−τ).
PAIRED_MAX_ROWS = 200   # the exact multinomial test up to this many rows; above, the conditional (Bonferroni) test
PAIRED_SIMPLEX = 40     # the null face's grid: a triangle cut into PAIRED_SIMPLEX² pieces (861 points at 40)
PAIRED_NUISANCE_RISK = 0.02  # the share of the risk spent on the Berger–Boos band of FT's accuracy
_GRID_CHUNK = 64  # null points per tail evaluation of the grid (a failing test stops after the first that decides)


@functools.lru_cache(maxsize=4)
def _lattice(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts [L, 4] of every outcome of n rows over the cells 10, 11, 00, 01; its flat index in the cube
    (u1, u2, u3) = cumulative counts from the top cell, 0 ≤ u1 ≤ u2 ≤ u3 ≤ n, cube side n + 1)."""
    u1, u2, u3 = np.meshgrid(*(np.arange(n + 1, dtype=np.int32),) * 3, indexing="ij", sparse=False)
    ok = (u1 <= u2) & (u2 <= u3)
    u1, u2, u3 = u1[ok], u2[ok], u3[ok]
    counts = np.stack([u1, u2 - u1, u3 - u2, n - u3], 1).astype(np.int64)
    return counts, np.flatnonzero(ok)


@functools.lru_cache(maxsize=16)
def _z_statistic(n: int, target: float) -> np.ndarray:
    """Per outcome of :func:`_lattice`: the studentized mean of Z, mean / √((var + n⁻²)/n), then replaced by its
    least value over every outcome that dominates it (more rows moved to higher cells: each cumulative count from
    the top at least as large), so that it never falls when a row's Z rises. A monotone statistic has its largest
    null tail on the boundary E[Z] = 0."""
    counts, flat = _lattice(n)
    z = np.array([1.0, 1.0 - target, 0.0, -target])
    mean = counts @ z / n
    var = np.maximum(counts @ (z * z) / n - mean * mean, 0.0)
    stat = mean / np.sqrt((var + 1.0 / (n * n)) / n)
    cube = np.full((n + 1) ** 3, np.inf)
    cube[flat] = stat
    cube = cube.reshape((n + 1,) * 3)
    for axis in range(3):
        cube = np.flip(np.minimum.accumulate(np.flip(cube, axis), axis=axis), axis)
    return cube.reshape(-1)[flat]


def _face(target: float, weights: np.ndarray) -> np.ndarray:
    """Null distributions with E[Z] = 0 (cells 10, 11, 00, 01) from barycentric ``weights`` [G, 3] of the face's
    vertices: all rows 00; FT right on τ of rows with the graft right on all of them (11: τ, 01: 1 − τ); the graft
    right only where FT is wrong (10: τ/(1 + τ), 01: 1/(1 + τ))."""
    vertices = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, target, 0.0, 1 - target],
                         [target / (1 + target), 0.0, 0.0, 1 / (1 + target)]])
    return np.clip(weights, 0, None) @ vertices


def _face_grid(m: int) -> np.ndarray:
    i, j = np.meshgrid(np.arange(m + 1), np.arange(m + 1), indexing="ij")
    keep = i + j <= m
    i, j = i[keep], j[keep]
    return np.stack([m - i - j, i, j], 1) / m


def _z_tail(n: int, target: float, observed: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """tail(weights [G, 3]) = P(statistic ≥ the observed one) under each face distribution (barycentric weights).

    The statistic never falls when a row moves to a higher cell, so for each (u1, u2) the outcomes at or above the
    observed one are those with u3 ≥ T(u1, u2). The tail is then a sum over (u1, u2) of the trinomial chance of
    (n10 = u1, n11 = u2 − u1, the other n − u2 rows in 00 or 01) times the binomial chance that at least
    T − u2 of those rows are in 00: O(n²) terms per null distribution instead of the lattice's O(n³)."""
    import numpy as np  # noqa: PLC0415  (the module itself: the hot loop below skips the lazy stand-in's lookups)
    from scipy.special import gammaln  # noqa: PLC0415

    counts, _ = _lattice(n)
    stat = _z_statistic(n, target)
    up = stat >= stat[_lattice_index(n, observed)] - 1e-12
    u1, u2 = counts[up, 0], counts[up, 0] + counts[up, 1]
    above = np.bincount(u1 * (n + 1) + u2, minlength=(n + 1) ** 2)  # how many u3 are at or above: the interval [T, n]
    i1, i2 = np.divmod(np.flatnonzero(above), n + 1)
    rest = n - i2
    need = rest + 1 - above[i1 * (n + 1) + i2]  # rows of the rest that must be in 00
    log_tri = gammaln(n + 1) - gammaln(i1 + 1) - gammaln(i2 - i1 + 1) - gammaln(rest + 1)
    j = np.arange(n + 2, dtype=np.float64)
    m = np.arange(n + 1, dtype=np.float64)[:, None]
    log_bin = np.where(j <= m, gammaln(m + 1) - gammaln(j + 1) - gammaln(np.maximum(m - j, 0) + 1), -np.inf)

    def log(x: np.ndarray) -> np.ndarray:  # log 0 as a huge finite negative: 0 · log 0 = 0, k · log 0 → exp 0
        return np.log(np.where(x > 0, x, 1.0)) + np.where(x > 0, 0.0, -1e300)

    def tail(weights: np.ndarray) -> np.ndarray:
        pi = _face(target, np.atleast_2d(weights))
        out = np.empty(len(pi))
        for g in range(0, len(pi), 32):
            p = pi[g:g + 32]
            other = p[:, 2] + p[:, 3]  # the chance of a row in 00 or 01; q: in 00 given that
            q = np.divide(p[:, 2], other, out=np.full_like(other, 0.5), where=other > 0)
            pmf = np.exp(log_bin + j * log(q)[:, None, None] + (m - j) * log(1 - q)[:, None, None])
            survive = np.cumsum(pmf[:, :, ::-1], 2)[:, :, ::-1]  # [G, m, s]: P(at least s of m rows in 00)
            tri = np.exp(log_tri + i1 * log(p[:, :1]) + (i2 - i1) * log(p[:, 1:2]) + rest * log(other)[:, None])
            out[g:g + 32] = (tri * survive[:, rest, need]).sum(1)
        return out

    return tail


def _lattice_index(n: int, observed) -> int:
    n10, n11, n00, _ = (int(c) for c in observed)
    counts, _ = _lattice(n)
    hit = np.flatnonzero((counts[:, 0] == n10) & (counts[:, 1] == n11) & (counts[:, 2] == n00))
    return int(hit[0])


def z_counts(graft: Outcome, ft: Outcome) -> np.ndarray:
    """Rows per cell, in Z's order: graft right & FT wrong, both right, both wrong, graft wrong & FT right."""
    g, f = graft.pred == graft.labels, ft.pred == ft.labels
    return np.array([int((g & ~f).sum()), int((g & f).sum()), int((~g & ~f).sum()), int((~g & f).sum())])


def z_pvalue(counts, target: float, nuisance_risk: float, stop_above: float = 1.0) -> float:
    """:func:`_z_pvalue`, cached by its arguments (sizes of a search often share their cells). With ``stop_above``
    (a test's risk) the search for the sup stops as soon as the p-value is known to exceed it: the value returned
    is then a lower bound of the p-value above ``stop_above``, so a decision p ≤ risk is the same as without it."""
    return _z_pvalue(tuple(int(c) for c in counts), float(round(target, 12)), float(nuisance_risk),
                     float(stop_above))


class _Above(Exception):
    """The sup search found a null whose tail already puts the p-value above the risk decided at."""

    def __init__(self, value: float):
        self.value = value


@functools.lru_cache(maxsize=4096)
def _z_pvalue(counts: tuple[int, ...], target: float, nuisance_risk: float, stop_above: float = 1.0) -> float:
    """The exact p-value of H0: E[Z] ≤ 0 (share ≤ τ) from the cell counts, in the manner of Berger & Boos (1994):
    the sup, over the null distributions of the four cells whose FT accuracy a lies in the two-sided
    Clopper–Pearson interval of a at ``nuisance_risk``, of the chance of a studentized mean at least the observed
    one, plus ``nuisance_risk``. (Without the restriction the sup sits at nulls unlike the data, e.g. FT right on
    20 % of rows, where a studentized mean is unstable.) The sup is taken on the face's grid within the band and
    refined by a local search from the three best grid points."""
    from scipy.optimize import minimize  # noqa: PLC0415
    from scipy.stats import beta  # noqa: PLC0415

    n = int(sum(counts))
    right = int(counts[1] + counts[3])
    a_lo = 0.0 if right == 0 else float(beta.ppf(nuisance_risk / 2, right, n - right + 1))
    a_hi = 1.0 if right == n else float(beta.ppf(1 - nuisance_risk / 2, right + 1, n - right))
    tail = _z_tail(n, target, counts)
    grid = _face_grid(PAIRED_SIMPLEX)

    def accuracy(w: np.ndarray) -> np.ndarray:  # FT's accuracy a = P(11) + P(01) of the face distribution
        return w[..., 1] + w[..., 2] / (1 + target)

    inside = (accuracy(grid) >= a_lo - 1e-12) & (accuracy(grid) <= a_hi + 1e-12)
    if not inside.any():  # a band narrower than the grid: its two ends on the A–C edge and the B–C edge
        inside[:] = False
    points = grid[inside]
    # the band's ends on the face's edges (exact points, so that a narrow band is never missed)
    ends = []
    for a in (a_lo, a_hi):
        ends.append([1 - a, a, 0.0])                      # on the C–A edge
        if a <= 1 / (1 + target):
            b = a * (1 + target)
            ends.append([1 - b, 0.0, b])                  # on the C–B edge
        else:
            t = (a - 1 / (1 + target)) / (1 - 1 / (1 + target))
            ends.append([0.0, t, 1 - t])                  # on the A–B edge
    points = np.concatenate([points, np.clip(np.array(ends), 0, 1)])
    # the grid in chunks, nearest FT's observed accuracy first (where the sup usually is): a chunk whose tail puts
    # the p-value above ``stop_above`` decides at once (the sup only grows with more points and refinement)
    observed = right / n
    order = np.argsort(np.abs(accuracy(points) - observed), kind="stable")
    values = np.full(len(points), -np.inf)
    for i in range(0, len(order), _GRID_CHUNK):
        chunk = order[i:i + _GRID_CHUNK]
        values[chunk] = tail(points[chunk])
        best = float(values[chunk].max())
        if best + nuisance_risk > stop_above:
            return min(1.0, best + nuisance_risk)
    best = float(values.max())

    def objective(x: np.ndarray) -> float:
        w = np.array([1 - x[0] - x[1], x[0], x[1]])
        if w.min() < 0 or not a_lo - 1e-12 <= accuracy(w) <= a_hi + 1e-12:
            return 1.0
        value = float(tail(w)[0])
        if value + nuisance_risk > stop_above:
            raise _Above(value)
        return -value

    if best + nuisance_risk < 0.2:  # refine where a decision at a usual risk could turn on it
        for k in np.argsort(-values)[:2]:
            try:
                got = minimize(objective, points[k, 1:], method="Nelder-Mead",
                               options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 80})
            except _Above as above:
                return min(1.0, above.value + nuisance_risk)
            best = max(best, -float(got.fun))
    return min(1.0, best + nuisance_risk)


def paired_test(graft: Outcome, ft: Outcome, target: float, confidence: float) -> bool:
    """Whether the paired bound confirms share ≥ ``target`` at ``confidence`` (module doc): up to PAIRED_MAX_ROWS
    rows the exact test of E[Z] ≤ 0 (:func:`z_pvalue`); above, FT's accuracy bounded above at PAIRED_ACCURACY_RISK of
    the risk and the exact test of p + w_lo q ≤ τ at the rest (:func:`paired_pvalue`)."""
    x_r, n_r, x_w, n_w = _paired_counts(graft, ft)
    if not n_r:
        return False
    risk = 1 - confidence
    if n_r + n_w <= PAIRED_MAX_ROWS:
        return z_pvalue(z_counts(graft, ft), target, PAIRED_NUISANCE_RISK * risk, risk + 1e-15) <= risk + 1e-15
    a_up = accuracy_upper(n_r, n_r + n_w, PAIRED_ACCURACY_RISK * risk)
    w = (1 - a_up) / a_up
    return paired_pvalue(x_r, n_r, x_w, n_w, w, target) <= (1 - PAIRED_ACCURACY_RISK) * risk + 1e-15


def paired_bound(graft: Outcome, ft: Outcome, confidence: float, resolution: float = 2e-3) -> float:
    """The paired lower bound of the share for a report: the largest τ ≤ 1 (to ``resolution``, by bisection below
    the point share) that :func:`paired_test` confirms (0 when none). A keep search decides with the test at its
    target itself; a report shows this bound, raised to the target where the test confirmed it there."""
    x_r, n_r, x_w, n_w = _paired_counts(graft, ft)
    if not n_r:
        return 0.0
    lo, hi = 0.0, min(1.0, (x_r + x_w) / n_r)  # no τ above the point share is confirmed
    if hi > 0 and paired_test(graft, ft, hi, confidence):
        return float(math.floor(hi / resolution + 1e-9) * resolution)
    while hi - lo > resolution / 2:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if paired_test(graft, ft, mid, confidence) else (lo, mid)
    return float(math.floor(lo / resolution + 1e-9) * resolution)


PAIRED_ROWS_EXACT = 1000  # rows_needed_paired runs the test itself on scaled counts up to this many rows


def _from_cells(counts) -> tuple[Outcome, Outcome]:
    """A graft's and FT's outcomes with the given cell counts (Z's order: 10, 11, 00, 01; labels all 1)."""
    n10, n11, n00, n01 = (int(c) for c in counts)
    g = np.array([1] * (n10 + n11) + [0] * (n00 + n01))
    f = np.array([0] * n10 + [1] * n11 + [0] * n00 + [1] * n01)
    labels = np.ones(len(g), dtype=int)
    return Outcome(float(g.mean()), g, labels), Outcome(float(f.mean()), f, labels)


def rows_needed_paired(graft: Outcome, ft: Outcome, target: float, confidence: float) -> int | None:
    """Selection rows that would let :func:`paired_test` confirm ``target`` if the rows kept their proportions: the
    test itself run on the cell counts scaled to m rows (doubling, then bisection), up to PAIRED_ROWS_EXACT rows;
    above, a normal approximation of the paired statistic at the test's risk. To about 25 % (the bisection's last
    bracket; the upper end is returned). None when the point share
    (x_r + x_w)/n_r is not above the target; the rows at hand when they already confirm it."""
    from scipy.stats import norm  # noqa: PLC0415

    x_r, n_r, x_w, n_w = _paired_counts(graft, ft)
    n = n_r + n_w
    if not n_r:
        return None
    if paired_test(graft, ft, target, confidence):
        return n
    if (x_r + x_w) / n_r <= target + 1e-12:
        return None
    counts = z_counts(graft, ft).astype(np.float64)

    def passes(m: int) -> bool:
        scaled = np.floor(counts * m / n + 0.5).astype(int)
        scaled[int(np.argmax(scaled))] += m - int(scaled.sum())
        return paired_test(*_from_cells(scaled), target, confidence)

    lo, hi = n, 2 * n
    while hi <= PAIRED_ROWS_EXACT and not passes(hi):
        lo, hi = hi, 2 * hi
    if hi <= PAIRED_ROWS_EXACT:
        # to 25 % (an estimate for a report line; each new row count under PAIRED_MAX_ROWS builds its own n³/6
        # outcome lattice, so the probes are few and multiples of 8, shared by the searches of one run)
        while hi - lo > max(8, lo // 4):
            mid = (lo + hi) // 16 * 8
            if not lo < mid < hi:
                break
            lo, hi = (lo, mid) if passes(mid) else (mid, hi)
        return int(hi)
    w = n_w / n_r
    p, q = x_r / n_r, (x_w / n_w if n_w else 0.0)
    share, a = p + w * q, n_r / n
    var_row = p * (1 - p) / a + (w * w * q * (1 - q) / (1 - a) if n_w else 0.0)  # per-row variance of the share
    var_row = max(var_row, target * (1 - target) / (4 * n))  # no miss yet: at least a ½-row's worth
    z = norm.ppf(1 - (1 - PAIRED_ACCURACY_RISK) * (1 - confidence))
    return int(math.ceil(max(PAIRED_ROWS_EXACT + 1, z * z * var_row / (share - target) ** 2)))


def share_bound(graft: Outcome, ft: Outcome, confidence: float, weights: np.ndarray | None = None,
                method: str = "exact") -> float | None:
    """The lower confidence bound of graft's share of FT's score on the same rows. ``paired`` (accuracy):
    :func:`paired_bound`; ``exact`` (accuracy): :func:`agreement_bound`; ``bootstrap`` (and any F1): the (1 −
    confidence) quantile of the paired bootstrap shares (the smallest resampled share s with at least a 1 − confidence
    fraction of resamples ≤ s). None without per-row outcomes."""
    if graft.pred is None or ft.pred is None:
        return None
    if len(graft.pred) != len(ft.pred):
        raise SkillgraftError(f"graft and FT were scored on different rows ({len(graft.pred)} vs {len(ft.pred)})")
    if method not in BOUND_METHODS:
        raise SkillgraftError(f"unknown bound method {method!r}: one of {', '.join(BOUND_METHODS)}")
    if method in ("exact", "paired") and is_exact(ft) and graft.metric == "accuracy":
        return (paired_bound if method == "paired" else agreement_bound)(graft, ft, confidence)
    weights = resample_weights(len(ft.pred)) if weights is None else weights
    return float(np.quantile(bootstrap_shares(graft, ft, weights), 1 - confidence, method="inverted_cdf"))


# ------------------------------------------------------------------ a bounded mean per row: generative agreement
BETTING_HEDGE = 0.75   # the largest bet against mean ≤ m, as a share of 1/m (the capital never falls below 1 − this)
BETTING_MAX_ROWS = 1 << 22  # rows_needed_betting looks no further


def _log_wealth(values: np.ndarray, target: float, risk: float) -> float:
    """The largest log-capital, over the rows in their order, of betting against E[X] ≤ ``target`` (X ∈ [0, 1]):
    K_t = Π_{i≤t} (1 + λ_i (X_i − target)) with the predictable plug-in bet of Waudby-Smith & Ramdas (2023),
    λ_i = min(√(2 log(1/risk) / (n σ̂²_{i−1})), BETTING_HEDGE/target), σ̂² from the rows before i only."""
    x = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
    n = len(x)
    if not n:
        return 0.0
    t = np.arange(1, n + 1)
    mean = (0.5 + np.cumsum(x)) / (t + 1)
    var = (0.25 + np.cumsum((x - mean) ** 2)) / (t + 1)
    before = np.concatenate([[0.25], var[:-1]])  # σ̂²_{i−1}: the bet on row i never sees row i
    bet = np.sqrt(2 * math.log(1 / risk) / (n * before))
    if target > 0:
        bet = np.minimum(bet, BETTING_HEDGE / target)
    return float(np.cumsum(np.log1p(bet * (x - target))).max())


def betting_test(values, target: float, confidence: float) -> bool:
    """Whether the rows' values (each in [0, 1]; i.i.d. rows) reject E[X] ≤ ``target`` at risk 1 − confidence: the
    betting capital of :func:`_log_wealth` reaches 1/risk at some row. Under any mean ≤ target the capital is a
    nonnegative supermartingale (each factor's expectation is 1 + λ(E[X] − target) ≤ 1, λ ≥ 0 chosen before the row
    is seen), so by Ville's inequality it ever reaches 1/risk with probability ≤ risk. Exact in that sense (no
    normal approximation); conservative."""
    risk = 1 - confidence
    return target <= 0 or _log_wealth(values, target, risk) >= math.log(1 / risk) - 1e-12


def betting_bound(values, confidence: float, resolution: float = 1e-4) -> float:
    """The lower confidence bound of E[X] from :func:`betting_test`: the largest m it rejects (to ``resolution``,
    floored). The capital is nonincreasing in m (each factor is, for the clipped bet), so the rejected m form an
    interval [0, L) and bisection finds L; P(L > E[X]) ≤ 1 − confidence."""
    if not len(values) or not betting_test(values, resolution, confidence):
        return 0.0
    lo, hi = resolution, 1.0
    if betting_test(values, hi, confidence):  # never: the capital at m = 1 cannot grow
        return 1.0
    while hi - lo > resolution / 2:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if betting_test(values, mid, confidence) else (lo, mid)
    return float(math.floor(lo / resolution + 1e-9) * resolution)


def rows_needed_betting(values, target: float, confidence: float) -> int | None:
    """Rows that would let :func:`betting_test` confirm ``target`` if the rows kept coming as these did (the values
    repeated in order to m rows; doubling, then bisection to the row). None when their mean is not above the target
    (no number of rows confirms it); the rows at hand when they already do; BETTING_MAX_ROWS at most."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if not n or float(x.mean()) <= target + 1e-12:
        return None
    if betting_test(x, target, confidence):
        return n
    lo, hi = n, 2 * n
    while hi < BETTING_MAX_ROWS and not betting_test(np.resize(x, hi), target, confidence):
        lo, hi = hi, 2 * hi
    hi = min(hi, BETTING_MAX_ROWS)
    while hi - lo > 1:  # the test is O(m): bisect to the row
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if betting_test(np.resize(x, mid), target, confidence) else (mid, hi)
    return int(hi)


# What each bound is, in words for reports (KeepResult.method).
BOUND_NAMES = {
    "paired": "the exact paired test of acc(graft) − τ·acc(FT) ≥ 0 on the selection rows (the graft's wins on FT's "
              "wrong rows count; a studentized mean with its null sup over FT accuracies in a Berger–Boos band)",
    "exact": "the Clopper–Pearson bound of how often the graft is right where FT is right (ignores the graft's wins)",
    "bootstrap": "a seeded paired bootstrap of the F1 share (approximate)",
    "agreement": "the Clopper–Pearson bound of how often the graft predicts what FT predicts (no label read)",
    "betting": "a betting lower bound (Waudby-Smith & Ramdas) of the mean over rows of each row's share of completion "
               "tokens whose top next-token prediction is FT's (teacher forcing; rows independent, a row's tokens "
               "not; no label read)",
}


def bound_prose(confidence: float) -> str:
    """How a size is judged at ``confidence``, in words for reports (one source for every report that shows it)."""
    return (f"with {confidence:.0%} confidence: a lower bound of its share (exact for accuracy — the paired test of "
            "acc(graft) ≥ τ·acc(FT) by default, or the Clopper–Pearson bound of how often the graft is right where "
            "FT is right; a seeded paired bootstrap for F1; for agreement targets the Clopper–Pearson bound of the "
            "graft's agreement with FT's predictions; on open-ended generative data a betting bound of the mean "
            "per-row share of completion tokens whose top prediction is FT's), in a "
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
