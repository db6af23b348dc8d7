"""What a graft knows of its base: the content fingerprint of a model's body (sampled coordinates of every tensor,
:func:`skillgraft.models.anatomy.fingerprint`), cached per body while none of its parameters changed (PyTorch's
in-place version counters, and a count of parameter/submodule registrations), read from memory or from files, in
the base's own or bf16-rounded precision. :mod:`skillgraft.graft.graft` checks it on every apply."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.models.anatomy import fingerprint, fingerprinted, sample_positions, tensor_sample

_BASE = "_skillgraft_base"                # attribute of the base body: what is known about its content (_Base)


def _body(scorer) -> torch.nn.Module:
    """The base model a graft is tied to: ``scorer.model`` (shared by every view of a multi-task model)."""
    return getattr(scorer, "model", scorer)


def _state_key(body: torch.nn.Module) -> tuple:
    """Identity, storage and in-place version counter of every parameter: any change to one changes the key.

    A plain walk of ``_modules`` / ``_parameters`` (4× faster than ``parameters()``; a tied tensor is
    listed once per owner, which is harmless in a key).
    """
    out: list[tuple[int, int, int]] = []
    stack = [body]
    while stack:
        mod = stack.pop()
        if mod._parameters:
            out.extend([(id(p), p.data_ptr(), p._version) for p in mod._parameters.values() if p is not None])
        if mod._modules:
            stack.extend([m for m in mod._modules.values() if m is not None])
    return tuple(out)


def _named_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``dict(module.named_parameters())`` (same names, order and de-duplication), without the generator stack."""
    out: dict[str, torch.nn.Parameter] = {}
    seen: set[int] = set()
    stack = [("", module)]
    while stack:
        prefix, mod = stack.pop()
        for name, p in mod._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out[prefix + name] = p
        if mod._modules:
            stack.extend(reversed([(f"{prefix}{k}.", m) for k, m in mod._modules.items() if m is not None]))
    return out


_REGISTRATIONS = [0]  # parameters or submodules registered on any module since import (nn.Module's global hooks)


def _registered(*_) -> None:
    _REGISTRATIONS[0] += 1


def _watch_registrations() -> None:
    """Count every parameter or submodule registration (``setattr``/``register_*``), once per process."""
    if not _REGISTRATIONS[1:]:
        from torch.nn.modules import module  # noqa: PLC0415

        module.register_module_parameter_registration_hook(_registered)
        module.register_module_module_registration_hook(_registered)
        _REGISTRATIONS.append(True)


_DATA_PTR, _VERSION = operator.methodcaller("data_ptr"), operator.attrgetter("_version")


def _same_objects(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _quick_key(plist: tuple) -> tuple:
    """A cheap stand-in for :func:`_state_key` over a known parameter list: registrations, storages and the
    sum of the in-place version counters (they only grow, so any in-place write raises the sum)."""
    return _REGISTRATIONS[0], tuple(map(_DATA_PTR, plist)), sum(map(_VERSION, plist))


def _params_of(body) -> tuple:
    """Every parameter of ``body`` (the walk of :func:`_state_key`)."""
    out: list = []
    stack = [body]
    while stack:
        mod = stack.pop()
        if mod._parameters:
            out.extend([p for p in mod._parameters.values() if p is not None])
        if mod._modules:
            stack.extend([m for m in mod._modules.values() if m is not None])
    return tuple(out)


def _bumped(key: tuple, changed) -> tuple:
    """``key`` with the entries of the ``changed`` parameters re-read (after writing only to those)."""
    now = {id(p): (id(p), p.data_ptr(), p._version) for p in changed}
    return tuple(now.get(entry[0], entry) for entry in key)


@dataclass
class _Base:
    """The body's content fingerprint, valid while its state key is ``key``.

    ``epoch`` is created when the fingerprint is computed and kept across apply → revert pairs that
    restore the body bit-exactly, so "same epoch" means "same content": a graft may then reuse the θ_pre
    values it backed up the last time instead of gathering them again. ``samples``: each tensor's sampled
    bytes with the (identity, storage, version) they were read at; a recomputation reads again only the
    tensors written since (a tensor never read, e.g. most of a memory-mapped embedding matrix, stays unread).
    """

    key: tuple
    fingerprint: str
    epoch: object = field(default_factory=object)
    samples: dict[str, tuple[tuple, bytes]] = field(default_factory=dict, repr=False)
    quick: tuple | None = field(default=None, repr=False)  # (parameters, _quick_key) valid with ``key``'s content


def _fingerprint(scorer, known: dict[str, tuple[tuple, bytes]], read=None) -> tuple[str, dict]:
    """``fingerprint(scorer)`` and the samples it hashed: a tensor unchanged since ``known`` is not read again,
    the others are read by ``read(name, p)`` (None: :func:`tensor_sample`)."""
    samples: dict[str, tuple[tuple, bytes]] = {}
    for name, p in fingerprinted(scorer):
        state = (id(p), p.data_ptr(), p._version)
        old = known.get(name)
        fresh = old is None or old[0] != state
        samples[name] = (state, (tensor_sample(p) if read is None else read(name, p)) if fresh else old[1])
    return fingerprint(scorer, {name: sample for name, (_, sample) in samples.items()}), samples


def _base(scorer, key: tuple, compute: bool) -> _Base | None:
    body = _body(scorer)
    known = body.__dict__.get(_BASE)
    if known is not None and known.key == key:
        return known
    if known is not None and known.quick is not None and _quick_key(known.quick[0]) == known.quick[1] \
            and _same_objects(_params_of(body), known.quick[0]):
        known.key = key  # only this graft's fast swaps wrote since the key was taken, each reverted bit-exactly
        return known
    if not compute:
        return None
    value, samples = _fingerprint(scorer, known.samples if known is not None else {})
    known = _Base(key, value, samples=samples)
    body.__dict__[_BASE] = known
    return known


def cached_fingerprint(scorer) -> str:
    """:func:`~skillgraft.models.anatomy.fingerprint` of ``scorer``, recomputed only when a parameter changed.

    The cache lives on the base body, keyed by each parameter's identity, storage and in-place version
    counter (``tensor._version``): an optimizer step, ``load_state_dict``, ``copy_``/``add_`` under
    ``no_grad``, a ``.to()`` or a replaced parameter all invalidate it. Writes through ``param.data``
    bypass PyTorch's version counter; after such a write call :func:`forget_fingerprint`.
    """
    return _base(scorer, _state_key(_body(scorer)), compute=True).fingerprint


def fingerprint_from_files(scorer, pre_files) -> str:
    """:func:`cached_fingerprint` of a model just loaded from the safetensors folder ``pre_files``, its samples read
    from the files (in slices) instead of the model's memory: a memory-mapped model's pages stay untouched (a
    fingerprint strided over a whole embedding matrix would otherwise make all of it resident). A tensor whose
    file entry differs in shape or dtype, or in its first value, is sampled from memory."""
    from skillgraft.graft.localizers.machinery.source import row_slices  # noqa: PLC0415

    source = _pre_source(pre_files)

    def read(name: str, p: torch.Tensor) -> bytes:
        full = "model." + name  # the scorer's name (a source names tensors as the scorer does)
        flat = p.detach().reshape(-1)
        if source.shapes.get(full) != tuple(p.shape) or flat.numel() == 0:
            return tensor_sample(p)
        positions, row = sample_positions(flat.numel()), math.prod(p.shape[1:])
        taken = []
        for start, rows in row_slices(source, full):
            values = rows.reshape(-1)
            if rows.dtype != p.dtype or (start == 0 and not torch.equal(values[:1], flat[:1].cpu())):
                return tensor_sample(p)
            first = start * row  # the slice holds flat positions [first, first + len(values))
            at = -(-first // positions.step) * positions.step - first
            end = min(positions.stop, first + len(values)) - first
            if at < end:
                taken.append(values[at:end:positions.step])
        return torch.cat(taken).float().contiguous().numpy().tobytes()

    body = _body(scorer)
    value, samples = _fingerprint(scorer, {}, read)
    body.__dict__[_BASE] = _Base(_state_key(body), value, samples=samples)
    return value


def rounded_fingerprint(scorer) -> str:
    """The base's identity in any precision: the fingerprint's (cached) samples rounded to bf16 as ``.to(bfloat16)``
    rounds, dtypes left out: the same checkpoint loaded in fp32 or bf16 gives the same value."""
    import hashlib  # noqa: PLC0415

    known, h = _base(scorer, _state_key(_body(scorer)), compute=True), hashlib.sha256()
    carried = getattr(scorer, "carried", ())
    for name, p in scorer.model.named_parameters():
        if "model." + name in carried:
            continue
        raw = known.samples[name][1] if name in known.samples else tensor_sample(p)
        values = torch.frombuffer(bytearray(raw), dtype=torch.float32) if raw else torch.empty(0)
        h.update(f"{name}|{tuple(p.shape)}|".encode())
        h.update(values.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:32]


def base_dtype(scorer) -> str:
    """The dtype of the base's weights (``torch.float32``, ``torch.bfloat16``; mixed: the first tensor's)."""
    return next((str(p.dtype) for p in _body(scorer).parameters()), "")


def known_fingerprint(scorer) -> str | None:
    """The fingerprint cached for ``scorer``'s current weights, without computing one (None: none cached)."""
    known = _base(scorer, _state_key(_body(scorer)), compute=False)
    return known.fingerprint if known is not None else None


def adopt_fingerprint(scorer, value: str) -> None:
    """Cache ``value`` as the fingerprint of ``scorer``'s current weights: its parameters were just pointed at
    tensors of a model whose fingerprint it is (no tensor read, so a memory-mapped model's pages stay untouched)."""
    body = _body(scorer)
    body.__dict__[_BASE] = _Base(_state_key(body), value)


def forget_fingerprint(scorer) -> None:
    """Drop what is cached about the base's content (needed only after writing weights through ``param.data``)."""
    _body(scorer).__dict__.pop(_BASE, None)


def _pre_source(pre_files):
    """θ_pre's checkpoint folder as a lazy source (``shapes``, ``rows``); a source object is used as it is."""
    if pre_files is None or hasattr(pre_files, "rows"):
        return pre_files
    from skillgraft.graft.localizers.machinery.source import SafetensorsFolder  # noqa: PLC0415

    try:
        return SafetensorsFolder(pre_files)
    except SkillgraftError as e:
        raise SkillgraftError(f"pre_files {pre_files}: {e}") from None
