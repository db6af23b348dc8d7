"""θ_ft for the learned localizer, read one tensor (or one process's rows of it) at a time.

The fine-tuned model is either an in-memory scorer, or a folder that a skillgraft ``Scorer`` was saved to
(``model.safetensors`` or its sharded ``model.safetensors.index.json``, plus ``head.safetensors`` in head
mode; a run directory holding ``model/`` works too). A folder is never loaded as a second model: each
read opens the file through safetensors' memory-mapped ``safe_open``, copies the rows asked for and closes
the mapping again, so only the tensor being read is resident.

    source = fine_tuned(ft, pre, names)    # checks names and shapes against θ_pre
    source.rows(name, start, stop)         # θ_ft[name][start:stop] (dim 0), in its stored dtype
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.models.anatomy import HEAD_PREFIX, check_compatible

MODEL_PREFIX = "model."


class FineTuned:
    """θ_ft tensors by the scorer's parameter names."""

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def rows(self, name: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """θ_ft[name][start:stop] along dim 0 (the whole tensor by default); callers must not modify it."""
        raise NotImplementedError


class InMemory(FineTuned):
    """A fine-tuned scorer already in memory (its tensors are read in place, never copied whole)."""

    def __init__(self, ft: torch.nn.Module):
        self.params = dict(ft.named_parameters())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.params[name].shape)

    def rows(self, name: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        return self.params[name].detach()[start:stop]


class SafetensorsFolder(FineTuned):
    """A saved scorer's safetensors files, read lazily through memory-mapped ``safe_open``."""

    def __init__(self, folder: str | os.PathLike):
        from safetensors import safe_open  # noqa: PLC0415

        self.folder = _model_folder(Path(folder))
        self.where: dict[str, tuple[Path, str]] = {}   # parameter name → (file, key in the file)
        self.shapes: dict[str, tuple[int, ...]] = {}
        files = [(f, MODEL_PREFIX) for f in _weight_files(self.folder)]
        if (self.folder / "head.safetensors").is_file():
            files.append((self.folder / "head.safetensors", HEAD_PREFIX))
        for file, prefix in files:
            try:
                with safe_open(str(file), framework="pt") as f:
                    for key in f.keys():
                        self.where[prefix + key] = (file, key)
                        self.shapes[prefix + key] = tuple(f.get_slice(key).get_shape())
            except (OSError, RuntimeError, ValueError) as e:
                raise SkillgraftError(f"{file}: not a readable safetensors file ({e})") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def rows(self, name: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        from safetensors import safe_open  # noqa: PLC0415

        file, key = self.where[name]
        with safe_open(str(file), framework="pt") as f:  # mapped for this read only
            piece = f.get_slice(key)
            return piece[start:stop] if piece.get_shape() else f.get_tensor(key)


def row_slices(source, name: str, chunk: int = 1 << 22):
    """``(start, rows)`` of tensor ``name`` of a lazy ``source``, about ``chunk`` values at a time along dim 0
    (a 0-d tensor whole): no tensor-sized copy."""
    shape = source.shapes[name]
    if not shape:
        yield 0, source.rows(name)
        return
    step = max(1, chunk // max(1, math.prod(shape[1:])))
    for start in range(0, shape[0], step):
        yield start, source.rows(name, start, start + step)


def fine_tuned(ft, pre: torch.nn.Module, names: list[str]) -> FineTuned:
    """θ_ft as a source: ``ft`` is a scorer, or the folder a scorer was saved to; names and shapes checked."""
    if isinstance(ft, (str, os.PathLike)):
        source = SafetensorsFolder(ft)
        params = dict(pre.named_parameters())
        missing = [n for n in names if n not in source.shapes]
        if missing:
            raise SkillgraftError(f"fine-tuned model {source.folder}: no tensor for {missing[0]!r} in its safetensors "
                                  f"files ({len(missing)} missing; is it the same architecture as θ_pre?)")
        for n in names:
            if source.shape(n) != _global_shape(params[n]):
                raise SkillgraftError(f"fine-tuned model {source.folder}: tensor {n!r} has shape {source.shape(n)}, "
                                      f"θ_pre has {_global_shape(params[n])}")
        return source
    if not isinstance(ft, torch.nn.Module):
        raise SkillgraftError(f"the fine-tuned model must be a scorer or a saved scorer's folder, got "
                              f"{type(ft).__name__}")
    check_compatible(pre, ft, names)
    return InMemory(ft)


def _global_shape(p: torch.Tensor) -> tuple[int, ...]:
    return tuple(p.shape)  # a DTensor reports its global shape


def _model_folder(folder: Path) -> Path:
    if not folder.is_dir():
        raise SkillgraftError(f"fine-tuned model folder not found: {folder}")
    if not (folder / "scorer_config.json").is_file() and (folder / "model" / "scorer_config.json").is_file():
        return folder / "model"  # a fine-tuning run directory
    return folder


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SkillgraftError(f"{index}: unreadable index ({e})") from None
        from skillgraft.untrusted import inside  # noqa: PLC0415

        if not isinstance(weight_map, dict):
            raise SkillgraftError(f"{index}: field 'weight_map' must be an object of tensor name → file")
        # every shard inside the folder: an index naming "../x.safetensors" or an absolute path is refused
        return list(dict.fromkeys(inside(folder, f, index, f"weight_map.{name}") for name, f in weight_map.items()))
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    raise SkillgraftError(f"{folder}: no model.safetensors (or model.safetensors.index.json); localization reads θ_ft "
                          "from a scorer saved by skillgraft (save_pretrained) or a run directory's model/")
