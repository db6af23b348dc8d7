"""Candidate-restricted localization: S, Δ and the saved θ_pre exist only on a candidate set C.

C is the top-c fraction of the graftable coordinates by |Δ| (``LocalizeConfig.candidates``; c ≥ sparsity
and ≥ every fractional budget), or a Region chosen by any other scorer, plus an explicit γ_base. It is
kept per tensor as int32 positions, and only on C the localizer holds

    S (fp32, also for bf16/fp16 models), Δ = θ_ft − θ_pre, θ_pre (for the restore), γ_base, γ held, ∂L/∂θ

Coordinates outside C stay exactly θ_pre (γ = 0) and are never selected. A hook on each graftable tensor
(``register_post_accumulate_grad_hook``) gathers its gradient onto C as soon as it is accumulated and
drops the dense gradient at once, so at most one tensor's dense gradient exists. θ_ft is read once per
tensor from its source (memory-mapped safetensors for a saved model). Memory beyond the model and its
activations: about 19 bytes per candidate, plus one tensor's gradient.

With c = 1 every coordinate is a candidate and the trajectory, regions and restore are bit-identical to
the dense localizer (same S stream, same arithmetic elementwise, the same exact top-k). Under FSDP each
process holds C ∩ its own rows; the budgets' top-k is the distributed one of :mod:`.topk`.
"""

from __future__ import annotations

import ctypes
from functools import partial

import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.keep import Ranking
from skillgraft.graft.localizers.sharded import Group, Piece
from skillgraft.graft.localizers.source import FineTuned
from skillgraft.graft.localizers.topk import StreamingTopK, top_k
from skillgraft.graft.region import Region, numel_of
from skillgraft.graft.selection import Budget

CHUNK = 1 << 20  # S is drawn in chunks of this many values (same stream as one draw per tensor)
BINS = 1 << 15   # histogram bins of |Δ|: the top 16 bits of a non-negative float32 (order-preserving)


def _bins(moved: torch.Tensor) -> torch.Tensor:
    """Histogram bin of each |Δ| (non-negative; NaN lands above +inf, as the shared selection ranks it)."""
    keys = moved.float() if moved.dtype != torch.float32 else moved.clone()
    keys = keys.view(torch.int32).bitwise_right_shift_(16)
    return keys.to(torch.int16)  # < 2**15


def _release_freed_memory() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere): building C frees
    many tensor-sized temporaries that glibc would otherwise keep resident next to the long-lived state."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Holding:
    """Scoring a binary choice inside a continuous trajectory: hold θ_pre + mask⊙Δ, then go back.

    Shared by the dense working state and :class:`Candidates` (both define ``names``, ``current``, ``hold``,
    and ``S``, ``base``, ``bias`` for :meth:`gamma`).
    """

    def gamma(self, n: str) -> torch.Tensor:
        """γ of tensor n: σ(S − bias), flipped to 1 − σ on γ_base."""
        s = torch.sigmoid(self.S[n] - self.bias)
        return torch.where(self.base[n], 1 - s, s)

    def ranking_keys(self, seed: int) -> tuple[dict, dict, dict]:
        """The learned order of the held coordinates (:class:`~skillgraft.graft.keep.Ranking` ``first``/``then``):

        * first the learned region, γ > 0.5 (the rounded γ), by the logit of γ with every coordinate's S started
          from the same ½ (S − S₀ + ½: the learned drift orders them, not the initial draw's noise), ±(bias − S̃),
          + on γ_base;
        * then every other coordinate by |Δ| (γ_base's own score): outside the region the drift is a small
          first-order signal the loss never tested in a graft, and ordering the rest by it loses to a random
          order at 1e-1 of MiniLM's body (bench/RESULTS.md, issue 25).

        Returns (keys, in the region, |Δ|) per tensor, on the CPU."""
        start = self._draw_S(seed)
        keys, region, moved = {}, {}, {}
        for n in self.names:
            drift = self.S[n].double() - start[n].double() + 0.5 - self.bias
            keys[n] = torch.where(self.base[n], -drift, drift).cpu()
            region[n] = (self.gamma(n) > 0.5).cpu()
            moved[n] = self.delta[n].abs().double().cpu()
        return keys, region, moved

    def hold_choice(self, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move the working weights to the binary ``masks``; returns the continuous γ to :meth:`release` to."""
        continuous = dict(self.current)
        for n in self.names:
            self.hold(n, masks[n].to(continuous[n].dtype))
        return continuous

    def release(self, continuous: dict[str, torch.Tensor]) -> None:
        """Back to the continuous γ that :meth:`hold_choice` returned."""
        for n in self.names:
            self.hold(n, continuous[n])


class Candidates(Holding):
    """The working model's graftable tensors restricted to C: Δ, S, γ_base, γ held, θ_pre, gathered ∂L/∂θ."""

    def __init__(self, pieces: dict[str, Piece], source: FineTuned, config, group: Group, *,
                 base: Region | None = None, chosen: Region | None = None):
        self.pieces, self.names, self.group = pieces, list(pieces), group
        self.shapes = {n: p.shape for n, p in pieces.items()}
        self.offsets, start = {}, 0  # each tensor's first position in the universe (tensors in `names` order)
        for n, p in pieces.items():
            self.offsets[n] = start
            start += numel_of(p.shape)
        self.universe = start
        self.bias = config.sigmoid_bias
        if base is not None:
            _check_fits(base, self.shapes, "base region")
        if chosen is not None:
            _check_fits(chosen, self.shapes, "candidate region")
        k_c = Budget.parse(config.candidates).size(self.universe) if config.candidates is not None else self.universe
        positions = self._choose(k_c, source, base, chosen)
        self.pos, self.original, self.delta = {}, {}, {}
        for n, piece in pieces.items():
            pos = positions.pop(n)
            values = piece.values()
            self.pos[n] = pos.to(torch.int32 if piece.numel < 2 ** 31 else torch.int64).to(values.device)
            self.original[n] = values[pos.to(values.device)]  # a copy (advanced indexing)
            ft = source.rows(n, piece.start, piece.stop).reshape(-1)
            self.delta[n] = ft[pos.to(ft.device)].to(values.device) - self.original[n]
        self.size = self._total(sum(int(p.numel()) for p in self.pos.values()))
        self.base = self._base(config.sparsity, base)
        self.base_size = self._total(sum(int(b.sum()) for b in self.base.values()))
        self.S = self._draw_S(config.seed)
        self.current = {n: self.gamma(n) for n in self.names}
        self.grads: dict[str, torch.Tensor | None] = dict.fromkeys(self.names)
        self.hooks: list = []
        _release_freed_memory()

    def ranking(self, seed: int) -> Ranking:
        """The learned order of the candidates (:meth:`Holding.ranking_keys`); coordinates outside C are never
        ranked, so the largest region of the family is C."""
        if self.group.sharded:
            raise SkillgraftError("keep targets need the learned ranking in one process; run without sharding")
        keys, region, moved = (torch.cat([t[n].reshape(-1) for n in self.names]) for t in self.ranking_keys(seed))
        positions = torch.cat([self._global(n, self.pos[n]) for n in self.names])
        return Ranking.from_keys(self.shapes, positions, keys, first=region, then=moved)

    # ------------------------------------------------------------------ construction
    def _total(self, local: int) -> int:
        return self.group.sum(local) if self.group.sharded else local

    def _global(self, n: str, pos: torch.Tensor) -> torch.Tensor:
        return pos.to(torch.int64).cpu() + (self.offsets[n] + self.pieces[n].first)

    def _choose(self, k_c: int, source: FineTuned, base: Region | None, chosen: Region | None) -> dict:
        """Local positions (sorted int64) of C in each piece: the top-k_c |Δ| (or ``chosen``) ∪ base.

        Two reads of θ_ft, no per-coordinate buffer: a histogram of |Δ| by its float32 bits' top half (all-
        reduced when sharded) gives the bin holding the k_c-th largest; everything above it is in, and only
        that bin's coordinates go through the exact (streamed, distributed) top-k with the shared tie rule.
        """
        if chosen is not None:
            positions = {n: self._local(chosen, n) for n in self.names}
        elif k_c >= self.universe:
            positions = {n: torch.arange(p.numel) for n, p in self.pieces.items()}
        else:
            hist = torch.zeros(BINS, dtype=torch.int64)
            for n, piece in self.pieces.items():
                hist += torch.bincount(_bins(self._movement(n, source)).cpu(), minlength=BINS)
            if self.group.topk is not None:
                hist = self.group.sum_(hist.to(self.group.device)).cpu()
            from_top = hist.flip(0).cumsum(0)
            edge = BINS - 1 - int(torch.searchsorted(from_top, k_c))  # the bin holding the k_c-th largest
            need = k_c - int(from_top[BINS - 1 - edge] - hist[edge])
            stream, positions = StreamingTopK(need), {}
            for n, piece in self.pieces.items():
                moved = self._movement(n, source)
                bins = _bins(moved)
                positions[n] = torch.nonzero(bins > edge).view(-1).cpu()
                tied = torch.nonzero(bins == edge).view(-1)
                stream.add(moved[tied], positions=tied.cpu() + (self.offsets[n] + piece.first))
                del moved, bins, tied
            scores, glob = stream.result()
            if self.group.topk is not None:  # the global top-need among every process's local top-need
                glob = glob[top_k(scores, glob, need, self.group.topk)]
            for n, piece in self.pieces.items():
                lo = self.offsets[n] + piece.first
                edge_pos = glob[(glob >= lo) & (glob < lo + piece.numel)] - lo
                positions[n] = torch.sort(torch.cat([positions[n], edge_pos])).values
        if base is not None:
            positions = {n: torch.unique(torch.cat([positions[n], self._local(base, n)])) for n in self.names}
        return positions

    def _movement(self, n: str, source: FineTuned) -> torch.Tensor:
        """|θ_ft − θ_pre| of this process's rows of tensor n, flat (one tensor read)."""
        piece = self.pieces[n]
        values = piece.values()
        moved = torch.sub(source.rows(n, piece.start, piece.stop).reshape(-1).to(values.device), values)
        return moved.abs_()

    def _local(self, region: Region, n: str) -> torch.Tensor:
        """The region's coordinates of tensor n that fall in this process's piece, as local positions."""
        idx = region.indices.get(n)
        if idx is None:
            return torch.empty(0, dtype=torch.int64)
        piece = self.pieces[n]
        idx = idx[(idx >= piece.first) & (idx < piece.first + piece.numel)]
        return idx - piece.first

    def _base(self, sparsity: float, base: Region | None) -> dict[str, torch.Tensor]:
        """γ_base on C: the given region, or the top-``sparsity`` |Δ| (C holds it: c ≥ sparsity)."""
        if base is not None:
            out = {}
            for n in self.names:
                idx = self._local(base, n).to(self.pos[n].device)
                out[n] = torch.isin(self.pos[n].to(torch.int64), idx)
            return out
        k = int(round(sparsity * self.universe))
        wide = torch.float64 if any(d.dtype == torch.float64 for d in self.delta.values()) else torch.float32
        scores = torch.cat([d.abs().reshape(-1).cpu().to(wide) for d in self.delta.values()])
        glob = torch.cat([self._global(n, p) for n, p in self.pos.items()]) if self.group.topk else None
        return self._split(top_k(scores, glob, k, self.group.topk))

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for n, pos in self.pos.items():
            out[n] = flat[start:start + pos.numel()].to(pos.device)
            start += pos.numel()
        return out

    def _draw_S(self, seed: int) -> dict[str, torch.Tensor]:
        """S ~ U[0, 1) at C: the dense localizer's draw (one stream over the tensors in order), gathered."""
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for n, piece in self.pieces.items():
            want = self.pos[n].to(torch.int64).cpu() + piece.first  # flat index in the whole tensor, ascending
            S = torch.empty(want.numel(), dtype=torch.float32)
            done, j, total = 0, 0, numel_of(piece.shape)
            while done < total:
                size = min(CHUNK, total - done)
                draw = torch.rand(size, generator=gen)
                end = int(torch.searchsorted(want, done + size)) if want.numel() else 0
                if end > j:
                    S[j:end] = draw[want[j:end] - done]
                    j = end
                done += size
            out[n] = S.to(self.delta[n].device)
        return out

    # ------------------------------------------------------------------ the working weights
    @torch.no_grad()
    def apply(self) -> None:
        """Move C from θ_pre to θ_pre + γ⊙Δ (the caller restores with :meth:`restore` in a finally)."""
        for n in self.names:
            values, idx = self.pieces[n].values(), self.pos[n]
            step = self.current[n].to(values.dtype) * self.delta[n]
            values.index_copy_(0, idx.to(torch.int64), (values.index_select(0, idx) + step).to(values.dtype))

    @torch.no_grad()
    def hold(self, n: str, target: torch.Tensor) -> None:
        """Move tensor n's candidates from θ_pre + current⊙Δ to θ_pre + target⊙Δ."""
        delta = self.delta[n]
        change = target.to(delta.dtype) - self.current[n].to(delta.dtype)
        values, idx = self.pieces[n].values(), self.pos[n]
        values.index_copy_(0, idx.to(torch.int64), (values.index_select(0, idx) + change * delta).to(values.dtype))
        self.current[n] = target

    @torch.no_grad()
    def restore(self) -> None:
        """θ_pre back on C, bit-exactly (nothing outside C was ever written)."""
        for n in self.names:
            self.pieces[n].values().index_copy_(0, self.pos[n].to(torch.int64), self.original[n])

    # ------------------------------------------------------------------ gradients and the step on S
    def watch(self) -> None:
        """Gather each graftable tensor's gradient onto C as soon as it is accumulated; drop the dense one."""
        for n, piece in self.pieces.items():
            piece.param.requires_grad_(True)
            self.hooks.append(piece.param.register_post_accumulate_grad_hook(partial(self._gather, n)))

    def _gather(self, n: str, param: torch.Tensor) -> None:
        g = self.pieces[n].grad()
        if g is not None:
            picked = g.index_select(0, self.pos[n])
            self.grads[n] = picked if self.grads[n] is None else self.grads[n] + picked  # as autograd accumulates
        param.grad = None

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    @torch.no_grad()
    def update(self, lr: float, l1: float, group: Group | None = None) -> None:
        """S ← S − lr·∂L/∂S on C; ∂L/∂S = (∂L/∂θ ⊙ Δ + λ) ⊙ (1 − 2γ_base) ⊙ σ'(S − bias); θ follows γ."""
        for n in self.names:
            g = self.grads[n]
            if g is None:
                g = torch.zeros(self.pos[n].numel(), dtype=self.pieces[n].param.dtype, device=self.S[n].device)
            if self.group.world > 1 and not self.group.sharded:
                self.group.sum_(g)  # replicated model: sum the ranks' gathered gradients (not the dense ones)
            s = torch.sigmoid(self.S[n] - self.bias)
            sign = 1 - 2 * self.base[n].to(s.dtype)
            grad_s = (g.to(s.dtype) * self.delta[n].to(s.dtype) + l1) * sign * s * (1 - s)
            self.S[n].sub_(lr * grad_s)
            self.grads[n] = None
            self.hold(n, self.gamma(n))

    # ------------------------------------------------------------------ selection
    def choose(self, budget: Budget) -> dict[str, torch.Tensor]:
        """Masks over C of what ``budget`` selects now: γ > 0.5, or exactly the top-k of γ (ties by position)."""
        if budget.rounding:
            return {n: self.gamma(n) > 0.5 for n in self.names}
        k = budget.size(self.universe)
        if k > self.size:
            raise SkillgraftError(f"budget {budget} asks for {k} coordinates but the candidate set holds {self.size}; "
                                  "raise candidates")
        scores = torch.cat([self.gamma(n).reshape(-1).cpu() for n in self.names])
        glob = torch.cat([self._global(n, p) for n, p in self.pos.items()]) if self.group.topk else None
        return self._split(top_k(scores, glob, k, self.group.topk))

    def count(self, masks: dict[str, torch.Tensor]) -> int:
        return self._total(sum(int(m.sum()) for m in masks.values()))

    def region(self, masks: dict[str, torch.Tensor]) -> Region:
        """The Region of ``masks`` (gathered from every process when sharded)."""
        mine = {n: (self.pos[n][masks[n]].to(torch.int64).cpu() + self.pieces[n].first) for n in self.names}
        if self.group.sharded and self.group.world > 1:
            parts = self.group.gather({n: v.numpy() for n, v in mine.items() if v.numel()})
            mine = {n: torch.cat([torch.as_tensor(p[n]) for p in parts if n in p]) for n in self.names
                    if any(n in p for p in parts)}
        return Region(self.shapes, mine)


def _check_fits(region: Region, shapes: dict, what: str) -> None:
    bad = [n for n in region.indices if n not in shapes]
    if bad or any(tuple(shapes[n]) != tuple(s) for n, s in region.shapes.items() if n in shapes):
        raise SkillgraftError(f"{what} does not fit the graftable tensors (e.g. {bad[:2]})")
