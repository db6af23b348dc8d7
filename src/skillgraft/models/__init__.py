"""Model loading, Scorer modes and freezing rules."""

from skillgraft.models.freezing import freeze, param_groups, transformer_blocks
from skillgraft.models.loading import DEFAULT_MODEL, ModelRef, bundled_minilm_path, model_reference
from skillgraft.models.scorer import Scorer, build_scorer
from skillgraft.models.spec import ModelSpec

__all__ = ["DEFAULT_MODEL", "ModelRef", "ModelSpec", "Scorer", "build_scorer", "bundled_minilm_path", "freeze", "model_reference",
           "param_groups", "transformer_blocks"]
