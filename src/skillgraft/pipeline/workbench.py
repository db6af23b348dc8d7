"""A Workbench: one θ_pre and N fine-tuned members, each a :class:`~skillgraft.pipeline.member.Member` with one
explicit, typed state (:class:`~skillgraft.pipeline.member.MemberState`), changed here only: :meth:`Workbench.record`
(FT's scores on a set: ``scored``), :meth:`Workbench.scored`, :meth:`Workbench.release` (θ_ft dropped to its checkpoint
files, its head, config and tokenizer kept) and :meth:`Workbench.release_to_files`
(``lazy``: files holding exactly θ_ft, read tensor by tensor); a member's graft is set by :meth:`Workbench.set_graft`.
θ_pre has a state too (:class:`~skillgraft.pipeline.member.PreState`): ``deferred`` for a lean pair until
:meth:`Workbench.load_pre`, then ``loaded``, or ``released`` when :meth:`Workbench.release_pre` dropped its tensors.

Every member's ``pre`` is a scorer of θ_pre whose parameters *are* the bench's θ_pre (shared, not copied; only a
task's own new head is its own), and a member is released before the next one loads, so whatever N is the bench
holds at most two models' weights: θ_pre once and one θ_ft. :meth:`Workbench.release_pre` drops θ_pre's tensors
(every member's θ_pre with them) and the next member's θ_pre gives them back (:meth:`share`), so a lean member —
θ_ft loaded, scored, released to its files, then θ_pre — holds one model's weights at a time (``skillgraft merge``;
bench/merge_memory.py). ``skillgraft graft`` is the same path with N = 1 (:meth:`Workbench.of`;
:func:`skillgraft.pipeline.variants.score_ft_first`). The bench carries its placement (:attr:`Workbench.runtime`,
given by the verb that made it: nothing ambient is copied) and what it loads is placed there by the loaders the verb
gave that runtime (:func:`~skillgraft.pipeline.opening.from_pair`'s deferred θ_pre, a member's ``loader``).
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from skillgraft.lazy import torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.identity import adopt_fingerprint, forget_fingerprint, known_fingerprint
from skillgraft.heap import collect_if_alive, release_freed_memory
from skillgraft.models.anatomy import carried_names
from skillgraft.pipeline.member import FineTunedFiles, Member, MemberState, PreState, scorer_digest
from skillgraft.pipeline.opening import readable_as

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
    """θ_pre once (``pre``), the members by name in the order added, and where they run (``runtime``)."""

    pre: object | None = None                                    # θ_pre's scorer (the first member's)
    pre_state: PreState = PreState.RELEASED                      # θ_pre's tensors in memory, or dropped
    members: dict[str, Member] = field(default_factory=dict)
    runtime: object | None = None  # a placement's Runtime, given by the verb (None: as loaded)

    @property
    def names(self) -> list[str]:
        return list(self.members)

    @property
    def states(self) -> Mapping[str, MemberState]:
        """Each member's state (read-only: the states change through :meth:`scored`, :meth:`release`, …)."""
        return MappingProxyType({n: m.state for n, m in self.members.items()})

    @property
    def heads(self) -> Mapping[str, dict[str, torch.Tensor]]:
        """Each θ_ft's carried tensors."""
        return MappingProxyType({n: m.head for n, m in self.members.items()})

    @property
    def grafts(self) -> Mapping[str, object]:
        """Each member's graft, once made (:meth:`set_graft`)."""
        return MappingProxyType({n: m.graft for n, m in self.members.items() if m.graft is not None})

    @property
    def base(self) -> dict[str, torch.Tensor]:
        """θ_pre per scorer parameter name."""
        return dict(self.pre.named_parameters())

    def pre_scorer(self):
        return self.pre

    @property
    def placement(self) -> str:
        """Where the bench's models run, as every report names it (one placement for every member: they share
        θ_pre's tensors): the loaded θ_pre's device and precision, else the bench's runtime."""
        from skillgraft.models.placement import describe_module  # noqa: PLC0415

        if self.pre is not None:
            return describe_module(self.pre)
        return self.runtime.describe() if self.runtime is not None else "nothing loaded"

    @contextlib.contextmanager
    def placed(self) -> Iterator[object | None]:
        """The bench's placement active for the block, for a caller whose loaders read the active placement (the
        bench's own loads are placed by the runtime their loaders were given)."""
        from skillgraft.models.placement import using  # noqa: PLC0415

        with using(self.runtime) as runtime:
            yield runtime

    def share(self, pre):
        """θ_pre of a new member: the first becomes the bench's θ_pre; a later one's parameters become the bench's
        (its own carried head aside), so θ_pre stays in memory once — when the bench's θ_pre is released, it takes
        this one's tensors back first. Pass as ``from_pair(share_pre=…)``."""
        if self.pre is None:
            self.pre = pre
            self.pre_state = PreState.LOADED
            return pre
        known = known_fingerprint(pre)  # e.g. read from its files (a lean load): its pages untouched
        if self.pre_state == PreState.RELEASED:
            mine = dict(pre.named_parameters(remove_duplicate=False))
            carried = set(carried_names(self.pre))
            for name, p in self.pre.named_parameters(remove_duplicate=False):
                if name not in carried:
                    p.data = mine[name].data  # the same Parameter objects every member's θ_pre holds
            del mine  # else its Parameters outlive share_parameters below, and collect_if_alive collects in vain
            forget_fingerprint(self.pre)
            if known is not None:
                adopt_fingerprint(self.pre, known)  # the same weights (carried heads are not fingerprinted)
            self.pre_state = PreState.LOADED
        keep = set(carried_names(pre))
        replaced = [weakref.ref(p) for n, p in pre.named_parameters() if n not in keep]
        share_parameters(pre, self.pre, keep)
        if known is not None:
            adopt_fingerprint(pre, known)
        collect_if_alive(*replaced)  # its own copies, freed by reference counting (else collected)
        release_freed_memory()
        return pre

    def pre_tensors(self) -> dict[str, torch.Tensor] | None:
        """θ_pre's weights by their names in its model (each task's own head aside), when loaded: a later member's
        θ_pre classifier is built on them (``from_pair(pre_tensors=…)``), so θ_pre is read from its files once."""
        if self.pre is None or self.pre_state != PreState.LOADED:
            return None
        carried = set(carried_names(self.pre))
        return {name: t for name, t in self.pre.model.state_dict().items() if "model." + name not in carried}

    def release_pre(self) -> None:
        """Drop θ_pre's tensors (shared by every member's θ_pre; each task's own head aside) until the next member's
        θ_pre gives them back (:meth:`share`): a lean member then loads, scores and releases its θ_ft with no θ_pre
        beside it (the weights of one model resident, whichever)."""
        if self.pre is None or self.pre_state == PreState.RELEASED:
            return
        carried = set(carried_names(self.pre))
        for name, p in self.pre.named_parameters(remove_duplicate=False):
            if name not in carried:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.pre_state = PreState.RELEASED
        gc.collect()
        release_freed_memory()

    @classmethod
    def of(cls, member: Member, runtime=None) -> Workbench:
        """A bench of one member (``skillgraft graft``: N = 1), under its own name, on ``runtime``."""
        bench = cls(runtime=runtime)
        bench.add(member.name, member)
        return bench

    def add(self, name: str, member: Member) -> Member:
        """``member`` on the bench as ``name``, in the state it was made in (``loaded``, or ``scored`` when FT's
        scores are recorded: :meth:`record`). The first member's θ_pre, when loaded, is the bench's (a later one's is
        shared through :meth:`share`)."""
        if self.pre is None and member.pre_state == PreState.LOADED:
            self.pre, self.pre_state = member.pre, PreState.LOADED
        params = dict(member.ft.named_parameters())
        member.name = name
        member.head = {n: params[n].detach().clone() for n in carried_names(member.ft)}
        self.members[name] = member
        return member

    def scored(self, name: str) -> None:
        """Member ``name``'s FT was scored (its θ_ft still in memory)."""
        member = self.members[name]
        if member.state == MemberState.LOADED:
            member.state = MemberState.SCORED

    @staticmethod
    def record(member: Member, set_name: str, metrics: dict, probs) -> None:
        """FT's metrics and probabilities on evaluation set ``set_name`` (the agreement reference; once θ_ft is
        released they are its row): a loaded member is ``scored`` from then on. A member on no bench (a recipe's)
        is recorded the same way."""
        member.probs[set_name] = probs
        member.ft_metrics[set_name] = dict(metrics)
        if member.state == MemberState.LOADED:
            member.state = MemberState.SCORED

    def set_graft(self, name: str, graft) -> None:
        """Member ``name``'s graft, once made (read back through :attr:`grafts`)."""
        self.members[name].graft = graft

    def load_pre(self, name: str) -> None:
        """Load member ``name``'s θ_pre when it was deferred (a lean pair: after its θ_ft was scored and released,
        so the two are never resident together; docs/scale.md), checked against θ_ft's tensors and shapes; the first
        one is the bench's θ_pre."""
        member = self.members[name]
        if member.pre_state == PreState.DEFERRED:
            member.pre = member.load_pre()  # placed by the runtime its loader was given (from_pair)
            member.load_pre, member.pre_state = None, PreState.LOADED
            ft = member.ft
            shapes = ft.shapes if member.released else {n: tuple(p.shape) for n, p in ft.named_parameters()}
            if shapes != {n: tuple(p.shape) for n, p in member.pre.named_parameters()}:
                raise SkillgraftError(f"pre-trained and fine-tuned models differ in their tensors or shapes "
                                      f"({member.pre.base_model} vs {ft.base_model})")
            release_freed_memory()  # what scoring FT and reading the checkpoints left in the heap, before the work
        if self.pre is None:
            self.pre, self.pre_state = member.pre, PreState.LOADED

    def release(self, name: str, folder: Path | None = None, *, state: MemberState = MemberState.RELEASED) -> None:
        """Drop member ``name``'s θ_ft from memory (what identifies it, its head and its scores are kept); ``folder``:
        where it is read back from (default its ``inputs.ft_dir``)."""
        member = self.members[name]
        if member.released:
            return
        ft = member.ft
        # its digest, part of every cache key, computed while θ_ft is in memory (a lean member's θ_pre loads later)
        digest = member.identity()["finetuned"] if member.pre_state == PreState.LOADED else scorer_digest(ft)
        member.ft = FineTunedFiles(folder or member.inputs.ft_dir, ft.base_model, digest,
                                   {n: tuple(p.shape) for n, p in ft.named_parameters()},
                                   getattr(ft.model, "config", None), ft.tokenizer)
        gone = weakref.ref(ft)
        del ft
        member.state = state
        collect_if_alive(gone)
        release_freed_memory()

    def release_to_files(self, name: str) -> bool:
        """Release member ``name``'s θ_ft when its checkpoint folder holds exactly it (safetensors with the loaded
        dtype and values, read back in slices: :func:`~skillgraft.pipeline.opening.readable_as`), so that what reads
        θ_ft from the files (a ``reads_files`` localizer, ``Graft.from_models``) computes what it computed on the
        model (state ``lazy``); returns whether it is released. Otherwise θ_ft stays loaded."""
        member = self.members[name]
        if member.released:
            return True
        folder = Path(member.ft_files or member.inputs.ft_dir)  # a lean pair's local folder (a hub id's snapshot)
        if not folder.is_dir() or not readable_as(member.ft, folder):
            return False
        self.release(name, folder, state=MemberState.LAZY)
        return True

