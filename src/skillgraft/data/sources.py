"""Reading a user's or a dataset's rows before they become examples: JSONL and CSV/TSV files, Hugging Face datasets.

Every reader yields ``(where, row)`` pairs, ``where`` naming the file and line (or dataset split and row) that
an error about the row will cite. :func:`open_source` opens a file, a ``datasets`` folder (``save_to_disk`` or
data files in a hub repository's layout) or a Hugging Face Hub dataset name as a :class:`Source` of splits.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillgraft.errors import SkillgraftError
from skillgraft.untrusted import TOO_DEEP, no_such, read_text, regular_tree, unique_keys

def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (non-finite values are refused)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows to {value} (non-finite values are refused)")
    return value


def jsonl_rows(path: Path, hint: str = "") -> list[tuple[str, dict]]:
    """``(path:line, object)`` for each non-blank line of a JSONL file (BOM, CRLF and blank lines accepted);
    a line that is not a JSON object, or holds NaN / Infinity, is one error naming the file and the line."""
    rows = []
    for lineno, line in enumerate(read_text(path).split("\n"), 1):  # not splitlines(): U+2028 is JSON text
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float,
                             object_pairs_hook=unique_keys)
        except json.JSONDecodeError as e:
            raise SkillgraftError(f"{where}: malformed JSON ({e.msg} at column {e.colno}){hint}") from None
        except ValueError as e:
            raise SkillgraftError(f"{where}: {e}") from None
        except RecursionError:
            raise SkillgraftError(f"{where}: {TOO_DEEP}") from None
        if not isinstance(row, dict):
            raise SkillgraftError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if "\\u" in line:  # only an escape can make a lone surrogate: "\ud800" parses, then breaks the tokenizer
            _refuse_surrogates(where, row)
        rows.append((where, row))
    return rows


def _refuse_surrogates(where: str, value, field: str = "") -> None:
    """An unpaired surrogate escape (``"\ud800"``, half of a UTF-16 pair) in any string of ``value``: one
    error naming the line, the field and the character (it is no Unicode text; a tokenizer fails on it)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            name = f"field {field!r}" if field else "a key"
            raise SkillgraftError(f"{where}: {name} holds an unpaired surrogate escape "
                                  f"'\\u{ord(value[e.start]):04x}' (character {e.start + 1}): not Unicode text; "
                                  "write the character itself or its full surrogate pair") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _refuse_surrogates(where, k, "")
            _refuse_surrogates(where, v, f"{field}.{k}" if field else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _refuse_surrogates(where, v, f"{field}[{i}]")


def csv_reader(text: str, delimiter: str = ","):
    """A strict ``csv.reader`` over ``text`` (quoting errors raise ``csv.Error``; fields up to the text's size)."""
    csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))
    return csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)


DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass
class Source:
    """A user's data source: its splits (a file has one, named ``None``) and the files behind them.

    A file's split holds its rows; a dataset's holds the ``datasets.Dataset``, turned into rows only when
    :meth:`split` chooses it (the unused splits of a large dataset are never materialised).
    """

    name: str
    splits: dict[str | None, Any]
    files: list[Path]

    def split(self, name: str | None, option: str, default: tuple[str, ...] = ("train",)) -> tuple[str | None, list]:
        """(split name, rows): ``name`` if given (it must exist), else the first of ``default``, else the only one."""
        if None in self.splits:  # a file
            if name is not None:
                raise SkillgraftError(f"{option} {name!r}: {self.name} is a file with no splits; {option} applies to "
                                      "a Hugging Face dataset")
            return None, self.splits[None]
        if name is None:
            name = next((d for d in default if d in self.splits), None)
            if name is None and len(self.splits) > 1:
                raise SkillgraftError(f"{self.name}: splits {sorted(self.splits)}; choose one with {option}")
            name = name or next(iter(self.splits))
        elif name not in self.splits:
            raise SkillgraftError(f"{self.name}: no split {name!r} ({option}); it has {sorted(self.splits)}")
        return name, [(f"{self.name}[{name}][{i}]", dict(row)) for i, row in enumerate(self.splits[name])]


def open_source(source: str | Path, config: str | None = None) -> Source:
    """Read ``source``: a .jsonl/.csv/.tsv file, a ``datasets`` folder (``save_to_disk`` or data files in a hub
    repository's layout), or a Hugging Face Hub dataset name (``config``: its configuration)."""
    path = Path(source)
    if path.is_file():
        if config is not None:
            raise SkillgraftError(f"--data-config {config!r}: {path} is a file; a configuration applies to a Hugging "
                                  "Face dataset")
        return Source(str(path), {None: _read_file(path)}, [path])
    if path.is_dir():
        return _read_dataset(str(path), config, local=True)
    text = str(source)
    if os.path.lexists(path) or path.suffix.lower() in DATA_SUFFIXES or not _HUB_NAME.match(text):
        raise no_such(path, "data file")  # a link loop or a broken link is no hub name either
    return _read_dataset(text, config, local=False)


def _read_file(path: Path) -> list[tuple[str, dict]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = jsonl_rows(path, "; expected one JSON object per line")
    elif suffix in (".csv", ".tsv"):
        rows = _table_rows(path, "\t" if suffix == ".tsv" else ",")
    else:
        raise SkillgraftError(f"{path}: unsupported data file (expected .jsonl, .csv, .tsv, a Hugging Face dataset "
                              "folder or a hub dataset name)")
    if not rows:
        raise SkillgraftError(f"{path}: no rows")
    return rows


def _table_rows(path: Path, delimiter: str) -> list[tuple[str, dict]]:
    """The rows of a CSV/TSV file with a header, as ``(path:line, {column: value})``; blank lines skipped, a
    repeated column name or a row with more fields than the header is one error naming the line."""
    text = read_text(path)
    first = next((line for line in text.splitlines() if line.strip()), "")
    if delimiter == "," and "\t" in first and "," not in first:
        delimiter = "\t"  # a tab-separated file named .csv: its header says so (no comma, a tab)
    reader = csv_reader(text, delimiter)
    rows, header = [], None
    try:
        for row in reader:
            if not any(v.strip() for v in row):
                continue
            where = f"{path}:{reader.line_num}"
            if header is None:
                header = [h.strip() for h in row]
                twice = sorted({h for h in header if header.count(h) > 1})
                if twice:
                    raise SkillgraftError(f"{where}: column {twice[0]!r} appears twice in the header")
                continue
            if len(row) > len(header):
                raise SkillgraftError(f"{where}: {len(row)} fields but the header names {len(header)} columns "
                                      f"{header}; quote fields that hold the delimiter")
            rows.append((where, dict(zip(header, row))))
    except csv.Error as e:
        kind = "TSV" if delimiter == "\t" else "CSV"
        raise SkillgraftError(f"{path}:{reader.line_num}: malformed {kind} ({e})") from None
    return rows


def _read_dataset(source: str, config: str | None, *, local: bool) -> Source:
    if local:
        regular_tree(source, "a dataset's file")  # a FIFO as an arrow file blocked in open(), deaf to SIGTERM
    import datasets  # noqa: PLC0415 - only users' dataset folders and names need it

    what = f"{source}" + (f" (configuration {config!r})" if config else "")
    saved = local and any((Path(source) / f).is_file() for f in ("dataset_dict.json", "state.json"))
    try:
        if saved:
            if config is not None:
                raise SkillgraftError(f"--data-config {config!r}: {source} is a dataset saved with save_to_disk, "
                                      "which has no configurations")
            ds = datasets.load_from_disk(source)
        else:
            ds = datasets.load_dataset(source, config)
    except SkillgraftError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure is one clear line naming the source
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if local:
            raise SkillgraftError(f"{source}: not a Hugging Face dataset folder (save_to_disk, or data files such as "
                                  f"train.jsonl / test.csv): {first}") from None
        raise SkillgraftError(f"{source}: no such file or folder, and loading it as a Hugging Face Hub dataset"
                              f"{' configuration ' + repr(config) if config else ''} failed: {first}") from None
    parts = dict(ds.items()) if isinstance(ds, datasets.DatasetDict) else {getattr(ds, "split", None) or "train": ds}
    splits = {str(name): part for name, part in parts.items() if len(part)}
    files = [Path(f["filename"]) for part in parts.values() for f in part.cache_files]
    if not splits:
        raise SkillgraftError(f"{what}: no rows")
    if local and not saved:
        files = [f for f in Path(source).rglob("*") if f.is_file() and ".cache" not in f.parts]
    return Source(what, splits, sorted(set(files)))
