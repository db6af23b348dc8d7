"""``skillgraft tasks``: every registered task, where its data was found and its split sizes."""

from __future__ import annotations

import os
from dataclasses import dataclass

from skillgraft.verbs.result import VerbResult


@dataclass
class TaskRow(VerbResult):
    name: str
    kind: str
    labels: int
    metric: str
    data: str | None             # the task's data folder, None when not found
    sizes: tuple[str, str, str]  # train, dev, test row counts ("-": no file)

    def document(self) -> dict:
        """The row with its sizes by split."""
        return {**super().document(), "sizes": dict(zip(("train", "dev", "test"), self.sizes))}


def tasks(data_dir: str | os.PathLike | None = None, task_file: str | os.PathLike | None = None) -> list[TaskRow]:
    """One row per registered task (``task_file``: a YAML of extra tasks registered first)."""
    from skillgraft.data import TASKS, load_task_yaml  # noqa: PLC0415
    from skillgraft.data.loading import find_split_file, read_file, resolve_data_dir  # noqa: PLC0415
    from skillgraft.errors import SkillgraftError  # noqa: PLC0415

    if task_file:
        load_task_yaml(task_file)
    rows = []
    for task in TASKS.values():
        try:
            root = resolve_data_dir(data_dir, task)
        except SkillgraftError:
            rows.append(TaskRow(task.name, task.kind, task.num_labels, task.metric, None, ("-", "-", "-")))
            continue
        sizes = []
        for split in ("train", "dev", "test"):
            path = find_split_file(task, split, root)
            sizes.append(str(len(read_file(task, path))) if path else "-")
        rows.append(TaskRow(task.name, task.kind, task.num_labels, task.metric, str(root / task.data_folder),
                            tuple(sizes)))
    return rows
