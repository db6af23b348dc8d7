"""What a localizer is: it scores the graftable coordinates; the shared selection makes the Regions.

    regions(pre, ft, data, budgets, options) → {Budget: Region},   |region| = budget.size(|U|)
    run(pre, ft, data, options)              → Localization (regions for options.budgets, summary)

A score-based localizer implements only ``scores`` (one pass, whatever the number of budgets) and
inherits ``run``/``regions``, which call :func:`~skillgraft.graft.selection.select` once per budget.
The learned localizers (paper Eq. 3–4 and its relaxations) override ``run``: they run the engine
(:mod:`.engine`), whose selection happens inside the optimisation. Every localizer says, before any work,
what it cannot do (:meth:`Localizer.refuse`: sharded models, generative data).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from skillgraft.lazy import torch
from pydantic import Field

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.rows import Row
from skillgraft.graft.localizers.machinery.sharded import fsdp_launched, is_sharded
from skillgraft.graft.ranking import Ranking
from skillgraft.graft.region import Region
from skillgraft.graft.selection import Budget, Budgets, parse_budgets, region_universe, select, select_streamed
from skillgraft.keep.scoring import keep_search
from skillgraft.keep.search import KeepResult
from skillgraft.keep.spec import KeepSpec
from skillgraft.models.anatomy import Graftable
from skillgraft.spec import Spec


# A streamed selection keeps up to 2k candidates (16 bytes each): used while k ≤ |U| / STREAM_SHARE, where that pool
# stays well under the dense scores (4-8 bytes per coordinate) it replaces.
STREAM_SHARE = 32


class LocalizerOptions(Spec):
    """Options every localizer has: the universe U of a region and the budgets ``run`` selects."""

    graftable: Graftable = Field("body", description="the universe of a region: body | body+embeddings | all | bias")
    budgets: Budgets = Field(None, description=(
        "region sizes: fractions of the graftable parameters in (0, 1] or counts ≥ 1 (exact top-k)"))


@dataclass(frozen=True)
class BudgetScore:
    """One budget's region at a scored step: its score on the selection split, its size, its IoU with the region
    of the last scored step (None at the first), its fit share (score ÷ FT's on the same rows; None: unknown)."""

    acc: float
    size: int
    iou_prev: float | None = None
    fit: float | None = None


_SCORE_FIELDS = ("acc", "size", "iou_prev", "fit")


@dataclass
class ScoredStep(Row):
    """One scored step of a learned trajectory (the engine's log), read as its JSON columns: ``step``, ``budget``
    (a per-budget trajectory's), the relaxation's own fields, then ``<label>:acc`` / ``:size`` / ``:iou_prev`` per
    budget (spelt only by :meth:`columns` and read back by :meth:`from_columns`)."""

    step: int
    budget: str | None = None
    relaxation: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, BudgetScore] = field(default_factory=dict)  # by budget label

    def columns(self) -> dict[str, Any]:
        out = {"step": self.step, **({"budget": self.budget} if self.budget is not None else {}), **self.relaxation}
        for label, s in self.scores.items():
            out[label + ":acc"], out[label + ":size"] = s.acc, s.size
            if s.iou_prev is not None:
                out[label + ":iou_prev"] = s.iou_prev
            if s.fit is not None:
                out[label + ":fit"] = s.fit
        return out

    @classmethod
    def from_columns(cls, row: dict[str, Any], labels: Sequence[str]) -> ScoredStep:
        """The step :meth:`columns` wrote (a resumed trajectory's saved log); ``labels``: the plan's budgets'."""
        scored: dict[str, dict] = {}
        relaxation = {}
        for key, value in row.items():
            label, _, what = key.rpartition(":")
            if label in labels and what in _SCORE_FIELDS:
                scored.setdefault(label, {})[what] = value
            elif key not in ("step", "budget"):
                relaxation[key] = value
        return cls(row["step"], row.get("budget"), relaxation, {k: BudgetScore(**v) for k, v in scored.items()})


@dataclass
class Localization:
    """What every localizer's ``run`` returns: a Region per budget and what produced it (JSON-able ``summary``).

    Score-based localizers fill ``regions``, ``config`` and ``extra`` (their scoring time); the engine
    (:mod:`.engine`) also the best step and score per budget, the history of scored steps, γ_base's size, the
    step times, |C| when candidate-restricted, and on request the learned order and keep-target results.
    """

    regions: dict[Budget, Region]
    best_step: dict[Budget, int] = field(default_factory=dict)
    best_score: dict[Budget, float] = field(default_factory=dict)
    history: list[ScoredStep] = field(default_factory=list)  # the learned trajectory's scored steps
    base_size: int | None = None
    step_seconds: float | None = None  # median time of one step (forward/backward + update)
    config: dict = field(default_factory=dict)
    candidate_size: int | None = None  # |C| when candidate-restricted
    step_times: list[float] = field(default_factory=list)  # seconds of each step (benchmarks)
    ranking: Ranking | None = None    # the learned order at the last step (keep targets; see skillgraft.keep)
    keep: list[KeepResult] = field(default_factory=list)  # one per keep target
    extra: dict = field(default_factory=dict)  # more summary fields (e.g. score_seconds)
    resumed_seconds: float = 0.0  # time the stopped runs this one resumed from spent, first step to last save
    reference: dict | None = None  # FT's score on the selection rows ({"score", "of"}): the fit shares' denominator
    fit: dict = field(default_factory=dict)  # per budget key: FT's and the region's score, fit share, still rising
    stopped: list[dict] = field(default_factory=list)  # each trajectory's last step and why it stopped there

    @property
    def region(self) -> Region:
        return next(iter(self.regions.values()))

    @property
    def summary(self) -> dict:
        """JSON-able: budgets by their exact key (``Budget.parse(key)`` gives them back)."""
        out = {"budgets": [b.key for b in self.regions]}
        if self.best_step:
            out |= {"best_step": {b.key: s for b, s in self.best_step.items()},
                    "best_score": {b.key: s for b, s in self.best_score.items()}}
        if self.base_size is not None:
            out["base_size"] = self.base_size
        if self.step_seconds is not None:
            out |= {"step_seconds": self.step_seconds, "history": [h.columns() for h in self.history]}
        out["config"] = self.config
        if self.candidate_size is not None:
            out["candidate_size"] = self.candidate_size
        if self.keep:
            out["keep"] = [r.to_dict() for r in self.keep]
        if self.reference is not None:
            out["reference"] = self.reference
        if self.fit:
            out["fit"] = self.fit
        if self.stopped:
            out["stopped"] = self.stopped
        return out | self.extra


def examples_of(data: Any) -> tuple[list[Example], list[Example]]:
    """(train, dev) from ``data``: an object with ``.train`` (and ``.dev``), a list of examples, or None."""
    if data is None:
        return [], []
    if isinstance(data, (list, tuple)):
        return list(data), []
    if hasattr(data, "train"):
        return list(data.train), list(getattr(data, "dev", None) or [])
    raise SkillgraftError(f"localizer data must be examples or an object with .train/.dev, got {type(data).__name__}")


class Localizer:
    """Base of every localizer. Subclasses set ``Options`` and implement ``scores`` (or ``regions``)."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[Spec]] = LocalizerOptions
    summary: ClassVar[str] = ""
    # capabilities, declared by each localizer (read by the verbs, never listed outside it)
    reads_files: ClassVar[bool] = False  # reads θ_ft lazily from its checkpoint files (a lean pair may release it)
    sparsity_trajectories: ClassVar[bool] = False  # one trajectory per γ_base sparsity (the frontier learns each:
    #                                                :meth:`trajectory`)

    def options(self, options: Spec | dict | None = None) -> Spec:
        """``options`` validated as this localizer's Options (a dict, an instance, or None for defaults)."""
        if isinstance(options, self.Options):
            return options
        if options is not None and not isinstance(options, dict):
            raise SkillgraftError(f"localizer {self.name!r} takes {self.Options.__name__} options, got "
                                  f"{type(options).__name__}")
        return self.Options.build(options, where=f"localizer {self.name!r} options")

    def refuse(self, options: Spec, *, sharded: bool = False, generative: bool = False) -> None:
        """One clear line, before any work, for a run this localizer cannot do: a sharded (FSDP) model — a
        score-based localizer scores every coordinate in one process — or generative data when it needs labels
        (:meth:`needs_labels`). The learned localizers override it (they run sharded through the engine)."""
        if sharded:
            raise SkillgraftError(f"localizer {self.name!r} does not run sharded (FSDP): it scores every coordinate in "
                                  "one process; launch it without an FSDP config (learned and learned-adam run "
                                  "sharded)")
        why = self.needs_labels(options)
        if generative and why:
            raise SkillgraftError(f"localizer {self.name!r} needs class labels ({why}); generative (prompt → "
                                  "completion) data has none")

    def needs_labels(self, options: Spec) -> str | None:
        """Why this localizer needs class labels (None: it does not)."""
        return None

    def check(self, pre, options: Spec) -> None:
        """:meth:`refuse` for this run: is ``pre`` sharded (or the process launched with FSDP), is it generative."""
        self.refuse(options, sharded=is_sharded(pre) or fsdp_launched(),
                    generative=getattr(pre, "mode", None) == "generative")

    def scores(self, pre, ft, data, options: Spec, *, progress: bool = False) -> dict[str, torch.Tensor]:
        """One score per graftable coordinate (higher = more likely in the region), per tensor."""
        raise NotImplementedError(f"localizer {self.name!r} does not score coordinates")

    def score_stream(self, pre, ft, data, options: Spec, *, progress: bool = False
                     ) -> Iterator[tuple[str, torch.Tensor]] | None:
        """:meth:`scores` one tensor at a time, ``(name, scores)`` in universe order, when this localizer can give them
        so (then :meth:`run` never holds them all: :func:`~skillgraft.graft.selection.select_streamed`); None: it
        cannot (only :meth:`scores`)."""
        return None

    def run(self, pre, ft, data, options: Spec | dict | None = None, *, progress: bool = False) -> Localization:
        """Regions for ``options.budgets`` (scores computed once) and a summary (seconds)."""
        opts = self.options(options)
        budgets = list(dict.fromkeys(opts.budgets or []))
        if not budgets or any(b.rounding for b in budgets):
            raise SkillgraftError(f"localizer {self.name!r} needs budgets that are fractions or counts (the 'round' "
                                  "budget, γ rounded at 0.5, is the learned localizer's)")
        self.check(pre, opts)
        t0 = time.perf_counter()
        shapes = region_universe(pre, opts.graftable)
        total = sum(math.prod(s) for s in shapes.values())
        # small budgets: scores one tensor at a time, each tensor's own top-k kept (same regions as select's)
        stream = self.score_stream(pre, ft, data, opts, progress=progress) if \
            max(b.size(total) for b in budgets) <= total // STREAM_SHARE else None
        if stream is not None:
            regions = select_streamed(stream, budgets, shapes)
        else:
            scores = self.scores(pre, ft, data, opts, progress=progress)
            regions = {b: select(scores, b, shapes) for b in budgets}
        return Localization(regions, config=opts.to_dict(), extra={"score_seconds": time.perf_counter() - t0})

    @property
    def ranked(self) -> bool:
        """Whether this localizer orders the coordinates (scores, or its own :meth:`ranking`): keep targets need it."""
        return type(self).scores is not Localizer.scores or type(self).ranking is not Localizer.ranking

    def ranking(self, pre, ft, data, options: Spec | dict | None = None, *, progress: bool = False) -> Ranking:
        """The nested family of this localizer's regions: its scores' order (keep targets search it)."""
        opts = self.options(options)
        self.check_ranked()
        self.check(pre, opts)
        return Ranking.from_scores(self.scores(pre, ft, data, opts, progress=progress),
                                   region_universe(pre, opts.graftable))

    def check_ranked(self, options: Spec | dict | None = None) -> None:
        """One clear line, before any work, for a keep target on a localizer without an order (with ``options``:
        one the localizer gives no order with)."""
        if not self.ranked:
            raise SkillgraftError(f"localizer {self.name!r} gives no order of the coordinates (one trajectory per "
                                  "budget), so a keep target cannot be searched on it; use learned or a score-based "
                                  "localizer (movement, fish, …)")

    def keep(self, pre, ft, data, keep: KeepSpec | Sequence[float], options: Spec | dict | None = None, *,
             selection: list[Example] | None = None, progress: bool = False) -> list[KeepResult]:
        """The smallest region of :meth:`ranking` reaching each keep target on ``selection`` (default: the data's
        dev split), by the search of :mod:`skillgraft.keep.search`."""
        selection = examples_of(data)[1] if selection is None else selection
        return keep_search(pre, ft, self.ranking(pre, ft, data, options, progress=progress), selection, keep)

    def regions(self, pre, ft, data, budgets: Sequence[Budget | float | int | str], options: Spec | dict | None = None,
                *, progress: bool = False) -> dict[Budget, Region]:
        """A Region of exactly each budget's size, keyed by Budget (``budgets`` replace ``options.budgets``)."""
        opts = self.options(options).replace(budgets=parse_budgets(budgets) or None)
        return self.run(pre, ft, data, opts, progress=progress).regions

    def trajectory(self, pre, ft, data, options: Spec | dict | None = None, *, ranked: bool = False,
                   progress: bool = False):
        """One learned trajectory at ``options``' γ_base sparsity (its budgets' regions; with ``ranked`` its order
        too): a localizer declaring ``sparsity_trajectories`` implements it; the frontier runs it per sparsity."""
        raise SkillgraftError(f"localizer {self.name!r} learns no trajectory per sparsity (sparsity_trajectories)")

    def region(self, pre, ft, data, budget: Budget | float | int | str, options: Spec | dict | None = None,
               *, progress: bool = False) -> Region:
        """The Region of one budget."""
        return next(iter(self.regions(pre, ft, data, [budget], options, progress=progress).values()))

    def __repr__(self) -> str:
        return f"<localizer {self.name!r}: {self.summary}>"
