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
    source: str = ""           # the registered merge method that made it ("": the verb's own reference rows)
    stores: str = "checkpoint"  # what a task keeps to rebuild its model: "graft" (its graft file) or "checkpoint"

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
    source: str = ""  # the registered merge method that made it (not a column)

    @classmethod
    def of(cls, s: Scored, ft: Scored, stored: Mapping[str, int]) -> MergeRow:
        """The row of ``s``; ``stored``: the bytes each task stores with this method (every task, in order), unless
        the method says its own per-task bytes in ``s.info["bytes"]`` (the task-aware peers do)."""
        if not s.test and not s.dev:
            return cls(s.method, s.config, error=s.info.get("error", ""), source=s.source)
        own = s.info.get("bytes") or {}
        stored = {n: own.get(n, b) for n, b in stored.items()}
        info = {k: v for k, v in s.info.items() if k != "bytes"}
        return cls(s.method, s.config, s.scores(ft, stored), info, source=s.source)

    @property
    def refit(self) -> bool:
        return bool(self.info.get("refit_heads"))

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
                        f"{n}:normalized": t.normalized() if t.test is not None else None,
                        f"{n}:bytes": t.stored_bytes})
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
    on dev, the reported ones on test). The report reads what it says of a method from here (``summary``,
    ``stores``, ``grid_note``, ``legend``, :meth:`headline`, :meth:`headline_lines`), so a new method appears in it with
    no edit to the report; a row it marks ``info["writable"]`` (one merged model for every task, chosen on dev, with
    its ``reuse``) is a candidate for the merged model the output folder holds: the verb writes the candidate best on
    dev (:func:`pick_written`) and marks it ``info["written"]``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[Spec]] = Spec
    stores: ClassVar[str] = "checkpoint"  # what a task keeps to rebuild a merged model: "graft" or "checkpoint"
    grid_note: ClassVar[str] = ""  # its grid of settings chosen on dev, as the report's grid section names it
    legend: ClassVar[str] = ""  # what its settings mean (the report's closing notes)

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

    def headline(self, rows: list[MergeRow], options: Spec) -> dict:
        """merge.json's headline entries of this method from its ``rows`` (refitted ones too): by default its best
        row on test among those chosen on dev (all its test rows when none is). ``rows``: every row of the run (a
        method may compare itself with another's), each with the ``source`` that made it."""
        best = best_row([r for r in rows if r.source == self.name])
        if best is None:
            return {}
        return {f"best_{self.name}": f"{best.method} ({best.config})",
                f"best_{self.name}_mean_normalized": best.mean_normalized()}

    def headline_lines(self, headline: dict) -> list[str]:
        """The report's headline bullets of this method (from :meth:`headline`'s entries)."""
        best = headline.get(f"best_{self.name}")
        if best is None:
            return []
        return [f"- {self.name} ({self.summary}): best {best}: mean normalized accuracy "
                f"{fmt(headline[f'best_{self.name}_mean_normalized'])}"]


def fmt(x, pct: bool = False) -> str:
    """A score as the merge report prints it (``-`` for none)."""
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    return f"{100 * x:.1f}" if pct else f"{x:.4f}"


def best_row(rows: list[MergeRow], refit: bool = False) -> MergeRow | None:
    """The best test-scored row (by mean normalized accuracy) among the dev-chosen ones, else among all."""
    scored = [r for r in rows if r.on_test and r.refit == refit and r.mean_normalized() is not None]
    chosen = [r for r in scored if r.chosen_on_dev] or scored
    return max(chosen, key=lambda r: r.mean_normalized()) if chosen else None


def pick_written(results: list[Scored], ft: Scored) -> tuple[Scored | None, str]:
    """The merged model to write: of the rows its method marked ``info["writable"]`` (one model for every task,
    chosen on dev), the best by mean normalized dev score (the earlier one on a tie: the stitch before mergekit);
    marked ``info["written"]``. Also the reason, one line naming the runner-up; ``(None, why)`` when no candidate."""
    cands = [s for s in results if s.info.get("writable") and s.dev and s.reuse is not None]
    if not cands:
        return None, "no method that writes one merged model ran"
    dev = [s.mean_normalized(ft, "dev") for s in cands]
    dev = [-np.inf if np.isnan(v) else v for v in dev]
    i = int(np.argmax(dev))
    best = cands[i]
    best.info["written"] = True
    others = sorted(((v, s) for j, (v, s) in enumerate(zip(dev, cands)) if j != i), key=lambda x: -x[0])
    why = f"best mean normalized dev score of the one-model merges ({fmt(dev[i])}"
    why += f"; next: {others[0][1].method} ({others[0][1].config}) {fmt(others[0][0])})" if others else ")"
    return best, why
