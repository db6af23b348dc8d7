"""A long run's plan and its estimated time, said before the work (issue 80: a localizer of 100 steps at 43 s each
showed its 1 h 08 min only after the first step).

As transformers' ``Trainer`` prints its totals before training (examples, steps, batch size), the localizer and
fine-tuning loops say, before step 1, what they will do (:func:`plan_line`: rows, steps, batch, scoring), and, once
the first micro-batch is timed, about how long it will take (:func:`estimate_seconds`, :func:`estimate_line`). The
estimate is the first micro-batch's time × the micro-batches to come (a forward-only scoring micro-batch counted as
a third of a training one); the first micro-batch includes warm-up, so the estimate errs long. Said on stderr, only
where the loop shows progress. (A memory plan, issue 76, is its own function beside these.)
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


def estimate_seconds(first_micro_batch: float, training: int, scoring: int = 0) -> float:
    """Seconds for ``training`` forward + backward micro-batches and ``scoring`` forward-only ones, from the time of
    the first training micro-batch."""
    return first_micro_batch * (training + FORWARD_SHARE * scoring)


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


def estimate_line(what: str, first_micro_batch: float, training: int, scoring: int = 0) -> str:
    """The estimate, once the first micro-batch is timed: ``localize: about 1 h 08 min (first micro-batch 41.2 s ×
    100 training + 22 scoring micro-batches)``."""
    total = estimate_seconds(first_micro_batch, training, scoring)
    parts = f"{training:,} training" + (f" + {scoring:,} scoring" if scoring else "")
    return (f"{what}: about {duration(total)} (estimated: first micro-batch {first_micro_batch:.2f} s × {parts} "
            "micro-batches)")


def say(line: str) -> None:
    """One line on stderr, above a progress bar if one is drawn."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    tqdm.write(line, file=sys.stderr)
