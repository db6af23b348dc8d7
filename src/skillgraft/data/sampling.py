"""k-shot sampling exactly as LM-BFF: seeded shuffle, train = first K per label, dev = next K per label.

A label with fewer than 2K rows keeps K for train and what is left for dev (LM-BFF slices ``[K:2K]``; e.g.
TREC's ABBR at K = 64), with a warning; fewer than K is an error.

LM-BFF (``tools/generate_k_shot_data.py``) seeds NumPy with the data seed, shuffles the training lines,
then keeps the first K examples of every label for train and the next K for dev; test is the task's
test split (for a task without one, ``test_from_train``: the train rows outside this draw). The result is
deterministic for a (task, K, seed). Where an LM-BFF ``k-shot/<TASK>/<K>-<SEED>`` folder exists under the data
root its files are used as they are.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from skillgraft.lazy import np

from skillgraft.data.loading import Example, find_split_file, load_split, read_file, resolve_data_dir
from skillgraft.data.tasks import Task, get_task
from skillgraft.errors import SkillgraftError


@dataclass(frozen=True)
class FewShotData:
    """The three splits of one k-shot draw."""

    task: Task
    k: int
    seed: int
    train: list[Example]
    dev: list[Example]
    test: list[Example]


def sample_kshot(examples: list[Example], num_labels: int, k: int, seed: int, *, source: str = "train",
                 dev: bool = True) -> tuple[list[Example], list[Example]]:
    """Split ``examples`` into (train, dev) with K per label each, LM-BFF style."""
    if k <= 0:
        raise SkillgraftError(f"K must be a positive number of examples per label, got {k}")
    shuffled = list(examples)
    np.random.RandomState(seed).shuffle(shuffled)
    by_label: dict[int, list[Example]] = {i: [] for i in range(num_labels)}
    for ex in shuffled:
        by_label[ex.label].append(ex)
    counts = {lab: len(v) for lab, v in by_label.items()}
    smallest = min(counts, key=counts.get)
    if counts[smallest] < k:
        raise SkillgraftError(
            f"{source}: K={k} needs {k} examples per label for train{' (and up to K more for dev)' if dev else ''}, "
            f"but label index {smallest} has only {counts[smallest]} (per-label counts: {counts})"
        )
    short = {lab: n - k for lab, n in counts.items() if n < 2 * k}
    if dev and short:  # LM-BFF's rule slices [K:2K]: a rare label's dev keeps what is left after its train
        warnings.warn(f"{source}: fewer than 2·K={2 * k} examples for label index(es) {sorted(short)}; their dev "
                      f"split keeps only what train left ({short}), as LM-BFF's sampler does", stacklevel=2)
    train = [ex for lab in range(num_labels) for ex in by_label[lab][:k]]
    dev_split = [ex for lab in range(num_labels) for ex in by_label[lab][k:2 * k]] if dev else []
    return train, dev_split


def load_kshot(task: Task | str, k: int, seed: int, data_dir: str | os.PathLike | None = None,
               *, test_limit: int | None = None, dev_limit: int | None = None) -> FewShotData:
    """The (train, dev, test) splits of a k-shot draw of ``task``.

    ``test_limit`` / ``dev_limit`` keep a fixed, seeded sample of N test / dev examples (:func:`eval_subset`);
    None keeps all.
    """
    task = get_task(task)
    if not task.has_train:
        raise SkillgraftError(f"task {task.name!r} is evaluation-only (no train split); it cannot be k-shot sampled")
    root = resolve_data_dir(data_dir, task)
    kshot_dir = root / "k-shot" / task.data_folder / f"{k}-{seed}"
    if kshot_dir.is_dir():
        def split(name: str) -> list[Example]:
            for ext in (".jsonl", ".tsv", ".csv"):
                if (kshot_dir / (name + ext)).is_file():
                    return read_file(task, kshot_dir / (name + ext))
            raise SkillgraftError(f"{kshot_dir}: no {name} file")
        train, dev, test = split("train"), split("dev"), split("test")
    else:
        full = load_split(task, "train", root)
        train, dev = sample_kshot(full, task.num_labels, k, seed, source=f"{task.name} train split")
        if task.test_from_train and find_split_file(task, "test", root) is None:
            drawn = {id(ex) for ex in train + dev}  # the stand-in test: train rows outside this draw
            test = [ex for ex in full if id(ex) not in drawn]
        else:
            test = load_split(task, "test", root)
    return FewShotData(task, k, seed, train, eval_subset(dev, dev_limit), eval_subset(test, test_limit))


def eval_subset(examples: list[Example], limit: int | None) -> list[Example]:
    """The one evaluation-subset sampler: a fixed seeded sample of ``limit`` examples, in file order.

    Every runner (``skillgraft graft``, ``finetune``, every recipe, OOD sets) draws test subsets here, so
    the same (task, k, seed, test limit) always means the same examples. Test files may be sorted by
    label, so a plain head would be one-sided; None (or a limit ≥ the split) keeps all.
    """
    if limit is None or limit >= len(examples):
        return list(examples)
    if limit < 1:
        raise SkillgraftError(f"test limit must be ≥ 1, got {limit}")
    keep = np.sort(np.random.RandomState(0).choice(len(examples), limit, replace=False))
    return [examples[i] for i in keep]
