"""Fine-tuning one Scorer: the training core (:func:`skillgraft.train.core.fit`) on one task.

Deterministic global batches from the seed (:func:`batch_schedule`), cross-entropy (+ optional L1 on
movement λ‖θ−θ_pre‖₁), clip, step; every ``eval_every`` steps the dev metric is computed and the best
weights are kept (F1 tasks by F1) and restored at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skillgraft.data.loading import Example
from skillgraft.train.callbacks import BestDev
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.core import TrainResult, fit
from skillgraft.train.samplers import SingleTask, batch_schedule

if TYPE_CHECKING:
    from skillgraft.models.scorer import Scorer

FinetuneResult = TrainResult

__all__ = ["FinetuneConfig", "FinetuneResult", "batch_schedule", "finetune"]


def finetune(scorer: Scorer, train: list[Example], dev: list[Example] | None, config: FinetuneConfig, *,
             k: int | None = None, accelerator=None, progress: bool = True, callbacks=()) -> FinetuneResult:
    """Train ``scorer`` in place on ``train`` (best dev checkpoint restored at the end).

    Steps: ``config.steps`` or 16·n·k capped (``k`` defaults to ``len(train) / n``). ``callbacks`` run
    after the best-dev tracker (e.g. ``AutoRGN()``, ``Snapshots(scorer, [0, 50])``, ``RegionMask(...)``).
    """
    task = scorer.task
    k = k or max(1, len(train) // task.num_labels)
    sampler = SingleTask(train, dev, batch_size=config.batch_size, steps=config.resolved_steps(task.num_labels, k),
                         seed=config.seed, name=task.name)
    return fit(scorer, sampler, config, [BestDev(), *callbacks], accelerator=accelerator, progress=progress,
               desc=f"finetune {task.name}")
