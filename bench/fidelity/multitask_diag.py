"""Why the K = 1024 multi-task regions overlap (issue 23, item 5): a diagnostic over the stored regions.

Reads, from the store, the task regions of `bench/fidelity/multitask.yaml` (γ_base = 0) and the multi-task body,
and prints for each task region:
  * its size, and the overlap a random region of the same size would have (|γ_i| / N): the chance level;
  * the share of its coordinates among the top-|γ_i| coordinates of |Δ| = |θ_MT − θ_pre| (is the learned
    region just the largest movements?);
  * where it lies: LayerNorm, biases, attention, FFN (paper Figs. 9–10);
and for each pair, the overlap, its ratio to chance, and how much of the intersection is top-|Δ|.

    SKILLGRAFT_CACHE=/work/store python bench/fidelity/multitask_diag.py [--out bench/results/multitask_diag.json]

Seconds on a CPU; nothing is trained. Run it after `skillgraft run bench/fidelity/multitask.yaml`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from skillgraft.graft.region import Region
from skillgraft.models.loading import bundled_minilm_path
from skillgraft.spec import read_yaml

RECIPE = read_yaml(Path(__file__).with_name("multitask.yaml"))  # the one source of the tasks and the localizer
TASKS = list(RECIPE["tasks"])
OPTIONS = {"sparsity": 0.0, **{k: RECIPE["localize"][k] for k in ("steps", "batch_size")}}  # γ_base = 0 (Fig. 8)


def find_regions(store: Path) -> dict[str, Region]:
    """The γ_base = 0 region of each task whose stored key matches the recipe's localizer options."""
    found = {}
    for entry in sorted(store.glob(f"regions-*-{RECIPE['k']}-{RECIPE['seed']}-learned-*")):
        key = json.loads((entry / "key.json").read_text())
        task, opts = key["setup"]["data"]["task"], key["options"]
        if task in TASKS and all(opts.get(k) == v for k, v in OPTIONS.items()):
            found[task] = Region.load(entry / "round")
    missing = [t for t in TASKS if t not in found]
    if missing:
        raise SystemExit(f"no stored region for {missing} in {store}: run bench/fidelity/multitask.yaml first")
    return found


def movement(store: Path) -> dict[str, torch.Tensor]:
    """|θ_MT − θ_pre| per region tensor name (``model.`` + the body's names)."""
    (mt,) = sorted(store.glob(f"multitask-{'_'.join(TASKS)}-{RECIPE['k']}-{RECIPE['seed']}-*"))
    ft = load_file(mt / "model" / "body" / "model.safetensors")
    pre = load_file(bundled_minilm_path() / "model.safetensors")
    return {f"model.{n}": (ft[n].float() - pre[n].float()).abs() for n in ft if n in pre}


def top_delta(delta: dict[str, torch.Tensor], names: list[str], size: int) -> Region:
    """The ``size`` coordinates of largest |Δ| over the region universe ``names``."""
    flat = torch.cat([delta[n].reshape(-1) for n in names])
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[torch.topk(flat, size).indices] = True
    masks, start = {}, 0
    for n in names:
        m = delta[n].numel()
        masks[n] = keep[start:start + m].reshape(delta[n].shape)
        start += m
    return Region.from_masks(masks, {n: tuple(delta[n].shape) for n in names})


def shares(region: Region) -> dict[str, float]:
    """Share of the region per coarse module type (attn / ffn / layernorm / bias), from Region.module_type_counts."""
    counts: dict[str, int] = {}
    for kind, n in region.module_type_counts().items():
        counts[kind.split(".")[0]] = counts.get(kind.split(".")[0], 0) + n
    total = max(1, len(region))
    return {k: round(v / total, 3) for k, v in sorted(counts.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/multitask_diag.json")
    args = ap.parse_args()
    store = Path(os.environ.get("SKILLGRAFT_CACHE", "runs/cache"))
    regions = find_regions(store)
    delta = movement(store)
    names = list(next(iter(regions.values())).shapes)
    universe = sum(delta[n].numel() for n in names)
    out: dict = {"universe": universe, "tasks": {}, "pairs": {}}
    tops = {t: top_delta(delta, names, len(r)) for t, r in regions.items()}
    for t, r in regions.items():
        out["tasks"][t] = {"size": len(r), "chance_overlap": len(r) / universe,
                           "share_in_top_delta": round(len(r.intersection(tops[t])) / max(1, len(r)), 3),
                           "where": shares(r)}
        print(f"{t:8s} size {len(r):6d}  in top-|Δ| of its size {out['tasks'][t]['share_in_top_delta']:.3f}  "
              f"where {out['tasks'][t]['where']}")
    for i in TASKS:
        for j in TASKS:
            if i >= j:
                continue
            inter = regions[i].intersection(regions[j])
            chance = len(regions[i]) * len(regions[j]) / universe
            union_top = tops[i].union(tops[j])
            row = {"intersection": len(inter), "chance_intersection": round(chance, 2),
                   "ratio_to_chance": round(len(inter) / max(chance, 1e-9), 1),
                   "iou": round(regions[i].iou(regions[j]), 3),
                   "intersection_in_top_delta": round(len(inter.intersection(union_top)) / max(1, len(inter)), 3),
                   "intersection_where": shares(inter)}
            out["pairs"][f"{i}|{j}"] = row
            print(f"{i:8s} ∩ {j:8s} {len(inter):6d} (chance {chance:7.2f}, ×{row['ratio_to_chance']})  "
                  f"IoU {row['iou']:.3f}  in top-|Δ| {row['intersection_in_top_delta']:.3f}  "
                  f"where {row['intersection_where']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
