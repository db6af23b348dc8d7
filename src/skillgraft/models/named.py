"""A plain transformers model seen as skillgraft's :class:`~skillgraft.models.scorer.Scorer` names it.

A Scorer's parameters read ``model.<HF name>``; a graft, an export and the fingerprint use those names.
:class:`PlainModel` wraps a model a user loaded with transformers so its parameters read the same way (the
model itself is shared, not copied); ``carried``: the Scorer-named tensors of a task head the base lacks (left
out of the fingerprint, as a Scorer leaves them out).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class PlainModel(torch.nn.Module):
    """``model`` with Scorer parameter names (``model.*``)."""

    def __init__(self, model: torch.nn.Module, carried: Iterable[str] = ()):
        super().__init__()
        self.model = model
        self.carried = set(carried)
