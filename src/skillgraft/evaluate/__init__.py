"""Metrics (accuracy, F1, ECE, agreement), prediction and plots."""

from skillgraft.lazy import lazy_exports

# each name’s module is imported on first use (``import skillgraft.evaluate.x`` runs no sibling)
_EXPORTS = {
    "accuracy": "skillgraft.evaluate.metrics",
    "agreement": "skillgraft.evaluate.metrics",
    "ece": "skillgraft.evaluate.metrics",
    "f1": "skillgraft.evaluate.metrics",
    "reliability_bins": "skillgraft.evaluate.metrics",
    "summarize": "skillgraft.evaluate.metrics",
    "evaluate": "skillgraft.evaluate.predict",
    "labels_of": "skillgraft.evaluate.predict",
    "predict_probs": "skillgraft.evaluate.predict",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["accuracy", "agreement", "ece", "evaluate", "f1", "labels_of", "predict_probs", "reliability_bins",
           "summarize"]
