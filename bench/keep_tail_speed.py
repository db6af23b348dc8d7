"""The paired bound's null tail (keep.stats.paired_exact._z_tail): its O(n²) sum of trinomial × binomial-survival
terms against the tail's definition, the multinomial chance summed over every outcome of the O(n³) lattice whose
statistic is at least the observed one's (how the tail was computed before). Same values, time per grid chunk.

    .venv/bin/python bench/keep_tail_speed.py            # n = 64, 128, 200 rows; 64 null points per chunk
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.special import gammaln

from skillgraft.keep.stats.paired_exact import _face, _face_grid, _lattice, _lattice_index, _z_statistic, _z_tail


def lattice_tail(n: int, target: float, observed: tuple[int, ...]):
    """The definition: Σ over the outcomes at or above the observed statistic of the multinomial pmf."""
    counts, _ = _lattice(n)
    stat = _z_statistic(n, target)
    up = counts[stat >= stat[_lattice_index(n, observed)] - 1e-12].astype(np.float64)
    log_coef = gammaln(n + 1) - gammaln(up + 1).sum(1)

    def tail(weights: np.ndarray) -> np.ndarray:
        pi = _face(target, np.atleast_2d(weights))
        logp = np.log(np.where(pi > 0, pi, 1.0)) + np.where(pi > 0, 0.0, -1e300)
        return np.exp(log_coef[None, :] + logp @ up.T).sum(1)

    return tail


def best_of(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    chunk = _face_grid(40)[:64]
    print("| rows n | observed cells (10, 11, 00, 01) | τ | max abs difference | definition, s / chunk | "
          "O(n²) sum, s / chunk | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for n, observed, target in [(64, (3, 55, 3, 3), 0.9), (128, (5, 108, 8, 7), 0.9), (200, (8, 170, 12, 10), 0.95)]:
        slow, fast = lattice_tail(n, target, observed), _z_tail(n, target, observed)
        diff = float(np.max(np.abs(slow(chunk) - fast(chunk))))
        t_slow, t_fast = best_of(lambda: slow(chunk), args.repeats), best_of(lambda: fast(chunk), args.repeats)
        print(f"| {n} | {observed} | {target} | {diff:.1e} | {t_slow:.3f} | {t_fast:.4f} | {t_slow / t_fast:.0f}× |")


if __name__ == "__main__":
    main()
