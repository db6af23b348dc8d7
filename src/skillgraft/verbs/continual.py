"""``skillgraft continual add``: a task arrives; it trains only the coordinates no earlier task owns (paper §5.2).

The state folder and the learner are :mod:`skillgraft.pipeline.continual`; this verb opens (or creates) the state,
finds γ_task (given, or the store's single-task fine-tune + localize), trains the owned coordinates, re-scores every
learned task and saves the state atomically."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from skillgraft.data.spec import DataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region
from skillgraft.io import check_apart, roll_back, sibling
from skillgraft.locking import locked
from skillgraft.models.spec import MAX_LENGTH, ModelSpec
from skillgraft.pipeline.opening import prepare
from skillgraft.pipeline.store import Store
from skillgraft.train.finetune import FinetuneConfig
from skillgraft.verbs import converts_into_store
from skillgraft.verbs.result import VerbResult


@dataclass
class ContinualResult(VerbResult):
    """One ``continual add``: the task, its arrival order, |γ_task|, the coordinates it owns and those earlier tasks
    own, its test metrics, and its whole state entry (continual.json's, what ``--json`` prints)."""

    task: str
    order: int
    region_size: int
    owned_size: int
    shared_with_earlier: int
    test: dict
    entry: dict
    state: Path | None = None  # the state folder

    @classmethod
    def of(cls, entry: dict, state: str | os.PathLike | None = None) -> ContinualResult:
        return cls(entry["task"], entry["order"], entry["region_size"], entry["owned_size"],
                   entry["shared_with_earlier"], entry.get("test", {}), entry, state)

    @property
    def test_score(self) -> float:
        return self.test["score"]

    def to_dict(self) -> dict:
        return self.entry

    def document(self) -> dict:
        """The state folder and the task's entry in it."""
        return {"state": self.state, **self.entry}


@converts_into_store
def continual_add(state: str | os.PathLike, task: str, *, k: int = 16, seed: int = 13, data_dir=None,
                  model: str | None = None, mode: str = "head", region: str | os.PathLike | None = None,
                  finetune_config: FinetuneConfig | None = None, region_finetune_config: FinetuneConfig | None = None,
                  localize_config=None, init: str = "current", test_limit: int | None = None,
                  cache: str | os.PathLike | None = None, progress: bool = True, runtime=None) -> ContinualResult:
    """Add ``task`` to the continual state folder ``state`` (created on first use); returns its typed entry.

    γ_task is read from ``region`` (a Region or Graft folder) or learned from an independent single-task
    run (fine-tune with ``region_finetune_config`` or else ``finetune_config``, then localize with
    ``localize_config``): both are stages of the store ``cache`` (default ``$SKILLGRAFT_CACHE`` or
    ``runs/cache``), shared with ``skillgraft graft`` and the recipes at the same settings. The owned
    coordinates train with ``finetune_config``; a config left out is the spec's defaults (``FinetuneConfig()``,
    ``LocalizeConfig()``). After training, every learned task is evaluated on its test split (the DataSpec's
    seeded subset) with its own union graft, and the state is saved atomically.
    """
    from skillgraft.pipeline.continual import STATE_FILE, ContinualLearner, task_region  # noqa: PLC0415 - torch

    def draw(name: str, k: int, seed: int) -> DataSpec:
        return DataSpec.build({"task": name, "k": k, "seed": seed, "data_dir": data_dir, "test_limit": test_limit},
                              where="continual add")

    if init not in ("current", "graft"):
        raise SkillgraftError(f"init must be 'current' or 'graft', got {init!r}")
    state = Path(state)
    check_apart(state, {"--cache": Store(cache).root, "--data-dir": data_dir})  # the state is replaced whole on save
    # One `continual add` on a state at a time: a second one waits, then reads the state with the first's task
    # (before, both read the same state and the last to finish replaced it: the other's task was lost).
    import contextlib  # noqa: PLC0415

    lock = locked(sibling(state, "lock"), f"waiting for another `continual add` on {state} …") \
        if state.parent.is_dir() else contextlib.nullcontext()  # no folder made for the lock alone
    with lock:
        roll_back(state)  # a kill while the state was being replaced: the old state returns before it is read
        learner = ContinualLearner.load(state) if (state / STATE_FILE).is_file() else None
        if learner is None:
            if state.exists() and any(state.iterdir()):
                raise SkillgraftError(f"{state} exists and is not a continual state folder (no {STATE_FILE})")
            learner = ContinualLearner.create(model, mode)
        spec = draw(task, k, seed)
        data = spec.load()
        task = data.task.name
        info = {"k": k, "seed": seed}
        init_graft = None
        if region is not None:
            region_path = Path(region)
            if (region_path / "region.json").is_file():
                gamma = Region.load(region_path)
            elif (region_path / "graft_config.json").is_file():
                init_graft = Graft.from_pretrained(region_path)
                gamma = init_graft.region
            else:
                raise SkillgraftError(f"--region {region_path}: neither a region folder (region.json) "
                                      "nor a graft folder")
            info["region_source"] = str(region_path)
        else:
            settings, store = learner.settings, Store(cache)
            model_spec = ModelSpec(model=settings["model"], mode=settings["mode"], pooling=settings["pooling"],
                                   max_length=settings["max_length"] or MAX_LENGTH)
            from skillgraft.models.placement import boundary  # noqa: PLC0415

            member = prepare(store, model_spec, spec, region_finetune_config or finetune_config or FinetuneConfig(),
                             progress=progress, runtime=boundary(runtime))  # keyed by the run's precision
            gamma, init_graft, single = task_region(member, store, localize_config, progress=progress)
            del member
            info["region_source"] = "single-task fine-tune + localize"
            info["single_task"] = single
        if init == "graft" and init_graft is None:
            raise SkillgraftError("init='graft' needs a graft (give --region a graft folder, or let it learn one)")
        entry = learner.add_task(task, gamma, data.train, data.dev, finetune_config or FinetuneConfig(),
                                 init=init_graft if init == "graft" else None, progress=progress, info=info)
        for e in learner.entries:
            test = data.test if e["task"] == task else draw(e["task"], e.get("k", k), e.get("seed", seed)).load().test
            metrics, _ = learner.evaluate(e["task"], test)
            e.setdefault("test_history", []).append({"after": task, "score": metrics["score"], "n": metrics["n"]})
            if e["task"] == task:
                e["test"] = metrics
        learner.save(state)
        return ContinualResult.of(entry, state)


@dataclass
class LearnedTask:
    """One task of a continual state, as ``continual show`` lists it: its arrival order, |γ_task|, the coordinates it
    owns and those earlier tasks own, and its latest test score (None: never scored)."""

    order: int
    task: str
    region_size: int | None
    owned_size: int | None
    shared_with_earlier: int | None
    latest_test: float | None

    @classmethod
    def of(cls, entry: dict) -> LearnedTask:
        history = entry.get("test_history") or []
        return cls(entry["order"], entry["task"], entry.get("region_size"), entry.get("owned_size"),
                   entry.get("shared_with_earlier"), history[-1]["score"] if history else None)


@dataclass
class ContinualState(VerbResult):
    """``skillgraft continual show``: the state's base model and its tasks in arrival order; ``record`` (its
    continual.json) is what ``--json`` prints."""

    base_model: str | None
    tasks: list[LearnedTask]
    record: dict

    def document(self) -> dict:
        return self.record


def continual_show(state: str | os.PathLike) -> ContinualState:
    """``skillgraft continual show``: the state in ``state``, typed (one line if it is not a state folder)."""
    record = read_state(state)
    return ContinualState(record.get("base_model"), [LearnedTask.of(e) for e in record["tasks"]], record)


def read_state(state: str | os.PathLike) -> dict:
    """``skillgraft continual show``: the state's ``continual.json`` (one line if ``state`` is not a state folder)."""
    from skillgraft.untrusted import read_json  # noqa: PLC0415

    from skillgraft.pipeline.continual import STATE_FILE, checked_entries  # noqa: PLC0415

    state = Path(state)
    roll_back(state)
    if not (state / STATE_FILE).is_file():
        raise SkillgraftError(f"{state}: no continual.json; not a continual state folder")
    record = read_json(state / STATE_FILE, required=("tasks",), what="continual state")
    checked_entries(state, state / STATE_FILE, record)
    return record
