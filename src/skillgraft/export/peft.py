"""Grafts in the tools users already have: a PEFT SHiRA adapter, a plain per-tensor delta, an HF checkpoint.

The grafted model is θ = θ_pre + γ ⊙ (θ_ft − θ_pre) (paper Eq. 1). Three ways to write it:

* ``peft``  — a PEFT **SHiRA** adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) for
  the plain Hugging Face base model, so that ``PeftModel.from_pretrained(base, dir)`` computes the grafted
  model and ``merge_and_unload()`` gives its weights. SHiRA stores, per targeted ``nn.Linear``, exactly
  r·(m+n) COO entries (indices ``[2, N]`` int32 of (row, col) in the ``[out, in]`` weight, values ``[N]``)
  with one global r; the saved indices replace the random mask on load. Each Linear weight's region becomes
  its entries, padded with zero-valued entries outside the region. A value is the additive delta d with
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
``head="refuse"`` refuses. :func:`graft_from_peft` reads a SHiRA adapter back as a Graft (a Region to
inspect, compare and compose).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from skillgraft.lazy import nn, torch

from skillgraft.errors import SkillgraftError
from skillgraft.export.adapter_checks import adapter_base, check_shira_indices
from skillgraft.export.base import (_HUB_IDS, ADAPTER_CONFIG, ADAPTER_WEIGHTS, HEAD_FILE, PEFT_PREFIX, SCORER_PREFIX,
                                    SUMMARY_FILE, ExportSpec, Exporter, _as_scorer, _check_base, _head_file, _header,
                                    _hf_name, exact_delta)
from skillgraft.export.card import peft_readme
from skillgraft.finite import refuse_non_finite
from skillgraft.graft.graft import Graft, cached_fingerprint
from skillgraft.graft.graft_file import WEIGHTS_FILE
from skillgraft.graft.region import Region
from skillgraft.io import atomic_dir, check_target, read_json
from skillgraft.models.anatomy import graftable_names


def shira_entries(base: torch.Tensor, idx: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """COO entries (flat positions, values) that turn ``base.view(-1)[idx]`` into ``target`` by addition.

    One entry d per coordinate (:func:`exact_delta`); where no single addition is exact, two entries at the
    same position, −θ_pre then θ_ft: PyTorch adds duplicate COO entries one after the other into the dense
    weight (``W += sparse``, what SHiRA's forward and merge do), so θ_pre − θ_pre + θ_ft is exactly θ_ft. If an
    implementation summed duplicates first instead, the pair would degrade to the single rounded delta.
    """
    a = base.reshape(-1)[idx]
    d, missed = exact_delta(a, target)
    d[missed] = -a[missed]
    return torch.cat([idx, idx[missed]]), torch.cat([d, target.reshape(-1).to(a.dtype)[missed]])


def apply_entries(weight: torch.Tensor, flat: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``weight + sparse(flat, values)`` exactly as SHiRA computes it (a new tensor)."""
    rows, cols = weight.shape
    out = weight.detach().cpu().clone()
    out += torch.sparse_coo_tensor(torch.stack([flat // cols, flat % cols]), values.to(out.dtype), (rows, cols),
                                   check_invariants=False)
    return out


# ---------------------------------------------------------------------------------------------- PEFT plan
@dataclass
class _Layer:
    """A touched module of the base model and what the graft changes in it."""

    path: str
    module: nn.Module
    touched: dict[str, str] = field(default_factory=dict)  # param name → scorer tensor name
    reason: str = ""  # why SHiRA cannot hold it ('' when it can)

    entries: tuple[torch.Tensor, torch.Tensor] | None = None  # SHiRA (flat positions, values) of the weight

    def shira_need(self, graft: Graft) -> int:
        m, n = self.module.weight.shape
        if self.entries is None:
            name = self.touched["weight"]
            self.entries = shira_entries(self.module.weight.detach().cpu(), graft.region.indices[name],
                                         graft.values[name])
        return max(1, math.ceil(len(self.entries[0]) / (m + n)))

    def fits(self, r: int) -> bool:
        return r * sum(self.module.weight.shape) <= self.module.weight.numel()


@dataclass
class _Plan:
    """Where each grafted coordinate goes: SHiRA entries, whole modules, or whole base tensors."""

    shira: list[_Layer]
    whole: list[_Layer]
    tensors: dict[str, str]  # scorer tensor name → why it is not in SHiRA
    r: int


TIED = "parameter shared with another module (tied)"


def _owners(hf: nn.Module) -> dict[int, list[str]]:
    """Parameter id → every module path holding it (more than one: tied weights)."""
    out: dict[int, list[str]] = {}
    for name, p in hf.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(name.rpartition(".")[0])
    return out


def _why_not_shira(module: nn.Module, touched: set[str], tied: bool) -> str:
    if tied:
        return TIED
    if not isinstance(module, nn.Linear):
        kind = type(module).__name__
        return f"{kind} (peft's SHiRA wraps nn.Linear only)" if kind == "Conv1D" else kind
    if touched != {"weight"}:
        return "Linear bias"
    return ""


def _choose_r(graft: Graft, candidates: list[_Layer]) -> tuple[list[_Layer], list[_Layer], int]:
    """The global r minimising bytes: every SHiRA layer holds r·(m+n) entries (two int32 indices + a value
    each), so a Linear needing a much larger r than the rest is cheaper stored whole, and one that cannot fit
    r·(m+n) ≤ m·n must be."""
    best = None
    for r in sorted({l.shira_need(graft) for l in candidates}) or [1]:
        shira = [l for l in candidates if l.shira_need(graft) <= r and l.fits(r)]
        rest = [l for l in candidates if l not in shira]
        cost = sum(r * sum(l.module.weight.shape) * (8 + l.module.weight.element_size()) for l in shira) + \
            sum(_module_bytes(l.module) for l in rest)
        if best is None or cost < best[0]:
            best = (cost, shira, rest, r)
    return best[1], best[2], best[3]


def _plan(graft: Graft, hf: nn.Module, non_linear: str) -> _Plan:
    """Split the grafted coordinates between SHiRA entries and the ``non_linear`` route."""
    owners = _owners(hf)
    layers: dict[str, _Layer] = {}
    for name in graft.region.indices:
        path, _, pname = _hf_name(name).rpartition(".")
        try:
            module = hf.get_submodule(path)
        except AttributeError:
            raise SkillgraftError(f"graft tensor {name!r}: the base model has no module {path!r}") from None
        layers.setdefault(path, _Layer(path, module)).touched[pname] = name

    def tied(layer: _Layer, pname: str) -> bool:
        return len(owners.get(id(getattr(layer.module, pname)), [])) > 1

    for layer in layers.values():
        layer.reason = _why_not_shira(layer.module, set(layer.touched), any(tied(layer, n) for n in layer.touched))
    if non_linear == "refuse":
        candidates = [l for l in layers.values() if not l.reason]
        r = max((l.shira_need(graft) for l in candidates), default=1)
        dense = [l for l in layers.values() if l.reason or not l.fits(r)]
        for l in dense:
            l.reason = l.reason or f"Linear whose region needs r={r}·(m+n) > m·n entries"
        if dense:
            listed = ", ".join(f"{l.path} ({l.reason}: {_count(graft, l)} coordinates)" for l in dense[:8])
            more = f" and {len(dense) - 8} more" if len(dense) > 8 else ""
            raise SkillgraftError(
                f"{sum(_count(graft, l) for l in dense)} graft coordinate(s) in {len(dense)} module(s) cannot be held "
                f"by a SHiRA adapter: {listed}{more}. Use --non-linear modules_to_save (stores those modules whole) or "
                "tensors (stores those tensors whole), or --to delta / --to hf")
        return _Plan(candidates, [], {}, r)
    if non_linear == "tensors":  # a Linear's weight can be SHiRA even when its bias is grafted
        candidates = [l for l in layers.values() if isinstance(l.module, nn.Linear) and "weight" in l.touched
                      and not tied(l, "weight")]
        shira, rest, r = _choose_r(graft, candidates)
        tensors = {}
        for layer in layers.values():
            for pname, name in layer.touched.items():
                if pname == "weight" and layer in shira:
                    continue
                tensors[name] = (TIED if tied(layer, pname) else
                                 f"Linear weight cheaper stored whole than at the global r={r}" if layer in rest
                                 and pname == "weight" else
                                 "Linear bias" if isinstance(layer.module, nn.Linear) else layer.reason)
        return _Plan(shira, [], tensors, r)
    shira, rest, r = _choose_r(graft, [l for l in layers.values() if not l.reason])
    for l in rest:
        l.reason = f"Linear whose region is cheaper stored whole than at the global r={r}"
    # a grafted tied parameter: every module sharing it is stored whole too (a copy of one would miss the others)
    for layer in [l for l in layers.values() if l.reason == TIED]:
        for pname in [n for n in layer.touched if tied(layer, n)]:
            for path in owners[id(getattr(layer.module, pname))]:
                if path not in layers:
                    layers[path] = _Layer(path, hf.get_submodule(path), {}, f"tied to {layer.path}")
    shira, whole = _absorb(shira, [l for l in layers.values() if l.reason])
    unmergeable = [l for l in whole if not isinstance(getattr(l.module, "weight", None), torch.Tensor)]
    if unmergeable:
        listed = ", ".join(f"{l.path} ({type(l.module).__name__}: {_count(graft, l)} coordinates)" for l in unmergeable)
        raise SkillgraftError(f"graft coordinates in {listed} would need that module stored whole, and peft's "
                              "merge_and_unload cannot unload a module without a weight; use --non-linear tensors, "
                              "--to delta or --to hf")
    return _Plan(shira, whole, {}, r)


def _absorb(shira: list[_Layer], dense: list[_Layer]) -> tuple[list[_Layer], list[_Layer]]:
    """A module stored whole already holds everything below it: nested layers join their container."""
    outer = {l.path: l for l in dense}

    def container(path: str) -> str | None:
        return min((d for d in outer if path != d and path.startswith(d + ".")), key=len, default=None)

    for layer in shira + dense:
        if (c := container(layer.path)) is not None:
            outer[c].touched.update({f"{layer.path[len(c) + 1:]}.{k}": v for k, v in layer.touched.items()})
    return [l for l in shira if container(l.path) is None], [l for l in dense if container(l.path) is None]


def _count(graft: Graft, layer: _Layer) -> int:
    return sum(len(graft.region.indices[n]) for n in layer.touched.values())


def _module_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _placeholder(hf: nn.Module, taken: set[str]) -> _Layer:
    """A SHiRA target for an adapter whose coordinates all went another route (peft needs at least one target).

    Its r·(m+n) entries are all zero, so it changes nothing; the smallest untied Linear is preferred.
    """
    owners = _owners(hf)
    linears = [(p, m) for p, m in hf.named_modules() if isinstance(m, nn.Linear) and p not in taken
               and sum(m.weight.shape) <= m.weight.numel() and not any(p.startswith(t + ".") for t in taken)]
    if not linears:
        raise SkillgraftError("a SHiRA adapter needs at least one nn.Linear target, and every nn.Linear of the base "
                              "model has to be stored whole (its bias or a tied weight is grafted); use --non-linear "
                              "tensors, --to delta or --to hf")
    linears.sort(key=lambda pm: (len(owners.get(id(pm[1].weight), [])) > 1, sum(pm[1].weight.shape)))
    return _Layer(linears[0][0], linears[0][1], {}, "")


def _grafted(param: torch.Tensor, graft: Graft, name: str) -> torch.Tensor:
    """θ_pre of one tensor with the graft written in (a CPU copy)."""
    out = param.detach().cpu().clone()
    if name in graft.region.indices:
        out.view(-1)[graft.region.indices[name]] = graft.values[name].to(out.dtype)
    return out



def export_peft(graft: Graft, base, out: str | os.PathLike, *, non_linear: str = "tensors",
                head: str = "separate", overwrite: bool = False, force: bool = False) -> dict:
    """Write ``graft`` as a PEFT SHiRA adapter for ``base`` (a Scorer or its plain HF model); returns the summary.

    ``PeftModel.from_pretrained(base_hf_model, out)`` then computes the grafted model, and
    ``merge_and_unload()`` gives the weights of :meth:`Graft.export` bit for bit (:func:`shira_entries`; the
    summary's ``inexact`` counts coordinates where this machine's PyTorch would not, checked at export).
    """
    check_target(out, overwrite)
    spec = ExportSpec.build({"non_linear": non_linear, "head": head}, where="export_peft")
    scorer = _as_scorer(base)
    params = _check_base(graft, scorer, force)
    hf = scorer.model
    own_head = _own_head(graft, hf)  # a classifier's own head: modules of the base's class, stored whole
    if graft.carried and not own_head and spec.head == "refuse":
        _head_file(graft, scorer, Path(out), "refuse", "PEFT adapter")
    plan = _plan(graft, hf, spec.non_linear)
    taken = {l.path for l in plan.whole}
    plan.whole += [_Layer(path, hf.get_submodule(path), {}, "carried task head (θ_pre lacks it)")
                   for path in own_head if path not in taken]
    placeholder = None
    if not plan.shira:
        placeholder = _placeholder(hf, {l.path for l in plan.whole})
        plan.shira, plan.r = [placeholder], 1
    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, int] = {}
    inexact, pairs, padding = 0, 0, 0
    for layer in plan.shira:
        weight = layer.module.weight
        rows, cols = weight.shape
        name = layer.touched.get("weight")
        if name:
            layer.shira_need(graft)
            flat, vals = layer.entries
            idx = graft.region.indices[name]
            pairs += len(flat) - len(idx)
            got = apply_entries(weight, flat, vals).view(-1)[idx]  # what peft will compute, checked here
            inexact += int((got != graft.values[name].to(got.dtype)).sum())
        else:  # the zero placeholder
            flat, vals = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=weight.dtype)
        n_pad = plan.r * (rows + cols) - flat.numel()
        window = torch.arange(min(rows * cols, flat.numel() + n_pad))
        pad = window[~torch.isin(window, flat)][:n_pad]
        flat = torch.cat([flat, pad])
        tensors[f"{PEFT_PREFIX}{layer.path}.shira_indices"] = torch.stack([flat // cols, flat % cols]).to(torch.int32)
        tensors[f"{PEFT_PREFIX}{layer.path}.shira_weight"] = torch.cat([vals, torch.zeros(n_pad, dtype=vals.dtype)])
        entries[layer.path] = int(flat.numel() - n_pad)
        padding += n_pad
    canonical = {id(p): n for n, p in params.items()}  # a tied weight is named once, by its first owner
    whole_stored = 0
    for layer in plan.whole:
        for key, t in layer.module.state_dict(keep_vars=True).items():
            sname = canonical.get(id(t))
            value = (graft.carried[sname].detach().cpu().clone() if sname in graft.carried else
                     _grafted(t, graft, sname) if sname else t.detach().cpu().clone())
            tensors[f"{PEFT_PREFIX}{layer.path}.{key}"] = value.contiguous()
            whole_stored += value.numel()
    targets = {l.path for l in plan.shira}
    for name in plan.tensors:  # whole base tensors, loaded into the base model (like peft's LoRA bias="all")
        path, _, pname = _hf_name(name).rpartition(".")
        key = f"{path}.base_layer.{pname}" if path in targets else f"{path}.{pname}"
        tensors[PEFT_PREFIX + key] = _grafted(params[name], graft, name).contiguous()
    shira_coords = sum(len(graft.region.indices[l.touched["weight"]]) for l in plan.shira if l.touched)
    summary = {
        "to": "peft", "out": str(out), "format": "PEFT SHiRA adapter", "base_model": _base_name(graft, scorer),
        "coordinates": graft.size,
        "routes": {
            "shira": {"modules": len(plan.shira) - (placeholder is not None), "coordinates": shira_coords,
                      "padding_entries": padding, "entries": sum(entries.values()) + padding, "r": plan.r,
                      "placeholder": placeholder.path if placeholder else None},
            "modules_to_save": {"modules": {l.path: l.reason for l in plan.whole},
                                "coordinates": sum(_count(graft, l) for l in plan.whole),
                                "stored_parameters": whole_stored},
            "tensors": {"tensors": {_hf_name(n): why for n, why in plan.tensors.items()},
                        "coordinates": sum(len(graft.region.indices[n]) for n in plan.tensors),
                        "stored_parameters": sum(params[n].numel() for n in plan.tensors)},
        },
        "replace_pairs": pairs, "inexact": inexact,
    }
    if own_head:  # a classifier: the labels its head was trained for, which the base's config does not know
        id2label = {int(k): str(v) for k, v in (getattr(hf.config, "id2label", None) or {}).items()}
        summary["labels"] = {"num_labels": len(id2label), "id2label": id2label}
    from peft import ShiraConfig  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    config = ShiraConfig(r=plan.r, target_modules=sorted(targets),
                         modules_to_save=sorted(l.path for l in plan.whole) or None, fan_in_fan_out=False,
                         base_model_name_or_path=summary["base_model"], inference_mode=True,
                         task_type={"causal": "CAUSAL_LM", "generative": "CAUSAL_LM", "classifier": "SEQ_CLS"}.get(
                             graft.metadata.mode or getattr(scorer, "mode", "")))
    with atomic_dir(out, overwrite=overwrite) as tmp:
        summary["routes"]["head"] = None if own_head else _head_file(graft, scorer, tmp, spec.head, "PEFT adapter")
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS),
                  metadata=_header(graft, {"shira_entries": entries, "mode": graft.metadata.mode or
                                           getattr(scorer, "mode", None)}))
        config.save_pretrained(str(tmp), auto_mapping_dict={"base_model_class": type(hf).__name__,
                                                            "parent_library": type(hf).__module__})
        summary["bytes"] = (tmp / ADAPTER_WEIGHTS).stat().st_size
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        (tmp / "README.md").write_text(peft_readme(summary, type(hf).__name__))
    return summary


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
        if top != getattr(hf, "base_model_prefix", None):  # the head proper: its whole top-level module
            path = top
        try:
            hf.get_submodule(path)
        except AttributeError:
            return []
        paths.append(path)
    return sorted(set(paths))


def _base_name(graft: Graft, scorer) -> str:
    """The base as plain transformers / peft load it: a hub id, or the folder a GGUF file was converted into (its
    dequantized weights are the base; a hub copy of the unquantized model is another base)."""
    from skillgraft.models.gguf import converted_base  # noqa: PLC0415

    name = graft.base_model or getattr(scorer, "base_model", "") or ""
    return converted_base(name) or _HUB_IDS.get(name, name)


class Peft(Exporter):
    """A PEFT SHiRA adapter folder for the plain Hugging Face base model (see the module doc)."""

    summary = "a PEFT SHiRA adapter folder (PeftModel.from_pretrained, mergekit)"
    container = "PEFT adapter"

    def export(self, graft: Graft, base, out, spec: ExportSpec) -> dict:
        return export_peft(graft, base, out, non_linear=spec.non_linear, head=spec.head, overwrite=spec.overwrite,
                           force=spec.force)

    def lines(self, summary: dict) -> list[tuple[str, str]]:
        """The routes: SHiRA entries, modules stored whole, tensors stored whole; then the head and inexact lines."""
        out = []
        routes = summary.get("routes", {})
        sh, ms, ts = routes["shira"], routes["modules_to_save"], routes["tensors"]
        out.append(("info", f"SHiRA: {sh['coordinates']:,} coordinates in {sh['modules']} Linear weight(s) "
                            f"(+{sh['padding_entries']:,} zero entries, r={sh['r']})"
                    + (f", zero placeholder target {sh['placeholder']}" if sh["placeholder"] else "")))
        if ms["modules"]:
            out.append(("info", f"modules_to_save: {ms['coordinates']:,} coordinates in {len(ms['modules'])} "
                                f"module(s) stored whole ({ms['stored_parameters']:,} parameters)"))
            if ms["coordinates"] and ms["stored_parameters"] > 20 * max(1, summary["coordinates"]):
                out.append(("hint", "--non-linear tensors stores only the grafted tensors (biases and norms, not whole "
                                    "modules); --to delta stores only the coordinates"))
        if ts["tensors"]:
            out.append(("info", f"tensors: {ts['coordinates']:,} coordinates in {len(ts['tensors'])} tensor(s) stored "
                                f"whole ({ts['stored_parameters']:,} parameters; loaded into the base model, not "
                                "undone by disabling the adapter)"))
        if sh["padding_entries"] > max(sh["coordinates"], 1):
            out.append(("hint", f"most SHiRA entries are zero padding (SHiRA holds r·(m+n) entries per Linear, "
                                f"{sh['padding_entries']:,} here): --to delta stores only the coordinates"))
        labels = summary.get("labels")
        if labels:
            out.append(("info", f"labels: num_labels={labels['num_labels']}, id2label={labels['id2label']} "
                                "(pass them to from_pretrained: README.md)"))
        return out + super().lines(summary)


# ---------------------------------------------------------------------------------------------- import
def load_adapter_base(directory: str | os.PathLike, model: str | None = None) -> nn.Module:
    """The HF base model of a PEFT adapter folder (``--model`` or its ``base_model_name_or_path``; a classifier's)."""
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
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return adapter_base(Path(directory), meta, name, mode)


def _read_adapter(directory: Path) -> tuple[dict, dict]:
    """(adapter_config, skillgraft header metadata or {}) of a PEFT adapter folder; SHiRA only."""
    cfg_path = directory / ADAPTER_CONFIG
    if not cfg_path.is_file():
        raise SkillgraftError(f"{directory}: not a PEFT adapter folder (no {ADAPTER_CONFIG})")
    cfg = read_json(cfg_path, required=("peft_type",), what="PEFT adapter config")
    if str(cfg["peft_type"]).upper() != "SHIRA":
        raise SkillgraftError(f"{cfg_path}: a {cfg['peft_type']} adapter; only SHiRA adapters (sparse weights) "
                              "import as a graft region")
    w_path = directory / ADAPTER_WEIGHTS
    if not w_path.is_file():
        other = "adapter_model.bin (pickle, not read)" if (directory / "adapter_model.bin").is_file() else "none"
        raise SkillgraftError(f"{directory}: no {ADAPTER_WEIGHTS} (found: {other})")
    from safetensors import safe_open  # noqa: PLC0415

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
    except json.JSONDecodeError:
        meta = {}
    return cfg, meta


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file of an adapter folder: readable, and every value finite."""
    from safetensors.torch import load_file  # noqa: PLC0415

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
    """Read a PEFT SHiRA adapter as a Graft on ``base`` (a Scorer or its plain HF model; default: the adapter's
    base model, :func:`load_adapter_base`).

    The region is the adapter's support: every stored SHiRA entry (for an adapter written by
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
    indices: dict[str, torch.Tensor] = {}
    values: dict[str, torch.Tensor] = {}
    head, carried = set(getattr(scorer, "carried", ())), {}
    for key, t in tensors.items():
        path = key.removeprefix(PEFT_PREFIX)
        if path.endswith(".shira_weight"):
            path = path[: -len(".shira_weight")]
            try:
                module = scorer.model.get_submodule(path)
            except AttributeError:
                module = None
            if not isinstance(module, nn.Linear):
                raise SkillgraftError(f"{directory}: SHiRA layer {path!r} is not a Linear of the given base model")
            if entries.get(path, -1) == 0:
                continue  # a zero placeholder target (export_peft found no Linear weight to hold)
            name = canonical[id(module.weight)]
            ij = tensors.get(f"{PEFT_PREFIX}{path}.shira_indices")
            if ij is None:
                raise SkillgraftError(f"{directory}: {key} has no matching shira_indices")
            w = params[name]
            check_shira_indices(directory / ADAPTER_WEIGHTS, f"{PEFT_PREFIX}{path}.shira_indices", ij, t, w.shape)
            ij, t = ij.long(), t.reshape(-1)
            if path in entries:  # written by export_peft: grafted entries first, zero padding after
                ij, t = ij[:, : entries[path]], t[: entries[path]]
            flat = ij[0] * w.shape[1] + ij[1]
            indices[name] = torch.unique(flat)
            values[name] = apply_entries(w, flat, t).view(-1)[indices[name]]  # as peft computes it
        elif not path.endswith(".shira_indices"):  # a module or tensor stored whole
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
    metadata = {**meta.get("metadata", {}), "imported_from": str(directory), "peft_type": "SHIRA",
                "r": cfg.get("r")}
    return Graft(Region(shapes, indices), values, carried, meta.get("base_model") or cfg.get("base_model_name_or_path")
                 or "", got, metadata, directory)


def read_graft_or_adapter(directory: str | os.PathLike, model: str | None = None) -> tuple[Graft, Path]:
    """A graft folder, or a PEFT SHiRA adapter folder read on its base model; returns (graft, weights file)."""
    directory = Path(directory)
    if (directory / ADAPTER_CONFIG).is_file():
        return graft_from_peft(directory, load_adapter_base(directory, model)), directory / ADAPTER_WEIGHTS
    return Graft.from_pretrained(directory), directory / WEIGHTS_FILE
