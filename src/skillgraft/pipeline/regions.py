"""The regions stage: a localizer's regions for one member, learned once and then read from the store.

Every runner that needs regions (``skillgraft graft``, the recipes, ``skillgraft merge``, continual learning)
asks :func:`learned_regions`; its store key covers the fine-tuned model, the data (content digest), the
localizer and its resolved options, so the same setting means the same entry whichever runner asks.
"""

from __future__ import annotations

import time
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.trained import bitfit_variant, retrain_variant
from skillgraft.pipeline.variants import Variant, base_variants, graft_variant
from skillgraft.spec import Spec
from skillgraft.untrusted import inside


def localizer_options(localizer: str, localize: Spec | dict | None, *, build=None) -> Spec:
    """The options of ``localizer``: its own defaults, overridden only by the fields the user set.

    ``localize`` may be the localizer's own options, a dict, or another localizer's options spec (the CLI and
    the recipes' ``localize`` section): only its *explicitly set* fields (``model_fields_set``) carry over, so
    ``--localizer prune`` never runs with the learned localizer's lr or steps. A set field the chosen
    localizer does not have is refused by name. ``build(OptionsClass, values)`` validates (the CLI passes one
    whose errors name ``--options``).
    """
    loc = get_localizer(localizer)
    if localize is None or isinstance(localize, loc.Options):
        return loc.options(localize)
    given = dict(localize) if isinstance(localize, dict) else localize.given()
    foreign = sorted(k for k in given if k not in loc.Options.model_fields)
    if foreign:
        raise SkillgraftError(f"localizer {localizer!r} has no option {', '.join(foreign)}; its options: "
                              f"{', '.join(loc.Options.model_fields)}")
    return build(loc.Options, given) if build is not None else loc.options(given)


def learned_regions(member: Member, store, localizer: str, options: Spec, *,
                    progress: bool = False) -> tuple[dict[Budget, Region], dict]:
    """Regions of ``localizer`` for ``member`` (one per budget) and its summary: THE regions cache.

    The store key covers the fine-tuned model, the data (content digest), the localizer and its resolved
    options; a finished entry is reused, an interrupted one never is.
    """
    loc = get_localizer(localizer)
    options = loc.options(options)
    key, label = _regions_key(member, localizer, options)
    holder: dict = {}

    def make(folder: Path) -> None:
        t0 = time.perf_counter()
        result = loc.run(member.pre, member.ft, member.data, options, progress=progress)
        for budget, region in result.regions.items():
            region.save(folder / budget.key)
        summary = {**result.summary, "budgets": [b.key for b in result.regions],  # stopped runs' time included
                   "seconds": time.perf_counter() - t0 + result.resumed_seconds}
        write_json(folder / "summary.json", summary)
        holder["regions"] = result.regions

    entry = store.fetch("regions", key, make, label=label)
    regions, summary = _read_regions(entry, regions="regions" not in holder)
    return holder.get("regions") or regions, summary


def stored_regions(member: Member, store, localizer: str, options: Spec) -> tuple[dict[Budget, Region], dict] | None:
    """The regions cache's entry for these settings (as :func:`learned_regions` returns it), or None when it is not
    in the store: nothing is computed."""
    key, label = _regions_key(member, localizer, get_localizer(localizer).options(options))
    entry = store.get("regions", key, label)
    return None if entry is None else _read_regions(entry)


def _regions_key(member: Member, localizer: str, options: Spec) -> tuple[dict, str]:
    return ({"setup": member.identity(), "localizer": localizer, "options": options.to_dict()},
            f"{member.task}-{member.k}-{member.seed}-{localizer}")


def _read_regions(entry: Path, *, regions: bool = True) -> tuple[dict[Budget, Region], dict]:
    path = entry / "summary.json"
    summary = read_json(path, required=("budgets",), what="stored regions summary")
    if not isinstance(summary["budgets"], list):
        raise SkillgraftError(f"{path}: field 'budgets' must be a list of budgets, got {summary['budgets']!r}"[:300])
    # each budget names its region's folder in the entry: a name leading out of it is refused (untrusted.inside)
    folders = [(b, inside(entry, b, path, f"budgets.{i}")) for i, b in enumerate(summary["budgets"])]
    return ({Budget.parse(b): Region.load(f) for b, f in folders} if regions else {}), summary


def learned_grafts(member: Member, store, localize: Spec, *, progress: bool = False
                   ) -> tuple[list[Variant], dict[Budget, Region], dict]:
    """pre, head only, FT and one learned graft per budget of ``localize`` (the learned localizer's options), the
    regions and the localization summary: the models every comparison recipe starts from."""
    regions, summary = learned_regions(member, store, "learned", localize, progress=progress)
    variants = base_variants(member) + [graft_variant(member, region, budget, {"budget": budget.key})
                                       for budget, region in regions.items()]
    return variants, regions, summary


def model_variants(member: Member, spec, run) -> tuple[list[Variant], dict]:
    """:func:`learned_grafts` and, if ``spec`` (a recipe's ``GraftVariantsMixin``) asks, a re-trained graft and
    BitFit; + the localization summary."""
    variants, regions, summary = learned_grafts(member, run.store, spec.localize, progress=spec.progress)
    if spec.retrain:
        key = spec.retrain.budget or next(iter(regions))
        label = "graft re-training" if key.rounding else f"graft re-training {key.label}"
        variants.append(retrain_variant(member, run.store, regions[key], spec.retrain.finetune, label=label,
                                        budget=key.fraction))
    if spec.bitfit:
        variants.append(bitfit_variant(member, run.store, spec.bitfit.finetune))
    return variants, summary
