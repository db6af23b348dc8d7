"""Users' own data as a task built on the fly: JSONL, CSV/TSV, a Hugging Face dataset folder, or a hub dataset name.

Classification rows give a text (and optionally a second text) and a label; generative rows give a prompt
and a completion. Labels are declared (``labels``, in the order of the model's logits), taken from the
fine-tuned classifier's ``config.id2label``, or inferred from the data (sorted; integers 0..n-1 stay in
index order) — :class:`UserData` says which. Without a separate evaluation file, a dataset's 'validation' (else
'test') split is evaluated on, else a seeded fraction of the rows is held out; k-shot sampling (LM-BFF style,
per label) is optional. Hugging Face datasets (a ``save_to_disk`` folder, a folder of data files in a hub
repository's layout, or a hub name such as ``stanfordnlp/sst2``) are read with the ``datasets`` package
(:mod:`skillgraft.data.sources`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.lazy import np

from skillgraft.data.loading import Example, whole_number_label
from skillgraft.data.sampling import eval_subset, sample_kshot
from skillgraft.data.sources import open_source
from skillgraft.data.tasks import SENTIMENT, Task, from_readable
from skillgraft.errors import SkillgraftError

EVAL_SPLITS = ("validation", "test")          # default evaluation splits of a dataset, in order
MAX_LABEL_COMPLETIONS = 32  # completions drawn from at most this many distinct strings are labels
_GENERIC = re.compile(r"^LABEL_\d+$")


@dataclass(frozen=True)
class GenerativeTask(Task):
    """A prompt→completion task. ``labels`` are the distinct completions when they form a small closed set
    (then exact match is scored by ranking them); empty when completions are open-ended."""

    def __post_init__(self) -> None:
        if self.kind != "generative":
            raise SkillgraftError(f"task {self.name!r}: a generative task has kind 'generative', got {self.kind!r}")

    @classmethod
    def make(cls, name: str, completions: tuple[str, ...] = ()) -> GenerativeTask:
        return cls(name, "generative", tuple(completions), tuple(completions), "", description="prompt → completion")

    @classmethod
    def from_dict(cls, spec: dict) -> GenerativeTask:
        return cls.make(spec["name"], tuple(spec.get("labels") or ()))


@dataclass
class UserData:
    """The examples of a user's files and how their labels were decided."""

    task: Task
    train: list[Example]
    test: list[Example]
    files: list[Path]
    labels_note: str = ""
    dev: list[Example] = field(default_factory=list)
    source_note: str = ""  # which file / dataset splits were used for what


def _is_generic(labels) -> bool:
    return all(_GENERIC.match(str(x)) for x in labels)


def _field(row: dict, name: str, where: str, option: str = "") -> str:
    if name not in row or row[name] is None:
        hint = f"; name your columns with {option} and --label-field" if option == "--text-field" else (
            f"; name yours with {option}" if option else "")
        raise SkillgraftError(f"{where}: field {name!r} is missing (fields: {sorted(row)}){hint}")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SkillgraftError(f"{where}: field {name!r} must be text, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SkillgraftError(f"{where}: field {name!r} is {value} (non-finite values are refused)")
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def read_prompts(path: Path, prompt_field: str = "prompt", completion_field: str = "completion"
                 ) -> list[tuple[str, str, str | None]]:
    """``(where, prompt, completion)`` per row of a .jsonl/.csv/.tsv file of prompts whose completion may be left
    out (None); a row without a prompt, a field that is not text, or an empty or unreadable file: one clear line."""
    _, rows = open_source(path).split(None, "--keep-data")
    return [(where, _field(row, prompt_field, where, "--prompt-field"),
             None if row.get(completion_field) is None else _field(row, completion_field, where, "--completion-field"))
            for where, row in rows]


def resolve_labels(values: set[str], declared: list[str] | None = None, model_labels: tuple[str, ...] | None = None,
                   source: str = "the data") -> tuple[tuple[str, ...], dict[str, int], str]:
    """(labels in logit order, raw value → index, a sentence saying how they were decided)."""
    if declared:
        labels = tuple(str(x) for x in declared)
        if len(set(labels)) != len(labels):
            raise SkillgraftError(f"--labels {list(labels)}: duplicate labels")
        unknown = sorted(values - set(labels))
        if unknown:
            raise SkillgraftError(f"{source}: label(s) {unknown[:5]} are not among the declared labels {list(labels)}")
        if model_labels is not None and len(model_labels) != len(labels):
            raise SkillgraftError(f"--labels declares {len(labels)} labels but the fine-tuned classifier has "
                                  f"{len(model_labels)} outputs")
        return labels, {v: labels.index(v) for v in labels}, f"declared: {list(labels)} (logit order)"
    ints = all(re.fullmatch(r"-?\d+", v) for v in values)
    if model_labels is not None and not _is_generic(model_labels):
        labels = tuple(model_labels)
        if values <= set(labels):
            source_note = f"from the fine-tuned model's config.id2label: {list(labels)}"
            return labels, {v: labels.index(v) for v in labels}, source_note
        if ints and all(0 <= int(v) < len(labels) for v in values):
            return labels, {v: int(v) for v in values}, (f"integers in the data are indices into the fine-tuned "
                                                         f"model's config.id2label: {list(labels)}")
        raise SkillgraftError(f"{source}: labels {sorted(values)[:6]} are neither the fine-tuned model's labels "
                              f"{list(labels)} nor indices into them; declare them with --labels (logit order)")
    if ints:
        n = len(model_labels) if model_labels is not None else max(int(v) for v in values) + 1
        if any(not 0 <= int(v) < n for v in values):
            raise SkillgraftError(f"{source}: integer labels {sorted(values, key=int)} do not index the model's "
                                  f"{n} outputs")
        labels = tuple(str(i) for i in range(n))
        return labels, {v: int(v) for v in values}, f"integers 0..{n - 1} of the data are logit indices"
    labels = tuple(sorted(values))
    if model_labels is not None and len(labels) != len(model_labels):
        raise SkillgraftError(f"{source}: {len(labels)} distinct labels {list(labels)[:6]} but the fine-tuned "
                              f"classifier has {len(model_labels)} outputs; declare them with --labels (logit order)")
    if len(labels) < 2:
        raise SkillgraftError(f"{source}: only one label value {list(labels)}; classification needs at least two")
    return labels, {v: i for i, v in enumerate(labels)}, f"inferred from the data, sorted: {list(labels)} (logit order)"


def _split(rows: list, fraction: float, seed: int) -> tuple[list, list]:
    order = np.random.RandomState(seed).permutation(len(rows))
    n_eval = max(1, int(round(fraction * len(rows))))
    if n_eval >= len(rows):
        raise SkillgraftError(f"{len(rows)} row(s) cannot be split into training and evaluation rows; give --eval-data")
    held = set(order[:n_eval].tolist())
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


# Names too generic to name a task or a model: a split, a file or folder role, a run folder's leaf (``sst2/ft``)
GENERIC_NAMES = frozenset({
    "train", "training", "test", "testing", "dev", "validation", "valid", "val", "eval", "evaluation", "heldout",
    "held-out", "data", "dataset", "datasets", "rows", "examples", "all", "raw", "processed", "split", "splits",
    "ft", "finetuned", "fine-tuned", "finetune", "fine-tune", "model", "models", "checkpoint", "checkpoints", "final",
    "best", "last", "output", "outputs", "out", "run", "runs", "result", "results", "merged", "hf", "export",
    "exported", "base", "clf", "classifier", "sft", "lora", "adapter", "default", "main", "plain_text"})
_SPLIT_AFFIX = re.compile(r"^(?:(?:train|test|dev|validation|valid|val|eval)[-_.](.+)|(.+?)[-_.](?:train|test|dev|"
                          r"validation|valid|val|eval))$", re.IGNORECASE)
_RUN_LEAF = re.compile(r"^(?:checkpoint|step|epoch|ckpt)[-_]?\d+$", re.IGNORECASE)


def generic_name(name: str) -> bool:
    """Whether ``name`` says nothing of the task (``train``, ``ft``, ``model``, ``checkpoint-500``, …)."""
    return not name or name.lower() in GENERIC_NAMES or bool(_RUN_LEAF.match(name)) or name in (".", "..")


def passed_name(path, config: str | None = None) -> str:
    """The name of what the user passed: a file's stem less a split affix (``sst2_train.jsonl`` → ``sst2``), the
    nearest folder above a generic leaf (``sst2/train.jsonl``, ``runs/sst2/ft`` → ``sst2``), a hub dataset's
    configuration (``nyu-mll/glue`` + ``sst2`` → ``sst2``) or its name."""
    import os  # noqa: PLC0415

    if config and not generic_name(config):
        return config
    typed = Path(os.path.normpath(str(path)))
    leaf = typed.stem if typed.suffix.lower() in (".jsonl", ".json", ".csv", ".tsv", ".txt", ".yaml", ".yml",
                                                  ".parquet", ".arrow", ".gguf", ".safetensors") else typed.name
    m = _SPLIT_AFFIX.match(leaf)
    if m and not generic_name(m.group(1) or m.group(2)):
        return m.group(1) or m.group(2)
    # the parts as typed, then (all generic: `ft`, `../train.jsonl`) the folders they lead to
    for name in (leaf, *(q.name for q in typed.parents), *(q.name for q in Path(os.path.abspath(typed)).parents)):
        if not generic_name(name):
            return name
    return leaf or "data"


def load_user_data(spec, model_labels: tuple[str, ...] | None = None) -> UserData:
    """The examples of ``spec`` (a :class:`~skillgraft.data.spec.UserDataSpec`): train (optionally k-shot) and
    evaluation rows, as a classification or generative task."""
    source = open_source(spec.data, spec.data_config)
    train_split, rows = source.split(spec.data_split, "--data-split")
    files = list(source.files)
    if spec.eval_data is not None:
        held = open_source(spec.eval_data, spec.data_config if not Path(spec.eval_data).is_file() else None)
        eval_split, eval_rows = held.split(spec.eval_split, "--eval-split", EVAL_SPLITS)
        files += [f for f in held.files if f not in files]  # evaluate passes --data again as its eval rows
        evaluated = f"{held.name}" + (f" [{eval_split}]" if eval_split else "")
    elif spec.eval_split is not None or (train_split is not None and any(
            d in source.splits and d != train_split for d in EVAL_SPLITS)):
        default = tuple(d for d in EVAL_SPLITS if d != train_split)
        eval_split, eval_rows = source.split(spec.eval_split, "--eval-split", default)
        if eval_split == train_split:
            raise SkillgraftError(f"--eval-split {eval_split!r} is the split the graft is learned on (--data-split)")
        evaluated = f"{source.name} [{eval_split}]"
    else:
        rows, eval_rows = _split(rows, spec.eval_fraction, spec.seed)
        evaluated = f"a seeded {spec.eval_fraction:.0%} of --data ({source.name}) held out"
    name = passed_name(spec.data, spec.data_config)  # sst2/train.jsonl → sst2 (was "train")
    if spec.generative:
        data = _generative(name, rows, eval_rows, spec)
    else:
        data = _classification(name, rows, eval_rows, spec, model_labels)
    if spec.k is not None:
        if data.task.num_labels:
            data.train, _ = sample_kshot(data.train, data.task.num_labels, spec.k, spec.seed, source=str(spec.data),
                                         dev=False)
        else:
            keep = np.random.RandomState(spec.seed).permutation(len(data.train))[: spec.k]
            data.train = [data.train[i] for i in sorted(keep)]
    data.test = eval_subset(data.test, spec.test_limit)
    data.files = files
    data.source_note = (f"learned on {source.name}" + (f" [{train_split}]" if train_split else "")
                        + f", evaluated on {evaluated}")
    return data


def _classification(name, rows, eval_rows, spec, model_labels) -> UserData:
    def parse(items):
        out = []
        for where, row in items:
            text = _field(row, spec.text_field, where, "--text-field")
            pair = _field(row, spec.text_pair_field, where, "--text-pair-field") if spec.text_pair_field else None
            label = whole_number_label(_field(row, spec.label_field, where, "--label-field"))  # CSV "1.0" = JSONL 1.0
            out.append((text, pair, label, where))
        return out

    train, test = parse(rows), parse(eval_rows)
    values = {x[2] for x in train + test}
    try:
        labels, index, note = resolve_labels(values, spec.labels, model_labels, source=str(spec.data))
    except SkillgraftError:
        if not (spec.eval_data is not None or spec.eval_split is not None):
            raise  # the held-out rows are --data's own rows
        _blame_eval_rows(train, test, spec, model_labels)
        raise
    template = "*cls**sent_0**+sent_1*_Answer:*mask*.*sep+*" if spec.text_pair_field else SENTIMENT
    try:
        if spec.template is not None:
            template = from_readable(spec.template, pair=spec.text_pair_field is not None)
        task = Task(name, "pair" if spec.text_pair_field else "single", labels, labels, template,
                    description=f"user data {spec.data}")
    except SkillgraftError as e:
        raise SkillgraftError(f"--template {spec.template!r}: {e}") from None
    make = lambda items: [Example(t, index[y], p) for t, p, y, _ in items]  # noqa: E731
    return UserData(task, make(train), make(test), [], note)


def _blame_eval_rows(train, test, spec, model_labels) -> None:
    """When the labels of --data and --eval-data together cannot be resolved: if --data's alone can, the fault is
    an evaluation row's label, named with its file and line (it was blamed on --data)."""
    known, _, note = resolve_labels({x[2] for x in train}, spec.labels, model_labels, source=str(spec.data))
    option = "--eval-data" if spec.eval_data is not None else "--eval-split"
    for _, _, y, where in test:
        if y not in known and not (re.fullmatch(r"-?\d+", y) and "indices" in note and 0 <= int(y) < len(known)):
            raise SkillgraftError(f"{where}: unknown label {y!r} in the evaluation rows ({option}); the labels are "
                                  f"{list(known)} ({note})") from None


def _generative(name, rows, eval_rows, spec) -> UserData:
    def parse(items):
        return [(_field(row, spec.prompt_field, where, "--prompt-field"),
                 _field(row, spec.completion_field, where, "--completion-field")) for where, row in items]

    train, test = parse(rows), parse(eval_rows)
    completions = sorted({c for _, c in train})
    closed = (2 <= len(completions) <= MAX_LABEL_COMPLETIONS and len(completions) * 2 <= len(train)
              and all(c in set(completions) for _, c in test))
    if spec.labels:
        completions, closed = [str(x) for x in spec.labels], True
        unknown = sorted({c for _, c in train + test} - set(completions))
        if unknown:
            raise SkillgraftError(f"{spec.data}: completion(s) {unknown[:3]} are not among the declared labels")
    labels = tuple(completions) if closed else ()
    task = GenerativeTask.make(name, labels)
    index = {c: i for i, c in enumerate(labels)}
    make = lambda items: [Example(p, index.get(c, 0), c) for p, c in items]  # noqa: E731
    note = (f"completions are labels ({len(labels)} distinct): exact match ranks them" if closed
            else "open-ended completions: completion loss and token accuracy")
    return UserData(task, make(train), make(test), [], note)
