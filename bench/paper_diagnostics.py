"""Where does MiniLM keep a prompt-mode skill? Grafts of structured parts of Δ, on train and dev (issue 14).

Usage: .venv/bin/python bench/paper_diagnostics.py [--tasks SST-2,mr,cr] [--seed 13] [--threads T]

For each task, the paper recipe's fine-tuning (prompt mode, SGD, K = 64; from the store, or fine-tuned once) is
grafted onto θ_pre in structured ways and scored on the 128 training and the 128 dev examples (never on test):

* top-|Δ| regions at 1e-4 … 1 of the body (what the paper's γ_base is drawn from);
* WiSE-FT, θ_pre + α·Δ for α = 0.25, 0.5, 0.75 (every coordinate, a fraction of its movement);
* one transformer block's whole Δ, and every block's but one.

Alongside accuracy it prints the mean margin (logit of the label minus the best other logit) over the examples:
how far a model pushes the examples to the right side, FT's margins large, the pre-trained model's about 0.
Writes bench/results/paper_diagnostics.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
FRACTIONS = [1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0]
ALPHAS = [0.25, 0.5, 0.75]


@torch.no_grad()
def label_logits(scorer, examples, micro_batch: int = 64) -> torch.Tensor:
    """``[examples, labels]``: the scorer's label logits (causal mode: log p of each label word after the prompt; a
    generative scorer: the summed log p of each label completion, ``Scorer.candidate_batch``)."""
    logits = []
    generative = getattr(scorer, "mode", None) == "generative"
    step = max(1, micro_batch // scorer.task.num_labels) if generative else micro_batch
    for start in range(0, len(examples), step):
        chunk = examples[start:start + step]
        batch = scorer.candidate_batch(chunk) if generative else scorer.collate(chunk)
        batch.pop("labels")
        logits.append(scorer(**batch).float())
    return torch.cat(logits)


def margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per example: the label's logit minus the best other label's."""
    gold = logits.gather(1, labels[:, None]).squeeze(1)
    return gold - logits.scatter(1, labels[:, None], float("-inf")).max(1).values


def scores(scorer, examples, micro_batch: int = 64) -> dict:
    """Accuracy and the mean margin (logit of the label minus the best other logit) on ``examples``."""
    logits = label_logits(scorer, examples, micro_batch)
    labels = torch.tensor([e.label for e in examples])
    return {"acc": round(float((logits.argmax(-1) == labels).float().mean()), 4),
            "margin": round(float(margins(logits, labels).mean()), 3)}


def diagnose(task: str, seed: int) -> dict:
    from skillgraft.graft import Graft, get_localizer
    from skillgraft.graft.interpolate import interpolate
    from skillgraft.graft.region import Region
    from skillgraft.models.anatomy import graftable_names
    from skillgraft.pipeline.report import RunDir
    from skillgraft.pipeline.store import Store
    from skillgraft.recipes.paper import PaperSpec

    spec = PaperSpec.build({"recipe": "paper", "tasks": [task], "seeds": [seed], "test_limit": 500},
                           where="bench/paper_diagnostics.py")
    setup = spec.member(RunDir(Path("runs/paper_diagnostics"), Store(None)), task, seed)
    pre, ft, data = setup.pre, setup.ft, setup.data
    splits = {"train": data.train, "dev": data.dev}

    def row(model) -> dict:
        return {name: scores(model, examples) for name, examples in splits.items()}

    out = {"task": task, "seed": seed, "pre": row(pre), "ft": row(ft), "top_movement": {}, "wise": {},
           "block": {}, "all_but_block": {}}
    regions = get_localizer("movement").regions(pre, ft, None, FRACTIONS)
    for budget, region in regions.items():
        with Graft.from_models(pre, ft, region).applied(pre):
            out["top_movement"][budget.label] = row(pre)
    for alpha in ALPHAS:
        with interpolate(pre, ft, alpha):
            out["wise"][str(alpha)] = row(pre)
    names = graftable_names(pre)
    shapes = {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}
    blocks = sorted({n.split("layer.")[1].split(".")[0] for n in names if "layer." in n}, key=int)
    for b in blocks:
        inside = [n for n in names if f"layer.{b}." in n]
        for key, chosen in (("block", inside), ("all_but_block", [n for n in names if n not in inside])):
            region = Region.from_masks({n: torch.ones(shapes[n], dtype=torch.bool) for n in chosen}, shapes)
            with Graft.from_models(pre, ft, region).applied(pre):
                out[key][b] = row(pre)
    # where the top 1e-4 of |Δ| lies: coordinates per tensor kind and block
    where: dict[str, int] = {}
    top = regions[next(iter(regions))]
    for n, idx in top.indices.items():
        kind = n.split("layer.")[1] if "layer." in n else n
        where[kind] = where.get(kind, 0) + len(idx)
    out["top_1e-4_where"] = dict(sorted(where.items(), key=lambda kv: -kv[1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="SST-2,mr,cr")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for task in args.tasks.split(","):
        t0 = time.perf_counter()
        r = diagnose(task, args.seed)
        r["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(r)

        def fmt(x: dict) -> str:
            return f"{x['train']['acc']:.3f} / {x['dev']['acc']:.3f} ({x['dev']['margin']:+.2f})"

        print(f"\n{task} seed {args.seed} — accuracy train / dev (mean margin on dev)")
        print(f"  pre-trained          {fmt(r['pre'])}")
        print(f"  fine-tuned           {fmt(r['ft'])}")
        for k, v in r["top_movement"].items():
            print(f"  top |Δ| {k:<12} {fmt(v)}")
        for k, v in r["wise"].items():
            print(f"  θ_pre + {k}·Δ      {fmt(v)}")
        for k, v in r["block"].items():
            print(f"  block {k} only         {fmt(v)}   all but block {k}: {fmt(r['all_but_block'][k])}")
        print(f"  top 1e-4 |Δ| lies in: {r['top_1e-4_where']}")
    path = HERE / "results" / "paper_diagnostics.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
