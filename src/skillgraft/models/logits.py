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

Under bf16 autocast a frozen linear head (Gemma's tied 262,144 × 640 embedding: fine-tuning freezes it, and every
weight is frozen in localization and evaluation) would be cast to bf16 on every forward — autocast caches casts of
weights that require grad only — and that cast of 168M values cost more than the head's product at a few scored
rows (≈ 0.5 s of a 2 s Gemma step on one CPU thread). :func:`head_logits` keeps the bf16 copy and casts again only
when the weight changes (its version counter, storage or device): the same bits as autocast's cast, computed once.
"""

from __future__ import annotations

import threading

from skillgraft.lazy import torch
from skillgraft.lazy import nn

# a frozen head weight → ((its version, data pointer, device), its bf16 copy); entries go with their weights
_BF16_HEADS: dict = {}  # torch.utils.weak.WeakIdKeyDictionary, made on first use (torch is imported lazily)
_INSTALLED: dict[int, int] = {}  # id(head) → how many head_logits calls (threads) run with its cached forward now
_LOCK = threading.Lock()


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
    cached = _uses_cached_bf16(head)
    if cached:
        _install(head)
    try:
        return model(**inputs).logits
    finally:
        handle.remove()
        if cached:
            _uninstall(head)


def _uses_cached_bf16(head: nn.Module) -> bool:
    """Whether autocast would cast the head's weight to bf16 on this call and not keep the cast: a plain
    ``nn.Linear`` whose fp32 weight needs no gradient, under bf16 autocast on the weight's device."""
    weight = getattr(head, "weight", None)
    if type(head) is not nn.Linear or weight is None or weight.requires_grad or weight.dtype != torch.float32:
        return False
    kind = weight.device.type
    return torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16


def _bf16_weight(weight):
    """The weight's bf16 cast, cast again only when the weight changed (version counter, storage or device)."""
    global _BF16_HEADS
    if type(_BF16_HEADS) is dict:
        from torch.utils.weak import WeakIdKeyDictionary  # noqa: PLC0415  (keyed by identity: tensors compare by value)

        _BF16_HEADS = WeakIdKeyDictionary()
    key = (weight._version, weight.data_ptr(), weight.device)
    held = _BF16_HEADS.get(weight)
    if held is None or held[0] != key:
        with torch.no_grad():
            held = (key, weight.to(torch.bfloat16))
        _BF16_HEADS[weight] = held
    return held[1]


def _install(head: nn.Module) -> None:
    """The head's forward, for the length of the call, autocast's own computation with the kept cast:
    ``linear(x.bf16, W.bf16, b.bf16)`` — an instance attribute over ``nn.Linear.forward``, shared by threads
    that run at once and removed by the last."""
    with _LOCK:
        n = _INSTALLED.get(id(head), 0)
        if n == 0:
            def forward(x, head=head):
                if not _uses_cached_bf16(head):
                    return nn.Linear.forward(head, x)
                bias = head.bias
                return torch.nn.functional.linear(x.to(torch.bfloat16), _bf16_weight(head.weight),
                                                  None if bias is None else bias.to(torch.bfloat16))

            head.forward = forward
        _INSTALLED[id(head)] = n + 1


def _uninstall(head: nn.Module) -> None:
    with _LOCK:
        n = _INSTALLED.pop(id(head)) - 1
        if n:
            _INSTALLED[id(head)] = n
        else:
            del head.forward
