"""Diagonal Fisher over N examples on MiniLM: vectorised (torch.func vmap(grad)) vs the per-example loop.

Usage: .venv/bin/python bench/fisher_speed.py [--n 256] [--params blocks|all] [--chunk-size 16] [--threads T]

Both paths compute the empirical Fisher of log p(y|x) of the bundled all-MiniLM-L6-v2 (head mode, mean
pooling) over the first N SST-2 training sentences, in eval mode, with the attention mask; ``--params
blocks`` restricts it to the 6 transformer blocks (what the FIM layer score needs), ``all`` takes every
tensor of the model (embeddings included). Prints both times, the ratio and the largest difference
(relative to the largest Fisher entry), and writes bench/results/fisher_speed.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--params", choices=["blocks", "all"], default="blocks")
    ap.add_argument("--chunk-size", type=int, default=None, help="default: FisherConfig's (4 on CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--task", default="SST-2")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from skillgraft.data import load_split
    from skillgraft.fisher import block_names, fisher_diagonal
    from skillgraft.models import build_scorer

    scorer = build_scorer(None, args.task, "head")
    examples = load_split(args.task, "train")[: args.n]
    names = None if args.params == "all" else [n for v in block_names(scorer).values() for n in v]
    n_params = sum(p.numel() for n, p in scorer.named_parameters() if names is None and n.startswith("model.")
                   or names is not None and n in names)
    fisher_diagonal(scorer, examples[:4], names=names, chunk_size=4)  # warm-up (allocator, kernels)

    t0 = time.perf_counter()
    fast = fisher_diagonal(scorer, examples, names=names, chunk_size=args.chunk_size)
    t_vmap = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = fisher_diagonal(scorer, examples, names=names, method="loop")
    t_loop = time.perf_counter() - t0
    scale = max(float(t.abs().max()) for t in ref.values())
    diff = max(float((fast[n] - ref[n]).abs().max()) for n in ref) / scale
    out = {"n": len(examples), "params": args.params, "fisher_parameters": n_params, "chunk_size": args.chunk_size,
           "threads": torch.get_num_threads(), "vmap_seconds": round(t_vmap, 2), "loop_seconds": round(t_loop, 2),
           "speedup": round(t_loop / t_vmap, 2), "max_abs_diff_relative": diff,
           "vmap_examples_per_second": round(len(examples) / t_vmap, 2),
           "loop_examples_per_second": round(len(examples) / t_loop, 2)}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "fisher_speed.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
