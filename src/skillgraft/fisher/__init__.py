"""Diagonal Fisher information, per-layer FIM scores and surgical fine-tuning selection.

FISH regions (top Fisher of θ_pre) are the ``fish`` localizer: ``skillgraft.graft.get_localizer("fish")``."""

from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal, fisher_loop, fisher_traces
from skillgraft.fisher.scores import LayerScores, aggregate_layers, block_names, fim_layer_scores, rank_correlation
from skillgraft.fisher.surgical import ranking_stability, resolve_layer_spec

__all__ = ["FisherConfig", "LayerScores", "aggregate_layers", "block_names", "fim_layer_scores",
           "fisher_diagonal", "fisher_loop", "fisher_traces",
           "rank_correlation", "ranking_stability", "resolve_layer_spec"]
