"""``skillgraft localizers``: the registered localizers (what each does, where it runs), or one localizer's options
with their defaults and help (all read from the code: :mod:`skillgraft.graft.localizers`)."""

from __future__ import annotations

from dataclasses import dataclass

from skillgraft.verbs.result import VerbResult


@dataclass
class LocalizerRow(VerbResult):
    """One registered localizer: what it does and where it runs with its default options (``"yes"``, or the line it
    refuses with) — on ``--candidates``, sharded with FSDP, on generative data."""

    name: str
    summary: str
    candidates: str
    sharded: str
    generative: str


@dataclass
class LocalizerOption:
    """One option of a localizer: its field name, its default (as shown) and its help."""

    option: str
    default: str
    help: str


@dataclass
class LocalizerInfo(VerbResult):
    """``skillgraft localizers NAME``: the localizer's summary, its options and where it runs."""

    name: str
    summary: str | None
    options: list[LocalizerOption]
    support: LocalizerRow

    def document(self) -> dict:
        s = self.support
        return {"name": self.name, "summary": self.summary, "options": [vars(o) for o in self.options],
                "support": {"candidates": s.candidates, "sharded": s.sharded, "generative": s.generative}}


def localizer_rows() -> list[LocalizerRow]:
    """Every registered localizer, in registration order."""
    from skillgraft.graft.localizers import LOCALIZERS, support_table  # noqa: PLC0415

    return [LocalizerRow(r.name, LOCALIZERS[r.name].summary or "", r.candidates, r.sharded, r.generative)
            for r in support_table()]


def localizer_info(name: str) -> LocalizerInfo:
    """Localizer ``name``'s options and where it runs (an unknown name is one line listing the known ones)."""
    from skillgraft.graft.localizers import get_localizer, options_table, support  # noqa: PLC0415

    loc = get_localizer(name)
    row = support(name)
    return LocalizerInfo(name, loc.summary, [LocalizerOption(f, d, t) for f, d, t in options_table(name)],
                         LocalizerRow(name, loc.summary or "", row.candidates, row.sharded, row.generative))
