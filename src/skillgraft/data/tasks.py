"""Task registry: dataset folder, label set, metric, LM-BFF template and label words.

A *task* fixes everything a scorer needs to turn examples into one logit per label. The built-in
suite is LM-BFF's (Gao et al., 2021) with its manual templates and label words; users add their own
with :func:`register_task` or a YAML file (:func:`load_task_yaml`).

Template syntax (LM-BFF): parts separated by ``*``; ``cls``/``sep+`` special tokens, ``mask`` the mask
token, ``sent_0`` the first sentence, ``+sent_0`` with a leading space, ``sent-_0`` with the last
character removed, ``+sentl_1`` the second sentence with a leading space and a lower-cased first letter;
any other part is literal text where ``_`` stands for a space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from skillgraft.errors import SkillgraftError
from skillgraft.spec import parse_file

Kind = Literal["single", "pair"]
Metric = Literal["accuracy", "f1"]


@dataclass(frozen=True)
class Task:
    """One classification task.

    Attributes:
        name: registry name (LM-BFF spelling, e.g. ``SST-2``).
        kind: ``single`` (field ``text``) or ``pair`` (fields ``text_a``/``text_b``).
        labels: label strings as they appear in the data, in a fixed order (logit i = labels[i]).
        label_words: one word per label for prompt/causal scoring (used with a leading space).
        template: LM-BFF manual template for masked-LM prompting.
        causal_template: template for autoregressive scoring; ``*mask*`` must be its last slot.
        metric: ``accuracy`` or ``f1`` (binary F1 of ``positive_label``).
        folder: data folder name under the data root (defaults to ``name``).
        positive_label: the label counted as positive for F1.
        has_train: False for evaluation-only (OOD) sets.
        test_from_train: the data has no test split; a k-shot draw is tested on the train rows outside its
            own train and dev examples (a stand-in the reports name).
    """

    name: str
    kind: Kind
    labels: tuple[str, ...]
    label_words: tuple[str, ...]
    template: str
    causal_template: str | None = None
    metric: Metric = "accuracy"
    folder: str | None = None
    positive_label: str | None = None
    has_train: bool = True
    test_from_train: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("single", "pair"):
            raise SkillgraftError(f"task {self.name!r}: kind must be 'single' or 'pair', got {self.kind!r}")
        if len(self.labels) < 2:
            raise SkillgraftError(f"task {self.name!r}: needs at least two labels, got {list(self.labels)}")
        if len(set(self.labels)) != len(self.labels):
            raise SkillgraftError(f"task {self.name!r}: duplicate labels in {list(self.labels)}")
        if len(self.label_words) != len(self.labels):
            raise SkillgraftError(
                f"task {self.name!r}: {len(self.labels)} labels but {len(self.label_words)} label words"
            )
        if self.metric not in ("accuracy", "f1"):
            raise SkillgraftError(f"task {self.name!r}: metric must be 'accuracy' or 'f1', got {self.metric!r}")
        if self.metric == "f1" and self.positive_label not in self.labels:
            raise SkillgraftError(f"task {self.name!r}: metric f1 needs positive_label among {list(self.labels)}")
        if "*mask*" not in self.template:
            raise SkillgraftError(f"task {self.name!r}: template {self.template!r} has no *mask*")
        causal = self.causal_template or self.template
        if "*mask*" not in causal or "sent" in causal.split("*mask*", 1)[1]:
            raise SkillgraftError(
                f"task {self.name!r}: causal template {causal!r} must have *mask* after every sentence (an "
                "autoregressive model scores the label word after the whole input); set causal_template"
            )

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def data_folder(self) -> str:
        return self.folder or self.name

    def label_index(self, label: str) -> int:
        try:
            return self.labels.index(label)
        except ValueError:
            raise SkillgraftError(
                f"task {self.name!r}: unknown label {label!r}; the task's labels are {list(self.labels)}"
            ) from None


SENTIMENT = "*cls**sent_0*_It_was*mask*.*sep+*"
TOPIC = "*cls**mask*:*+sent_0**sep+*"
TOPIC_CAUSAL = "*cls**sent_0*_Topic:*mask**sep+*"
NLI = "*cls**sent-_0*?*mask*,*+sentl_1**sep+*"
NLI_CAUSAL = "*cls**sent_0*_Question:*+sentl_1*_Yes_or_no?*mask**sep+*"
PARAPHRASE = "*cls**sent_0**mask*,*+sentl_1**sep+*"
PARAPHRASE_CAUSAL = "*cls**sent_0**+sentl_1*_Same_meaning?*mask**sep+*"


_SLOTS = {"text": "sent_0", "text_pair": "sent_1", "label": "mask"}


def from_readable(template: str, *, pair: bool = False) -> str:
    """The LM-BFF template of a readable one: ``'{text} It was {label}.'`` → ``'*cls**sent_0*_It_was*mask*.*sep+*'``.

    Slots are ``{text}``, ``{text_pair}`` (pair tasks) and ``{label}`` (exactly once; the label word is scored where
    it stands, after a space). A template already in LM-BFF form (with ``*mask*``) is returned as it is.
    """
    if "*mask*" in template:
        return template
    parts = re.split(r"(\{[^{}]*\})", template)
    slots = [p[1:-1] for p in parts[1::2]]
    unknown = sorted({s for s in slots if s not in _SLOTS})
    if unknown:
        raise SkillgraftError(f"unknown slot(s) {', '.join('{' + s + '}' for s in unknown)}; "
                              "the slots are {text}, {text_pair} and {label}")
    if slots.count("label") != 1:
        raise SkillgraftError("needs {label} exactly once (where the label word is scored)")
    if slots.count("text") != 1:
        raise SkillgraftError("needs {text} exactly once")
    if slots.count("text_pair") != (1 if pair else 0):
        raise SkillgraftError("a pair task needs {text_pair} once" if pair
                              else "{text_pair} needs a pair field (--text-pair-field)")
    if slots.index("label") != len(slots) - 1:
        raise SkillgraftError("{label} must come after every text slot (a causal model scores the label word after "
                              "the whole input; a label-first template is not supported for your own data)")
    if any(c in "*_" for c in "".join(parts[0::2])):
        raise SkillgraftError("the characters '*' and '_' are reserved outside the slots")
    out = ["*cls*"]
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(part.replace(" ", "_"))
            continue
        slot = _SLOTS[part[1:-1]]
        spaced = out[-1].endswith("_")
        if spaced:
            out[-1] = out[-1][:-1]
        if slot == "mask":  # a label word is always read after a space (word_ids)
            out.append("*mask*")
        else:
            out.append(f"*{'+' if spaced and i > 1 else ''}{slot}*")
    out.append("*sep+*")
    return "".join(out)

_BUILTIN = [
    Task("SST-2", "single", ("0", "1"), ("terrible", "great"), SENTIMENT, description="SST binary sentiment"),
    Task("sst-5", "single", ("0", "1", "2", "3", "4"), ("terrible", "bad", "okay", "good", "great"), SENTIMENT,
         description="SST fine-grained sentiment"),
    Task("mr", "single", ("0", "1"), ("terrible", "great"), SENTIMENT, description="movie review sentiment"),
    Task("cr", "single", ("0", "1"), ("terrible", "great"), SENTIMENT, description="customer review sentiment"),
    Task("mpqa", "single", ("0", "1"), ("terrible", "great"), SENTIMENT, description="opinion polarity"),
    Task("subj", "single", ("0", "1"), ("subjective", "objective"), "*cls**sent_0*_This_is*mask*.*sep+*",
         description="subjectivity"),
    Task("trec", "single", ("0", "1", "2", "3", "4", "5"),
         ("Description", "Entity", "Expression", "Human", "Location", "Number"), TOPIC, TOPIC_CAUSAL,
         description="question type"),
    Task("ag_news", "single", ("1", "2", "3", "4"), ("World", "Sports", "Business", "Tech"), TOPIC, TOPIC_CAUSAL,
         description="news topic"),
    Task("MNLI", "pair", ("contradiction", "entailment", "neutral"), ("No", "Yes", "Maybe"), NLI, NLI_CAUSAL,
         description="multi-genre NLI"),
    Task("SNLI", "pair", ("contradiction", "entailment", "neutral"), ("No", "Yes", "Maybe"), NLI, NLI_CAUSAL,
         description="Stanford NLI"),
    Task("QNLI", "pair", ("not_entailment", "entailment"), ("No", "Yes"), NLI, NLI_CAUSAL,
         description="question-answer entailment"),
    Task("RTE", "pair", ("not_entailment", "entailment"), ("No", "Yes"), NLI, NLI_CAUSAL,
         description="recognising textual entailment"),
    Task("MRPC", "pair", ("0", "1"), ("No", "Yes"), PARAPHRASE, PARAPHRASE_CAUSAL, metric="f1", positive_label="1",
         description="paraphrase"),
    Task("QQP", "pair", ("0", "1"), ("No", "Yes"), PARAPHRASE, PARAPHRASE_CAUSAL, metric="f1", positive_label="1",
         test_from_train=True, description="duplicate questions (no test split: train rows outside the draw)"),
    Task("imdb", "single", ("neg", "pos"), ("terrible", "great"), SENTIMENT, has_train=False,
         description="movie reviews (OOD evaluation only)"),
    Task("yelp_polarity", "single", ("0", "1"), ("terrible", "great"), SENTIMENT, has_train=False,
         description="Yelp reviews (OOD evaluation only)"),
]

TASKS: dict[str, Task] = {t.name: t for t in _BUILTIN}


def register_task(task: Task, *, overwrite: bool = False) -> Task:
    """Add a task to the registry (``overwrite=True`` replaces one of the same name)."""
    if task.name in TASKS and not overwrite:
        raise SkillgraftError(f"task {task.name!r} is already registered; pass overwrite=True to replace it")
    TASKS[task.name] = task
    return task


def get_task(name: str | Task) -> Task:
    """Look a task up by name (case-insensitive)."""
    if isinstance(name, Task):
        return name
    if name in TASKS:
        return TASKS[name]
    folded = {k.lower(): v for k, v in TASKS.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    raise SkillgraftError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")


_TASK_FIELDS = {"name", "kind", "labels", "label_words", "template", "causal_template", "metric", "folder",
                "positive_label", "has_train", "test_from_train", "description"}


def task_from_dict(spec: dict, source: str = "task spec") -> Task:
    """Build a :class:`Task` from a plain mapping (labels/label_words may be lists or a label→word map)."""
    if not isinstance(spec, dict):
        raise SkillgraftError(f"{source}: expected a mapping of task fields, got {type(spec).__name__}")
    unknown = set(spec) - _TASK_FIELDS
    if unknown:
        raise SkillgraftError(f"{source}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_TASK_FIELDS)}")
    spec = dict(spec)
    words = spec.get("label_words")
    if isinstance(words, dict):
        spec.setdefault("labels", list(words))
        missing = [k for k in (spec["labels"] if isinstance(spec["labels"], (list, tuple)) else []) if k not in words]
        if missing or not isinstance(spec["labels"], (list, tuple)):
            raise SkillgraftError(f"{source}: field 'label_words' names no word for label(s) "
                                  f"{missing or spec['labels']}")
        spec["label_words"] = [words[k] for k in spec["labels"]]
    for required in ("name", "kind", "labels", "label_words", "template"):
        if required not in spec:
            raise SkillgraftError(f"{source}: missing required field {required!r}")
    _check_types(spec, source)
    spec["labels"] = tuple(str(x) for x in spec["labels"])
    spec["label_words"] = tuple(str(x) for x in spec["label_words"])
    return Task(**spec)


def _check_types(spec: dict, source: str) -> None:
    """Each task field of its type, by name (before: ``labels: positive`` became the labels p, o, s, …, and a list
    where text belongs was taken as its printed form)."""
    def scalar(v) -> bool:
        return isinstance(v, (str, int, float)) and not isinstance(v, bool)

    for key in ("labels", "label_words"):
        if not isinstance(spec[key], (list, tuple)) or not all(scalar(x) for x in spec[key]):
            raise SkillgraftError(f"{source}: field {key!r} must be a list of words, got {spec[key]!r}"[:300])
    for key in ("name", "kind", "template", "causal_template", "metric", "folder", "description"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise SkillgraftError(f"{source}: field {key!r} must be text, got {spec[key]!r}"[:300])
    for key in ("has_train", "test_from_train"):
        if key in spec and not isinstance(spec[key], bool):
            raise SkillgraftError(f"{source}: field {key!r} must be true or false, got {spec[key]!r}")
    if spec.get("positive_label") is not None and not scalar(spec["positive_label"]):
        raise SkillgraftError(f"{source}: field 'positive_label' must be a label, got {spec['positive_label']!r}")


def load_task_yaml(path: str | Path, *, overwrite: bool = False) -> list[Task]:
    """Register every task defined in a YAML file (one mapping, or a list under ``tasks:``)."""
    path = Path(path)
    if not path.is_file():
        from skillgraft.untrusted import no_such  # noqa: PLC0415

        raise no_such(path, "task file")
    from skillgraft.untrusted import load_yaml  # noqa: PLC0415 - duplicate keys and alias bombs refused

    doc = parse_file(path, lambda text: load_yaml(path, text), yaml.YAMLError,
                     lambda e: f"not valid YAML: {e}")  # BOM, UTF-16 read
    specs = doc.get("tasks", [doc]) if isinstance(doc, dict) else doc
    if not isinstance(specs, list):
        raise SkillgraftError(f"{path}: expected a task mapping or a list under 'tasks:'")
    return [register_task(task_from_dict(s, f"{path} (task {i})"), overwrite=overwrite) for i, s in enumerate(specs)]
