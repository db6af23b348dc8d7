"""What every merge method shares: :class:`MergeMethod` (typed options, rows scored per task), :class:`Scored` (one
merged model's scores per task), :class:`MergeRow` (its report row, typed; normalized accuracy derived once, by
:class:`~skillgraft.evaluate.rows.TaskScores`) and :class:`Bench`, what a method may ask of the models."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from skillgraft.lazy import np, torch

from skillgraft.evaluate.rows import Row, TaskScores
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

    def scores(self, ft: Scored, stored: Mapping[str, int] | None = None) -> dict[str, TaskScores]:
        """Each task's :class:`~skillgraft.evaluate.rows.TaskScores` beside its own fine-tuned model ``ft``."""
        names = [*self.dev, *(t for t in self.test if t not in self.dev)] if stored is None else list(stored)
        return {t: TaskScores(self.dev.get(t), self.test.get(t), ft.dev.get(t), ft.test.get(t),
                              (stored or {}).get(t, 0)) for t in names}

    def normalized(self, ft: Scored, split: str = "test") -> dict[str, float]:
        """Score ÷ the task's own fine-tuned score (:meth:`TaskScores.normalized`, the one derivation of share of
        FT; NaN where FT has no score), for the tasks scored on ``split``."""
        scores = self.scores(ft)
        return {t: scores[t].normalized(split) for t in getattr(self, split)}

    def mean_normalized(self, ft: Scored, split: str = "test") -> float:
        vals = list(self.normalized(ft, split).values())
        return float(np.mean(vals)) if vals else float("nan")


@dataclass
class MergeRow(Row):
    """A row of ``skillgraft merge``'s report: one merged model (method, settings) with each task's
    :class:`TaskScores`; its columns are merge.json's and results.csv's (``<task>:dev``, ``<task>:test``,
    ``<task>:normalized``, ``<task>:bytes`` per task). A grid point that failed holds only its ``error``."""

    method: str
    config: str
    tasks: dict[str, TaskScores] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, s: Scored, ft: Scored, stored: Mapping[str, int]) -> MergeRow:
        """The row of ``s``; ``stored``: the bytes each task stores with this method (every task, in order), unless
        the method says its own per-task bytes in ``s.info["bytes"]`` (the task-aware peers do)."""
        if not s.test and not s.dev:
            return cls(s.method, s.config, error=s.info.get("error", ""))
        own = s.info.get("bytes") or {}
        stored = {n: own.get(n, b) for n, b in stored.items()}
        info = {k: v for k, v in s.info.items() if k != "bytes"}
        return cls(s.method, s.config, s.scores(ft, stored), info)

    @property
    def on_test(self) -> bool:
        return any(t.test is not None for t in self.tasks.values())

    @property
    def chosen_on_dev(self) -> bool:
        return bool(self.info.get("chosen_on_dev"))

    def mean_normalized(self, split: str = "test") -> float | None:
        """Mean normalized score over the tasks scored on ``split`` (None when none is)."""
        vals = [t.normalized(split) for t in self.tasks.values() if getattr(t, split) is not None]
        return float(np.mean(vals)) if vals else None

    @property
    def mean_accuracy(self) -> float | None:
        vals = [t.test for t in self.tasks.values() if t.test is not None]
        return float(np.mean(vals)) if vals else None

    @property
    def bytes_per_task(self) -> float:
        return float(np.mean([t.stored_bytes for t in self.tasks.values()]))

    def columns(self) -> dict:
        if self.error is not None:
            return {"method": self.method, "config": self.config, "error": self.error}
        out = {"method": self.method, "config": self.config, "on_test": self.on_test,
               "chosen_on_dev": self.chosen_on_dev, "dev_mean_normalized": self.mean_normalized("dev"),
               "mean_accuracy": self.mean_accuracy, "mean_normalized": self.mean_normalized("test"),
               "bytes_per_task": self.bytes_per_task, **self.info}
        for n, t in self.tasks.items():
            out.update({f"{n}:dev": t.dev, f"{n}:test": t.test,
                        f"{n}:normalized": t.normalized() if t.test is not None else None, f"{n}:bytes": t.stored_bytes})
        return out


Use = Callable[[str], contextlib.AbstractContextManager]  # task name → a context yielding the scorer to score


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
