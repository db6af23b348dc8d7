"""Activation checkpointing for a localization run, on a model kept in eval mode, undone afterwards.

Each transformer block (a Hugging Face ``GradientCheckpointingLayer``) keeps only its input in the forward pass and
recomputes its activations in the backward pass: activation memory falls from O(layers × block) to O(layers × hidden
+ one block), for about one more forward pass of compute. Results are unchanged (the recomputation is the same
computation, with the attention kernels of its forward pass). Hugging Face checkpoints only modules in training
mode, so the blocks themselves are flagged as training while every submodule (dropout included) stays in eval.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError

_ABSENT = object()


@contextlib.contextmanager
def activation_checkpointing(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Checkpoint every transformer block of ``model`` for the duration (a no-op when not ``enabled``)."""
    if not enabled:
        yield
        return
    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415
    from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: PLC0415

    from skillgraft.models.placement import recompute_contexts  # noqa: PLC0415

    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not blocks:
        raise SkillgraftError(f"gradient_checkpointing: {type(getattr(model, 'model', model)).__name__} has no "
                              "checkpointable transformer blocks; turn gradient_checkpointing off")
    saved = [(m, m.__dict__.get("gradient_checkpointing", _ABSENT), m.__dict__.get("_gradient_checkpointing_func",
              _ABSENT), m.training) for m in blocks]
    try:
        for m in blocks:
            m.gradient_checkpointing = True
            m._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False,
                                                               context_fn=recompute_contexts)
            m.training = True  # the block only: its submodules keep their own (eval) mode
        yield
    finally:
        for m, flag, func, training in saved:
            for attr, value in (("gradient_checkpointing", flag), ("_gradient_checkpointing_func", func)):
                if value is _ABSENT:
                    m.__dict__.pop(attr, None)
                else:
                    setattr(m, attr, value)
            m.training = training
