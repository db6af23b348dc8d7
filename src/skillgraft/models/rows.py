"""A run's training rows tokenized once, on the device: each step's batch an index into them (issue 75)."""

from __future__ import annotations

from skillgraft.data.loading import Example
from skillgraft.lazy import torch


class Tokenized:
    """A run's rows tokenized once (one :meth:`Scorer.collate` of them all, on the device once; pinned on CUDA): a
    step's batch is an index into them, cut to its longest row — the same tensors ``collate`` of those rows gives
    (right padding), with no tokenizer, no host padding and one host→device copy of the indices per step."""

    LIMIT = 256 << 20  # bytes the tokenized rows may take at most (more: the run collates per step)

    def __init__(self, full: dict[str, torch.Tensor], index: dict, widths: list[int], repeat: int):
        self.full, self.index, self.widths, self.repeat = full, index, widths, repeat
        self.length = full["input_ids"].shape[1]
        device = full["input_ids"].device
        self.pinned = device.type == "cuda"
        self.offsets = torch.arange(repeat, device=device)

    @classmethod
    def of(cls, scorer, examples: list[Example], device=None) -> Tokenized | None:
        """The rows of ``examples`` for ``scorer`` on ``device``; None when a batch could not be cut from them
        exactly (left padding, a batch with rows not per example) — the caller then collates per step."""
        from skillgraft.models.scorer import Scorer  # noqa: PLC0415

        collate = getattr(scorer, "collate", None)
        if collate is None or not examples or type(scorer).collate is not Scorer.collate:
            return None
        rows = len(examples) * (len(getattr(scorer, "label_ids", ())) or 1)
        if rows * scorer.max_length * 8 * 4 > cls.LIMIT:  # at most 4 int64 [rows, max_length] tensors
            return None
        if scorer.mode in ("head", "classifier") and scorer.tokenizer.padding_side != "right":
            return None  # left padding: cutting columns would not give collate's batch (the others pad right)
        # each example's width from its own batch's shape: no value is read back, so a loop may build its rows in
        # its first step without a host read (tests/test_engine.py counts them)
        widths = [collate([ex])["input_ids"].shape[1] for ex in examples]
        full = collate(list(examples))
        n = len(examples)
        mask = full.get("attention_mask")
        if mask is None or "candidates" in full or mask.dim() != 2 or mask.shape[0] % n:
            return None
        repeat = mask.shape[0] // n
        for k, t in full.items():
            if t.dim() == 0 or t.shape[0] not in (n, n * repeat):
                return None
        index = {}
        for i, ex in enumerate(examples):
            index.setdefault(ex, i)
        if device is not None:
            device = torch.device(device)
            full = {k: (v.pin_memory() if device.type == "cuda" else v).to(device, non_blocking=True)
                    for k, v in full.items()}
        return cls(full, index, widths, repeat)

    def take(self, examples: list[Example] | None = None, rows=None) -> dict[str, torch.Tensor]:
        """The batch of ``examples`` (rows of this run; or their positions ``rows`` in the list it was made from), as
        ``collate(examples)`` would give it (values, shapes and strides)."""
        rows = [self.index[ex] for ex in examples] if rows is None else [int(i) for i in rows]
        width = max(self.widths[i] for i in rows)
        ix = torch.tensor(rows)
        device = self.offsets.device
        if device.type != "cpu":
            ix = ix.pin_memory().to(device, non_blocking=True)
        wide = (ix.unsqueeze(1) * self.repeat + self.offsets).reshape(-1) if self.repeat > 1 else ix
        out = {}
        for k, t in self.full.items():
            t = t.index_select(0, ix if t.shape[0] == len(self.widths) else wide)
            if t.dim() == 2 and t.shape[1] == self.length and k != "score_pos":
                # contiguous, as collate's: a compiled body's graph guards on the strides (a cut view would be
                # compiled anew at its first width, issue 75)
                t = t[:, :width].contiguous()
            out[k] = t
        return out

    def covers(self, examples: list[Example]) -> bool:
        return all(ex in self.index for ex in examples)
