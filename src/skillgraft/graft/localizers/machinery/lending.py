"""Borrowing θ_pre for a computation and giving it back bit-exactly, whatever happens (errors, Ctrl-C).

Localizers work *in* the pre-trained scorer (no dense copy of the model): the learned localizer moves
its graftable tensors to θ_pre + γ⊙Δ, and both it and FISH lend it the fine-tuned task head. Everything
they touch is put back in a ``finally``: tensor values (from offloaded copies), ``requires_grad`` flags,
``.grad`` and every module's train/eval mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from skillgraft.lazy import torch

from skillgraft.models.anatomy import carried_names


@contextlib.contextmanager
def preserved(model: torch.nn.Module, names: Iterable[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Restore ``model`` on exit: the values of tensors ``names``, every flag, grad and module mode.

    Yields the offloaded (CPU) copies of ``names``, which callers may read but must not modify.
    """
    params = dict(model.named_parameters())
    saved = {n: params[n].detach().to("cpu", copy=True) for n in names}
    flags = {n: p.requires_grad for n, p in params.items()}
    grads = {n: p.grad for n, p in params.items()}
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield saved
    finally:
        with torch.no_grad():
            for n, value in saved.items():
                params[n].copy_(value.to(params[n].device))
        for n, p in params.items():
            grad = grads[n]
            p.grad = grad.to(p.device) if grad is not None and grad.device != p.device else grad  # model moved
            p.requires_grad_(flags[n])
        for m, training in modes:  # each module exactly as it was (not model.train(), which recurses)
            m.training = training


@contextlib.contextmanager
def lent_head(pre: torch.nn.Module, ft: torch.nn.Module | None) -> Iterator[torch.nn.Module]:
    """``pre`` wearing ``ft``'s new task head (head mode: θ_pre's own head is random) for the duration."""
    names = carried_names(pre) if ft is not None else []
    with preserved(pre, names):
        source, params = dict(ft.named_parameters()) if names else {}, dict(pre.named_parameters())
        with torch.no_grad():
            for n in names:
                params[n].copy_(source[n])
        yield pre
