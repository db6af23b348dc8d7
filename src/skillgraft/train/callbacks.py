"""Callbacks of the training core: best-dev checkpoint, region masks, Auto-RGN, weight snapshots.

A callback is any object with some of these methods (all optional; :class:`Callback` has them as
no-ops). The core calls them in this order:

* ``on_setup(state)`` — after the config's freezing rules, before the trainable set is fixed: may change
  ``requires_grad``;
* ``on_train_start(state)`` — ``state.params`` and ``state.optimizer`` exist, nothing has moved yet;
* per step: ``on_after_backward(step)`` (before clipping), ``on_before_optimizer_step(step, optimizer)``
  (after clipping), ``on_after_optimizer_step(step)``, and ``on_evaluate(step, metrics)`` when the dev
  sets were scored (``metrics["dev"]``: the mean score over tasks); ``step`` counts updates done so far;
* ``on_train_end(state)`` — after the final dev evaluation.

Nothing here touches process-global state (no torch optimizer hooks), so two runs never interfere.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from skillgraft.lazy import no_grad, torch

from skillgraft.errors import SkillgraftError

if TYPE_CHECKING:
    from skillgraft.train.core import TrainState


class Callback:
    """No-op base; override the hooks you need."""

    def on_setup(self, state: TrainState) -> None: ...

    def on_train_start(self, state: TrainState) -> None: ...

    def on_after_backward(self, step: int) -> None: ...

    def on_before_optimizer_step(self, step: int, optimizer) -> None: ...

    def on_after_optimizer_step(self, step: int) -> None: ...

    def on_evaluate(self, step: int, metrics: dict) -> None: ...

    def on_train_end(self, state: TrainState) -> None: ...


class BestDev(Callback):
    """Keep the trainable weights at the best dev score (the first step reaching the maximum; for several
    tasks the mean score) and restore them at the end; ``state.best_step``/``best_dev`` report it."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.score: float | None = None
        self.weights: list[torch.Tensor] | None = None

    def on_train_start(self, state: TrainState) -> None:
        self.params = state.params

    def on_evaluate(self, step: int, metrics: dict) -> None:
        if self.score is None or metrics["dev"] > self.score:
            self.step, self.score = step, metrics["dev"]
            self.weights = [p.detach().clone() for p in self.params]

    @no_grad
    def on_train_end(self, state: TrainState) -> None:
        if self.weights is None:
            return
        for p, v in zip(self.params, self.weights):
            p.copy_(v)
        state.best_step, state.best_dev = self.step, self.score

    def state(self) -> dict:
        """What resuming needs (skillgraft.resume): the best step, its score and weights."""
        return {"step": self.step, "score": self.score,
                "weights": None if self.weights is None else [w.detach().to("cpu", copy=True) for w in self.weights]}

    def load_state(self, state: dict) -> None:
        self.step, self.score = state["step"], state["score"]
        self.weights = None if state["weights"] is None else [
            w.to(p.device, p.dtype) for w, p in zip(state["weights"], self.params)]


class RegionMask(Callback):
    """Only the allowed coordinates of ``module`` (default: the trained model) move.

    ``indices``: ``{parameter name: flat int64 positions}`` that may move (e.g. ``region.indices``);
    ``whole``: names whose every coordinate may move (a new head, adapter tensors). The mask decides what
    trains in ``module`` — the config's freezing rules do not apply there: tensors without allowed
    coordinates are frozen, the others train; on a partly allowed tensor the gradient is zeroed outside
    the mask (before clipping) and after every optimizer step the coordinates outside are written back
    from a copy, so weight decay, momentum or an L1 term can never move them: they stay bit-exact.
    ``shapes`` (optional, ``{name: shape}``) is checked against the model.
    """

    def __init__(self, indices: Mapping[str, torch.Tensor], whole: Iterable[str] = (), *, module=None,
                 shapes: Mapping[str, tuple[int, ...]] | None = None):
        self.indices = {n: torch.as_tensor(i, dtype=torch.long).reshape(-1) for n, i in indices.items()}
        self.whole = set(whole)
        self.module = module
        self.shapes = shapes
        self.masks: dict[str, torch.Tensor] = {}
        self.trained: dict[str, int] = {}  # name → coordinates that train (after the run has started)

    def on_setup(self, state: TrainState) -> None:
        params = dict((self.module if self.module is not None else state.model).named_parameters())
        unknown = sorted((set(self.indices) | self.whole) - set(params))
        if unknown:
            raise SkillgraftError(f"region mask: the model has no parameters {unknown[:5]}")
        for name, p in params.items():
            idx = self.indices.get(name)
            if name in self.whole:
                p.requires_grad_(True)
            elif idx is None or idx.numel() == 0:
                p.requires_grad_(False)
            else:
                if self.shapes is not None and name in self.shapes and tuple(self.shapes[name]) != tuple(p.shape):
                    raise SkillgraftError(f"region mask: {name!r} has shape {tuple(self.shapes[name])}, "
                                          f"the model has {tuple(p.shape)}")
                if int(idx.min()) < 0 or int(idx.max()) >= p.numel():
                    raise SkillgraftError(f"region mask: positions of {name!r} outside 0..{p.numel() - 1}")
                mask = torch.zeros(p.numel(), dtype=torch.bool)
                mask[idx] = True
                self.masks[name] = mask.view(p.shape).to(p.device)
                p.requires_grad_(True)
        self._params = params

    def on_train_start(self, state: TrainState) -> None:
        live = {id(p) for p in state.params}
        self._masked = [(self._params[n], m, self._params[n].detach().clone()) for n, m in self.masks.items()
                        if id(self._params[n]) in live]
        self.trained = {n: (int(self.masks[n].sum()) if n in self.masks else p.numel())
                        for n, p in self._params.items() if id(p) in live}
        state.trainable_parameters -= sum(p.numel() - int(m.sum()) for p, m, _ in self._masked)

    @no_grad
    def on_after_backward(self, step: int) -> None:
        present = [(p.grad, mask) for p, mask, _ in self._masked if p.grad is not None]
        if present:
            torch._foreach_mul_([g for g, _ in present], [m for _, m in present])

    @no_grad
    def on_after_optimizer_step(self, step: int) -> None:
        for p, mask, saved in self._masked:
            p.copy_(torch.where(mask, p, saved))

    def on_train_end(self, state: TrainState) -> None:
        self.on_after_optimizer_step(state.steps)


class AutoRGN(Callback):
    """Auto-RGN (Lee et al., ICLR 2023): per-tensor lr = base lr · RGN_t / max_t RGN_t, with the relative
    gradient norm RGN_t = ‖∇_t L‖ / ‖θ_t‖ of the step (so the multiplier is in (0, 1]).

    At its first step it splits the optimizer's parameter groups into one group per tensor (optimizer
    state is keyed by parameter, so nothing is lost). Tensors with ‖θ‖ = 0 (a zero-initialised bias)
    have no defined RGN: they keep the base learning rate and do not enter the maximum. Every
    ``record_every`` steps the multipliers go to ``history`` (keyed by parameter name).
    """

    def __init__(self, record_every: int = 0, names: dict[int, str] | None = None):
        self.record_every = record_every
        self.names = names or {}
        self.base_lr: list[float] | None = None
        self.history: list[dict] = []

    def on_train_start(self, state: TrainState) -> None:
        if not self.names:
            self.names = {id(p): n for n, p in state.model.named_parameters()}

    def on_before_optimizer_step(self, step: int, optimizer) -> None:
        groups = optimizer.param_groups
        if self.base_lr is None:
            split = [{**g, "params": [p]} for g in groups for p in g["params"]]
            groups[:] = split
            self.base_lr = [g["lr"] for g in groups]
        mult = self._multipliers([g["params"][0] for g in groups])
        inner = getattr(optimizer, "optimizer", optimizer)
        on_device = bool(inner.defaults.get("fused"))  # a fused step takes its lr as a tensor: no read
        lrs = torch.tensor(self.base_lr, dtype=torch.float64, device=mult.device) * mult
        values = lrs.unbind() if on_device else lrs.tolist()
        for g, lr in zip(groups, values):
            g["lr"] = lr
        if self.record_every and step % self.record_every == 0:  # a read, at the record points only
            self.history.append({"step": step, "multipliers": {self.names.get(id(g["params"][0]), str(i)): m
                                                               for i, (g, m) in enumerate(zip(groups, mult.tolist()))}})

    @staticmethod
    @no_grad
    def _multipliers(params) -> torch.Tensor:
        """RGN_t / max RGN per tensor (1 where ‖θ_t‖ = 0), float64 on the device: two vectorised norms, no read
        (the same numbers the per-tensor host arithmetic gave)."""
        weights = torch.stack(torch._foreach_norm([p.detach().float() for p in params])).double()
        grads = torch.stack(torch._foreach_norm([(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                                                 .float() for p in params])).double()
        defined = weights > 0
        rgn = torch.where(defined, grads / torch.where(defined, weights, 1.0), 0.0)
        top = torch.where(defined, rgn, -1.0).max()
        top = torch.where(top > 0, top, 1.0)
        return torch.where(defined, rgn / top, 1.0)


class Snapshots(Callback):
    """CPU copies of ``scorer``'s weights after N updates, for N in ``steps`` (N < the run's steps)."""

    def __init__(self, scorer, steps: Iterable[int]):
        self.scorer = scorer
        self.steps = {int(s) for s in steps}
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def on_before_optimizer_step(self, step: int, optimizer) -> None:
        if step in self.steps:
            self.states[step] = {n: p.detach().to("cpu", copy=True) for n, p in self.scorer.named_parameters()}

    def scorer_at(self, step: int):
        """A copy of the scorer holding the weights after ``step`` updates."""
        if step not in self.states:
            raise SkillgraftError(f"no snapshot at step {step}; have {sorted(self.states)}")
        out = copy.deepcopy(self.scorer)
        with torch.no_grad():
            for n, p in out.named_parameters():
                p.copy_(self.states[step][n])
        out.eval()
        return out
