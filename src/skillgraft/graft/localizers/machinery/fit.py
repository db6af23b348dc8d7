"""How well a learned region fits what it was asked to fit, and when a trajectory has fitted enough.

    fit share = acc(θ_pre + γ ⊙ Δ; selection rows) ÷ acc(θ_ft; selection rows)

The engine scores every budget's region on the selection rows (train, or train + dev) at its scored steps; this
module puts those scores beside the fine-tuned model's own score on the same rows (the *reference*) and decides:

* :class:`Schedule` — when a trajectory stops: ``fixed`` runs exactly ``steps`` (the paper's protocol, 100 steps);
  ``fit`` stops once every budget's best region reaches ``target`` of FT's score there, when no budget's best has
  improved for ``patience`` steps, or when no budget's region has changed at all since the trajectory's start for
  ``still`` steps (S has not left its start: its score cannot have moved either), with ``steps`` as the cap;
* :func:`fit_summary` — per budget: FT's and the region's score, the fit share, and whether it was still rising when
  the trajectory ended (its best in the last fifth of the scored steps beat everything before them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers.machinery.base import ScoredStep
from skillgraft.graft.selection import Budget
from skillgraft.spec import COUNT_MAX, OMITTED_AT_DEFAULT, Spec

RISING_TAIL = 0.2  # "still rising": the best of the last fifth of the scored steps beats every earlier one


@dataclass(frozen=True)
class Schedule:
    """When one trajectory stops (see the module doc). ``target`` and ``patience`` apply to ``fit`` only."""

    kind: str = "fixed"
    target: float = 0.99
    patience: int = 50
    still: int = 10

    def stop(self, history: Sequence[ScoredStep], budgets: Sequence[Budget], reference: float | None,
             step: int, unchanged_since: int | None = None) -> str | None:
        """Why the trajectory stops after scored ``step`` (None: it goes on); reads the scored history and
        ``unchanged_since``: the trajectory's first scored step when every region scored since is exactly the one
        scored there (None: one changed)."""
        if self.kind != "fit":
            return None
        peaks = [_peak(history, b) for b in budgets]
        if any(p is None for p in peaks):
            return None
        if reference and all(acc / reference >= self.target for acc, _ in peaks):
            return f"fit share ≥ {self.target:g} at step {step}"
        if all(step - at >= self.patience for _, at in peaks):
            return f"no budget improved for {self.patience} steps (step {step})"
        if self.still and unchanged_since is not None and step - unchanged_since >= self.still:
            return f"no region changed at all in {step - unchanged_since} steps from its start (step {step})"
        return None


class ScheduleOptions(Spec):
    """The schedule's options, shared by every learned localizer's typed options (a mixin; ``learned`` makes fit
    its default, the relaxed localizers keep fixed: see :meth:`_left_out` for what enters a store key)."""

    schedule: Literal["fixed", "fit"] = Field("fixed", description=(
        "when a trajectory stops: fixed = exactly `steps` (the paper's protocol); fit = once every budget's region "
        "reaches fit_target of FT's score on the selection rows, or no budget improved for `patience` steps, "
        "with `steps` as the cap"))
    fit_target: float = Field(0.99, gt=0, le=1, description=(
        "schedule fit: the fit share (region's score ÷ FT's on the selection rows) at which a trajectory stops"),
        json_schema_extra=OMITTED_AT_DEFAULT)
    patience: int = Field(50, ge=1, le=COUNT_MAX, description=(
        "schedule fit: stop when no budget's best score has improved for this many steps"),
        json_schema_extra=OMITTED_AT_DEFAULT)
    still: int = Field(10, ge=0, le=COUNT_MAX, description=(
        "schedule fit: stop when no budget's region has changed at all since the start for this many steps (S has "
        "not left its start, e.g. on an AdamW fine-tune's small Δ; 0: never)"))  # written: it changed fit's stops
    step_rows: Literal["train", "train+dev"] = Field("train", description=(
        "the rows each step's gradient is taken from (all of them a step, in micro-batches, up to batch_size): train "
        "(the paper's), or train+dev (every row of a train+dev selection, the rows the fit share is measured on)"),
        json_schema_extra=OMITTED_AT_DEFAULT)  # runs at the default keep their store keys

    def _left_out(self) -> set[str]:
        """A fixed schedule reads neither fit_target nor patience: they stay out of configs and store keys. The
        schedule itself is left out only where fixed is the default (the relaxed localizers, whose runs stored before
        it keep their keys); where fit is (``learned``), both are written, so a stored config reads back as itself
        and a fit run is never found under a fixed run's key."""
        out = super()._left_out()
        if self.schedule == "fixed":
            out |= {"fit_target", "patience", "still"}
            if type(self).model_fields["schedule"].default == "fixed":
                out.add("schedule")
        return out

    def step_examples(self, train: list, dev: list | None) -> list:
        """The rows of each step's gradient (``step_rows``); train+dev without dev rows is refused in one line."""
        if self.step_rows == "train":
            return train
        if not dev:
            raise SkillgraftError("step_rows 'train+dev' needs dev examples (data with .dev), or step_rows 'train'")
        return list(train) + list(dev)

    @property
    def stopping(self) -> Schedule:
        """The engine's :class:`Schedule` of these options."""
        return Schedule(self.schedule, self.fit_target, self.patience, self.still)


def _rows(history: Sequence[ScoredStep], budget: Budget) -> list[tuple[int, float]]:
    """(step, score) of ``budget``'s region at each scored step of its trajectory (in order)."""
    return [(h.step, h.scores[budget.label].acc) for h in history
            if budget.label in h.scores and (h.budget is None or h.budget == budget.label)]


def _peak(history: Sequence[ScoredStep], budget: Budget) -> tuple[float, int] | None:
    """The best score of ``budget`` so far and the first step that reached it (None: never scored)."""
    rows = _rows(history, budget)
    if not rows:
        return None
    best = max(acc for _, acc in rows)
    return best, next(step for step, acc in rows if acc == best)


def rising(history: Sequence[ScoredStep], budget: Budget) -> bool:
    """Whether ``budget``'s best score came in the last :data:`RISING_TAIL` of its scored steps and beat every
    earlier one: the trajectory ended while the region was still fitting better."""
    rows = _rows(history, budget)
    if len(rows) < 2:
        return False
    first, last = rows[0][0], rows[-1][0]
    cut = last - RISING_TAIL * (last - first)
    before = [acc for step, acc in rows if step < cut]
    tail = [acc for step, acc in rows if step >= cut]
    return bool(before) and bool(tail) and max(tail) > max(before)


def fit_summary(history: Sequence[ScoredStep], best_score: dict[Budget, float], reference: dict | None,
                rows: int) -> dict[str, dict]:
    """Per budget (by key): FT's score on the selection rows, the region's best there, the fit share, the last
    scored step and whether the score was still rising at the end. ``reference``: ``{"score", "of"}``."""
    ft = reference["score"] if reference else None
    out = {}
    for budget, score in best_score.items():
        scored = _rows(history, budget)
        out[budget.key] = {"ft": ft, "region": score, "share": (score / ft) if ft else None,
                           "rows": rows, "last_step": scored[-1][0] if scored else None,
                           "rising": rising(history, budget)}
    return out


def fit_apart(pre, ft, result, train: list, dev: list | None, micro_batch: int, accelerator=None) -> None:
    """Each budget's region and FT scored on the training rows and on the dev rows apart, into ``result.fit[key]
    ["apart"]``: the selection rows' two halves. FT fits the rows it was fine-tuned on, often all of them, so a fit
    share short of its target can be memorization: the region at FT's level on the dev rows, short of it on the
    training rows. Where the fit was measured on train + dev, in one process, with θ_ft loaded (not read from files).

    On the dev rows also the region's *agreement* with FT (the share of rows where it predicts FT's label; a label
    classifier's, not a generative scorer's): where FT is near chance there, a region can match its accuracy while
    answering otherwise on many rows, and it is the agreement that carries to test (bench/RESULTS.md, MRPC/13)."""
    from skillgraft.lazy import torch  # noqa: PLC0415
    from skillgraft.evaluate.predict import predict_probs  # noqa: PLC0415
    from skillgraft.graft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.localizers.machinery.batches import accuracy  # noqa: PLC0415
    from skillgraft.graft.localizers.machinery.sharded import is_sharded  # noqa: PLC0415

    if not (train and dev and result.fit and accelerator is None and isinstance(ft, torch.nn.Module)
            and not is_sharded(pre)):
        return
    halves = {"train": train, "dev": dev}
    ft_score = {k: accuracy(ft, rows, micro_batch) for k, rows in halves.items()}
    labels = getattr(ft, "mode", None) != "generative"  # a label per row to agree on

    def answers(scorer):
        return predict_probs(scorer, dev, batch_size=micro_batch).argmax(-1)

    ft_answers = answers(ft) if labels else None
    for budget, region in result.regions.items():
        if budget.key not in result.fit:
            continue
        with Graft.from_models(pre, ft, region, {}).applied(pre):
            mine = {k: accuracy(pre, rows, micro_batch) for k, rows in halves.items()}
            agreement = float((answers(pre) == ft_answers).mean()) if labels else None
        apart = {k: {"region": mine[k], "ft": ft_score[k], "rows": len(halves[k])} for k in halves}
        if agreement is not None:
            apart["dev"]["agreement"] = agreement
        result.fit[budget.key]["apart"] = apart


def answered_by(ft, accelerator=None):
    """``fit_to: ft``: a function giving rows back with each label replaced by FT's own answer (the argmax of its
    label probabilities), so that a region is fitted and selected toward FT's behaviour, not the gold labels. Needs a
    label classifier held in memory in one process (refused in one line otherwise, before any work)."""
    import dataclasses  # noqa: PLC0415

    from skillgraft.lazy import torch  # noqa: PLC0415
    from skillgraft.evaluate.predict import predict_probs  # noqa: PLC0415

    if not isinstance(ft, torch.nn.Module):
        raise SkillgraftError("fit_to 'ft' labels the rows by the fine-tuned model's answers: pass it loaded, not as "
                              "a folder")
    if getattr(ft, "mode", None) == "generative":
        raise SkillgraftError("fit_to 'ft' needs a label classifier: a generative scorer's targets are its "
                              "completions, not one label per row")
    if accelerator is not None:
        raise SkillgraftError("fit_to 'ft' runs in one process: FT's answers are taken before the localization")

    def answered(rows: list) -> list:
        probs = predict_probs(ft, rows) if rows else []
        return [dataclasses.replace(e, label=int(p.argmax())) for e, p in zip(rows, probs)]

    return answered


__all__ = ["Schedule", "ScheduleOptions", "answered_by", "fit_apart", "fit_summary", "rising"]
