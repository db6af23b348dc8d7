"""What every exporter shares: the :class:`Exporter` interface, :class:`ExportSpec`, the base model a graft is
exported for (checked like :meth:`Graft.apply`), exact additive deltas and the carried head's separate file."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import ClassVar, Literal, Optional

from skillgraft.lazy import torch
from pydantic import Field, field_validator, model_validator
from skillgraft.lazy import nn

from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.graft.identity import cached_fingerprint
from skillgraft.models.families import HUB_IDS
from skillgraft.registry import Registry
from skillgraft.spec import Spec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
DELTA_FILE = "delta.safetensors"
HEAD_FILE = "skillgraft_head.safetensors"
SUMMARY_FILE = "skillgraft_export.json"
PEFT_PREFIX = "base_model.model."
SCORER_PREFIX = "model."
_HUB_IDS = HUB_IDS  # the one table of model-family quirks (models/families.py)

def human_size(n: int) -> str:
    """A file size as people read it: MiB from 1 MiB up (``551.6 MiB``, not ``564865.6 KiB``), else KiB."""
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


class ExportSpec(Spec):
    """Options of ``skillgraft export`` (one source for the CLI and the library)."""

    to: str = Field("peft", description="peft: a sparse PEFT adapter folder (SHiRA or Supertuning); hf: the grafted "
                                        "model as a Hugging Face checkpoint; delta: delta.safetensors of per-tensor int32 indices + values "
                                        "(stock safetensors reader); any other registered exporter (EXPORTERS)")
    model: Optional[str] = Field(None, description="base model (default: the one recorded in the graft)")
    non_linear: Literal["modules_to_save", "tensors", "refuse"] = Field(
        "modules_to_save", description="coordinates a sparse adapter cannot hold (biases, norms, embeddings, Conv1D, "
                                       "tied weights): modules_to_save stores their modules whole (peft's own route: "
                                       "disable_adapter(), and delete_adapter() then unload(), give the base model "
                                       "exactly; a grafted Linear bias stores its whole Linear); tensors stores just those tensors, written into the base "
                                       "model on load like peft's LoRA bias='all' (smaller, but disabling or "
                                       "unloading the adapter does not undo them); refuse lists them and writes "
                                       "nothing. A classifier's own head, which the base lacks, is stored whole "
                                       "(modules_to_save) either way")
    tuner: Literal["auto", "shira", "supertuning"] = Field(
        "auto", description="--to peft: the sparse PEFT tuner holding the grafted Linear weights. auto: the fewer "
                            "bytes; shira: SHiRA, r·(m+n) entries per Linear (one r); supertuning: peft's "
                            "Supertuning, m·n·(1 − sparsity) entries per Linear (one sparsity; peft ≥ 0.21). Both "
                            "restore the base on disable_adapter() and unload()")
    head: Literal["separate", "refuse"] = Field(
        "separate", description="a head-mode graft's new task head: separate writes skillgraft_head.safetensors "
                                "beside the adapter/delta (the adapter alone outputs hidden states); refuse")
    overwrite: bool = Field(False, description="replace an existing output folder whole (never mixed into)")
    force: bool = Field(False, description="export even if the base model's fingerprint differs from the graft's")
    gguf_type: str = Field("exact", description="--to gguf: the type of the tensors the graft touches. exact: the "
                                                "smallest that holds their grafted values bit for bit (the base's "
                                                "own blocks with only the grafted values' quants changed, else BF16 "
                                                "or F16, else F32); base: the base's own type and bytes, each grafted "
                                                "value rounded to its block's nearest level (the base's size; warns "
                                                "when it keeps under 0.9 of the grafted change); F32, BF16, F16, Q8_0 "
                                                "or Q4_0: the touched matrices re-quantized to it (norms stay F32) "
                                                "— for measuring that loss (docs/export.md)")


    @field_validator("to")
    @classmethod
    def _registered(cls, v: str) -> str:
        if v not in EXPORTERS:
            raise ValueError(f"unknown export target {v!r}; known: {', '.join(EXPORTERS)}")
        return v

    @model_validator(mode="after")
    def _options_of_another_target(self):
        """An option given for another export target than ``to`` is refused, not silently ignored (``--gguf-type``
        with ``--to peft`` wrote an adapter at the graft's own precision, exit 0)."""
        wrong = sorted(f for f in self.model_fields_set if ONLY_FOR.get(f, self.to) != self.to)
        if wrong:
            names = ", ".join(f"--{f.replace('_', '-')}" for f in wrong)
            raise ValueError(f"{names} only shapes --to {ONLY_FOR[wrong[0]]}; this export is --to {self.to}: leave "
                             f"{'it' if len(wrong) == 1 else 'them'} out")
        return self


# options of one export target only (ExportSpec refuses them with any other)
ONLY_FOR = {"gguf_type": "gguf", "tuner": "peft"}


class Exporter:
    """Base of every export target: ``export`` writes the folder and returns its summary (the JSON written as
    ``skillgraft_export.json``); ``lines`` is what a command line prints of that summary."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    container: ClassVar[str | None] = None  # what cannot hold a carried head ("PEFT adapter"); None: it carries it
    base_kind: ClassVar[str] = "any"  # "gguf": only a graft whose base is a GGUF file
    writes: ClassVar[str] = "folder"  # "file": ``out`` is one file (FILE.gguf), no skillgraft_export.json beside it
    suffix: ClassVar[str | None] = None  # ".gguf": ``apply --export FILE.gguf`` writes with this exporter

    def refuse(self, graft: Graft, out, spec: ExportSpec) -> None:
        """Refusals that need no model (called before the base loads); raise a SkillgraftError."""

    def export(self, graft: Graft, base, out: str | os.PathLike, spec: ExportSpec) -> dict:
        raise NotImplementedError

    def lines(self, summary: dict) -> list[tuple[str, str]]:
        """``(kind, text)`` to print, ``kind`` one of ``info``, ``note``, ``hint``, ``warning``: the separate head
        file and inexact coordinates (every exporter may have them)."""
        out = []
        head = (summary.get("routes") or {}).get("head") or summary.get("head")
        if head:
            out.append(("note", f"task head ({head['parameters']:,} parameters) written separately to "
                                f"{summary['out']}/{HEAD_FILE}: the adapter alone outputs hidden states, not labels"))
        if summary.get("inexact"):
            out.append(("warning", f"{summary['inexact']} coordinate(s) are not reproduced bit for bit by the "
                                   "additive form (within an ulp)"))
        return out

    def applied(self, summary: dict, out) -> list[tuple[str, str]]:
        """What ``apply --export`` prints of the grafted model written to ``out`` (``lines`` and where it went)."""
        return [*self.lines(summary), ("info", f"exported grafted model → {out} ({self.name}: {self.summary})")]


_REGISTRY: Registry[Exporter] = Registry(Exporter, "exporter", article="an", lookup="export target")
EXPORTERS: dict[str, Exporter] = _REGISTRY.members  # filled by export/__init__.py's lines (and users' own)
register_exporter = _REGISTRY.register  # class decorator: register an Exporter subclass under a name
get_exporter = _REGISTRY.get  # the registered member of that name (an error listing the known names)
APPLY_EXPORTER = "hf"  # what ``apply --export OUT`` writes unless an exporter claims OUT's suffix


def exporter_for(out: str | os.PathLike) -> str:
    """The exporter ``apply --export OUT`` writes with: the registered one whose ``suffix`` ends ``OUT``'s name
    (``FILE.gguf``: gguf), else the grafted model as a Hugging Face checkpoint (``hf``)."""
    name = Path(out).name.lower()
    for key, exporter in EXPORTERS.items():
        if exporter.suffix and name.endswith(exporter.suffix.lower()):
            return key
    return APPLY_EXPORTER


# ---------------------------------------------------------------------------------------------- the output
def export_inputs(graft: Graft, model: str | os.PathLike | None = None, base=None,
                  **more: str | os.PathLike | None) -> dict[str, object]:
    """Every input an export of ``graft`` reads, by the name a message gives it: the graft's folder, ``--model``,
    the base recorded in the graft (read when ``--model`` is not given, and the only base the graft is applied to
    later), the folder the base was loaded from, the GGUF file a converted base came from, the data files the graft
    records, and ``more`` (``--data-dir``). None and names that are no path (hub ids) are skipped by the check."""
    inputs: dict[str, object] = {"graft": graft.source, "--model": model,
                                 "the graft's base (graft_config.json base_model)": graft.base_model or None}
    model_obj = getattr(base, "model", base)
    loaded = getattr(getattr(model_obj, "config", None), "_name_or_path", None) or getattr(base, "name_or_path", None)
    inputs["the base model's folder"] = loaded
    for name in (model, graft.base_model, loaded):
        source = _gguf_source(name)
        if source:
            inputs[f"the GGUF file the base was converted from ({name})"] = source
    user = graft.metadata.user_data or {}
    for key in ("data", "eval_data"):
        if isinstance(user.get(key), str):
            inputs[f"the graft's recorded --{key.replace('_', '-')}"] = user[key]
    inputs.update(more)
    return inputs


def _gguf_source(name) -> str | None:
    """The GGUF file a store folder ``name`` was converted from (None for anything else)."""
    from skillgraft.models.gguf import SOURCE_FILE  # noqa: PLC0415
    from skillgraft.untrusted import read_json  # noqa: PLC0415

    if not name or not (Path(str(name)) / SOURCE_FILE).is_file():
        return None
    try:
        file = read_json(Path(str(name)) / SOURCE_FILE).get("file")
    except SkillgraftError:
        return None
    return file if isinstance(file, str) else None


def check_export_target(graft: Graft, out: str | os.PathLike, overwrite: bool = False, *, model=None, base=None,
                        **more) -> Path:
    """The one check of an export's output, before any work (every exporter, ``export``, ``apply --export``): an
    existing ``out`` refused unless ``overwrite``, and never one of the export's own inputs (:func:`export_inputs`)
    or a folder holding one, with or without ``--overwrite``: `export G --to hf --out BASE --overwrite` replaced
    the graft's recorded base, which the graft could then never be applied to again."""
    from skillgraft.io import check_target  # noqa: PLC0415

    return check_target(out, overwrite, export_inputs(graft, model, base, **more))


# ---------------------------------------------------------------------------------------------- base model
def _as_scorer(base) -> nn.Module:
    """A Scorer stays itself; a plain Hugging Face model is wrapped so its parameters read ``model.*``."""
    from transformers import PreTrainedModel  # noqa: PLC0415

    from skillgraft.models.named import PlainModel  # noqa: PLC0415

    if not isinstance(base, PreTrainedModel) and isinstance(getattr(base, "model", None), nn.Module):
        return base
    if isinstance(base, nn.Module):
        return PlainModel(base)
    raise SkillgraftError(f"expected a Scorer or a Hugging Face model as the base, got {type(base).__name__}")


def _hf_name(name: str) -> str:
    if not name.startswith(SCORER_PREFIX):
        raise SkillgraftError(f"graft tensor {name!r} is not part of the base model (expected 'model.<name>')")
    return name[len(SCORER_PREFIX):]


def _check_base(graft: Graft, scorer, force: bool) -> dict[str, torch.Tensor]:
    """The base must have every graft tensor with its shape, and (unless ``force``) the graft's fingerprint."""
    params = dict(scorer.named_parameters())
    for name, shape in graft.region.shapes.items():
        if name.startswith("head."):
            continue
        if name not in params:
            raise SkillgraftError(f"this graft covers tensor {name!r}, which the base model does not have; it was "
                                  "learned on a different architecture")
        if tuple(params[name].shape) != tuple(shape):
            raise SkillgraftError(f"this graft expects {name!r} of shape {tuple(shape)}, the base model has "
                                  f"{tuple(params[name].shape)}")
    if not force and not graft.base_fingerprint:  # the same rule as Graft.apply
        raise SkillgraftError(f"{graft._where()} records no base_fingerprint, so it cannot be checked against the "
                              "base it is exported for; export it anyway with --force")
    if not force:
        got = cached_fingerprint(scorer)
        # the one precision rule, Graft.apply's (so `apply --export`, --to hf and every other exporter agree): the
        # graft's base loaded in another precision (--precision bf16 for an fp32 graft) is accepted with one warning
        if got != graft.base_fingerprint and not graft._same_base_other_precision(scorer):
            raise SkillgraftError(f"this graft was learned on base model {graft.base_model or '?'} with fingerprint "
                                  f"{graft.base_fingerprint}; the given base has {got}. Export against its base "
                                  "model, or force it (--force)")
    return params


def load_graft_base(graft: Graft, model: str | None = None, *, runtime=None):
    """The graft's base: a Scorer when its task is known (head pooling then known), else the plain HF model; placed
    on ``runtime`` (the verb's)."""
    from skillgraft.models.loading import model_reference  # noqa: PLC0415
    from skillgraft.models.scorer import load_for_mode, build_scorer  # noqa: PLC0415

    mode = graft.metadata.mode or "head"
    name = model or graft.base_model or None
    task = graft_task(graft)
    if task is not None:
        return build_scorer(name, task, mode, runtime=runtime)
    with torch.random.fork_rng(devices=[]):  # CPU only: models load there first
        torch.manual_seed(0)  # as build_scorer: weights missing from the checkpoint initialise the same way
        return load_for_mode(model_reference(name), mode, None, runtime)[0]


# ---------------------------------------------------------------------------------------------- exact deltas
def exact_delta(base: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive deltas d (in ``base``'s dtype) with fl(base + d) == target; returns d and a mask of misses.

    d = target − base rounded once is usually exact; where it is not, the rounding residual is folded back
    in (and a last ulp step tried). Some targets no single addition reaches: when fine-tuning shrank a weight
    (|target| < |base|/2), target may sit on a finer grid than both base and d; d then lands on the nearest
    reachable value, within half an ulp of max(|base|, |d|) (about 15% of a real MiniLM graft's coordinates).
    """
    base, target = base.reshape(-1), target.reshape(-1).to(base.dtype)
    b64, t64 = base.double(), target.double()
    d = (t64 - b64).to(base.dtype)
    for _ in range(4):
        bad = (base + d) != target
        if not bool(bad.any()):
            break
        got = (base[bad] + d[bad]).double()
        d[bad] = (d[bad].double() + (t64[bad] - got)).to(base.dtype)
    bad = (base + d) != target
    if bool(bad.any()) and base.dtype in (torch.float32, torch.float64):
        up = torch.where(target[bad] > base[bad] + d[bad], math.inf, -math.inf).to(base.dtype)
        step = torch.nextafter(d[bad], up)
        fixed = (base[bad] + step) == target[bad]
        d[bad] = torch.where(fixed, step, d[bad])
    return d, ((base + d) != target) & torch.isfinite(target)



# ---------------------------------------------------------------------------------------------- writers
def _head_file(graft: Graft, scorer, tmp: Path, head: str, what: str) -> dict | None:
    """Write the carried head beside the adapter/delta (or refuse); returns its summary."""
    if not graft.carried:
        return None
    names = {k: tuple(v.shape) for k, v in graft.carried.items()}
    if head == "refuse":
        raise SkillgraftError(
            f"this graft carries a new task head {names} that the base model lacks; a {what} for the base model "
            "cannot hold it. Use --head separate (writes it to skillgraft_head.safetensors beside it) or --to hf")
    from safetensors.torch import save_file  # noqa: PLC0415

    pooling = graft.metadata.pooling or getattr(scorer, "pooling", None) or "unknown"
    task = getattr(scorer, "task", None)
    meta = {"format": "skillgraft.head", "pooling": str(pooling),
            "labels": json.dumps(list(task.labels) if task is not None else []),
            "usage": "logits = pool(last_hidden_state of the grafted base model) @ weight.T + bias"}
    save_file({k.removeprefix("head."): v.detach().cpu().contiguous() for k, v in graft.carried.items()},
              str(tmp / HEAD_FILE), metadata=meta)
    return {"route": f"separate file {HEAD_FILE}", "tensors": sorted(graft.carried),
            "parameters": graft.carried_size, "pooling": str(pooling)}


def _header(graft: Graft, extra: dict) -> dict[str, str]:
    """safetensors header metadata (strings): the graft's config, so an import restores it exactly."""
    return {"format": "pt", "skillgraft": json.dumps({**graft.config(), **extra})}



def graft_task(graft: Graft):
    """The task a graft records: its own task spec (a checkpoint pair on a user's data), a registered task
    by name, or None."""
    from skillgraft.data.tasks import get_task  # noqa: PLC0415

    record = graft.metadata.task_spec
    if record is not None:
        from skillgraft.models.scorer import task_from_config  # noqa: PLC0415

        return task_from_config(dict(record), f"{graft._where()} metadata task_spec")
    name = graft.metadata.task
    if not name:
        return None
    try:
        return get_task(name)
    except SkillgraftError:
        return None


