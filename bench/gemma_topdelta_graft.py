"""A top-|Δ| graft on Gemma-3-270M from a stored fine-tune, for the GGUF export bench (issue 80).

    SKILLGRAFT_CACHE=... python bench/gemma_topdelta_graft.py FT_FOLDER OUT --task QNLI --density 1e-3

FT_FOLDER is a saved fine-tuned Scorer (``…/run/model``); the region is the ``density`` share of the body with the
largest |θ_ft − θ_pre| (the movement localizer's scores, one global top-k), written with ``Graft.from_models``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("ft")
    ap.add_argument("out")
    ap.add_argument("--task", default="QNLI")
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--density", type=float, default=1e-3)
    args = ap.parse_args()
    import torch

    from skillgraft.graft import Graft
    from skillgraft.graft.localizers.movement import movement_stream
    from skillgraft.graft.region import Region
    from skillgraft.models import build_scorer

    pre = build_scorer(args.model, args.task, "causal")
    scores = dict(movement_stream(pre, args.ft))
    flat = torch.cat([s.reshape(-1) for s in scores.values()])
    k = max(1, int(round(args.density * flat.numel())))
    cut = torch.topk(flat, k, sorted=False).values.min()
    del flat
    masks = {n: s >= cut for n, s in scores.items()}
    region = Region.from_masks(masks, {n: tuple(s.shape) for n, s in scores.items()})
    graft = Graft.from_models(pre, args.ft, region, {"task": args.task, "mode": "causal", "k": 64, "seed": 13})
    graft.save_pretrained(args.out)
    print(f"{graft.size:,} coordinates in {len(region.indices)} tensors → {args.out}")


if __name__ == "__main__":
    main()
