"""Multi-task fine-tuning (paper §5.1, App. C.1): one shared body, one scorer per task.

A :class:`MultiTaskScorer` holds one Hugging Face body and a Scorer *view* per task that shares it (the
task's own head in head mode, its own label words in prompt mode). A view is an ordinary Scorer, so
``evaluate``, ``localize`` and ``Graft`` work per task unchanged. Training (:func:`multitask_finetune`)
draws each step's batch from a task chosen uniformly at random (seeded), as the paper's MT runs do;
the best checkpoint is the one with the best *mean* dev score over the tasks.

The same loop trains a single view restricted to a region (``trainable=``): only the region's body
coordinates (and the task's own head) move; every other body coordinate is written back from a frozen
copy after each optimizer step, so it stays bit-exact (forget-free continual learning, §5.2).

:class:`JointScorer` presents several views as one scorer over task-tagged examples (logits padded
to the widest label set with −inf), so the learned localizer can optimise a joint loss Σ_i L_i —
the "purification" of a union of regions (§5.1, Fig. 8d).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from skillgraft.data.loading import Example
from skillgraft.data.tasks import Task, get_task, task_from_dict
from skillgraft.errors import SkillgraftError
from skillgraft.evaluate.predict import evaluate
from skillgraft.io import atomic_dir, read_json
from skillgraft.models.anatomy import is_carried
from skillgraft.models.freezing import freeze
from skillgraft.models.scorer import Scorer, build_scorer
from skillgraft.train.finetune import FinetuneConfig, batch_schedule, freeze_unused

MT_CONFIG = "multitask_config.json"
MT_HEADS = "heads.safetensors"


def _key(task: str) -> str:
    return task.replace(".", "_")


class MultiTaskScorer(nn.Module):
    """One shared body (``model``) and one Scorer view per task; parameters ``model.*`` and ``heads.<task>.*``."""

    def __init__(self, views: dict[str, Scorer]):
        super().__init__()
        if not views:
            raise SkillgraftError("a multi-task model needs at least one task")
        first = next(iter(views.values()))
        for name, v in views.items():
            if v.model is not first.model:
                raise SkillgraftError(f"view {name!r} does not share the body of the other tasks")
        self.model = first.model
        self._views: dict[str, Scorer] = {}
        self.heads = nn.ModuleDict()
        for name, v in views.items():
            self._register(name, v)

    def _register(self, name: str, view: Scorer) -> None:
        if name in self._views:
            raise SkillgraftError(f"task {name!r} is already in this multi-task model")
        self._views[name] = view
        if view.head is not None:
            self.heads[_key(name)] = view.head

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, model_name: str | None, tasks: list[str | Task], mode: str = "head", *, pooling: str | None = None,
              max_length: int = 128, head_seed: int = 0) -> MultiTaskScorer:
        """Pre-trained body + a fresh scorer per task (heads initialised as ``build_scorer`` does)."""
        if not tasks:
            raise SkillgraftError("a multi-task model needs at least one task")
        tasks = [get_task(t) for t in tasks]
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise SkillgraftError(f"duplicate tasks in {names}")
        first = build_scorer(model_name, tasks[0], mode, pooling=pooling, max_length=max_length, head_seed=head_seed)
        mt = cls({tasks[0].name: first})
        for t in tasks[1:]:
            mt.add_task(t, head_seed=head_seed)
        return mt

    def add_task(self, task: str | Task, *, head_seed: int = 0) -> Scorer:
        """A new view on the shared body (a fresh head in head mode)."""
        task = get_task(task)
        ref = self.reference
        view = Scorer(self.model, ref.tokenizer, task, ref.mode, pooling=ref.pooling, max_length=ref.max_length,
                      base_model=ref.base_model, tied_decoder=ref.tied_decoder, head_seed=head_seed)
        view.to(self.model.device)
        self._register(task.name, view)
        return view

    @property
    def reference(self) -> Scorer:
        return next(iter(self._views.values()))

    @property
    def tasks(self) -> list[str]:
        return list(self._views)

    @property
    def base_model(self) -> str:
        return self.reference.base_model

    @property
    def mode(self) -> str:
        return self.reference.mode

    def view(self, task: str) -> Scorer:
        """The Scorer of ``task`` (shares this model's body: changes to one are changes to all)."""
        if task not in self._views:
            raise SkillgraftError(f"task {task!r} is not in this multi-task model (tasks: {self.tasks})")
        return self._views[task]

    __getitem__ = view

    def forward(self, task: str, **batch) -> torch.Tensor:
        return self.view(task)(**batch)

    # ------------------------------------------------------------------ files
    def save_pretrained(self, directory: str | os.PathLike, *, overwrite: bool = True) -> Path:
        """``body/`` (HF checkpoint + tokenizer), ``heads.safetensors``, ``multitask_config.json`` (atomic)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        with atomic_dir(directory, overwrite=overwrite) as tmp:
            self.model.save_pretrained(tmp / "body")
            self.reference.tokenizer.save_pretrained(tmp / "body")
            heads = {f"{name}::{k}": v.detach().contiguous().cpu() for name, view in self._views.items()
                     if view.head is not None for k, v in view.head.state_dict().items()}
            if heads:
                save_file(heads, str(tmp / MT_HEADS))
            cfg = {"format": "skillgraft.multitask", "format_version": 1, "tasks": self.tasks,
                   "scorers": {name: view.scorer_config() for name, view in self._views.items()}}
            (tmp / MT_CONFIG).write_text(json.dumps(cfg, indent=2))
        return Path(directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> MultiTaskScorer:
        from safetensors.torch import load_file  # noqa: PLC0415

        from skillgraft.models.loading import load_hf_model, load_tokenizer  # noqa: PLC0415

        directory = Path(directory)
        cfg_path = directory / MT_CONFIG
        if not cfg_path.is_file():
            raise SkillgraftError(f"{directory}: no {MT_CONFIG}; not a skillgraft multi-task model folder")
        cfg = read_json(cfg_path, required=("scorers", "tasks"), what="multi-task config")
        scorers, order = cfg["scorers"], cfg["tasks"]
        first = scorers[order[0]]
        mode = first["mode"]
        kind = "base" if mode == "head" or first.get("tied_decoder") else ("mlm" if mode == "prompt" else "causal")
        model = load_hf_model(str(directory / "body"), kind)
        tokenizer = load_tokenizer(str(directory / "body"))
        heads = load_file(str(directory / MT_HEADS)) if (directory / MT_HEADS).is_file() else {}
        views = {}
        for name in order:
            sc = scorers[name]
            task = task_from_dict(sc["task"], str(cfg_path))
            view = Scorer(model, tokenizer, task, sc["mode"], pooling=sc["pooling"], max_length=sc["max_length"],
                          base_model=sc.get("base_model", ""), tied_decoder=sc.get("tied_decoder", False))
            if view.head is not None:
                try:
                    view.head.load_state_dict({"weight": heads[f"{name}::weight"], "bias": heads[f"{name}::bias"]})
                except (KeyError, RuntimeError) as e:
                    raise SkillgraftError(f"{directory / MT_HEADS}: no fitting head for task {name!r} ({e})") from None
            views[name] = view
        return cls(views)


# ---------------------------------------------------------------------------------------------- training
@dataclass
class MultiTaskResult:
    model: MultiTaskScorer
    steps: int
    best_step: int
    best_dev: float | None            # mean dev score over tasks at the best step
    history: list[dict]
    task_steps: dict[str, int]        # how many steps each task was drawn
    seconds: float
    trainable_parameters: int


def multitask_finetune(mt: MultiTaskScorer, data: dict[str, tuple[list[Example], list[Example] | None]],
                       config: FinetuneConfig, *, trainable=None, accelerator=None,
                       progress: bool = True) -> MultiTaskResult:
    """Train the tasks of ``data`` (task → (train, dev)) together on ``mt``'s shared body, in place.

    Each step draws one task uniformly at random (``config.seed``) and takes a batch of that task.
    Steps: ``config.steps``, or the sum of the single-task default step counts (paper App. C.1: the
    MT run gets as many iterations as all single-task runs together). ``trainable`` (a Region over
    body tensors) restricts the body's training to those coordinates; others stay bit-exact.
    """
    from accelerate import Accelerator, DistributedDataParallelKwargs  # noqa: PLC0415

    config.validate()
    if not data:
        raise SkillgraftError("multi-task training needs at least one task")
    for name, (train, _) in data.items():
        mt.view(name)
        if not train:
            raise SkillgraftError(f"task {name!r}: the training split is empty")
    accelerator = accelerator or Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    world, rank = accelerator.num_processes, accelerator.process_index
    if config.batch_size % world:
        raise SkillgraftError(f"batch_size {config.batch_size} must be divisible by the {world} processes")
    names = list(data)
    views = {n: mt.view(n) for n in names}
    if config.steps is not None:
        steps = config.steps
    else:
        steps = sum(config.resolved_steps(views[n].task.num_labels, max(1, len(data[n][0]) // views[n].task.num_labels))
                    for n in names)

    # ---- which parameters train
    for p in mt.parameters():
        p.requires_grad_(False)
    masks: dict[int, torch.Tensor] = {}
    for n in names:
        view = views[n]
        freeze(view, embeddings=config.freeze_embeddings, head=config.freeze_head, bias_only=config.bias_only,
               layers=config.layers)
        if trainable is not None:
            for pname, p in view.named_parameters():
                if is_carried(pname):
                    continue
                idx = trainable.indices.get(pname)
                p.requires_grad_(idx is not None and idx.numel() > 0)
                if p.requires_grad:
                    if tuple(p.shape) != trainable.shapes[pname]:
                        raise SkillgraftError(f"trainable region: {pname!r} has shape {trainable.shapes[pname]}, "
                                              f"the model has {tuple(p.shape)}")
                    m = torch.zeros(p.numel(), dtype=torch.bool)
                    m[idx] = True
                    masks[id(p)] = m.view(p.shape).to(p.device)
    for n in names:
        freeze_unused(views[n], data[n][0][: min(2, len(data[n][0]))])
    params, seen = [], set()
    for n in names:
        for p in views[n].parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    if not params:
        raise SkillgraftError("no trainable parameters left after freezing")
    frozen = {id(p): p.detach().clone() for p in params if id(p) in masks}
    n_trainable = sum(int(masks[id(p)].sum()) if id(p) in masks else p.numel() for p in params)

    torch.manual_seed(config.seed)
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    model, opt = accelerator.prepare(mt, opt)
    raw = accelerator.unwrap_model(model)
    rng = np.random.RandomState(config.seed)
    order = rng.randint(len(names), size=steps)
    task_steps = {n: int((order == i).sum()) for i, n in enumerate(names)}
    schedules = {n: batch_schedule(len(data[n][0]), config.batch_size, task_steps[n], config.seed + i)
                 for i, n in enumerate(names)}
    cursor = dict.fromkeys(names, 0)
    best_state, best_dev, best_step, history = None, None, 0, []

    def dev_score(step: int) -> None:
        nonlocal best_state, best_dev, best_step
        scores = {}
        for n in names:
            if data[n][1]:
                metrics, _ = evaluate(raw.view(n), data[n][1], batch_size=config.eval_batch_size)
                scores[n] = metrics["score"]
        if not scores:
            return
        mean = float(np.mean(list(scores.values())))
        history.append({"step": step, "dev": mean, **{f"dev:{n}": s for n, s in scores.items()}})
        if best_dev is None or mean > best_dev:
            best_dev, best_step = mean, step
            best_state = [p.detach().clone() for p in params]

    start = time.perf_counter()
    model.train()
    desc = "multitask" if len(names) > 1 else f"finetune {names[0]}" + (" (region)" if trainable is not None else "")
    bar = tqdm(range(steps), desc=desc, disable=not (progress and accelerator.is_main_process))
    loss_ema = None
    for step in bar:
        n = names[order[step]]
        shard = schedules[n][cursor[n]][rank::world]
        cursor[n] += 1
        train = data[n][0]
        batch = raw.view(n).collate([train[i] for i in shard])
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        labels = batch.pop("labels")
        loss = torch.nn.functional.cross_entropy(model(n, **batch).float(), labels)
        accelerator.backward(loss)
        with torch.no_grad():
            for p in params:
                if id(p) in masks and p.grad is not None:
                    p.grad.mul_(masks[id(p)])
        if config.max_grad_norm:
            accelerator.clip_grad_norm_(params, config.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():  # coordinates outside the region: back to their frozen values, bit-exact
            for p in params:
                if id(p) in masks:
                    p.copy_(torch.where(masks[id(p)], p, frozen[id(p)]))
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if config.eval_every and (step + 1) % config.eval_every == 0 and step + 1 < steps:
            dev_score(step + 1)
            model.train()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss_ema:.3f}", dev=f"{history[-1]['dev']:.3f}" if history else "-")
    seconds = time.perf_counter() - start
    dev_score(steps)
    if best_state is not None:
        with torch.no_grad():
            for p, v in zip(params, best_state):
                p.copy_(v)
    raw.eval()
    for p in raw.parameters():
        p.requires_grad_(False)
    return MultiTaskResult(raw, steps, best_step if history else steps, best_dev, history, task_steps, seconds,
                           n_trainable)


def finetune_region(mt: MultiTaskScorer, task: str, train: list[Example], dev: list[Example] | None, region,
                    config: FinetuneConfig, **kwargs) -> MultiTaskResult:
    """Train only ``region``'s body coordinates (and ``task``'s own head) of ``mt`` on one task."""
    return multitask_finetune(mt, {task: (train, dev)}, config, trainable=region, **kwargs)


# ---------------------------------------------------------------------------------------------- joint loss
@dataclass(frozen=True)
class TaskExample:
    """An example tagged with its task (the unit of :class:`JointScorer`)."""

    task: str
    example: Example

    @property
    def label(self) -> int:
        return self.example.label


def tag(task: str, examples: list[Example]) -> list[TaskExample]:
    return [TaskExample(task, ex) for ex in examples]


class JointScorer(nn.Module):
    """Several task views over one body, as one scorer of task-tagged examples.

    ``collate`` groups a mixed batch by task; ``forward`` returns each task's logits padded with −inf to
    the widest label set, so cross-entropy over a mixed batch is the (example-weighted) joint loss
    Σ_i L_i and argmax accuracy is per-task accuracy. Parameters: ``model.*`` and ``head.<task>.*``.
    """

    def __init__(self, mt: MultiTaskScorer, tasks: list[str]):
        super().__init__()
        self.views = {t: mt.view(t) for t in tasks}  # plain dict: parameters registered below, once
        self.tasks = list(tasks)
        self.model = mt.model
        self.head = nn.ModuleDict({_key(t): v.head for t, v in self.views.items() if v.head is not None})
        self.base_model = mt.base_model
        self.width = max(v.task.num_labels for v in self.views.values())

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def collate(self, examples: list[TaskExample]) -> dict[str, torch.Tensor]:
        if not examples:
            raise SkillgraftError("cannot build a batch from zero examples")
        batch, labels = {}, []
        for i, t in enumerate(self.tasks):
            mine = [ex.example for ex in examples if ex.task == t]
            if not mine:
                continue
            sub = self.views[t].collate(mine)
            labels.append(sub.pop("labels"))
            batch.update({f"{i}:{k}": v for k, v in sub.items()})
        unknown = {ex.task for ex in examples} - set(self.tasks)
        if unknown:
            raise SkillgraftError(f"examples of tasks {sorted(unknown)} that this joint scorer does not have")
        batch["labels"] = torch.cat(labels)
        return batch

    def forward(self, labels: torch.Tensor | None = None, **batch) -> torch.Tensor:
        out = []
        for i, t in enumerate(self.tasks):
            sub = {k.split(":", 1)[1]: v for k, v in batch.items() if k.startswith(f"{i}:")}
            if not sub:
                continue
            logits = self.views[t](**sub)
            pad = logits.new_full((logits.shape[0], self.width), float("-inf"))
            pad[:, : logits.shape[1]] = logits
            out.append(pad)
        return torch.cat(out)
