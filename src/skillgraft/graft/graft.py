"""Graft: a Region plus the fine-tuned values on it, tied to the base model it was learned on.

Grafting (paper Eq. 1): θ = θ_pre + γ ⊙ (θ_ft − θ_pre), i.e. copy θ_ft on the region γ and keep θ_pre
elsewhere. A new task head (standard FT) does not exist in θ_pre, so it travels whole as a *carried*
tensor and is counted separately. Files: ``graft_config.json`` + ``graft.safetensors``
(:mod:`skillgraft.graft.graft_file`: packed positions and values, no dense masks, no pickle; validated
on load).

Applying writes the region's values into the model in place and keeps a backup of exactly the
coordinates it overwrote *with the model* (an attribute of its base body), so that ``revert`` is
bit-exact, a second graft on the same model is refused, and ``with graft.applied(model):`` restores
the model whatever happens in the block. Switching skills is a few scattered writes: the base model's
content fingerprint is cached per model and reused while none of its parameters changed (PyTorch's
in-place version counters; see :func:`cached_fingerprint`).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from skillgraft.lazy import no_grad, torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft_file import FORMAT, FORMAT_VERSION, GraftMetadata, read_graft_file, write_graft_file
from skillgraft.graft.identity import (_BASE, _REGISTRATIONS, _VERSION, _Base, _base, _body, _bumped, _named_parameters,
                                       _params_of, _quick_key, _same_objects, _state_key, _watch_registrations,
                                       base_dtype, cached_fingerprint, _pre_source, rounded_fingerprint)
from skillgraft.graft.region import Region, compact_positions
from skillgraft.graft.flat import _FLAT, flat_writes, forget_broken, relay
from skillgraft.graft.swap import (_APPLIED, _Applied, _capture, _eager, _fast_restore, _InFiles, _replay, _restore, _same,
                                  _Swap)
from skillgraft.io import atomic_dir, check_target
from skillgraft.models.anatomy import carried_names, check_compatible

__all__ = ["FORMAT_VERSION", "Graft", "active_graft"]

Outside = Literal["pre", "zero"]


def active_graft(scorer) -> Graft | None:
    """The graft currently applied to ``scorer`` (or to another view of its base body), if any."""
    rec = _body(scorer).__dict__.get(_APPLIED)
    return rec.graft if rec is not None else None


@dataclass
class Graft:
    """A region γ, the fine-tuned values on it, carried tensors, and the base model's identity."""

    region: Region
    values: dict[str, torch.Tensor]
    carried: dict[str, torch.Tensor] = field(default_factory=dict)
    base_model: str = ""
    base_fingerprint: str = ""
    metadata: GraftMetadata = field(default_factory=GraftMetadata)  # a dict given is validated into one
    source: Path | None = field(default=None, compare=False)  # the folder it was read from, for messages
    base_dtype: str = ""                  # the base's dtype when learned (torch.float32, torch.bfloat16)
    base_rounded: str = ""                # rounded_fingerprint of the base: the same base in another precision

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, GraftMetadata):
            self.metadata = GraftMetadata.build(dict(self.metadata or {}), where=f"{self._where()} metadata")
        self._check_values()

    def _check_values(self) -> None:
        for name, idx in self.region.indices.items():
            v = self.values.get(name)
            if v is None or v.numel() != idx.numel():
                raise SkillgraftError(f"{self._where()}: {idx.numel()} coordinates of {name!r} but "
                                      f"{'no' if v is None else v.numel()} values")

    def _where(self) -> str:
        return f"graft {self.source}" if self.source else "graft"

    def __repr__(self) -> str:
        return (f"Graft(size={self.size}, density={self.region.density:.3g}, carried={sorted(self.carried)}, "
                f"base={self.base_model!r} [{(self.base_fingerprint or 'no fingerprint')[:12]}]"
                + (f", source={str(self.source)!r}" if self.source else "") + ")")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_models(cls, pre, ft, region: Region, metadata: GraftMetadata | dict | None = None) -> Graft:
        """Take θ_ft's values on ``region`` (and the new head) from the fine-tuned scorer ``ft``, or from the
        folder it was saved to (read lazily: one tensor at a time, the region's values kept)."""
        if active_graft(pre) is not None:
            raise SkillgraftError("the pre-trained model has a graft applied; revert it before taking a graft "
                                  "against it (its fingerprint would be the grafted model's)")
        if isinstance(ft, (str, os.PathLike)):
            from skillgraft.graft.localizers.machinery.source import fine_tuned  # noqa: PLC0415

            heads = carried_names(pre)
            source = fine_tuned(ft, pre, list(dict.fromkeys([*region.shapes, *heads])))
            values = {name: source.rows(name).reshape(-1)[idx] for name, idx in region.indices.items()}
            carried = {name: source.rows(name) for name in heads}
        else:
            check_compatible(pre, ft, list(region.shapes))
            ft_params = dict(ft.named_parameters())
            values = {name: ft_params[name].detach().reshape(-1)[idx.to(ft_params[name].device)].cpu().clone()
                      for name, idx in region.indices.items()}
            carried = {name: ft_params[name].detach().cpu().clone() for name in carried_names(ft)}
        return cls(region, values, carried, getattr(pre, "base_model", ""), cached_fingerprint(pre),
                   metadata or GraftMetadata(), base_dtype=base_dtype(pre), base_rounded=rounded_fingerprint(pre))

    @property
    def size(self) -> int:
        return len(self.region)

    @property
    def carried_size(self) -> int:
        return sum(t.numel() for t in self.carried.values())

    # ------------------------------------------------------------------ apply / revert
    def _target(self, model):
        """``model`` as the graft names tensors: a skillgraft Scorer as it is; a plain transformers model (no
        ``mode``, a ``config``) seen through :class:`~skillgraft.models.named.PlainModel` when the graft's
        ``model.``-prefixed names are its own."""
        if hasattr(model, "mode") or not hasattr(model, "config"):  # a Scorer, or no transformers model
            return model
        from skillgraft.models.named import PlainModel  # noqa: PLC0415

        if isinstance(model, PlainModel):
            return model
        _watch_registrations()
        seen = self.__dict__.get("_seen_target")  # the answer for this model while nothing was registered since
        if (seen is not None and seen[0]() is model and seen[1] == _REGISTRATIONS[0] and seen[2] is self.region
                and seen[3] == tuple(self.carried)):
            return model.__dict__["_skillgraft_plain"] if seen[4] else model
        plain = self._plain(model)
        self.__dict__["_seen_target"] = (weakref.ref(model), _REGISTRATIONS[0], self.region, tuple(self.carried),
                                         plain is not model)
        return plain

    def _plain(self, model):
        from skillgraft.models.named import PlainModel  # noqa: PLC0415

        names = [*self.region.shapes, *self.carried]
        if not names or not all(n.startswith("model.") for n in names):
            if any(n.startswith("head.") for n in names):
                raise SkillgraftError(f"{self._where()} is a head-mode graft: its task head ({', '.join(self.carried)})"
                                      " is no part of a transformers model; apply it to skillgraft's Scorer "
                                      "(Scorer.from_pretrained), or export it (skillgraft export / apply --export)")
            return model
        own = dict(model.named_parameters())
        if names[0][len("model."):] not in own:
            return model
        plain = model.__dict__.get("_skillgraft_plain")  # reused: a new wrapper registers a module each time
        if plain is None or plain.carried != set(self.carried):
            plain = model.__dict__["_skillgraft_plain"] = PlainModel(model, self.carried)
        return plain

    def _check_target(self, scorer, force: bool) -> dict[str, torch.nn.Parameter]:
        """Everything ``apply`` needs, checked before anything is written; returns the named parameters."""
        return self._prepare(self._target(scorer), force)[0]

    def _prepare(self, scorer, force: bool) -> tuple[dict[str, torch.nn.Parameter], tuple, _Base | None]:
        body = _body(scorer)
        rec = body.__dict__.get(_APPLIED)
        if rec is None:
            forget_broken(body)
        if rec is not None:
            other = "this graft" if rec.graft is self else "another graft"
            raise SkillgraftError(f"{other} is already applied to this model; revert it first (or use "
                                  "`with graft.applied(model):`, which reverts on exit)")
        params = _named_parameters(scorer)
        for name, shape in self.region.shapes.items():
            if name not in params:
                raise SkillgraftError(f"{self._where()} covers tensor {name!r}, which the target model does not "
                                      "have; it was learned on a different architecture")
            if tuple(params[name].shape) != shape:
                raise SkillgraftError(f"{self._where()} expects {name!r} of shape {shape}, the target model has "
                                      f"{tuple(params[name].shape)}; it was learned on a different architecture")
        self._check_values()
        for name, t in self.carried.items():
            if name not in params or params[name].shape != t.shape:
                raise SkillgraftError(f"carried tensor {name!r} {tuple(t.shape)} of {self._where()} does not fit "
                                      "the target model (a head for a different number of labels?)")
        key = _state_key(body)
        if force:
            return params, key, _base(scorer, key, compute=False)
        if not self.base_fingerprint:
            raise SkillgraftError(f"{self._where()} records no base_fingerprint, so it cannot be checked against "
                                  "the model it is applied to; apply it anyway with force=True (CLI: --force)")
        base = _base(scorer, key, compute=True)
        if base.fingerprint != self.base_fingerprint and self._same_base_other_precision(scorer):
            return params, key, base
        if base.fingerprint != self.base_fingerprint:
            raise SkillgraftError(
                f"{self._where()} was learned on base model {self.base_model or '?'} with fingerprint "
                f"{self.base_fingerprint}; the target model's fingerprint is {base.fingerprint} (a different "
                "checkpoint, or changed weights). Apply it to its base model, or force it (--force)."
            )
        return params, key, base

    def _same_base_other_precision(self, scorer) -> bool:
        """The target is this graft's base loaded in another precision (fp32 ↔ bf16): same values rounded to bf16,
        another dtype. Said once per graft in one warning line; the values are written in the target's dtype."""
        here = base_dtype(scorer)
        if not self.base_rounded or not self.base_dtype or here == self.base_dtype:
            return False
        if rounded_fingerprint(scorer) != self.base_rounded:
            return False
        if not self.__dict__.get("_crossing_said"):
            import warnings  # noqa: PLC0415

            was, now = (d.replace("torch.float32", "fp32").replace("torch.bfloat16", "bf16")
                        for d in (self.base_dtype, here))
            warnings.warn(f"{self._where()} was learned on {self.base_model or 'its base'} in {was}; applied to the "
                          f"same base in {now} (its values rounded to {now})", stacklevel=4)
            self.__dict__["_crossing_said"] = True
        return True

    def _on_device(self, name: str, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensor ``name``'s indices and values on ``device`` (values in ``dtype``), copied once while unchanged."""
        cache = self.__dict__.setdefault("_device_copies", {})
        idx, v = self.region.indices[name], self.values[name]
        hit = cache.get((name, device, dtype))
        if hit is None or hit[0] is not idx or hit[2] is not v or (hit[1], hit[3]) != (idx._version, v._version):
            hit = (idx, idx._version, v, v._version, idx.to(device, copy=True), v.to(device, dtype, copy=True))
            cache[(name, device, dtype)] = hit
        return hit[4], hit[5]

    @no_grad
    def apply(self, scorer, *, outside: Outside = "pre", force: bool = False, pre_files=None):
        """Write the graft into ``scorer`` in place; :meth:`revert` restores the exact previous values.

        Every check (architecture, carried shapes, base fingerprint, no graft already applied) runs before
        the first write, and a failure while writing restores what was written, so a failed apply leaves
        the model as it was. Only the overwritten coordinates are backed up (plus carried tensors); on a
        base whose content is known unchanged since this graft's last apply, that backup is reused.
        ``outside="zero"`` sets graftable coordinates outside the region to 0 instead of θ_pre (the
        lottery-ticket-zero baseline); it backs up the whole universe tensors, unless ``pre_files`` (θ_pre's
        safetensors folder, e.g. the checkpoint it was loaded from) holds a tensor with the same dtype and
        values (checked in slices): that tensor is restored from the files on revert, so the backup costs no
        memory (the files must not change while the graft is applied). ``force`` skips the
        base-fingerprint check (never the shape checks).
        """
        if outside not in ("pre", "zero"):
            raise SkillgraftError(f"outside must be 'pre' or 'zero', got {outside!r}")
        target, scorer = scorer, self._target(scorer)  # a plain transformers model: seen as a Scorer names it
        if outside == "pre" and pre_files is None and self._fast_apply(scorer, force):
            return target
        params, key, base = self._prepare(scorer, force)
        files = _pre_source(pre_files) if outside == "zero" else None
        body = _body(scorer)
        # the backup of θ_pre on the region is for exactly these index tensors, unchanged, on this base content
        anchor = [self.region, *[(t, t._version) for t in self.region.indices.values()]]
        reuse = self.__dict__.get("_backup")
        if reuse is None or base is None or reuse[0] is not base.epoch or not _same(reuse[1], anchor):
            reuse = None
        saved: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
        try:
            if outside == "zero":
                for name in self.region.shapes:
                    p = params[name]
                    on_disk = _InFiles(files, name) if files is not None and name in files.shapes else None
                    keep = on_disk if on_disk is not None and on_disk.same_as(p.detach()) else p.detach().clone()
                    saved.append((p, None, keep))
                    p.detach().zero_()
            for name in self.region.indices:
                p = params[name]
                d = p.detach()
                here, values = self._on_device(name, d.device, d.dtype)
                if outside == "pre":
                    i, old = reuse[2][name] if reuse is not None else (here, None)
                    saved.append((p, i, old if old is not None else torch.take(d, i)))
                else:
                    i = here
                d.put_(i, values)
            for name, t in self.carried.items():
                p = params[name]
                saved.append((p, None, p.detach().clone()))
                p.detach().copy_(t.to(p.device, p.dtype))
        except BaseException:
            _restore(saved)
            raise
        rec = _Applied(self, saved, outside, checked=not force)
        if base is not None:
            rec.key, rec.base = _bumped(key, [p for p, _, _ in saved]), base
            if outside == "pre" and reuse is None:  # θ_pre on the region, valid while the base keeps this epoch
                self.__dict__["_backup"] = (base.epoch, anchor,
                                            {name: (i, old) for (_, i, old), name in zip(saved, self.region.indices)})
        body.__dict__[_APPLIED] = rec
        return target

    @no_grad
    def revert(self, scorer):
        """Restore the values ``scorer`` had before :meth:`apply` (bit-exact)."""
        target, scorer = scorer, self._target(scorer)
        body = _body(scorer)
        rec = body.__dict__.get(_APPLIED)
        if rec is None:
            raise SkillgraftError("no graft is applied to this model (nothing to revert)")
        if rec.graft is not self:
            raise SkillgraftError("another graft is applied to this model; revert it with that graft")
        if rec.fast is not None:
            self._fast_revert(body, rec)
            return target
        key = _state_key(body) if rec.key is not None else None
        _restore(rec.saved)
        del body.__dict__[_APPLIED]
        if key is not None and key == rec.key:
            # nothing else changed while applied: the body is bit-exactly the base it was (same epoch)
            known = _Base(_bumped(key, [p for p, _, _ in rec.saved]), rec.base.fingerprint, rec.base.epoch,
                          rec.base.samples)
            body.__dict__[_BASE] = known
            if rec.outside == "pre":
                self._plan_swap(body, rec, known)
        return target

    # ------------------------------------------------------------------ fast swaps
    def _anchor(self) -> tuple:
        tensors = (*self.region.indices.values(), *self.values.values(), *self.carried.values())
        return (self.region, self.values, self.carried, tensors, sum(map(_VERSION, tensors)))

    def _anchored(self, anchor: tuple) -> bool:
        """The graft's region, values and carried tensors are those the swap was prepared from, unchanged (the
        same objects at the same in-place versions: versions only grow, so their sum says it)."""
        region, values, carried, tensors, versions = anchor
        if region is not self.region or values is not self.values or carried is not self.carried:
            return False
        now = (*self.region.indices.values(), *self.values.values(), *self.carried.values())
        return _same_objects(now, tensors) and sum(map(_VERSION, now)) == versions

    def _plan_swap(self, body, rec: _Applied, known: _Base) -> None:
        """Prepare the fast swap from what this (slow) apply wrote, now that its revert restored ``known``: the
        touched parameters laid out in the body's flat buffers (:mod:`~skillgraft.graft.flat`), one index each."""
        _watch_registrations()
        n = len(self.region.indices)
        relay(body, [p for p, _, _ in rec.saved[:n]])
        layout = body.__dict__[_FLAT]
        writes = [(p, i, self._on_device(name, p.device, p.dtype)[1], old)
                  for (p, i, old), name in zip(rec.saved[:n], self.region.indices)]
        flat, loose, bumped = flat_writes(layout, writes)
        carried = [(p.detach(), self.carried[name].to(p.device, p.dtype), old)
                   for (p, _, old), name in zip(rec.saved[n:], self.carried)]
        plist = _params_of(body)
        counts: dict[int, int] = {}
        for p in plist:
            counts[id(p)] = counts.get(id(p), 0) + 1
        bump = sum(counts.get(id(p), 0) for p, _, _ in rec.saved)
        sw = _Swap(weakref.ref(body), known.epoch, [(p.detach(), *rest) for p, *rest in writes], carried,
                   self._anchor(), bump, rec.checked, layout=weakref.ref(layout), flat=flat, loose=loose,
                   bumped=bumped)
        _capture(sw)
        known.quick = (plist, _quick_key(plist))  # after the capture, which raised the targets' versions
        self.__dict__["_swap"] = sw

    def _fast_apply(self, scorer, force: bool) -> bool:
        """Apply through the prepared swap when the body still holds the base and the layout it was prepared on;
        else False."""
        sw = self.__dict__.get("_swap")
        if sw is None or not (force or sw.checked):
            return False
        body = _body(scorer)
        known = body.__dict__.get(_BASE)
        if (sw.body() is not body or _APPLIED in body.__dict__ or known is None or known.epoch is not sw.epoch
                or known.quick is None or sw.layout() is not body.__dict__.get(_FLAT) or not self._anchored(sw.anchor)):
            return False
        plist, (registrations, ptrs, version) = known.quick
        if _quick_key(plist) != known.quick[1]:
            return False
        try:
            if not _replay(sw, 0):
                _eager(sw, 0)
        except BaseException:
            _fast_restore(sw)
            raise
        body.__dict__[_APPLIED] = _Applied(self, [], "pre", fast=(known, (registrations, ptrs, version + sw.bump)))
        return True

    def _fast_revert(self, body, rec: _Applied) -> None:
        known, expected = rec.fast
        sw = self.__dict__["_swap"]
        _fast_restore(sw)
        del body.__dict__[_APPLIED]
        if known.quick is not None:  # what the key is if nothing but this swap wrote: any other write (while
            # applied or after) leaves the key above it, and the next apply or check finds the base changed
            known.quick = (known.quick[0], (*expected[:2], expected[2] + sw.bump))

    @contextlib.contextmanager
    def applied(self, scorer, *, outside: Outside = "pre", force: bool = False, pre_files=None) -> Iterator:
        """``with graft.applied(model) as m: ...`` — apply, yield the model, revert bit-exactly on any exit
        (``pre_files``: see :meth:`apply`)."""
        self.apply(scorer, outside=outside, force=force, pre_files=pre_files)
        try:
            yield scorer
        finally:
            self.revert(scorer)

    # ------------------------------------------------------------------ files
    def config(self) -> dict:
        """The ``graft_config.json`` fields (the weights' checksum is added when writing)."""
        crossing = {"base_dtype": self.base_dtype, "base_rounded_fingerprint": self.base_rounded}
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "base_model": self.base_model,
                "base_fingerprint": self.base_fingerprint or None, **{k: v for k, v in crossing.items() if v},
                "size": self.size,
                "density": self.region.density, "graftable_parameters": self.region.universe_size,
                "carried_parameters": self.carried_size, "carried": sorted(self.carried),
                "carried_shapes": {k: list(self.carried[k].shape) for k in sorted(self.carried)},
                "shapes": {k: list(v) for k, v in self.region.shapes.items()}, "metadata": self.metadata.to_dict()}

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
            tensors["indices"] = compact_positions(flat)
            tensors["values"] = (torch.cat([self.values[n].reshape(-1) for n in names]) if names
                                 else torch.empty(0)).contiguous()
        else:
            for name in names:
                tensors[f"{name}::indices"] = compact_positions(self.region.indices[name])
                tensors[f"{name}::values"] = self.values[name].reshape(-1).contiguous()
        for name, t in self.carried.items():
            tensors[f"carried::{name}"] = t.contiguous()
        return tensors

    def save_pretrained(self, directory: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write ``graft_config.json`` + ``graft.safetensors`` atomically (the folder appears complete).

        An existing ``directory`` is refused unless ``overwrite`` (then it is replaced whole).
        """
        return write_graft_file(directory, self._packed_tensors(), self.config(), overwrite=overwrite)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> Graft:
        """Read a graft folder, validated (:func:`~skillgraft.graft.graft_file.read_graft_file`)."""
        f = read_graft_file(directory)
        cfg = f.config
        return cls(Region(f.shapes, f.indices), f.values, f.carried, cfg.base_model, cfg.base_fingerprint or "",
                   cfg.metadata, Path(directory), base_dtype=cfg.base_dtype or "",
                   base_rounded=cfg.base_rounded_fingerprint or "")

    def export(self, base_scorer, directory: str | os.PathLike, *, force: bool = False,
               overwrite: bool = False) -> Path:
        """Write the grafted model as an ordinary Hugging Face checkpoint (+ scorer config), atomically.

        An existing ``directory`` is refused before any work unless ``overwrite`` (then it is replaced whole,
        only once the new checkpoint is complete): nothing already there is deleted by surprise.
        """
        check_target(directory, overwrite)
        with self.applied(base_scorer, force=force), atomic_dir(directory, overwrite=overwrite) as tmp:
            base_scorer.save_pretrained(tmp)
        return Path(directory)
