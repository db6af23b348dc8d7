"""The paper's fine-tuning grid: batch size × learning rate, chosen on the dev split (Appendix A; LM-BFF).

The paper fine-tunes with SGD for 16·n·k steps at every (batch, lr) of {2, 4, 8} × {1e-2, 5e-3, 1e-3} and keeps
the run with the best dev score (its best dev checkpoint). :func:`choose` runs each grid point as a fine-tuning
stage of the store (:func:`~skillgraft.pipeline.opening.finetuned_run`, resumable step by step), reads each point's
best dev score and returns the chosen settings with every point's row. A **screened** grid (``steps`` set) runs
the points on a shorter schedule and returns the chosen (batch, lr) with the full schedule of ``finetune``, a
further stage of its own; an unscreened grid (the paper's) returns the chosen point itself, already in the store.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from skillgraft.data.spec import DataSpec
from skillgraft.untrusted import read_json
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline.store import Store
from skillgraft.pipeline.opening import finetuned_run, stored_run
from skillgraft.spec import COUNT_MAX, FLOAT_MAX, Spec
from skillgraft.train import FinetuneConfig
from skillgraft.train.run import drop_weights


class GridSpec(Spec):
    """The (batch size, learning rate) grid chosen on dev; defaults: the paper's (Appendix A)."""

    batch_sizes: list[Annotated[int, Field(ge=1, le=COUNT_MAX)]] = Field(
        default_factory=lambda: [2, 4, 8], min_length=1, description="batch sizes tried (paper: 2, 4, 8)")
    lrs: list[Annotated[float, Field(gt=0, le=FLOAT_MAX)]] = Field(
        default_factory=lambda: [1e-2, 5e-3, 1e-3], min_length=1,
        description="learning rates tried (paper: 1e-2, 5e-3, 1e-3)")
    steps: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "screen each point on this many steps, then fine-tune the chosen point on `finetune`'s full schedule "
        "(null: every point on the full schedule, the paper's)"))
    eval_every: int | None = Field(None, ge=0, le=COUNT_MAX, description=(
        "dev evaluation interval of a screened point (null: `finetune.eval_every`)"))
    test_limit: int | None = Field(64, ge=1, le=COUNT_MAX, description=(
        "test rows a screened point is scored on (printed beside its dev score, never used; the full-schedule "
        "points use the recipe's test_limit)"))

    @field_validator("batch_sizes", "lrs", mode="before")
    @classmethod
    def _one(cls, v):
        return [v] if isinstance(v, (int, float)) else v

    def points(self) -> list[tuple[int, float]]:
        """(batch size, lr) in grid order: batch sizes outer, learning rates inner (ties go to the first)."""
        return [(b, lr) for b in self.batch_sizes for lr in self.lrs]

    def point_config(self, finetune: FinetuneConfig, batch_size: int, lr: float) -> FinetuneConfig:
        """The fine-tuning of one grid point: ``finetune`` at this batch and lr (and the screen's steps)."""
        over: dict = {"batch_size": batch_size, "lr": lr}
        if self.steps is not None:
            over["steps"] = self.steps
            if self.eval_every is not None:
                over["eval_every"] = self.eval_every
        return FinetuneConfig.build({**finetune.to_dict(), **over}, where="grid")

    @staticmethod
    def full_config(finetune: FinetuneConfig, batch_size: int, lr: float) -> FinetuneConfig:
        """A point's fine-tuning on ``finetune``'s full schedule: what the grid returns when it chooses the point."""
        return FinetuneConfig.build({**finetune.to_dict(), "batch_size": batch_size, "lr": lr}, where="grid")

    def point_data(self, data: DataSpec) -> DataSpec:
        """A screened point's data: the same draw, scored on ``test_limit`` test rows."""
        if self.steps is None:
            return data
        return data.model_copy(update={"test_limit": self.test_limit})

    def point_row(self, run_dir, data: DataSpec, batch_size: int, lr: float) -> dict:
        """One grid point's report row (:func:`run_row`) from its run folder, screened or not as this grid says."""
        return run_row(run_dir, batch_size, lr, screen=self.steps is not None,
                       test_rows=self.point_data(data).test_limit)


def run_row(run_dir, batch_size: int, lr: float, *, screen: bool, test_rows: int | None) -> dict:
    """One fine-tuning run of the grid as a report row, from its ``metrics.json``."""
    m = read_json(run_dir / "metrics.json", what="fine-tuning metrics")
    test = m.get("test") or {}
    return {"task": m["task"], "seed": m["seed"], "k": m["k"], "batch_size": batch_size, "lr": lr,
            "steps": m["steps"], "screen": screen, "best_dev": m["best_dev"], "best_step": m["best_step"],
            "dev_history": [h.get("dev") for h in m.get("history", [])],
            "test_score": test.get("score", test.get("accuracy")), "test_rows": test_rows,
            "train_seconds": m.get("train_seconds"), "examples_per_second": m.get("train_examples_per_second"),
            "chosen": False}


def pick(finetune: FinetuneConfig, rows: list[dict]) -> FinetuneConfig:
    """Mark the best dev score (ties to the first point) and return ``finetune`` at its batch and lr."""
    best = max(range(len(rows)), key=lambda i: (rows[i]["best_dev"] if rows[i]["best_dev"] is not None
                                                 else float("-inf"), -i))
    rows[best]["chosen"] = True
    return GridSpec.full_config(finetune, rows[best]["batch_size"], rows[best]["lr"])


def choose(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, grid: GridSpec, *,
           progress: bool = False, log=None, runtime=None) -> tuple[FinetuneConfig, list[dict]]:
    """Run every grid point (from the store when done) and pick the best dev score, ties to the first point.

    Returns the chosen fine-tuning (``finetune`` at the chosen batch and lr; a screened grid keeps
    ``finetune``'s schedule) and one row per point: batch, lr, steps, best dev score and step, the dev
    history, the test score on the point's test rows (not used), training seconds and ``chosen``.
    """
    rows, runs = [], []
    for batch_size, lr in grid.points():
        config = grid.point_config(finetune, batch_size, lr)
        run_dir, _ = finetuned_run(store, model, grid.point_data(data), config, progress=progress, runtime=runtime)
        rows.append(grid.point_row(run_dir, data, batch_size, lr))
        runs.append((run_dir, config))
        if log is not None:
            r = rows[-1]
            log(f"grid {r['task']} seed {r['seed']}: batch {batch_size}, lr {lr:g}, {r['steps']} steps → dev "
                f"{r['best_dev']} (step {r['best_step']}), {r['train_seconds']} s")
    chosen = pick(finetune, rows)
    if grid.steps is not None:
        freed = sum(drop_weights(run_dir, dropped_note(config)) for run_dir, config in runs
                    if config.to_dict() != chosen.to_dict())  # (a screen as long as the schedule is the chosen run)
        if freed and log is not None:
            log(f"grid {data.task} seed {data.seed}: the screened points' weights dropped from the store "
                f"({freed / 2**30:.1f} GiB; their scores stay)")
    return chosen, rows


def dropped_note(config: FinetuneConfig) -> str:
    """What a screened grid point's run folder says in place of its dropped weights."""
    return (f"a screened grid point (batch {config.batch_size}, lr {config.lr:g}, {config.steps} steps): its dev "
            "scores chose the grid's point, then its weights were dropped (only a screen's scores are kept). Fine-tune "
            "the chosen point on the full schedule to get a model")


def stored_choice(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, grid: GridSpec,
                  runtime=None) -> tuple[FinetuneConfig, list[dict]] | None:
    """What :func:`choose` returns, read from the store without training (None: a grid point is not there)."""
    rows = []
    for batch_size, lr in grid.points():
        run_dir = stored_run(store, model, grid.point_data(data), grid.point_config(finetune, batch_size, lr), runtime)
        if run_dir is None:
            return None
        rows.append(grid.point_row(run_dir, data, batch_size, lr))
    return pick(finetune, rows), rows
