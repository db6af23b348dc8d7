"""One fine-tuning run end to end: data → scorer → train → test metrics → run directory (atomic)."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from skillgraft.lazy import np
from pydantic import Field

from skillgraft import __version__
from skillgraft.data.spec import DataSpec
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram
from skillgraft.evaluate.predict import evaluate, labels_of
from skillgraft.errors import SkillgraftError
from skillgraft.io import _remove, atomic_dir, atomic_path, check_target, write_json
from skillgraft.untrusted import read_json
from skillgraft.models.spec import MaxLength, Mode, ModelSpec, Pooling
from skillgraft.spec import COUNT_MAX, Seed, Spec
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.finetune import finetune as train

if TYPE_CHECKING:
    from skillgraft.models.scorer import Scorer
    from skillgraft.models.loading import ModelRef


def write_probs(path: Path, probs: np.ndarray, labels: np.ndarray, label_names) -> None:
    """Per-example probabilities as CSV: index, gold label, one column per label."""
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "label", *[f"p_{name}" for name in label_names]])
        for i, (row, y) in enumerate(zip(probs, labels)):
            w.writerow([i, label_names[y], *[f"{p:.6f}" for p in row]])


class RunConfig(Spec):
    """A fine-tuning run directory's ``config.json``: what rebuilds θ_pre exactly (same base, scorer and head
    initialisation) and the k-shot draw the run saw."""

    skillgraft_version: str | None = Field(None, description="skillgraft version that wrote the run")
    task: str | None = Field(None, description="task name")
    k: int = Field(ge=1, le=COUNT_MAX, description="examples per label of the k-shot draw")
    seed: Seed = Field(description="data seed of the k-shot draw")
    model: str = Field(description="the pre-trained model (hub name or path, as resolved)")
    mode: Mode = Field(description="scorer: head | prompt | causal")
    pooling: Pooling | None = Field(description="head pooling")
    max_length: MaxLength = Field(description="max tokens per example")
    data_dir: str | None = Field(None, description="data root given to the run")
    test_limit: int | None = DataSpec.model_fields["test_limit"]
    dev_limit: int | None = DataSpec.model_fields["dev_limit"]  # the dev rows its best checkpoint was chosen on
    finetune: FinetuneConfig = Field(description="the fine-tuning settings (finetune.seed: the head's initialisation)")
    num_processes: int = Field(1, ge=1, description="processes the run trained on")

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec(model=self.model, mode=self.mode, pooling=self.pooling, max_length=self.max_length)


def run_finetune(data: DataSpec, out_dir: str | os.PathLike, *, model: ModelSpec | None = None,
                 finetune: FinetuneConfig | None = None, overwrite: bool = False, accelerator=None,
                 progress: bool = True, runtime=None) -> dict:
    """Fine-tune ``model`` on the k-shot draw ``data`` and write ``out_dir``; returns the metrics.

    ``out_dir`` gets ``model/`` (HF checkpoint + scorer config), ``config.json`` (:class:`RunConfig`),
    ``metrics.json``, ``test_probs.csv``, ``confidence.png`` and ``reliability.png``; it appears only when
    complete. An existing ``out_dir`` is refused before any training unless ``overwrite``. ``runtime``: the run's
    placement, passed down from its verb (None: the active one, if any).
    """
    from skillgraft.models.placement import accelerator_for  # noqa: PLC0415

    model = model or ModelSpec()
    check_target(out_dir, overwrite, {"--model": model.model, "--data-dir": data.data_dir})
    config = finetune or FinetuneConfig()
    few = data.load()
    scorer = model.scorer(few.task, head_seed=config.seed, runtime=runtime)  # placed as it loads
    accelerator = accelerator or accelerator_for(scorer)
    from skillgraft.models.anatomy import fingerprint  # noqa: PLC0415
    from skillgraft.resume import current, discard, resume_point  # noqa: PLC0415
    from skillgraft.spec import stable_hash  # noqa: PLC0415

    from skillgraft.io import sibling  # noqa: PLC0415

    # the same command resumes a stopped run: beside out_dir, or inside the open resume point of a store stage
    # (out_dir is then in the stage's temporary folder, which a later process never sees)
    outer = current()
    resume = outer / "run" if outer is not None else sibling(out_dir, "resume")
    key = {"model": model.to_dict(), "weights": fingerprint(scorer), "config": config.to_dict(),
           "examples": stable_hash([[e.text_a, e.text_b, e.label] for e in [*few.train, *(few.dev or [])]])}
    with resume_point(resume, key=key):
        result = train(scorer, few.train, few.dev, config, k=data.k, accelerator=accelerator, progress=progress)
    metrics = {"task": few.task.name, "k": data.k, "seed": data.seed, "steps": result.steps,
               "best_step": result.best_step, "best_dev": result.best_dev, "train_seconds": round(result.seconds, 2),
               "train_examples_per_second": round(result.examples_per_second, 2),
               "trainable_parameters": result.trainable_parameters, "history": result.history}
    if not accelerator.is_main_process:
        return metrics
    t0 = time.perf_counter()
    test_metrics, probs = evaluate(result.scorer, few.test, progress="test" if progress else False)
    metrics["test"] = test_metrics
    metrics["eval_examples_per_second"] = round(len(few.test) / (time.perf_counter() - t0), 2)
    resolved = RunConfig(skillgraft_version=__version__, task=few.task.name, k=data.k, seed=data.seed,
                         model=scorer.base_model, mode=model.mode, pooling=scorer.pooling,
                         max_length=model.max_length, data_dir=str(data.data_dir) if data.data_dir else None,
                         test_limit=data.test_limit, dev_limit=data.dev_limit, finetune=config,
                         num_processes=accelerator.num_processes)
    labels = labels_of(few.test)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        result.scorer.save_pretrained(tmp / "model")
        write_json(tmp / "config.json", resolved.to_dict())
        write_json(tmp / "metrics.json", metrics)
        write_probs(tmp / "test_probs.csv", probs, labels, few.task.labels)
        confidence_histogram({"fine-tuned": probs}, tmp / "confidence.png", title=f"{few.task.name} test")
        reliability_diagram({"fine-tuned": (probs, labels)}, tmp / "reliability.png", title=f"{few.task.name} test")
    discard(resume)  # the run is complete: its saved state is no longer needed
    return metrics


def load_finetuned(run_dir: str | os.PathLike, base=None, runtime=None) -> tuple[Scorer, Scorer, RunConfig, ModelRef]:
    """(fine-tuned scorer, pre-trained scorer, run config, the base's model reference) of a fine-tuning run
    directory; ``base``: that reference when the run resolved it already (resolved here otherwise, once);
    ``runtime``: the run's placement (both models are placed there as they load)."""
    run_dir = Path(run_dir)
    model_dir = run_dir / "model"
    if not model_dir.is_dir():
        if (run_dir / WEIGHTS_DROPPED).is_file():  # (its text says why; not echoed: a file is not a message)
            raise SkillgraftError(f"{run_dir}: this run kept its scores, not its weights (dropped once read, e.g. a "
                                  f"screened grid point; {WEIGHTS_DROPPED} says why): there is no model to open")
        raise SkillgraftError(f"{run_dir}: not a fine-tuning run directory (no model/ folder)")
    cfg = read_run_config(run_dir)
    from skillgraft.models.scorer import Scorer  # noqa: PLC0415

    ft = Scorer.from_pretrained(model_dir, runtime=runtime)
    try:  # the base resolved and loaded in one go (models.loading.load), its reference handed back on the scorer
        pre = cfg.model_spec.scorer(ft.task, head_seed=cfg.finetune.seed, ref=base, runtime=runtime)
    except SkillgraftError as e:  # the recorded base, as typed to finetune (a relative name is read from here)
        raise SkillgraftError(
            f"{run_dir / 'config.json'}: its field 'model' ({cfg.model!r}, the base this run was fine-tuned from, as "
            f"given to finetune) cannot be loaded from {Path.cwd()}: {e}. A relative name is read from the current "
            "folder: run from the folder the fine-tuning ran in") from None
    return ft, pre, cfg, pre.ref


WEIGHTS_DROPPED = "WEIGHTS-DROPPED.txt"


def drop_weights(run_dir: str | os.PathLike, why: str) -> int:
    """Remove a finished run's ``model/`` (its metrics, config and plots stay) and leave ``why`` in its place; returns
    the bytes freed (0: already dropped). For runs only their scores are read from, e.g. a screened grid point."""
    run_dir = Path(run_dir)
    model_dir = run_dir / "model"
    if not model_dir.is_dir():
        return 0
    (run_dir / WEIGHTS_DROPPED).write_text(why.rstrip() + "\n", encoding="utf-8")  # first: never a bare run dir
    aside = run_dir / f".model.dropped-{os.getpid()}"
    try:  # one rename: a reader sees the whole model or none, and of two processes dropping it one does
        os.rename(model_dir, aside)
    except FileNotFoundError:
        return 0
    freed = sum(f.stat().st_size for f in aside.rglob("*") if f.is_file())
    _remove(aside)
    return freed


def read_run_config(run_dir: str | os.PathLike) -> RunConfig:
    """A run directory's ``config.json`` as a :class:`RunConfig`; a missing or damaged file, or a field missing
    or at fault, is one error naming the file and the field. ``finetune.seed`` (the head's initialisation)
    must be recorded: its default would silently rebuild another θ_pre."""
    path = Path(run_dir) / "config.json"
    raw = read_json(path, what="fine-tuning run config")
    ft = raw.get("finetune") if isinstance(raw, dict) else None
    if isinstance(ft, dict) and "seed" not in ft:
        raise SkillgraftError(f"{path}: field 'finetune.seed' (the head's initialisation) is missing")
    return RunConfig.read(path, what="fine-tuning run config")
