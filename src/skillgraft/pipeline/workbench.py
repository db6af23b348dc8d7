"""A Workbench: one θ_pre and N fine-tuned models, each with an explicit state.

    loaded    θ_ft in memory (its Setup's ``ft`` is a Scorer): scored, localized, seen by the merge methods
    released  only its checkpoint files (``ft`` is a :class:`~skillgraft.pipeline.setup.FineTunedFiles`); its
              head (the carried tensors, a few KiB) stays, and :meth:`Workbench.finetuned` reads it back whole

Every member's ``pre`` is a scorer of θ_pre whose parameters *are* the bench's θ_pre (shared, not copied; only a
task's own new head is its own), and a member is released before the next one loads, so whatever N is the bench
holds at most two models' weights: θ_pre once and one θ_ft. θ_pre has a state too: :meth:`Workbench.release_pre`
drops its tensors (every member's θ_pre with them) and the next member's θ_pre gives them back (:meth:`share`),
so a lean member — θ_ft loaded, scored, released to its files, then θ_pre — holds one model's weights at a time
(``skillgraft merge``; bench/merge_memory.py). ``skillgraft graft`` is the same path with N = 1
(:meth:`Workbench.of`; :func:`skillgraft.pipeline.variants.score_ft_first`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from skillgraft.lazy import torch

from skillgraft.graft.graft import adopt_fingerprint, forget_fingerprint, known_fingerprint
from skillgraft.heap import release_freed_memory
from skillgraft.models.anatomy import carried_names
from skillgraft.pipeline.setup import FineTunedFiles, Setup, readable_as, scorer_digest

State = Literal["loaded", "released"]


def share_parameters(scorer, shared, keep: set[str]) -> int:
    """Point every parameter of ``scorer`` at ``shared``'s parameter of the same name and shape (except ``keep``,
    e.g. a task's own head); returns how many were shared. Tied weights stay tied (names are read with
    duplicates). The replaced tensors are freed once nothing else holds them."""
    theirs = dict(shared.named_parameters(remove_duplicate=False))
    n = 0
    for prefix, module in scorer.named_modules():
        for pname, p in list(module._parameters.items()):
            full = f"{prefix}.{pname}" if prefix else pname
            other = theirs.get(full)
            if p is None or other is None or full in keep or other.shape != p.shape or other is p:
                continue
            module._parameters[pname] = other
            n += 1
    return n


@dataclass
class Workbench:
    """θ_pre once (``pre``) and the members, by name, in the order added."""

    pre: object | None = None                                   # θ_pre's scorer (the first member's)
    pre_state: State = "released"                               # θ_pre's tensors in memory, or dropped
    members: dict[str, Setup] = field(default_factory=dict)
    states: dict[str, State] = field(default_factory=dict)
    heads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # each θ_ft's carried tensors
    loaders: dict[str, Callable] = field(default_factory=dict, repr=False)   # read a released θ_ft back
    grafts: dict[str, object] = field(default_factory=dict)     # each member's graft, once made

    @property
    def names(self) -> list[str]:
        return list(self.members)

    @property
    def base(self) -> dict[str, torch.Tensor]:
        """θ_pre per scorer parameter name."""
        return dict(self.pre.named_parameters())

    def pre_scorer(self):
        return self.pre

    @property
    def placement(self) -> str:
        """Where the bench's models run (one placement for every member: they share θ_pre's tensors)."""
        from skillgraft.models.placement import describe_module  # noqa: PLC0415

        return describe_module(self.pre) if self.pre is not None else "nothing loaded"

    def share(self, pre):
        """θ_pre of a new member: the first becomes the bench's θ_pre; a later one's parameters become the bench's
        (its own carried head aside), so θ_pre stays in memory once — when the bench's θ_pre is released, it takes
        this one's tensors back first. Pass as ``from_pair(share_pre=…)``."""
        if self.pre is None:
            self.pre = pre
            self.pre_state = "loaded"
            return pre
        known = known_fingerprint(pre)  # e.g. read from its files (a lean load): its pages untouched
        if self.pre_state == "released":
            mine = dict(pre.named_parameters(remove_duplicate=False))
            carried = set(carried_names(self.pre))
            for name, p in self.pre.named_parameters(remove_duplicate=False):
                if name not in carried:
                    p.data = mine[name].data  # the same Parameter objects every member's θ_pre holds
            forget_fingerprint(self.pre)
            if known is not None:
                adopt_fingerprint(self.pre, known)  # the same weights (carried heads are not fingerprinted)
            self.pre_state = "loaded"
        share_parameters(pre, self.pre, set(carried_names(pre)))
        if known is not None:
            adopt_fingerprint(pre, known)
        gc.collect()
        release_freed_memory()
        return pre

    def release_pre(self) -> None:
        """Drop θ_pre's tensors (shared by every member's θ_pre; each task's own head aside) until the next member's
        θ_pre gives them back (:meth:`share`): a lean member then loads, scores and releases its θ_ft with no θ_pre
        beside it (the weights of one model resident, whichever)."""
        if self.pre is None or self.pre_state == "released":
            return
        carried = set(carried_names(self.pre))
        for name, p in self.pre.named_parameters(remove_duplicate=False):
            if name not in carried:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.pre_state = "released"
        gc.collect()
        release_freed_memory()

    @classmethod
    def of(cls, setup: Setup, name: str | None = None) -> Workbench:
        """A bench of one member (``skillgraft graft``: N = 1), named after its task."""
        bench = cls()
        bench.add(name or setup.task, setup)
        return bench

    def add(self, name: str, setup: Setup, loader: Callable | None = None) -> Setup:
        """A loaded member; ``loader()`` reads its θ_ft back after it is released (:meth:`finetuned`). The first
        member's θ_pre, when loaded, is the bench's (a later one's is shared through :meth:`share`)."""
        if self.pre is None and setup.pre is not None:
            self.pre, self.pre_state = setup.pre, "loaded"
        self.members[name] = setup
        self.states[name] = "loaded"
        params = dict(setup.ft.named_parameters())
        self.heads[name] = {n: params[n].detach().clone() for n in carried_names(setup.ft)}
        if loader is not None:
            self.loaders[name] = loader
        return setup

    def load_pre(self, name: str) -> None:
        """Load member ``name``'s θ_pre when it was deferred (a lean pair: after its θ_ft was scored and released,
        so the two are never resident together; docs/scale.md); the first one is the bench's θ_pre."""
        setup = self.members[name]
        setup.load_deferred_pre()
        if self.pre is None:
            self.pre, self.pre_state = setup.pre, "loaded"

    def release(self, name: str, folder: Path | None = None) -> None:
        """Drop member ``name``'s θ_ft from memory (what identifies it, its head and its scores are kept); ``folder``:
        where it is read back from (default its ``ft_dir``)."""
        setup = self.members[name]
        if self.states[name] == "released":
            return
        ft = setup.ft
        # its digest, part of every cache key, computed while θ_ft is in memory (a lean member's θ_pre loads later)
        digest = setup.identity()["finetuned"] if setup.pre is not None else scorer_digest(ft)
        setup.ft = FineTunedFiles(folder or setup.ft_dir, ft.base_model, digest,
                                  {n: tuple(p.shape) for n, p in ft.named_parameters()})
        del ft
        self.states[name] = "released"
        gc.collect()
        release_freed_memory()

    def release_to_files(self, name: str) -> bool:
        """Release member ``name``'s θ_ft when its checkpoint folder holds exactly it (safetensors with the loaded
        dtype and values, read back in slices: :func:`~skillgraft.pipeline.setup.readable_as`), so that what reads
        θ_ft from the files (a ``reads_files`` localizer, ``Graft.from_models``) computes what it computed on the
        model; returns whether it is released. Otherwise θ_ft stays loaded."""
        if self.states[name] == "released":
            return True
        setup = self.members[name]
        folder = Path(setup.ft_files or setup.ft_dir)  # a lean pair's local folder (a hub id's snapshot)
        if not folder.is_dir() or not readable_as(setup.ft, folder):
            return False
        self.release(name, folder)
        return True

    @contextlib.contextmanager
    def finetuned(self, name: str) -> Iterator[object]:
        """Member ``name``'s θ_ft: the loaded one, or read back from its files for the block (then dropped)."""
        setup = self.members[name]
        if self.states[name] == "loaded":
            yield setup.ft
            return
        ft = self.loaders[name]()
        try:
            yield ft
        finally:
            del ft
            gc.collect()
            release_freed_memory()
