"""What every merge method shares: :class:`MergeMethod` (typed options, rows scored per task), :class:`Scored` (one
merged model's scores per task, normalized in one place) and :class:`Bench`, what a method may ask of the models."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import torch

from skillgraft.evaluate.metrics import share_of_ft
from skillgraft.spec import Spec


Use = Callable[[str], contextlib.AbstractContextManager]  # task name → a context yielding the scorer to score


@dataclass
class Scored:
    """One merged model (a method and its settings) scored per task."""

    method: str
    config: str
    dev: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)   # written to merge.json's row
    body: object = field(default=None, repr=False, compare=False)  # what the row merged (the stitch's Graft)
    reuse: Callable[[], Use] | None = field(default=None, repr=False, compare=False)  # its models again (refit)

    def normalized(self, ft: Scored, split: str = "test") -> dict[str, float]:
        """Score ÷ the task's own fine-tuned score (:func:`~skillgraft.evaluate.metrics.share_of_ft`, as a graft
        report's ``share_of_ft``; NaN where FT has no score)."""
        mine, ref = getattr(self, split), getattr(ft, split)
        shares = {t: share_of_ft(mine[t], ref.get(t)) for t in mine}
        return {t: float("nan") if v is None else v for t, v in shares.items()}

    def mean_normalized(self, ft: Scored, split: str = "test") -> float:
        vals = list(self.normalized(ft, split).values())
        return float(np.mean(vals)) if vals else float("nan")


class Bench(Protocol):
    """What a merge method may ask of the models being merged (:class:`skillgraft.pipeline.workbench.Workbench`)."""

    names: list[str]          # the tasks, in the order given
    grafts: dict[str, object]  # each task's graft (skillgraft.graft.Graft)
    base: Mapping[str, torch.Tensor]  # θ_pre per scorer parameter name

    def score(self, use: Use, split: str, names: list[str] | None = None) -> dict[str, float]:
        """Each task's (of ``names``, default all) score on its ``split`` rows (dev or test) with the scorer
        ``use(name)`` yields."""

    def grafted(self, graft_of: Callable[[str], object]) -> Use:
        """Each task's θ_pre with ``graft_of(name)`` applied (reverted after)."""

    def on_body(self, merged: Mapping[str, torch.Tensor]) -> Use:
        """Each task's model with the merged body ``merged`` (mergekit's names) and the task's own head."""

    def pre_scorer(self):
        """θ_pre's scorer (one per bench)."""


def graft_file_bytes(graft) -> int:
    """Bytes of a graft as stored (graft.safetensors: positions, values, the carried head)."""
    import tempfile  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        path = graft.save_pretrained(Path(tmp) / "g")
        return (path / "graft.safetensors").stat().st_size


class MergeMethod:
    """Base of every merge method: ``Options`` (a typed spec whose fields are ``skillgraft merge`` options),
    ``on_model`` (called once per fine-tuned model while it is in memory) and ``rows`` (its merged models scored
    on dev, the reported ones on test)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[Spec]] = Spec

    def options(self, spec: Spec) -> Spec:
        """This method's options read from ``spec`` (a spec holding its fields, e.g. ``MergeSpec``)."""
        if isinstance(spec, self.Options) and type(spec) is self.Options:
            return spec
        return self.Options.build({k: getattr(spec, k) for k in self.Options.model_fields}, where=f"merge {self.name}")

    def active(self, options: Spec) -> bool:
        """Whether the options ask for any row of this method."""
        return True

    def start(self, bench: Bench, options: Spec, work: Path) -> None:
        """Before the first fine-tuned model loads (``work``: a scratch folder for this run)."""

    def on_model(self, bench: Bench, name: str, ft, options: Spec, work: Path) -> None:
        """While task ``name``'s fine-tuned scorer ``ft`` is in memory (it is released after every method saw it)."""

    def rows(self, bench: Bench, options: Spec, ft: Scored, work: Path) -> list[Scored]:
        raise NotImplementedError
