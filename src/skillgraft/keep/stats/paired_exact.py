"""The paired bound's exact test on up to PAIRED_MAX_ROWS rows: H0 E[Z] ≤ 0 from the counts of the four cells
(graft right / FT wrong, both right, both wrong, graft wrong / FT right), Z = 1[graft right] − τ·1[FT right].

An unconditional test in the manner of Barnard (Berger & Boos 1994 for the nuisance): the statistic is the
studentized mean of Z made monotone; the p-value is the sup, over the null face E[Z] = 0 within a Clopper–Pearson
band of FT's accuracy, of P(statistic ≥ observed), plus the band's risk. docs/keep.md argues it;
:mod:`skillgraft.keep.stats.bound` decides and inverts with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from skillgraft.lazy import np  # numpy, imported at first use (not on --help's path)

PAIRED_MAX_ROWS = 200   # the exact multinomial test up to this many rows; above, the conditional (Bonferroni) test
PAIRED_SIMPLEX = 40     # the null face's grid: a triangle cut into PAIRED_SIMPLEX² pieces (861 points at 40)
PAIRED_NUISANCE_RISK = 0.02  # the share of the risk spent on the Berger–Boos band of FT's accuracy
_GRID_CHUNK = 64  # null points per tail evaluation of the grid (a failing test stops after the first that decides)


@functools.lru_cache(maxsize=4)
def _lattice(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts [L, 4] of every outcome of n rows over the cells 10, 11, 00, 01; its flat index in the cube
    (u1, u2, u3) = cumulative counts from the top cell, 0 ≤ u1 ≤ u2 ≤ u3 ≤ n, cube side n + 1), in the cube's order
    (lexicographic in u1, u2, u3): each (u1 ≤ u2) pair repeated for u3 = u2 … n, never the whole cube."""
    u1, u2 = np.triu_indices(n + 1)  # u1 ≤ u2, lexicographic
    lengths = n + 1 - u2             # u3 from u2 to n
    start = np.cumsum(lengths) - lengths
    u3 = np.arange(int(lengths.sum())) - np.repeat(start, lengths) + np.repeat(u2, lengths)
    u1, u2 = np.repeat(u1, lengths), np.repeat(u2, lengths)
    counts = np.stack([u1, u2 - u1, u3 - u2, n - u3], 1).astype(np.int64)
    return counts, (u1.astype(np.int64) * (n + 1) + u2) * (n + 1) + u3


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
    # the least value over the orthant above each point: a running minimum along each axis from the top, computed
    # in place on the cube reversed once (a minimum is exact: the order of the passes changes no value)
    cube = cube.reshape((n + 1,) * 3)[::-1, ::-1, ::-1].copy()
    for axis in range(3):
        np.minimum.accumulate(cube, axis=axis, out=cube)
    return cube[::-1, ::-1, ::-1].reshape(-1)[flat]


def _face(target: float, weights: np.ndarray) -> np.ndarray:
    """Null distributions with E[Z] = 0 (cells 10, 11, 00, 01) from barycentric ``weights`` [G, 3] of the face's
    vertices: all rows 00; FT right on τ of rows with the graft right on all of them (11: τ, 01: 1 − τ); the graft
    right only where FT is wrong (10: τ/(1 + τ), 01: 1/(1 + τ))."""
    return np.clip(weights, 0, None) @ _vertices(target)


def _vertices(target: float) -> np.ndarray:
    return np.array([[0.0, 0.0, 1.0, 0.0], [0.0, target, 0.0, 1 - target],
                     [target / (1 + target), 0.0, 0.0, 1 / (1 + target)]])


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
    # survive[m, s] = P(at least s of m rows in 00), summed from s = m down (terms above m are 0): only the rows m
    # and the columns s the tail reads are made, the columns stored from the top s down (the sum's own order)
    lo, hi, s_lo = int(rest.min()), int(rest.max()), int(need.min())
    j = np.arange(hi, s_lo - 1, -1, dtype=np.float64)
    m = np.arange(lo, hi + 1, dtype=np.float64)[:, None]
    rows_01 = np.maximum(m - j, 0)
    log_bin = np.where(j <= m, gammaln(m + 1) - gammaln(j + 1) - gammaln(rows_01 + 1), -np.inf)
    cells = np.stack([i1, i2 - i1, rest]).astype(np.float64)  # rows in 10, in 11, in 00 or 01: per (u1, u2)
    at = (rest - lo) * len(j) + (hi - need)  # survive[m = rest, s = need] in the rows and columns made
    vertices = _vertices(target)

    def log(x: np.ndarray) -> np.ndarray:  # log 0 as a huge finite negative: 0 · log 0 = 0, k · log 0 → exp 0
        return np.log(np.where(x > 0, x, 1.0)) + np.where(x > 0, 0.0, -1e300)

    def tail(weights: np.ndarray) -> np.ndarray:
        pi = np.clip(np.atleast_2d(weights), 0, None) @ vertices  # _face
        out = np.empty(len(pi))
        for g in range(0, len(pi), 32):
            p = pi[g:g + 32]
            other = p[:, 2] + p[:, 3]  # the chance of a row in 00 or 01; q: in 00 given that
            q = np.divide(p[:, 2], other, out=np.full_like(other, 0.5), where=other > 0)
            lq = log(np.stack([q, 1 - q], 1))[:, :, None, None]
            survive = np.cumsum(np.exp(log_bin + j * lq[:, 0] + rows_01 * lq[:, 1]), 2)  # [G, m, s from the top]
            tri = np.exp(log_tri + log(np.stack([p[:, 0], p[:, 1], other], 1)) @ cells)
            out[g:g + 32] = (tri * survive.reshape(len(p), -1)[:, at]).sum(1)
        return out

    return tail


def _lattice_index(n: int, observed) -> int:
    n10, n11, n00, _ = (int(c) for c in observed)
    _, flat = _lattice(n)  # sorted: the cube's order
    u1, u2, u3 = n10, n10 + n11, n10 + n11 + n00
    return int(np.searchsorted(flat, (u1 * (n + 1) + u2) * (n + 1) + u3))


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
