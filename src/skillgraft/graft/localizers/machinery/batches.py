"""The rows the engine runs on: the scorer's loss and hits on a batch, a step's micro-batches (lock-stepped across
processes), the run's rows tokenized once on the device, and a region's accuracy on the selection rows (sharded over
processes, counts summed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from skillgraft.lazy import no_grad, np, torch

from skillgraft.data.loading import Example, text_length
from skillgraft.graft.localizers.machinery.sharded import reshard


def batch_loss(scorer, batch, reduction: str = "mean"):
    """The scorer's own loss on a batch (:func:`skillgraft.models.scorer.batch_loss`; imported on first use, so the
    localizers' options load without torch)."""
    from skillgraft.models.scorer import batch_loss as loss  # noqa: PLC0415

    return loss(scorer, batch, reduction=reduction)


def batch_hits(scorer, batch):
    """(correct, count) on a batch (:func:`skillgraft.models.scorer.batch_hits`; imported on first use)."""
    from skillgraft.models.scorer import batch_hits as hits  # noqa: PLC0415

    return hits(scorer, batch)


class RunRows(Sequence):
    """A run's training rows (a sequence of them, as the list they come from) and their tokenized form on the
    device (:class:`~skillgraft.models.rows.Tokenized`), built at the first :meth:`batch` and owned by the run: each
    step's micro-batch is an index into it, or collated per step where it cannot be cut from it."""

    def __init__(self, examples: list[Example]):
        self.examples, self._built = examples, None

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]

    def batch(self, scorer, chunk, device) -> dict:
        """The micro-batch of rows ``chunk`` (positions) on ``device``, as ``scorer.collate`` of them gives it."""
        from skillgraft.models.rows import Tokenized  # noqa: PLC0415

        device = torch.device(device)
        if self._built is None or self._built[0] != device:
            self._built = (device, Tokenized.of(scorer, self.examples, device))
        rows = self._built[1]
        if rows is not None:
            return rows.take(rows=chunk)
        batch = scorer.collate([self.examples[i] for i in chunk])
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def by_length(examples, indices: np.ndarray) -> np.ndarray:
    """``indices`` ordered by their examples' length (stable): the micro-batches of one step, or of one scoring, pad
    little. A step's gradient is the sum over its examples, so their order within it changes nothing but rounding."""
    return indices[np.argsort([text_length(examples[i]) for i in indices], kind="stable")]


def micro_batches(mine: np.ndarray, micro_batch: int, lockstep: int | None):
    """(example indices, loss weight) per forward. ``lockstep``: every process runs ⌈lockstep/micro⌉ of them,
    a process without examples left running one weighted 0 (FSDP needs every rank in every forward)."""
    count = math.ceil((lockstep if lockstep is not None else len(mine)) / micro_batch)
    for i in range(count):
        chunk = mine[i * micro_batch:(i + 1) * micro_batch]
        yield (chunk, 1) if len(chunk) else (np.zeros(1, dtype=np.int64), 0.0)


@no_grad
def accuracy_on(scorer, examples: list[Example], micro_batch: int, accelerator, lockstep: bool = False,
                collated: dict | None = None) -> float:
    """Accuracy of ``scorer`` on ``examples`` (sharded over processes, counts summed). ``collated``: where the
    micro-batches are kept between calls scoring the same rows with the same scorer (a trajectory's every scored
    step and budget), collated and moved once; hits never change a batch."""
    world, rank = accelerator.num_processes, accelerator.process_index
    mine = [examples[i] for i in by_length(examples, np.arange(rank, len(examples), world))]
    correct = torch.zeros(2, device=accelerator.device)
    slots = math.ceil(len(examples) / world) if lockstep else len(mine)
    for start in range(0, slots, micro_batch):
        part = mine[start:start + micro_batch]
        key = (id(scorer), micro_batch, world, rank, slots, str(accelerator.device), start)
        batch = None if collated is None else collated.get(key)
        if batch is None:
            batch = scorer.collate(part or examples[:1])
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            if collated is not None:
                collated[key] = batch
        hits, count = batch_hits(scorer, batch)  # labels right (generative: next completion tokens right)
        if part:
            correct[0] += hits
            correct[1] += count
    if lockstep:
        reshard(scorer)  # a no-grad forward may leave gathered parameters behind; the next edit must show
    if world > 1:
        torch.distributed.all_reduce(correct)
    return float(correct[0] / correct[1].clamp(min=1))


def accuracy(scorer, examples: list[Example], micro_batch: int = 64) -> float:
    """Accuracy of ``scorer`` on ``examples`` in one process (what the engine scores a region by)."""
    from skillgraft.models.placement import accelerator_for  # noqa: PLC0415

    return accuracy_on(scorer, examples, micro_batch, accelerator_for(scorer))
