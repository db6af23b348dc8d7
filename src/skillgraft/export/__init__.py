"""The exporter registry: a graft written in the tools users already have.

    export_graft(graft, out, ExportSpec(to="peft")) -> summary (dict, also ``skillgraft_export.json``)

Each target is an :class:`~skillgraft.export.base.Exporter` (its ``export`` and the ``lines`` a command line prints
of its summary). Adding one: a module with an ``Exporter`` subclass and a line below (or
``@register_exporter("name")`` in your own code); ``skillgraft export --to NAME`` then works. See docs/export.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.export.base import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, DELTA_FILE, HEAD_FILE, SUMMARY_FILE, ExportSpec,
                                    Exporter, _head_file, exact_delta, graft_task, load_graft_base)
from skillgraft.export.delta import Delta, export_delta
from skillgraft.export.hf import HF, USER_CLASS, export_hf
from skillgraft.export.peft import (Peft, apply_entries, export_peft, graft_from_peft, load_adapter_base,
                                    read_graft_or_adapter, shira_entries)
from skillgraft.graft.graft import Graft

EXPORTERS: dict[str, Exporter] = {}


def register_exporter(name: str, *, replace: bool = False):
    """Class decorator: register an :class:`Exporter` subclass as ``--to name``."""
    def add(cls: type[Exporter]) -> type[Exporter]:
        if not (isinstance(cls, type) and issubclass(cls, Exporter)):
            raise SkillgraftError(f"exporter {name!r} must be an Exporter subclass, got {cls!r}")
        if name in EXPORTERS and not replace:
            raise SkillgraftError(f"an exporter named {name!r} is already registered")
        cls.name = name
        EXPORTERS[name] = cls()
        return cls
    return add


def get_exporter(name: str) -> Exporter:
    """The registered exporter ``name`` (a clear error listing the known names otherwise)."""
    if name not in EXPORTERS:
        raise SkillgraftError(f"unknown export target {name!r}; known: {', '.join(EXPORTERS)}")
    return EXPORTERS[name]


def export_graft(graft: Graft, out: str | os.PathLike, spec: ExportSpec | None = None, base=None) -> dict:
    """``skillgraft export``: check the target, load the base when not given, write ``spec.to``."""
    from skillgraft.io import check_target  # noqa: PLC0415

    spec = spec or ExportSpec()
    exporter = get_exporter(spec.to)
    check_target(out, spec.overwrite)
    if graft.carried and spec.head == "refuse" and exporter.container:
        _head_file(graft, None, Path(out), "refuse", exporter.container)
    base = base if base is not None else load_graft_base(graft, spec.model)
    return exporter.export(graft, base, out, spec)


register_exporter("peft")(Peft)
register_exporter("hf")(HF)
register_exporter("delta")(Delta)

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "DELTA_FILE", "EXPORTERS", "HEAD_FILE", "SUMMARY_FILE", "USER_CLASS",
           "ExportSpec", "Exporter", "apply_entries", "exact_delta", "export_delta", "export_graft", "export_hf",
           "export_peft", "get_exporter", "graft_from_peft", "graft_task", "load_adapter_base", "load_graft_base",
           "read_graft_or_adapter", "register_exporter", "shira_entries"]
