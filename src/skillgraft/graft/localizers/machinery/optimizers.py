"""The engine's optimizer of a relaxation's parameters z (one strategy of :mod:`.engine`, beside the relaxation and
the layout): sgd (the paper's), adam, nsgd."""

from __future__ import annotations

from skillgraft.lazy import no_grad, torch

from skillgraft.graft.localizers.machinery.sharded import Group


class Optimizer:
    """The update of a relaxation's parameters z: sgd z ← z − lr·g (the paper's), adam (``torch.optim.Adam``), or
    nsgd: sgd on g / RMS(g) over every coordinate (one scale per step, magnitudes kept)."""

    def __init__(self, kind: str, lr: float, params: list[torch.Tensor], group: Group):
        self.kind, self.lr, self.params, self.group = kind, lr, params, group
        self.adam = torch.optim.Adam(params, lr=lr) if kind == "adam" else None

    @no_grad
    def step(self, grads: list[torch.Tensor], finite: torch.Tensor | None = None, params=None) -> None:
        """One update; ``finite`` (a 0-d bool on the device): where false, the gradients count as 0 (no read).
        ``params``: the tensors ``grads`` are for, views of the parameters (sgd only: a fused step's chunk)."""
        if finite is not None:  # in place in the caller's list: each gradient freed once replaced
            for i, g in enumerate(grads):
                grads[i] = torch.where(finite, g, 0.0)
        if self.kind == "nsgd":
            scale = self._rms(grads).clamp_min(1e-30)
            for i, g in enumerate(grads):
                grads[i] = g / scale
        if self.adam is not None:
            for p, g in zip(self.params, grads):
                p.grad = g
            self.adam.step()
            for p in self.params:
                p.grad = None
        else:
            for p, g in zip(self.params if params is None else params, grads):
                p.sub_(self.lr * g)

    def _rms(self, grads: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([g.reshape(-1) for g in grads])
        if not (self.group.sharded and self.group.world > 1):
            return flat.pow(2).mean().sqrt()
        total = self.group.sum_(torch.stack([flat.double().pow(2).sum(), torch.tensor(flat.numel(), dtype=torch.float64,
                                                                                     device=flat.device)]))
        return (total[0] / total[1].clamp(min=1)).sqrt().to(flat.dtype)
