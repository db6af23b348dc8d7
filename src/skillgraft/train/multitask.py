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
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from skillgraft.data.loading import Example
from skillgraft.data.tasks import Task, get_task, task_from_dict
from skillgraft.errors import SkillgraftError
from skillgraft.io import atomic_dir
from skillgraft.untrusted import read_json
from skillgraft.models.scorer import Scorer, build_scorer
from skillgraft.models.spec import MAX_LENGTH
from skillgraft.train.callbacks import BestDev, RegionMask
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.core import TrainResult, fit
from skillgraft.train.samplers import MultiTask

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
              max_length: int = MAX_LENGTH, head_seed: int = 0) -> MultiTaskScorer:
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
        if (directory / MT_HEADS).is_file():
            from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

            check_safetensors(directory / MT_HEADS)  # its header bounded before safetensors reads it
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
MultiTaskResult = TrainResult


def multitask_finetune(mt: MultiTaskScorer, data: dict[str, tuple[list[Example], list[Example] | None]],
                       config: FinetuneConfig, *, trainable=None, accelerator=None, progress: bool = True,
                       callbacks=()) -> MultiTaskResult:
    """Train the tasks of ``data`` (task → (train, dev)) together on ``mt``'s shared body, in place.

    The training core with a :class:`MultiTask` sampler: each step draws one task uniformly at random
    (``config.seed``) and takes a batch of that task. Steps: ``config.steps``, or the sum of the
    single-task default step counts (paper App. C.1: the MT run gets as many iterations as all
    single-task runs together). The best checkpoint is the one with the best *mean* dev score.
    ``trainable`` (a Region over body tensors, or anything with ``indices``/``shapes``) restricts the
    body's training to those coordinates (a :class:`RegionMask`); the others stay bit-exact.
    """
    if not data:
        raise SkillgraftError("multi-task training needs at least one task")
    views = {n: mt.view(n) for n in data}
    if config.steps is not None:
        steps = config.steps
    else:
        steps = sum(config.resolved_steps(v.task.num_labels, max(1, len(data[n][0]) // v.task.num_labels))
                    for n, v in views.items())
    sampler = MultiTask(data, batch_size=config.batch_size, steps=steps, seed=config.seed)
    masks = []
    if trainable is not None:
        heads = [] if config.freeze_head else [f"heads.{_key(n)}.{h}" for n, v in views.items() if v.head is not None
                                               for h, _ in v.head.named_parameters()]
        masks.append(RegionMask(trainable.indices, heads, shapes=trainable.shapes))
    desc = "multitask" if len(views) > 1 else f"finetune {next(iter(views))}" + (" (region)" if masks else "")
    return fit(mt, sampler, config, [*masks, BestDev(), *callbacks], accelerator=accelerator, progress=progress,
               desc=desc)


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

    @property
    def text_a(self) -> str:
        return self.example.text_a

    @property
    def text_b(self) -> str | None:
        return self.example.text_b


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
