"""Diagonal Fisher information, per-layer FIM scores and surgical fine-tuning selection.

FISH regions (top Fisher of θ_pre) are the ``fish`` localizer: ``skillgraft.graft.get_localizer("fish")``."""

from skillgraft.lazy import lazy_exports

# each name’s module is imported on first use (``import skillgraft.fisher.x`` runs no sibling)
_EXPORTS = {
    "FisherConfig": "skillgraft.fisher.fisher",
    "fisher_diagonal": "skillgraft.fisher.fisher",
    "fisher_loop": "skillgraft.fisher.fisher",
    "fisher_traces": "skillgraft.fisher.fisher",
    "LayerScores": "skillgraft.fisher.scores",
    "aggregate_layers": "skillgraft.fisher.scores",
    "block_names": "skillgraft.fisher.scores",
    "fim_layer_scores": "skillgraft.fisher.scores",
    "rank_correlation": "skillgraft.fisher.scores",
    "ranking_stability": "skillgraft.fisher.surgical",
    "resolve_layer_spec": "skillgraft.fisher.surgical",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["FisherConfig", "LayerScores", "aggregate_layers", "block_names", "fim_layer_scores",
           "fisher_diagonal", "fisher_loop", "fisher_traces",
           "rank_correlation", "ranking_stability", "resolve_layer_spec"]
