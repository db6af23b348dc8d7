"""Forget-free continual learning by grafting (paper §5.2, App. C.3).

Tasks arrive in order t_1, t_2, …; each t_n comes with a grafting region γ_{t_n} (learned from an
independent single-task run). When t_n arrives, only the coordinates

    owned(t_n) = γ_{t_n} \\ ∪_{i<n} γ_{t_i}

of the shared body are trained (plus t_n's own head), starting from the current model; every other
coordinate keeps its value bit-exactly. Task t_n is inferred with the grafted model

    θ_pre + (∪_{i≤n} γ_{t_i}) ⊙ (θ_current − θ_pre)

whose coordinates were all fixed by step n, so later tasks can never change what t_n sees.

The state is a folder a user can read and extend (``skillgraft continual add --state DIR --task …``):

    continual.json           arrival order, per-task region/owned sizes, metrics, base model identity
    model/                   the current body + one head per task (MultiTaskScorer format)
    regions/<n>-<task>/      γ_{t_n}                      (Region: region.json + region.safetensors)
    owned/<n>-<task>/        γ_{t_n} \\ ∪_{i<n} γ_{t_i}    (the coordinates task n trained and owns)

Every stage goes through the :class:`~skillgraft.pipeline.store.Store`: γ_t is the store's regions stage
(:func:`~skillgraft.pipeline.regions.learned_regions`) of the store's single-task fine-tuning
(:func:`~skillgraft.pipeline.opening.prepare`), and in a recipe each continual step — the state after tasks
t_1 … t_n, grafting (:func:`grafting_steps`) or naive sequential FT (:func:`naive_steps`) — is a store entry keyed
by the resolved specs of every step up to n, so an interrupted run resumes after its last finished step.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import torch

from collections.abc import Iterator

from skillgraft.data.loading import Example
from skillgraft.data.sampling import FewShotData
from skillgraft.data.spec import DataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region
from skillgraft.io import atomic_dir
from skillgraft.untrusted import read_json
from skillgraft.models.anatomy import fingerprint, graftable_names
from skillgraft.models.spec import MAX_LENGTH, ModelSpec
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.store import Store, draw_key, precision_key
from skillgraft.train.finetune import FinetuneConfig
from skillgraft.train.multitask import MultiTaskScorer, finetune_region, multitask_finetune

STATE_FILE = "continual.json"


def _slug(n: int, task: str) -> str:
    return f"{n}-{task.replace('/', '_')}"


class ContinualLearner:
    """The current model, θ_pre, and the bookkeeping of which task owns which coordinates."""

    def __init__(self, current: MultiTaskScorer | None, pre: MultiTaskScorer | None, entries: list[dict],
                 regions: dict[str, Region], settings: dict):
        self.current = current
        self.pre = pre
        self.entries = entries
        self.regions = regions
        self.settings = settings

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, model: str | None = None, mode: str = "head", *, pooling: str | None = None,
               max_length: int = MAX_LENGTH) -> ContinualLearner:
        """A new, empty continual state for ``model`` in ``mode`` (no task learned yet)."""
        return cls(None, None, [], {}, {"model": model, "mode": mode, "pooling": pooling, "max_length": max_length})

    @property
    def tasks(self) -> list[str]:
        return [e["task"] for e in self.entries]

    def _pre_view(self, task: str):
        if self.pre is None:
            s = self.settings
            self.pre = MultiTaskScorer.build(s["model"], [task], s["mode"], pooling=s["pooling"],
                                             max_length=s["max_length"])
            if s.get("base_fingerprint") and fingerprint(self.pre.reference) != s["base_fingerprint"]:
                raise SkillgraftError(f"the base model {s['model']!r} no longer matches the fingerprint recorded in "
                                      f"{STATE_FILE}; continual state needs its original pre-trained model")
        if task not in self.pre.tasks:
            self.pre.add_task(task)
        return self.pre.view(task)

    def union_through(self, task: str) -> Region:
        """∪_{i≤n} γ_{t_i} for task t_n (the region task t_n is inferred with)."""
        n = self._order(task)
        union = self.regions[self.entries[0]["task"]]
        for e in self.entries[1:n]:
            union = union | self.regions[e["task"]]
        return union

    def owned(self, task: str) -> Region:
        """γ_{t_n} \\ ∪_{i<n} γ_{t_i}: the coordinates task t_n trained."""
        n = self._order(task)
        own = self.regions[task]
        for e in self.entries[: n - 1]:
            own = own - self.regions[e["task"]]
        return own

    def _order(self, task: str) -> int:
        for e in self.entries:
            if e["task"] == task:
                return e["order"]
        raise SkillgraftError(f"task {task!r} has not been learned yet (learned: {self.tasks})")

    # ------------------------------------------------------------------ learning
    def add_task(self, task: str, region: Region, train: list[Example], dev: list[Example] | None,
                 config: FinetuneConfig, *, init: Graft | None = None, progress: bool = True,
                 info: dict | None = None) -> dict:
        """Learn task ``task`` on γ_task minus the earlier tasks' regions (the rest of the body is untouched).

        ``init`` (optional): a graft of a single-task model on this task; its values are copied onto the
        owned coordinates (and its head) before training, instead of starting from the current values.
        """
        if task in self.tasks:
            raise SkillgraftError(f"task {task!r} was already learned (order {self._order(task)}); "
                                  "tasks are learned once")
        pre_view = self._pre_view(task)
        universe = set(graftable_names(pre_view, "body"))
        bad = [n for n in region.shapes if n not in universe]
        if bad:
            raise SkillgraftError(f"region for {task!r} names tensors outside the model's body, e.g. {bad[:2]}")
        if self.current is None:
            self.current = MultiTaskScorer.build(self.settings["model"], [task], self.settings["mode"],
                                                 pooling=self.settings["pooling"],
                                                 max_length=self.settings["max_length"], head_seed=config.seed)
            self.settings["base_model"] = self.current.base_model
            self.settings["base_fingerprint"] = fingerprint(pre_view)
        else:
            self.current.add_task(task, head_seed=config.seed)
        n = len(self.entries) + 1
        entry = {"order": n, "task": task, "region": f"regions/{_slug(n, task)}", "owned": f"owned/{_slug(n, task)}",
                 "added": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **(info or {})}
        self.entries.append(entry)
        self.regions[task] = region
        own = self.owned(task)
        entry.update(region_size=len(region), owned_size=len(own), shared_with_earlier=len(region) - len(own),
                     init="graft" if init is not None else "current")
        view = self.current.view(task)
        if init is not None:
            _copy_graft_values(view, init, own)
        if len(own) == 0 and view.head is None:
            entry["train"] = {"steps": 0, "note": "nothing to train: region fully owned by earlier tasks"}
            return entry
        result = finetune_region(self.current, task, train, dev, own, config, progress=progress)
        entry["train"] = {"steps": result.steps, "best_step": result.best_step, "best_dev": result.best_dev,
                          "seconds": round(result.seconds, 2), "trainable_parameters": result.trainable_parameters}
        return entry

    def graft(self, task: str) -> Graft:
        """The graft task t_n is inferred with: ∪_{i≤n} γ_{t_i}, current values, t_n's head."""
        pre_view = self._pre_view(task)
        return Graft.from_models(pre_view, self.current.view(task), self.union_through(task),
                                 {"task": task, "continual_order": self._order(task)})

    def evaluate(self, task: str, examples: list[Example], **kwargs) -> tuple[dict, object]:
        """Metrics of ``task`` inferred with its union graft (∪_{i≤n} γ_{t_i}) on ``examples``."""
        from skillgraft.graft.scoring import evaluate_graft  # noqa: PLC0415

        return evaluate_graft(self._pre_view(task), self.graft(task), examples, **kwargs)

    def ownership(self) -> list[dict]:
        """Per task: region size, coordinates it owns, coordinates shared with earlier tasks."""
        return [{"order": e["order"], "task": e["task"], "region_size": len(self.regions[e["task"]]),
                 "owned": len(self.owned(e["task"])), "union_size": len(self.union_through(e["task"]))}
                for e in self.entries]

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the whole state folder atomically (it is replaced only when complete)."""
        if self.current is None:
            raise SkillgraftError("nothing to save: no task learned yet")
        directory = Path(directory)
        with atomic_dir(directory, overwrite=True) as tmp:
            self.current.save_pretrained(tmp / "model")
            for e in self.entries:
                self.regions[e["task"]].save(tmp / e["region"])
                self.owned(e["task"]).save(tmp / e["owned"])
            state = {"format": "skillgraft.continual", "format_version": 1, **self.settings,
                     "tasks": self.entries, "ownership": self.ownership()}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, default=str) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ContinualLearner:
        """Read a continual state folder written by :meth:`save` (checked against its own records)."""
        directory = Path(directory)
        path = directory / STATE_FILE
        if not path.is_file():
            raise SkillgraftError(f"{directory}: no {STATE_FILE}; not a continual-learning state folder")
        state = read_json(path, required=("tasks",), what="continual state")
        if state.get("format") != "skillgraft.continual":
            raise SkillgraftError(f"{path}: not a skillgraft continual state")
        entries = checked_entries(directory, path, state)
        regions = {}
        for e in entries:
            try:
                regions[e["task"]] = Region.load(directory / e["region"])
            except (KeyError, FileNotFoundError) as err:
                raise SkillgraftError(f"{path}: task entry {e.get('task')!r} has no readable region ({err})") from None
        settings = {k: state.get(k) for k in ("model", "mode", "pooling", "max_length", "base_model",
                                               "base_fingerprint")}
        current = MultiTaskScorer.from_pretrained(directory / "model")
        if current.tasks != [e["task"] for e in entries]:
            raise SkillgraftError(f"{path}: tasks {[e['task'] for e in entries]} but the saved model has "
                                  f"{current.tasks}")
        return cls(current, None, entries, regions, settings)


def checked_entries(directory: Path, path: Path, state: dict) -> list[dict]:
    """The task entries of a continual state, each an object naming its task, order and folders; the folders
    (``region``, ``owned``) must lie inside ``directory`` (:func:`skillgraft.untrusted.inside`): ``continual add``
    writes them back there, so ``"../x"`` or an absolute path would make it write outside the state folder."""
    from skillgraft.untrusted import inside  # noqa: PLC0415

    entries = state["tasks"]
    if not isinstance(entries, list):
        raise SkillgraftError(f"{path}: field 'tasks' must be a list of task entries, got {type(entries).__name__}")
    seen = set()
    for i, e in enumerate(entries):
        where = f"tasks.{i}"
        if not isinstance(e, dict):
            raise SkillgraftError(f"{path}: field {where!r} must be a task entry (an object), got {type(e).__name__}")
        if not isinstance(e.get("task"), str) or not e["task"]:
            raise SkillgraftError(f"{path}: field '{where}.task' must be a task name, got {e.get('task')!r}")
        if e["task"] in seen:
            raise SkillgraftError(f"{path}: field '{where}.task': task {e['task']!r} is listed twice")
        seen.add(e["task"])
        if type(e.get("order")) is not int or e["order"] != i + 1:
            raise SkillgraftError(f"{path}: field '{where}.order' must be {i + 1} (the arrival order), got "
                                  f"{e.get('order')!r}")
        for key in ("region", "owned"):
            inside(directory, e.get(key), path, f"{where}.{key}")
    return entries


@torch.no_grad()
def _copy_graft_values(view, graft: Graft, region: Region) -> None:
    """Write ``graft``'s values on the coordinates of ``region`` (⊆ graft.region) and its head into ``view``."""
    params = dict(view.named_parameters())
    for name, idx in region.indices.items():
        src = graft.region.indices.get(name)
        if src is None or not torch.isin(idx, src).all():
            raise SkillgraftError(f"init graft does not cover the owned coordinates of {name!r}")
        pos = torch.searchsorted(src, idx)
        flat = params[name].detach().view(-1)  # (not .data: in-place version counters must see the write)
        flat[idx.to(flat.device)] = graft.values[name][pos].to(flat.device, flat.dtype)
    for name, t in graft.carried.items():
        if name in params and params[name].shape == t.shape:
            params[name].detach().copy_(t)


def task_region(member: Member, store: Store, localize=None, *, progress: bool = False) -> tuple[Region, Graft, dict]:
    """γ_t from the independent single-task run ``member`` (the store's fine-tuning): the learned localizer's first
    region (the store's regions stage), the single-task graft on it, and a summary."""
    found, summary = learned_regions(member, store, "learned", localize, progress=progress)
    region = next(iter(found.values()))
    graft = Graft.from_models(member.pre, member.ft, region, {"task": member.task})
    return region, graft, {"size": len(region), "localize_seconds": summary.get("seconds"),
                           "finetuned": member.inputs.ft_dir.parent.name}


# ---------------------------------------------------------------------------------------------- store stages
def naive_steps(store: Store, model: ModelSpec, draws: list[DataSpec], data: dict[str, FewShotData],
                config: FinetuneConfig, *, head_seed: int, progress: bool = False,
                runtime=None) -> Iterator[MultiTaskScorer]:
    """Naive continual FT: one body fine-tuned on each task in turn (a new head per task, seeded ``head_seed``);
    ``runtime``: the run's placement (outside fp32 its precision is part of each step's key).

    Yields the model right after each task (the same object, trained further after the next ``next``). Step n is
    the store entry ``continual-naive`` keyed by the draws of tasks 1 … n, ``config`` and ``head_seed``.
    """
    current = None
    for n, draw in enumerate(draws, 1):
        task = data[draw.task].task.name
        key = {"draws": [draw_key(model, d) for d in draws[:n]], "finetune": config.to_dict(), "head_seed": head_seed,
               **precision_key(runtime)}
        label = f"{n}-{task}"
        found = store.get("continual-naive", key, label)
        if found is not None:
            current = MultiTaskScorer.from_pretrained(found / "model")
            yield current
            continue

        def make(folder: Path, task=task, draw=draw) -> None:
            nonlocal current
            if current is None:
                current = MultiTaskScorer.build(model.model, [task], model.mode, pooling=model.pooling,
                                                max_length=model.max_length, head_seed=head_seed)
            else:
                current.add_task(task, head_seed=head_seed)
            multitask_finetune(current, {task: (data[draw.task].train, data[draw.task].dev)}, config,
                               progress=progress)
            current.save_pretrained(folder / "model")

        store.fetch("continual-naive", key, make, label)
        yield current


def grafting_steps(store: Store, model: ModelSpec, draws: list[DataSpec], data: dict[str, FewShotData],
                   regions: dict[str, Region], config: FinetuneConfig, *, region_key: dict,
                   init: dict[str, Graft] | None = None,
                   progress: bool = False, runtime=None) -> Iterator[tuple[ContinualLearner, dict]]:
    """Grafting continual: task t_n trains γ_{t_n} minus the earlier regions (:meth:`ContinualLearner.add_task`).

    Yields ``(learner, entry)`` right after each task. Step n is the store entry ``continual-graft`` keyed by the
    draws of tasks 1 … n, ``region_key`` (what determines the regions: the single-task fine-tuning and the
    localizer's options), ``config`` and whether owned coordinates start from the single-task graft (``init``).
    """
    learner = None
    for n, draw in enumerate(draws, 1):
        task = data[draw.task].task.name
        key = {"draws": [draw_key(model, d) for d in draws[:n]], "regions": region_key,
               "finetune": config.to_dict(), "init": "graft" if init else "current", **precision_key(runtime)}
        label = f"{n}-{task}"
        found = store.get("continual-graft", key, label)
        if found is not None:
            learner = ContinualLearner.load(found / "state")
            yield learner, learner.entries[-1]
            continue

        def make(folder: Path, task=task, draw=draw) -> None:
            nonlocal learner
            if learner is None:
                learner = ContinualLearner.create(model.model, model.mode, pooling=model.pooling,
                                                  max_length=model.max_length)
            learner.add_task(task, regions[task], data[draw.task].train, data[draw.task].dev, config,
                             init=init[task] if init else None, progress=progress,
                             info={"k": draw.k, "seed": draw.seed})
            learner.save(folder / "state")

        store.fetch("continual-graft", key, make, label)
        yield learner, learner.entries[-1]
