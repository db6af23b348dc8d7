"""A Setup: one fine-tuned model beside its pre-trained base, on one k-shot draw and its test subset.

Every runner starts here. :func:`prepare` fine-tunes (or finds in the store) a model from typed specs;
:func:`from_run` opens a fine-tuning run directory a user already has; :func:`from_pair` takes any two
Hugging Face checkpoints (θ_pre, θ_ft: hub names or folders saved by plain transformers) and the user's own
data files (:class:`~skillgraft.data.UserDataSpec`) or a registered task. Registered tasks load through
:class:`~skillgraft.data.DataSpec`, so the same (task, k, seed, test limit) always means the same
examples, whichever verb or recipe asks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from skillgraft.data.sampling import FewShotData
from skillgraft.data.spec import DataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.models.scorer import Scorer
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline.store import Store, data_digest, model_digest
from skillgraft.train import FinetuneConfig


@dataclass
class Setup:
    """θ_ft and θ_pre scorers of one fine-tuning run, the k-shot data and FT's probabilities per set."""

    ft: Scorer
    pre: Scorer
    data: FewShotData
    ft_dir: Path
    run_config: dict
    data_root: str | None = None  # the data root the examples were read from
    ft_seconds: float = 0.0
    probs: dict[str, np.ndarray] = field(default_factory=dict)  # FT's probabilities per evaluation set
    data_files: list[Path] | None = None  # a user's data files (instead of a registered task's)
    labels_note: str = ""                 # how the labels were decided (user data)
    graft_metadata: dict = field(default_factory=dict)  # recorded in every graft (a pair: its task, data, models)
    _identity: dict | None = field(default=None, repr=False)

    @property
    def task(self) -> str:
        return self.data.task.name

    @property
    def k(self) -> int:
        return self.data.k

    @property
    def seed(self) -> int:
        return self.data.seed

    @property
    def test(self):
        return self.data.test

    @property
    def total_parameters(self) -> int:
        """Parameters of the pre-trained model (``scorer.model``): the denominator of a sparsity in %."""
        return sum(p.numel() for p in self.pre.model.parameters())

    @property
    def finetune_config(self) -> FinetuneConfig:
        """The fine-tuning settings of a skillgraft run; for a checkpoint pair (trained elsewhere) the defaults
        with trained embeddings (what it changed is unknown: every body tensor counts)."""
        if "finetune" not in self.run_config:
            return FinetuneConfig.build({"freeze_embeddings": False}, where="checkpoint pair")
        return FinetuneConfig.build(self.run_config["finetune"], where=f"{self.ft_dir}/config.json finetune")

    def identity(self) -> dict:
        """What determines everything learned from this setup (part of every downstream cache key): the
        contents of θ_ft (with its head) and θ_pre, and the data (the draw and the files' content digest)."""
        if self._identity is None:
            self._identity = {"finetuned": scorer_digest(self.ft), "pretrained": scorer_digest(self.pre),
                              "mode": self.pre.mode, "data": self.data_key}
        return self._identity

    @property
    def data_key(self) -> dict:
        """The k-shot draw and the content hash of the data files it was drawn from."""
        if self.data_files is not None:
            from skillgraft.pipeline.store import file_digest  # noqa: PLC0415

            return {"task": self.task, "labels": list(self.data.task.labels), "k": self.k, "seed": self.seed,
                    "train_n": len(self.data.train), "test_n": len(self.test), "digest": file_digest(self.data_files)}
        return {"task": self.task, "k": self.k, "seed": self.seed, "test_n": len(self.test),
                "digest": data_digest(self.data.task, self.data_root)}


def scorer_digest(scorer) -> str:
    """Content digest of a scorer: the base model's fingerprint plus its task head's exact values."""
    import hashlib  # noqa: PLC0415

    from skillgraft.models.anatomy import carried_names, fingerprint  # noqa: PLC0415

    h = hashlib.sha256(fingerprint(scorer).encode())
    params = dict(scorer.named_parameters())
    for name in carried_names(scorer):
        h.update(name.encode())
        h.update(params[name].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def finetuned_run(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, *,
                  progress: bool = True) -> tuple[Path, float]:
    """The run directory of this fine-tuning (trained once, then found in the store) and its seconds."""
    from skillgraft.train.run import run_finetune  # noqa: PLC0415

    key = {"model": model.to_dict(), "model_digest": model_digest(model.model),
           "data": data.to_dict() | {"data_dir": None}, "data_digest": data_digest(data.task, data.data_dir),
           "finetune": finetune.to_dict()}
    t0 = time.perf_counter()

    def make(folder: Path) -> None:
        run_finetune(data.task, data.k, data.seed, folder / "run", model=model.model, mode=model.mode,
                     pooling=model.pooling, config=finetune, data_dir=data.data_dir, max_length=model.max_length,
                     test_limit=data.test_limit, overwrite=True, progress=progress)

    entry = store.fetch("ft", key, make, label=f"{data.task}-{data.k}-{data.seed}-{model.mode}")
    return entry / "run", time.perf_counter() - t0


def prepare(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, *,
            progress: bool = False) -> Setup:
    """Fine-tune (or find in the store) ``model`` on ``data``; load θ_ft, θ_pre and the data."""
    ft_dir, seconds = finetuned_run(store, model, data, finetune, progress=progress)
    setup = from_run(ft_dir, data_dir=data.data_dir, test_limit=data.test_limit)
    setup.ft_seconds = seconds
    return setup


def from_run(ft_dir: str | os.PathLike, *, data_dir: str | os.PathLike | None = None,
             test_limit: int | None = None) -> Setup:
    """Open a fine-tuning run directory: θ_ft, θ_pre (same head initialisation), its k-shot data.

    ``data_dir`` / ``test_limit`` override the run's own (None: the run's data root, full test set).
    """
    from skillgraft.train.run import load_finetuned  # noqa: PLC0415

    ft_dir = Path(ft_dir)
    if not ft_dir.exists():
        raise SkillgraftError(f"fine-tuning run not found: {ft_dir}")
    ft, pre, cfg = load_finetuned(ft_dir)
    ft.eval()
    pre.eval()
    spec = DataSpec.build({"task": ft.task.name, "k": cfg["k"], "seed": cfg["seed"],
                           "data_dir": data_dir or cfg.get("data_dir"), "test_limit": test_limit},
                          where=f"{ft_dir}/config.json")
    data = spec.load(ft.task)
    return Setup(ft, pre, data, ft_dir, cfg, data_root=str(spec.data_dir) if spec.data_dir else None)

