"""Metrics (accuracy, F1, ECE, agreement), prediction and plots."""

from skillgraft.evaluate.metrics import accuracy, agreement, ece, f1, reliability_bins, summarize
from skillgraft.evaluate.predict import evaluate, labels_of, predict_probs

__all__ = ["accuracy", "agreement", "ece", "evaluate", "f1", "labels_of", "predict_probs", "reliability_bins",
           "summarize"]
