"""Where a learned mask lives: the coordinates it covers, Δ there, and writing θ_pre + m ⊙ Δ into the model.

A layout is the engine's (:mod:`.engine`) view of the working model's graftable tensors:

* :class:`Dense` — every graftable coordinate, per tensor in its own shape; θ_pre is restored from the
  caller's offloaded snapshot;
* :class:`~skillgraft.graft.localizers.machinery.candidates.Candidates` — a candidate set C only (top-c |Δ| or a Region
  chosen by any score), flat per tensor; θ_pre saved and restored on C; gradients gathered onto C by hooks.
  Under FSDP2 it holds C ∩ this process's rows (the *sharded* layout) and its top-k is the distributed one.

Both hold per tensor ``delta`` (Δ at the layout's coordinates, model dtype) and ``current`` (the mask the
weights hold), and write a mask two ways: :meth:`Layout.hold` moves the weights by (m − current) ⊙ Δ (the
paper's localizer, whose trajectory is pinned bit for bit), :meth:`Layout.put` writes θ_pre + m ⊙ Δ from the
saved θ_pre (binary and sampled masks: no drift however often they flip).
"""

from __future__ import annotations

from contextlib import contextmanager

from skillgraft.lazy import no_grad, torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery.sharded import Group
from skillgraft.graft.localizers.machinery.source import FineTuned, InMemory
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget, top_k_masks


def joined(values: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor | None:
    """The one flat tensor that ``values[n]`` (``names`` in order) are consecutive contiguous views of, or None."""
    first = values[names[0]]
    base, start = first.untyped_storage().data_ptr(), first.storage_offset()
    offset = start
    for n in names:
        t = values[n]
        if (t.dtype != first.dtype or t.device != first.device or not t.is_contiguous()
                or t.untyped_storage().data_ptr() != base or t.storage_offset() != offset):
            return None
        offset += t.numel()
    return first.as_strided((offset - start,), (1,), start)


class Layout:
    """What the engine needs of a layout (see the module doc); subclasses fill in the storage."""

    names: list[str]
    delta: dict[str, torch.Tensor]
    current: dict[str, torch.Tensor]
    universe: int           # |U|: every graftable coordinate, over all processes
    size: int | None = None  # |C| when candidate-restricted (None: dense)
    group: Group

    # ------------------------------------------------------------------ writing masks
    @no_grad
    def hold(self, n: str, target: torch.Tensor) -> None:
        """Move tensor n's working weights from θ_pre + current⊙Δ to θ_pre + target⊙Δ (incrementally)."""
        raise NotImplementedError

    @no_grad
    def put(self, n: str, target: torch.Tensor) -> None:
        """Write θ_pre + target⊙Δ at tensor n from the saved θ_pre (exact, whatever was held before)."""
        raise SkillgraftError(f"{type(self).__name__} layout keeps no θ_pre to write binary masks from")

    def write(self, masks: dict[str, torch.Tensor], absolute: bool = False) -> None:
        for n in self.names:  # a lazy ``masks`` (the sigmoid's) makes one tensor's mask at a time
            (self.put if absolute else self.hold)(n, masks[n])

    def forget(self) -> None:
        """Drop what can be recomputed between steps (see :meth:`Dense.forget`); by default nothing."""

    @contextmanager
    def full(self):
        """θ_pre + Δ at every coordinate the layout holds, for the block; θ_pre back bit for bit after it. Only
        before the first mask is written (the weights hold θ_pre): what a fit share is measured against when θ_ft
        is read from its files."""
        raise NotImplementedError
        yield  # pragma: no cover

    def hold_choice(self, masks: dict[str, torch.Tensor], absolute: bool = False) -> dict[str, torch.Tensor]:
        """Move the working weights to the binary ``masks``; returns the mask to :meth:`release` to."""
        continuous = dict(self.current)
        self.write({n: masks[n].to(continuous[n].dtype) for n in self.names}, absolute)
        return continuous

    def release(self, continuous: dict[str, torch.Tensor], absolute: bool = False) -> None:
        """Back to the mask that :meth:`hold_choice` returned."""
        self.write(continuous, absolute)

    # ------------------------------------------------------------------ per-coordinate values and selection
    def draw(self, seed: int) -> dict[str, torch.Tensor]:
        """U[0, 1) at the layout's coordinates: one seeded stream over the whole universe (tensors in order),
        so a coordinate's draw does not depend on the layout."""
        raise NotImplementedError

    def draw_flat(self, seed: int) -> dict[str, torch.Tensor]:
        """U[0, 1) over the layout's own coordinates in order (the stream's i-th value to the i-th coordinate)."""
        raise NotImplementedError

    def gather(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Dense per-tensor scores at the layout's coordinates."""
        raise NotImplementedError

    def masks_of(self, region: Region) -> dict[str, torch.Tensor]:
        """A Region as boolean masks at the layout's coordinates."""
        raise NotImplementedError

    def top(self, scores: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
        """Masks of exactly the k largest ``scores`` over the layout (the shared tie rule; over every process)."""
        raise NotImplementedError

    def select(self, scores: dict[str, torch.Tensor], budget: Budget) -> dict[str, torch.Tensor]:
        """What ``budget`` selects by ``scores``: s > 0.5 (round), or exactly the top-k."""
        if budget.rounding:
            return {n: scores[n] > 0.5 for n in self.names}
        k = budget.size(self.universe)
        held = self.universe if self.size is None else self.size
        if k > held:
            fix = "the candidate set holds {}; raise candidates" if self.size is not None else "only {} can be chosen"
            raise SkillgraftError(f"budget {budget} asks for {k} coordinates but {fix.format(held)}")
        return self.top(scores, k)

    def flat(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-tensor values as one vector (tensors in order, positions ascending)."""
        return torch.cat([values[n].reshape(-1) for n in self.names])

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """:meth:`flat` undone: views of ``flat`` in each tensor's layout shape."""
        out, start = {}, 0
        for n in self.names:
            d = self.delta[n]
            out[n] = flat[start:start + d.numel()].view(d.shape)
            start += d.numel()
        return out

    # ------------------------------------------------------------------ gradients, regions, lifetime
    def watch(self) -> None:
        raise NotImplementedError

    def grads(self) -> dict[str, torch.Tensor]:
        """∂L/∂θ at the layout's coordinates since the last call (summed over replicating processes)."""
        raise NotImplementedError

    def count(self, masks: dict[str, torch.Tensor]) -> int:
        local = sum(int(m.sum()) for m in masks.values())
        return self.group.sum(local) if self.group.sharded else local

    def region(self, masks: dict[str, torch.Tensor]) -> Region:
        raise NotImplementedError

    def positions(self) -> torch.Tensor:
        """Each held coordinate's position in the universe (the :meth:`flat` order), on the CPU."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def restore(self) -> None:
        pass

    # ------------------------------------------------------------------ resuming (skillgraft.resume)
    @no_grad
    def state(self) -> dict:
        """What a resumed run needs of the layout, bit for bit: the working weights at its coordinates (written
        incrementally, they carry the rounding of every step) and the mask they hold."""
        return {"working": {n: w.detach().to("cpu", copy=True) for n, w in self._working().items()},
                "current": {n: c.detach().to("cpu", copy=True) for n, c in self.current.items()}}

    @no_grad
    def load_state(self, state: dict) -> None:
        """:meth:`state` put back."""
        self._set_working(state["working"])
        self.current = {n: state["current"][n].to(self.delta[n].device) for n in self.names}

    def _working(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _set_working(self, working: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError


class Dense(Layout):
    """Every graftable coordinate, in the working model's own tensors; θ_pre restored by the caller's snapshot."""

    def __init__(self, pre, source: FineTuned | torch.nn.Module, names: list[str], group: Group | None = None):
        source = source if isinstance(source, FineTuned) else InMemory(source)
        p_pre = dict(pre.named_parameters())
        self.names, self.group = names, group or Group()
        self.params = {n: p_pre[n] for n in names}
        self.universe = sum(p_pre[n].numel() for n in names)
        self.delta, flat, start = {}, None, 0  # Δ in one flat buffer where one dtype and device allow
        for n in names:
            d = source.rows(n).to(p_pre[n].device) - p_pre[n].detach()
            if flat is None and not self.delta:
                flat = torch.empty(self.universe, dtype=d.dtype, device=d.device)
            if flat is not None and (d.dtype, d.device) == (flat.dtype, flat.device):
                d = flat[start:start + d.numel()].view(d.shape).copy_(d)
            self.delta[n] = d
            start += d.numel()
        self._current: dict[str, torch.Tensor] | None = {n: torch.zeros(d.shape, device=d.device)
                                                         for n, d in self.delta.items()}
        self.recompute = None  # set by the engine: the held mask, recomputed from the relaxation's parameters

    @property
    def current(self) -> dict[str, torch.Tensor]:
        """The mask the weights hold (recomputed, bit for bit, after :meth:`forget`)."""
        if self._current is None:
            self._current = dict(self.recompute())
        return self._current

    @current.setter
    def current(self, value: dict[str, torch.Tensor]) -> None:
        self._current = value

    def forget(self) -> None:
        """Drop the held mask (one float per coordinate) between steps when it can be recomputed: the caller
        reads :attr:`current` (which recomputes it) before the parameters it comes from move."""
        if self.recompute is not None:
            self._current = None

    @contextmanager
    def full(self):
        """See :meth:`Layout.full`: a copy of the held tensors while θ_pre + Δ is in them (no larger than the
        relaxation's state the run allocates next, so the run's peak is unchanged)."""
        saved = {n: self.params[n].detach().clone() for n in self.names}
        try:
            with torch.no_grad():
                for n in self.names:
                    self.params[n].add_(self.delta[n])
            yield
        finally:
            with torch.no_grad():
                for n in self.names:
                    self.params[n].copy_(saved[n])
            del saved

    @no_grad
    def hold(self, n: str, target: torch.Tensor) -> None:
        change = target.to(self.delta[n].dtype) - self.current[n].to(self.delta[n].dtype)
        self.params[n].add_(change * self.delta[n])
        self.current[n] = target

    def _working(self) -> dict[str, torch.Tensor]:
        return {n: self.params[n] for n in self.names}

    def _set_working(self, working: dict[str, torch.Tensor]) -> None:
        for n in self.names:
            self.params[n].copy_(working[n].to(self.params[n].device))

    def draw(self, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        out = self.flat_views(torch.float32)  # the tensors' draws in turn, into one flat buffer
        for n, d in self.delta.items():
            out[n].copy_(torch.rand(d.shape, generator=gen))
        return out

    def flat_views(self, dtype) -> dict[str, torch.Tensor]:
        """An uninitialised flat buffer of the universe, as views in each tensor's shape (:func:`joined` of them
        gives the buffer back)."""
        device = next(iter(self.delta.values())).device
        return self.split(torch.empty(self.universe, dtype=dtype, device=device))

    CHUNK = 1 << 22  # coordinates the fused step works on at a time (16 MiB of float32 per temporary)

    def chunks(self, limit: int | None = None):
        """(names, start, stop): consecutive whole tensors of about ``limit`` coordinates at most (a larger tensor
        alone), their span in the flat order: what the fused step works on at a time, so its temporaries stay
        small whatever the model."""
        limit, names, first, start = limit or self.CHUNK, [], 0, 0
        for n in self.names:
            size = self.delta[n].numel()
            if names and start + size - first > limit:
                yield names, first, start
                names, first = [], start
            names.append(n)
            start += size
        if names:
            yield names, first, start

    def grad_of(self, names: list[str]) -> torch.Tensor:
        """∂L/∂θ of tensors ``names`` as one flat float32 vector (summed over replicating processes); their
        ``.grad`` freed."""
        out = []
        for n in names:
            p = self.params[n]
            g = self.group.sum_(p.grad) if p.grad is not None else torch.zeros_like(p)
            p.grad = None
            out.append(g.reshape(-1))
        return (torch.cat(out) if len(out) > 1 else out[0]).float()

    draw_flat = draw  # the layout's coordinates are the universe

    def gather(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: scores[n].to(self.delta[n].device) for n in self.names}

    def masks_of(self, region: Region) -> dict[str, torch.Tensor]:
        bad = [n for n in region.indices if n not in self.delta]
        if bad or any(tuple(self.delta[n].shape) != s for n, s in region.shapes.items() if n in self.delta):
            raise SkillgraftError(f"base region does not fit the graftable tensors (e.g. {bad[:2]})")
        masks = region.to_masks()
        return {n: (masks[n].to(self.delta[n].device) if n in masks
                    else torch.zeros_like(self.delta[n], dtype=torch.bool)) for n in self.names}

    def top(self, scores: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
        return top_k_masks({n: scores[n] for n in self.names}, k)

    def watch(self) -> None:
        """Gradients of the graftable tensors, kept dense in ``.grad`` until :meth:`grads`."""
        for p in self.params.values():
            p.requires_grad_(True)

    @no_grad
    def grads(self) -> dict[str, torch.Tensor]:
        out = {}
        for n, p in self.params.items():
            out[n] = self.group.sum_(p.grad if p.grad is not None else torch.zeros_like(p))
            p.grad = None
        return out

    def region(self, masks: dict[str, torch.Tensor]) -> Region:
        return Region.from_masks({n: m.cpu() for n, m in masks.items()},
                                 {n: tuple(self.delta[n].shape) for n in self.names})

    def positions(self) -> torch.Tensor:
        return torch.arange(self.universe)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(self.delta[n].shape) for n in self.names}
