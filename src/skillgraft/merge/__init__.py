"""The merge-method registry: every way ``skillgraft merge`` combines several fine-tuned models of one base.

    get_merge_method(name).rows(bench, options, ft, work) -> [Scored]

A method is a :class:`~skillgraft.merge.base.MergeMethod` with typed ``Options`` (their fields are
``skillgraft merge`` options, through ``MergeSpec``). Adding one: a module with a ``MergeMethod`` subclass and a
line below (or ``@register_merge_method("name")`` in your own code). ``merge_methods(mergekit_runner=…)`` gives the
registered methods with mergekit's runner replaced (tests inject a fake instead of patching a module).
"""

from __future__ import annotations

from skillgraft.errors import SkillgraftError
from skillgraft.merge.base import Bench, MergeMethod, Scored
from skillgraft.merge.mergekit import METHODS as MERGEKIT_METHODS, Mergekit, MergekitOptions, Runner
from skillgraft.merge.stitch import RULES, Rule, Stitch, StitchOptions

MERGE_METHODS: dict[str, MergeMethod] = {}


def register_merge_method(name: str, *, replace: bool = False):
    """Class decorator: register a :class:`MergeMethod` subclass under ``name``."""
    def add(cls: type[MergeMethod]) -> type[MergeMethod]:
        if not (isinstance(cls, type) and issubclass(cls, MergeMethod)):
            raise SkillgraftError(f"merge method {name!r} must be a MergeMethod subclass, got {cls!r}")
        if name in MERGE_METHODS and not replace:
            raise SkillgraftError(f"a merge method named {name!r} is already registered")
        cls.name = name
        MERGE_METHODS[name] = cls()
        return cls
    return add


def get_merge_method(name: str) -> MergeMethod:
    """The registered merge method ``name`` (a clear error listing the known names otherwise)."""
    if name not in MERGE_METHODS:
        raise SkillgraftError(f"unknown merge method {name!r}; known: {', '.join(MERGE_METHODS)}")
    return MERGE_METHODS[name]


def merge_methods(*, mergekit_runner: Runner | None = None) -> dict[str, MergeMethod]:
    """The registered methods, in order; with ``mergekit_runner``, mergekit's runner is that function."""
    out = dict(MERGE_METHODS)
    if mergekit_runner is not None:
        out["mergekit"] = Mergekit(runner=mergekit_runner)
    return out


register_merge_method("stitch")(Stitch)
register_merge_method("mergekit")(Mergekit)

__all__ = ["MERGEKIT_METHODS", "MERGE_METHODS", "RULES", "Bench", "MergeMethod", "Mergekit", "MergekitOptions",
           "Rule", "Scored", "Stitch", "StitchOptions", "get_merge_method", "merge_methods", "register_merge_method"]
