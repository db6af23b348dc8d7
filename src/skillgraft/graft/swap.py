"""What applying a graft writes into a model and how it is undone (:class:`~skillgraft.graft.graft.Graft`'s apply and
revert): the record an applied graft leaves on its base body (``_Applied``: every overwritten coordinate's old value,
or θ_pre's files holding it, ``_InFiles``), and a swap prepared for repeated skill switches (``_Swap``: the writes'
targets, indices, values and θ_pre backups on the device, as one write per flat buffer of the body
(:mod:`skillgraft.graft.flat`), optionally captured as CUDA graphs)."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field

from skillgraft.lazy import torch

from skillgraft.graft.identity import _Base

_APPLIED = "_skillgraft_applied"          # attribute of the base body: the record of the graft applied to it


@dataclass
class _Applied:
    """What ``apply`` overwrote: (parameter, flat positions or None for the whole tensor, old values)."""

    graft: object                # the Graft applied (skillgraft.graft.graft imports this module)
    saved: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]
    outside: str
    key: tuple | None = None     # state key right after applying (to re-validate the base on revert)
    base: _Base | None = None    # what was known about the base before applying
    fast: tuple | None = None    # a fast swap's (base, quick key expected right after applying)
    checked: bool = False        # the base fingerprint was checked (not forced)


@dataclass
class _Swap:
    """A graft's prepared swap on one body: every write's target, indices, values and θ_pre backup, on the device.

    Made by a revert that restored the base bit-exactly; used while the body keeps that base content (same
    epoch, same quick key) and the same flat layout: an apply is then one ``put_`` per flat buffer (the touched
    parameters are views of one buffer per device and dtype), one per region tensor outside the layout and one
    ``copy_`` per carried tensor, a revert the same, with no walk of the model and no checks beyond one pass over
    its storages and version counters."""

    body: weakref.ref
    epoch: object
    writes: list        # (detached parameter, indices, values, θ_pre values) per region tensor
    carried: list       # (detached parameter, the graft's tensor, θ_pre's) per carried tensor
    anchor: tuple       # the graft's own tensors at their versions
    bump: int           # how much one write to each target raises the quick key's version sum
    checked: bool       # the base fingerprint was checked (not forced) when it was made
    graph: object = None  # CUDA graphs of the writes (apply, revert), when captured
    layout: object = None  # weakref to the body's flat layout (skillgraft.graft.flat._Layout) when prepared
    flat: list = field(default_factory=list)    # (buffer's group, flat indices, values, θ_pre values) per buffer
    loose: list = field(default_factory=list)   # the writes of region tensors outside the layout, as ``writes``
    bumped: list = field(default_factory=list)  # parameters written through a buffer (versions raised by hand)


def _same(a: list, b: list) -> bool:
    """Same region object and the same index tensors at the same in-place versions."""
    return len(a) == len(b) and a[0] is b[0] and all(x[0] is y[0] and x[1] == y[1] for x, y in zip(a[1:], b[1:]))


class _InFiles:
    """A backup kept on disk: the tensor's θ_pre values are its copy in θ_pre's safetensors (checked equal)."""

    def __init__(self, source, name: str):
        self.source, self.name = source, name

    def same_as(self, d: torch.Tensor) -> bool:
        """Whether ``d`` equals the files' tensor (dtype and every value), read in slices."""
        if self.source.shapes.get(self.name) != tuple(d.shape):
            return False
        for start, part in self.slices():
            if part.dtype != d.dtype or not torch.equal(part, (d[start:start + len(part)] if d.dim() else d).cpu()):
                return False
        return True

    def copy_into(self, d: torch.Tensor) -> None:
        for start, part in self.slices():
            (d[start:start + len(part)] if d.dim() else d).copy_(part.to(d.device))

    def slices(self):
        from skillgraft.graft.localizers.machinery.source import row_slices  # noqa: PLC0415

        return row_slices(self.source, self.name)


def _restore(saved: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | _InFiles]]) -> None:
    for p, idx, old in reversed(saved):
        d = p.detach()  # shares storage and version counter with p
        if isinstance(old, _InFiles):
            old.copy_into(d)
        elif idx is None:
            d.copy_(old)
        else:
            d.put_(idx, old)


def _fast_restore(sw: _Swap) -> None:
    """Write θ_pre back on every coordinate a prepared swap writes (all of them: harmless where not yet written)."""
    if not _replay(sw, 1):
        _eager(sw, 1)


def _replay(sw: _Swap, which: int) -> bool:
    """Replay the captured CUDA graph of a swap's writes (0: apply, 1: revert); False when none is captured.
    A replay writes behind autograd's back, so the targets' version counters are raised as the eager writes do."""
    if sw.graph is None:
        return False
    sw.graph[which].replay()
    torch.autograd.graph.increment_version([d for d, *_ in sw.writes] + [d for d, *_ in sw.carried])
    return True


def _eager(sw: _Swap, which: int) -> None:
    """A swap's writes (0: apply, 1: revert): one ``put_`` per flat buffer, then the loose and carried tensors."""
    if sw.flat:
        buffers = sw.layout().buffers
        for key, i, v, old in sw.flat:
            buffers[key].put_(i, old if which else v)
        torch.autograd.graph.increment_version(sw.bumped)  # as a write through each parameter would
    for d, i, v, old in sw.loose:
        d.put_(i, old if which else v)
    for d, t, old in sw.carried:
        d.copy_(old if which else t)


def _capture(sw: _Swap) -> None:
    """Capture a swap's writes as two CUDA graphs (``SKILLGRAFT_SWAP_GRAPHS=1``, one CUDA device), checked once
    against the values they must write; any failure leaves the eager writes in place (not measured on a GPU)."""
    targets = [d for d, *_ in sw.writes] + [d for d, *_ in sw.carried]
    devices = {d.device for d in targets}
    if os.environ.get("SKILLGRAFT_SWAP_GRAPHS") != "1" or len(devices) != 1 or next(iter(devices)).type != "cuda":
        return
    device = next(iter(devices))
    versions = [d._version for d in targets]
    try:
        graphs, stream = (torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()), torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for which, graph in enumerate(graphs):
                with torch.cuda.graph(graph, stream=stream):
                    _eager(sw, which)
        torch.cuda.current_stream(device).wait_stream(stream)
        graphs[0].replay()
        ok = all(torch.equal(torch.take(d, i), v.to(d.dtype)) for d, i, v, _ in sw.writes) and \
            all(torch.equal(d, t) for d, t, _ in sw.carried)
        graphs[1].replay()
        ok = ok and all(torch.equal(torch.take(d, i), old) for d, i, _, old in sw.writes) and \
            all(torch.equal(d, old) for d, _, old in sw.carried)
        sw.graph = graphs if ok else None
    except Exception:  # noqa: BLE001 - a capture that fails falls back to the eager writes
        sw.graph = None
    if sw.graph is None:
        _eager(sw, 1)  # θ_pre back wherever a partial capture or replay wrote
    torch.autograd.graph.increment_version([d for d, v in zip(targets, versions) if d._version == v])
