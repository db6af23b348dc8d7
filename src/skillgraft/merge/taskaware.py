"""Task-aware merges: one model per task, rebuilt from a small per-task artefact on a shared base when the task of a
request is known (the routed regime of :mod:`skillgraft.graft.routed`). Each is a merge method (``--peers``), with
τ_t = θ_ft,t − θ_pre over the body (every tensor but the task's own head, which each task keeps):

* **TALL masks** (Wang et al., 2024, "Localizing Task Information for Improved Model Merging and Compression"):
  τ_MTL = Σ_t τ_t (task arithmetic), m_t = 1[|τ_t| > λ·|τ_MTL − τ_t|], θ_t = θ_pre + m_t ⊙ τ_MTL. Defaults λ = 0.4;
  grid ``--tall-lambdas`` (the paper's 0.2 … 0.6), λ chosen per task on dev rows, as published.
* **T-Switch** style (Qi et al., 2025, "Less is More: Efficient Model Merging with Binary Task Switch"):
  m_t = top-k |τ_t|, θ_t = θ_pre + α_t · m_t ⊙ sign(τ_t), α_t = ‖m_t ⊙ τ_t‖₂ / √k (the L2-matching scale, one per
  task; the official code keeps the top of the positive and the negative entries of each tensor apart, with a
  scale per tensor). Defaults density k/P = 0.4 (its drop ratio 0.6); grid ``--tswitch-densities``, per task on dev.
* **EMR-Merging** (Huang et al., 2024, "EMR-Merging: Tuning-Free High-Performance Model Merging"): elect
  σ = sign(Σ_t τ_t), ε = max_t |τ_t|·1[σ τ_t > 0], τ_uni = σ ⊙ ε; mask M_t = 1[τ_t ⊙ τ_uni > 0]; rescale
  λ_t = Σ|τ_t| / Σ|M_t ⊙ τ_uni|; θ_t = θ_pre + λ_t M_t ⊙ τ_uni. Tuning-free: its defaults are the method.

**At equal bytes.** Each also gets a row sized to the stitch's grafts: the mean bytes per task of ``grafts/`` (int32
position + fp32 value per coordinate, and the head). Bytes per task count what must be stored beyond θ_pre:
mask positions (int32 each, or a bitmap of P/8 bytes when smaller), T-Switch's sign bits and scale, EMR's
rescaler, the shared vector's fp32 values on the union of the masks divided among the N tasks, and the head. The
sparsity knob that meets the bytes: TALL's λ per task set to the k-th largest |τ_t| / |τ_MTL − τ_t| (its top-k
mask); T-Switch's k; EMR on task vectors trimmed to their top-k |τ_t| first (TIES's trim), as EMR has no knob.
One k for every task, the largest whose mean bytes per task stay within the grafts'.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from skillgraft.lazy import np
from skillgraft.lazy import torch
from pydantic import Field, field_validator

from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region
from skillgraft.merge.base import Bench, MergeMethod, MergeRow, Scored, graft_file_bytes
from skillgraft.spec import Spec

PEERS = ("tall", "tswitch", "emr")


class PeerOptions(Spec):
    """Which task-aware merges run (a field of ``skillgraft merge``)."""

    peers: list[Literal[PEERS]] = Field(default_factory=list,
                                        description="task-aware merges to compare, one model per task (tall, tswitch, "
                                                    "emr): defaults, a dev-chosen grid, and at the grafts' bytes per "
                                                    "task (docs/merge.md)")


class TallOptions(PeerOptions):
    tall_lambdas: list[float] = Field(default_factory=lambda: [0.2, 0.3, 0.4, 0.5, 0.6],
                                      description="λ grid of TALL masks m_t = |τ_t| > λ|τ_MTL − τ_t| (chosen per task "
                                                  "on dev rows; default 0.4)")

    @field_validator("tall_lambdas")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if not v or any(x <= 0 for x in v):
            raise ValueError(f"give λ values > 0, got {v}")
        return v


class TSwitchOptions(PeerOptions):
    tswitch_densities: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4],
                                           description="density grid of T-Switch's top-k |τ_t| mask (chosen per task "
                                                       "on dev rows; default 0.4)")

    @field_validator("tswitch_densities")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < x <= 1 for x in v):
            raise ValueError(f"densities are fractions in (0, 1], got {v}")
        return v


class EmrOptions(PeerOptions):
    """EMR-Merging is tuning-free: no options of its own."""


# ---------------------------------------------------------------------------------------------- the equations
def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` largest ``scores`` (ties broken by position, deterministic)."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    k = max(0, min(int(k), scores.numel()))
    if k:
        mask[torch.topk(scores, k, sorted=False).indices] = True
    return mask


def tall_masks(tau: torch.Tensor, lam: float | list[float]) -> torch.Tensor:
    """``[N, P]`` masks m_t = |τ_t| > λ_t |τ_MTL − τ_t|, τ_MTL = Σ_t τ_t (``tau``: ``[N, P]``)."""
    mtl = tau.sum(0)
    lam = torch.as_tensor(lam, dtype=tau.dtype).expand(len(tau))
    masks = torch.empty(tau.shape, dtype=torch.bool)
    for i, t in enumerate(tau):  # a row at a time: transient memory O(P), not O(N·P)
        masks[i] = t.abs() > lam[i] * (mtl - t).abs()
    return masks


def tall_topk(tau: torch.Tensor, k: int) -> torch.Tensor:
    """TALL's masks at size ``k``: λ_t is the k-th largest |τ_t| / |τ_MTL − τ_t| (the top-k of that ratio)."""
    mtl = tau.sum(0)
    masks = torch.empty(tau.shape, dtype=torch.bool)
    for i, t in enumerate(tau):  # a row at a time: transient memory O(P), not O(N·P)
        ratio = t.abs() / (mtl - t).abs().clamp_min(torch.finfo(tau.dtype).tiny)
        ratio[t == 0] = -1.0  # an untouched coordinate is never in a mask
        masks[i] = top_k(ratio, k) & (t != 0)
    return masks


def tswitch(tau_t: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    """(mask = top-k |τ_t|, α = ‖mask ⊙ τ_t‖₂ / √k): θ_t = θ_pre + α · mask ⊙ sign(τ_t)."""
    mask = top_k(tau_t.abs(), k) & (tau_t != 0)
    n = int(mask.sum())
    alpha = float(tau_t[mask].double().norm() / math.sqrt(n)) if n else 0.0
    return mask, alpha


def emr(tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(τ_uni, masks ``[N, P]``, rescalers ``[N]``) of EMR-Merging: elect, mask, rescale (module doc)."""
    sigma = torch.where(tau.sum(0) > 0, 1.0, -1.0).to(tau.dtype)
    agree = tau * sigma > 0
    eps = (tau.abs() * agree).amax(0)
    uni = sigma * eps
    masks = tau * uni > 0
    num = tau.abs().double().sum(1)
    den = (masks * uni.abs()).double().sum(1)
    scales = torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))
    return uni, masks, scales.to(tau.dtype)


def trimmed(tau: torch.Tensor, k: int) -> torch.Tensor:
    """Each task vector kept on its top-k |τ_t| (zero elsewhere)."""
    return torch.stack([t * top_k(t.abs(), k) for t in tau])


def mask_bytes(n: int, p: int) -> int:
    """A mask of ``n`` ones over ``p`` coordinates: int32 positions, or a bitmap when smaller."""
    return min(4 * n, -(-p // 8))


# ---------------------------------------------------------------------------------------------- the methods
class TaskAware(MergeMethod):
    """Shared machinery: θ_ft's body saved while in memory (``on_model``), the task vectors ``[N, P]`` read back,
    each task's model applied as a graft (its positions and values, its own head) and scored on its rows."""

    Options = PeerOptions

    def active(self, options: PeerOptions) -> bool:
        return self.name in options.peers

    def headline(self, rows: list[MergeRow], options: PeerOptions) -> dict:
        return {}  # the peers are headlined together, at the grafts' bytes (merge.json: peers_at_equal_bytes)

    def on_model(self, bench: Bench, name: str, ft, options: Spec, work: Path) -> None:
        from safetensors.torch import save_file  # noqa: PLC0415

        from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

        path = work / "taskaware" / f"ft{bench.names.index(name)}.safetensors"
        if path.is_file():  # another task-aware method saved it
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        carried = set(carried_names(ft))
        save_file({n: p.detach().contiguous() for n, p in ft.named_parameters() if n not in carried}, str(path))

    # --------------------------------------------------------------- per method
    def configs(self, options: Spec) -> list[tuple[str, dict]]:
        """(label, parameters) of the grid; the first is the defaults."""
        return [("defaults", {})]

    def models(self, tau: torch.Tensor, params: dict) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """Per task: (positions, Δ values, bytes beyond θ_pre less the head) of θ_t − θ_pre."""
        raise NotImplementedError

    def sized(self, k: int) -> dict:
        """Parameters of the configuration with ``k`` coordinates per task (the equal-bytes row)."""
        return {"k": k}

    # --------------------------------------------------------------- shared
    def vectors(self, bench: Bench, work: Path) -> tuple[dict[str, tuple[int, ...]], torch.Tensor, torch.Tensor]:
        """(shapes of the body tensors, θ_pre flat ``[P]``, τ ``[N, P]``)."""
        from safetensors import safe_open  # noqa: PLC0415

        files = [safe_open(str(work / "taskaware" / f"ft{i}.safetensors"), "pt") for i in range(len(bench.names))]
        keys = set(files[0].keys())
        base = bench.base
        # a tensor every FT left as θ_pre (a frozen embedding: Gemma's 168M of 268M) has τ = 0 in every task, so no
        # method can select it: left out, it costs neither the [N, P] task vectors' memory nor a bitmap over it
        shapes = {n: tuple(p.shape) for n, p in base.items() if n in keys
                  and any(not torch.equal(f.get_tensor(n).float(), p.detach().float().cpu()) for f in files)}
        # the task vectors live on the CPU ([N, P]; the files are read there), whatever device θ_pre is on
        pre = torch.cat([base[n].detach().reshape(-1).float().cpu() for n in shapes])
        tau = torch.empty(len(files), pre.numel())
        for i, f in enumerate(files):
            start = 0
            for n, shape in shapes.items():
                size = math.prod(shape)
                tau[i, start:start + size] = f.get_tensor(n).reshape(-1).float()
                start += size
            tau[i] -= pre
        return shapes, pre, tau

    def graft(self, bench: Bench, name: str, shapes: dict, pre: torch.Tensor, idx: torch.Tensor,
              delta: torch.Tensor) -> Graft:
        """Task ``name``'s model θ_pre + Δ on ``idx`` (flat, sorted) with its own head, as a graft."""
        own = bench.grafts[name]
        base = bench.base
        indices, values, start = {}, {}, 0
        bounds = torch.searchsorted(idx, torch.tensor(np.cumsum([0, *[math.prod(s) for s in shapes.values()]])))
        for j, (n, shape) in enumerate(shapes.items()):
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            if hi > lo:
                indices[n] = idx[lo:hi] - start
                values[n] = (pre[idx[lo:hi]] + delta[lo:hi]).to(base[n].dtype)
            start += math.prod(shape)
        return Graft(Region(shapes, indices), values, dict(bench.heads[name]), own.base_model, own.base_fingerprint,
                     {"merge_task": name, "merge_method": self.name})

    def rows(self, bench: Bench, options: Spec, ft: Scored, work: Path) -> list[Scored]:
        """Every configuration of the grid on dev; the defaults, the per-task dev choice and the equal-bytes row on
        test (each task's model built when it is scored, so one configuration's models are in memory at a time)."""
        shapes, pre, tau = self.vectors(bench, work)
        names = bench.names
        head = {n: sum(t.numel() * t.element_size() for t in bench.heads[n].values()) for n in names}
        target = float(np.mean([graft_file_bytes(bench.grafts[n]) for n in names]))

        def use_of(params: dict, s: Scored | None = None):
            built = self.models(tau, params)
            if s is not None:
                s.info.update(bytes={n: built[i][2] + head[n] for i, n in enumerate(names)},
                              coordinates={n: int(built[i][0].numel()) for i, n in enumerate(names)})
            made = {n: (built[i][0], built[i][1]) for i, n in enumerate(names)}
            return bench.grafted(lambda n: self.graft(bench, n, shapes, pre, *made[n]))

        grid = []
        for label, params in self.configs(options):
            s = Scored(self.name, label, info={"parameters": params})
            use = use_of(params, s)
            s.dev = bench.score(use, "dev")
            if not grid:  # the defaults
                s.test = bench.score(use, "test")
            grid.append(s)
            del use
        out = list(grid)
        if len(grid) > 1:  # per task, the grid's dev-best configuration
            best = {n: max(grid, key=lambda g: g.dev[n]) for n in names}
            chosen = Scored(self.name, "per task, chosen on dev",
                            info={"chosen_on_dev": True, "parameters": {n: best[n].info["parameters"] for n in names},
                                  "bytes": {n: best[n].info["bytes"][n] for n in names}})
            chosen.dev = {n: best[n].dev[n] for n in names}
            for g in grid:
                mine = [n for n in names if best[n] is g]
                if mine:
                    chosen.test.update(bench.score(use_of(g.info["parameters"]), "test", names=mine))
            chosen.test = {n: chosen.test[n] for n in names}
            out.append(chosen)
        k = self.solve_k(tau, target - float(np.mean(list(head.values()))))
        if k:
            s = Scored(self.name, f"at the grafts' bytes (k={k:,})", info={"parameters": self.sized(k),
                                                                          "equal_bytes": target})
            use = use_of(self.sized(k), s)
            s.dev, s.test = bench.score(use, "dev"), bench.score(use, "test")
            out.append(s)
        return out

    def byte_sizes(self, tau: torch.Tensor, params: dict) -> list[float]:
        """Each task's bytes of :meth:`models` at ``params`` (a method whose sizes need less than its models says
        so: :meth:`solve_k` asks at every step of its bisection)."""
        return [b for _, _, b in self.models(tau, params)]

    def solve_k(self, tau: torch.Tensor, budget: float) -> int:
        """The largest k whose mean bytes per task (less the head) stay within ``budget`` (bisection on a log scale,
        to 1%)."""
        def fits(k: int) -> bool:
            return float(np.mean(self.byte_sizes(tau, self.sized(k)))) <= budget

        lo, hi = 1, int(tau.shape[1])
        if budget <= 0 or not fits(lo):
            return 0
        if fits(hi):
            return hi
        while hi > lo * 1.01 and hi - lo > 1:
            mid = int(math.sqrt(lo * hi))
            mid = min(max(mid, lo + 1), hi - 1)
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo


def _sparse(mask: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.nonzero(mask, as_tuple=False).reshape(-1)
    return idx, values[idx]


class Tall(TaskAware):
    """TALL masks on the task-arithmetic vector (module doc)."""

    summary = "TALL masks: per task, m_t = |τ_t| > λ|τ_MTL − τ_t| on task arithmetic's τ_MTL"
    Options = TallOptions

    def configs(self, options: TallOptions) -> list[tuple[str, dict]]:
        return [("defaults (λ=0.4)", {"lambda": 0.4}),
                *[(f"λ={lam:g}", {"lambda": lam}) for lam in options.tall_lambdas if lam != 0.4]]

    def models(self, tau, params):
        masks = tall_topk(tau, params["k"]) if "k" in params else tall_masks(tau, params["lambda"])
        mtl = tau.sum(0)
        shared = 4 * int(masks.any(0).sum()) / len(tau)
        return [(*_sparse(m, mtl), mask_bytes(int(m.sum()), tau.shape[1]) + shared) for m in masks]


class TSwitch(TaskAware):
    """T-Switch-style binarized task vectors (module doc)."""

    summary = "T-Switch: per task, top-k |τ_t| mask + its signs + one scale"
    Options = TSwitchOptions

    def configs(self, options: TSwitchOptions) -> list[tuple[str, dict]]:
        return [("defaults (density 0.4)", {"density": 0.4}),
                *[(f"density={d:g}", {"density": d}) for d in options.tswitch_densities if d != 0.4]]

    def models(self, tau, params):
        out = []
        for t in tau:
            k = params.get("k") or int(round(params["density"] * t.numel()))
            mask, alpha = tswitch(t, k)
            n = int(mask.sum())
            out.append((*_sparse(mask, alpha * torch.sign(t)), mask_bytes(n, t.numel()) + -(-n // 8) + 4))
        return out

    def byte_sizes(self, tau, params):
        """As :meth:`models` counts them, without a top-k: its mask holds min(k, nonzero |τ_t|) coordinates."""
        out = []
        for t in tau:
            k = max(0, min(int(params.get("k") or int(round(params["density"] * t.numel()))), t.numel()))
            n = min(k, int((t != 0).sum()))
            out.append(mask_bytes(n, t.numel()) + -(-n // 8) + 4)
        return out


class Emr(TaskAware):
    """EMR-Merging: elect, mask, rescale (module doc)."""

    summary = "EMR-Merging: elected τ_uni, per task a sign-agreement mask and a rescaler"
    Options = EmrOptions

    def configs(self, options: EmrOptions) -> list[tuple[str, dict]]:
        return [("defaults (tuning-free)", {})]

    def models(self, tau, params):
        uni, masks, scales = emr(trimmed(tau, params["k"]) if "k" in params else tau)
        shared = 4 * int(masks.any(0).sum()) / len(tau)
        return [(*_sparse(m, float(c) * uni), mask_bytes(int(m.sum()), tau.shape[1]) + 4 + shared)
                for m, c in zip(masks, scales)]
