"""How the engine relaxes the binary region m ∈ {0,1}^C into something a gradient can move (paper Eq. 3–4 and kin).

Each relaxation keeps its parameters z on the layout's coordinates, gives the mask the forward pass uses after
t updates (:meth:`mask`), turns ∂L/∂θ into ∂L/∂z (:meth:`grad`; ∂L/∂m = ∂L/∂θ ⊙ Δ since θ = θ_pre + m ⊙ Δ), and
scores the coordinates a budget's region is the top-k of (:meth:`scores`):

* :class:`Sigmoid` (paper Eq. 3): γ = γ_base ⊙ (1 − σ(S − b)) + (1 − γ_base) ⊙ σ(S − b), S₀ ~ U[0, 1) (one stream
  over the universe, or over C), loss at the continuous γ, ∂L/∂S = (∂L/∂θ ⊙ Δ + λ) ⊙ (1 − 2γ_base) ⊙ σ'(S − b); regions:
  γ > 0.5 (Eq. 4, ``round``) or the exact top-k of γ. One trajectory for every budget.
* :class:`StraightThrough`: the binary top-k(z) forward, ∂L/∂z := ∂L/∂m backward; z₀ = 1 on the top-k of the
  base score (+ a tie-break by its rank). With ``start_k`` the forward size is pruned geometrically from
  start_k to k over ``anneal_steps`` (the prune schedule, Sanh et al. 2020), regions scored at size k only.
* :class:`HardConcrete` (L0, Louizos et al. 2018): stochastic gates z = clamp(σ((log u − log(1−u) + log α)/β)
  (ζ − γ) + γ, 0, 1), the penalty ρ((E‖z‖₀ − k)/k)² on top of the loss; regions: the exact top-k of log α.

Straight-through and hard-concrete run one trajectory per budget and write masks from the saved θ_pre
(``absolute``): they need the candidate layout in one process (their start ranks C by the base score).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from skillgraft.lazy import no_grad, torch

from skillgraft.graft.ranking import Ranking
from skillgraft.graft.localizers.machinery.layouts import Dense, Layout, joined
from skillgraft.graft.selection import top_k_flat, top_k_flat_on_device

# Hard-concrete constants (Louizos et al., 2018): temperature β and the stretch interval (γ, ζ).
HC_BETA, HC_LOW, HC_HIGH = 2 / 3, -0.1, 1.1


class Relaxation:
    """The strategy interface (see the module doc)."""

    name = ""
    per_budget = False   # one trajectory per budget (else one for all budgets)
    absolute = False     # masks written from the saved θ_pre (else incrementally, as the paper's localizer)
    rounds = False       # selects γ > 0.5 ('round' budgets)
    sharded = True       # runs on the sharded layout
    first = 0            # the first step whose regions are scored
    recomputable = False  # mask(t) is a pure function of the parameters (a layout may drop it between steps)

    def start(self, layout: Layout, score: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None,
              k: int | None, seed: int) -> list[torch.Tensor]:
        """Initial parameters (returned for the optimizer) from the base score and γ_base; k: the budget's size."""
        raise NotImplementedError

    def mask(self, t: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def grad(self, g: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError

    def scores(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def fused(self, layout: Layout, optimizer, finite) -> bool:
        """One whole update in place where this relaxation can (∂L/∂z, the optimizer's step on z, the new mask
        written), bit for bit the separate calls; False: the engine makes them."""
        return False

    def row(self) -> dict:
        """Extra history fields at a scored step."""
        return {}

    def state(self) -> dict:
        """What resuming needs beyond the optimizer's parameters (skillgraft.resume)."""
        return {}

    def load_state(self, state: dict, t: int) -> None:
        """:meth:`state` put back after step ``t`` (the parameters already restored)."""


class Lazy(Mapping):
    """A mapping of ``names`` to ``make(name)``, each value made when read (not kept)."""

    def __init__(self, names: list[str], make):
        self.names, self.make = names, make

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        return self.make(name)

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _ranks(score: torch.Tensor) -> torch.Tensor:
    """Each coordinate's rank by ``score`` (0 = the highest; ties by position), as floats."""
    out = torch.empty(score.numel(), device=score.device)
    out[torch.argsort(score, descending=True, stable=True)] = torch.arange(
        score.numel(), dtype=torch.float32, device=score.device)
    return out


class Sigmoid(Relaxation):
    """Paper Eq. 3: γ from S through a sigmoid, flipped on γ_base (per tensor, the reference arithmetic)."""

    name, rounds, recomputable = "sigmoid", True, True

    def __init__(self, bias: float = 10.0, l1: float = 0.0, draw: str = "universe", select: str = "gamma",
                 init: str = "uniform"):
        self.bias, self.l1, self.draw, self.select, self.init = bias, l1, draw, select, init
        self._chunks = None  # the fused step's plan (:meth:`_plan`)
        self.rounds = select == "gamma"  # γ > 0.5 is read off γ itself

    def _draw(self, seed: int) -> dict[str, torch.Tensor]:
        """S₀ ~ U[0, 1): the universe's stream at the layout's coordinates (``learned``: the same S₀ whatever C),
        or one stream over C itself (``draw="candidates"``: the relaxed localizers'). ``init="movement"``:
        S₀ = |Δ| ÷ max |Δ| ∈ [0, 1] instead, so that at step 0 the top-k of γ at *every* size is top-|Δ| of that
        size (γ_base is the top of |Δ|; outside it, γ = σ(S₀ − b) grows with |Δ|), not γ_base plus a random draw."""
        if self.init == "movement":
            layout = self.layout
            top = max(layout.group.gather(max((float(layout.delta[n].abs().max()) for n in layout.names
                                               if layout.delta[n].numel()), default=0.0)))
            return {n: layout.delta[n].abs().float().div_(top or 1.0) for n in layout.names}
        return self.layout.draw(seed) if self.draw == "universe" else self.layout.draw_flat(seed)

    def start(self, layout, score, base, k, seed):
        self.layout, self.base = layout, base
        self.S = self._draw(seed)
        self._chunks = self._plan(layout)
        return [self.S[n] for n in layout.names]

    def gamma(self, n: str) -> torch.Tensor:
        """γ of tensor n: σ(S − bias), flipped to 1 − σ on γ_base."""
        s = torch.sigmoid(self.S[n] - self.bias)
        return torch.where(self.base[n], 1 - s, s)

    def mask(self, t):
        return Lazy(self.layout.names, self.gamma)  # each γ made when read: a write holds one tensor's at a time

    def scores(self):
        """γ itself (``learned``: its pinned regions), or its logit ±(S − b) (``select="logit"``, the relaxed
        localizers: the top-k of γ ≈ 1 on γ_base ties in float32 by position, its logit does not)."""
        if self.select == "gamma":
            return self.mask(0)
        return {n: torch.where(self.base[n], self.bias - self.S[n], self.S[n] - self.bias) for n in self.layout.names}

    @no_grad
    def grad(self, g):
        out = []
        for n in self.layout.names:  # each ∂L/∂θ freed once used (``g`` is the layout's, made for this call)
            s = torch.sigmoid(self.S[n] - self.bias)
            sign = 1 - 2 * self.base[n].to(s.dtype)
            out.append((g.pop(n).to(s.dtype) * self.layout.delta[n].to(s.dtype) + self.l1) * sign * s * (1 - s))
        return out

    @no_grad
    def fused(self, layout, optimizer, finite):
        """The dense layout and plain SGD (:meth:`_plan`): per chunk of whole tensors σ(S − b) once before S moves
        (for ∂L/∂S and the held γ) and once after (the new γ), each op over the chunk's flat span, γ_base's flips
        (1 − σ, the sign of ∂L/∂S) on its few coordinates by index — the arithmetic of :meth:`grad`,
        :meth:`Optimizer.step` and :meth:`Layout.hold` (only the ±1 factor regrouped, which is exact) in a tenth
        of their ops on a small model and fewer passes over a large one, with no γ kept between steps."""
        if self._chunks is None or optimizer.kind != "sgd":
            return False
        S, delta = self._chunks[0][0], self._chunks[0][1]
        for _, _, names, a, b, sizes, flips, weights in self._chunks:
            g = layout.grad_of(names).mul_(delta[a:b])
            if self.l1:
                g.add_(self.l1)
            s = self._sigmoid(S[a:b], sizes)
            rest = 1 - s
            g = g.mul_(s).mul_(rest)
            held = s.index_copy_(0, flips, rest.index_select(0, flips))  # γ before S moves (σ done with)
            del s, rest
            g.index_copy_(0, flips, g.index_select(0, flips).neg_())  # × (1 − 2γ_base): a sign flip is exact
            optimizer.step([g], finite, params=[S[a:b]])
            del g
            now = self._sigmoid(S[a:b], sizes)
            now.index_copy_(0, flips, 1 - now.index_select(0, flips))
            if delta.dtype != now.dtype:
                now, held = now.to(delta.dtype), held.to(delta.dtype)
            change = now.sub_(held).mul_(delta[a:b])
            del held
            torch._foreach_add_(weights, change.split(sizes))
        return True

    def _sigmoid(self, S: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """σ(S − b) over a chunk's flat span, σ per tensor as :meth:`gamma` computes it (σ's vectorised and scalar
        tails round differently: one op over the span would not give the per-tensor values)."""
        s = S - self.bias
        torch._foreach_sigmoid_(s.split(sizes))
        return s

    def _plan(self, layout) -> list | None:
        """The fused step's chunks (:meth:`Dense.chunks`) with γ_base's coordinates in each (read here, before any
        step), when S, γ_base and Δ are flat over the dense layout; else None."""
        if not isinstance(layout, Dense) or not layout.names:
            return None
        self.S, self.base = _flat(layout, self.S, torch.float32), _flat(layout, self.base, torch.bool)
        S, base, delta = (joined(v, layout.names) for v in (self.S, self.base, layout.delta))
        if delta is None:
            return None
        out = []
        with torch.no_grad():  # the working weights flat, to move in place
            for names, a, b in layout.chunks():
                out.append((S, delta, names, a, b, [layout.delta[n].numel() for n in names],
                            base[a:b].nonzero().view(-1), [layout.params[n].view(-1) for n in names]))
        return out

    def ranking(self, seed: int) -> Ranking:
        """The learned order of the held coordinates (:class:`~skillgraft.graft.ranking.Ranking` ``first``/``then``):

        * first the learned region, γ > 0.5 (the rounded γ), by the logit of γ with every coordinate's S started
          from the same ½ (S − S₀ + ½: the learned drift orders them, not the initial draw's noise), ±(bias − S̃),
          + on γ_base;
        * then every other coordinate by |Δ| (γ_base's own score): outside the region the drift is a small
          first-order signal the loss never tested in a graft, and ordering the rest by it loses to a random
          order at 1e-1 of MiniLM's body (bench/RESULTS.md, issue 25).
        """
        layout, start = self.layout, self._draw(seed)
        keys, region, moved = [], [], []
        for n in layout.names:
            drift = self.S[n].double() - start[n].double() + 0.5 - self.bias
            keys.append(torch.where(self.base[n], -drift, drift).cpu().reshape(-1))
            region.append((self.gamma(n) > 0.5).cpu().reshape(-1))
            moved.append(layout.delta[n].abs().double().cpu().reshape(-1))
        return Ranking.from_keys(layout.shapes, layout.positions(), torch.cat(keys), first=torch.cat(region),
                                 then=torch.cat(moved))


def _flat(layout, values: dict[str, torch.Tensor], dtype) -> dict[str, torch.Tensor]:
    """``values`` as views of one flat buffer (as they are when they already are)."""
    if joined(values, layout.names) is not None:
        return values
    out = layout.flat_views(dtype)
    for n in layout.names:
        out[n].copy_(values[n])
    return out


class StraightThrough(Relaxation):
    """The binary top-k graft forward, ∂L/∂m backward; optionally pruned from start_k to k first."""

    name, per_budget, absolute, sharded = "straight-through", True, True, False

    def __init__(self, start_k: int | None = None, anneal_steps: int = 0):
        self.start_k, self.anneal_steps = start_k, anneal_steps
        self.first = anneal_steps if start_k is not None else 0

    def start(self, layout, score, base, k, seed):
        self.layout, self.k = layout, k
        flat = layout.flat(score).float()
        ranks = _ranks(flat)
        if self.start_k is None:
            self.z = top_k_flat(flat, k).float() + 1e-3 * (1 - ranks / flat.numel())
        else:  # the base score's order, on the scale of one nsgd step per coordinate
            self.z = 1 - ranks / flat.numel()
        self.z.requires_grad_(True)
        self.delta = layout.flat({n: d.float() for n, d in layout.delta.items()})
        return [self.z]

    def size(self, t: int) -> int:
        if t >= self.first:
            return self.k
        return round(math.exp(math.log(self.start_k) * (1 - t / self.first) + math.log(self.k) * t / self.first))

    def mask(self, t):
        return self.layout.split(top_k_flat_on_device(self.z.detach(), self.size(t)).float())  # per step: no read

    def scores(self):
        return self.layout.split(self.z.detach())

    def grad(self, g):
        return [self.layout.flat({n: v.float() for n, v in g.items()}) * self.delta]


class HardConcrete(Relaxation):
    """Stochastic L0 gates, E‖z‖₀ held at the budget by a penalty; regions: the top-k of log α."""

    name, per_budget, absolute, sharded = "hard-concrete", True, True, False

    def __init__(self, penalty: float = 1.0):
        self.penalty = penalty
        self.shift = HC_BETA * math.log(-HC_LOW / HC_HIGH)  # P(z > 0) = σ(log α − shift)

    def start(self, layout, score, base, k, seed):
        self.layout, self.k = layout, k
        flat = layout.flat(score).float()
        n, device = flat.numel(), flat.device
        p_off = min(0.5, 0.1 * k / max(1, n - k))
        on, off = math.log(0.95 / 0.05) - self.shift, math.log(p_off / (1 - p_off)) + self.shift
        # P(z = 1) = σ(log α + shift): 0.95 on the base region; P(z > 0) = p_off elsewhere (k/10 open gates)
        log_alpha = torch.where(top_k_flat(flat, k), torch.full((n,), on, device=device),
                                torch.full((n,), off, device=device))
        self.log_alpha = (log_alpha + 1e-3 * (1 - _ranks(flat) / n)).requires_grad_(True)  # ties by the base score
        self.gen = torch.Generator().manual_seed(seed)  # drawn on the CPU, then moved: one seed, one region anywhere
        self.delta = layout.flat({m: d.float() for m, d in layout.delta.items()})
        return [self.log_alpha]

    def mask(self, t):
        n = self.log_alpha.numel()
        self.drawn_from = self.gen.get_state()  # resuming redraws the same u (z's graph is rebuilt, not saved)
        u = torch.rand(n, generator=self.gen).to(self.log_alpha.device).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.log_alpha) / HC_BETA)
        self.z = (s * (HC_HIGH - HC_LOW) + HC_LOW).clamp(0, 1)
        return self.layout.split(self.z.detach())

    def scores(self):
        return self.layout.split(self.log_alpha.detach())

    def grad(self, g):
        dz = self.layout.flat({n: v.float() for n, v in g.items()}) * self.delta  # ∂L/∂z
        expected = torch.sigmoid(self.log_alpha - self.shift).sum()
        penalty = self.penalty * ((expected - self.k) / self.k) ** 2
        return list(torch.autograd.grad([self.z, penalty], [self.log_alpha], [dz, torch.ones_like(penalty)]))

    def row(self):
        return {"expected_size": float(torch.sigmoid(self.log_alpha.detach() - self.shift).sum())}

    def state(self):
        return {"gen": self.drawn_from}

    def load_state(self, state, t):
        self.gen.set_state(state["gen"])
        self.mask(t)  # the gates of step t again, from the same noise: z and its graph, the generator moved on
