"""Language-model logits only where a loss or a score reads them.

A causal LM's forward applies its output head (``lm_head``: hidden size × vocabulary) at every position, so a
batch of B sequences of S tokens builds a ``[B, S, V]`` tensor; at V = 262,144 (Gemma 3) that is most of the
step's time and memory, while a label-word score reads one position per sequence and a completion loss only
the completion's. :func:`head_logits` runs the model with a pre-hook on its output embedding module that keeps
the hidden states at the scored positions only, so the head (and whatever the model applies after it, e.g.
Gemma's final logit soft-capping) runs on ``[N, hidden]`` and returns ``[N, V]``:

    logits[i] = head(h[rows[i], cols[i]]),   i = 1 … N

The same forward is used for training, localization, Fisher and evaluation; nothing else changes. Models
without an output embedding module (or whose head is not a module called on the hidden states) fall back to
the full forward, indexed afterwards.
"""

from __future__ import annotations

from skillgraft.lazy import torch
from skillgraft.lazy import nn


def output_head(model: nn.Module) -> nn.Module | None:
    """The module that maps hidden states to vocabulary logits (``lm_head``, an MLM decoder), or None."""
    getter = getattr(model, "get_output_embeddings", None)
    try:
        head = getter() if callable(getter) else None
    except (AttributeError, NotImplementedError):
        return None
    return head if isinstance(head, nn.Module) else None


def head_logits(model: nn.Module, inputs: dict[str, torch.Tensor], rows: torch.Tensor,
                cols: torch.Tensor) -> torch.Tensor:
    """``model(**inputs).logits[rows, cols]`` — ``[*rows.shape, vocab]`` — computing the head only there.

    ``rows`` and ``cols`` index the batch and sequence dimensions and broadcast together (e.g. ``[N]`` and
    ``[N]``, or ``[B, 1]`` and ``[B, L]``).
    """
    head = output_head(model)
    if head is None:
        return model(**inputs).logits[rows, cols]

    def gather(module, args):
        return (args[0][rows, cols], *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        return model(**inputs).logits
    finally:
        handle.remove()
