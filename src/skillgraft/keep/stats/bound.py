"""The lower confidence bound of a graft's share of FT's score on the same rows (the keep search's promise).

For accuracy it is exact. With a = FT's accuracy, p = P(graft right | FT right), q = P(graft right | FT wrong):

    share = acc(graft) / acc(FT) = p + q (1 − a) / a  ≥  p,

so the one-sided Clopper–Pearson lower bound of p — the graft right on x of the n rows FT gets right, x ~ Bin(n, p)
— bounds the share from below (:func:`agreement_bound`). Conservative, never optimistic: it ignores the graft's wins
on FT's wrong rows, and no miss at all gives (1 − c)^(1/n), not 1. For F1 (no such identity) the bound is the
(1 − c) quantile of a seeded paired bootstrap (approximate). :mod:`skillgraft.keep.search` searches with it.

**The paired bound** (``paired``, the default for accuracy since issue 48) also counts the graft's wins on FT's wrong
rows. Per row Z = 1[graft right] − τ·1[FT right] ∈ {−τ, 0, 1 − τ, 1}, and share ≥ τ ⇔ E[Z] ≥ 0. Up to PAIRED_MAX_ROWS
rows :func:`~.paired_exact.z_pvalue` tests E[Z] ≤ 0 exactly: the four cells' counts are multinomial; the
statistic is the studentized mean of Z made monotone (never falling when a row's Z rises), so the null's largest tail
sits on E[Z] = 0; that sup is taken over the null distributions whose FT accuracy lies in a Clopper–Pearson band (Berger
& Boos 1994: the band's risk is added to the p-value), on a grid of the null face refined by a local search — an exact
unconditional test in the sense of Barnard, as for matched-pair ratios (Nam & Blackwelder 2002; Tang, Tang & Chan 2003).
Above PAIRED_MAX_ROWS (the lattice grows as n³) a conditional test: given FT's right/wrong pattern the graft's hits are
two binomials, x_r ~ Bin(n_r, p) and x_w ~ Bin(n_w, q), share = p + q·(1 − a)/a ≥ p + q·w_lo with w_lo from the
Clopper–Pearson upper bound of a at PAIRED_ACCURACY_RISK of the risk (Bonferroni), and p + w_lo·q ≤ τ is tested exactly
(:func:`paired_pvalue`). :func:`paired_bound` inverts either for the report. docs/keep.md argues both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skillgraft.errors import SkillgraftError
from skillgraft.keep.stats.paired_exact import PAIRED_MAX_ROWS, PAIRED_NUISANCE_RISK, z_pvalue
from skillgraft.lazy import np  # numpy, imported at first use (not on --help's path)

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
def z_counts(graft: Outcome, ft: Outcome) -> np.ndarray:
    """Rows per cell, in Z's order: graft right & FT wrong, both right, both wrong, graft wrong & FT right."""
    g, f = graft.pred == graft.labels, ft.pred == ft.labels
    return np.array([int((g & ~f).sum()), int((g & f).sum()), int((~g & ~f).sum()), int((~g & f).sum())])


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
