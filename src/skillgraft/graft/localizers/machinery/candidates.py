"""The candidate (and sharded) layout of the engine: S, Δ and the saved θ_pre exist only on a candidate set C.

C is the top-c fraction of the graftable coordinates by |Δ| (``candidates``; c ≥ sparsity and ≥ every
fractional budget), or a Region chosen by any other score (a saliency), plus an explicit γ_base. It is
kept per tensor as int32 positions, and only on C the localizer holds

    Δ = θ_ft − θ_pre, θ_pre (for the restore), the mask held, ∂L/∂θ; and the relaxation's S (fp32) and γ_base

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

from contextlib import contextmanager

from functools import partial

from skillgraft.lazy import no_grad, torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery.layouts import Layout
from skillgraft.graft.localizers.machinery.sharded import Group, Piece
from skillgraft.graft.localizers.machinery.source import FineTuned
from skillgraft.graft.localizers.machinery.topk import StreamingTopK, top_k
from skillgraft.graft.region import Region, numel_of
from skillgraft.heap import release_freed_memory

CHUNK = 1 << 20  # S is drawn in chunks of this many values (same stream as one draw per tensor)
BINS = 1 << 15   # histogram bins of |Δ|: the top 16 bits of a non-negative float32 (order-preserving)


def _bins(moved: torch.Tensor) -> torch.Tensor:
    """Histogram bin of each |Δ| (non-negative; NaN lands above +inf, as the shared selection ranks it)."""
    keys = moved.float() if moved.dtype != torch.float32 else moved.clone()
    keys = keys.view(torch.int32).bitwise_right_shift_(16)
    return keys.to(torch.int16)  # < 2**15


class Candidates(Layout):
    """The working model's graftable tensors restricted to C: Δ, S, γ_base, γ held, θ_pre, gathered ∂L/∂θ."""

    def __init__(self, pieces: dict[str, Piece], source: FineTuned, group: Group, *, size: int | None = None,
                 chosen: Region | None = None, base: Region | None = None):
        """C = the top-``size`` |Δ| (every coordinate when None), or the Region ``chosen``; ∪ ``base`` (γ_base)."""
        self.pieces, self.names, self.group = pieces, list(pieces), group
        self.shapes = {n: p.shape for n, p in pieces.items()}
        self.offsets, start = {}, 0  # each tensor's first position in the universe (tensors in `names` order)
        for n, p in pieces.items():
            self.offsets[n] = start
            start += numel_of(p.shape)
        self.universe = start
        if base is not None:
            _check_fits(base, self.shapes, "base region")
        if chosen is not None:
            _check_fits(chosen, self.shapes, "candidate region")
        positions = self._choose(self.universe if size is None else size, source, base, chosen)
        self.pos, self.original, self.delta = {}, {}, {}
        for n, piece in pieces.items():
            pos = positions.pop(n)
            values = piece.values()
            self.pos[n] = pos.to(torch.int32 if piece.numel < 2 ** 31 else torch.int64).to(values.device)
            self.original[n] = values[pos.to(values.device)]  # a copy (advanced indexing)
            ft = source.rows(n, piece.start, piece.stop).reshape(-1)
            self.delta[n] = ft[pos.to(ft.device)].to(values.device) - self.original[n]
        self.size = self._total(sum(int(p.numel()) for p in self.pos.values()))
        self.current = {n: torch.zeros(d.shape, device=d.device) for n, d in self.delta.items()}
        self.grads_: dict[str, torch.Tensor | None] = dict.fromkeys(self.names)
        self.hooks: list = []
        release_freed_memory()  # building C freed many tensor-sized temporaries

    def positions(self) -> torch.Tensor:
        """The candidates' positions in the universe; coordinates outside C are never ranked or selected."""
        if self.group.sharded:
            raise SkillgraftError("keep targets need the learned ranking in one process; run without sharding")
        return torch.cat([self._global(n, self.pos[n]) for n in self.names])

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

    def masks_of(self, region: Region) -> dict[str, torch.Tensor]:
        out = {}
        for n in self.names:
            idx = self._local(region, n).to(self.pos[n].device)
            out[n] = torch.isin(self.pos[n].to(torch.int64), idx)
        return out

    def gather(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for n, piece in self.pieces.items():
            flat = scores[n].reshape(-1)[piece.first:piece.first + piece.numel]
            out[n] = flat[self.pos[n].to(torch.int64).to(flat.device)].to(self.delta[n].device)
        return out

    def top(self, scores: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
        """Exactly the top-k over C (distributed when sharded); compared in float32, or float64 if any score is."""
        wide = torch.float64 if any(s.dtype == torch.float64 for s in scores.values()) else torch.float32
        flat = torch.cat([scores[n].reshape(-1).cpu().to(wide) for n in self.names])
        glob = torch.cat([self._global(n, p) for n, p in self.pos.items()]) if self.group.topk else None
        return self._split(top_k(flat, glob, k, self.group.topk))

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for n, pos in self.pos.items():
            out[n] = flat[start:start + pos.numel()].to(pos.device)
            start += pos.numel()
        return out

    def draw(self, seed: int) -> dict[str, torch.Tensor]:
        """U[0, 1) at C: the dense layout's draw (one stream over the tensors in order), gathered."""
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for n, piece in self.pieces.items():
            want = self.pos[n].to(torch.int64).cpu() + piece.first  # flat index in the whole tensor, ascending
            out[n] = _stream_at(gen, want, numel_of(piece.shape)).to(self.delta[n].device)
        return out

    def draw_flat(self, seed: int) -> dict[str, torch.Tensor]:
        """U[0, 1) over C itself: the i-th candidate (C in universe order, over every process) gets the stream's
        i-th value — what the relaxed localizers always drew; it depends on C, not on the process count."""
        counts = {n: int(p.numel()) for n, p in self.pos.items()}
        every = self.group.gather(counts) if self.group.sharded else [counts]
        start, want = 0, []
        for n in self.names:
            before = sum(c[n] for c in every[:self.group.rank]) if self.group.sharded else 0
            want.append(torch.arange(counts[n]) + start + before)
            start += sum(c[n] for c in every)
        return self._split(_stream_at(torch.Generator().manual_seed(seed), torch.cat(want), start))

    # ------------------------------------------------------------------ the working weights
    @no_grad
    def hold(self, n: str, target: torch.Tensor) -> None:
        """Move tensor n's candidates from θ_pre + current⊙Δ to θ_pre + target⊙Δ."""
        delta = self.delta[n]
        change = target.to(delta.dtype) - self.current[n].to(delta.dtype)
        values, idx = self.pieces[n].values(), self.pos[n]
        values.index_copy_(0, idx.to(torch.int64), (values.index_select(0, idx) + change * delta).to(values.dtype))
        self.current[n] = target

    @no_grad
    def put(self, n: str, target: torch.Tensor) -> None:
        """θ_pre + target⊙Δ on tensor n's candidates, computed in float32 from the saved θ_pre (no drift)."""
        values = self.pieces[n].values()
        new = self.original[n].float() + target.float() * self.delta[n].float()
        values.index_copy_(0, self.pos[n].to(torch.int64), new.to(values.dtype))
        self.current[n] = target

    def _working(self) -> dict[str, torch.Tensor]:
        return {n: self.pieces[n].values().index_select(0, self.pos[n].to(torch.int64)) for n in self.names}

    def _set_working(self, working: dict[str, torch.Tensor]) -> None:
        for n in self.names:
            values = self.pieces[n].values()
            values.index_copy_(0, self.pos[n].to(torch.int64), working[n].to(values.device, values.dtype))

    @contextmanager
    def full(self):
        """See :meth:`Layout.full`: θ_pre + Δ on every candidate, then the saved θ_pre back (exact)."""
        try:
            for n in self.names:
                self.put(n, torch.ones_like(self.delta[n], dtype=torch.float32))
            yield
        finally:
            self.restore()
            self.current = {n: torch.zeros(d.shape, device=d.device) for n, d in self.delta.items()}

    @no_grad
    def restore(self) -> None:
        """θ_pre back on C, bit-exactly (nothing outside C was ever written)."""
        for n in self.names:
            self.pieces[n].values().index_copy_(0, self.pos[n].to(torch.int64), self.original[n])

    # ------------------------------------------------------------------ gradients
    def watch(self) -> None:
        """Gather each graftable tensor's gradient onto C as soon as it is accumulated; drop the dense one."""
        for n, piece in self.pieces.items():
            piece.param.requires_grad_(True)
            self.hooks.append(piece.param.register_post_accumulate_grad_hook(partial(self._gather, n)))

    def _gather(self, n: str, param: torch.Tensor) -> None:
        g = self.pieces[n].grad()
        if g is not None:
            picked = g.index_select(0, self.pos[n])
            self.grads_[n] = picked if self.grads_[n] is None else self.grads_[n] + picked  # as autograd accumulates
        param.grad = None

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    @no_grad
    def grads(self) -> dict[str, torch.Tensor]:
        """The gathered ∂L/∂θ on C since the last call (zeros where a tensor got none)."""
        out = {}
        for n in self.names:
            g = self.grads_[n]
            if g is None:
                g = torch.zeros(self.pos[n].numel(), dtype=self.pieces[n].param.dtype, device=self.delta[n].device)
            if self.group.world > 1 and not self.group.sharded:
                self.group.sum_(g)  # replicated model: sum the ranks' gathered gradients (not the dense ones)
            out[n] = g
            self.grads_[n] = None
        return out

    def region(self, masks: dict[str, torch.Tensor]) -> Region:
        """The Region of ``masks`` (gathered from every process when sharded)."""
        mine = {n: (self.pos[n][masks[n]].to(torch.int64).cpu() + self.pieces[n].first) for n in self.names}
        if self.group.sharded and self.group.world > 1:
            parts = self.group.gather({n: v.numpy() for n, v in mine.items() if v.numel()})
            mine = {n: torch.cat([torch.as_tensor(p[n]) for p in parts if n in p]) for n in self.names
                    if any(n in p for p in parts)}
        return Region(self.shapes, mine)


def _stream_at(gen: torch.Generator, want: torch.Tensor, total: int) -> torch.Tensor:
    """The values at positions ``want`` (ascending) of the next ``total`` draws of U[0, 1) from ``gen``, drawn in
    chunks (the same stream as one draw of ``total``), without holding ``total`` values at once."""
    out = torch.empty(want.numel(), dtype=torch.float32)
    done, j = 0, 0
    while done < total:
        size = min(CHUNK, total - done)
        draw = torch.rand(size, generator=gen)
        end = int(torch.searchsorted(want, done + size)) if want.numel() else 0
        if end > j:
            out[j:end] = draw[want[j:end] - done]
            j = end
        done += size
    return out


def _check_fits(region: Region, shapes: dict, what: str) -> None:
    bad = [n for n in region.indices if n not in shapes]
    if bad or any(tuple(shapes[n]) != tuple(s) for n, s in region.shapes.items() if n in shapes):
        raise SkillgraftError(f"{what} does not fit the graftable tensors (e.g. {bad[:2]})")
