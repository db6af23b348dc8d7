"""The localizer registry: every way of choosing *where* a skill lives, behind one interface.

    get_localizer(name).regions(pre, ft, data, budgets, options) -> {Budget: Region}

A localizer scores the graftable coordinates; the shared selection (:mod:`skillgraft.graft.selection`)
turns scores into a Region of exactly the budget's size. Lottery-ticket-zero is not a localizer but an
apply mode (``Graft.apply(model, outside="zero")``). Adding one: a module with a ``Localizer`` subclass
and a line below (or ``@register_localizer("name")`` in your own code). See docs/localizers.md.
"""

from __future__ import annotations

import types
import typing
from typing import NamedTuple

from pydantic import Field, create_model

from skillgraft.errors import SkillgraftError
from skillgraft.registry import Registry
from skillgraft.graft.localizers.machinery.base import Localization, Localizer, LocalizerOptions
from skillgraft.graft.localizers.bias import Bias
from skillgraft.graft.localizers.fish import Fish, FishOptions
from skillgraft.graft.localizers.learned import Learned, LocalizeConfig, LocalizeResult, localize
from skillgraft.graft.localizers.movement import Movement, TiesTrim, movement
from skillgraft.graft.localizers.random import Random, RandomOptions
from skillgraft.graft.localizers.relaxed import (HardConcrete, LearnedAdam, LearnedSaliency, Prune, RelaxedOptions,
                                                 StraightThrough)
from skillgraft.graft.localizers.saliency import Saliency, SaliencyOptions
from skillgraft.spec import Spec

_REGISTRY: Registry[Localizer] = Registry(Localizer, "localizer")
LOCALIZERS: dict[str, Localizer] = _REGISTRY.members
register_localizer = _REGISTRY.register  # class decorator: register a Localizer subclass under a name
get_localizer = _REGISTRY.get  # the registered member of that name (an error listing the known names)


def options_table(name: str) -> list[tuple[str, str, str]]:
    """(field, default, help) of every option of localizer ``name``: what ``skillgraft localizers NAME`` shows."""
    opts = get_localizer(name).Options
    resolved = opts.build({})  # validators fill derived defaults (e.g. lr from relaxation × optimizer)
    rows = []
    for field, info in opts.model_fields.items():
        default = getattr(resolved, field, info.get_default(call_default_factory=True))
        if isinstance(default, Spec):
            default = f"{type(default).__name__} (set in a recipe)"
        elif isinstance(default, list):
            default = ",".join(str(x) for x in default)
        rows.append((field, "-" if default is None else str(default), info.description or ""))
    return rows


class Support(NamedTuple):
    """Where localizer ``name`` runs with its default options: ``"yes"``, or the one line it refuses with."""

    name: str
    candidates: str  # --candidates (the candidate-restricted layout): an option of the optimised localizers only
    sharded: str     # a model sharded with FSDP2
    generative: str  # generative (prompt → completion) data, which has no class labels


def support(name: str) -> Support:
    """:class:`Support` of localizer ``name``, read from the code itself (its options and ``refuse``), so the
    table ``skillgraft localizers`` prints and docs/localizers.md cannot drift from what a run does."""
    loc = get_localizer(name)
    opts = loc.options(None)

    def verdict(**setting) -> str:
        try:
            loc.refuse(opts, **setting)
        except SkillgraftError as e:
            return f"refused: {e}"
        return "yes"

    candidates = ("yes" if "candidates" in loc.Options.model_fields else
                  f"refused: localizer {name!r} has no option 'candidates' (it has no optimisation to restrict)")
    return Support(name, candidates, verdict(sharded=True), verdict(generative=True))


def support_table() -> list[Support]:
    """:func:`support` of every registered localizer, in registration order."""
    return [support(name) for name in LOCALIZERS]


def _without_none(ann):
    """``X | None`` → ``X`` (the union's fields are all optional anyway)."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
    return ann


def options_union() -> type[Spec]:
    """A spec with every registered localizer's options that a command line can give (nested specs are
    left to recipes), all unset by default: the CLI offers them all, the chosen localizer validates the ones
    the user set and refuses the others by name (issue 22)."""
    fields: dict[str, tuple] = {}
    owners: dict[str, list[str]] = {}
    for name, loc in LOCALIZERS.items():
        for field, info in loc.Options.model_fields.items():
            ann = _without_none(info.annotation)
            if isinstance(ann, type) and issubclass(ann, Spec):
                continue
            owners.setdefault(field, []).append(name)
            if field not in fields:
                fields[field] = (ann, info.description or "")
            elif fields[field][0] != ann:
                fields[field] = (str, fields[field][1])  # typed differently per localizer: the chosen one parses it
    made = {}
    for field, (ann, text) in fields.items():
        who = owners[field]
        scope = "every localizer" if len(who) == len(LOCALIZERS) else ", ".join(who)
        made[field] = (ann | None, Field(None, description=f"{text} [{scope}; default: the localizer's own]"))
    return create_model("LocalizerFlags", __base__=Spec, **made)


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
           "LocalizerOptions", "RandomOptions", "RelaxedOptions", "SaliencyOptions", "get_localizer", "localize",
           "movement", "options_table", "options_union", "register_localizer", "Support", "support", "support_table"]
