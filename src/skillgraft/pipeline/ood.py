"""Out-of-distribution evaluation sets: another task's examples mapped into the source's label space.

A transfer names a source task and target tasks; each target's labels are mapped into the source's by
NAME (``labels: {target_label: source_label | null}``, null drops the label; see
:mod:`skillgraft.data.label_map`). The mapped examples are subsampled by the one test-subset sampler
(:func:`~skillgraft.data.sampling.eval_subset`), so a (task, limit) pair always means the same examples.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from skillgraft.data.label_map import check_label_map, map_examples
from skillgraft.data.loading import Example, load_split
from skillgraft.data.sampling import eval_subset
from skillgraft.data.tasks import get_task
from skillgraft.errors import SkillgraftError
from skillgraft.spec import COUNT_MAX, Spec


def _task_name(name: str) -> str:
    try:
        return get_task(name).name
    except SkillgraftError as e:
        raise ValueError(str(e)) from None


class TargetSpec(Spec):
    """One OOD evaluation set (a bare task name in YAML means identical label names)."""

    task: str = Field(description="the target task (its examples are relabelled into the source's labels)")
    labels: dict[str, str | None] | None = Field(None, description=(
        "target label → source label, by name; null drops that label (null map: identical label names)"))
    split: Literal["train", "dev", "test"] = Field("test", description="which split of the target is evaluated")
    limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "seeded sample of N examples after mapping (null: all; in a recipe, not given: its ood_limit)"))

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, v):
        return {"task": v} if isinstance(v, str) else v

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str) -> str:
        return _task_name(v)

    @field_validator("labels", mode="before")
    @classmethod
    def _names(cls, v):  # YAML reads labels such as 0 / 1 as numbers; labels are names
        if isinstance(v, dict):
            return {str(k): (None if x is None else str(x)) for k, x in v.items()}
        return v


class TransferSpec(Spec):
    """Train on ``source``; evaluate zero-shot on each target."""

    source: str = Field(description="the task the model is fine-tuned on")
    targets: list[TargetSpec] = Field(min_length=1, description="OOD sets: [{task, labels, split, limit}]")

    @field_validator("source")
    @classmethod
    def _known_task(cls, v: str) -> str:
        return _task_name(v)

    def check(self, where: str = "transfer") -> None:
        """Refuse (before any work) a target whose labels or inputs cannot be mapped onto the source."""
        source = get_task(self.source)
        for j, target in enumerate(self.targets):
            task = get_task(target.task)
            if task.kind != source.kind:
                raise SkillgraftError(f"{where}.targets[{j}]: {source.name} is a {source.kind} task but {task.name} "
                                      f"is a {task.kind} task; their inputs cannot be transferred")
            check_label_map(source, task, target.labels, f"{where}.targets[{j}]")


def with_limits(transfers, limit):
    """Raw transfers (YAML) with ``limit`` on every target that names none (a bare task name → ``{task}``)."""
    if not isinstance(transfers, list):
        return transfers
    return [{**t, "targets": [_with_limit(x, limit) for x in t["targets"]]}
            if isinstance(t, dict) and isinstance(t.get("targets"), list) else t for t in transfers]


def _with_limit(target, limit):
    target = {"task": target} if isinstance(target, str) else target
    return {**target, "limit": limit} if isinstance(target, dict) and "limit" not in target else target


def ood_examples(source: str, target: TargetSpec, data_dir=None, where: str = "OOD target") -> list[Example]:
    """``target``'s examples mapped into ``source``'s labels, subsampled to ``target.limit`` (eval_subset)."""
    raw = load_split(target.task, target.split, data_dir)
    return eval_subset(map_examples(source, target.task, raw, target.labels, where), target.limit)
