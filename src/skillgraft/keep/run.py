"""Keep targets in a grafting report (``skillgraft graft --keep 0.95,0.99``): the smallest graft keeping each share.

The selection split (:mod:`.selection`) is a user's ``--keep-data`` file, else the data's dev split, else a seeded
held-out slice of the localization rows; the report's test rows are never used to choose. A size counts as reaching a
target when the lower confidence bound of its share (``--keep-confidence``) does. The search (:mod:`.search`) runs on
the chosen localizer's nested family (``Localizer.keep``); the found regions are stored (keyed by the member,
the localizer and its options, the targets and the split) and scored on the test rows beside every other variant.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.region import Region
from skillgraft.io import write_json
from skillgraft.keep.report import KeepSummary, KeepTarget, target_key
from skillgraft.keep.scoring import selection_outcome
from skillgraft.keep.selection import check_keep_rows, selection_split, with_completions
from skillgraft.keep.spec import LEARNED_ORDER, KeepSpec
from skillgraft.keep.stats.bound import KEEP_BOUND
from skillgraft.spec import Spec
from skillgraft.untrusted import inside, read_json


def keep_identity(keep: KeepSpec) -> dict:
    """The keep spec's part of a store key: its settings, the bound's method, and the --keep-data file's content."""
    out = {"keep": keep.to_dict(), "bound": KEEP_BOUND}
    if keep.keep_data is not None and Path(keep.keep_data).is_file():
        out["keep_data"] = hashlib.sha256(Path(keep.keep_data).read_bytes()).hexdigest()
    return out


def keep_results(member, store, localizer: str, options: Spec, keep: KeepSpec, *,
                 progress: bool = False) -> tuple[dict[str, Region], KeepSummary]:
    """Regions found for each keep target and the search's summary (stored: a re-run only re-scores) for ``member``
    (a :class:`~skillgraft.pipeline.member.Member`: its θ_pre, θ_ft, data and identity)."""
    loc = get_localizer(localizer)
    options = loc.options(options)
    key = {"setup": member.identity(), "localizer": localizer, "options": options.to_dict(), **keep_identity(keep),
           "learned_order": LEARNED_ORDER}
    holder: dict = {}

    def make(folder: Path) -> None:
        selection, data, note = selection_split(member, keep)
        check_keep_rows(keep, member.data.task, len(selection), note.split(" (")[0])
        selection = with_completions(member.ft, selection, keep.keep_new_tokens)
        ft = selection_outcome(member.ft, selection)
        if ft.pred is not None:  # FT's right rows are what the exact bound counts
            check_keep_rows(keep, member.data.task, len(selection), note.split(" (")[0],
                            right=int((ft.pred == ft.labels).sum()))
        t0 = time.perf_counter()
        results = loc.keep(member.pre, member.ft, data, keep, options, selection=selection, progress=progress)
        summary = KeepSummary(note, len(selection), keep.keep_confidence, time.perf_counter() - t0,
                              [KeepTarget.of(r) for r in results])
        for r in results:
            r.region.save(folder / f"keep-{r.key}")
        write_json(folder / "summary.json", summary)
        holder["regions"] = {r.key: r.region for r in results}

    entry = store.fetch("keep", key, make, label=f"{member.task}-{member.k}-{member.seed}-{localizer}-keep")
    path = entry / "summary.json"
    summary = read_json(path, required=("targets",), what="stored keep summary")
    if not isinstance(summary["targets"], list) or not all(isinstance(t, dict) and type(t.get("target")) in (int, float)
                                                           for t in summary["targets"]):
        raise SkillgraftError(f"{path}: field 'targets' must be a list of keep results, each with its 'target' share")
    summary = KeepSummary.from_columns(summary)
    regions = holder.get("regions") or {target_key(t): Region.load(inside(entry, f"keep-{target_key(t)}", path,
                                                                          f"targets.{i}.target"))
                                        for i, t in enumerate(summary.targets)}
    return regions, summary


def keep_graft(member, store, localizer: str, options: Spec, keep: KeepSpec, meta: dict | None = None, *,
               progress: bool = False) -> tuple[object, KeepTarget]:
    """The graft of ``keep``'s one target (``skillgraft merge --routed --keep τ``): the region :func:`keep_results`
    finds on the same selection split as ``skillgraft graft --keep`` (the member's dev rows, never its test rows),
    θ_pre + γ ⊙ (θ_ft − θ_pre) on it, and that target's search result (with the selection note). Needs θ_ft
    loaded."""
    from skillgraft.graft.graft import Graft  # noqa: PLC0415

    regions, summary = keep_results(member, store, localizer, options, keep, progress=progress)
    (target,) = summary.targets
    region = regions[target_key(target)]
    meta = {"task": member.task, "mode": member.pre.mode, "localizer": localizer, "keep": target.target,
            "keep_confidence": summary.confidence, **(meta or {})}
    return Graft.from_models(member.pre, member.ft, region, meta), dataclasses.replace(target,
                                                                                     selection=summary.selection)
