"""Model loading, Scorer modes and freezing rules."""

from skillgraft.lazy import lazy_exports

# each name’s module is imported on first use (``import skillgraft.models.x`` runs no sibling)
_EXPORTS = {
    "freeze": "skillgraft.models.freezing",
    "param_groups": "skillgraft.models.freezing",
    "transformer_blocks": "skillgraft.models.freezing",
    "DEFAULT_MODEL": "skillgraft.models.loading",
    "ModelRef": "skillgraft.models.loading",
    "bundled_minilm_path": "skillgraft.models.loading",
    "model_reference": "skillgraft.models.loading",
    "Scorer": "skillgraft.models.scorer",
    "build_scorer": "skillgraft.models.scorer",
    "ModelSpec": "skillgraft.models.spec",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["DEFAULT_MODEL", "ModelRef", "ModelSpec", "Scorer", "build_scorer", "bundled_minilm_path", "freeze",
           "model_reference", "param_groups", "transformer_blocks"]
