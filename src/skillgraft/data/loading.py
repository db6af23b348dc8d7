"""Reading task data: the JSONL layout of ``shared/data``, LM-BFF's TSV/CSV layout, and HF ``datasets``.

Layouts under a data root:

* JSONL: ``<root>/<task folder>/{train,dev,test}.jsonl``, one object per line with ``text`` (single) or
  ``text_a``/``text_b`` (pair) and ``label`` (the label string).
* LM-BFF: ``<root>/original/<TASK>/{train,dev,test}.{tsv,csv}`` and
  ``<root>/k-shot/<TASK>/<K>-<SEED>/{train,dev,test}.{tsv,csv}``.

Data root resolution: explicit argument, then ``$SKILLGRAFT_DATA``, then ``./data``, then
``../shared/data`` (relative to the working directory, then to the source checkout).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from skillgraft.data.sources import csv_reader, jsonl_rows, open_source
from skillgraft.data.tasks import Task, get_task
from skillgraft.errors import SkillgraftError
from skillgraft.untrusted import read_text

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Example:
    """One labelled example; ``label`` is the index into ``task.labels``."""

    text_a: str
    label: int
    text_b: str | None = None


def text_length(example) -> int:
    """Characters of an example's text(s): the sort key that makes a batch of neighbours pad little (evaluation,
    the Fisher's examples, a localization step's micro-batches)."""
    return len(example.text_a) + len(example.text_b or "")


def candidate_data_roots(explicit: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """Where data is looked for, in order, each with the rule that produced it."""
    roots: list[tuple[str, Path]] = []
    if explicit is not None:
        return [("--data-dir", Path(explicit))]
    if os.environ.get("SKILLGRAFT_DATA"):
        roots.append(("$SKILLGRAFT_DATA", Path(os.environ["SKILLGRAFT_DATA"])))
    roots.append(("./data", Path("data")))
    roots.append(("../shared/data", Path("..") / "shared" / "data"))
    checkout = Path(__file__).resolve().parents[3]
    roots.append(("checkout ../shared/data", checkout.parent / "shared" / "data"))
    return roots


def resolve_data_dir(explicit: str | os.PathLike | None = None, task: Task | str | None = None) -> Path:
    """The first candidate root that holds the task's data (or simply exists, without a task)."""
    tried = []
    for rule, root in candidate_data_roots(explicit):
        tried.append(f"{rule} = {root}")
        if not root.is_dir():
            continue
        if task is None or any(find_split_file(get_task(task), split, root) for split in ("test", "train")):
            return root
    what = f" holding task {get_task(task).name!r}" if task is not None else ""
    raise SkillgraftError(
        "no data directory" + what + " found; tried " + "; ".join(tried)
        + ". Pass --data-dir or set SKILLGRAFT_DATA."
    )


def find_split_file(task: Task, split: str, root: Path) -> Path | None:
    """The file holding ``split`` of ``task`` under ``root`` (JSONL or LM-BFF original), or None."""
    folder = task.data_folder
    for candidate in (
        root / folder / f"{split}.jsonl",
        root / "original" / folder / f"{split}.tsv",
        root / "original" / folder / f"{split}.csv",
    ):
        if candidate.is_file():
            return candidate
        if candidate.is_dir():
            raise SkillgraftError(f"{candidate}: a folder where the {split} split's file should be")
    if split == "test" and task.name == "MNLI":
        for name in ("dev_matched.tsv",):
            if (root / "original" / folder / name).is_file():
                return root / "original" / folder / name
    return None


def load_split(task: Task | str, split: str, data_dir: str | os.PathLike | None = None) -> list[Example]:
    """Load one split of a task as a list of :class:`Example` (errors name the file and line)."""
    task = get_task(task)
    if split not in SPLITS:
        raise SkillgraftError(f"unknown split {split!r}; expected one of {SPLITS}")
    root = resolve_data_dir(data_dir, task)
    path = find_split_file(task, split, root)
    if path is None:
        raise SkillgraftError(
            f"task {task.name!r} has no {split} split under {root} (looked for "
            f"{root / task.data_folder / (split + '.jsonl')} and the LM-BFF original/ layout)"
        )
    return read_file(task, path)


def read_file(task: Task, path: Path) -> list[Example]:
    """Parse a JSONL, TSV or CSV file of ``task`` examples."""
    path = Path(path)
    if path.suffix == ".jsonl":
        examples = _read_jsonl(task, path)
    elif path.suffix == ".tsv":
        examples = _read_tsv(task, path)
    elif path.suffix == ".csv":
        examples = _read_csv(task, path)
    else:
        raise SkillgraftError(f"{path}: unsupported file type (expected .jsonl, .tsv or .csv)")
    if not examples:
        raise SkillgraftError(f"{path}: the split is empty (no examples)")
    return examples


_WHOLE = __import__("re").compile(r"[+-]?\d+\.0+")


def whole_number_label(label: str) -> str:
    """``"1"`` for ``"1.0"`` (pandas writes an integer label column holding a missing value, or read as floats,
    as ``0.0`` / ``1.0``): a label in a CSV or TSV reads as the same label as the number ``1.0`` in JSONL, which
    JSON parses to a float. Any other text is left as it is."""
    return str(int(float(label))) if _WHOLE.fullmatch(label) else label


def _label(task: Task, raw: object, where: str) -> int:
    if isinstance(raw, (list, dict, bool)) or raw is None:
        got = "null" if raw is None else f"{type(raw).__name__} {raw!r}"
        raise SkillgraftError(f"{where}: field 'label' must be a string or a number, got {got}")
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)  # 1.0 as pandas writes an integer label
    label = whole_number_label(str(raw).strip())  # "1.0" in a CSV/TSV is the same label as 1.0 in JSONL
    if label not in task.labels:
        shown = repr(label) if len(label) <= 40 else repr(label[:40]) + f"… ({len(label)} characters)"
        raise SkillgraftError(f"{where}: unknown label {shown}; task {task.name!r} has labels {list(task.labels)}")
    return task.labels.index(label)


def checked_text(value: object, where: str, field: str) -> str:
    if value is None:
        raise SkillgraftError(f"{where}: field {field!r} is missing")
    if not isinstance(value, str):
        raise SkillgraftError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    return value


def _read_jsonl(task: Task, path: Path) -> list[Example]:
    out = []
    for where, row in jsonl_rows(path):
        if "label" not in row:
            raise SkillgraftError(f"{where}: field 'label' is missing")
        label = _label(task, row["label"], where)
        if task.kind == "single":
            out.append(Example(checked_text(row.get("text"), where, "text"), label))
        else:
            out.append(Example(checked_text(row.get("text_a"), where, "text_a"), label,
                               checked_text(row.get("text_b"), where, "text_b")))
    return out


# GLUE TSV headers: which columns hold the sentences and the label.
_TSV_COLUMNS = [
    (("sentence",), "label"),
    (("sentence1", "sentence2"), "gold_label"),
    (("sentence1", "sentence2"), "label"),
    (("question", "sentence"), "label"),
    (("#1 String", "#2 String"), "Quality"),
    (("question1", "question2"), "is_duplicate"),
]


def _read_tsv(task: Task, path: Path) -> list[Example]:
    lines = read_text(path).splitlines()
    if not lines:
        raise SkillgraftError(f"{path}: the split is empty (no examples)")
    header = lines[0].split("\t")
    for text_cols, label_col in _TSV_COLUMNS:
        if all(c in header for c in text_cols) and label_col in header:
            break
    else:
        raise SkillgraftError(f"{path}: unrecognised TSV header {header}; expected GLUE column names")
    idx = [header.index(c) for c in text_cols]
    last = label_col in ("gold_label", "label") and header[-1] == label_col
    lab = len(header) - 1 if last else header.index(label_col)
    out = []
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        cols = line.split("\t")
        where = f"{path}:{lineno}"
        if len(cols) <= max(idx + [lab]):
            raise SkillgraftError(f"{where}: expected {len(header)} tab-separated columns, got {len(cols)}")
        label = _label(task, cols[lab], where)
        texts = [cols[i] for i in idx]
        out.append(Example(texts[0], label, texts[1] if len(texts) > 1 and task.kind == "pair" else None))
    return out


def _read_csv(task: Task, path: Path) -> list[Example]:
    out = []
    reader = csv_reader(read_text(path))
    try:
        for row in reader:
            if not any(v.strip() for v in row):  # a blank line (spaces or CRLF)
                continue
            where = f"{path}:{reader.line_num}"
            if len(row) < 2:
                raise SkillgraftError(f"{where}: expected 'label,text' columns, got {len(row)} column(s)")
            label = _label(task, row[0], where)
            if task.kind == "pair":
                if len(row) < 3:
                    raise SkillgraftError(f"{where}: pair task needs 'label,text_a,text_b'")
                out.append(Example(row[1], label, row[2]))
            else:
                out.append(Example(" ".join(row[1:]), label))
    except csv.Error as e:
        raise SkillgraftError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
    return out


def load_hf_split(task: Task | str, split: str, dataset: str, config: str | None = None,
                  text_fields: tuple[str, ...] | None = None, label_field: str = "label") -> list[Example]:
    """Load a split of a Hugging Face dataset (hub name or folder; :func:`~skillgraft.data.sources.open_source`).

    Integer labels are taken as indices into ``task.labels``; string labels must match them.
    """
    task = get_task(task)
    _, rows = open_source(dataset, config).split(split, "split")
    columns = list(rows[0][1])
    fields = text_fields or (("sentence", "text") if task.kind == "single" else ("sentence1", "sentence2"))
    present = [f for f in fields if f in columns]
    if task.kind == "single":
        present = present[:1]
    if not present or (task.kind == "pair" and len(present) < 2):
        raise SkillgraftError(f"{dataset}: no text columns among {fields}; columns are {columns}")
    out = []
    for where, row in rows:
        raw = row[label_field]
        label = raw if isinstance(raw, int) and 0 <= raw < task.num_labels else _label(task, raw, where)
        out.append(Example(row[present[0]], label, row[present[1]] if task.kind == "pair" else None))
    return out
