"""``torch.compile`` of a scorer's transformer body for one run (``--compile``, issue 75)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from skillgraft.lazy import nn


def compile_bodies(model) -> list:
    """``torch.compile`` the transformer body of each scorer in ``model`` in place (``nn.Module.compile``): the blocks
    that do the work, not the scorer around them, whose head hook (models/logits.py) and forward context would change
    the graph at every call. Shapes that vary (a batch is as wide as its longest row) are compiled dynamic after the
    second; the graphs guard on the grad mode (training and scoring are a graph each). Returns the bodies
    (:func:`uncompile` undoes it)."""
    bodies = []
    for module in model.modules():
        body = getattr(module, "model", None)
        if hasattr(module, "collate") and isinstance(body, nn.Module):
            inner = getattr(body, "model", None)  # a causal LM: its decoder stack (the LM head runs outside)
            target = inner if isinstance(inner, nn.Module) and hasattr(body, "get_output_embeddings") else body
            if all(target is not b for b in bodies):
                target.compile()
                bodies.append(target)
    return bodies


def uncompile(bodies: list) -> None:
    """The bodies run eagerly again (what follows the run: evaluation, saving, a graft's swaps)."""
    for body in bodies:
        body._compiled_call_impl = None


@contextlib.contextmanager
def compiled(model, on: bool = True) -> Iterator[list]:
    """``model``'s transformer bodies compiled inside the block (when ``on``), eager again after it."""
    bodies = compile_bodies(model) if on else []
    try:
        yield bodies
    finally:
        uncompile(bodies)
