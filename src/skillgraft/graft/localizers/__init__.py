"""The localizer registry: every way of choosing *where* a skill lives, behind one interface.

    get_localizer(name).regions(pre, ft, data, budgets, options) -> {Budget: Region}

A localizer scores the graftable coordinates; the shared selection (:mod:`skillgraft.graft.selection`)
turns scores into a Region of exactly the budget's size. Lottery-ticket-zero is not a localizer but an
apply mode (``Graft.apply(model, outside="zero")``). Adding one: a module with a ``Localizer`` subclass
and a line below (or ``@register_localizer("name")`` in your own code). See docs/localizers.md.
"""

from __future__ import annotations

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.base import Localization, Localizer, LocalizerOptions
from skillgraft.graft.localizers.bias import Bias
from skillgraft.graft.localizers.fish import Fish, FishOptions
from skillgraft.graft.localizers.learned import Learned, LocalizeConfig, LocalizeResult, localize
from skillgraft.graft.localizers.movement import Movement, TiesTrim, movement
from skillgraft.graft.localizers.random import Random, RandomOptions
from skillgraft.graft.localizers.relaxed import (HardConcrete, LearnedAdam, LearnedSaliency, Prune, RelaxedOptions,
                                                 StraightThrough)
from skillgraft.graft.localizers.saliency import Saliency, SaliencyOptions

LOCALIZERS: dict[str, Localizer] = {}


def register_localizer(name: str, *, replace: bool = False):
    """Class decorator: register a :class:`Localizer` subclass under ``name``."""
    def add(cls: type[Localizer]) -> type[Localizer]:
        if not (isinstance(cls, type) and issubclass(cls, Localizer)):
            raise SkillgraftError(f"localizer {name!r} must be a Localizer subclass, got {cls!r}")
        if name in LOCALIZERS and not replace:
            raise SkillgraftError(f"a localizer named {name!r} is already registered")
        cls.name = name
        LOCALIZERS[name] = cls()
        return cls
    return add


def get_localizer(name: str) -> Localizer:
    """The registered localizer ``name`` (a clear error listing the known names otherwise)."""
    if name not in LOCALIZERS:
        raise SkillgraftError(f"unknown localizer {name!r}; known: {', '.join(LOCALIZERS)}")
    return LOCALIZERS[name]


register_localizer("learned")(Learned)
register_localizer("movement")(Movement)
register_localizer("ties-trim")(TiesTrim)
register_localizer("random")(Random)
register_localizer("bias")(Bias)
register_localizer("fish")(Fish)
register_localizer("saliency")(Saliency)
register_localizer("learned-adam")(LearnedAdam)
register_localizer("learned-saliency")(LearnedSaliency)
register_localizer("straight-through")(StraightThrough)
register_localizer("prune")(Prune)
register_localizer("hard-concrete")(HardConcrete)

__all__ = ["LOCALIZERS", "FishOptions", "LocalizeConfig", "LocalizeResult", "Localization", "Localizer",
           "LocalizerOptions", "RandomOptions", "RelaxedOptions", "SaliencyOptions", "get_localizer", "localize", "movement",
           "register_localizer"]
