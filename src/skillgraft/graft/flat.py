"""The flat buffers behind a body's prepared swaps (as FSDP's flat parameters): the parameters a swap writes become
views of one 1-D buffer per (device, dtype), so a swap's writes are one ``put_`` per buffer at flat indices,
whatever the number of tensors it touches. Laying them out copies them once (their content, names and Parameter
objects unchanged; a parameter that shares its storage with another is left out and written on its own)."""

from __future__ import annotations

from skillgraft.lazy import torch

from skillgraft.graft.identity import _BASE, _params_of, _quick_key, _state_key
from skillgraft.graft.swap import _APPLIED

_FLAT = "_skillgraft_flat"                # attribute of the base body: its _Layout


class _Layout:
    """Per (device, dtype): a 1-D buffer; per laid-out parameter (by identity): its group and offset."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.members: dict[int, tuple[torch.nn.Parameter, tuple, int]] = {}

    def holds(self, p) -> bool:
        """``p`` is still the view of its buffer it was made (nothing replaced its data since)."""
        hit = self.members.get(id(p))
        if hit is None or hit[0] is not p:
            return False
        buf, off = self.buffers[hit[1]], hit[2]
        return p.dtype == buf.dtype and p.device == buf.device and p.is_contiguous() \
            and p.data_ptr() == buf.data_ptr() + off * buf.element_size()

    def intact(self) -> bool:
        return all(self.holds(p) for p, _, _ in self.members.values())

    def where(self, p) -> tuple[tuple, int] | None:
        """(group, offset) of ``p`` in the layout, or None when it is not laid out."""
        hit = self.members.get(id(p))
        return (hit[1], hit[2]) if hit is not None and self.holds(p) else None


def forget_broken(body) -> None:
    """Drop the body's layout when a parameter left it (``.to()``, a new ``.data``): its buffers are not kept
    alive by the layout alone; the next prepared swap lays the parameters out again."""
    layout = body.__dict__.get(_FLAT)
    if layout is not None and not layout.intact():
        del body.__dict__[_FLAT]


def _safely(check, *args) -> bool:
    try:
        return check(*args)
    except (RuntimeError, NotImplementedError):
        return False


def _group(p) -> tuple:
    return (p.device, p.dtype)


def _layable(p, shared: dict) -> bool:
    """A plain dense floating tensor that owns its whole storage alone (a tied weight is one Parameter: fine)."""
    d = p.detach()
    return (type(d) is torch.Tensor and d.layout == torch.strided and d.is_floating_point() and d.numel() > 0
            and d.device.type != "meta" and d.is_contiguous() and d.storage_offset() == 0
            and d.untyped_storage().nbytes() == d.numel() * d.element_size()
            and shared.get(d.untyped_storage().data_ptr(), 0) == 1)


def lay_out(body, params, every) -> dict[int, tuple[int, int]]:
    """Make the body's layout hold every parameter of ``params`` that can be laid out (``every``: all the body's
    parameters, to find storages shared between two of them). Content unchanged; a group already holding them all
    is kept as it is, others are rebuilt (one new buffer each, the old one freed). Returns the parameters moved:
    id → (old data_ptr, new data_ptr). Out of memory: the layout stays as it was (the swap writes per tensor)."""
    current = body.__dict__.get(_FLAT)
    if current is not None and not current.intact():
        current = None
    layout = current or _Layout()
    shared: dict[int, int] = {}
    for q in {id(q): q for q in every}.values():
        try:
            key = q.detach().untyped_storage().data_ptr() if q.device.type != "meta" else None
        except (RuntimeError, NotImplementedError):  # no plain storage (a lazy or subclassed parameter)
            key = None
        shared[key] = shared.get(key, 0) + 1
    wanted: dict[tuple, dict[int, torch.nn.Parameter]] = {}
    for p in params:
        if layout.holds(p) or _safely(_layable, p, shared):
            wanted.setdefault(_group(p), {})[id(p)] = p
    moved: dict[int, tuple[int, int]] = {}
    new = _Layout()
    new.buffers, new.members = dict(layout.buffers), dict(layout.members)
    for key, group in wanted.items():
        if all(layout.holds(p) for p in group.values()):
            continue
        members = {id(p): p for p, k, _ in layout.members.values() if k == key}
        members.update(group)
        order = list(members.values())
        try:
            buf = torch.empty(sum(p.numel() for p in order), dtype=key[1], device=key[0])
        except RuntimeError:  # out of memory: these tensors keep their own storage
            continue
        new.buffers[key], off = buf, 0
        for p in order:  # each parameter whole before the next; one that cannot move keeps its storage
            n, old = p.numel(), p.data_ptr()
            try:
                view = buf[off:off + n].view(p.shape)
                view.copy_(p.detach())
                p.data = view
            except RuntimeError:
                new.members.pop(id(p), None)
                continue
            finally:
                off += n
            new.members[id(p)] = (p, key, off - n)
            moved[id(p)] = (old, p.data_ptr())
    if moved or current is None:
        body.__dict__[_FLAT] = new
    return moved


def flat_writes(layout: _Layout, writes: list) -> tuple[list, list, list]:
    """``writes`` (parameter, indices, values, θ_pre values) per tensor as ``(flat, loose, bumped)``: per buffer of
    ``layout`` one ``(group, flat indices, values, θ_pre values)``; the writes of tensors outside it; the
    parameters the flat writes change (their version counters are raised by hand: the buffer has its own)."""
    parts: dict[tuple, list] = {}
    loose, bumped = [], []
    for p, i, v, old in writes:
        at = layout.where(p)
        if at is None:
            loose.append((p.detach(), i, v, old))
            continue
        parts.setdefault(at[0], []).append((i + at[1], v, old))
        bumped.append(p)
    flat = [(key, torch.cat([i for i, _, _ in ws]), torch.cat([v for _, v, _ in ws]), torch.cat([o for _, _, o in ws]))
            for key, ws in parts.items()]
    return flat, loose, bumped


def relay(body, params) -> None:
    """:func:`lay_out` ``params`` and keep what is known of the body's content valid (moving changes no value)."""
    if _APPLIED in body.__dict__:  # a graft's writes go through the layout until it is reverted
        return
    known = body.__dict__.get(_BASE)
    current = known is not None and known.key == _state_key(body)
    quick = known is not None and known.quick is not None and _quick_key(known.quick[0]) == known.quick[1]
    moved = lay_out(body, params, _params_of(body))
    if not moved or known is None:
        return
    if current:
        known.key = _state_key(body)
        for name, (state, sample) in list(known.samples.items()):
            hit = moved.get(state[0])
            if hit is not None and state[1] == hit[0]:
                known.samples[name] = ((state[0], hit[1], state[2]), sample)
    plist = _params_of(body)
    known.quick = (plist, _quick_key(plist)) if quick else None


def prepare_skills(model, grafts) -> dict[str, torch.Tensor]:
    """Set a model up for repeated swaps of ``grafts`` (RoutedSkills): the union of their region tensors laid out
    at once, and, for a carried tensor whose shape differs between skills (a head for another number of labels),
    one storage with room for the largest, the parameter a view of its start. Returns that room per parameter name
    (the model's own name): a skill's shape is a view of it at the same address, so switching the head's shape
    leaves the storages a prepared swap checks as they were. A graft that does not fit the model is left out."""
    from skillgraft.errors import SkillgraftError  # noqa: PLC0415
    from skillgraft.graft.identity import _body, _named_parameters  # noqa: PLC0415

    own = dict(model.named_parameters())
    touched, body, sizes = {}, None, {}
    for graft in grafts:
        try:
            target = graft._target(model)
        except SkillgraftError:
            continue
        named = _named_parameters(target)
        touched.update({id(named[n]): named[n] for n in graft.region.indices if n in named})
        body = _body(target)
        for name, t in graft.carried.items():
            p = own.get(name.removeprefix("model."))
            if p is not None and p.shape != t.shape:
                sizes[name.removeprefix("model.")] = max(sizes.get(name.removeprefix("model."), p.numel()), t.numel())
    room = {}
    for name, size in sizes.items():
        p = own[name]
        buf = torch.empty(size, dtype=p.dtype, device=p.device)
        buf[:p.numel()].copy_(p.detach().reshape(-1))
        p.data = buf[:p.numel()].view(p.shape)
        room[name] = buf
    if body is not None and touched:
        relay(body, list(touched.values()))
    return room
