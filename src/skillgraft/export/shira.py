"""What a sparse PEFT adapter (SHiRA or Supertuning) can hold of a graft, and how: its entries and the plan of routes.

peft 0.21's SHiRA stores, per targeted ``nn.Linear``, exactly r·(m+n) COO entries with one global r; its
Supertuning stores int(m·n·(1 − sparsity)) flat entries with one global sparsity (:mod:`skillgraft.export.peft`).
:func:`shira_entries` turns a region's coordinates into entries whose merge is bit-exact (fl(θ_pre + d) == θ_ft, or
the pair −θ_pre, θ_ft); :func:`plan_routes` decides, per module the graft touches, whether the sparse tuner holds it
or the ``non_linear`` route does (biases, norms, Conv1D, tied weights, a Linear whose region would force costlier
padding), and picks the tuner (the fewer bytes) and its r or sparsity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from skillgraft.lazy import nn, torch

from skillgraft.errors import SkillgraftError
from skillgraft.export.base import _hf_name, exact_delta
from skillgraft.graft.graft import Graft
from skillgraft.models.families import layer_kind


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


def apply_entries(weight: torch.Tensor, flat: torch.Tensor, values: torch.Tensor, peft_type: str = "SHIRA"
                  ) -> torch.Tensor:
    """``weight + sparse(flat, values)`` exactly as peft computes it (a new tensor): SHiRA adds a sparse COO tensor,
    Supertuning scatter-adds the values into the flattened weight."""
    if peft_type == SUPERTUNING:
        out = weight.detach().cpu().reshape(-1).clone()
        return out.scatter_add(0, flat.long(), values.to(out.dtype)).reshape(weight.shape)
    rows, cols = weight.shape
    out = weight.detach().cpu().clone()
    out += torch.sparse_coo_tensor(torch.stack([flat // cols, flat % cols]), values.to(out.dtype), (rows, cols),
                                   check_invariants=False)
    return out


# ---------------------------------------------------------------------------------------------- PEFT plan
SUPERTUNING = "SUPERTUNING"


def supertuning_count(numel: int, sparsity: float) -> int:
    """Entries peft's Supertuning allocates for a weight of ``numel`` values (``SupertuningLayer._num_trainable``)."""
    return int(numel * (1 - sparsity))


def supertuning_sparsity(layers: list[Layer], graft: Graft) -> float:
    """The largest ``sparsity`` (one per adapter) at which every layer gets at least the entries it needs."""
    need = {id(l): max(1, len(l.entries_for(graft)[0]) if "weight" in l.touched else 0) for l in layers}
    s = 1 - max(need[id(l)] / l.module.weight.numel() for l in layers)
    while s > 0 and any(supertuning_count(l.module.weight.numel(), s) < need[id(l)] for l in layers):
        s = math.nextafter(s, 0.0)
    return max(s, 0.0)


@dataclass
class Layer:
    """A touched module of the base model and what the graft changes in it."""

    path: str
    module: nn.Module
    touched: dict[str, str] = field(default_factory=dict)  # param name → scorer tensor name
    reason: str = ""  # why SHiRA cannot hold it ('' when it can)

    entries: tuple[torch.Tensor, torch.Tensor] | None = None  # SHiRA (flat positions, values) of the weight

    def entries_for(self, graft: Graft) -> tuple[torch.Tensor, torch.Tensor]:
        if self.entries is None:
            name = self.touched["weight"]
            self.entries = shira_entries(self.module.weight.detach().cpu(), graft.region.indices[name],
                                         graft.values[name])
        return self.entries

    def shira_need(self, graft: Graft) -> int:
        m, n = self.module.weight.shape
        return max(1, math.ceil(len(self.entries_for(graft)[0]) / (m + n)))

    def fits(self, r: int) -> bool:
        return r * sum(self.module.weight.shape) <= self.module.weight.numel()


@dataclass
class Plan:
    """Where each grafted coordinate goes: SHiRA entries, whole modules, or whole base tensors."""

    shira: list[Layer]
    whole: list[Layer]
    tensors: dict[str, str]  # scorer tensor name → why it is not in SHiRA
    r: int
    peft_type: str = "SHIRA"  # or SUPERTUNING: the sparse tuner holding the Linear weights (the fewer bytes)
    sparsity: float | None = None  # Supertuning's one sparsity


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
        transposed = (layer_kind(module) or ("",))[0] == "conv1d"  # GPT-2's Conv1D (the family table)
        return f"{kind} (peft's SHiRA wraps nn.Linear only)" if transposed else kind
    if touched != {"weight"}:
        return "Linear bias"
    return ""


def _shira_bytes(layers: list[Layer], r: int) -> int:
    """SHiRA's r·(m+n) entries per layer: two int16 (int32 past 32,767) indices and a value each."""
    return sum(r * sum(l.module.weight.shape) * (4 * (1 + (max(l.module.weight.shape) > 32767))
                                                 + l.module.weight.element_size()) for l in layers)


def _supertuning_bytes(layers: list[Layer], sparsity: float) -> int:
    """Supertuning's int(m·n·(1 − sparsity)) entries per layer: an int32 flat index and a float32 value each."""
    return sum(8 * supertuning_count(l.module.weight.numel(), sparsity) for l in layers)


def sparse_bytes(plan: Plan) -> int:
    """The bytes of a plan's sparse entries (without the safetensors header)."""
    if plan.peft_type == SUPERTUNING:
        return _supertuning_bytes(plan.shira, plan.sparsity)
    return _shira_bytes(plan.shira, plan.r)


def _choose_r(graft: Graft, candidates: list[Layer], tuner: str = "auto"
              ) -> tuple[list[Layer], list[Layer], int, str, float | None]:
    """The sparse tuner and its one size parameter minimising bytes. SHiRA holds r·(m+n) entries per layer (one
    global r), so a Linear needing a much larger r than the rest is cheaper stored whole, and one that cannot fit
    r·(m+n) ≤ m·n must be; Supertuning holds m·n·(1 − sparsity) entries per layer (one global sparsity), so its
    padding follows each layer's size rather than m+n: far less for a graft spread thinly over many Linears."""
    best = None
    for r in (sorted({l.shira_need(graft) for l in candidates}) or [1]) if tuner != "supertuning" else []:
        shira = [l for l in candidates if l.shira_need(graft) <= r and l.fits(r)]
        rest = [l for l in candidates if l not in shira]
        cost = _shira_bytes(shira, r) + sum(_module_bytes(l.module) for l in rest)
        if best is None or cost < best[0]:
            best = (cost, shira, rest, r, "SHIRA", None)
    ratio = {id(l): len(l.entries_for(graft)[0]) / l.module.weight.numel() for l in candidates}
    for q in sorted(set(ratio.values())) if tuner != "shira" else []:
        held = [l for l in candidates if ratio[id(l)] <= q and l.module.weight.numel() < 2 ** 31]
        if not held:
            continue
        s = supertuning_sparsity(held, graft)
        rest = [l for l in candidates if l not in held]
        cost = _supertuning_bytes(held, s) + sum(_module_bytes(l.module) for l in rest)
        if best is None or cost < best[0]:
            best = (cost, held, rest, 1, SUPERTUNING, s)
    if best is None:  # no candidate: the plan holds no sparse layer (a placeholder target follows)
        return [], [], 1, SUPERTUNING if tuner == "supertuning" else "SHIRA", None
    return best[1:]


def plan_routes(graft: Graft, hf: nn.Module, non_linear: str, tuner: str = "auto") -> Plan:
    """Split the grafted coordinates between SHiRA entries and the ``non_linear`` route."""
    owners = _owners(hf)
    layers: dict[str, Layer] = {}
    for name in graft.region.indices:
        path, _, pname = _hf_name(name).rpartition(".")
        try:
            module = hf.get_submodule(path)
        except AttributeError:
            raise SkillgraftError(f"graft tensor {name!r}: the base model has no module {path!r}") from None
        layers.setdefault(path, Layer(path, module)).touched[pname] = name

    def tied(layer: Layer, pname: str) -> bool:
        return len(owners.get(id(getattr(layer.module, pname)), [])) > 1

    for layer in layers.values():
        layer.reason = _why_not_shira(layer.module, set(layer.touched), any(tied(layer, n) for n in layer.touched))
    if non_linear == "refuse":
        dense = [l for l in layers.values() if l.reason]
        if dense:
            listed = ", ".join(f"{l.path} ({l.reason}: {count_in(graft, l)} coordinates)" for l in dense[:8])
            more = f" and {len(dense) - 8} more" if len(dense) > 8 else ""
            raise SkillgraftError(
                f"{sum(count_in(graft, l) for l in dense)} graft coordinate(s) in {len(dense)} module(s) cannot be "
                f"held by a sparse PEFT adapter (SHiRA and Supertuning hold nn.Linear weights only): {listed}{more}. "
                "Use --non-linear modules_to_save (stores those modules whole) or tensors (stores those tensors "
                "whole), or --to delta / --to hf")
        candidates = list(layers.values())
        r = max((l.shira_need(graft) for l in candidates), default=1)
        if not candidates:
            return Plan([], [], {}, r, SUPERTUNING if tuner == "supertuning" else "SHIRA")
        s = supertuning_sparsity(candidates, graft)
        if tuner == "supertuning" or tuner == "auto" and (not all(l.fits(r) for l in candidates) or _supertuning_bytes(
                candidates, s) < _shira_bytes(candidates, r)):
            return Plan(candidates, [], {}, 1, SUPERTUNING, s)
        if not all(l.fits(r) for l in candidates):
            wide = [l.path for l in candidates if not l.fits(r)]
            raise SkillgraftError(f"SHiRA cannot hold this graft: {', '.join(wide[:8])} would need r={r}, more than "
                                  "r·(m+n) ≤ m·n allows; use --tuner supertuning or auto")
        return Plan(candidates, [], {}, r)
    if non_linear == "tensors":  # a Linear's weight can be SHiRA even when its bias is grafted
        candidates = [l for l in layers.values() if isinstance(l.module, nn.Linear) and "weight" in l.touched
                      and not tied(l, "weight")]
        shira, rest, r, kind, sparsity = _choose_r(graft, candidates, tuner)
        tensors = {}
        for layer in layers.values():
            for pname, name in layer.touched.items():
                if pname == "weight" and layer in shira:
                    continue
                tensors[name] = (TIED if tied(layer, pname) else
                                 f"Linear weight cheaper stored whole than at the global {_size(kind, r, sparsity)}"
                                 if layer in rest and pname == "weight" else
                                 "Linear bias" if isinstance(layer.module, nn.Linear) else layer.reason)
        return Plan(shira, [], tensors, r, kind, sparsity)
    shira, rest, r, kind, sparsity = _choose_r(graft, [l for l in layers.values() if not l.reason], tuner)
    for l in rest:
        l.reason = f"Linear whose region is cheaper stored whole than at the global {_size(kind, r, sparsity)}"
    # a grafted tied parameter: every module sharing it is stored whole too (a copy of one would miss the others)
    for layer in [l for l in layers.values() if l.reason == TIED]:
        for pname in [n for n in layer.touched if tied(layer, n)]:
            for path in owners[id(getattr(layer.module, pname))]:
                if path not in layers:
                    layers[path] = Layer(path, hf.get_submodule(path), {}, f"tied to {layer.path}")
    shira, whole = _absorb(shira, [l for l in layers.values() if l.reason])
    unmergeable = [l for l in whole if not isinstance(getattr(l.module, "weight", None), torch.Tensor)]
    if unmergeable:
        listed = ", ".join(f"{l.path} ({type(l.module).__name__}: {count_in(graft, l)} coordinates)"
                           for l in unmergeable)
        raise SkillgraftError(f"graft coordinates in {listed} would need that module stored whole, and peft's "
                              "merge_and_unload cannot unload a module without a weight; use --non-linear tensors, "
                              "--to delta or --to hf")
    return Plan(shira, whole, {}, r, kind, sparsity)


def _size(kind: str, r: int, sparsity: float | None) -> str:
    return f"sparsity={sparsity}" if kind == SUPERTUNING else f"r={r}"


def _absorb(shira: list[Layer], dense: list[Layer]) -> tuple[list[Layer], list[Layer]]:
    """A module stored whole already holds everything below it: nested layers join their container."""
    outer = {l.path: l for l in dense}

    def container(path: str) -> str | None:
        return min((d for d in outer if path != d and path.startswith(d + ".")), key=len, default=None)

    for layer in shira + dense:
        if (c := container(layer.path)) is not None:
            outer[c].touched.update({f"{layer.path[len(c) + 1:]}.{k}": v for k, v in layer.touched.items()})
    return [l for l in shira if container(l.path) is None], [l for l in dense if container(l.path) is None]


def count_in(graft: Graft, layer: Layer) -> int:
    return sum(len(graft.region.indices[n]) for n in layer.touched.values())


def _module_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def placeholder_layer(hf: nn.Module, taken: set[str]) -> Layer:
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
    return Layer(linears[0][0], linears[0][1], {}, "")


def grafted(param: torch.Tensor, graft: Graft, name: str) -> torch.Tensor:
    """θ_pre of one tensor with the graft written in (a CPU copy)."""
    out = param.detach().cpu().clone()
    if name in graft.region.indices:
        out.view(-1)[graft.region.indices[name]] = graft.values[name].to(out.dtype)
    return out
