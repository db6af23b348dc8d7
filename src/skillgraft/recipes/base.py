"""Recipes: experiments described by a typed spec and run by ``skillgraft run FILE.yaml``.

A recipe is a function ``fn(spec, run: RunDir) -> dict`` registered with ``@recipe("name", Spec)``, where
``Spec`` (a subclass of :class:`ExperimentSpec`) declares every setting the recipe reads, with its default,
range and help. The YAML names the recipe (``recipe: calibration``) and sets fields of its spec; an unknown
or misspelt field, or a bad value, is refused with its name before any work and before any output folder
exists. ``run_recipe`` writes the run folder atomically (it appears only when the recipe finished), with
``config.json`` (the resolved spec) and ``metrics.json`` (what the function returned). Expensive stages
(fine-tuning, localization, trained baselines) live in the :class:`~skillgraft.pipeline.Store`, so a
re-run or another recipe on the same settings reuses them. The settings several recipes share (seeds, task
lists, the grafts a comparison holds, OOD transfers) are the mixins here; recipe modules import only this module
(and :mod:`skillgraft.pipeline`), never each other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from skillgraft.data.spec import DataSpec
from skillgraft.data.tasks import get_task
from skillgraft.errors import SkillgraftError
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.io import atomic_dir, check_target, write_json
from skillgraft.models.gguf import in_store
from skillgraft.models.placement import Placement, Precision, using
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline.ood import TransferSpec, with_limits
from skillgraft.pipeline.report import RunDir, mean_std  # noqa: F401 - re-exported for recipes
from skillgraft.pipeline.member import Member
from skillgraft.pipeline.opening import prepare
from skillgraft.pipeline.store import Store
from skillgraft.pipeline.trained import BitFitSpec, RetrainSpec
from skillgraft.spec import COUNT_MAX, Seed, Spec
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
    dev_limit: int | None = DataSpec.model_fields["dev_limit"]
    cache_dir: Path | None = Field(None, description="store of finished stages (null: $SKILLGRAFT_CACHE or runs/cache)")
    progress: bool = Field(False, description="progress bars for every stage")
    device: str = Placement.model_fields["device"]
    precision: Precision = Placement.model_fields["precision"]
    deterministic: bool = Placement.model_fields["deterministic"]
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description="the fine-tuning grafts come from")

    def model_spec(self) -> ModelSpec:
        return ModelSpec(model=self.model, mode=self.mode, pooling=self.pooling, max_length=self.max_length)

    def data_spec(self, task: str, seed: int, *, k: int | None = None) -> DataSpec:
        return DataSpec(task=task, k=k or self.k, seed=seed, data_dir=self.data_dir, test_limit=self.test_limit,
                        dev_limit=self.dev_limit)

    def member(self, run: RunDir, task: str, seed: int, *, k: int | None = None) -> Member:
        """Fine-tune (or find in the store) ``task`` at data ``seed``; θ_ft, θ_pre and the data."""
        return prepare(run.store, self.model_spec(), self.data_spec(task, seed, k=k), self.finetune,
                       progress=self.progress, runtime=run.runtime)


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


def _task_names(names: list[str]) -> list[str]:
    try:
        return [get_task(t).name for t in names]
    except SkillgraftError as e:
        raise ValueError(str(e)) from None


# Registered task names, canonicalised (``sst-2`` → ``SST-2``); an unknown name is refused at validation.
TaskNames = Annotated[list[str], AfterValidator(_task_names)]


def inherit_finetune(values, section: str, *, drop: tuple[str, ...] = ()):
    """Before validation: fields of ``values[section]`` (a FinetuneConfig) left out take ``values['finetune']``'s,
    except ``drop``."""
    if not isinstance(values, dict):
        return values
    base, own = values.get("finetune") or {}, values.get(section)
    if isinstance(base, FinetuneConfig):
        base = base.model_dump(exclude_unset=True)
    if not isinstance(base, dict) or not (own is None or isinstance(own, dict)):
        return values  # a ready FinetuneConfig, or a bad value the field's validation names
    inherited = {k: v for k, v in base.items() if k in FinetuneConfig.model_fields and k not in drop}
    return {**values, section: {**inherited, **(own or {})}}


def switch(v):
    """YAML ``true`` turns an optional sub-spec on with its defaults, ``false`` off."""
    return {} if v is True else None if v is False else v


class GraftVariantsMixin(Spec):
    """The models a calibration / OOD comparison holds beside FT: learned grafts, re-training, BitFit."""

    localize: LocalizeConfig = Field(default_factory=LocalizeConfig, description=(
        "the learned localizer's settings; `budgets` gives one region per budget from one localization"))
    retrain: RetrainSpec | None = Field(None, description=(
        "graft re-training (Table 1) of one learned region; its `finetune` fields change the recipe's "
        "`finetune` (null: off)"))
    bitfit: BitFitSpec | None = Field(None, description="BitFit beside the grafts (null: off)")

    @field_validator("retrain", "bitfit", mode="before")
    @classmethod
    def _switch(cls, v):
        return switch(v)

    @model_validator(mode="before")
    @classmethod
    def _retrain_from_finetune(cls, values):
        """``retrain.finetune`` is the recipe's ``finetune`` with the given fields changed."""
        if not isinstance(values, dict):
            return values
        retrain = switch(values.get("retrain"))
        if isinstance(retrain, dict) and (retrain.get("finetune") is None or isinstance(retrain["finetune"], dict)):
            base = values.get("finetune") or {}
            base = base.to_dict() if isinstance(base, Spec) else base
            if isinstance(base, dict):
                values = {**values, "retrain": {**retrain, "finetune": {**base, **(retrain.get("finetune") or {})}}}
        return values

    @model_validator(mode="after")
    def _retrain_budget_is_learned(self):
        budget = self.retrain.budget if self.retrain else None
        if budget is not None and budget not in self.localize.budget_list:
            raise ValueError(f"retrain.budget: {budget} is not among localize.budgets "
                             f"{[b.label for b in self.localize.budget_list]}")
        return self


class TransfersMixin(Spec):
    """Source → OOD target transfers, each over data seeds (label maps checked before any work)."""

    seeds: list[Seed] = Field(default_factory=lambda: [13], min_length=1,
                             description="data seeds → mean (std); the paper uses [13, 21, 42, 87, 100]")
    ood_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "each OOD set: seeded sample of N examples after label mapping (not given: test_limit; null: all); a "
        "target's own `limit` wins"))
    transfers: list[TransferSpec] = Field(min_length=1, description=(
        "[{source: TASK, targets: [{task, labels: {target label: source label | null}}]}]; a bare target "
        "name means identical label names"))

    @field_validator("seeds", mode="before")
    @classmethod
    def _one_seed(cls, v):
        return [v] if isinstance(v, int) else v

    @model_validator(mode="before")
    @classmethod
    def _limits(cls, values):
        """``ood_limit`` defaults to ``test_limit``; each target's ``limit`` to ``ood_limit``."""
        if not isinstance(values, dict):
            return values
        limit = values.get("ood_limit", values.get("test_limit"))
        transfers = with_limits(values.get("transfers"), limit)
        return {**values, "ood_limit": limit, **({"transfers": transfers} if transfers is not None else {})}

    @model_validator(mode="after")
    def _mappable(self):
        for i, transfer in enumerate(self.transfers):
            try:
                transfer.check(f"transfers[{i}]")
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        return self


class LocalizerRun(Spec):
    """One localizer of a comparison: a registered name, its options and the label of its rows."""

    name: str = Field(description="registered localizer (docs/localizers.md)")
    label: str | None = Field(None, description="row label (default: the name)")
    options: dict = Field(default_factory=dict, description=(
        "the localizer's options; `budgets` here picks a subset of the recipe's `budgets` (default: all of them)"))

    @property
    def title(self) -> str:
        return self.label or self.name

    def resolved(self, budgets: list) -> Spec:
        """The localizer's validated options at ``budgets`` (a recipe's), or the subset its own options name."""
        from skillgraft.graft.localizers import get_localizer  # noqa: PLC0415
        from skillgraft.graft.selection import Budget  # noqa: PLC0415

        mine = self.options.get("budgets")
        chosen = budgets if mine is None else [Budget.parse(b) for b in mine]
        if any(b not in budgets for b in chosen):
            raise SkillgraftError(f"options.budgets {[b.label for b in chosen]} must be among the recipe's budgets "
                                  f"{[b.label for b in budgets]}")
        return get_localizer(self.name).options({**self.options, "budgets": [b.key for b in chosen]})

def size_budgets(v) -> list:
    """A recipe's ``budgets`` field: sizes only (fractions of the body or counts), never ``round``."""
    from skillgraft.graft.selection import Budget  # noqa: PLC0415

    out = [Budget.parse(x) for x in ([v] if isinstance(v, (int, float, str)) else v)]
    if any(x.rounding for x in out):
        raise ValueError("budgets must be sizes (fractions or counts); 'round' has no size to compare at")
    return out


def check_localizer_runs(localizers: list[LocalizerRun], resolve: Callable[[LocalizerRun], object]) -> None:
    """Distinct labels, and each run's options resolvable (``resolve``), as one ValueError naming the run."""
    titles = [loc.title for loc in localizers]
    if len(set(titles)) != len(titles):
        raise ValueError(f"localizers: two share a label ({titles}); give each a `label`")
    for i, loc in enumerate(localizers):
        try:
            resolve(loc)
        except SkillgraftError as e:
            raise ValueError(f"localizers[{i}] ({loc.name}): {e}") from None



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


def placement_of(spec) -> Placement:
    """A recipe's ``device``, ``precision`` and ``deterministic`` (its placement: where and how every stage it runs
    computes); an unknown device is one line naming the field, before any work."""
    return Placement.build({k: getattr(spec, k) for k in ("device", "precision", "deterministic") if hasattr(spec, k)},
                           where="recipe")


def run_spec(entry: Recipe, spec, out: str | os.PathLike, *, cache: str | os.PathLike | None = None,
             overwrite: bool = False) -> Path:
    """Run a registered recipe with a validated spec into ``out`` (atomic; refused if it exists unless
    ``overwrite``)."""
    out = Path(out)
    store = Store(cache if cache is not None else spec.cache_dir)
    check_target(out, overwrite, {"--cache": store.root, "data_dir": getattr(spec, "data_dir", None)})
    placement = placement_of(spec)  # an unknown device is refused here, before any work
    with atomic_dir(out, overwrite=overwrite) as tmp, in_store(store.root), using(placement) as runtime:  # GGUF
        run = RunDir(tmp, store, runtime=runtime)  # the recipe's placement, passed down from here
        write_json(tmp / "config.json", spec.to_dict())
        metrics = entry.fn(spec, run) or {}
        write_json(tmp / "metrics.json", metrics)
    return out
