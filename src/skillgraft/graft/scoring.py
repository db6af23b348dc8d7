"""Scoring a graft: apply it to the pre-trained scorer, evaluate, revert (the base is left untouched)."""

from __future__ import annotations

import numpy as np

from skillgraft.data.loading import Example
from skillgraft.evaluate.predict import evaluate
from skillgraft.graft.graft import Graft


def evaluate_graft(pre, graft: Graft, examples: list[Example], *, reference: np.ndarray | None = None,
                   outside: str = "pre", batch_size: int = 64, progress: bool | str = False,
                   force: bool = False) -> tuple[dict, np.ndarray]:
    """Metrics and probabilities of θ_pre + γ⊙Δ (or γ⊙θ_ft with ``outside='zero'``) on ``examples``."""
    with graft.applied(pre, outside=outside, force=force):
        return evaluate(pre, examples, batch_size=batch_size, reference=reference, progress=progress)
