"""Localization step vs plain SGD fine-tuning step on the same batch: time and peak memory ratios.

Usage: .venv/bin/python bench/graft_speed_memory.py [--examples 128] [--steps 5]

Each phase runs in its own subprocess (so peak RSS is per phase): `ft` = plain SGD steps of the
fine-tuning loop (frozen embeddings, the paper's setting); `localize` = steps of the learned localizer
(continuous γ, one forward/backward per step, hand-written ∂L/∂S). Both use the same MiniLM head-mode
scorer, the same 128 SST-2 examples as one batch (micro-batches of 64), and torch's default threads.
Writes bench/results/graft_speed_memory.json and prints the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def phase(name: str, n: int, steps: int) -> dict:
    import torch

    from skillgraft.data import load_kshot
    from skillgraft.graft import LocalizeConfig, localize
    from skillgraft.models import build_scorer
    from skillgraft.train.core import freeze_unused

    torch.manual_seed(0)
    data = load_kshot("SST-2", n // 2, 42)
    batch_examples = data.train[:n]
    base_rss = rss_mb()
    pre = build_scorer(None, "SST-2", "head")
    if name == "ft":
        from skillgraft.models import freeze

        freeze(pre, embeddings=True)
        freeze_unused(pre, batch_examples[:2])
        params = [p for p in pre.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1e-2, weight_decay=1e-4)
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            for start in range(0, n, 64):
                batch = pre.collate(batch_examples[start:start + 64])
                labels = batch.pop("labels")
                loss = torch.nn.functional.cross_entropy(pre(**batch), labels, reduction="sum") / n
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        step = sorted(times)[len(times) // 2]  # median, as localize reports
    else:
        ft = build_scorer(None, "SST-2", "head")
        with torch.no_grad():  # a stand-in fine-tuned model: small random movement of the body
            g = torch.Generator().manual_seed(1)
            for name_, p in ft.model.named_parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=g))
        cfg = LocalizeConfig(sparsity=1e-4, steps=steps + 1, batch_size=n, micro_batch=64, eval_every=10**6)
        res = localize(pre, ft, batch_examples, None, cfg, progress=False)
        step = res.step_seconds  # median over steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"phase": name, "step_seconds": step, "peak_rss_mb": peak, "rss_before_models_mb": base_rss}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--phase")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.examples, args.steps)))
        return
    out = {}
    for name in ("ft", "localize"):
        r = subprocess.run([sys.executable, __file__, "--phase", name, "--examples", str(args.examples), "--steps",
                            str(args.steps)], capture_output=True, text=True, env={**os.environ,
                                                                                    "TOKENIZERS_PARALLELISM": "false"})
        if r.returncode:
            sys.exit(r.stderr[-3000:])
        out[name] = json.loads(r.stdout.strip().splitlines()[-1])
    ft, loc = out["ft"], out["localize"]
    out["time_ratio"] = loc["step_seconds"] / ft["step_seconds"]
    out["peak_rss_ratio"] = loc["peak_rss_mb"] / ft["peak_rss_mb"]
    out["peak_above_imports_ratio"] = ((loc["peak_rss_mb"] - loc["rss_before_models_mb"])
                                       / (ft["peak_rss_mb"] - ft["rss_before_models_mb"]))
    out["settings"] = vars(args)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "graft_speed_memory.json").write_text(json.dumps(out, indent=2))
    print(f"SGD step {ft['step_seconds']:.3f}s, localization step {loc['step_seconds']:.3f}s "
          f"-> time ratio {out['time_ratio']:.3f}")
    print(f"peak RSS {ft['peak_rss_mb']:.0f} MB vs {loc['peak_rss_mb']:.0f} MB -> ratio {out['peak_rss_ratio']:.3f} "
          f"(above-imports ratio {out['peak_above_imports_ratio']:.3f})")


if __name__ == "__main__":
    main()
