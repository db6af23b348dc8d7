"""Diagonal Fisher information, per-layer FIM scores, surgical fine-tuning selection and FISH regions."""

from skillgraft.fisher.fish import fish_iou, fish_region, fish_scores
from skillgraft.fisher.fisher import FisherConfig, fisher_diagonal, fisher_loop, fisher_total, fisher_traces
from skillgraft.fisher.scores import LayerScores, aggregate_layers, block_names, fim_layer_scores, rank_correlation
from skillgraft.fisher.surgical import ranking_stability, resolve_layer_spec

__all__ = ["FisherConfig", "LayerScores", "aggregate_layers", "block_names",
           "fim_layer_scores", "fish_iou", "fish_region", "fish_scores", "fisher_diagonal", "fisher_loop",
           "fisher_total", "fisher_traces", "rank_correlation", "ranking_stability", "resolve_layer_spec"]
