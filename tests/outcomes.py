"""Per-row outcomes built by hand, for the tests of the keep bounds and of the reports that quote them."""

from __future__ import annotations

import numpy as np

from skillgraft.keep.stats.bound import Outcome


def outcome(correct, labels=None, metric="accuracy") -> Outcome:
    """An Outcome from per-row correctness (labels all 1 unless given; pred = label where correct, else its
    opposite); ``metric="f1"`` scores F1 of label 1."""
    correct = np.asarray(correct, dtype=bool)
    labels = np.ones(len(correct), dtype=int) if labels is None else np.asarray(labels)
    pred = np.where(correct, labels, 1 - labels)
    if metric == "f1":
        tp = int(((pred == 1) & (labels == 1)).sum())
        wrong = int(((pred == 1) != (labels == 1)).sum())
        score = 2 * tp / (2 * tp + wrong) if 2 * tp + wrong else 1.0
    else:
        score = float(correct.mean())
    return Outcome(score, pred, labels, metric)
