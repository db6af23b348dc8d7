"""Batch samplers: what the training core sees at each step — (which task, the global batch).

A sampler holds each task's (train, dev) examples and yields, per step, the task key and the list of
examples of the *global* batch; every process takes its own shard of it. :class:`SingleTask` keys its
one task ``None`` (the model is a plain Scorer); :class:`MultiTask` keys tasks by name (the model is a
``MultiTaskScorer`` and ``model.view(name)`` is the task's Scorer).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from skillgraft.lazy import np

from skillgraft.data.loading import Example
from skillgraft.errors import SkillgraftError

Batch = tuple[str | None, list[Example]]


def batch_schedule(n: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """``[steps, batch_size]`` example indices: concatenated seeded permutations (epochs)."""
    rng = np.random.RandomState(seed)
    need = steps * batch_size
    epochs = [rng.permutation(n) for _ in range(math.ceil(need / n) if need else 0)]
    flat = np.concatenate(epochs) if epochs else np.zeros(0, dtype=np.int64)
    return flat[:need].reshape(steps, batch_size)


class SingleTask:
    """One task: step t's batch is row t of :func:`batch_schedule` (seeded epochs over ``train``)."""

    def __init__(self, train: list[Example], dev: list[Example] | None, *, batch_size: int, steps: int, seed: int,
                 name: str = "task"):
        if not train:
            raise SkillgraftError("the training split is empty")
        self.data = {None: (train, dev)}
        self.steps, self.batch_size, self.seed, self.name = steps, batch_size, seed, name
        self.task_steps = {name: steps}

    def __iter__(self) -> Iterator[Batch]:
        train = self.data[None][0]
        for row in batch_schedule(len(train), self.batch_size, self.steps, self.seed):
            yield None, [train[i] for i in row]


class MultiTask:
    """Several tasks on one body: each step draws a task uniformly at random (``seed``) and takes the
    next batch of that task's own :func:`batch_schedule` (seed ``seed + i`` for the i-th task)."""

    def __init__(self, data: dict[str, tuple[list[Example], list[Example] | None]], *, batch_size: int, steps: int,
                 seed: int):
        if not data:
            raise SkillgraftError("multi-task training needs at least one task")
        for name, (train, _) in data.items():
            if not train:
                raise SkillgraftError(f"task {name!r}: the training split is empty")
        self.data = dict(data)
        self.steps, self.batch_size, self.seed = steps, batch_size, seed
        names = list(data)
        self.order = np.random.RandomState(seed).randint(len(names), size=steps)
        self.task_steps = {n: int((self.order == i).sum()) for i, n in enumerate(names)}

    def __iter__(self) -> Iterator[Batch]:
        names = list(self.data)
        schedules = {n: batch_schedule(len(self.data[n][0]), self.batch_size, self.task_steps[n], self.seed + i)
                     for i, n in enumerate(names)}
        cursor = dict.fromkeys(names, 0)
        for i in self.order:
            n = names[i]
            train = self.data[n][0]
            yield n, [train[j] for j in schedules[n][cursor[n]]]
            cursor[n] += 1
