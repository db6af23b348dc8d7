"""The regions stage: a localizer's regions for one member, learned once and then read from the store.

Every runner that needs regions (``skillgraft graft``, the recipes, ``skillgraft merge``, continual learning)
asks :func:`learned_regions`; its store key covers the fine-tuned model, the rows the localizer reads (content
digests: the localization rows, and the dev rows when its ``select_on`` reads them), the localizer and its resolved
options, so the same setting means the same entry whichever runner asks, and a change it does not depend on (the
test rows, a file's name) reruns nothing; a rerun says why in one line.
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


def resolve_once(localizer: str, localize: Spec | dict | None) -> Spec:
    """A run's localizer options at its entry (a verb): as given when already resolved (the command line resolves
    the flags it was given, naming them in its errors), else resolved here (the Python API's dict, another
    localizer's options spec), once; below, they travel typed."""
    if isinstance(localize, get_localizer(localizer).Options):
        return localize
    return localizer_options(localizer, localize)


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
    legacy = store.get("regions", _legacy_key(member, localizer, options), label)  # a store filled before: kept
    if legacy is not None:
        return _read_regions(legacy)
    if store.get("regions", key, label) is None:
        say_why(store, key, label, options)

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
    options = get_localizer(localizer).options(options)
    key, label = _regions_key(member, localizer, options)
    entry = store.get("regions", _legacy_key(member, localizer, options), label) or store.get("regions", key, label)
    return None if entry is None else _read_regions(entry)


def reads_dev(options: Spec) -> bool:
    """Whether a localizer with these options reads the dev rows (its ``select_on`` names them)."""
    return "dev" in str(getattr(options, "select_on", "") or "")


def rows_digest(rows) -> str:
    """Content digest of examples (their text, pair text, label or completion: everything an example holds)."""
    import hashlib  # noqa: PLC0415

    h = hashlib.sha256()
    for ex in rows or []:
        h.update(repr(ex).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _task_key(task) -> dict:
    """What of the task scoring reads (labels, label words, template…), its name left out: a renamed task is the
    same localization."""
    import dataclasses  # noqa: PLC0415

    fields = dataclasses.asdict(task) if dataclasses.is_dataclass(task) else {"repr": repr(task)}
    return {k: repr(v) for k, v in fields.items() if k not in ("name", "description")}


def _regions_key(member: Member, localizer: str, options: Spec) -> tuple[dict, str]:
    """The store key of a localization: the models, the rows it reads — the localization rows and, when its
    ``select_on`` reads them, the dev rows — the task's scoring, the localizer and its options. The test rows, the
    data files' names and the task's name are not in it: changing them never reruns a localization."""
    data = member.data
    rows = {"train": rows_digest(data.train), "task": _task_key(data.task)}
    if reads_dev(options):
        rows["dev"] = rows_digest(data.dev)
    setup = {k: v for k, v in member.identity().items() if k != "data"}
    return ({"setup": setup, "rows": rows, "localizer": localizer, "options": options.to_dict()},
            f"{member.task}-{member.k}-{member.seed}-{localizer}")


def _legacy_key(member: Member, localizer: str, options: Spec) -> dict:
    """The key regions were stored under before it named the rows read (it held the data files' digest and the test
    row count): entries found under it are still used."""
    return {"setup": member.identity(), "localizer": localizer, "options": options.to_dict()}


def say_why(store, key: dict, label: str, options: Spec) -> str | None:
    """One line on stderr when a localization reruns although one of the same task, draw and localizer is stored:
    what of its key changed (``regions recomputed: dev rows changed and select_on=train+dev``). Returned too."""
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from skillgraft.pipeline.store import KEY_FILE  # noqa: PLC0415

    newest = store.newest("regions", label)
    if newest is None:
        return None
    try:
        old = json.loads((newest / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    new = json.loads(json.dumps({"kind": "regions", **key}, default=str))
    if "rows" not in old:  # stored under the former key: what changed cannot be told apart
        return None
    why = []
    for part, text in (("finetuned", "the fine-tuned model changed"), ("pretrained", "the pre-trained model changed"),
                       ("mode", "the scoring mode changed"), ("precision", "the precision changed")):
        if old.get("setup", {}).get(part) != new["setup"].get(part):  # (precision: absent in fp32)
            why.append(text)
    if old["rows"].get("train") != new["rows"].get("train"):
        why.append("the localization rows changed")
    if old["rows"].get("task") != new["rows"].get("task"):
        why.append("the task's labels or template changed")
    if old["rows"].get("dev") != new["rows"].get("dev") and "dev" in new["rows"]:
        why.append(f"dev rows changed and select_on={getattr(options, 'select_on', '')}")
    for name in sorted(set(old.get("options", {})) | set(new["options"])):
        a, b = old.get("options", {}).get(name), new["options"].get(name)
        if a != b:
            why.append(f"option {name} changed ({a} → {b})")
    if not why:
        return None
    line = "regions recomputed: " + "; ".join(why)
    print(line, file=sys.stderr, flush=True)
    return line


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
