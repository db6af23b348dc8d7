"""Accuracy, F1, expected calibration error and agreement, from label probabilities."""

from __future__ import annotations

from skillgraft.lazy import np


def share_of_ft(score: float, ft: float | None) -> float | None:
    """A model's score as a share of the fine-tuned model's (``score / ft``): the one derivation of "share of FT",
    called "normalized accuracy" in merge reports (graft reports' ``share_of_ft``, merge rows' ``normalized``).
    None when FT has no score, or scores 0."""
    return score / ft if ft else None


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Share of examples whose most probable label is the gold one."""
    return float((probs.argmax(-1) == labels).mean())


def f1(probs: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """Binary F1 of class ``positive``: 2·TP / (2·TP + FP + FN)."""
    pred = probs.argmax(-1)
    tp = int(((pred == positive) & (labels == positive)).sum())
    fp = int(((pred == positive) & (labels != positive)).sum())
    fn = int(((pred != positive) & (labels == positive)).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0


def ece(probs: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> float:
    """Expected calibration error (Guo et al., 2017): Σ_b |B_b|/n · |acc(B_b) − conf(B_b)|.

    Bins are ``n_bins`` equal-width intervals of the max probability, ``(lo, hi]`` (the first is ``[0, hi]``).
    """
    conf = probs.max(-1)
    correct = probs.argmax(-1) == labels
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        sel = bins == b
        if sel.any():
            total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(total)


def agreement(probs_a: np.ndarray, probs_b: np.ndarray) -> float:
    """Share of examples on which two models predict the same label."""
    return float((probs_a.argmax(-1) == probs_b.argmax(-1)).mean())


def reliability_bins(probs: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> dict[str, list[float]]:
    """Per-bin confidence, accuracy and count (for reliability diagrams)."""
    conf = probs.max(-1)
    correct = probs.argmax(-1) == labels
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1)
    out = {"lo": [], "hi": [], "confidence": [], "accuracy": [], "count": []}
    for b in range(n_bins):
        sel = bins == b
        out["lo"].append(float(edges[b]))
        out["hi"].append(float(edges[b + 1]))
        out["count"].append(int(sel.sum()))
        out["confidence"].append(float(conf[sel].mean()) if sel.any() else float("nan"))
        out["accuracy"].append(float(correct[sel].mean()) if sel.any() else float("nan"))
    return out


def task_metric(metric: str, probs: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """The task's score: accuracy, or binary F1 of the positive label (MRPC, QQP)."""
    return f1(probs, labels, positive) if metric == "f1" else accuracy(probs, labels)


def summarize(probs: np.ndarray, labels: np.ndarray, *, metric: str = "accuracy", positive: int = 1,
              reference: np.ndarray | None = None) -> dict[str, float]:
    """All metrics of one model on one split; ``reference`` (e.g. the FT model's probs) adds agreement."""
    out = {"accuracy": accuracy(probs, labels), "ece": ece(probs, labels), "n": int(len(labels)),
           "mean_confidence": float(probs.max(-1).mean())}
    if metric == "f1":
        out["f1"] = f1(probs, labels, positive)
    out["score"] = out["f1"] if metric == "f1" else out["accuracy"]
    if reference is not None:
        out["agreement"] = agreement(probs, reference)
    return out
