"""fp32 vs bf16-mixed: one fine-tuning step's forward + backward of Gemma-3-270M on this machine (issue 75, item 6).

Usage: .venv/bin/python bench/precision.py [--model gemma-3-270m] [--reps 5] [--batch 8] [--threads 1]

The real google/gemma-3-270m after ``make gemma`` (else ``--model`` a folder of the same shape), causal label-word
scoring of SST-2 rows (/work/shared/data, else a toy set), batch 8: the scorer's forward (LM head at the scored
positions only), the cross-entropy and its backward through every weight, the two precisions timed in turn
(interleaved, so a load change on a shared machine hits both), ``--reps`` each after one warm-up; prints the
medians and minima, the ratios, what ``--precision auto`` resolves to here and the CPU's bf16 flags. bf16-mixed is
timed twice: as skillgraft runs it (the frozen tied head's bf16 cast kept between steps, models/logits.py) and with
the head cast on every forward, as autocast alone does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

import torch  # noqa: E402

SHARED = Path("/work/shared/data")


def rows(n: int):
    from skillgraft.data import load_kshot

    if (SHARED / "SST-2").is_dir():
        return load_kshot("SST-2", 16, 13, SHARED).train[:n]
    import tempfile

    from tiny import write_sentiment_data

    return load_kshot("SST-2", 16, 13, write_sentiment_data(Path(tempfile.mkdtemp()))).train[:n]


def step(scorer, batch) -> tuple[float, float]:
    """(wall, CPU) seconds of one forward + backward: on a machine shared with other jobs the process's CPU time is
    the steadier measure of its work."""
    t0, c0 = time.perf_counter(), time.process_time()
    loss = scorer.loss(batch)
    loss.backward()
    scorer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from skillgraft.models import build_scorer
    from skillgraft.models.placement import Placement, _cpu_flags, using

    scorer = build_scorer(args.model, "SST-2", "causal")
    scorer.train()
    for name, p in scorer.named_parameters():  # as fine-tuning's default (freeze_embeddings): the tied 262k × 640
        p.requires_grad_("embed" not in name)  # embedding gets no gradient
    batch = scorer.collate(rows(args.batch))
    width = batch["input_ids"].shape
    from skillgraft.models import logits

    kept = logits._uses_cached_bf16
    variants = ("fp32", "bf16-mixed", "bf16-mixed, head cast every step")
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(args.reps + 1):
        for precision in times:
            scorer.precision = precision.partition(",")[0]
            logits._uses_cached_bf16 = (lambda head: False) if "every" in precision else kept
            wall, used = step(scorer, batch)
            if rep:
                times[precision].append(wall)
                cpu[precision].append(used)
    flags = sorted(_cpu_flags() & {"avx512_bf16", "amx_bf16", "amx_tile", "avx512f"})
    with using(Placement(device="cpu", precision="auto")) as runtime:
        chosen = runtime.describe()
    print(f"model {args.model}: {sum(p.numel() for p in scorer.parameters()) / 1e6:.0f}M parameters, batch "
          f"{tuple(width)}, {args.threads} thread(s); CPU flags {flags}; --precision auto here: {chosen}")
    logits._uses_cached_bf16 = kept
    for k, v in times.items():
        print(f"{k:32s} forward+backward wall median {statistics.median(v):7.3f} s, CPU median "
              f"{statistics.median(cpu[k]):7.3f} s, CPU min {min(cpu[k]):7.3f} s  "
              f"(each wall/CPU: {' '.join(f'{x:.2f}/{y:.2f}' for x, y in zip(v, cpu[k]))})")
    for k in variants[1:]:
        for what, d in (("wall, median", times), ("CPU, median", cpu)):
            print(f"{k} vs fp32 ({what}): {statistics.median(d['fp32']) / statistics.median(d[k]):.2f}× faster")
        print(f"{k} vs fp32 (CPU, min): {min(cpu['fp32']) / min(cpu[k]):.2f}× faster")


if __name__ == "__main__":
    main()
