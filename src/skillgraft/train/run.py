"""One fine-tuning run end to end: data → scorer → train → test metrics → run directory (atomic)."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import numpy as np

from skillgraft import __version__
from skillgraft.data.sampling import load_kshot
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram
from skillgraft.evaluate.predict import evaluate, labels_of
from skillgraft.errors import SkillgraftError
from skillgraft.io import atomic_dir, atomic_path, check_target, read_json, write_json
from skillgraft.models.scorer import build_scorer
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.finetune import finetune


def write_probs(path: Path, probs: np.ndarray, labels: np.ndarray, label_names) -> None:
    """Per-example probabilities as CSV: index, gold label, one column per label."""
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "label", *[f"p_{name}" for name in label_names]])
        for i, (row, y) in enumerate(zip(probs, labels)):
            w.writerow([i, label_names[y], *[f"{p:.6f}" for p in row]])


def run_finetune(task: str, k: int, seed: int, out_dir: str | os.PathLike, *, model: str | None = None,
                 mode: str = "head", pooling: str | None = None, config: FinetuneConfig | None = None,
                 data_dir: str | None = None, max_length: int = 128, test_limit: int | None = None,
                 overwrite: bool = False, accelerator=None, progress: bool = True) -> dict:
    """Fine-tune ``model`` on a k-shot draw of ``task`` and write ``out_dir``; returns the metrics.

    ``out_dir`` gets ``model/`` (HF checkpoint + scorer config), ``config.json``, ``metrics.json``,
    ``test_probs.csv``, ``confidence.png`` and ``reliability.png``; it appears only when complete. An existing
    ``out_dir`` is refused before any training unless ``overwrite``.
    """
    from accelerate import Accelerator  # noqa: PLC0415

    check_target(out_dir, overwrite)
    config = config or FinetuneConfig()
    accelerator = accelerator or Accelerator()
    data = load_kshot(task, k, seed, data_dir, test_limit=test_limit)
    scorer = build_scorer(model, data.task, mode, pooling=pooling, max_length=max_length, head_seed=config.seed)
    result = finetune(scorer, data.train, data.dev, config, k=k, accelerator=accelerator, progress=progress)
    metrics = {"task": data.task.name, "k": k, "seed": seed, "steps": result.steps, "best_step": result.best_step,
               "best_dev": result.best_dev, "train_seconds": round(result.seconds, 2),
               "train_examples_per_second": round(result.examples_per_second, 2),
               "trainable_parameters": result.trainable_parameters, "history": result.history}
    if not accelerator.is_main_process:
        return metrics
    t0 = time.perf_counter()
    test_metrics, probs = evaluate(result.scorer, data.test, progress="test")
    metrics["test"] = test_metrics
    metrics["eval_examples_per_second"] = round(len(data.test) / (time.perf_counter() - t0), 2)
    resolved = {"skillgraft_version": __version__, "task": data.task.name, "k": k, "seed": seed,
                "model": scorer.base_model, "mode": mode, "pooling": scorer.pooling, "max_length": max_length,
                "data_dir": str(data_dir) if data_dir else None, "test_limit": test_limit,
                "finetune": config.to_dict(), "num_processes": accelerator.num_processes}
    labels = labels_of(data.test)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        result.scorer.save_pretrained(tmp / "model")
        write_json(tmp / "config.json", resolved)
        write_json(tmp / "metrics.json", metrics)
        write_probs(tmp / "test_probs.csv", probs, labels, data.task.labels)
        confidence_histogram({"fine-tuned": probs}, tmp / "confidence.png", title=f"{data.task.name} test")
        reliability_diagram({"fine-tuned": (probs, labels)}, tmp / "reliability.png", title=f"{data.task.name} test")
    return metrics


def load_finetuned(run_dir: str | os.PathLike):
    """(fine-tuned scorer, pre-trained scorer, resolved config) of a fine-tuning run directory."""
    from skillgraft.models import Scorer  # noqa: PLC0415

    run_dir = Path(run_dir)
    model_dir = run_dir / "model"
    if not model_dir.is_dir():
        raise SkillgraftError(f"{run_dir}: not a fine-tuning run directory (no model/ folder)")
    cfg = read_run_config(run_dir)
    ft = Scorer.from_pretrained(model_dir)
    pre = build_scorer(cfg["model"], ft.task, cfg["mode"], pooling=cfg["pooling"], max_length=cfg["max_length"],
                       head_seed=cfg["finetune"]["seed"])
    return ft, pre, cfg


# What a run's config.json must record to rebuild θ_pre exactly (same base, scorer and head initialisation).
RUN_FIELDS = ("k", "seed", "model", "mode", "pooling", "max_length", "finetune")


def read_run_config(run_dir: str | os.PathLike) -> dict:
    """A run directory's ``config.json``, checked: every field of :data:`RUN_FIELDS` present and well typed
    (an error names the file and the field), ``finetune.seed`` (the head's initialisation) included."""
    from skillgraft.models.spec import ModelSpec  # noqa: PLC0415

    path = Path(run_dir) / "config.json"
    cfg = read_json(path, required=RUN_FIELDS, what="fine-tuning run config")
    ModelSpec.build({f: cfg[f] for f in ("model", "mode", "pooling", "max_length")}, where=str(path))
    for name in ("k", "seed"):
        if not isinstance(cfg[name], int) or isinstance(cfg[name], bool):
            raise SkillgraftError(f"{path}: field {name!r} must be an integer, got {cfg[name]!r}")
    ft = cfg["finetune"]
    if not isinstance(ft, dict) or not isinstance(ft.get("seed"), int):
        got = f"a {type(ft).__name__}" if not isinstance(ft, dict) else f"seed {ft.get('seed', 'missing')!r}"
        raise SkillgraftError(f"{path}: field 'finetune.seed' (the head's initialisation) must be an integer; "
                              f"got {got}")
    return cfg
