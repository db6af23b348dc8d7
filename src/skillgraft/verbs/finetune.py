"""``skillgraft finetune``: fine-tune a model on a k-shot draw of a task into a run directory (model, config,
metrics, plots); every refusal (an existing folder, bad ``--layers``) before training."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from skillgraft.data.spec import DataSpec
from skillgraft.models.spec import ModelSpec
from skillgraft.train.config import FinetuneConfig
from skillgraft.verbs.result import VerbResult


@dataclass
class FinetuneResult(VerbResult):
    """A finished fine-tuning run: its folder and the metrics ``run_finetune`` wrote (``metrics.json``)."""

    out: Path
    k: int
    seed: int
    metrics: dict

    @property
    def test(self) -> dict | None:
        return self.metrics.get("test")

    def document(self) -> dict:
        """The run folder and its metrics.json."""
        return {"out": self.out, **self.metrics}

    def line(self) -> str:
        """The one line ``skillgraft finetune`` prints (the test scores when the run has a test split)."""
        t, m = self.test, self.metrics
        scores = ""
        if t is not None:
            f1 = f" F1 {t['f1']:.4f}" if "f1" in t else ""
            scores = f" test acc {t['accuracy']:.4f}{f1} ECE {t['ece']:.4f} |"
        return (f"{m['task']} k={self.k} seed={self.seed}:{scores} {m['steps']} steps in {m['train_seconds']:.0f}s "
                f"({m['train_examples_per_second']:.1f} ex/s) → {self.out}")


def default_out(data: DataSpec) -> Path:
    """The run directory when none is given: ``runs/ft-<task>-<k>-<seed>``."""
    return Path("runs") / f"ft-{data.task}-{data.k}-{data.seed}"


def finetune(data: DataSpec, model: ModelSpec, config: FinetuneConfig, *, out: str | os.PathLike | None = None,
             layers: str | None = None, overwrite: bool = False, runtime=None) -> FinetuneResult:
    """Fine-tune ``model`` on ``data``'s k-shot draw into ``out`` (default :func:`default_out`). ``layers``: train only
    these blocks — ``'0,3,5'``, or ``fim:top-K`` / ``fim:bottom-K`` / ``random-K`` (surgical fine-tuning).
    ``runtime``: where it computes (None: the placement the command line activated), passed down."""
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415
    from skillgraft.train import run_finetune  # noqa: PLC0415

    runtime = boundary(runtime)

    out = check_target(Path(out) if out is not None else default_out(data), overwrite)  # before any work
    if layers is not None:
        from skillgraft.fisher.surgical import parse_layers  # noqa: PLC0415

        config = config.replace(layers=parse_layers(layers, task=data.task, model=model.model, mode=model.mode,
                                                    k=data.k, seed=data.seed, data_dir=data.data_dir))
    from skillgraft.pipeline.memory_plan import plan_training  # noqa: PLC0415

    plan_training("finetune", model.model, micro_batch=config.batch_size, max_length=model.max_length,
                  runtime=runtime)  # or one line
    metrics = run_finetune(data, out, model=model, finetune=config, overwrite=overwrite, runtime=runtime)
    return FinetuneResult(out, data.k, data.seed, metrics)
