"""The graft file: ``graft_config.json`` (validated against a schema) + ``graft.safetensors``.

Format version 1. ``graft.safetensors`` holds one ``indices`` tensor (int32, or int64 past 2³¹: positions
in the concatenation of the universe tensors, in ``shapes`` order, sorted and unique), one ``values``
tensor (θ_ft at those positions, floating point) and one ``carried::<name>`` tensor per tensor that
travels whole (a new head). Values of mixed dtypes use per-tensor entries ``<name>::indices`` /
``<name>::values`` instead. ``graft_config.json`` declares the universe (``shapes``), the size, the
carried tensors (names and shapes), the base model (name + content fingerprint), a sha256 of
``graft.safetensors`` and free-form metadata.

Reading trusts nothing: the config is checked against :class:`GraftFileConfig`, the weights file must
open and match its checksum, and the tensors must agree with the config (dtypes, sorted unique in-range
positions, value count = index count = declared size, carried names and shapes, every value finite: no NaN
or ±Inf, which would poison the model a graft is applied to). Every failure is one :class:`SkillgraftError`
line naming the file and the field or position at fault. Writing refuses non-finite values too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from skillgraft.lazy import torch
from pydantic import ConfigDict, Field, ValidationError, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.finite import first_non_finite, refuse_non_finite
from skillgraft.io import atomic_dir
from skillgraft.spec import Spec, file_message, parse_file

FORMAT = "skillgraft.graft"
FORMAT_VERSION = 1
UNKNOWN = f"unknown field (not part of format version {FORMAT_VERSION})"
CONFIG_FILE = "graft_config.json"
WEIGHTS_FILE = "graft.safetensors"
INDEX_DTYPES = ("torch.int32", "torch.int64")  # by name: the module imports no torch

Dim = Annotated[int, Field(ge=0)]
NON_FINITE = ("a graft must hold finite values (a faulty writer, or a diverged fine-tuning): applied, it would "
              "poison the model and every export of it")


class GraftMetadata(Spec):
    """What a graft records about how it was learned (``graft_config.json`` "metadata"). The fields skillgraft
    reads back are typed; any other key a recipe records (localizer, budget, a compose report, …) is kept as
    written and read as an attribute (``metadata.compose``). Only the keys given are written (:meth:`to_dict`)."""

    model_config = ConfigDict(extra="allow")

    task: str | None = Field(None, description="task name (registered, or the user's data file's stem)")
    mode: Literal["head", "prompt", "causal", "classifier", "generative"] | None = Field(
        None, description="scorer mode of the fine-tuned model")
    k: int | None = Field(None, ge=0, description="examples per label it was localized on (0: every row)")
    seed: int | None = Field(None, ge=0, description="data seed")
    pretrained: str | None = Field(None, description="a checkpoint pair's pre-trained model")
    finetuned: str | None = Field(None, description="a checkpoint pair's fine-tuned model")
    task_spec: dict[str, Any] | None = Field(None, description="the task itself (a user's data: labels, kind, …)")
    user_data: dict[str, Any] | None = Field(None, description="the UserDataSpec of a checkpoint pair's data")
    pooling: str | None = Field(None, description="head pooling of the scorer it was learned with")
    merge_task: str | None = Field(None, description="the task's name in a merge")

    def to_dict(self) -> dict[str, Any]:
        """The keys given (typed ones and any other), as JSON values: what ``graft_config.json`` stores."""
        dumped = self.model_dump(mode="json")
        return {k: v for k, v in dumped.items() if k in self.model_fields_set or k in (self.model_extra or {})}

    def updated(self, **changes) -> GraftMetadata:
        """A validated copy with ``changes`` added or replaced."""
        return type(self).build({**self.to_dict(), **changes}, where="graft metadata")


class GraftFileConfig(Spec):
    """Schema of ``graft_config.json``. Required: what reading the weights needs; the rest is checked if present."""

    format: Literal["skillgraft.graft"] = Field(description="file kind marker")
    format_version: int = Field(ge=1, le=FORMAT_VERSION, description="layout version (this reader: ≤ 1)")
    base_model: str = Field(description="name or path of the model the graft was learned on ('' if unknown)")
    base_fingerprint: str | None = Field(None, min_length=1, description="content fingerprint of the base "
                                         "model; without it apply is refused unless forced")
    base_dtype: str | None = Field(None, description="dtype of the base's weights it was learned on (torch.float32 …)")
    base_rounded_fingerprint: str | None = Field(None, min_length=1, description="fingerprint of the base's values "
                                                 "rounded to bf16, dtypes left out: the same base loaded in another "
                                                 "precision is recognised")
    size: int = Field(ge=0, description="number of grafted coordinates (= indices = values)")
    density: float | None = Field(None, ge=0, le=1, description="size / graftable_parameters")
    graftable_parameters: int | None = Field(None, ge=0, description="coordinates in the universe")
    carried_parameters: int | None = Field(None, ge=0, description="numel of all carried tensors")
    carried: list[str] = Field(description="names of the tensors that travel whole (a new head)")
    carried_shapes: dict[str, list[Dim]] | None = Field(None, description="shape of each carried tensor")
    shapes: dict[str, list[Dim]] = Field(description="the universe: graftable tensor names and shapes, in order")
    weights_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="sha256 of graft.safetensors")
    metadata: GraftMetadata = Field(default_factory=GraftMetadata, description="task, mode, how it was learned, …")

    @field_validator("base_fingerprint", mode="before")
    @classmethod
    def _empty_is_missing(cls, v):
        return None if v == "" else v


@dataclass
class GraftFile:
    """What a graft folder holds, validated: the config and the tensors unpacked per universe tensor."""

    config: GraftFileConfig
    shapes: dict[str, tuple[int, ...]]
    indices: dict[str, torch.Tensor]
    values: dict[str, torch.Tensor]
    carried: dict[str, torch.Tensor]


def numel(shape) -> int:
    return math.prod(int(d) for d in shape)


# ---------------------------------------------------------------------------------------------- writing
def write_graft_file(directory: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict, *,
                     overwrite: bool = False) -> Path:
    """Write ``graft.safetensors`` (``tensors``) + ``graft_config.json`` (``config`` + the checksum) atomically."""
    from safetensors.torch import save  # noqa: PLC0415

    for key, t in tensors.items():  # never write what we would refuse to read
        refuse_non_finite(t, f"{Path(directory) / WEIGHTS_FILE}: tensor {key!r}", NON_FINITE)
    blob = save(tensors, metadata={"format": FORMAT})
    config = {**config, "weights_sha256": hashlib.sha256(blob).hexdigest()}
    try:
        GraftFileConfig.model_validate(config)  # never write what we would refuse to read
    except ValidationError as e:
        raise SkillgraftError(file_message(e, Path(directory) / CONFIG_FILE, UNKNOWN)) from None
    text = json.dumps(config, indent=2)
    with atomic_dir(directory, overwrite=overwrite) as tmp:
        (tmp / WEIGHTS_FILE).write_bytes(blob)
        (tmp / CONFIG_FILE).write_text(text + "\n")
    return Path(directory)


# ---------------------------------------------------------------------------------------------- reading
def read_graft_file(directory: str | os.PathLike) -> GraftFile:
    """Read and validate a graft folder; any problem is one error naming the file and the field/position."""
    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise SkillgraftError(f"{directory}: not a graft folder (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    cfg = read_config(cfg_path)
    shapes = {k: tuple(v) for k, v in cfg.shapes.items()}
    tensors = read_tensors(w_path, cfg.weights_sha256)
    carried = _carried(w_path, tensors, cfg)
    if "indices" in tensors or "values" in tensors:
        indices, values = _packed(w_path, tensors, shapes, cfg.size)
    else:
        indices, values = _per_tensor(w_path, tensors, shapes, cfg.size)
    return GraftFile(cfg, shapes, indices, values, carried)


def read_config(path: Path) -> GraftFileConfig:
    """``graft_config.json`` validated against :class:`GraftFileConfig`, plus the cross-field checks."""
    from skillgraft.untrusted import unique_keys  # noqa: PLC0415

    raw = parse_file(path, lambda text: json.loads(text, object_pairs_hook=unique_keys), ValueError,
                     lambda e: f"not valid JSON ({e.msg} at line {e.lineno})" if isinstance(e, json.JSONDecodeError)
                     else str(e))
    if not isinstance(raw, dict):
        raise SkillgraftError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    if "format" in raw and raw["format"] != FORMAT:
        raise SkillgraftError(f"{path}: field 'format': {raw['format']!r} is not a skillgraft graft ({FORMAT!r})")
    version = raw.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise SkillgraftError(f"{path}: field 'format_version': {version} is newer than this skillgraft reads "
                              f"(≤ {FORMAT_VERSION}); upgrade skillgraft")
    try:
        cfg = GraftFileConfig.model_validate(raw)
    except ValidationError as e:
        raise SkillgraftError(file_message(e, path, UNKNOWN)) from None

    def bad(field: str, msg: str):
        return SkillgraftError(f"{path}: field {field!r}: {msg}")

    universe = sum(numel(s) for s in cfg.shapes.values())
    if len(set(cfg.carried)) != len(cfg.carried):
        raise bad("carried", f"names repeat: {cfg.carried}")
    both = sorted(set(cfg.carried) & set(cfg.shapes))
    if both:
        raise bad("carried", f"{both[0]!r} is also a graftable tensor in 'shapes'")
    if cfg.carried_shapes is not None and set(cfg.carried_shapes) != set(cfg.carried):
        diff = sorted(set(cfg.carried_shapes) ^ set(cfg.carried))
        raise bad("carried_shapes", f"names differ from 'carried' (e.g. {diff[0]!r})")
    if cfg.graftable_parameters is not None and cfg.graftable_parameters != universe:
        raise bad("graftable_parameters", f"{cfg.graftable_parameters} but 'shapes' hold {universe} coordinates")
    if cfg.size > universe:
        raise bad("size", f"{cfg.size} is more than the {universe} coordinates of 'shapes'")
    if cfg.density is not None and not math.isclose(cfg.density, cfg.size / max(1, universe), rel_tol=1e-6,
                                                    abs_tol=1e-12):
        raise bad("density", f"{cfg.density} but size / graftable = {cfg.size / max(1, universe)}")
    return cfg


def read_tensors(path: Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (matching ``sha256`` if given); a damaged file is one error naming it."""
    from safetensors.torch import load  # noqa: PLC0415

    from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

    if path.is_file():
        check_safetensors(path)  # its header bounded before safetensors reads it (models/headers.py)
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise SkillgraftError(f"{path}: cannot read ({e})") from None
    try:
        tensors = load(blob)
    except Exception as e:  # noqa: BLE001  (safetensors raises its own error types; any of them means unreadable)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SkillgraftError(f"{path}: not a readable safetensors file ({reason}); truncated or corrupted") from None
    if sha256 is not None and hashlib.sha256(blob).hexdigest() != sha256:
        raise SkillgraftError(f"{path}: contents do not match 'weights_sha256' in {CONFIG_FILE}; the file is "
                              "corrupted or was changed after saving")
    return tensors


def _carried(path: Path, tensors: dict[str, torch.Tensor], cfg: GraftFileConfig) -> dict[str, torch.Tensor]:
    carried = {k[len("carried::"):]: v for k, v in tensors.items() if k.startswith("carried::")}
    for name in cfg.carried:
        if name not in carried:
            raise SkillgraftError(f"{path}: carried tensor {name!r} declared in {CONFIG_FILE} is missing")
    for name, t in carried.items():
        if name not in cfg.carried:
            raise SkillgraftError(f"{path}: tensor 'carried::{name}' is not declared in {CONFIG_FILE} 'carried'")
        if not t.dtype.is_floating_point:
            raise SkillgraftError(f"{path}: carried tensor {name!r} has dtype {t.dtype}; expected floating point")
        refuse_non_finite(t, f"{path}: carried tensor {name!r}", NON_FINITE)
        if cfg.carried_shapes is not None and list(t.shape) != cfg.carried_shapes[name]:
            raise SkillgraftError(f"{path}: carried tensor {name!r} has shape {list(t.shape)}; {CONFIG_FILE} "
                                  f"declares {cfg.carried_shapes[name]}")
    total = sum(t.numel() for t in carried.values())
    if cfg.carried_parameters is not None and total != cfg.carried_parameters:
        raise SkillgraftError(f"{path}: carried tensors hold {total} values; {CONFIG_FILE} 'carried_parameters' "
                              f"declares {cfg.carried_parameters}")
    return carried


def check_positions(path: Path, what: str, idx: torch.Tensor, vals: torch.Tensor | None, limit: int,
                     range_of: str) -> torch.Tensor:
    """dtype, 1-D, count, range [0, limit) and strictly increasing order of one indices tensor."""
    if str(idx.dtype) not in INDEX_DTYPES:
        raise SkillgraftError(f"{path}: {what} has dtype {idx.dtype}; expected int32 or int64")
    if idx.dim() != 1:
        raise SkillgraftError(f"{path}: {what} has shape {list(idx.shape)}; expected one dimension")
    if vals is not None and vals.numel() != idx.numel():
        raise SkillgraftError(f"{path}: {what} has {idx.numel()} positions but the values tensor has {vals.numel()}")
    idx = idx.long()
    if not idx.numel():
        return idx
    out = torch.nonzero((idx < 0) | (idx >= limit)).reshape(-1)
    if out.numel():
        i = int(out[0])
        raise SkillgraftError(f"{path}: {what}[{i}] = {int(idx[i])} is out of range [0, {limit}) ({range_of})")
    step = idx[1:] - idx[:-1]
    wrong = torch.nonzero(step <= 0).reshape(-1)
    if wrong.numel():
        i = int(wrong[0]) + 1
        kind = "duplicated" if int(step[i - 1]) == 0 else "out of order"
        raise SkillgraftError(f"{path}: {what}[{i}] = {int(idx[i])} follows {int(idx[i - 1])}: positions must be "
                              f"sorted and unique ({kind})")
    return idx


def _check_values(path: Path, what: str, vals: torch.Tensor) -> None:
    if not vals.dtype.is_floating_point:
        raise SkillgraftError(f"{path}: {what} has dtype {vals.dtype}; expected floating point")
    if vals.dim() != 1:
        raise SkillgraftError(f"{path}: {what} has shape {list(vals.shape)}; expected one dimension")


def _non_finite(path: Path, what: str, count: int) -> None:
    more = f" ({count} non-finite values in all)" if count > 1 else ""
    raise SkillgraftError(f"{path}: {what}{more}; {NON_FINITE}")


def _packed(path: Path, tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], size: int
            ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    for key in tensors:
        if key not in ("indices", "values") and not key.startswith("carried::"):
            raise SkillgraftError(f"{path}: unexpected tensor {key!r} beside the packed 'indices'/'values'")
    for key in ("indices", "values"):
        if key not in tensors:
            raise SkillgraftError(f"{path}: tensor {key!r} is missing (packed layout needs 'indices' and 'values')")
    vals = tensors["values"]
    _check_values(path, "tensor 'values'", vals)
    universe = sum(numel(s) for s in shapes.values())
    flat = check_positions(path, "tensor 'indices'", tensors["indices"], vals, universe,
                            "the coordinates of 'shapes'")
    if flat.numel() != size:
        raise SkillgraftError(f"{path}: holds {flat.numel()} positions and values; "
                              f"{CONFIG_FILE} 'size' declares {size}")
    sizes = [numel(s) for s in shapes.values()]
    ends = torch.tensor(sizes, dtype=torch.long).cumsum(0)
    bad = first_non_finite(vals)
    if bad is not None:
        i, value, count = bad
        k = int(torch.searchsorted(ends, flat[i], right=True))
        name = list(shapes)[k]
        _non_finite(path, f"tensor 'values'[{i}] is {value} (coordinate {int(flat[i]) - int(ends[k]) + sizes[k]} of "
                          f"{name!r})", count)
    cuts = [0, *torch.searchsorted(flat, ends).tolist()]  # where each universe tensor's positions end
    indices, values = {}, {}
    for k, name in enumerate(shapes):
        lo, hi = cuts[k], cuts[k + 1]
        if hi > lo:
            indices[name], values[name] = flat[lo:hi] - (int(ends[k]) - sizes[k]), vals[lo:hi]
    return indices, values


def _per_tensor(path: Path, tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], size: int
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    indices, values = {}, {}
    for key, t in tensors.items():
        if key.startswith("carried::"):
            continue
        name, sep, kind = key.rpartition("::")
        if not sep or kind not in ("indices", "values"):
            raise SkillgraftError(f"{path}: unexpected tensor {key!r} (expected 'indices'/'values', "
                                  "'<name>::indices'/'<name>::values' or 'carried::<name>')")
        if name not in shapes:
            raise SkillgraftError(f"{path}: tensor {key!r} names {name!r}, which is not in {CONFIG_FILE} 'shapes'")
        (indices if kind == "indices" else values)[name] = t
    for name in sorted(set(indices) ^ set(values)):
        missing = "values" if name in indices else "indices"
        raise SkillgraftError(f"{path}: tensor '{name}::{missing}' is missing")
    for name in indices:
        _check_values(path, f"tensor '{name}::values'", values[name])
        indices[name] = check_positions(path, f"tensor '{name}::indices'", indices[name], values[name],
                                         numel(shapes[name]), f"tensor {name!r} of shape {list(shapes[name])}")
        bad = first_non_finite(values[name])
        if bad is not None:
            i, value, count = bad
            _non_finite(path, f"tensor '{name}::values'[{i}] is {value} (coordinate {int(indices[name][i])} of "
                              f"{name!r})", count)
    total = sum(int(v.numel()) for v in indices.values())
    if total != size:
        raise SkillgraftError(f"{path}: holds {total} positions and values; {CONFIG_FILE} 'size' declares {size}")
    return indices, values
