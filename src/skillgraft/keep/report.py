"""A keep search as a report writes it: one typed row per target (:class:`KeepTarget`), the search's summary
(:class:`KeepSummary`: the store's summary.json, metrics.json's ``keep``), its console line and its report section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from skillgraft.evaluate.rows import Row
from skillgraft.keep.search import KeepResult
from skillgraft.keep.stats.bound import BOUND_NAMES, bound_prose


@dataclass
class KeepTarget(Row):
    """One keep target's search as a report writes it (:meth:`KeepResult.to_dict`'s columns); ``test_score`` and
    ``test_share`` are columns once the report's rows scored it (``tested``), ``selection`` once a routed merge
    names its split."""

    target: float
    reached: bool
    size: int | None
    density: float | None
    selection_share: float | None
    confidence: float | None
    bound: float | None
    selection_rows: int | None
    point_size: int | None
    rows_needed: int | None
    note: str
    best_size: int
    best_share: float
    universe: int
    probes: list
    probe_count: int
    search_seconds: float
    kind: str = "share"
    bound_method: str | None = None
    next_size: int | None = None
    next_rows: int | None = None
    test_score: float | None = None
    test_share: float | None = None
    tested: bool = False            # not a column: whether test_score / test_share are
    selection: str | None = None    # a routed merge's selection split (a column when set)

    @classmethod
    def of(cls, r: KeepResult) -> KeepTarget:
        return cls.from_columns(r.to_dict())

    @classmethod
    def from_columns(cls, c) -> KeepTarget:
        """The row of written (or stored) columns."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "tested"]
        return cls(**{n: c[n] for n in names if n in c}, tested="test_score" in c)

    def columns(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)[:_SEARCHED]}
        if self.tested:
            out |= {"test_score": self.test_score, "test_share": self.test_share}
        if self.selection is not None:
            out["selection"] = self.selection
        return out

    @property
    def label(self) -> str:
        return keep_label(self.target, self.kind)

    @property
    def shown_size(self) -> int:
        """The size found, or the best probed one when the target is not reached."""
        return self.size if self.reached else self.best_size


_SEARCHED = 21  # KeepTarget's fields that are KeepResult.to_dict's columns (target … next_rows)


@dataclass
class KeepSummary(Row):
    """A keep search's summary (the store's summary.json, metrics.json's ``keep``): the selection split, its rows,
    the confidence, the seconds it took and one :class:`KeepTarget` per target."""

    selection: str
    selection_n: int
    confidence: float | None
    seconds: float
    targets: list[KeepTarget] = field(default_factory=list)

    @classmethod
    def from_columns(cls, c) -> KeepSummary:
        return cls(c["selection"], c["selection_n"], c["confidence"], c["seconds"],
                   [KeepTarget.from_columns(t) for t in c["targets"]])

    def columns(self) -> dict:
        return {"selection": self.selection, "selection_n": self.selection_n, "confidence": self.confidence,
                "seconds": self.seconds, "targets": self.targets}


def keep_label(target: float, kind: str = "share") -> str:
    return f"keep {target:g}" if kind == "share" else f"keep-agreement {target:g}"


def target_key(t: KeepTarget) -> str:
    """A stored target's file name part: ``0.95``, or ``agreement-0.95`` for an agreement target."""
    return repr(t.target) if t.kind == "share" else f"agreement-{t.target!r}"


def keep_section(summary: KeepSummary, rows: list) -> KeepSummary:
    """The keep summary with each target's test score and share of FT (from the report's rows)."""
    by_name = {r.model: r for r in rows}
    targets = []
    for t in summary.targets:
        row = by_name.get(t.label)
        targets.append(dataclasses.replace(t, tested=True, test_score=row.score if row else None,
                                           test_share=row.share_of_ft if row else None))
    return dataclasses.replace(summary, targets=targets)


def keep_line(t: KeepTarget | dict) -> str:
    """One console line (rich markup) for a keep target of :func:`keep_section` (or its written columns, as a
    routed merge's summary holds them): size, shares, bound, cost, note."""
    from rich.markup import escape  # noqa: PLC0415

    t = t if isinstance(t, KeepTarget) else KeepTarget.from_columns(t)
    size = t.shown_size
    head = (f"{t.label}: {size:,} params ({size / t.universe:.2e})" if t.reached else
            f"{t.label}: [yellow]not reached[/] by any size; best {t.best_share:.3f} at {size:,}")
    method = f", {t.bound_method} bound" if t.bound_method else ""
    bound = ("" if t.bound is None else
             f", {t.confidence:.0%} lower bound {t.bound:.3f} on {t.selection_rows} rows{method}")
    agree = t.kind == "agreement"
    test = ("" if t.test_share is None or agree else f", test share {t.test_share:.3f}")
    note = f"\n  {escape(t.note)}" if t.note else ""
    what = "agreement with FT" if agree else "selection share"
    return (f"{head}, {what} {t.selection_share or t.best_share:.3f}{bound}{test} "
            f"| {t.probe_count} probes, {t.search_seconds:.0f} s{note}")


def keep_markdown(section: KeepSummary) -> list[str]:
    """Report lines: per target the size found, its selection share, bound and test share, and what the search cost."""
    conf = section.confidence
    lines = ["", "## Keep targets", "",
             f"Selection split: {section.selection}. Each target's region is the smallest probed size of the "
             "localizer's nested family whose share of FT's selection score reaches the target "
             + (f"{bound_prose(conf)}." if conf is not None else
                "(point estimate; galloping ×4, then bisection on a log scale)."), "",
             "| target | reached | size | density | selection share | lower bound | test share | point-estimate size "
             "| probes | search s |",
             "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for t in section.targets:
        size = t.shown_size
        sel = t.selection_share if t.reached else t.best_share
        test = "-" if t.test_share is None else f"{t.test_share:.3f}"
        bound = "-" if t.bound is None else f"{t.bound:.3f}"
        point = "-" if t.point_size is None else f"{t.point_size:,}"
        reached = "yes" if t.reached else "**no** (best reached shown)"
        name = f"{t.target:g}" if t.kind == "share" else f"agreement {t.target:g}"
        lines.append(f"| {name} | {reached} | {size:,} | {size / t.universe:.2e} | {sel:.3f} | {bound} | "
                     f"{test} | {point} | {t.probe_count} | {t.search_seconds:.0f} |")
        if t.note:
            notes.append(f"- {t.label}: {t.note}.")
    methods = sorted({t.bound_method for t in section.targets if t.bound_method})
    if methods:
        notes.insert(0, "- Bound: " + "; ".join(f"`{m}` — {BOUND_NAMES[m]}" for m in methods) + ".")
    return lines + ([""] + notes if notes else [])
