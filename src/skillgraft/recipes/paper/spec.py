"""The paper recipe's spec (:class:`PaperSpec`): Table 2's tasks, seeds, budgets and localizers, the OOD transfers
of Tables 3 and 7, Fig. 5's fine-tunings and the paper's fine-tuning grid; the tasks' groups and stand-in test sets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from skillgraft.data import get_task
from skillgraft.errors import SkillgraftError
from skillgraft.graft.selection import Budget
from skillgraft.pipeline.grid import GridSpec
from skillgraft.pipeline.ood import TransferSpec, with_limits
from skillgraft.recipes.base import (ExperimentSpec, LocalizerRun, SeedsMixin, check_localizer_runs,
                                     size_budgets)
from skillgraft.spec import COUNT_MAX, Seed, Spec
from skillgraft.train import FinetuneConfig

SINGLE = ["SST-2", "sst-5", "mr", "cr", "mpqa", "subj", "trec", "ag_news"]
PAIRS = ["RTE", "MRPC", "QNLI", "SNLI", "MNLI", "QQP"]
# What the shared data's test split is where it is not LM-BFF's (data/MANIFEST.md).
STAND_INS = {"QQP": "no test split in the shared data: each draw is tested on the rows of the 9,999-example train "
                    "subset outside its own train + dev examples (LM-BFF: GLUE dev)",
             "MNLI": "TextFooler's 1,000-example tokenised sample of dev_matched (LM-BFF: all of dev_matched)",
             "ag_news": "full test; train pool is a 5,000-example sample of 120k",
             "QNLI": "GLUE dev (complete); train pool is a 9,999-example subset",
             "SNLI": "official test (complete); train pool is a 9,999-example subset"}
STAND_IN_TESTS = {"MNLI", "QQP"}  # marked † in Table 2: their test set is not LM-BFF's at all
MOONSHOT_TASKS = ["SST-2", "mr", "cr"]
METRICS = ["score", "accuracy", "ece", "agreement", "share_of_ft", "gap_closed"]
# The paper's OOD transfers (Tables 3 and 7), label maps as in recipes/ood.yaml (target label → source label).
# NLI: the paper's "MNLI (0/1)" keeps contradiction and entailment only (footnote 2).
_NLI_01 = {"entailment": "entailment", "contradiction": "not_entailment", "neutral": None}
_SAME01 = {"0": "0", "1": "1"}
PAPER_TRANSFERS = [
    {"source": "SST-2", "targets": [{"task": "imdb", "labels": {"neg": "0", "pos": "1"}},
                                    {"task": "yelp_polarity", "labels": _SAME01}]},
    {"source": "mpqa", "targets": [{"task": "SST-2", "labels": _SAME01}, {"task": "yelp_polarity", "labels": _SAME01}]},
    {"source": "QNLI", "targets": [{"task": "MNLI", "labels": _NLI_01}, {"task": "SNLI", "labels": _NLI_01}]},
]


class PaperSpec(ExperimentSpec, SeedsMixin):
    """Paper Table 2 (64-shot, prompt-based SGD FT, grafts ≤ 0.01%) on the configured model, beside the paper."""

    mode: Literal["head", "prompt", "causal"] = Field("prompt", description=(
        "scorer: prompt (the paper's: LM-BFF template + label words at the mask) | head | causal"))
    tasks: list[str] = Field(default_factory=lambda: SINGLE + PAIRS, min_length=1, description="tasks to run")
    seeds: list[Seed] = Field(default_factory=lambda: [13, 21, 42], min_length=1,
                             description="data seeds → mean (std); the paper uses [13, 21, 42, 87, 100]")
    task_seeds: dict[str, list[Seed]] = Field(default_factory=lambda: {t: [13] for t in PAIRS}, description=(
        "seeds of particular tasks instead of `seeds` (default: one seed for the sentence-pair tasks)"))
    budgets: list[Budget] = Field(default_factory=lambda: [Budget.parse(x) for x in (1e-5, 1e-4, 1e-3)],
                                  min_length=1, description="graft sizes, fractions of the body (or counts)")
    localizers: list[LocalizerRun] = Field(
        default_factory=lambda: [LocalizerRun(name="learned", label="paper (learned)",
                                              options={"steps": 50, "eval_every": 10})],
        min_length=1, description="localizers compared at every budget; the first is the reference (the paper's)")
    ood: list[TransferSpec] = Field(default_factory=lambda: [TransferSpec.build(t) for t in PAPER_TRANSFERS],
                                    description=(
        "Table 7 / Table 3 OOD sets: [{source, targets: [{task, labels: {target label: source label | null}}]}] "
        "(default: SST-2 → imdb, yelp_polarity; mpqa → SST-2, yelp_polarity; QNLI → MNLI, SNLI (0/1)); a "
        "transfer runs when its source is among `tasks`, on Table 2's models ([]: none)"))
    ood_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "each OOD set: seeded sample of N examples after label mapping (not given: test_limit; null: all); a "
        "target's own `limit` wins"))
    ood_localizers: list[str] | None = Field(None, description=(
        "labels of the localizers whose grafts are scored on the OOD sets, beside the pre-trained and fine-tuned "
        "models (null: every localizer; the paper's Table 3 / Fig. 7 compare FT with its learned grafts)"))
    finetunes: dict[str, dict] = Field(default_factory=dict, description=(
        "Fig. 5: label → FinetuneConfig fields laid over `finetune` (an `optimizer` change without `lr` takes that "
        "optimizer's default lr), each fine-tuned on `finetune_tasks` and grafted by the reference localizer at "
        "every budget; one equal to `finetune` is Table 2's fine-tuning ({}: none)"))
    finetune_tasks: list[str] = Field(default_factory=lambda: ["SST-2"], min_length=1, description=(
        "tasks the `finetunes` run on (seeds as for Table 2)"))
    grid: GridSpec | None = Field(None, description=(
        "choose each (task, seed)'s batch size and lr on dev from this grid (the paper's: {batch_sizes: [2, 4, 8], "
        "lrs: [1e-2, 5e-3, 1e-3]}), each point a store stage; `finetune` gives the other settings (null: "
        "`finetune` as it is)"))

    @model_validator(mode="before")
    @classmethod
    def _ood_limits(cls, values):
        """``ood_limit`` defaults to ``test_limit``; each OOD target's ``limit`` to ``ood_limit``."""
        if not isinstance(values, dict):
            return values
        limit = values.get("ood_limit", values.get("test_limit", cls.model_fields["test_limit"].default))
        return {**values, "ood_limit": limit, "ood": with_limits(values.get("ood", PAPER_TRANSFERS), limit)}

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v):
        return size_budgets(v)

    @model_validator(mode="after")
    def _check(self):
        check_localizer_runs(self.localizers, self.options_of)
        for t in list(self.tasks) + list(self.task_seeds) + list(self.finetune_tasks):
            try:
                get_task(t)
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        titles = [loc.title for loc in self.localizers]
        for label in self.ood_localizers or []:
            if label not in titles:
                raise ValueError(f"ood_localizers: {label!r} is not the label of a localizer (labels: {titles})")
        for i, transfer in enumerate(self.ood):
            try:
                transfer.check(f"ood[{i}]")
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        for label in self.finetunes:
            try:
                self.finetune_of(label)
            except SkillgraftError as e:
                raise ValueError(str(e)) from None
        return self

    def finetune_of(self, label: str) -> FinetuneConfig:
        """``finetunes[label]`` laid over ``finetune``; an optimizer change without ``lr`` takes its default lr."""
        base, over = self.finetune.to_dict(), self.finetunes[label]
        if not isinstance(over, dict):
            raise SkillgraftError(f"finetunes.{label}: expected FinetuneConfig fields, got {over!r}")
        if over.get("optimizer", base["optimizer"]) != base["optimizer"] and "lr" not in over:
            base.pop("lr")
        return FinetuneConfig.build({**base, **over}, where=f"finetunes.{label}")

    def localizers_ood(self) -> list[LocalizerRun]:
        """The localizers whose grafts are scored out of distribution (``ood_localizers``; None: all)."""
        wanted = self.ood_localizers
        return list(self.localizers) if wanted is None else [loc for loc in self.localizers if loc.title in wanted]

    def ood_of(self, task: str) -> list[tuple[int, TransferSpec]]:
        """The (index, transfer) pairs whose source is ``task``."""
        return [(i, t) for i, t in enumerate(self.ood) if t.source == get_task(task).name]

    def options_of(self, loc: LocalizerRun) -> Spec:
        """The localizer's validated options with this recipe's budgets (or the subset it names)."""
        return loc.resolved(self.budgets)

    def seeds_of(self, task: str) -> list[int]:
        return self.task_seeds.get(task) or self.task_seeds.get(get_task(task).name) or self.seeds
