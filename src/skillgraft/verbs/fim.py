"""``skillgraft fim``: per-layer Fisher (FIM) scores of the pre-trained model (surgical fine-tuning): the ranking,
``fim.json`` and ``fim.png`` (both, or neither)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skillgraft.data.spec import DataSpec
from skillgraft.fisher.fisher import FisherConfig
from skillgraft.models.spec import ModelSpec
from skillgraft.verbs.result import VerbResult


@dataclass
class FimResult(VerbResult):
    """The layer scores of one k-shot draw and where they were written."""

    task: str
    k: int
    seed: int
    kind: str
    aggregate: str
    scores: object  # skillgraft.fisher.scores.LayerScores
    out: Path

    def document(self) -> dict:
        """The draw, the ranking (top → bottom), each block's score and parameter count, the folder."""
        s = self.scores
        return {"task": self.task, "k": self.k, "seed": self.seed, "kind": self.kind, "aggregate": self.aggregate,
                "out": self.out, "ranking": s.ranking(), "scores": s.scores, "parameters": s.num_parameters}


def fim(data: DataSpec, model: ModelSpec, fisher: FisherConfig, *, aggregate: Literal["sum", "frobenius"] = "sum",
        normalize: bool = False, out: str | os.PathLike | None = None, runtime=None) -> FimResult:
    """FIM layer scores of ``model`` on ``data``'s k-shot train split, written to ``out`` (default
    ``runs/fim-<task>-<k>-<seed>``), on ``runtime`` (None: the placement the command line activated)."""
    from skillgraft.finite import refuse_non_finite_model  # noqa: PLC0415
    from skillgraft.fisher import fim_layer_scores  # noqa: PLC0415
    from skillgraft.fisher.plots import layer_scores_bar  # noqa: PLC0415
    from skillgraft.io import atomic_files, write_json  # noqa: PLC0415

    from skillgraft.pipeline.memory_plan import plan_training  # noqa: PLC0415

    from skillgraft.models.placement import boundary  # noqa: PLC0415

    runtime = boundary(runtime)
    plan_training("fim", model.model, micro_batch=fisher.chunk_size or 64, max_length=model.max_length, fisher=True,
                  runtime=runtime)
    few = data.load()
    scorer = model.scorer(few.task, runtime=runtime)
    refuse_non_finite_model(scorer, scorer.base_model, "its Fisher scores would be meaningless")
    scores = fim_layer_scores(scorer, few.train, aggregate=aggregate, normalize=normalize, config=fisher,
                              progress="fisher")
    out = Path(out) if out else Path("runs") / f"fim-{few.task.name}-{data.k}-{data.seed}"
    n_used = min(len(few.train), fisher.n_examples or len(few.train))
    with atomic_files(out) as tmp:  # both files, or neither
        write_json(tmp / "fim.json", {"task": few.task.name, "k": data.k, "seed": data.seed, "model": scorer.base_model,
                                      "mode": model.mode, "n_examples": n_used, **scores.to_dict()})
        layer_scores_bar(scores, tmp / "fim.png", title=f"{few.task.name} FIM per block (N={n_used})")
    return FimResult(few.task.name, data.k, data.seed, fisher.kind, aggregate, scores, out)
