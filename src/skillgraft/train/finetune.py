"""Fine-tuning a Scorer on Hugging Face Accelerate (one CPU, one GPU, or ``accelerate launch`` many).

The loop is short and linear (nanoGPT style): deterministic global batches from the seed, each process
takes its shard, cross-entropy (+ optional L1 on movement λ‖θ−θ_pre‖₁), clip, step; every
``eval_every`` steps the dev metric is computed and the best weights are kept (F1 tasks by F1).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.predict import evaluate
from skillgraft.models.freezing import freeze


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run (defaults: the paper's SGD recipe, tuned for MiniLM)."""

    optimizer: Literal["sgd", "adamw"] = field(default="sgd", metadata={"help": "sgd (paper default) or adamw"})
    lr: float = field(default=0.1, metadata={"help": "learning rate (SGD; MiniLM SST-2 sweep in bench/RESULTS.md)"})
    batch_size: int = field(default=8, metadata={"help": "examples per step (split over processes)"})
    weight_decay: float = field(default=1e-4, metadata={"help": "weight decay"})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping (None: off)"})
    steps: int | None = field(default=None, metadata={"help": "steps; None: 16·n·k capped at 16·n·512"})
    max_steps: int | None = field(default=400, metadata={"help": "cap on the default step count (None: none)"})
    eval_every: int = field(default=100, metadata={"help": "dev evaluation interval in steps (0: only at end)"})
    l1: float = field(default=0.0, metadata={"help": "λ of the L1 penalty λ‖θ−θ_pre‖₁ on movement"})
    freeze_embeddings: bool = field(default=True, metadata={"help": "freeze embeddings (paper default)"})
    freeze_head: bool = field(default=False, metadata={"help": "freeze the head (LM head in prompt mode)"})
    bias_only: bool = field(default=False, metadata={"help": "train only biases (BitFit)"})
    layers: list[int] | None = field(default=None, metadata={"help": "train only these blocks (+ head)"})
    seed: int = field(default=0, metadata={"help": "model seed (batch order, head init)"})
    eval_batch_size: int = field(default=64, metadata={"help": "batch size for evaluation"})

    def resolved_steps(self, num_labels: int, k: int) -> int:
        if self.steps is not None:
            return self.steps
        steps = 16 * num_labels * min(k, 512)
        return min(steps, self.max_steps) if self.max_steps else steps

    def validate(self) -> None:
        if self.optimizer not in ("sgd", "adamw"):
            raise SkillgraftError(f"optimizer must be 'sgd' or 'adamw', got {self.optimizer!r}")
        for name in ("lr", "batch_size"):
            if getattr(self, name) <= 0:
                raise SkillgraftError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.steps is not None and self.steps < 0:
            raise SkillgraftError(f"steps must be ≥ 0, got {self.steps}")
        if self.l1 < 0 or self.weight_decay < 0:
            raise SkillgraftError("l1 and weight_decay must be ≥ 0")


@dataclass
class FinetuneResult:
    scorer: torch.nn.Module
    steps: int
    best_step: int
    best_dev: float | None
    history: list[dict]
    seconds: float
    examples_per_second: float
    trainable_parameters: int


def batch_schedule(n: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """``[steps, batch_size]`` example indices: concatenated seeded permutations (epochs)."""
    rng = np.random.RandomState(seed)
    need = steps * batch_size
    epochs = [rng.permutation(n) for _ in range(math.ceil(need / n) if need else 0)]
    flat = np.concatenate(epochs) if epochs else np.zeros(0, dtype=np.int64)
    return flat[:need].reshape(steps, batch_size)


def freeze_unused(scorer, examples: list[Example], trainable: dict[str, bool] | None = None) -> list[str]:
    """Freeze parameters the scorer's output does not depend on (e.g. BERT's pooler under mean pooling).

    Found by one probe backward pass; keeps DDP and weight decay from touching parameters that never
    receive a gradient. Returns the names frozen.
    """
    batch = scorer.collate(examples)
    batch.pop("labels")
    batch = {k: v.to(scorer.device) for k, v in batch.items()}
    scorer.zero_grad(set_to_none=True)
    scorer(**batch).float().sum().backward()
    unused = []
    for name, p in scorer.named_parameters():
        if p.requires_grad and p.grad is None:
            p.requires_grad_(False)
            unused.append(name)
            if trainable is not None:
                trainable[name] = False
    scorer.zero_grad(set_to_none=True)
    return unused


def finetune(scorer, train: list[Example], dev: list[Example] | None, config: FinetuneConfig, *, k: int | None = None,
             accelerator=None, progress: bool = True, step_hook=None) -> FinetuneResult:
    """Train ``scorer`` in place on ``train`` (best dev checkpoint restored at the end).

    ``step_hook(step, optimizer)``, if given, runs after backward/clipping and before each optimizer step
    (``step`` = updates done so far): per-tensor learning rates (Auto-RGN), checkpoint snapshots.
    """
    from accelerate import Accelerator  # noqa: PLC0415

    config.validate()
    if not train:
        raise SkillgraftError("the training split is empty")
    accelerator = accelerator or Accelerator()
    world, rank = accelerator.num_processes, accelerator.process_index
    if config.batch_size % world:
        raise SkillgraftError(f"batch_size {config.batch_size} must be divisible by the {world} processes")
    task = scorer.task
    k = k or max(1, len(train) // task.num_labels)
    steps = config.resolved_steps(task.num_labels, k)
    trainable = freeze(scorer, embeddings=config.freeze_embeddings, head=config.freeze_head,
                       bias_only=config.bias_only, layers=config.layers)
    freeze_unused(scorer, train[: min(2, len(train))], trainable)
    params = [p for p in scorer.parameters() if p.requires_grad]
    if not params:
        raise SkillgraftError("no trainable parameters left after freezing")
    n_trainable = sum(p.numel() for p in params)
    torch.manual_seed(config.seed)
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    anchors = [p.detach().clone() for p in params] if config.l1 > 0 else None
    model, opt = accelerator.prepare(scorer, opt)
    raw = accelerator.unwrap_model(model)
    schedule = batch_schedule(len(train), config.batch_size, steps, config.seed)
    names = [n for n, on in trainable.items() if on]
    best_state, best_dev, best_step, history = None, None, 0, []

    eval_seconds = 0.0

    def dev_score(step: int) -> None:
        nonlocal best_state, best_dev, best_step, eval_seconds
        if not dev:
            return
        t_eval = time.perf_counter()
        metrics, _ = evaluate(raw, dev, batch_size=config.eval_batch_size)
        eval_seconds += time.perf_counter() - t_eval
        history.append({"step": step, "dev": metrics["score"], "dev_ece": metrics["ece"]})
        if best_dev is None or metrics["score"] > best_dev:
            best_dev, best_step = metrics["score"], step
            state = dict(raw.named_parameters())
            best_state = {n: state[n].detach().clone() for n in names}

    start = time.perf_counter()
    model.train()
    bar = tqdm(range(steps), desc=f"finetune {task.name}", disable=not (progress and accelerator.is_main_process))
    loss_ema = None
    for step in bar:
        shard = schedule[step][rank::world]
        batch = raw.collate([train[i] for i in shard])
        batch = {key: v.to(accelerator.device) for key, v in batch.items()}
        labels = batch.pop("labels")
        logits = model(**batch)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        if anchors is not None:
            loss = loss + config.l1 * sum((p - a).abs().sum() for p, a in zip(params, anchors))
        accelerator.backward(loss)
        if config.max_grad_norm:
            accelerator.clip_grad_norm_(params, config.max_grad_norm)
        if step_hook is not None:
            step_hook(step, opt)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if config.eval_every and (step + 1) % config.eval_every == 0 and step + 1 < steps:
            dev_score(step + 1)
            model.train()
            bar.set_postfix(loss=f"{loss_ema:.3f}", dev=f"{history[-1]['dev']:.3f}" if history else "-")
        elif step % 10 == 0:
            bar.set_postfix(loss=f"{loss_ema:.3f}")
    seconds = time.perf_counter() - start - eval_seconds  # training only (dev evaluations excluded)
    dev_score(steps)
    if best_state is not None:
        with torch.no_grad():
            state = dict(raw.named_parameters())
            for n, v in best_state.items():
                state[n].copy_(v)
    raw.eval()
    for p in raw.parameters():
        p.requires_grad_(False)
    return FinetuneResult(raw, steps, best_step if dev else steps, best_dev, history, seconds,
                          steps * config.batch_size / max(seconds, 1e-9), n_trainable)


def config_dict(config: FinetuneConfig) -> dict:
    return asdict(config)
