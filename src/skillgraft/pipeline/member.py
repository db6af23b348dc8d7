"""A Member: one fine-tuned model beside its pre-trained base, on one k-shot draw, with one explicit, typed state.

What it was opened from is fixed (:class:`MemberInputs`: the draw, the run's config, what reports and grafts record);
where its models are changes, and the member's :class:`MemberState` is the one record of it:

    loaded    θ_ft in memory; FT not scored yet
    scored    θ_ft in memory and FT's scores recorded (``probs`` / ``ft_metrics``)
    released  θ_ft dropped: ``ft`` is a :class:`FineTunedFiles` (its files, config and tokenizer) and its head (the
              carried tensors) stays
    lazy      released to files that hold exactly the loaded θ_ft (checked): a ``reads_files`` localizer and
              ``Graft.from_models`` read it tensor by tensor, as they did the model

θ_pre has a state too (:class:`PreState`): ``deferred`` for a lean pair (``load_pre`` set) until it loads. Every verb
of the graft path passes a member (``skillgraft graft`` is a :class:`~skillgraft.pipeline.workbench.Workbench` of
one); the loaders that open one are in :mod:`skillgraft.pipeline.opening`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from skillgraft.lazy import np
from skillgraft.lazy import torch

from skillgraft.data.sampling import FewShotData
from skillgraft.graft.graft_file import GraftMetadata
from skillgraft.pipeline.store import data_digest, precision_key
from skillgraft.train import FinetuneConfig
from skillgraft.train.run import RunConfig

if TYPE_CHECKING:
    from skillgraft.models.loading import ModelRef
    from skillgraft.models.scorer import Scorer


@dataclass(frozen=True)
class FineTunedFiles:
    """θ_ft released from memory: the checkpoint folder it was loaded from, read lazily (tensor by tensor, by
    the localizers that take a folder and by ``Graft.from_models``), and what a report shows of it."""

    path: Path
    base_model: str
    digest: str                          # scorer_digest of the model it was (part of every cache key)
    shapes: dict[str, tuple[int, ...]]   # its parameters' shapes (θ_pre loaded later is checked against them)
    config: object = None                # its model's config and tokenizer: what writing its head on another body
    tokenizer: object = None             # needs beside the carried tensors (a merge's classifiers), nothing read back

    def __fspath__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class MemberInputs:
    """What a member was opened from: the k-shot draw, the run's config, where its checkpoints are, and what reports
    and grafts record of them (fixed once opened; a verb narrowing the data makes new inputs with ``replace``)."""

    data: FewShotData
    ft_dir: Path
    run_config: RunConfig | None  # a skillgraft run's config.json; None for a checkpoint pair
    data_root: str | None = None  # the data root the examples were read from
    ft_seconds: float = 0.0
    data_files: list[Path] | None = None  # a user's data files (instead of a registered task's)
    labels_note: str = ""                 # how the labels were decided (user data)
    data_note: str = ""                   # which files / dataset splits were learned on and evaluated on
    graft_metadata: GraftMetadata = field(default_factory=GraftMetadata)  # recorded in every graft (a pair: its
    # task, data and models)
    pre_files: Path | None = None         # a pair: A's folder (lottery-ticket-zero restores θ_pre from it, checked)
    pre_ref: ModelRef | None = None       # θ_pre's model reference, resolved once when the member opened
    ft_ref: ModelRef | None = None        # a pair's θ_ft reference (None: a skillgraft run's saved model)

    @property
    def finetune_config(self) -> FinetuneConfig:
        """The fine-tuning settings of a skillgraft run; for a checkpoint pair (trained elsewhere) the defaults
        with trained embeddings (what it changed is unknown: every body tensor counts)."""
        if self.run_config is None:
            return FinetuneConfig.build({"freeze_embeddings": False}, where="checkpoint pair")
        return self.run_config.finetune

    @property
    def data_key(self) -> dict:
        """The k-shot draw and the content hash of the data files it was drawn from."""
        data = self.data
        if self.data_files is not None:
            from skillgraft.digest import file_digest  # noqa: PLC0415

            return {"task": data.task.name, "labels": list(data.task.labels), "k": data.k, "seed": data.seed,
                    "train_n": len(data.train), "test_n": len(data.test), "digest": file_digest(self.data_files)}
        return {"task": data.task.name, "k": data.k, "seed": data.seed, "test_n": len(data.test),
                "digest": data_digest(data.task, self.data_root)}


class MemberState(str, Enum):
    """Where a member's θ_ft is (a ``str``: ``MemberState.RELEASED == "released"``)."""

    LOADED = "loaded"      # in memory, FT not scored yet
    SCORED = "scored"      # in memory, FT's scores recorded
    RELEASED = "released"  # dropped: its checkpoint files, what was kept of it (head, config, tokenizer) beside
    LAZY = "lazy"          # dropped: files holding exactly θ_ft, read tensor by tensor

    @property
    def in_memory(self) -> bool:
        return self in (MemberState.LOADED, MemberState.SCORED)

    @property
    def released(self) -> bool:
        """θ_ft is not in memory (only its files)."""
        return not self.in_memory


class PreState(str, Enum):
    """Where θ_pre is: a member's (``deferred``: a lean pair's, not loaded yet) or the bench's."""

    DEFERRED = "deferred"
    LOADED = "loaded"
    RELEASED = "released"


@dataclass
class Member:
    """One fine-tuned model: its name, inputs, θ_ft (a scorer, or its files once released) and θ_pre's scorer (None
    while deferred: ``load_pre`` loads it), its states, FT's scores per evaluation set, its head (θ_ft's carried
    tensors, kept when θ_ft is released; set by the bench), how to read θ_ft back, and its graft once made.

    Its states (``state``, ``pre_state``) and what goes with them (``ft``, ``pre``, ``probs``, ``ft_metrics``,
    ``head``, ``graft``) are written by the :class:`~skillgraft.pipeline.workbench.Workbench`'s transitions only
    (and set once here, when the member is made); everything else reads them."""

    name: str
    inputs: MemberInputs
    ft: Scorer | FineTunedFiles
    pre: Scorer | None
    state: MemberState = MemberState.LOADED
    pre_state: PreState = PreState.LOADED  # DEFERRED when made without θ_pre (a lean pair: ``load_pre`` set)
    load_pre: Callable[[], Scorer] | None = field(default=None, repr=False)  # θ_pre, deferred (a lean pair)
    ft_files: Path | None = None  # a lean pair: the folder θ_ft was loaded from (read back lazily)
    probs: dict[str, np.ndarray] = field(default_factory=dict)  # FT's probabilities per evaluation set
    ft_metrics: dict[str, dict] = field(default_factory=dict)   # FT's metrics per evaluation set
    head: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    graft: object | None = None
    _identity: dict | None = field(default=None, repr=False)
    precision: str = field(default="fp32", init=False)  # the models' precision, read once they are made

    def __post_init__(self) -> None:
        if self.pre is None:
            self.pre_state = PreState.DEFERRED
        from skillgraft.models.placement import precision_of  # noqa: PLC0415

        loaded = self.ft if not isinstance(self.ft, FineTunedFiles) else self.pre
        if loaded is not None:
            self.precision = precision_of(loaded)

    @property
    def data(self) -> FewShotData:
        return self.inputs.data

    @property
    def task(self) -> str:
        return self.data.task.name

    @property
    def k(self) -> int:
        return self.data.k

    @property
    def seed(self) -> int:
        return self.data.seed

    @property
    def test(self):
        return self.data.test

    @property
    def released(self) -> bool:
        """θ_ft is not in memory (only its files): FT was scored before (``ft_metrics``, ``probs``); read from
        ``state``, the one record of it."""
        return self.state.released

    @property
    def total_parameters(self) -> int:
        """Parameters of the pre-trained model (``scorer.model``): the denominator of a sparsity in %."""
        return sum(p.numel() for p in self.pre.model.parameters())

    def identity(self) -> dict:
        """What determines everything learned from this member (part of every downstream cache key): the contents of
        θ_ft (with its head) and θ_pre, the data (the draw and the files' content digest) and, outside fp32, the
        precision the models compute in (a localization under bf16-mixed is another entry, as its fine-tuning is:
        ``pipeline.opening.finetune_key``; fp32's keys are as they always were)."""
        if self._identity is None:
            ft = self.ft.digest if isinstance(self.ft, FineTunedFiles) else scorer_digest(self.ft)
            self._identity = {"finetuned": ft, "pretrained": scorer_digest(self.pre), "mode": self.pre.mode,
                              "data": self.inputs.data_key, **precision_key(self)}
        return self._identity


def scorer_digest(scorer) -> str:
    """Content digest of a scorer: the base model's fingerprint plus its task head's exact values."""
    import hashlib  # noqa: PLC0415

    from skillgraft.graft.identity import cached_fingerprint  # noqa: PLC0415
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    h = hashlib.sha256(cached_fingerprint(scorer).encode())
    params = dict(scorer.named_parameters())
    for name in carried_names(scorer):
        h.update(name.encode())
        h.update(params[name].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
