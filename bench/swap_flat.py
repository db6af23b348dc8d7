"""A repeated graft swap (apply + revert) on one model: CPU time and aten ops per swap (issue 75 item 7).

Usage: OMP_NUM_THREADS=1 .venv/bin/python bench/swap_flat.py [--models minilm,gemma,gemma-bf16,routed-tiny] [--reps 200]
[--density 1e-4] [--out bench/results/swap_flat.json]

* ``minilm``: the bundled all-MiniLM-L6-v2 head-mode scorer (fp32); the graft is the top-|Δ| ``density`` of its
  body against a perturbed copy and carries the copy's head (2 tensors);
* ``gemma`` / ``gemma-bf16``: a random Gemma-3-270M-shaped ``Gemma3ForCausalLM`` (hidden 640, 18 layers,
  262,144-token tied vocabulary) in fp32 / bf16; the graft is ``density`` of every ``model.layers.*`` tensor and
  the final norm (random coordinates and values), no carried tensor;
* ``routed-tiny``: ``RoutedSkills`` over the tests' tiny BERT and two skills (400 coordinates per body tensor, heads
  of 2 and 4 labels: tests/routing.py); timed: entering and leaving ``use(task)``, the two skills in turn.

Per model: a first apply + revert prepares the swap (not timed); then ``--reps`` swaps, each timed in this thread's
CPU time (``time.thread_time``: the machine is shared) and wall time; the aten ops one apply and one revert
dispatch (a TorchDispatchMode); whether θ_pre came back bit for bit. Writes ``--out`` (JSON) and prints a line
per model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))  # hostreads.Ops: the aten-op counter the swap tests use

import torch  # noqa: E402
from hostreads import Ops  # noqa: E402

from skillgraft.graft.graft import Graft  # noqa: E402
from skillgraft.graft.identity import cached_fingerprint  # noqa: E402
from skillgraft.graft.region import Region  # noqa: E402



def minilm(density: float):
    from skillgraft.models import build_scorer
    from skillgraft.models.anatomy import graftable_names

    pre = build_scorer(None, "SST-2", "head")
    ft = build_scorer(None, "SST-2", "head", head_seed=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ft.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    names = graftable_names(pre)
    pp, fp = dict(pre.named_parameters()), dict(ft.named_parameters())
    delta = torch.cat([(fp[n].detach() - pp[n].detach()).abs().reshape(-1) for n in names])
    top = torch.topk(delta, round(density * delta.numel())).indices.sort().values
    indices, start = {}, 0
    for n in names:
        lo, hi = torch.searchsorted(top, torch.tensor([start, start + pp[n].numel()])).tolist()
        if hi > lo:
            indices[n] = top[lo:hi] - start
        start += pp[n].numel()
    graft = Graft.from_models(pre, ft, Region({n: tuple(pp[n].shape) for n in names}, indices))
    return pre, graft, "all-MiniLM-L6-v2 head-mode scorer (fp32)"


def gemma(density: float, dtype):
    import transformers as tf

    torch.manual_seed(0)
    layers = 18
    cfg = tf.Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        max_position_embeddings=2048, layer_types=["sliding_attention" if (i + 1) % 6 else "full_attention"
                                                   for i in range(layers)], tie_word_embeddings=True)
    pre = tf.Gemma3ForCausalLM(cfg).to(dtype).eval()
    params = dict(pre.named_parameters())
    names = [n for n in params if n.startswith("model.layers.") or n == "model.norm.weight"]
    g = torch.Generator().manual_seed(1)
    indices, values = {}, {}
    for n in names:
        p = params[n].detach().reshape(-1)
        k = max(1, round(density * p.numel()))
        indices[n] = torch.randint(0, p.numel(), (k,), generator=g).unique()
        values[n] = p[indices[n]] + torch.randn(len(indices[n]), generator=g).to(dtype) * 0.01
    region = Region({n: tuple(params[n].shape) for n in names}, indices)
    graft = Graft(region, values, {}, "random-gemma-270m", cached_fingerprint(pre))
    total = sum(p.numel() for p in pre.parameters())
    return pre, graft, f"random Gemma-3-270M shape ({str(dtype)[6:]}, {total / 1e6:.1f}M parameters, tied)"


def routed_tiny(args) -> dict:
    import tempfile

    sys.path.insert(0, str(HERE.parent / "tests"))
    from routing import write_routed_folder
    from tiny import build_tiny

    from skillgraft.graft.routed import RoutedSkills

    with tempfile.TemporaryDirectory() as tmp:
        build_tiny("bert", Path(tmp) / "bert")
        skills = RoutedSkills.from_pretrained(write_routed_folder(Path(tmp) / "bert", Path(tmp) / "routed"))
    before = {k: v.clone() for k, v in skills.model.state_dict().items()}
    for _ in range(3):
        for task in skills.tasks:
            with skills.use(task):
                pass
    ops = {}
    for task in skills.tasks:
        with Ops() as c:
            with skills.use(task):
                pass
        ops[task] = dict(c.ops)
    cpu = []
    for _ in range(args.reps):
        for task in skills.tasks:
            c0 = time.thread_time()
            with skills.use(task):
                pass
            cpu.append(time.thread_time() - c0)
    exact = all(torch.equal(v, skills.model.state_dict()[k]) for k, v in before.items())
    out = {"model": "routed-tiny", "description": "RoutedSkills, tiny BERT, skills sentiment (2 labels) and topic (4)",
           "use_enter_exit_cpu_us_median": round(statistics.median(cpu) * 1e6, 1), "ops_per_use": ops,
           "bit_exact": exact, "reps": args.reps}
    print(f"routed-tiny: use() enter+exit {out['use_enter_exit_cpu_us_median']} µs CPU (median); ops {ops}; "
          f"bit-exact {exact}", flush=True)
    return out


def bench(kind: str, args) -> dict:
    if kind == "routed-tiny":
        return routed_tiny(args)
    pre, graft, desc = minilm(args.density) if kind == "minilm" else \
        gemma(args.density, torch.bfloat16 if kind.endswith("bf16") else torch.float32)
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    t0 = time.perf_counter()
    graft.apply(pre)
    graft.revert(pre)
    first = time.perf_counter() - t0
    for _ in range(3):
        graft.apply(pre)
        graft.revert(pre)
    with Ops() as on:
        graft.apply(pre)
    with Ops() as off:
        graft.revert(pre)
    cpu, wall = [], []
    for _ in range(args.reps):
        c0, w0 = time.thread_time(), time.perf_counter()
        graft.apply(pre)
        graft.revert(pre)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    exact = all(torch.equal(p, before[n]) for n, p in pre.named_parameters())
    out = {"model": kind, "description": desc, "coordinates": graft.size, "tensors": len(graft.region.indices),
           "carried": len(graft.carried), "first_apply_revert_ms": round(first * 1e3, 1),
           "apply_revert_cpu_us_median": round(statistics.median(cpu) * 1e6, 1),
           "apply_revert_cpu_us_min": round(min(cpu) * 1e6, 1),
           "apply_revert_wall_us_median": round(statistics.median(wall) * 1e6, 1),
           "ops_apply": dict(on.ops), "ops_revert": dict(off.ops), "bit_exact": exact, "reps": args.reps}
    print(f"{kind}: {desc}; {graft.size:,} coordinates in {out['tensors']} tensors (+{out['carried']} carried): "
          f"apply+revert {out['apply_revert_cpu_us_median']} µs CPU (median; min {out['apply_revert_cpu_us_min']}), "
          f"{out['apply_revert_wall_us_median']} µs wall; ops apply {sum(on.ops.values())} {dict(on.ops)}, "
          f"revert {sum(off.ops.values())}; bit-exact {exact}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm,gemma,gemma-bf16,routed-tiny")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--density", type=float, default=1e-4)
    ap.add_argument("--out", default=str(HERE / "results" / "swap_flat.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    runs = [bench(kind, args) for kind in args.models.split(",")]
    result = {"command": " ".join(["bench/swap_flat.py", *sys.argv[1:]]), "torch": torch.__version__,
              "load_average_before": os.getloadavg(), "models": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
