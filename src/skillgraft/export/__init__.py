"""The exporter registry: a graft written in the tools users already have.

    export_graft(graft, out, ExportSpec(to="peft")) -> summary (dict, also ``skillgraft_export.json``)

Each target is an :class:`~skillgraft.export.base.Exporter` (its ``export`` and the ``lines`` a command line prints
of its summary). Adding one: a module with an ``Exporter`` subclass and a line below (or
``@register_exporter("name")`` in your own code); ``skillgraft export --to NAME`` then works. See docs/export.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.export.base import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, APPLY_EXPORTER, DELTA_FILE, EXPORTERS, HEAD_FILE,
                                    SUMMARY_FILE, ExportSpec, Exporter, _head_file, check_export_target, exact_delta,
                                    exporter_for, get_exporter, graft_task, load_graft_base, register_exporter)
from skillgraft.export.delta import Delta, export_delta
from skillgraft.export.gguf import GGUF, export_gguf
from skillgraft.export.hf import HF, USER_CLASS, export_hf
from skillgraft.export.peft import Peft, export_peft
from skillgraft.export.peft_read import graft_from_peft, load_adapter_base, read_graft_or_adapter
from skillgraft.export.shira import apply_entries, shira_entries
from skillgraft.graft.graft import Graft

def export_graft(graft: Graft, out: str | os.PathLike, spec: ExportSpec | None = None, base=None, *,
                 runtime=None) -> dict:
    """``skillgraft export``: check the target, load the base when not given (on ``runtime``, the verb's
    placement), write ``spec.to``."""
    spec = spec or ExportSpec()
    exporter = get_exporter(spec.to)
    check_export_target(graft, out, spec.overwrite, model=spec.model)
    exporter.refuse(graft, out, spec)
    if graft.carried and spec.head == "refuse" and exporter.container:
        _head_file(graft, None, Path(out), "refuse", exporter.container)
    base = base if base is not None else load_graft_base(graft, spec.model, runtime=runtime)
    return exporter.export(graft, base, out, spec)


register_exporter("peft")(Peft)
register_exporter("hf")(HF)
register_exporter("delta")(Delta)
register_exporter("gguf")(GGUF)

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "APPLY_EXPORTER", "DELTA_FILE", "EXPORTERS", "HEAD_FILE", "SUMMARY_FILE", "USER_CLASS",
           "ExportSpec", "Exporter", "apply_entries", "check_export_target", "exact_delta", "export_delta",
           "export_gguf", "export_graft", "exporter_for",
           "export_hf", "export_peft", "get_exporter", "graft_from_peft", "graft_task", "load_adapter_base",
           "load_graft_base", "read_graft_or_adapter", "register_exporter", "shira_entries"]
