"""A long run's plan and its estimated time, said before the work (issue 80: a localizer of 100 steps at 43 s each
showed its 1 h 08 min only after the first step).

As transformers' ``Trainer`` prints its totals before training (examples, steps, batch size), the localizer and
fine-tuning loops say, before step 1, what they will do (:func:`plan_line`: rows, steps, batch, scoring), and, once
its second micro-batch is timed, about how long it will take (:func:`estimate_seconds`, :func:`estimate_line`). The
estimate is that micro-batch's time × the run's micro-batches, plus the scoring: the first scoring's time ×
the scorings to come where the loop scores before step 1 (the localizer), else its forwards counted as a third of a
training micro-batch per row (:func:`forward_equivalents`). A loaded machine's timing varies: it is an estimate.
Said on stderr, only where the loop shows progress. (A memory plan, issue 76, is its own function beside these.)
The first micro-batch is not what a step costs: it pays the run's one-time work (the allocator's first blocks, the
kernels' first choice, lazy initialisation) — on Gemma-3-270M fine-tuning on a 2-core CPU it took 2.60 s where every
later step took 1.2–1.3 s, so an estimate from it said 1 h 47 min for a 45-minute run. :class:`WarmTimer` times
the second.
"""

from __future__ import annotations

import sys

FORWARD_SHARE = 1 / 3  # a forward-only (scoring) micro-batch ≈ a third of a forward + backward one


def duration(seconds: float) -> str:
    """``43 s``, ``7 min 10 s``, ``1 h 08 min``: a time as a person reads it."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def estimate_seconds(micro_batch: float, training: int, scoring: float = 0.0,
                     scoring_seconds: float = 0.0) -> float:
    """Seconds for ``training`` forward + backward micro-batches from the time of a warm one, plus the scoring:
    ``scoring_seconds`` when timed (the loop's first scoring × the scorings to come), plus ``scoring`` forward work in
    training micro-batch equivalents (:func:`forward_equivalents`) where it was not."""
    return micro_batch * (training + scoring) + scoring_seconds


def forward_equivalents(rows: int, rows_per_micro_batch: int) -> float:
    """Forward-only work over ``rows`` rows in training micro-batches of ``rows_per_micro_batch`` rows (a forward ≈
    :data:`FORWARD_SHARE` of a forward + backward)."""
    return FORWARD_SHARE * rows / max(1, rows_per_micro_batch)


def plan_line(what: str, *, rows: int, steps: int, batch: int, micro_batches: int = 1, scored: int = 0,
              score_rows: int = 0, trajectories: int = 1) -> str:
    """What a loop will do, before step 1: ``localize: 100 steps of 16 of 64 rows (1 micro-batch each), scored 11
    times on 32 rows``."""
    runs = f"{trajectories} trajectories × " if trajectories > 1 else ""
    line = (f"{what}: {runs}{steps:,} steps of {batch:,} of {rows:,} rows "
            f"({micro_batches} micro-batch{'es' if micro_batches != 1 else ''} each)")
    if scored and score_rows:
        line += f", scored {scored} time{'s' if scored != 1 else ''} on {score_rows:,} rows"
    return line


def estimate_line(what: str, micro_batch: float, training: int, scoring: float = 0.0,
                  scoring_seconds: float = 0.0, scorings: int = 0, cap: str = "") -> str:
    """The estimate, once a warm micro-batch is timed: ``localize: about 9 min 10 s (estimated: second micro-batch
    9.70 s × 10 training micro-batches + 10 more scorings at 44.1 s, the first one's time)``. With ``cap`` (a loop
    that may stop before its last step, e.g. the fit schedule's) the time is an upper bound: ``localize: at most …
    (…); <cap>``."""
    total = estimate_seconds(micro_batch, training, scoring, scoring_seconds)
    parts = f"{training:,} training micro-batches"
    if scoring_seconds and scorings:
        parts += f" + {scorings} more scoring{'s' if scorings != 1 else ''} at {scoring_seconds / scorings:.1f} s, " \
                 "the first one's time"
    elif scoring:
        parts += f" + scoring (forwards: {scoring:.1f} micro-batch equivalents)"
    line = f"(estimated: second micro-batch {micro_batch:.2f} s × {parts})"
    if cap:
        return f"{what}: at most {duration(total)} {line}; {cap}"
    return f"{what}: about {duration(total)} {line}"


def say(line: str) -> None:
    """One line on stderr, above a progress bar if one is drawn."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    tqdm.write(line, file=sys.stderr)


class Estimate:
    """A loop's estimated time, said once a warm micro-batch is timed (the localization's: its training
    micro-batches and its scorings of ``rows_per_scoring`` rows each)."""

    def __init__(self, what: str, training: int, scorings: int, rows_per_scoring: int, rows_per_micro_batch: float,
                 cap: str = ""):
        self.what, self.training, self.scorings, self.cap = what, training, scorings, cap
        self.rows_per_scoring, self.rows_per_micro_batch = rows_per_scoring, rows_per_micro_batch
        self.scoring: float | None = None  # the first scoring's seconds (step 0), when it ran before step 1

    def __call__(self, micro_batch: float) -> None:
        if self.scoring is not None:  # that scoring is done: the others take about as long
            rest = max(0, self.scorings - 1)
            say(estimate_line(self.what, micro_batch, self.training, scoring_seconds=rest * self.scoring,
                              scorings=rest, cap=self.cap))
        else:
            forwards = forward_equivalents(self.scorings * self.rows_per_scoring, round(self.rows_per_micro_batch))
            say(estimate_line(self.what, micro_batch, self.training, scoring=forwards, cap=self.cap))


class WarmTimer:
    """Hands ``say`` the time of a loop's second micro-batch, the first warm one (the module's docstring: the first
    pays the run's one-time work). Called with each micro-batch's seconds while :attr:`waiting`; returns True once it
    has said it. A run of one micro-batch in all is over before an estimate could help: it says none."""

    def __init__(self, estimate):
        self.estimate, self.seen, self.waiting = estimate, 0, True  # estimate(seconds) says the line

    def __call__(self, seconds: float) -> bool:
        self.seen += 1
        if self.seen >= 2:
            self.waiting = False
            self.estimate(seconds)
        return not self.waiting
