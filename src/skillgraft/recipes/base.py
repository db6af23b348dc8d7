"""Recipes: experiments described by a typed spec and run by ``skillgraft run FILE.yaml``.

A recipe is a function ``fn(spec, run: RunDir) -> dict`` registered with ``@recipe("name", Spec)``, where
``Spec`` (a subclass of :class:`ExperimentSpec`) declares every setting the recipe reads, with its default,
range and help. The YAML names the recipe (``recipe: calibration``) and sets fields of its spec; an unknown
or misspelt field, or a bad value, is refused with its name before any work and before any output folder
exists. ``run_recipe`` writes the run folder atomically (it appears only when the recipe finished), with
``config.json`` (the resolved spec) and ``metrics.json`` (what the function returned). Expensive stages
(fine-tuning, localization, trained baselines) live in the :class:`~skillgraft.pipeline.Store`, so a
re-run or another recipe on the same settings reuses them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from skillgraft.data.spec import DataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.io import atomic_dir, check_target, write_json
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline.report import RunDir, mean_std  # noqa: F401 - re-exported for recipes
from skillgraft.pipeline.setup import Setup, prepare
from skillgraft.pipeline.store import Store
from skillgraft.spec import COUNT_MAX, Seed, Spec, read_yaml
from skillgraft.train import FinetuneConfig


class ExperimentSpec(Spec):
    """Settings every recipe shares: the model, the k-shot data, the fine-tuning, where stages are cached."""

    recipe: str = Field(description="the recipe's registered name")
    model: str | None = ModelSpec.model_fields["model"]
    mode: Literal["head", "prompt", "causal"] = ModelSpec.model_fields["mode"]
    pooling: Literal["cls", "mean", "last"] | None = ModelSpec.model_fields["pooling"]
    max_length: int = ModelSpec.model_fields["max_length"]
    k: int = DataSpec.model_fields["k"]
    data_dir: Path | None = DataSpec.model_fields["data_dir"]
    test_limit: int | None = DataSpec.model_fields["test_limit"]
    cache_dir: Path | None = Field(None, description="store of finished stages (null: $SKILLGRAFT_CACHE or runs/cache)")
    progress: bool = Field(False, description="progress bars for every stage")
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description="the fine-tuning grafts come from")

    def model_spec(self) -> ModelSpec:
        return ModelSpec(model=self.model, mode=self.mode, pooling=self.pooling, max_length=self.max_length)

    def data_spec(self, task: str, seed: int, *, k: int | None = None) -> DataSpec:
        return DataSpec(task=task, k=k or self.k, seed=seed, data_dir=self.data_dir, test_limit=self.test_limit)

    def setup(self, run: RunDir, task: str, seed: int, *, k: int | None = None) -> Setup:
        """Fine-tune (or find in the store) ``task`` at data ``seed``; θ_ft, θ_pre and the data."""
        return prepare(run.store, self.model_spec(), self.data_spec(task, seed, k=k), self.finetune,
                       progress=self.progress)


class SeedsMixin(Spec):
    """Tasks × data seeds → mean (std)."""

    tasks: list[str] = Field(default_factory=lambda: ["SST-2"], min_length=1, description="tasks to run")
    seeds: list[Seed] = Field(default_factory=lambda: [13], min_length=1,
                             description="data seeds → mean (std); the paper uses [13, 21, 42, 87, 100]")

    @field_validator("seeds", mode="before")
    @classmethod
    def _one_seed(cls, v):
        return [v] if isinstance(v, int) else v


class OneSeedMixin(Spec):
    """One data seed for every task, and the test evaluation's batch size."""

    seed: Seed = Field(13, description="data seed of every task's k-shot draw")
    eval_batch_size: int = Field(64, ge=1, le=COUNT_MAX, description="batch size of test evaluation")


@dataclass(frozen=True)
class Recipe:
    name: str
    spec: type[ExperimentSpec]
    fn: Callable


RECIPES: dict[str, Recipe] = {}


def recipe(name: str, spec: type[ExperimentSpec]):
    """Register ``fn(spec, run) -> dict`` as recipe ``name`` with its typed spec."""

    def wrap(fn):
        RECIPES[name] = Recipe(name, spec, fn)
        return fn

    return wrap


def load_recipe(path: str | os.PathLike, overrides: dict | None = None) -> tuple[Recipe, ExperimentSpec]:
    """The recipe a YAML file names and its validated spec (errors name the file and the field)."""
    import skillgraft.recipes  # noqa: F401, PLC0415 - registers the built-in recipes

    values = {**read_yaml(path), **(overrides or {})}
    name = values.get("recipe")
    if name is None:
        raise SkillgraftError(f"{path}: needs a top-level 'recipe:' naming one of {sorted(RECIPES)}")
    if name not in RECIPES:
        raise SkillgraftError(f"{path}: unknown recipe {name!r}; known: {sorted(RECIPES)}")
    entry = RECIPES[name]
    return entry, entry.spec.build(values, where=str(path))


def run_recipe(path: str | os.PathLike, out: str | os.PathLike | None = None, *, overrides: dict | None = None,
               cache: str | os.PathLike | None = None, overwrite: bool = False) -> Path:
    """Run the recipe a YAML file describes; returns the run directory.

    Everything is checked before any work: the spec, and the output folder (an existing one is refused
    unless ``overwrite``; then it is replaced whole when the new run is complete).
    """
    entry, spec = load_recipe(path, overrides)
    return run_spec(entry, spec, Path(out) if out else Path("runs") / Path(path).stem, cache=cache,
                    overwrite=overwrite)


def run_spec(entry: Recipe, spec, out: str | os.PathLike, *, cache: str | os.PathLike | None = None,
             overwrite: bool = False) -> Path:
    """Run a registered recipe with a validated spec into ``out`` (atomic; refused if it exists unless
    ``overwrite``)."""
    out = Path(out)
    check_target(out, overwrite)
    store = Store(cache if cache is not None else spec.cache_dir)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        run = RunDir(tmp, store)
        write_json(tmp / "config.json", spec.to_dict())
        metrics = entry.fn(spec, run) or {}
        write_json(tmp / "metrics.json", metrics)
    return out
