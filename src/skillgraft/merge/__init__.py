"""The merge-method registry: every way ``skillgraft merge`` combines several fine-tuned models of one base.

    get_merge_method(name).rows(bench, options, ft, work) -> [Scored]

A method is a :class:`~skillgraft.merge.base.MergeMethod` with typed ``Options`` (their fields are
``skillgraft merge`` options, through ``MergeSpec``). Adding one: a module with a ``MergeMethod`` subclass and a
line below (or ``@register_merge_method("name")`` in your own code). ``merge_methods(mergekit_runner=…)`` gives the
registered methods with mergekit's runner replaced (tests inject a fake instead of patching a module).
"""

from __future__ import annotations

from skillgraft.registry import Registry
from skillgraft.merge.base import Bench, MergeMethod, Scored
from skillgraft.merge.mergekit import METHODS as MERGEKIT_METHODS, Mergekit, MergekitOptions, Runner
from skillgraft.merge.stitch import RULES, Rule, Stitch, StitchOptions
from skillgraft.merge.taskaware import Emr, Tall, TSwitch

_REGISTRY: Registry[MergeMethod] = Registry(MergeMethod, "merge method")
MERGE_METHODS: dict[str, MergeMethod] = _REGISTRY.members
register_merge_method = _REGISTRY.register  # class decorator: register a MergeMethod subclass under a name
get_merge_method = _REGISTRY.get  # the registered member of that name (an error listing the known names)


def merge_methods(*, mergekit_runner: Runner | None = None) -> dict[str, MergeMethod]:
    """The registered methods, in order; with ``mergekit_runner``, mergekit's runner is that function."""
    out = dict(MERGE_METHODS)
    if mergekit_runner is not None:
        out["mergekit"] = Mergekit(runner=mergekit_runner)
    return out


register_merge_method("stitch")(Stitch)
register_merge_method("mergekit")(Mergekit)
register_merge_method("tall")(Tall)
register_merge_method("tswitch")(TSwitch)
register_merge_method("emr")(Emr)

__all__ = ["MERGEKIT_METHODS", "MERGE_METHODS", "RULES", "Bench", "MergeMethod", "Mergekit", "MergekitOptions",
           "Rule", "Scored", "Stitch", "StitchOptions", "get_merge_method", "merge_methods", "register_merge_method"]
