"""Typed report rows read as their CSV / JSON columns: the rows of ``skillgraft graft`` (one model each,
:class:`skillgraft.pipeline.variants.ResultRow`) and of ``skillgraft merge`` (one merged model each, with one
:class:`TaskScores` per task: :class:`skillgraft.merge.base.MergeRow`).

Both derive "share of FT" the one way, :func:`~skillgraft.evaluate.metrics.share_of_ft` (score ÷ the fine-tuned
model's score; merge reports call it normalized accuracy), and both are read-only mappings of their columns
(:meth:`Row.columns`), so a CSV / JSON writer and a report index them by column name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skillgraft.evaluate.metrics import share_of_ft


class Row(Mapping):
    """A typed row; :meth:`columns` gives its CSV / JSON columns in report order."""

    def columns(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str):
        return self.columns()[key]

    def __iter__(self):
        return iter(self.columns())

    def __len__(self) -> int:
        return len(self.columns())


@dataclass
class TaskScores:
    """One task's scores in a merge row: dev and test score of the merged model, the task's own fine-tuned model's,
    and the bytes stored for the task."""

    dev: float | None = None
    test: float | None = None
    ft_dev: float | None = None
    ft_test: float | None = None
    stored_bytes: int = 0

    def normalized(self, split: str = "test") -> float:
        """Score ÷ the fine-tuned model's on ``split`` (:func:`share_of_ft`; NaN where either has no score)."""
        score, ft = (self.dev, self.ft_dev) if split == "dev" else (self.test, self.ft_test)
        share = share_of_ft(score, ft) if score is not None else None
        return float("nan") if share is None else share
