"""Exact top-k over coordinates that are streamed tensor by tensor or spread over processes.

One order everywhere (the shared selection's, :func:`skillgraft.graft.selection.top_k_flat`): larger score
first, and among equal scores the smaller position in the graftable universe (tensors in model order,
flat index within a tensor). Because it is a strict total order, top-k(A ∪ B) = top-k(top-k(A) ∪ B):

* :class:`StreamingTopK` keeps the best k of a stream of tensors in O(k) memory;
* :func:`top_k` selects across processes without gathering scores: a threshold search on the scores'
  order-preserving integer keys with all-reduced counts (≈64 rounds), then the same search on positions
  among the scores equal to the threshold (≈log₂|U| rounds). The region equals the single-process one.
"""

from __future__ import annotations

from skillgraft.lazy import torch

from skillgraft.graft.selection import top_k_flat

NONE = -(2 ** 63)  # the max of an empty share


class Collective:
    """Sums and maxima of Python ints over the processes taking part (one process: the value itself)."""

    def sum(self, value: int) -> int:
        return value

    def max(self, value: int) -> int:
        return value


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys with the order of the scores as float64 (−0 = +0; NaN ranks highest, as in top_k_flat)."""
    x = scores.reshape(-1).to(torch.float64)
    x = torch.nan_to_num(x, nan=float("inf"), posinf=float("inf"), neginf=float("-inf")) + 0.0  # −0.0 → +0.0
    bits = x.view(torch.int64)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFF_FFFF_FFFF_FFFF)


def top_k(scores: torch.Tensor, positions: torch.Tensor | None, k: int, group: Collective | None = None
          ) -> torch.Tensor:
    """Mask of this process's share of the global top-k of ``scores`` (ties: smaller ``positions`` first).

    One process (``group=None``): ``positions`` are implied by the order of ``scores`` (ascending) and this
    is ``top_k_flat``. Otherwise every process of ``group`` calls it together with its own scores and their
    global positions, and only counts travel.
    """
    if group is None:
        return top_k_flat(scores.reshape(-1), k)
    keys = order_keys(scores)
    positions = positions.reshape(-1).to(torch.int64)
    total = group.sum(keys.numel())
    if k >= total or k <= 0:
        return torch.full((keys.numel(),), k > 0, dtype=torch.bool, device=keys.device)

    def count(mask: torch.Tensor) -> int:
        return group.sum(int(mask.sum()))

    # the k-th largest key t = the largest t with #{key ≥ t} ≥ k
    lo = -group.max(int((-keys).max()) if keys.numel() else NONE)
    hi = group.max(int(keys.max()) if keys.numel() else NONE)
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        if count(keys >= mid) >= k:
            lo = mid
        else:
            hi = mid - 1
    above, tied = keys > lo, keys == lo
    need = k - count(above)
    # among the tied, the `need` smallest positions: the smallest p with #{tied, position ≤ p} ≥ need
    lo_p, hi_p = 0, group.max(int(positions[tied].max()) if bool(tied.any()) else NONE)
    while lo_p < hi_p:
        mid = lo_p + (hi_p - lo_p) // 2
        if count(tied & (positions <= mid)) >= need:
            hi_p = mid
        else:
            lo_p = mid + 1
    return above | (tied & (positions <= lo_p))


class StreamingTopK:
    """The best k of a stream of score tensors in position order, in O(k) memory (exact, same ties).

    Scores are compared in float32, or float64 once any float64 tensor arrives (as ``top_k_masks``).
    ``add(scores, first)`` takes the next tensor's flat scores, whose positions are first, first+1, …
    (or ``add(scores, positions=...)`` with explicit ascending positions); positions must increase from one
    call to the next. ``result()`` gives (scores, positions), ascending.
    """

    def __init__(self, k: int, dtype: torch.dtype | None = None):
        self.k, self.dtype = k, torch.float32 if dtype is None else dtype
        self.scores = torch.empty(0, dtype=dtype)
        self.positions = torch.empty(0, dtype=torch.int64)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.pending_n = 0
        self.threshold: float | None = None  # the k-th best score so far: anything below it is out

    def add(self, scores: torch.Tensor, first: int = 0, positions: torch.Tensor | None = None) -> None:
        if scores.dtype == torch.float64 and self.dtype != torch.float64:  # compare wide from now on (exact)
            self.dtype = torch.float64
            self.scores = self.scores.to(self.dtype)
            self.pending = [(s.to(self.dtype), p) for s, p in self.pending]
        flat = scores.reshape(-1).to(self.dtype)
        if self.k <= 0 or not flat.numel():
            return
        if self.threshold is None:
            keep = torch.arange(flat.numel())
        else:
            keep = torch.nonzero(flat > self.threshold).view(-1)  # an equal score comes later: it loses
        if keep.numel():
            where = keep.cpu() + first if positions is None else positions.reshape(-1).to(torch.int64).cpu()[keep.cpu()]
            self.pending.append((flat[keep].cpu(), where))
            self.pending_n += keep.numel()
        if self.pending_n >= self.k:
            self._merge()

    def _merge(self) -> None:
        scores = torch.cat([self.scores, *[s for s, _ in self.pending]])
        positions = torch.cat([self.positions, *[p for _, p in self.pending]])
        self.pending, self.pending_n = [], 0
        if scores.numel() > self.k:
            chosen = top_k_flat(scores, self.k)
            scores, positions = scores[chosen], positions[chosen]
            self.threshold = float(scores.min())
        self.scores, self.positions = scores, positions

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pending:
            self._merge()
        return self.scores, self.positions
