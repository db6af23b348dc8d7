"""Training only part of a model: a region's coordinates (graft re-training) or chosen tensors (PEFT).

Graft re-training (paper Table 1): start from θ_pre and update only the coordinates of a learned
region γ (plus the new task head), i.e. θ = θ_pre + γ⊙u with u trained. This is :func:`finetune` with a
:class:`~skillgraft.train.callbacks.RegionMask`: gradients outside γ are zeroed and, after every
optimizer step, the coordinates outside are written back — weight decay, momentum or an L1 term can
never move them, and they stay bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skillgraft.data.loading import Example
from skillgraft.models.anatomy import is_carried
from skillgraft.train.callbacks import RegionMask
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.finetune import FinetuneResult, finetune

if TYPE_CHECKING:
    from skillgraft.models.scorer import Scorer


def finetune_masked(scorer: Scorer, train: list[Example], dev: list[Example] | None, config: FinetuneConfig, *,
                    region=None, trainable: Callable[[str], bool] | None = None, train_head: bool = True,
                    k: int | None = None, accelerator=None, progress: bool = True, callbacks=()) -> FinetuneResult:
    """Fine-tune ``scorer`` in place, changing only the allowed coordinates.

    Allowed: the coordinates of ``region`` (a Region, or anything with ``indices``: ``{name: flat
    positions}`` and ``shapes``); every coordinate of tensors with ``trainable(name)``; the new head
    (``head.*``) when ``train_head`` and not ``config.freeze_head``. All other parameters keep their
    exact starting values.
    ``trainable_parameters`` of the result counts the body coordinates that trained (head excluded).
    """
    whole = [n for n, _ in scorer.named_parameters()
             if (train_head and not config.freeze_head and is_carried(n)) or (trainable is not None and trainable(n))]
    mask = RegionMask(region.indices if region is not None else {}, whole,
                      shapes=region.shapes if region is not None else None)
    result = finetune(scorer, train, dev, config, k=k, accelerator=accelerator, progress=progress,
                      callbacks=[mask, *callbacks])
    result.trainable_parameters = sum(c for n, c in mask.trained.items() if not is_carried(n))
    return result
