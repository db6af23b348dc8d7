"""``skillgraft export``: a graft folder written by a registered exporter (``--to peft | delta | hf``)."""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.export import ExportSpec, export_graft


def export(graft_dir: str | os.PathLike, out: str | os.PathLike, spec: ExportSpec | None = None) -> dict:
    """Export the graft in ``graft_dir`` to ``out`` (refused before any work if it exists, unless
    ``spec.overwrite``); returns the exporter's summary (also ``skillgraft_export.json``)."""
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415

    spec = spec or ExportSpec()
    check_target(out, spec.overwrite, {"graft": graft_dir, "--model": spec.model})  # before any work
    return export_graft(Graft.from_pretrained(Path(graft_dir)), out, spec)
