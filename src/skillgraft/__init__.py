"""skillgraft: find where a fine-tuned model keeps a task's skill, store it as a sparse graft, use it."""

from skillgraft.errors import SkillgraftError

__version__ = "0.1.0"
__all__ = ["RoutedSkills", "SkillgraftError", "__version__"]


def __getattr__(name: str):
    if name == "RoutedSkills":  # imported on first use (it imports torch; the console script's --help does not)
        from skillgraft.graft.routed import RoutedSkills  # noqa: PLC0415

        return RoutedSkills
    raise AttributeError(f"module 'skillgraft' has no attribute {name!r}")
