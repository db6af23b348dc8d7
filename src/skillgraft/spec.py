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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from skillgraft.errors import SkillgraftError

S = TypeVar("S", bound="Spec")


class Spec(BaseModel):
    """Base of every typed setting: frozen, unknown fields refused, values validated on construction."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, arbitrary_types_allowed=True)

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
    return "; ".join(parts)


def stable_hash(obj: Any) -> str:
    """Short sha256 of a JSON-able object with sorted keys (cache keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML mapping from ``path``; a missing file or bad YAML is one clear error naming the file."""
    import yaml  # noqa: PLC0415

    path = Path(path)
    if not path.is_file():
        raise SkillgraftError(f"file not found: {path}")
    data = parse_file(path, yaml.safe_load, yaml.YAMLError,
                      lambda e: f"not valid YAML ({str(e).splitlines()[0]})") or {}
    if not isinstance(data, dict):
        raise SkillgraftError(f"{path}: expected a mapping of settings at the top level")
    return data


def parse_file(path: Path, parse: Callable[[str], Any], error: type[Exception],
               describe: Callable[[Any], str]) -> Any:
    """``parse`` of the text at ``path``; an ``error`` it raises (``describe``d) or a failed read is one
    :class:`SkillgraftError` naming the file."""
    try:
        return parse(path.read_text())
    except error as e:
        raise SkillgraftError(f"{path}: {describe(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SkillgraftError(f"{path}: cannot read ({e})") from None
