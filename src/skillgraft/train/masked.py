"""Training only part of a model: a Region's coordinates (graft re-training) or chosen tensors (PEFT).

Graft re-training (paper Table 1): start from θ_pre and update only the coordinates of a learned
region γ (plus the new task head), i.e. θ = θ_pre + γ⊙u with u trained. This reuses :func:`finetune`
unchanged: a gradient hook multiplies each gradient by the 0/1 mask of what may move, and after every
optimizer step the coordinates that must stay are written back from a saved copy — so weight decay,
momentum or an L1 term can never move them, and they stay bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from skillgraft.data.loading import Example
from skillgraft.graft.region import Region
from skillgraft.models.anatomy import is_carried
from skillgraft.train.finetune import FinetuneConfig, FinetuneResult, finetune


def finetune_masked(scorer, train: list[Example], dev: list[Example] | None, config: FinetuneConfig, *,
                    region: Region | None = None, trainable: Callable[[str], bool] | None = None,
                    train_head: bool = True, k: int | None = None, accelerator=None,
                    progress: bool = True) -> FinetuneResult:
    """Fine-tune ``scorer`` in place, changing only the allowed coordinates.

    Allowed: the coordinates of ``region``; every coordinate of tensors with ``trainable(name)``; the new
    head (``head.*``) when ``train_head``. All other parameters keep their exact starting values.
    """
    params = dict(scorer.named_parameters())
    allowed: dict[str, torch.Tensor | bool] = {}
    masks = region.to_masks() if region is not None else {}
    for name, p in params.items():
        if (train_head and is_carried(name)) or (trainable is not None and trainable(name)):
            allowed[name] = True
        elif name in masks and masks[name].any():
            allowed[name] = masks[name].to(p.device)
        else:
            allowed[name] = False
    saved = {n: params[n].detach().clone() for n, a in allowed.items() if a is not True}
    hooks = []
    for name, a in allowed.items():
        if a is True:
            continue
        p = params[name]
        p.requires_grad_(True)  # finetune's freezing rules decide afterwards; a hook needs a grad-tracking leaf
        if a is False:
            hooks.append(p.register_hook(lambda g: torch.zeros_like(g)))
        else:
            hooks.append(p.register_hook(lambda g, m=a: g * m.to(g.dtype)))

    @torch.no_grad()
    def restore(*_args, **_kwargs) -> None:
        for name, old in saved.items():
            a = allowed[name]
            p = params[name]
            if a is False:
                p.copy_(old)
            else:
                p.copy_(torch.where(a, p, old))

    hooks.append(register_optimizer_step_post_hook(restore))
    trained: set[str] = set()
    hooks.append(register_optimizer_step_pre_hook(
        lambda opt, *_: trained.update(n for n, p in params.items() if p.requires_grad)))
    try:
        result = finetune(scorer, train, dev, config, k=k, accelerator=accelerator, progress=progress)
    finally:
        for h in hooks:
            h.remove()
    restore()
    # trainable_parameters: what actually moved-or-could-move in the body (the new head not counted)
    result.trainable_parameters = sum(
        (p.numel() if allowed[n] is True else int(allowed[n].sum()))
        for n, p in params.items() if allowed[n] is not False and not is_carried(n) and n in trained)
    return result
