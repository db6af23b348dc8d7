"""Diagonal Fisher over N examples on MiniLM: vectorised paths vs the per-example loop.

Usage: .venv/bin/python bench/fisher_speed.py [--n 256] [--params blocks|all] [--methods hooks,vmap]
       [--chunk-size 16] [--threads T] [--device cpu|cuda]

Vectorised paths: ``hooks`` (one batched backward, per-example gradients in closed form from layer hooks) and
``vmap`` (torch.func vmap(grad)); the reference is the per-example loop. ``traces`` times
``fisher_traces`` (each tensor's Fisher mass, what the ``sum`` FIM layer score needs; Linear per-example
gradients never formed) against the same loop, summed per tensor.

Both paths compute the empirical Fisher of log p(y|x) of the bundled all-MiniLM-L6-v2 (head mode, mean
pooling) over the first N SST-2 training sentences, in eval mode, with the attention mask; ``--params
blocks`` restricts it to the 6 transformer blocks (what the FIM layer score needs), ``all`` takes every
tensor of the model (embeddings included). Prints both times, the ratio and the largest difference
(relative to the largest Fisher entry) per path, and writes bench/results/fisher_speed[-TAG].json.
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
    ap.add_argument("--methods", default="hooks,vmap,traces", help="vectorised paths to time against the loop")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tag", default="", help="suffix of the results file (e.g. the device)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from skillgraft.data import load_split
    from skillgraft.fisher import FisherConfig, block_names, fisher_diagonal, fisher_traces
    from skillgraft.models import build_scorer

    scorer = build_scorer(None, args.task, "head").to(args.device)
    examples = load_split(args.task, "train")[: args.n]
    names = None if args.params == "all" else [n for v in block_names(scorer).values() for n in v]
    n_params = sum(p.numel() for n, p in scorer.named_parameters() if names is None and n.startswith("model.")
                   or names is not None and n in names)
    tokens = [int(scorer.collate([e])["attention_mask"].sum()) for e in examples]
    methods = [m for m in args.methods.split(",") if m]

    def run(method: str, chunk: int | None, part):
        if method == "traces":
            return fisher_traces(scorer, part, FisherConfig(chunk_size=chunk), names=names)
        return fisher_diagonal(scorer, part, names=names, method=method, chunk_size=chunk)

    def timed(method: str, chunk: int | None):
        run(method, 4, examples[:4])  # warm-up (allocator, kernels)
        sync()
        t0 = time.perf_counter()
        f = run(method, chunk, examples)
        sync()
        return f, time.perf_counter() - t0

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    # roofline: the matmul FLOPs every exact path must do — forward, input-gradient backward and the
    # per-example weight gradients of the Linear layers, 2·T·in·out each (attention/softmax/norms excluded)
    linear = sum(m.weight.numel() for n, m in scorer.model.named_modules() if isinstance(m, torch.nn.Linear)
                 and (names is None or f"model.{n}.weight" in names))
    flops = 3 * 2 * sum(tokens) * linear
    a = torch.randn(1024, 1024, device=args.device)
    for _ in range(3):
        a @ a
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    sync()
    peak = 10 * 2 * 1024**3 / (time.perf_counter() - t0)

    ref, t_loop = timed("loop", None)
    scale = max(float(t.abs().max()) for t in ref.values())
    out = {"n": len(examples), "params": args.params, "fisher_parameters": n_params, "device": args.device,
           "threads": torch.get_num_threads(), "mean_tokens": round(sum(tokens) / len(tokens), 1),
           "loop_seconds": round(t_loop, 2), "loop_examples_per_second": round(len(examples) / t_loop, 2),
           "matmul_gflop": round(flops / 1e9, 1), "gemm_peak_gflops": round(peak / 1e9, 1),
           "loop_gflops": round(flops / t_loop / 1e9, 1),
           # no exact diagonal can beat the time of its matmuls at the GEMM peak of this machine
           "best_possible_diagonal_speedup": round(t_loop / (flops / peak), 2)}
    for method in methods:
        fast, t = timed(method, args.chunk_size)
        if method == "traces":
            sums = {n: float(t.double().sum()) for n, t in ref.items()}  # relative to the largest tensor mass
            diff = max(abs(fast[n] - sums[n]) for n in ref) / max(sums.values())
        else:
            diff = max(float((fast[n] - ref[n]).abs().max()) for n in ref) / scale
        out[method] = {"chunk_size": args.chunk_size, "seconds": round(t, 2), "speedup": round(t_loop / t, 2),
                       "examples_per_second": round(len(examples) / t, 2), "max_abs_diff_relative": diff}
    (HERE / "results").mkdir(exist_ok=True)
    name = f"fisher_speed{'-' + args.tag if args.tag else ''}.json"
    (HERE / "results" / name).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
