"""Typed specs: the one source of truth for every setting, its default, its range and its help text.

A spec is a frozen pydantic model that refuses unknown fields. Library entry points take specs, YAML
recipes are validated against them, and CLI verbs are generated from their fields (``skillgraft.cli``),
so a default or a help text is written exactly once. Help goes in ``Field(description=...)``.

    class LocalizeConfig(Spec):
        steps: int = Field(100, ge=0, description="gradient steps on S")

A validation failure becomes one :class:`SkillgraftError` line naming the field (``where.field``) and
the bad value, never a pydantic traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_serializer)

from skillgraft.errors import SkillgraftError
from skillgraft.untrusted import read_json, read_text

S = TypeVar("S", bound="Spec")
# Bounds every numeric field carries besides its own: a value out of range is one line naming the option,
# before any work, never an overflow deep inside NumPy, the tokenizer or an optimizer.
SEED_MAX = 2**32 - 1   # NumPy's RandomState and torch.manual_seed take seeds in [0, 2**32 - 1]
COUNT_MAX = 2**31 - 1  # sizes, limits, steps, batch sizes, max lengths: an int32
MAX_LENGTH = 128  # max tokens per example: the one default of every verb, recipe and scorer (models/spec.py's)
DEMO_OUT, DEMO_SEED = "runs/demo", 42  # `skillgraft demo` / `make demo`: its folder and data seed (recipes/graft.py)
FLOAT_MAX = 3.4e38     # learning rates, penalties, weight decay: what float32 optimizer state can hold
# Tolerances of searches bound below, so every search finishes: the keep search's walk probes up to
# ln 4 / ln(1 + tolerance) sizes per step (139 at 0.01; at 1e-20 its ratio rounded to 1 and it never ended)
TOLERANCE_MIN = 0.01


def _tolerance(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not TOLERANCE_MIN <= value <= 1:
        raise ValueError(f"a tolerance must be in [{TOLERANCE_MIN:g}, 1]: a finer one makes a search that cannot "
                         "finish")
    return value


def _regular(value, info):
    from skillgraft.untrusted import regular  # noqa: PLC0415

    return value if value is None else regular(value, f"a --{info.field_name.replace('_', '-')} file")


Tolerance = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_tolerance)]
# a path read later in the run: a FIFO or device refused when the spec is built, before any work (issue 81)
ReadablePath = Annotated[Path, AfterValidator(_regular)]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
# A field added after runs were stored: `Field(default, json_schema_extra=OMITTED_AT_DEFAULT)` leaves it out of
# to_dict() (configs, store keys) while it holds its default, so stored runs keep their keys and are found.
OMITTED_AT_DEFAULT = {"omitted_at_default": True}


class Spec(BaseModel):
    """Base of every typed setting: frozen, unknown fields refused, values validated on construction."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, arbitrary_types_allowed=True,
                              allow_inf_nan=False)  # `--lr nan`, `.inf` in a recipe: refused by name

    @field_validator("*", mode="before")
    @classmethod
    def _no_true_for_a_number(cls, value, info):
        """``steps: true`` in a recipe was 1 step (pydantic reads a bool as 0 or 1): refused by name."""
        if isinstance(value, bool) and info.field_name in cls.model_fields and \
                _numbers_only(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, got true/false")
        return value

    @model_serializer(mode="wrap")
    def _dump_without_left_out(self, handler):
        """Every dump (configs, store keys) leaves out :meth:`_left_out`'s fields."""
        data = handler(self)
        for name in self._left_out():
            data.pop(name, None)
        return data

    def _left_out(self) -> set[str]:
        """Fields not dumped: those marked :data:`OMITTED_AT_DEFAULT` while at their default. A spec whose other
        settings make a field moot extends this (never a serializer of its own, which would replace this one)."""
        out = set()
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra
            if isinstance(extra, dict) and extra.get("omitted_at_default") and getattr(self, name) == field.default:
                out.add(name)
        return out

    @classmethod
    def build(cls: type[S], values: dict[str, Any] | None = None, *, where: str = "") -> S:
        """Validate ``values`` into this spec; any problem is one clear error naming ``where.field``."""
        if values is not None and not isinstance(values, dict):
            raise SkillgraftError(f"{where or cls.__name__}: expected a mapping of settings, got "
                                  f"{type(values).__name__}")
        try:
            return cls.model_validate(values or {})
        except ValidationError as e:
            raise SkillgraftError(validation_message(e, where or cls.__name__)) from None

    def replace(self: S, **changes) -> S:
        """A validated copy with ``changes`` applied (specs are frozen). Fields that were never set stay
        unset (their defaults are re-derived), so ``model_fields_set`` keeps meaning "what was asked for"."""
        return type(self).build({**self.model_dump(exclude_unset=True), **changes}, where=type(self).__name__)

    def given(self) -> dict[str, Any]:
        """The fields that were set explicitly (by a user, a recipe file or code), with their values."""
        return {k: getattr(self, k) for k in self.model_fields_set}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able values (what run configs and cache keys store)."""
        return self.model_dump(mode="json")

    def key(self) -> str:
        """Short stable hash of the resolved values (cache keys)."""
        return stable_hash(self.to_dict())

    @classmethod
    def read(cls: type[S], path: str | os.PathLike, *, what: str = "file") -> S:
        """The JSON file at ``path`` validated into this spec; a missing or unreadable file, or any field at
        fault, is one error naming the file and the field (:func:`file_message`)."""
        raw = read_json(path, what=what)
        if not isinstance(raw, dict):
            raise SkillgraftError(f"{path}: unreadable {what} (expected a JSON object, got {type(raw).__name__})")
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise SkillgraftError(file_message(e, Path(path))) from None


def validation_message(error: ValidationError, where: str) -> str:
    """One line per problem: ``where.field: message (got value)``."""
    parts = []
    for item in error.errors():
        loc = ".".join(str(x) for x in item["loc"] if x != "__root__")
        field = f"{where}.{loc}" if loc else where
        if item["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown field (misspelt?)")
            continue
        got = item.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        msg = item["msg"].removeprefix("Value error, ")
        parts.append(f"{field}: {msg}{shown}")
    return readable_bounds("; ".join(parts))


def _numbers_only(annotation) -> bool:
    """Whether a field takes numbers and nothing a bool could stand for (no bool, text, list or other type)."""
    import typing  # noqa: PLC0415

    leaves, todo = set(), [annotation]
    while todo:
        a = todo.pop()
        origin = typing.get_origin(a)
        if origin is Annotated:
            todo.append(typing.get_args(a)[0])
        elif origin is not None and origin is not typing.Literal and typing.get_args(a) and \
                str(origin) in ("typing.Union", "<class 'types.UnionType'>"):
            todo.extend(typing.get_args(a))
        else:
            leaves.add(a)
    leaves.discard(type(None))
    return bool(leaves) and leaves <= {int, float}


def file_message(error: ValidationError, path: Path, unknown: str = "unknown field") -> str:
    """One line for a file that does not fit its spec: ``path: field 'a.b': message (got value); …``."""
    parts = []
    for item in error.errors():
        loc = ".".join(str(x) for x in item["loc"])
        if item["type"] == "extra_forbidden":
            parts.append(f"field {loc!r}: {unknown}")
            continue
        got = item.get("input")
        shown = "" if item["type"] == "missing" or isinstance(got, (dict, list)) else f" (got {got!r})"
        parts.append(f"field {loc!r}: {item['msg'].removeprefix('Value error, ')}{shown}")
    return readable_bounds(f"{path}: " + "; ".join(parts))


_BIG_BOUND = re.compile(r"(than(?: or equal to)?) (\d{16,})\b")


def readable_bounds(text: str) -> str:
    """pydantic spells a float bound out in digits ("less than or equal to 340000…000"): 3.4e+38 instead."""
    return _BIG_BOUND.sub(lambda m: f"{m.group(1)} {float(m.group(2)):g}", text)


def stable_hash(obj: Any) -> str:
    """Short sha256 of a JSON-able object with sorted keys (cache keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML mapping from ``path``; a missing file or bad YAML is one clear error naming the file."""
    import yaml  # noqa: PLC0415

    from skillgraft.untrusted import no_such  # noqa: PLC0415

    path = Path(path)
    if not path.is_file():
        raise no_such(path, "YAML file")
    from skillgraft.untrusted import load_yaml  # noqa: PLC0415 - duplicate keys and alias bombs refused

    data = parse_file(path, lambda text: load_yaml(path, text), yaml.YAMLError,
                      lambda e: f"not valid YAML ({str(e).splitlines()[0]})") or {}
    if not isinstance(data, dict):
        raise SkillgraftError(f"{path}: expected a mapping of settings at the top level")
    return data


def parse_file(path: Path, parse: Callable[[str], Any], error: type[Exception],
               describe: Callable[[Any], str]) -> Any:
    """``parse`` of the text at ``path``; an ``error`` it raises (``describe``d) or a failed read is one
    :class:`SkillgraftError` naming the file."""
    text = read_text(path)  # UTF-8 with or without a BOM, or UTF-16; else one error naming the file and line
    try:
        return parse(text)
    except error as e:
        raise SkillgraftError(f"{path}: {describe(e)}") from None
    except RecursionError:
        from skillgraft.untrusted import TOO_DEEP  # noqa: PLC0415

        raise SkillgraftError(f"{path}: {TOO_DEEP}") from None
