"""Checks on a PEFT adapter read back into a graft (export/peft_read.py's ``graft_from_peft`` and
``load_adapter_base``): SHiRA indices inside their weight, and the labels of a sequence-classifier adapter."""

from __future__ import annotations

import math
from pathlib import Path

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.export.base import ADAPTER_WEIGHTS


def check_shira_indices(file: Path, key: str, ij: torch.Tensor, values: torch.Tensor, shape) -> None:
    """A SHiRA layer's ``shira_indices`` must be integer (row, column) pairs inside its weight, one per value:
    peft itself loads an index outside the weight and fails (or writes out of bounds) only when merging."""
    if ij.dtype.is_floating_point or ij.dtype.is_complex or ij.dtype == torch.bool:
        raise SkillgraftError(f"{file}: tensor {key!r} has dtype {ij.dtype}; expected integer (row, column) indices")
    if ij.dim() != 2 or ij.shape[0] != 2:
        raise SkillgraftError(f"{file}: tensor {key!r} has shape {tuple(ij.shape)}; expected (2, n): rows and columns")
    if ij.shape[1] != values.numel():
        raise SkillgraftError(f"{file}: tensor {key!r} holds {ij.shape[1]} positions but its shira_weight holds "
                              f"{values.numel()} values")
    for axis, (what, size) in enumerate((("row", shape[0]), ("column", shape[1]))):
        bad = torch.nonzero((ij[axis] < 0) | (ij[axis] >= size)).reshape(-1)
        if bad.numel():
            i = int(bad[0])
            raise SkillgraftError(f"{file}: tensor {key!r}[{axis}, {i}] = {int(ij[axis, i])} is out of range: the "
                                  f"weight has {size} {what}s (shape {tuple(shape)}); the adapter is damaged or "
                                  "for another model")


def check_flat_indices(file: Path, key: str, flat: torch.Tensor, values: torch.Tensor, shape) -> None:
    """A Supertuning layer's ``supertuning_indices`` must be integer flat positions inside its weight, one per value
    (peft scatter-adds them into the flattened weight: one outside fails only when the layer runs)."""
    if flat.dtype.is_floating_point or flat.dtype.is_complex or flat.dtype == torch.bool:
        raise SkillgraftError(f"{file}: tensor {key!r} has dtype {flat.dtype}; expected integer flat positions")
    if flat.dim() != 1 or flat.numel() != values.numel():
        raise SkillgraftError(f"{file}: tensor {key!r} has shape {tuple(flat.shape)}; expected ({values.numel()},): "
                              "one flat position per stored value")
    numel = math.prod(shape)
    bad = torch.nonzero((flat < 0) | (flat >= numel)).reshape(-1)
    if bad.numel():
        i = int(bad[0])
        raise SkillgraftError(f"{file}: tensor {key!r}[{i}] = {int(flat[i])} is out of range: the weight has {numel} "
                              f"values (shape {tuple(shape)}); the adapter is damaged or for another model")


def adapter_labels(directory: Path, meta: dict) -> tuple[str, ...]:
    """The labels of a sequence-classifier adapter: the graft's task, else as many as its stored head has."""
    labels = ((meta.get("metadata") or {}).get("task_spec") or {}).get("labels")
    if labels:
        return tuple(str(x) for x in labels)
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(directory / ADAPTER_WEIGHTS), "pt") as f:
        for key in f.keys():
            if key.endswith(("classifier.weight", "score.weight", "out_proj.weight")):
                return tuple(str(i) for i in range(f.get_slice(key).get_shape()[0]))
    raise SkillgraftError(f"{directory}: a sequence-classifier adapter that records neither its labels nor its "
                          "classification head; its number of labels is unknown")


def adapter_base(directory: Path, meta: dict, name: str, mode: str, runtime=None):
    """An adapter's base model ``name`` loaded for ``mode``; a sequence classifier's (mode ``classifier``) with
    Scorer names (``model.*``) and its new head carried (no part of the fingerprint), as the graft's scorer had it."""
    from skillgraft.export.base import SCORER_PREFIX  # noqa: PLC0415
    from skillgraft.models.named import PlainModel  # noqa: PLC0415
    from skillgraft.models.loading import load_classifier, model_reference  # noqa: PLC0415
    from skillgraft.models.scorer import load_for_mode  # noqa: PLC0415

    if mode != "classifier":
        return load_for_mode(model_reference(name), mode, None, runtime)[0]

    model, head = load_classifier(model_reference(name).path, adapter_labels(directory, meta), runtime=runtime)
    body = PlainModel(model, (f"{SCORER_PREFIX}{n}" for n in head))
    return body
