"""Keep targets as a report's variants (``skillgraft graft --keep 0.95,0.99``): each target's region, found by the keep
run (:func:`skillgraft.keep.run.keep_results`), becomes a graft variant scored on the test rows beside the others."""

from __future__ import annotations

from skillgraft.graft.selection import Budget
from skillgraft.keep.report import KeepSummary, target_key
from skillgraft.keep.run import keep_results
from skillgraft.keep.spec import KeepSpec
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.variants import Variant, graft_variant
from skillgraft.spec import Spec


def keep_variants(member: Member, store, localizer: str, options: Spec, keep: KeepSpec, *,
                  progress: bool = False) -> tuple[list[Variant], KeepSummary]:
    """One graft variant per keep target (named ``keep 0.95``), and the search's summary."""
    regions, summary = keep_results(member, store, localizer, options, keep, progress=progress)
    variants = []
    for t in summary.targets:
        region = regions[target_key(t)]
        meta = {"localizer": localizer, "keep": t.target, "keep_kind": t.kind, "selection": summary.selection}
        variants.append(graft_variant(member, region, Budget.parse(max(1, len(region))), meta, name=t.label,
                                      kind="keep"))
    return variants, summary
