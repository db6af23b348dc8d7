"""Keep targets in a grafting report (``skillgraft graft --keep 0.95,0.99``): the smallest graft keeping each share.

The selection split is the data's dev split (a k-shot draw: the next K per label), else a seeded held-out
slice of the localization rows (the localizer then learns on the rest); the report's test rows are never
used to choose. The search (:mod:`skillgraft.graft.keep`) runs on the chosen localizer's nested family; the
found regions are stored (keyed by the setup, the localizer and its options, the targets and the split) and
scored on the test rows beside every other variant.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from skillgraft.errors import SkillgraftError
from skillgraft.graft.keep import LEARNED_ORDER, KeepSpec
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget
from skillgraft.io import read_json, write_json
from skillgraft.pipeline.setup import Setup
from skillgraft.pipeline.variants import Variant, graft_variant
from skillgraft.spec import Spec


def selection_split(setup: Setup, holdout: float = 0.2) -> tuple[list, object, str]:
    """(selection examples, the data the localizer learns on, a note saying which) for keep searches."""
    data = setup.data
    if data.dev:
        note = f"the dev split ({len(data.dev)} rows, distinct from the {len(setup.test)} test rows)"
        return list(data.dev), data, note
    rows = list(data.train)
    n = max(1, round(holdout * len(rows)))
    if len(rows) - n < 1:
        raise SkillgraftError(f"a keep target needs a selection split: the data has no dev split and only {len(rows)} "
                              "localization row(s) to hold some out from")
    order = np.random.RandomState(0).permutation(len(rows))
    selection = [rows[i] for i in sorted(order[:n])]
    rest = [rows[i] for i in sorted(order[n:])]
    note = (f"a seeded held-out slice of {n} of the {len(rows)} localization rows (no dev split); the localizer "
            f"learned on the other {len(rest)}")
    return selection, dataclasses.replace(data, train=rest, dev=[]), note


def keep_label(target: float) -> str:
    return f"keep {target:g}"


def keep_results(setup: Setup, store, localizer: str, options: Spec, keep: KeepSpec, *,
                 progress: bool = False) -> tuple[dict[float, Region], dict]:
    """Regions found for each keep target and the search's summary (stored: a re-run only re-scores)."""
    loc = get_localizer(localizer)
    options = loc.options(options)
    key = {"setup": setup.identity(), "localizer": localizer, "options": options.to_dict(), "keep": keep.to_dict(),
           "learned_order": LEARNED_ORDER}
    holder: dict = {}

    def make(folder: Path) -> None:
        selection, data, note = selection_split(setup, keep.keep_holdout)
        t0 = time.perf_counter()
        results = loc.keep(setup.pre, setup.ft, data, keep, options, selection=selection, progress=progress)
        summary = {"selection": note, "selection_n": len(selection), "seconds": time.perf_counter() - t0,
                   "targets": [r.to_dict() for r in results]}
        for r in results:
            r.region.save(folder / f"keep-{r.target!r}")
        write_json(folder / "summary.json", summary)
        holder["regions"] = {r.target: r.region for r in results}

    entry = store.fetch("keep", key, make, label=f"{setup.task}-{setup.k}-{setup.seed}-{localizer}-keep")
    summary = read_json(entry / "summary.json", required=("targets",), what="stored keep summary")
    regions = holder.get("regions") or {t["target"]: Region.load(entry / f"keep-{t['target']!r}")
                                        for t in summary["targets"]}
    return regions, summary


def keep_variants(setup: Setup, store, localizer: str, options: Spec, keep: KeepSpec, *,
                  progress: bool = False) -> tuple[list[Variant], dict]:
    """One graft variant per keep target (named ``keep 0.95``), and the search's summary."""
    regions, summary = keep_results(setup, store, localizer, options, keep, progress=progress)
    variants = []
    for target, region in regions.items():
        meta = {"localizer": localizer, "keep": target, "selection": summary["selection"]}
        variants.append(graft_variant(setup, region, Budget.parse(max(1, len(region))), meta,
                                      name=keep_label(target), kind="keep"))
    return variants, summary


def keep_section(summary: dict, rows: list[dict]) -> dict:
    """The keep summary with each target's test score and share of FT (from the report's rows)."""
    by_name = {r["model"]: r for r in rows}
    out = dict(summary)
    out["targets"] = []
    for t in summary["targets"]:
        row = by_name.get(keep_label(t["target"]), {})
        out["targets"].append({**t, "test_score": row.get("score"), "test_share": row.get("share_of_ft")})
    return out


def keep_markdown(section: dict) -> list[str]:
    """Report lines: per target the size found, its selection and test shares, and what the search cost."""
    lines = ["", "## Keep targets", "",
             f"Selection split: {section['selection']}. Each target's region is the smallest probed size of the "
             "localizer's nested family whose selection score is at least that share of FT's (galloping ×4, then "
             "bisection on a log scale).", "",
             "| target | reached | size | density | selection share | test share | probes | search s |",
             "|---:|:---:|---:|---:|---:|---:|---:|---:|"]
    for t in section["targets"]:
        size = t["size"] if t["reached"] else t["best_size"]
        sel = t["selection_share"] if t["reached"] else t["best_share"]
        test = "-" if t.get("test_share") is None else f"{t['test_share']:.3f}"
        reached = "yes" if t["reached"] else "**no** (best reached shown)"
        lines.append(f"| {t['target']:g} | {reached} | {size:,} | {size / t['universe']:.2e} | {sel:.3f} | {test} | "
                     f"{t['probe_count']} | {t['search_seconds']:.0f} |")
    return lines
