"""Region: a sparse set of parameter coordinates, per named tensor, with set algebra.

A region γ ⊆ {(tensor, flat index)} over a *universe* of graftable tensors (their shapes). Its size is
|γ|; its density is |γ| / (number of universe coordinates). Regions are stored as sorted unique int64
flat indices per tensor, never as dense masks.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.io import atomic_dir
from skillgraft.models.families import module_type  # the one table of model-family quirks
from skillgraft.resume import register_codec

@dataclass
class Region:
    """Sparse coordinates ``indices[name]`` (sorted unique flat int64) over tensors of ``shapes``."""

    shapes: dict[str, tuple[int, ...]]
    indices: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.shapes = {k: tuple(int(d) for d in v) for k, v in self.shapes.items()}
        clean = {}
        for name, idx in self.indices.items():
            if name not in self.shapes:
                raise SkillgraftError(f"region names tensor {name!r} that is not in its universe")
            idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1).cpu()
            if idx.numel():  # sorted unique: as given when it already is (a copy, as unique makes), else unique's
                idx = idx.clone(memory_format=torch.contiguous_format) if bool((idx[1:] > idx[:-1]).all()) \
                    else torch.unique(idx)
                if idx[0] < 0 or idx[-1] >= numel_of(self.shapes[name]):
                    raise SkillgraftError(f"region indices out of range for {name!r} of shape {self.shapes[name]}")
                clean[name] = idx
        self.indices = clean

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_masks(cls, masks: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]] | None = None) -> Region:
        """A Region from dense boolean masks per tensor (``shapes`` defaults to the masks' shapes)."""
        shapes = shapes or {k: tuple(v.shape) for k, v in masks.items()}
        return cls(shapes, {k: torch.nonzero(m.reshape(-1), as_tuple=False).reshape(-1).cpu()
                            for k, m in masks.items()})

    @classmethod
    def empty(cls, shapes: dict[str, tuple[int, ...]]) -> Region:
        """The empty region over a universe: |γ| = 0 (grafting it carries only a new head)."""
        return cls(shapes, {})

    @classmethod
    def full(cls, shapes: dict[str, tuple[int, ...]]) -> Region:
        """Every coordinate of the universe: θ_pre + γ⊙Δ = θ_ft on these tensors."""
        return cls(shapes, {k: torch.arange(numel_of(s)) for k, s in shapes.items()})

    def to_masks(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Dense boolean masks (only for tensors of the universe; use sparingly on big models)."""
        out = {}
        for name, shape in self.shapes.items():
            m = torch.zeros(numel_of(shape), dtype=torch.bool, device=device)
            if name in self.indices:
                m[self.indices[name].to(device)] = True
            out[name] = m.view(shape)
        return out

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        return sum(int(v.numel()) for v in self.indices.values())

    @property
    def size(self) -> int:
        return len(self)

    @property
    def universe_size(self) -> int:
        return sum(numel_of(s) for s in self.shapes.values())

    @property
    def density(self) -> float:
        """|γ| / graftable coordinates."""
        return len(self) / max(1, self.universe_size)

    def density_of(self, total_parameters: int) -> float:
        """|γ| / ``total_parameters`` (e.g. all of the model's parameters, not only the graftable)."""
        return len(self) / max(1, total_parameters)

    def __repr__(self) -> str:
        return f"Region(size={len(self)}, density={self.density:.3g}, tensors={len(self.indices)}/{len(self.shapes)})"

    # ------------------------------------------------------------------ algebra
    def _check(self, other: Region) -> None:
        for name in set(self.shapes) & set(other.shapes):
            if self.shapes[name] != other.shapes[name]:
                raise SkillgraftError(f"regions disagree on the shape of {name!r}: "
                                      f"{self.shapes[name]} vs {other.shapes[name]}")

    def _combine(self, other: Region, op: str) -> Region:
        self._check(other)
        shapes = {**self.shapes, **other.shapes}
        out = {}
        for name in shapes:
            a = self.indices.get(name, torch.empty(0, dtype=torch.long))
            b = other.indices.get(name, torch.empty(0, dtype=torch.long))
            if op == "or":
                out[name] = torch.cat([a, b])
            elif op == "and":
                out[name] = a[torch.isin(a, b)]
            else:
                out[name] = a[~torch.isin(a, b)]
        return Region(shapes, out)

    def union(self, other: Region) -> Region:
        """γ_A ∪ γ_B (shapes must agree where both have a tensor)."""
        return self._combine(other, "or")

    def intersection(self, other: Region) -> Region:
        """γ_A ∩ γ_B."""
        return self._combine(other, "and")

    def difference(self, other: Region) -> Region:
        """γ_A \\ γ_B: coordinates of this region that ``other`` does not cover."""
        return self._combine(other, "sub")

    __or__ = union
    __and__ = intersection
    __sub__ = difference

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Region):
            return NotImplemented
        keys = set(self.indices) | set(other.indices)
        return all(name in self.indices and name in other.indices
                   and torch.equal(self.indices[name], other.indices[name]) for name in keys)

    def overlap(self, other: Region) -> float:
        """|A ∩ B| / |B| (paper §5): the share of ``other`` that ``self`` also covers."""
        return len(self & other) / len(other) if len(other) else 0.0

    def iou(self, other: Region) -> float:
        """|A ∩ B| / |A ∪ B| (paper Table 8); |A ∪ B| = |A| + |B| − |A ∩ B| (no union built)."""
        self._check(other)
        both = 0
        for name, a in self.indices.items():
            b = other.indices.get(name)  # sorted, unique, never empty (__post_init__): a binary search per index
            if b is not None:
                both += int((b[torch.searchsorted(b, a).clamp_(max=len(b) - 1)] == a).sum())
        union = len(self) + len(other) - both
        return both / union if union else 0.0

    def contains(self, name: str, flat_index: int) -> bool:
        """Whether coordinate ``flat_index`` of tensor ``name`` is in the region."""
        idx = self.indices.get(name)
        return bool(idx is not None and torch.isin(torch.tensor([flat_index]), idx).item())

    # ------------------------------------------------------------------ analysis
    def counts_by(self, key) -> dict[str, int]:
        """Region size grouped by ``key(name) -> str`` (e.g. a layer or module type)."""
        c: Counter[str] = Counter()
        for name, idx in self.indices.items():
            c[key(name)] += int(idx.numel())
        return dict(c)

    def module_type_counts(self) -> dict[str, int]:
        """Region size per module type (attention parts, FFN, layernorm, bias …; paper Fig. 9)."""
        return self.counts_by(lambda n: "bias" if n.endswith("bias") and module_type(n) != "layernorm"
                              else module_type(n))

    # ------------------------------------------------------------------ files
    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """(tensors, metadata) to store: int32 indices per tensor and the universe's shapes."""
        tensors = {f"{name}::indices": compact_positions(idx) for name, idx in self.indices.items()}
        return tensors, {"shapes": {k: list(v) for k, v in self.shapes.items()}}

    def save(self, directory: str | os.PathLike, *, overwrite: bool = True) -> Path:
        """Write ``region.json`` (universe) + ``region.safetensors`` (indices) atomically."""
        from safetensors.torch import save_file  # noqa: PLC0415

        tensors, meta = self.state()
        meta["size"] = len(self)
        with atomic_dir(directory, overwrite=overwrite) as tmp:
            save_file(tensors, str(tmp / "region.safetensors"))
            (tmp / "region.json").write_text(json.dumps(meta, indent=1))
        return Path(directory)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Region:
        """Read a region folder written by :meth:`save`, validated like a graft file: ``region.json`` maps tensor
        names to shapes, ``region.safetensors`` holds ``<name>::indices`` of those tensors (integers, sorted,
        unique, in range); any problem is one error naming the file."""
        from skillgraft.graft.graft_file import check_positions, read_tensors  # noqa: PLC0415
        from skillgraft.untrusted import read_json  # noqa: PLC0415

        directory = Path(directory)
        meta_path, weights = directory / "region.json", directory / "region.safetensors"
        if not meta_path.is_file():
            raise SkillgraftError(f"{directory}: no region.json")
        meta = read_json(meta_path, required=("shapes",), what="region file")
        shapes = meta["shapes"]
        if not isinstance(shapes, dict) or not all(
                isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)
                for v in shapes.values()):
            raise SkillgraftError(f"{meta_path}: field 'shapes' must map tensor names to lists of sizes")
        if not weights.is_file():
            raise SkillgraftError(f"{directory}: no region.safetensors")
        indices = {}
        for key, t in read_tensors(weights).items():
            name, sep, kind = key.rpartition("::")
            if not sep or kind != "indices" or name not in shapes:
                raise SkillgraftError(f"{weights}: unexpected tensor {key!r} (expected '<name>::indices' of a tensor "
                                      "in region.json 'shapes')")
            indices[name] = check_positions(weights, f"tensor {key!r}", t, None, numel_of(tuple(shapes[name])),
                                            f"tensor {name!r} of shape {shapes[name]}")
        size = sum(int(i.numel()) for i in indices.values())
        if meta.get("size", size) != size:
            raise SkillgraftError(f"{weights}: holds {size} positions; region.json 'size' declares {meta['size']}")
        return cls({k: tuple(v) for k, v in shapes.items()}, indices)

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict) -> Region:
        """A Region from the tensors and metadata of :meth:`state`."""
        idx = {k[: -len("::indices")]: v.long() for k, v in tensors.items() if k.endswith("::indices")}
        return cls({k: tuple(v) for k, v in meta["shapes"].items()}, idx)


def numel_of(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def compact_positions(idx: torch.Tensor) -> torch.Tensor:
    """Indices as int32 when they fit (4 bytes per coordinate), else int64."""
    return idx.to(torch.int32) if (idx.numel() == 0 or int(idx.max()) < 2**31 - 1) else idx


def _region_state(region: Region) -> dict:
    return {"shapes": {k: list(v) for k, v in region.shapes.items()}, "indices": dict(region.indices)}


def _region_of_state(state: dict) -> Region:
    return Region({k: tuple(v) for k, v in state["shapes"].items()}, dict(state["indices"]))


register_codec("__region__", Region, _region_state, _region_of_state)  # a region in a resumable state (resume.py)
