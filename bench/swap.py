"""Switching skills on one loaded model: a graft (apply + revert, A→B) vs a PEFT LoRA swap vs reloading.

Usage: .venv/bin/python bench/swap.py [--threads 1,2] [--density 1e-3] [--models minilm,llama] [--reps 50]

Two base models, each timed in the same run and at each thread count:
* ``minilm``: the bundled all-MiniLM-L6-v2 head-mode scorer (``build_scorer(None, "SST-2", "head")``);
* ``gemma``: the real google/gemma-3-270m (fp32, 268M parameters, tied 262k vocabulary; ``make gemma``);
* ``llama``: a random bf16 Llama built in-process from a config (hidden 768, 12 layers, intermediate 3072,
  vocab 32000, untied LM head; its size is printed).
The skills are grafts of ``density`` × the body (top-|Δ| coordinates of a randomly perturbed copy, no
training; the MiniLM graft also carries its 770-parameter head). Timed, median of ``--reps``:
* graft ``apply + revert`` (the graft in memory) and a switch ``A → B`` (revert A, apply B);
* graft ``load + apply + revert`` (``Graft.from_pretrained`` from disk each time);
* PEFT: ``load_adapter`` + ``set_adapter`` + ``delete_adapter`` of a LoRA adapter (q/v projections) with the
  rank that matches the graft's parameter count best, saved to a temp folder — the issue's measure; the
  switch ``A → B`` (load B, activate it, delete A); ``set_adapter`` alone with both adapters resident
  (no disk, but every forward then runs the unmerged LoRA branch); ``merge_adapter`` + ``unmerge_adapter``
  of a resident adapter (the in-memory equivalent of applying a graft: no inference overhead);
* reloading an exported grafted checkpoint (``from_pretrained``; the reps are fewer, ``--reload-reps``).
Each thread count is measured twice: interleaved (methods take turns, so every call starts "cold", as a
switch between inference requests would) and back to back ("warm"). Writes bench/results/swap.json and
prints a table of medians and ratios (PEFT / graft).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402

from skillgraft.graft.graft import Graft  # noqa: E402
from skillgraft.graft.identity import cached_fingerprint  # noqa: E402
from skillgraft.graft.region import Region  # noqa: E402

LLAMA = {"hidden_size": 768, "num_hidden_layers": 12, "intermediate_size": 3072, "vocab_size": 32000,
         "num_attention_heads": 12, "num_key_value_heads": 12, "max_position_embeddings": 512,
         "tie_word_embeddings": False}


def clock(fn) -> float:
    """Milliseconds ``fn`` takes (``fn`` may time itself by returning seconds, to leave out its setup)."""
    t0 = time.perf_counter()
    own = fn()
    return (own if own is not None else time.perf_counter() - t0) * 1e3


def measure(methods: dict, reps: dict, *, interleave: bool, warmup: int = 2, seed: int = 0) -> dict:
    """Median and min ms per method.

    ``interleave``: the methods take turns in a shuffled order each round, so each call starts with caches
    and TLB holding the previous method's data ("cold", as between inference requests) and a burst of load
    on a shared machine hits all methods alike. Otherwise each method runs its reps back to back ("warm").
    """
    import random

    rng = random.Random(seed)
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(warmup):
        for fn in methods.values():
            fn()
    if interleave:
        for i in range(max(reps.values())):
            order = [k for k in methods if i < reps[k]]
            rng.shuffle(order)
            for k in order:
                times[k].append(clock(methods[k]))
    else:
        for k, fn in methods.items():
            times[k] = [clock(fn) for _ in range(reps[k])]
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "reps": len(v)} for k, v in times.items()}


def perturbed(model, seed: int, scale: float):
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_((torch.randn(p.shape, generator=g) * scale).to(p.dtype))
    return out


def top_delta_region(pre, ft, names: list[str], density: float) -> Region:
    """The top-|Δ| coordinates of the ``names`` tensors (exact top-k over their concatenation)."""
    pp, fp = dict(pre.named_parameters()), dict(ft.named_parameters())
    shapes = {n: tuple(pp[n].shape) for n in names}
    delta = torch.cat([(fp[n].detach().float() - pp[n].detach().float()).abs().reshape(-1) for n in names])
    k = round(density * delta.numel())
    flat = torch.topk(delta, k, sorted=False).indices.sort().values
    del delta
    indices, start = {}, 0
    for n in names:
        end = start + pp[n].numel()
        lo, hi = torch.searchsorted(flat, torch.tensor([start, end])).tolist()
        if hi > lo:
            indices[n] = flat[lo:hi] - start
        start = end
    return Region(shapes, indices)


def build(kind: str, density: float):
    """(pre, [graft A, graft B], hf model for PEFT, LoRA targets, save/load functions, description)."""
    if kind == "minilm":
        from skillgraft.models import build_scorer
        from skillgraft.models.anatomy import graftable_names
        from skillgraft.models.scorer import Scorer

        pre = build_scorer(None, "SST-2", "head")
        names = graftable_names(pre)
        grafts = []
        for seed in (1, 2):
            ft = build_scorer(None, "SST-2", "head", head_seed=seed)
            ft = perturbed(ft, seed, 1e-3)
            grafts.append(Graft.from_models(pre, ft, top_delta_region(pre, ft, names, density), {"skill": seed}))
            del ft
        total = sum(p.numel() for p in pre.model.parameters())

        def reload(folder):
            return Scorer.from_pretrained(folder)

        return pre, grafts, pre.model, ["query", "value"], reload, \
            f"all-MiniLM-L6-v2 (fp32, {total / 1e6:.1f}M parameters, body {len(names)} tensors)"
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "gemma":  # the real google/gemma-3-270m (fp32, dequantized from its GGUF: `make gemma`)
        from skillgraft.models.loading import model_reference

        pre = AutoModelForCausalLM.from_pretrained(model_reference("gemma-3-270m").path).eval()
        base, what = "gemma-3-270m", "google/gemma-3-270m (fp32"

        def reload(folder):
            return AutoModelForCausalLM.from_pretrained(folder)
    else:
        pre = LlamaForCausalLM(LlamaConfig(**LLAMA)).to(torch.bfloat16).eval()
        base, what = "random-llama", "random Llama (bf16"

        def reload(folder):
            return LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
    names = [n for n, _ in pre.named_parameters() if n.startswith("model.layers.") or n == "model.norm.weight"]
    grafts = []
    for seed in (1, 2):
        ft = perturbed(pre, seed, 1e-2)
        region = top_delta_region(pre, ft, names, density)
        fp = dict(ft.named_parameters())
        values = {n: fp[n].detach().reshape(-1)[i].clone() for n, i in region.indices.items()}
        grafts.append(Graft(region, values, {}, base, cached_fingerprint(pre), {"skill": seed}))
        del ft, fp
        gc.collect()
    total = sum(p.numel() for p in pre.parameters())
    body = sum(pre.get_parameter(n).numel() for n in names)
    return pre, grafts, pre, ["q_proj", "v_proj"], reload, \
        f"{what}, {total / 1e6:.1f}M parameters, body {body / 1e6:.1f}M in {len(names)} tensors)"


def lora_rank(model, targets: list[str], size: int) -> tuple[int, int]:
    """The LoRA rank whose parameter count on ``targets`` is closest to ``size`` (and that count)."""
    per_rank = sum(m.in_features + m.out_features for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in targets)
    r = max(1, round(size / per_rank))
    return r, r * per_rank


def bench_model(kind: str, args, tmp: Path) -> dict:
    from peft import LoraConfig, get_peft_model

    pre, (a, b), hf, targets, reload, desc = build(kind, args.density)
    print(f"\n== {kind}: {desc}; graft {a.size:,} + {b.size:,} parameters (carried {a.carried_size:,})", flush=True)
    a.save_pretrained(tmp / f"{kind}-graft-a")
    r, lora_params = lora_rank(hf, targets, a.size)
    peft_model = get_peft_model(copy.deepcopy(hf), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                                              init_lora_weights=False))
    peft_model.eval()
    for name in ("a", "b"):
        peft_model.save_pretrained(tmp / f"{kind}-lora-{name}", selected_adapters=["default"])
    export = tmp / f"{kind}-export"
    a.export(pre, export, force=True)
    before = {n: p.detach().clone() for n, p in pre.named_parameters()}
    out = {"model": kind, "description": desc, "graft_size": a.size, "graft_b_size": b.size,
           "graft_carried": a.carried_size, "lora_rank": r, "lora_targets": targets, "lora_parameters": lora_params,
           "graft_file_bytes": (tmp / f"{kind}-graft-a" / "graft.safetensors").stat().st_size,
           "lora_file_bytes": (tmp / f"{kind}-lora-a" / "adapter_model.safetensors").stat().st_size,
           "threads": {}}
    counter = iter(range(10**9))
    lora = {"a": str(tmp / f"{kind}-lora-a"), "b": str(tmp / f"{kind}-lora-b")}

    def graft_cycle():
        a.apply(pre)
        a.revert(pre)

    def graft_switch():  # A applied → B applied (setup and clean-up not timed)
        a.apply(pre)
        t0 = time.perf_counter()
        a.revert(pre)
        b.apply(pre)
        dt = time.perf_counter() - t0
        b.revert(pre)
        return dt

    def graft_from_disk():
        g = Graft.from_pretrained(tmp / f"{kind}-graft-a")
        g.apply(pre)
        g.revert(pre)

    def peft_cycle():
        name = f"s{next(counter)}"
        peft_model.load_adapter(lora["a"], adapter_name=name)
        peft_model.set_adapter(name)
        peft_model.set_adapter("default")
        peft_model.delete_adapter(name)

    def peft_switch():  # adapter A active → adapter B loaded and active, A deleted (setup/clean-up not timed)
        first, second = f"s{next(counter)}", f"s{next(counter)}"
        peft_model.load_adapter(lora["a"], adapter_name=first)
        peft_model.set_adapter(first)
        t0 = time.perf_counter()
        peft_model.load_adapter(lora["b"], adapter_name=second)
        peft_model.set_adapter(second)
        peft_model.delete_adapter(first)
        dt = time.perf_counter() - t0
        peft_model.set_adapter("default")
        peft_model.delete_adapter(second)
        return dt

    def peft_resident():  # both resident: only the active flag changes (half of a there-and-back)
        peft_model.load_adapter(lora["a"], adapter_name="resident")
        t0 = time.perf_counter()
        peft_model.set_adapter("resident")
        peft_model.set_adapter("default")
        dt = (time.perf_counter() - t0) / 2
        peft_model.delete_adapter("resident")
        return dt

    def peft_merge():
        peft_model.merge_adapter()
        peft_model.unmerge_adapter()

    def reload_checkpoint():
        m = reload(export)
        del m

    methods = {"graft apply+revert": graft_cycle, "graft switch A→B": graft_switch,
               "graft load+apply+revert": graft_from_disk, "PEFT load+set+delete": peft_cycle,
               "PEFT switch A→B (load B, delete A)": peft_switch, "PEFT set_adapter, both resident": peft_resident,
               "PEFT merge+unmerge, resident": peft_merge, "reload exported checkpoint": reload_checkpoint}
    reps = {k: args.reps for k in methods}
    reps["reload exported checkpoint"] = args.reload_reps
    reps["PEFT merge+unmerge, resident"] = max(args.reload_reps, args.reps // 5)
    for threads in args.threads:
        torch.set_num_threads(threads)
        out["threads"][str(threads)] = {}
        for mode in ("interleaved", "back_to_back"):
            rows = measure(methods, reps, interleave=mode == "interleaved")
            assert all(torch.equal(p, before[n]) for n, p in pre.named_parameters()), "graft revert not bit-exact"
            base = rows["graft apply+revert"]["median_ms"]
            for k, v in rows.items():
                v["vs_graft_apply_revert"] = v["median_ms"] / base
            out["threads"][str(threads)][mode] = rows
            print(f"-- {threads} thread(s), {mode.replace('_', ' ')} (median ms, × graft apply+revert)")
            for k, v in rows.items():
                print(f"   {k:38s} {v['median_ms']:10.3f} ms   ×{v['vs_graft_apply_revert']:8.1f}", flush=True)
    peft_model = pre = None  # the closures above hold the names: dropped by rebinding, not del
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--density", type=float, default=1e-3)
    ap.add_argument("--models", default="minilm,llama")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--reload-reps", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "swap.json"))
    args = ap.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import peft
    import transformers

    results = {"command": " ".join(["bench/swap.py", *sys.argv[1:]]), "torch": torch.__version__,
               "peft": peft.__version__, "transformers": transformers.__version__, "cpus": os.cpu_count(),
               "load_average_before": os.getloadavg(), "density": args.density, "models": []}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            results["models"].append(bench_model(kind, args, Path(tmp)))
    print("\n| model | threads | timing | graft apply+revert | graft A→B | PEFT load+set+delete | PEFT A→B | "
          "PEFT / graft (cycle) | PEFT / graft (A→B) | graft load+apply+revert | reload checkpoint |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in results["models"]:
        for t, modes in m["threads"].items():
            for mode, rows in modes.items():
                g, gs = rows["graft apply+revert"]["median_ms"], rows["graft switch A→B"]["median_ms"]
                p = rows["PEFT load+set+delete"]["median_ms"]
                ps = rows["PEFT switch A→B (load B, delete A)"]["median_ms"]
                gl, rl = rows["graft load+apply+revert"]["median_ms"], rows["reload exported checkpoint"]["median_ms"]
                print(f"| {m['model']} | {t} | {mode.replace('_', ' ')} | {g:.2f} ms | {gs:.2f} ms | {p:.1f} ms | "
                      f"{ps:.1f} ms | {p / g:.1f}× | {ps / gs:.1f}× | {gl:.1f} ms | {rl:.0f} ms |")
    results["load_average_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
