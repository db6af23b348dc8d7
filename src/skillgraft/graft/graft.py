"""Graft: a Region plus the fine-tuned values on it, tied to the base model it was learned on.

Grafting (paper Eq. 1): θ = θ_pre + γ ⊙ (θ_ft − θ_pre), i.e. copy θ_ft on the region γ and keep θ_pre
elsewhere. A new task head (standard FT) does not exist in θ_pre, so it travels whole as a *carried*
tensor and is counted separately. Files: ``graft_config.json`` + ``graft.safetensors`` (int32 indices and
values per tensor; no dense masks, no pickle).
"""

from __future__ import annotations

import json
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.region import Region, _compact
from skillgraft.io import atomic_dir, check_target
from skillgraft.models.anatomy import carried_names, check_compatible, fingerprint

FORMAT_VERSION = 1
CONFIG_FILE = "graft_config.json"
WEIGHTS_FILE = "graft.safetensors"
_BACKUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Graft:
    """A region γ, the fine-tuned values on it, carried tensors, and the base model's identity."""

    region: Region
    values: dict[str, torch.Tensor]
    carried: dict[str, torch.Tensor] = field(default_factory=dict)
    base_model: str = ""
    base_fingerprint: str = ""
    metadata: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_models(cls, pre, ft, region: Region, metadata: dict | None = None) -> Graft:
        """Take θ_ft's values on ``region`` (and the new head) from the fine-tuned scorer ``ft``."""
        check_compatible(pre, ft, list(region.shapes))
        ft_params = dict(ft.named_parameters())
        values = {name: ft_params[name].detach().reshape(-1)[idx.to(ft_params[name].device)].cpu().clone()
                  for name, idx in region.indices.items()}
        carried = {name: ft_params[name].detach().cpu().clone() for name in carried_names(ft)}
        return cls(region, values, carried, getattr(pre, "base_model", ""), fingerprint(pre), dict(metadata or {}))

    @property
    def size(self) -> int:
        return len(self.region)

    @property
    def carried_size(self) -> int:
        return sum(t.numel() for t in self.carried.values())

    # ------------------------------------------------------------------ apply / revert
    def _check_target(self, scorer, force: bool) -> dict[str, torch.nn.Parameter]:
        params = dict(scorer.named_parameters())
        for name, shape in self.region.shapes.items():
            if name not in params:
                raise SkillgraftError(f"this graft covers tensor {name!r}, which the target model does not have; "
                                      "it was learned on a different architecture")
            if tuple(params[name].shape) != shape:
                raise SkillgraftError(f"this graft expects {name!r} of shape {shape}, the target model has "
                                      f"{tuple(params[name].shape)}; it was learned on a different architecture")
        for name, t in self.carried.items():
            if name not in params or params[name].shape != t.shape:
                raise SkillgraftError(f"carried tensor {name!r} {tuple(t.shape)} does not fit the target model "
                                      "(a head for a different number of labels?)")
        if not force and self.base_fingerprint:
            got = fingerprint(scorer)
            if got != self.base_fingerprint:
                raise SkillgraftError(
                    f"this graft was learned on base model {self.base_model or '?'} with fingerprint "
                    f"{self.base_fingerprint}; the target model's fingerprint is {got} (a different checkpoint, or "
                    "a graft is already applied). Apply it to its base model, or force it (--force)."
                )
        return params

    @torch.no_grad()
    def apply(self, scorer, *, outside: Literal["pre", "zero"] = "pre", force: bool = False):
        """Write the graft into ``scorer`` in place; :meth:`revert` restores the exact previous values.

        ``outside="zero"`` sets graftable coordinates outside the region to 0 instead of θ_pre (the
        lottery-ticket-zero baseline).
        """
        if scorer in _BACKUPS:
            raise SkillgraftError("a graft is already applied to this model; revert it first")
        params = self._check_target(scorer, force)
        backup: dict[str, torch.Tensor] = {}
        for name in self.region.shapes if outside == "zero" else self.region.indices:
            p = params[name]
            backup[name] = p.detach().clone()
            flat = p.data.view(-1)
            if outside == "zero":
                flat.zero_()
            if name in self.region.indices:
                idx = self.region.indices[name].to(p.device)
                flat[idx] = self.values[name].to(device=p.device, dtype=p.dtype)
        for name, t in self.carried.items():
            backup[name] = params[name].detach().clone()
            params[name].data.copy_(t.to(params[name].device, params[name].dtype))
        _BACKUPS[scorer] = backup
        return scorer

    @torch.no_grad()
    def revert(self, scorer):
        """Restore the values ``scorer`` had before :meth:`apply` (bit-exact)."""
        backup = _BACKUPS.pop(scorer, None)
        if backup is None:
            raise SkillgraftError("no graft is applied to this model")
        params = dict(scorer.named_parameters())
        for name, old in backup.items():
            params[name].data.copy_(old)
        return scorer

    # ------------------------------------------------------------------ files
    def config(self) -> dict:
        return {"format": "skillgraft.graft", "format_version": FORMAT_VERSION, "base_model": self.base_model,
                "base_fingerprint": self.base_fingerprint, "size": self.size,
                "density": self.region.density, "graftable_parameters": self.region.universe_size,
                "carried_parameters": self.carried_size, "carried": sorted(self.carried),
                "shapes": {k: list(v) for k, v in self.region.shapes.items()}, "metadata": self.metadata}

    def _offsets(self) -> dict[str, int]:
        """Start of each universe tensor in the concatenation of all of them (``shapes`` order)."""
        out, start = {}, 0
        for name, shape in self.region.shapes.items():
            out[name] = start
            start += int(torch.Size(shape).numel())
        return out

    def _packed_tensors(self) -> dict[str, torch.Tensor]:
        """One flat ``indices`` tensor (positions in the concatenated universe) and one ``values`` tensor.

        Two entries instead of two per tensor keep the safetensors header to a few hundred bytes; a graft
        whose values mix dtypes falls back to per-tensor entries.
        """
        names = [n for n in self.region.shapes if n in self.region.indices]
        dtypes = {self.values[n].dtype for n in names}
        tensors: dict[str, torch.Tensor] = {}
        if len(dtypes) <= 1:
            offsets = self._offsets()
            flat = torch.cat([self.region.indices[n] + offsets[n] for n in names]) if names else \
                torch.empty(0, dtype=torch.long)
            tensors["indices"] = _compact(flat)
            tensors["values"] = (torch.cat([self.values[n].reshape(-1) for n in names]) if names
                                 else torch.empty(0)).contiguous()
        else:
            for name in names:
                tensors[f"{name}::indices"] = _compact(self.region.indices[name])
                tensors[f"{name}::values"] = self.values[name].contiguous()
        for name, t in self.carried.items():
            tensors[f"carried::{name}"] = t.contiguous()
        return tensors

    def save_pretrained(self, directory: str | os.PathLike, *, overwrite: bool = True) -> Path:
        """Write ``graft_config.json`` + ``graft.safetensors`` atomically (the folder appears complete)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        tensors = self._packed_tensors()
        with atomic_dir(directory, overwrite=overwrite) as tmp:
            save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "skillgraft.graft"})
            (tmp / CONFIG_FILE).write_text(json.dumps(self.config(), indent=2))
        return Path(directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> Graft:
        from safetensors.torch import load_file  # noqa: PLC0415

        directory = Path(directory)
        cfg_path, w_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        if not cfg_path.is_file() or not w_path.is_file():
            raise SkillgraftError(f"{directory}: not a graft folder (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
        try:
            cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise SkillgraftError(f"{cfg_path}: not valid JSON ({e.msg})") from None
        if cfg.get("format") != "skillgraft.graft":
            raise SkillgraftError(f"{cfg_path}: not a skillgraft graft config")
        if cfg.get("format_version", 0) > FORMAT_VERSION:
            raise SkillgraftError(f"{cfg_path}: format version {cfg['format_version']} is newer than this skillgraft")
        tensors = load_file(str(w_path))
        shapes = {k: tuple(v) for k, v in cfg["shapes"].items()}
        if "indices" in tensors:  # packed layout: positions in the concatenated universe
            indices, values = {}, {}
            flat, vals, start = tensors["indices"].long(), tensors["values"], 0
            for name, shape in shapes.items():
                end = start + int(torch.Size(shape).numel())
                lo, hi = torch.searchsorted(flat, torch.tensor([start, end])).tolist()
                if hi > lo:
                    indices[name], values[name] = flat[lo:hi] - start, vals[lo:hi]
                start = end
        else:
            indices = {k[: -len("::indices")]: v.long() for k, v in tensors.items() if k.endswith("::indices")}
            values = {k[: -len("::values")]: v for k, v in tensors.items() if k.endswith("::values")}
        carried = {k[len("carried::"):]: v for k, v in tensors.items() if k.startswith("carried::")}
        return cls(Region(shapes, indices), values, carried, cfg.get("base_model", ""),
                   cfg.get("base_fingerprint", ""), cfg.get("metadata", {}))

    def export(self, base_scorer, directory: str | os.PathLike, *, force: bool = False,
               overwrite: bool = False) -> Path:
        """Write the grafted model as an ordinary Hugging Face checkpoint (+ scorer config), atomically.

        An existing ``directory`` is refused before any work unless ``overwrite`` (then it is replaced whole,
        only once the new checkpoint is complete): nothing already there is deleted by surprise.
        """
        check_target(directory, overwrite)
        self.apply(base_scorer, force=force)
        try:
            with atomic_dir(directory, overwrite=overwrite) as tmp:
                base_scorer.save_pretrained(tmp)
        finally:
            self.revert(base_scorer)
        return Path(directory)

    # ------------------------------------------------------------------ composition
    def union(self, other: Graft, policy: Literal["error", "first", "average"] = "error") -> Graft:
        """Compose two grafts on the same base: their regions' union, with a declared overlap policy."""
        if self.base_fingerprint and other.base_fingerprint and self.base_fingerprint != other.base_fingerprint:
            raise SkillgraftError("grafts learned on different base models cannot be composed")
        region = self.region | other.region
        values = {}
        for name, idx in region.indices.items():
            out = torch.empty(idx.numel(), dtype=next(iter(self.values.values() or other.values.values())).dtype)
            filled = torch.zeros(idx.numel(), dtype=torch.bool)
            for g in (self, other):
                if name not in g.region.indices:
                    continue
                src = g.region.indices[name]
                pos = torch.searchsorted(idx, src)
                clash = filled[pos]
                if clash.any():
                    if policy == "error":
                        raise SkillgraftError(f"grafts overlap on {int(clash.sum())} coordinate(s) of {name!r}; "
                                              "choose an overlap policy: first or average")
                    if policy == "average":
                        out[pos[clash]] = (out[pos[clash]] + g.values[name][clash]) / 2
                    out[pos[~clash]] = g.values[name][~clash]
                else:
                    out[pos] = g.values[name]
                filled[pos] = True
            values[name] = out
        return Graft(region, values, {**other.carried, **self.carried}, self.base_model, self.base_fingerprint,
                     {"composed_of": [self.metadata, other.metadata], "overlap_policy": policy})
