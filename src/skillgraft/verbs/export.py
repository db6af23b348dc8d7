"""``skillgraft export``: a graft folder written by a registered exporter (``--to peft | delta | hf``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from skillgraft.export import ExportSpec, export_graft
from skillgraft.verbs.result import VerbResult


@dataclass
class ExportResult(VerbResult):
    """What ``skillgraft export`` wrote: where, by which exporter, how many grafted coordinates, and the exporter's
    own summary (``skillgraft_export.json``, what ``--json`` prints)."""

    out: Path
    to: str
    coordinates: int
    summary: dict

    @property
    def bytes(self) -> int | None:
        """The size written, when the exporter reports it."""
        return self.summary.get("bytes")

    def to_dict(self) -> dict:
        return self.summary

    def document(self) -> dict:
        """Where it wrote and the exporter's summary (skillgraft_export.json)."""
        return {"out": self.out, **self.summary}


def export(graft_dir: str | os.PathLike, out: str | os.PathLike, spec: ExportSpec | None = None, *,
           runtime=None) -> ExportResult:
    """Export the graft in ``graft_dir`` to ``out`` (refused before any work if it exists, unless
    ``spec.overwrite``); returns the typed result holding the exporter's summary. ``runtime``: where the base
    loads (None: the placement the command line activated), passed down."""
    from skillgraft.export import check_export_target  # noqa: PLC0415
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415

    runtime = boundary(runtime)  # the one read of the placement the command line activated
    spec = spec or ExportSpec()
    check_target(out, spec.overwrite, {"graft": graft_dir, "--model": spec.model})  # before any work
    graft = Graft.from_pretrained(Path(graft_dir))
    check_export_target(graft, out, spec.overwrite, model=spec.model)  # and what the graft records it was learned on
    summary = export_graft(graft, out, spec, runtime=runtime)
    return ExportResult(Path(out), summary["to"], summary["coordinates"], summary)
