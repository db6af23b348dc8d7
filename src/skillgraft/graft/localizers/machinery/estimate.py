"""A localization's plan said before step 1 and its estimated time once the first micro-batch is timed
(:mod:`skillgraft.eta`), for the engine (:mod:`.engine`)."""

from __future__ import annotations

import math

from skillgraft.graft.selection import Budget


def say_plan(plan, relax, budgets: list[Budget], train, select, batch_n: int, world: int, scored,
             label: str) -> Estimate:
    """Say the localization's plan (an :class:`~.engine.Plan` and its relaxation ``relax``) before step 1
    (:mod:`skillgraft.eta`) and return what says its estimated time once the first micro-batch is timed (with the
    first scoring's time, when it scores at step 0)."""
    from skillgraft.eta import plan_line, say  # noqa: PLC0415

    trajectories = len(plan.budgets) if plan.one_budget_each(relax) else 1
    per_step = math.ceil(math.ceil(batch_n / world) / plan.micro_batch)
    times = sum(1 for s in range(plan.steps + 1) if scored(s)) if select else 0
    what = label.split(" (")[0]
    say(plan_line(what, rows=len(train), steps=plan.steps, batch=batch_n, micro_batches=per_step, scored=times,
                  score_rows=len(select or []), trajectories=trajectories))
    rows = math.ceil(batch_n / world) / per_step  # rows of a training micro-batch
    return Estimate(what, trajectories * plan.steps * per_step, trajectories * times,
                    len(budgets) * math.ceil(len(select or []) / world), rows)


class Estimate:
    """The localization's estimated time, said once its first micro-batch is timed (:mod:`skillgraft.eta`)."""

    def __init__(self, what: str, training: int, scorings: int, rows_per_scoring: int, rows_per_micro_batch: float):
        self.what, self.training, self.scorings = what, training, scorings
        self.rows_per_scoring, self.rows_per_micro_batch = rows_per_scoring, rows_per_micro_batch
        self.scoring: float | None = None  # the first scoring's seconds (step 0), when it ran before step 1

    def __call__(self, first_micro_batch: float) -> None:
        from skillgraft.eta import estimate_line, forward_equivalents, say  # noqa: PLC0415

        if self.scoring is not None:  # that scoring is done: the others take about as long
            rest = max(0, self.scorings - 1)
            say(estimate_line(self.what, first_micro_batch, self.training, scoring_seconds=rest * self.scoring,
                              scorings=rest))
        else:
            forwards = forward_equivalents(self.scorings * self.rows_per_scoring, round(self.rows_per_micro_batch))
            say(estimate_line(self.what, first_micro_batch, self.training, scoring=forwards))
