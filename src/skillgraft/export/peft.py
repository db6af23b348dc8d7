"""Grafts in the tools users already have: a sparse PEFT adapter, a plain per-tensor delta, an HF checkpoint.

The grafted model is θ = θ_pre + γ ⊙ (θ_ft − θ_pre) (paper Eq. 1). Three ways to write it:

* ``peft``  — a PEFT **SHiRA** or **Supertuning** adapter folder (``adapter_config.json`` +
  ``adapter_model.safetensors``) for the plain Hugging Face base model, so that ``PeftModel.from_pretrained(base,
  dir)`` computes the grafted model and ``merge_and_unload()`` gives its weights; whichever of the two is fewer
  bytes for this graft. SHiRA stores, per targeted ``nn.Linear``, exactly r·(m+n) COO entries (indices ``[2, N]``
  of (row, col) in the ``[out, in]`` weight, values ``[N]``) with one global r; Supertuning stores
  int(m·n·(1 − sparsity)) flat int32 positions and values with one global sparsity; the saved indices replace the
  ones peft computes on load. Each Linear weight's region becomes its entries, padded with zero-valued entries
  outside the region. A value is the additive delta d with
  fl(θ_pre + d) == θ_ft; where no single fp32 addition reaches θ_ft, two entries at that position, −θ_pre
  then θ_ft (:func:`shira_entries`), so the merge is bit-exact. Coordinates SHiRA cannot hold — biases,
  norms, embeddings, GPT-2 ``Conv1D`` (peft's SHiRA wraps ``nn.Linear`` only), weights tied to another
  module, a Linear whose region would force a costlier global r — take the ``non_linear`` route:
  ``modules_to_save`` stores their modules whole (peft's own mechanism; dense), ``tensors`` stores just those
  tensors, which peft loads into the base model (as for LoRA's ``bias="all"``), ``refuse`` lists them.
* ``delta`` — ``delta.safetensors`` readable with the stock ``safetensors`` reader: per base tensor (its
  Hugging Face name) ``<name>::indices`` (int32 flat row-major positions), ``<name>::values`` (the grafted
  values: ``w.view(-1)[indices] = values``, exact) and ``<name>::delta`` (additive, ``w += delta``: exact
  except where no single fp32 addition reaches the value; counted as ``inexact``).
* ``hf``    — the grafted model as an ordinary checkpoint (:meth:`Graft.export`).

A head-mode graft carries a new task head that the base model lacks. It is never hidden inside the
adapter: ``head="separate"`` writes it to ``skillgraft_head.safetensors`` beside the adapter (with its
pooling and labels in the header, and a README saying the adapter alone outputs hidden states, not labels);
``head="refuse"`` refuses. This module writes the adapter; :mod:`skillgraft.export.shira` holds its entries and
the plan of routes, :mod:`skillgraft.export.peft_read` reads an adapter back as a Graft (``graft_from_peft``: a
Region to inspect, compare and compose).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from skillgraft.lazy import nn, torch

from skillgraft.export.base import (_HUB_IDS, ADAPTER_WEIGHTS, PEFT_PREFIX, SCORER_PREFIX, SUMMARY_FILE, ExportSpec,
                                    Exporter, _as_scorer, _check_base, _head_file, _header, _hf_name, check_export_target,
                                    human_size)
from skillgraft.export.card import peft_readme, sparse_tuner
from skillgraft.export.shira import (SUPERTUNING, Layer, apply_entries, count_in, grafted, placeholder_layer,
                                     plan_routes, sparse_bytes, supertuning_count, supertuning_sparsity)
from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.io import atomic_dir
from skillgraft.models.families import body_prefix


HEAD_REASON = "carried task head (θ_pre lacks it)"
_TUNER = {"SHIRA": "SHiRA", SUPERTUNING: "Supertuning"}


def export_peft(graft: Graft, base, out: str | os.PathLike, *, non_linear: str = "modules_to_save",
                head: str = "separate", tuner: str = "auto", overwrite: bool = False, force: bool = False) -> dict:
    """Write ``graft`` as a PEFT SHiRA or Supertuning adapter for ``base`` (a Scorer or its plain HF model);
    returns the summary.

    ``PeftModel.from_pretrained(base_hf_model, out)`` then computes the grafted model, and
    ``merge_and_unload()`` gives the weights of :meth:`Graft.export` bit for bit (:func:`shira_entries`; the
    summary's ``inexact`` counts coordinates where this machine's PyTorch would not, checked at export).
    """
    check_export_target(graft, out, overwrite, base=base)
    spec = ExportSpec.build({"non_linear": non_linear, "head": head, "tuner": tuner}, where="export_peft")
    scorer = _as_scorer(base)
    params = _check_base(graft, scorer, force)
    hf = scorer.model
    own_head = _own_head(graft, hf)  # a classifier's own head: modules of the base's class, stored whole
    if graft.carried and not own_head and spec.head == "refuse":
        _head_file(graft, scorer, Path(out), "refuse", "PEFT adapter")
    plan = plan_routes(graft, hf, spec.non_linear, _available(spec.tuner))
    taken = {l.path for l in plan.whole}
    plan.whole += [Layer(path, hf.get_submodule(path), {}, HEAD_REASON)
                   for path in own_head if path not in taken]
    placeholder = None
    if not plan.shira:
        placeholder = placeholder_layer(hf, {l.path for l in plan.whole})
        plan.shira, plan.r = [placeholder], 1
        if plan.peft_type == SUPERTUNING:  # one zero entry (peft allocates at least one per target)
            plan.sparsity = supertuning_sparsity([placeholder], graft)
    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, int] = {}
    inexact, pairs, padding = 0, 0, 0
    for layer in plan.shira:
        weight = layer.module.weight
        rows, cols = weight.shape
        name = layer.touched.get("weight")
        if name:
            flat, vals = layer.entries_for(graft)
            idx = graft.region.indices[name]
            pairs += len(flat) - len(idx)
            got = apply_entries(weight, flat, vals, plan.peft_type).view(-1)[idx]  # what peft computes, checked here
            inexact += int((got != graft.values[name].to(got.dtype)).sum())
        else:  # the zero placeholder
            flat, vals = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=weight.dtype)
        total = (supertuning_count(rows * cols, plan.sparsity) if plan.peft_type == SUPERTUNING else
                 plan.r * (rows + cols))
        n_pad = total - flat.numel()
        window = torch.arange(min(rows * cols, flat.numel() + n_pad))
        pad = window[~torch.isin(window, flat)][:n_pad]
        flat = torch.cat([flat, pad])
        vals = torch.cat([vals, torch.zeros(n_pad, dtype=vals.dtype)])
        if plan.peft_type == SUPERTUNING:  # flat int32 positions, float32 values (peft's own parameter dtype)
            tensors[f"{PEFT_PREFIX}{layer.path}.supertuning_indices"] = flat.to(torch.int32)
            tensors[f"{PEFT_PREFIX}{layer.path}.supertuning_values"] = vals.float()
        else:
            tensors[f"{PEFT_PREFIX}{layer.path}.shira_indices"] = torch.stack([flat // cols, flat % cols]).to(
                _index_dtype(rows, cols))
            tensors[f"{PEFT_PREFIX}{layer.path}.shira_weight"] = vals
        entries[layer.path] = int(flat.numel() - n_pad)
        padding += n_pad
    canonical = {id(p): n for n, p in params.items()}  # a tied weight is named once, by its first owner
    whole_stored = 0
    for layer in plan.whole:
        for key, t in layer.module.state_dict(keep_vars=True).items():
            sname = canonical.get(id(t))
            value = (graft.carried[sname].detach().cpu().clone() if sname in graft.carried else
                     grafted(t, graft, sname) if sname else t.detach().cpu().clone())
            tensors[f"{PEFT_PREFIX}{layer.path}.{key}"] = value.contiguous()
            whole_stored += value.numel()
    targets = {l.path for l in plan.shira}
    for name in plan.tensors:  # whole base tensors, loaded into the base model (like peft's LoRA bias="all")
        path, _, pname = _hf_name(name).rpartition(".")
        key = f"{path}.base_layer.{pname}" if path in targets else f"{path}.{pname}"
        tensors[PEFT_PREFIX + key] = grafted(params[name], graft, name).contiguous()
    shira_coords = sum(len(graft.region.indices[l.touched["weight"]]) for l in plan.shira if l.touched)
    summary = {
        "to": "peft", "out": str(out), "format": f"PEFT {_TUNER[plan.peft_type]} adapter",
        "base_model": _base_name(graft, scorer),
        "coordinates": graft.size, "graft_bytes": _graft_bytes(graft),
        "restores_base": {"disable_adapter": not plan.tensors,  # peft keeps modules_to_save on unload()
                          "unload": not plan.tensors and all(l.reason == HEAD_REASON for l in plan.whole),
                          # peft's unload() returns a modules_to_save wrapper's original only with no adapter active
                          "delete_adapter_then_unload": not plan.tensors},
        "routes": {
            "shira": {"peft_type": plan.peft_type, "modules": len(plan.shira) - (placeholder is not None),
                      "coordinates": shira_coords, "padding_entries": padding,
                      "entries": sum(entries.values()) + padding, "r": plan.r, "sparsity": plan.sparsity,
                      "placeholder": placeholder.path if placeholder else None},
            "modules_to_save": {"modules": {l.path: l.reason for l in plan.whole},
                                "coordinates": sum(count_in(graft, l) for l in plan.whole),
                                "stored_parameters": whole_stored},
            "tensors": {"tensors": {_hf_name(n): why for n, why in plan.tensors.items()},
                        "coordinates": sum(len(graft.region.indices[n]) for n in plan.tensors),
                        "stored_parameters": sum(params[n].numel() for n in plan.tensors)},
        },
        "replace_pairs": pairs, "inexact": inexact,
    }
    if any(l.reason != HEAD_REASON for l in plan.whole):  # what the smaller, base-writing route would weigh
        alt = plan_routes(graft, hf, "tensors", spec.tuner)
        summary["alternative"] = {"non_linear": "tensors", "tensors": len(alt.tensors), "data_bytes": (
            sparse_bytes(alt) + sum(params[n].numel() * params[n].element_size() for n in alt.tensors)
            + sum(t.numel() * t.element_size() for l in plan.whole if l.reason == HEAD_REASON
                  for t in l.module.state_dict().values()))}
    loads_from = _loadable_base(graft, scorer)
    if loads_from and loads_from != summary["base_model"]:
        summary["loads_from"] = loads_from
    if own_head:  # a classifier: the labels its head was trained for, which the base's config does not know
        id2label = {int(k): str(v) for k, v in (getattr(hf.config, "id2label", None) or {}).items()}
        summary["labels"] = {"num_labels": len(id2label), "id2label": id2label}
    from safetensors.torch import save_file  # noqa: PLC0415

    common = {"target_modules": sorted(targets), "modules_to_save": sorted(l.path for l in plan.whole) or None,
              "base_model_name_or_path": summary["base_model"], "inference_mode": True,
              "task_type": {"causal": "CAUSAL_LM", "generative": "CAUSAL_LM", "classifier": "SEQ_CLS"}.get(
                  graft.metadata.mode or getattr(scorer, "mode", ""))}
    if plan.peft_type == SUPERTUNING:
        from peft import SupertuningConfig  # noqa: PLC0415

        config = SupertuningConfig(sparsity=plan.sparsity, **common)
    else:
        from peft import ShiraConfig  # noqa: PLC0415

        config = ShiraConfig(r=plan.r, fan_in_fan_out=False, **common)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        summary["routes"]["head"] = None if own_head else _head_file(graft, scorer, tmp, spec.head, "PEFT adapter")
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS),
                  metadata=_header(graft, {"shira_entries": entries, "mode": graft.metadata.mode or
                                           getattr(scorer, "mode", None)}))
        config.save_pretrained(str(tmp), auto_mapping_dict={"base_model_class": type(hf).__name__,
                                                            "parent_library": type(hf).__module__})
        summary["bytes"] = (tmp / ADAPTER_WEIGHTS).stat().st_size
        if "alternative" in summary:  # its header would hold about this file's (the same graft config)
            with open(tmp / ADAPTER_WEIGHTS, "rb") as f:
                header = 8 + int.from_bytes(f.read(8), "little")
            summary["alternative"]["bytes_about"] = summary["alternative"]["data_bytes"] + header
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        (tmp / "README.md").write_text(peft_readme(summary, type(hf).__name__))
    return summary


def _available(tuner: str) -> str:
    """``tuner`` as this peft allows: Supertuning only where the installed peft has it (``auto`` then means SHiRA);
    ``supertuning`` asked of a peft without it is one line naming the installed version."""
    try:
        from peft import SupertuningConfig  # noqa: F401, PLC0415
    except ImportError:
        import peft  # noqa: PLC0415

        if tuner == "supertuning":
            raise SkillgraftError(f"--tuner supertuning needs a peft with Supertuning (requirements.lock pins "
                                  f"peft 0.21.2; installed: {peft.__version__}); use --tuner shira") from None
        return "shira"
    return tuner


def _own_head(graft: Graft, hf: nn.Module) -> list[str]:
    """Module paths holding a classifier graft's carried head (``model.classifier.*`` …), which a PEFT adapter
    stores whole in ``modules_to_save`` (as peft does for a sequence classifier's head); [] for a head-mode
    graft, whose head (``head.*``) is not part of the base model."""
    paths = []
    for name in graft.carried:
        if not name.startswith(SCORER_PREFIX):
            return []
        path = _hf_name(name).rpartition(".")[0]
        top = path.split(".")[0]
        if top != body_prefix(hf):  # the head proper: its whole top-level module (prefix: the family table)
            path = top
        try:
            hf.get_submodule(path)
        except AttributeError:
            return []
        paths.append(path)
    return sorted(set(paths))


def _base_name(graft: Graft, scorer) -> str:
    """The base as the user named it (``--pretrained``, a run's ``--model``; the bundled MiniLM as its hub id): what
    peft records, as ``PeftModel.save_pretrained`` records the name a model was loaded by — never a store folder."""
    name = graft.base_model or getattr(scorer, "base_model", "") or ""
    return _HUB_IDS.get(name, name)


def _loadable_base(graft: Graft, scorer) -> str:
    """Where plain transformers loads that base from when its name is no Hugging Face model: the folder a GGUF file
    (or ``gemma-3-270m``) was dequantized into (its weights are the base; a hub copy of the unquantized model is
    another base); '' otherwise."""
    from skillgraft.models.loading import converted_base  # noqa: PLC0415

    return converted_base(graft.base_model or getattr(scorer, "base_model", "") or "")


def _index_dtype(rows: int, cols: int):
    """SHiRA's (row, column) indices as int16 when the weight allows: peft reads them with ``.to(torch.int)`` on
    load (``ShiraModel._remap_adapter_state_dict_for_load``), so 8 bytes an entry instead of 12."""
    return torch.int16 if max(rows, cols) <= torch.iinfo(torch.int16).max else torch.int32


def _graft_bytes(graft: Graft) -> int:
    """The bytes of the graft's own file (8 per coordinate: an int32 position and an fp32 value) and its carried
    tensors: the size a PEFT adapter is compared with."""
    return 8 * graft.size + sum(t.numel() * t.element_size() for t in graft.carried.values())


class Peft(Exporter):
    """A PEFT SHiRA or Supertuning adapter folder for the plain Hugging Face base model (see the module doc)."""

    summary = "a sparse PEFT adapter folder, SHiRA or Supertuning (PeftModel.from_pretrained, mergekit)"
    container = "PEFT adapter"

    def export(self, graft: Graft, base, out, spec: ExportSpec) -> dict:
        return export_peft(graft, base, out, non_linear=spec.non_linear, head=spec.head, tuner=spec.tuner,
                           overwrite=spec.overwrite, force=spec.force)

    def lines(self, summary: dict) -> list[tuple[str, str]]:
        """The routes: SHiRA entries, modules stored whole, tensors stored whole; then the head and inexact lines."""
        out = []
        routes = summary.get("routes", {})
        if "bytes" in summary and "graft_bytes" in summary:
            out.append(("info", f"adapter {human_size(summary['bytes'])} for a graft of "
                                f"{human_size(summary['graft_bytes'])}"))
        restores = summary.get("restores_base") or {}
        sh, ms, ts = routes["shira"], routes["modules_to_save"], routes["tensors"]
        kept = [m for m, why in ms["modules"].items() if why != HEAD_REASON]
        if restores.get("disable_adapter"):
            out.append(("info", "disable_adapter() computes the base model exactly" + (
                "; so does unload()" if restores.get("unload") else
                f"; unload() keeps {len(kept)} module(s) grafted ({', '.join(kept[:3])}"
                f"{', …' if len(kept) > 3 else ''}: peft keeps modules_to_save on unload; "
                "model.delete_adapter('default') first, then unload() gives the base exactly)")))
        tuner, size = sparse_tuner(sh)
        out.append(("info", f"{tuner}: {sh['coordinates']:,} coordinates in {sh['modules']} Linear weight(s) "
                            f"(+{sh['padding_entries']:,} zero entries, {size})"
                    + (f", zero placeholder target {sh['placeholder']}" if sh["placeholder"] else "")))
        if ms["modules"]:
            out.append(("info", f"modules_to_save: {ms['coordinates']:,} coordinates in {len(ms['modules'])} "
                                f"module(s) stored whole ({ms['stored_parameters']:,} parameters: peft 0.21 loads "
                                "a modules_to_save module only with every tensor of it)"))
            alt = summary.get("alternative")
            if alt and "bytes_about" in alt and alt["bytes_about"] < summary.get("bytes", 0):
                out.append(("hint", f"--non-linear tensors stores only the grafted tensors (biases and norms, not "
                                    f"whole modules): about {human_size(alt['bytes_about'])}, its {alt['tensors']} "
                                    "tensor(s) written into the base on load (disable_adapter() and unload() then "
                                    "keep them); --to delta stores only the coordinates"))
            elif ms["coordinates"] and ms["stored_parameters"] > 20 * max(1, summary["coordinates"]):
                out.append(("hint", "--non-linear tensors stores only the grafted tensors (biases and norms, not whole "
                                    "modules); --to delta stores only the coordinates"))
        if ts["tensors"]:
            out.append(("warning", f"tensors: {ts['coordinates']:,} coordinates in {len(ts['tensors'])} tensor(s) "
                                   f"written into the base model on load ({ts['stored_parameters']:,} parameters): "
                                   "disable_adapter() and unload() do not undo them; the default --non-linear "
                                   "modules_to_save does"))
        if sh["padding_entries"] > max(sh["coordinates"], 1):
            floor = "r·(m+n)" if tuner == "SHiRA" else "m·n·(1 − sparsity)"
            out.append(("hint", f"most {tuner} entries are zero padding ({tuner} holds {floor} entries per Linear, "
                                f"{sh['padding_entries']:,} here): --to delta stores only the coordinates"))
        labels = summary.get("labels")
        if labels:
            out.append(("info", f"labels: num_labels={labels['num_labels']}, id2label={labels['id2label']} "
                                "(pass them to from_pretrained: README.md)"))
        return out + super().lines(summary)
