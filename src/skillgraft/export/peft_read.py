"""A sparse PEFT adapter (SHiRA or Supertuning) read back as a Graft (:func:`graft_from_peft`): the exact region
when the adapter carries skillgraft's header, else its entries' non-zero support; and its base model
(:func:`load_adapter_base`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from skillgraft.lazy import nn, torch

from skillgraft.errors import SkillgraftError
from skillgraft.export.adapter_checks import adapter_base, check_flat_indices, check_shira_indices
from skillgraft.export.base import ADAPTER_CONFIG, ADAPTER_WEIGHTS, HEAD_FILE, PEFT_PREFIX, _as_scorer
from skillgraft.export.shira import SUPERTUNING, apply_entries
from skillgraft.finite import refuse_non_finite
from skillgraft.graft.graft import Graft
from skillgraft.graft.identity import cached_fingerprint
from skillgraft.graft.graft_file import WEIGHTS_FILE
from skillgraft.graft.region import Region
from skillgraft.untrusted import read_json
from skillgraft.models.anatomy import graftable_names


# ---------------------------------------------------------------------------------------------- import
SPARSE = {"SHIRA": (".shira_weight", ".shira_indices"), SUPERTUNING: (".supertuning_values", ".supertuning_indices")}

def load_adapter_base(directory: str | os.PathLike, model: str | None = None, *, runtime=None) -> nn.Module:
    """The HF base model of a PEFT adapter folder (``--model`` or its ``base_model_name_or_path``; a classifier's),
    placed on ``runtime`` (the verb's)."""
    cfg, meta = _read_adapter(Path(directory))
    name = model or cfg.get("base_model_name_or_path")
    if not name:
        raise SkillgraftError(f"{directory}: the adapter names no base model; pass --model")
    if meta.get("mode"):
        mode = meta["mode"]
    else:
        cls = str((cfg.get("auto_mapping") or {}).get("base_model_class", ""))
        mode = "causal" if cfg.get("task_type") == "CAUSAL_LM" or cls.endswith("ForCausalLM") else \
            "prompt" if cls.endswith("ForMaskedLM") else \
            "classifier" if cfg.get("task_type") == "SEQ_CLS" or cls.endswith("ForSequenceClassification") else "head"
    with torch.random.fork_rng(devices=[]):  # CPU only: models load there first
        torch.manual_seed(0)
        return adapter_base(Path(directory), meta, name, mode, runtime)


def _read_adapter(directory: Path) -> tuple[dict, dict]:
    """(adapter_config, skillgraft header metadata or {}) of a PEFT adapter folder; SHiRA only."""
    cfg_path = directory / ADAPTER_CONFIG
    if not cfg_path.is_file():
        raise SkillgraftError(f"{directory}: not a PEFT adapter folder (no {ADAPTER_CONFIG})")
    cfg = read_json(cfg_path, required=("peft_type",), what="PEFT adapter config")
    if str(cfg["peft_type"]).upper() not in SPARSE:
        raise SkillgraftError(f"{cfg_path}: a {cfg['peft_type']} adapter; only SHiRA and Supertuning adapters (sparse "
                              "weights) import as a graft region")
    w_path = directory / ADAPTER_WEIGHTS
    if not w_path.is_file():
        other = "adapter_model.bin (pickle, not read)" if (directory / "adapter_model.bin").is_file() else "none"
        raise SkillgraftError(f"{directory}: no {ADAPTER_WEIGHTS} (found: {other})")
    from safetensors import safe_open  # noqa: PLC0415

    from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

    check_safetensors(w_path)  # its header bounded before safetensors reads it (models/headers.py)
    try:
        with safe_open(str(w_path), "pt") as f:
            header = f.metadata() or {}
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors' own error types: the file is damaged
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise SkillgraftError(f"{w_path}: not a readable safetensors file ({reason}); truncated or corrupted") from None
    try:
        meta = json.loads(header["skillgraft"]) if "skillgraft" in header else {}
    except json.JSONDecodeError as e:
        raise SkillgraftError(f"{w_path}: its 'skillgraft' header is not valid JSON ({e.msg}); the adapter is "
                              "damaged (export it again)") from None
    return cfg, _checked_header(w_path, meta)


def _checked_header(w_path: Path, meta) -> dict:
    """The ``skillgraft`` header of an adapter written by :func:`~skillgraft.export.peft.export_peft`, each field
    it is read for of its type: per-layer entry counts whole numbers ≥ 0 (a negative count sliced the stored
    entries from the end: another region), shapes lists of sizes, the rest objects or text. One line naming the
    file and the field (before: an AttributeError, or a silently different region)."""
    def bad(field: str, want: str, got) -> SkillgraftError:
        return SkillgraftError(f"{w_path}: 'skillgraft' header field {field!r} must be {want}, got {got!r}"[:400])

    if not isinstance(meta, dict):
        raise bad("(whole)", "a JSON object", type(meta).__name__)
    entries = meta.get("shira_entries", {})
    if not isinstance(entries, dict):
        raise bad("shira_entries", "an object of layer → count", entries)
    for layer, n in entries.items():
        if type(n) is not int or n < 0:
            raise bad(f"shira_entries.{layer}", "a whole number ≥ 0", n)
    shapes = meta.get("shapes", {})
    if not isinstance(shapes, dict):
        raise bad("shapes", "an object of tensor → shape", shapes)
    for name, shape in shapes.items():
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise bad(f"shapes.{name}", "a list of sizes ≥ 0", shape)
    for field in ("metadata",):
        if meta.get(field) is not None and not isinstance(meta[field], dict):
            raise bad(field, "an object", meta[field])
    for field in ("base_model", "base_fingerprint", "mode"):
        if meta.get(field) is not None and not isinstance(meta[field], str):
            raise bad(field, "text", meta[field])
    task_spec = (meta.get("metadata") or {}).get("task_spec")
    if task_spec is not None and not isinstance(task_spec, dict):
        raise bad("metadata.task_spec", "an object", task_spec)
    return meta


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file of an adapter folder: readable, and every value finite."""
    from safetensors.torch import load_file  # noqa: PLC0415

    from skillgraft.models.headers import check_safetensors  # noqa: PLC0415

    check_safetensors(path)  # its header bounded before safetensors reads it (models/headers.py)
    try:
        tensors = load_file(str(path))
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors' own error types: the file is damaged
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise SkillgraftError(f"{path}: not a readable safetensors file ({reason}); truncated or corrupted") from None
    for key, t in tensors.items():
        refuse_non_finite(t, f"{path}: tensor {key!r}", "an adapter must hold finite values (a faulty writer, or a "
                                                      "diverged training): merged, it would poison the model")
    return tensors


def graft_from_peft(directory: str | os.PathLike, base=None, *, force: bool = False) -> Graft:
    """Read a PEFT SHiRA or Supertuning adapter as a Graft on ``base`` (a Scorer or its plain HF model; default: the
    adapter's base model, :func:`load_adapter_base`).

    The region is the adapter's support: every stored sparse entry (for an adapter written by
    :func:`export_peft`, its grafted entries without the zero padding), plus, in modules stored whole, the
    coordinates that differ from the base. Values are what peft's merge computes, fl(θ_pre + w). A damaged
    weights file or a non-finite value is refused naming the file and the tensor's position.
    """
    directory = Path(directory)
    cfg, meta = _read_adapter(directory)
    scorer = _as_scorer(base if base is not None else load_adapter_base(directory))
    params = dict(scorer.named_parameters())
    canonical = {id(p): n for n, p in params.items()}  # a tied weight is named once, by its first owner
    got = cached_fingerprint(scorer)
    if meta.get("base_fingerprint") and meta["base_fingerprint"] != got and not force:
        raise SkillgraftError(f"{directory}: the adapter was exported from base {meta.get('base_model') or '?'} "
                              f"[{meta['base_fingerprint']}]; the given base has fingerprint {got}. Pass its base "
                              "model, or force it")
    tensors = _load_weights(directory / ADAPTER_WEIGHTS)
    entries = meta.get("shira_entries", {})
    peft_type = str(cfg["peft_type"]).upper()
    value_key, index_key = SPARSE[peft_type]
    indices: dict[str, torch.Tensor] = {}
    values: dict[str, torch.Tensor] = {}
    head, carried = set(getattr(scorer, "carried", ())), {}
    for key, t in tensors.items():
        path = key.removeprefix(PEFT_PREFIX)
        if path.endswith(value_key):
            path = path[: -len(value_key)]
            try:
                module = scorer.model.get_submodule(path)
            except AttributeError:
                module = None
            if not isinstance(module, nn.Linear):
                raise SkillgraftError(f"{directory}: sparse layer {path!r} is not a Linear of the given base model")
            if entries.get(path, -1) == 0:
                continue  # a zero placeholder target (export_peft found no Linear weight to hold)
            name = canonical[id(module.weight)]
            ij = tensors.get(f"{PEFT_PREFIX}{path}{index_key}")
            if ij is None:
                raise SkillgraftError(f"{directory}: {key} has no matching {index_key[1:]}")
            w = params[name]
            if peft_type == SUPERTUNING:  # flat positions, as (row, column) pairs once checked
                check_flat_indices(directory / ADAPTER_WEIGHTS, f"{PEFT_PREFIX}{path}{index_key}", ij, t, w.shape)
                ij = torch.stack([ij.long() // w.shape[1], ij.long() % w.shape[1]])
            else:
                check_shira_indices(directory / ADAPTER_WEIGHTS, f"{PEFT_PREFIX}{path}{index_key}", ij, t, w.shape)
            ij, t = ij.long(), t.reshape(-1)
            if path in entries:  # written by export_peft: grafted entries first, zero padding after
                if entries[path] > t.numel():
                    raise SkillgraftError(f"{directory / ADAPTER_WEIGHTS}: 'skillgraft' header field "
                                          f"'shira_entries.{path}' = {entries[path]} is more than the "
                                          f"{t.numel()} entries stored for that layer; the adapter is damaged")
                ij, t = ij[:, : entries[path]], t[: entries[path]]
            flat = ij[0] * w.shape[1] + ij[1]
            indices[name] = torch.unique(flat)
            values[name] = apply_entries(w, flat, t, peft_type).view(-1)[indices[name]]  # as peft computes it
        elif not path.endswith(index_key):  # a module or tensor stored whole
            owner, _, pname = path.replace(".base_layer.", ".").rpartition(".")
            try:
                p = getattr(scorer.model.get_submodule(owner), pname, None)
            except AttributeError:
                p = None
            name = canonical.get(id(p)) if isinstance(p, torch.Tensor) else None
            if name is None:
                continue  # a buffer of a module stored whole
            old = params[name].detach().cpu().reshape(-1)
            new = t.reshape(-1).to(old.dtype)
            if new.numel() != old.numel():
                raise SkillgraftError(f"{directory}: {path} has {new.numel()} values, the base model's has "
                                      f"{old.numel()}")
            if name in head:  # a classifier's task head (modules_to_save): carried whole, as in the graft
                carried[name] = new.reshape(params[name].shape).clone()
                continue
            changed = torch.nonzero(new != old).reshape(-1)
            if changed.numel():
                indices[name], values[name] = changed, new[changed]
    if meta.get("shapes"):
        shapes = {k: tuple(v) for k, v in meta["shapes"].items()}
    else:
        shapes = {n: tuple(params[n].shape) for n in graftable_names(scorer)}
    shapes.update({n: tuple(params[n].shape) for n in indices if n not in shapes})
    if (directory / HEAD_FILE).is_file():
        carried |= {f"head.{k}": v for k, v in _load_weights(directory / HEAD_FILE).items()}
    metadata = {**meta.get("metadata", {}), "imported_from": str(directory), "peft_type": peft_type,
                **({"sparsity": cfg.get("sparsity")} if peft_type == SUPERTUNING else {"r": cfg.get("r")})}
    return Graft(Region(shapes, indices), values, carried, meta.get("base_model") or cfg.get("base_model_name_or_path")
                 or "", got, metadata, directory)


def read_graft_or_adapter(directory: str | os.PathLike, model: str | None = None, *, runtime=None
                          ) -> tuple[Graft, Path]:
    """A graft folder, or a PEFT SHiRA adapter folder read on its base model (loaded on ``runtime``); returns (graft,
    weights file)."""
    directory = Path(directory)
    if (directory / ADAPTER_CONFIG).is_file():
        base = load_adapter_base(directory, model, runtime=runtime)
        return graft_from_peft(directory, base), directory / ADAPTER_WEIGHTS
    return Graft.from_pretrained(directory), directory / WEIGHTS_FILE
