"""``--to delta``: ``delta.safetensors``, readable with the stock safetensors reader (see docs/export.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from skillgraft.lazy import torch

from skillgraft.export.base import (DELTA_FILE, SUMMARY_FILE, ExportSpec, Exporter, _as_scorer, _check_base, _head_file,
                                    _header, _hf_name, check_export_target, exact_delta)
from skillgraft.graft.graft import Graft
from skillgraft.graft.region import compact_positions
from skillgraft.io import atomic_dir


def export_delta(graft: Graft, out: str | os.PathLike, *, base=None, head: str = "separate",
                 overwrite: bool = False, force: bool = False) -> dict:
    """Write ``delta.safetensors``: per base tensor ``<hf name>::indices`` (int32) and ``::values``.

    With ``base`` (a Scorer or HF model; checked like :meth:`Graft.apply`) also ``::delta``, additive deltas
    with fl(w + delta) == values. Names are the base model's own (``encoder.layer.0...weight``).
    """
    check_export_target(graft, out, overwrite, base=base)
    spec = ExportSpec.build({"head": head}, where="export_delta")
    scorer = _as_scorer(base) if base is not None else None
    params = _check_base(graft, scorer, force) if scorer is not None else {}
    if graft.carried and spec.head == "refuse":
        _head_file(graft, scorer, Path(out), "refuse", "delta file")
    tensors: dict[str, torch.Tensor] = {}
    inexact = 0
    for name, idx in graft.region.indices.items():
        hf = _hf_name(name)
        tensors[f"{hf}::indices"] = compact_positions(idx).contiguous()
        tensors[f"{hf}::values"] = graft.values[name].reshape(-1).contiguous()
        if name in params:
            d, missed = exact_delta(params[name].detach().reshape(-1).cpu()[idx], graft.values[name])
            tensors[f"{hf}::delta"] = d.contiguous()
            inexact += int(missed.sum())
    summary = {"to": "delta", "out": str(out), "format": "safetensors: <name>::indices int32 flat (row-major), "
               "<name>::values (set: w.view(-1)[indices] = values)" + (", <name>::delta (add)" if params else ""),
               "coordinates": graft.size, "tensors": len(graft.region.indices), "inexact": inexact}
    from safetensors.torch import save_file  # noqa: PLC0415

    with atomic_dir(out, overwrite=overwrite) as tmp:
        summary["head"] = _head_file(graft, scorer, tmp, spec.head, "delta file")
        meta = _header(graft, {"format": "skillgraft.delta", "layout": summary["format"]})
        save_file(tensors, str(tmp / DELTA_FILE), metadata=meta)
        summary["bytes"] = (tmp / DELTA_FILE).stat().st_size
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    return summary


# The class a user loads an export with, by scorer mode (head mode has none: its head is skillgraft's own).

class Delta(Exporter):
    """Per base tensor ``<name>::indices`` (int32 flat), ``::values`` and, with a base, the additive ``::delta``."""

    summary = "delta.safetensors of per-tensor int32 indices + values (stock safetensors reader)"
    container = "delta file"

    def export(self, graft: Graft, base, out, spec: ExportSpec) -> dict:
        return export_delta(graft, out, base=base, head=spec.head, overwrite=spec.overwrite, force=spec.force)
