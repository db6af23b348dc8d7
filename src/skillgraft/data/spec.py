"""DataSpec: which examples a run sees — task, k-shot draw, data root, evaluation subset."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from skillgraft.data.sampling import FewShotData, load_kshot
from skillgraft.data.user import UserData, load_user_data
from skillgraft.errors import SkillgraftError
from skillgraft.spec import COUNT_MAX, OMITTED_AT_DEFAULT, Seed, Spec


class DataSpec(Spec):
    """A k-shot draw of a registered task (LM-BFF sampling) and the test subset it is evaluated on."""

    task: str = Field("SST-2", description="task name (see `skillgraft tasks`)")
    k: int = Field(64, ge=1, le=COUNT_MAX, description=(
        "examples per label (k-shot; the paper's main tables use 64); dev = the "
        "next k per label"))
    seed: Seed = Field(42, description="data seed (LM-BFF: 13, 21, 42, 87, 100)")
    data_dir: Path | None = Field(None, description="data root (default: $SKILLGRAFT_DATA, ./data, ../shared/data)")
    test_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "evaluate on a fixed seeded sample of N test examples"))
    dev_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "score the dev split (best checkpoint, grid, localizer selection) on a fixed seeded sample of N of its "
        "rows (default: all k per label; for large k on a CPU)"), json_schema_extra=OMITTED_AT_DEFAULT)

    def load(self, task=None) -> FewShotData:
        """The :class:`~skillgraft.data.sampling.FewShotData` of this draw (test and dev subsets applied).

        ``task``: a Task object to use instead of looking ``self.task`` up in the registry (e.g. the task
        a saved model records).
        """
        return load_kshot(task or self.task, self.k, self.seed, self.data_dir, test_limit=self.test_limit,
                          dev_limit=self.dev_limit)


class UserDataSpec(Spec):
    """A user's own data file(s) instead of a registered task (``--data``; docs: README "Graft your own model")."""

    data: Path | None = Field(None, description="your examples: a .jsonl, .csv or .tsv file, a Hugging Face dataset "
                                                "folder (save_to_disk, or data files in a hub repository's layout) or "
                                                "a Hugging Face Hub dataset name")
    data_config: str | None = Field(None, description="configuration of a Hugging Face dataset (e.g. 'sst2' of 'glue')")
    data_split: str | None = Field(None, description="split of a Hugging Face dataset to learn on (default: 'train', "
                                                     "or its only split)")
    eval_data: Path | None = Field(None, description="held-out examples to evaluate on (default: the dataset's "
                                                     "'validation' or 'test' split, else a seeded --eval-fraction of "
                                                     "--data)")
    eval_split: str | None = Field(None, description="split to evaluate on, of --eval-data if given, else of --data "
                                                     "(default: 'validation', else 'test')")
    eval_fraction: float = Field(0.2, gt=0, lt=1, description="share of --data held out for evaluation when it has no "
                                                              "evaluation split and no --eval-data is given")
    text_field: str = Field("text", description="field holding the text (classification)")
    text_pair_field: str | None = Field(None, description="field holding the second text of a pair task")
    label_field: str = Field("label", description="field holding the label (classification)")
    prompt_field: str | None = Field(None, description="field holding the prompt (generative data; with "
                                                       "--completion-field)")
    completion_field: str | None = Field(None, description="field holding the completion (generative data)")
    labels: list[str] | None = Field(None, description="the labels in the model's logit order (default: the fine-tuned "
                                                       "classifier's config.id2label, else inferred, sorted)")
    template: str | None = Field(None, description=(
        "prompt and causal modes: how a row is put to the model, with {text}, {text_pair} and {label} (the label is "
        "scored as a word where {label} stands), e.g. '{text} Topic: {label}' (default: '{text} It was {label}.', "
        "a pair: '{text} {text_pair} Answer: {label}.')"))
    k: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "k-shot: examples per label (per row for open-ended completions) "
        "used to localize (default: all rows)"))
    seed: Seed = Field(42, description="seed of the evaluation hold-out and of k-shot sampling")
    test_limit: int | None = Field(None, ge=1, le=COUNT_MAX, description=(
        "evaluate on a fixed seeded sample of N examples"))

    @model_validator(mode="after")
    def _fields_agree(self):
        if (self.prompt_field is None) != (self.completion_field is None):
            raise ValueError("generative data needs both --prompt-field and --completion-field")
        if self.eval_data is not None and self.data is None:
            raise ValueError("--eval-data needs --data")
        if self.template is not None:
            if self.generative:
                raise ValueError("--template is for classification rows; generative rows carry their own prompts")
            from skillgraft.data.tasks import from_readable  # noqa: PLC0415

            try:
                from_readable(self.template, pair=self.text_pair_field is not None)
            except SkillgraftError as e:
                raise ValueError(f"--template {self.template!r}: {e}") from None
        return self

    def refuse_options_without_data(self) -> None:
        """Refuse, before any work, options that describe a ``--data`` file given without one (a verb reading a
        registered task or a run's data ignored them silently). Not a validator: ``merge`` shares these options
        across its per-model files, so its shared spec has no ``data`` of its own."""
        alone = sorted(self.model_fields_set & {"data_config", "data_split", "eval_split", "eval_fraction",
                                                "text_field", "text_pair_field", "label_field", "prompt_field",
                                                "completion_field", "labels", "template"})
        if alone and self.data is None and self.eval_data is None:
            names = ", ".join(f"--{n.replace('_', '-')}" for n in alone)
            raise SkillgraftError(f"{names} {'describes' if len(alone) == 1 else 'describe'} a --data file: give "
                                  f"--data, or leave {'it' if len(alone) == 1 else 'them'} out")

    @property
    def generative(self) -> bool:
        return self.completion_field is not None

    def load(self, model_labels: tuple[str, ...] | None = None) -> UserData:
        """The examples (:class:`~skillgraft.data.user.UserData`); ``model_labels``: a classifier's id2label."""
        if self.data is None:
            raise SkillgraftError("no --data file given")
        return load_user_data(self, model_labels)
