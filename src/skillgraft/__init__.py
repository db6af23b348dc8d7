"""skillgraft: find where a fine-tuned model keeps a task's skill, store it as a sparse graft, use it."""

from skillgraft.errors import SkillgraftError

__version__ = "0.1.0"
__all__ = ["SkillgraftError", "__version__"]
