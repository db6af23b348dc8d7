"""Localization memory and speed at scale: random bf16 Llamas of ~40M, ~165M and ~500M parameters (CPU), and
the real google/gemma-3-270m (``--sizes gemma --dtype fp32``: θ_pre is its dequantized folder, ``make gemma``).

Usage: .venv/bin/python bench/scale.py [--sizes 40M,165M,500M] [--repeats 3] [--micro-batch 16] [--k 16]
       [--phases forward,candidates,cli,...] [--dtype bf16|fp32]

Per size, a random Llama is built from a config, saved with save_pretrained (θ_pre), and a "fine-tuned"
copy (θ_pre + small heavy-tailed noise on the body, saved as a skillgraft scorer folder) is written beside
it (cached under --work). Each measurement runs in a fresh subprocess (causal scorer, bf16, the toy
sentiment task, k examples per label = one batch of 2k examples in micro-batches, one torch thread):

    forward          no-grad forwards over the batch
    sgd              plain SGD steps on the body tensors (forward/backward timed apart from the update)
    dense            the dense learned localizer, θ_ft in memory (as before issue 12)
    candidates       LocalizeConfig(candidates=1e-2), θ_ft read lazily from the folder
    candidates+ckpt  the same with gradient_checkpointing=True

and the command line on a checkpoint pair (issue 22 item 7; θ_ft saved by plain transformers beside θ_pre):

    cli              `skillgraft graft --pretrained A --finetuned B --candidates c --baselines '' --no-lottery-zero`
                     in process (loading, FT scored then released, θ_pre loaded, localization reading θ_ft
                     from B's files, the graft and θ_pre scored), the same localization settings
    cli+ckpt         the same with --gradient-checkpointing
    cli+lottery      cli+ckpt with the lottery-ticket-zero row (its apply backs up every body tensor)
    cli+baselines    the default report (top-movement, random, bias-only baselines, lottery-ticket-zero),
                     with checkpointing

Localization runs issue 12's setting: the default budget (γ rounded at 0.5), micro_batch 16, ``--repeats``
steps. Memory: the subprocess first runs the same measurement on a tiny Llama (imports, kernels, lazy
initialisations warm), takes its RSS as the baseline, loads the model, resets the high-water mark
(/proc/self/clear_refs) and reports VmHWM − baseline: everything the measurement made resident, weights
included. Times: process CPU time with one thread (the machine is shared; wall time there is noise),
minimum over repeats; the step is compared with a plain forward/backward (gradients on the body tensors)
timed in the same process right after. Writes bench/results/scale.json (``--results``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = {  # vocab 32000 unless smaller; untied embeddings (LlamaConfig's default)
    "tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "vocab_size": 400},
    "40M": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8,
            "vocab_size": 20000},
    "165M": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
             "vocab_size": 32000},
    "500M": {"hidden_size": 1280, "intermediate_size": 3584, "num_hidden_layers": 20, "num_attention_heads": 16,
             "vocab_size": 32000},
}
PHASES = ["forward", "sgd", "dense", "candidates", "candidates+ckpt", "cli", "cli+ckpt"]
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def clock() -> float:
    return time.process_time()


def status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def build(size: str, work: Path, dtype: str = "bf16") -> tuple[Path, Path]:
    """θ_pre (an HF checkpoint + tokenizer) and a fine-tuned scorer folder for ``size`` (cached in ``work``),
    with the fine-tuned model also saved by plain transformers in ``ft-hf`` beside it (the CLI's pair)."""
    folder = work / (size if dtype == "bf16" else f"{size}-{dtype}")
    pre_dir, ft_dir = folder / "pre", folder / "ft"
    if size == "gemma":  # the real google/gemma-3-270m as θ_pre (its dequantized folder in the store)
        from skillgraft.models.loading import model_reference

        pre_dir = Path(model_reference("gemma-3-270m").path)
    if (ft_dir / "scorer_config.json").is_file() and (folder / "ft-hf" / "config.json").is_file():
        return pre_dir, ft_dir
    import torch
    import transformers as tf

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import _bpe_tokenizer  # the tests' tiny BPE tokenizer (its ids fit any vocabulary)

    from skillgraft.models import build_scorer
    from skillgraft.models.anatomy import graftable_names

    torch.manual_seed(0)
    torch_dtype = getattr(torch, DTYPES[dtype])
    if size == "gemma":
        tok = tf.AutoTokenizer.from_pretrained(pre_dir)
    else:
        tok = _bpe_tokenizer({"bos": "<s>", "eos": "</s>", "unk": "<unk>"})
        cfg = tf.LlamaConfig(**SIZES[size], num_key_value_heads=SIZES[size]["num_attention_heads"],
                             max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                             eos_token_id=tok.eos_token_id)
        model = tf.LlamaForCausalLM(cfg).to(torch_dtype)
        model.save_pretrained(pre_dir)
        tok.save_pretrained(pre_dir)
        del model
    ft = build_scorer(str(pre_dir), "SST-2", "causal", dtype=torch_dtype)
    gen = torch.Generator().manual_seed(1)
    params = dict(ft.named_parameters())
    with torch.no_grad():  # a stand-in fine-tuning: heavy-tailed small movement of the body
        for n in graftable_names(ft):
            p = params[n]
            noise = torch.randn(p.shape, generator=gen) * torch.rand(p.shape, generator=gen) ** 4
            p.add_((1e-2 * noise * p.float().abs().mean()).to(p.dtype))
    ft.save_pretrained(ft_dir)
    ft.model.save_pretrained(folder / "ft-hf")
    tok.save_pretrained(folder / "ft-hf")
    return pre_dir, ft_dir


def phase(name: str, size: str, pre_dir: str, ft_dir: str, data_dir: str, args) -> dict:
    """One measurement. The same phase first runs on a tiny model so that every code path, kernel and lazy
    import is warm: the baseline is the RSS after that, and what is measured scales with the model."""
    import gc
    import types

    import torch

    import skillgraft.graft.localizers.machinery.engine as engine
    from skillgraft.data import load_kshot

    torch.set_num_threads(args.threads)
    # Step times in process CPU time: the machine is shared, and with one thread CPU time is what a step
    # costs whatever else runs (wall time under a load of 8 on 2 cores is noise). The localizer's own step
    # timer reads the same clock.
    engine.time = types.SimpleNamespace(perf_counter=clock)

    train = load_kshot("SST-2", args.k, 42, data_dir).train
    tiny_pre, tiny_ft = build("tiny", Path(args.work), args.dtype)
    run = measure_cli if name.startswith("cli") else measure
    run(name, str(tiny_pre), str(tiny_ft), train, args, repeats=1)
    gc.collect()
    torch.manual_seed(0)
    base = status("VmRSS")
    out = run(name, pre_dir, ft_dir, train, args, repeats=args.repeats, base=base)
    out.update(phase=name, size=size, baseline_rss=base)
    return out


def plain_forward_backward(pre, batches, body, n_examples) -> float:
    """Seconds of one forward/backward over the batch with gradients for the body tensors (grads dropped)."""
    import torch

    flags = {n: p.requires_grad for n, p in pre.named_parameters()}
    for n, p in pre.named_parameters():
        p.requires_grad_(n in body)
    t0 = clock()
    for b in batches:
        logits = pre(**{k: v for k, v in b.items() if k != "labels"})
        (torch.nn.functional.cross_entropy(logits.float(), b["labels"], reduction="sum") / n_examples).backward()
    seconds = clock() - t0
    for n, p in pre.named_parameters():
        p.grad = None
        p.requires_grad_(flags[n])
    return seconds


def measure_cli(name: str, pre_dir: str, ft_dir: str, train, args, repeats: int, base: int | None = None) -> dict:
    """`skillgraft graft` on the pair (θ_pre, θ_ft saved by plain transformers), in this process: the peak of
    the whole command (both loads included) above the baseline."""
    import tempfile

    from skillgraft.cli import app

    base = status("VmRSS") if base is None else base
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        cmd = ["graft", "--pretrained", pre_dir, "--finetuned", str(Path(ft_dir).parent / "ft-hf"), "--task",
               "SST-2", "--data-dir", args.data, "--k", str(args.k), "--test-limit", str(args.test_limit),
               "--candidates", str(args.candidates), "--steps", str(repeats), "--micro-batch", str(args.micro_batch),
               "--batch-size", str(2 * args.k), "--select-on", "train", "--eval-every", str(10 ** 6),
               "--out", f"{tmp}/out", "--cache", f"{tmp}/cache"]
        cmd += ["--gradient-checkpointing"] if name != "cli" else []
        cmd += [] if name == "cli+baselines" else ["--baselines", ""]
        cmd += ["--no-lottery-zero"] if name in ("cli", "cli+ckpt") else []
        reset_peak()
        t0 = clock()
        app(cmd, standalone_mode=False)
        out = {"cli_seconds": clock() - t0, "peak_above_baseline": status("VmHWM") - base, "command": cmd[:-4]}
    pre_files = sorted(Path(pre_dir).glob("*.safetensors"))
    out["weights_bytes"] = sum(p.stat().st_size for p in pre_files)
    return out


def measure(name: str, pre_dir: str, ft_dir: str, train, args, repeats: int, base: int | None = None) -> dict:
    import torch

    from skillgraft.graft import LocalizeConfig, localize
    from skillgraft.models import Scorer, build_scorer
    from skillgraft.models.anatomy import graftable_names

    base = status("VmRSS") if base is None else base
    t_load = clock()
    dtype = getattr(torch, DTYPES[args.dtype])
    pre = build_scorer(pre_dir, "SST-2", "causal", dtype=dtype)
    ft = Scorer.from_pretrained(ft_dir, dtype=dtype) if name == "dense" else None
    out: dict = {"load_seconds": clock() - t_load, "load_peak_above_baseline": status("VmHWM") - base,
                 "rss_after_load_above_baseline": status("VmRSS") - base,
                 "params": sum(p.numel() for p in pre.parameters()),
                 "weights_bytes": sum(p.numel() * p.element_size() for p in pre.parameters())}
    body = set(graftable_names(pre))
    out["body_params"] = sum(p.numel() for n, p in pre.named_parameters() if n in body)
    batches = [pre.collate(train[i:i + args.micro_batch]) for i in range(0, len(train), args.micro_batch)]
    out["tokens_per_micro_batch"] = int(batches[0]["input_ids"].numel())
    reset_peak()
    if name == "forward":
        times = []
        with torch.no_grad():
            for _ in range(repeats):
                t0 = clock()
                for b in batches:
                    pre(**{k: v for k, v in b.items() if k != "labels"})
                times.append(clock() - t0)
        out["forward_seconds"] = times
    elif name == "sgd":
        for n, p in pre.named_parameters():
            p.requires_grad_(n in body)
        opt = torch.optim.SGD([p for p in pre.parameters() if p.requires_grad], lr=1e-3)
        fb, upd = [], []
        for _ in range(repeats):
            t0 = clock()
            for b in batches:
                logits = pre(**{k: v for k, v in b.items() if k != "labels"})
                loss = torch.nn.functional.cross_entropy(logits.float(), b["labels"], reduction="sum") / len(train)
                loss.backward()
            t1 = clock()
            opt.step()
            opt.zero_grad(set_to_none=True)
            fb.append(t1 - t0)
            upd.append(clock() - t1)
        out["forward_backward_seconds"], out["update_seconds"] = fb, upd
    else:
        cfg = LocalizeConfig(steps=repeats, micro_batch=args.micro_batch, batch_size=len(train), select_on="train",
                             eval_every=10 ** 6,  # budgets: the default (γ rounded at 0.5), as in issue 12's figure
                             candidates=None if name == "dense" else args.candidates,
                             gradient_checkpointing=name.endswith("ckpt"))
        res = localize(pre, ft if ft is not None else ft_dir, train, None, cfg, progress=False)
        out["step_seconds"] = res.step_times
        out["candidate_size"] = res.candidate_size
    out["peak_above_baseline"] = status("VmHWM") - base
    if name != "forward":  # the plain forward/backward this step is compared with, same process, afterwards
        out["plain_forward_backward_seconds"] = [plain_forward_backward(pre, batches, body, len(train))
                                                 for _ in range(repeats)]
    return out


def run_phase(name: str, size: str, pre_dir: Path, ft_dir: Path, data_dir: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--sizes", size, "--pre", str(pre_dir), "--ft", str(ft_dir),
           "--data", str(data_dir), "--micro-batch", str(args.micro_batch), "--k",
           str(args.k), "--candidates", str(args.candidates), "--repeats", str(args.repeats), "--work", str(args.work),
           "--threads", str(args.threads), "--dtype", args.dtype, "--test-limit", str(args.test_limit)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if r.returncode:
        return {"phase": name, "size": size, "error": r.stderr[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def summarise(rows: list[dict]) -> dict:
    """Peaks as ratios to the forward pass's and to the weights; step time ÷ a plain forward/backward.

    Times are the minimum over repeats (the machine is shared: the minimum is the least disturbed run);
    the plain forward/backward is timed in the same process right after the measured phase.
    """
    by = {r["phase"]: r for r in rows if "error" not in r}
    fwd = by.get("forward", {}).get("peak_above_baseline")
    out = {}
    for name, r in by.items():
        out[f"{name}:peak_mb"] = r["peak_above_baseline"] / 2 ** 20
        if fwd:
            out[f"{name}:peak_vs_forward"] = r["peak_above_baseline"] / fwd
        out[f"{name}:peak_vs_weights"] = r["peak_above_baseline"] / r["weights_bytes"]
        plain = r.get("plain_forward_backward_seconds")
        step = r.get("step_seconds") or (
            [a + b for a, b in zip(r["forward_backward_seconds"], r["update_seconds"])] if name == "sgd" else None)
        if plain and step:
            out[f"{name}:step_vs_forward_backward"] = min(step) / min(plain)
            out[f"{name}:step_vs_forward_backward_median"] = statistics.median(step) / statistics.median(plain)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="40M,165M,500M")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--repeats", type=int, default=3, help="localization steps / timed repeats per measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each measurement")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=16, help="examples per label: a batch of 2k")
    ap.add_argument("--candidates", type=float, default=1e-2)
    ap.add_argument("--results", default="scale.json", help="file name under bench/results")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the models' dtype")
    ap.add_argument("--test-limit", type=int, default=32, help="test examples the CLI phases score every model on")
    ap.add_argument("--work", default=os.environ.get("SKILLGRAFT_SCALE_WORK", "/tmp/skillgraft-scale"))
    ap.add_argument("--phase")
    ap.add_argument("--pre")
    ap.add_argument("--ft")
    ap.add_argument("--data")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.sizes, args.pre, args.ft, args.data, args)))
        return
    work = Path(args.work)
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import write_sentiment_data

    data_dir = write_sentiment_data(work / "data")
    results = {"settings": {k: v for k, v in vars(args).items() if k not in ("phase", "pre", "ft", "data")},
               "sizes": {}}
    for size in args.sizes.split(","):
        t0 = time.time()
        pre_dir, ft_dir = build(size, work, args.dtype)
        rows = []
        for name in args.phases.split(","):
            row = run_phase(name, size, pre_dir, ft_dir, data_dir, args)
            rows.append(row)
            shown = row.get("error", "").splitlines()[-1:] or f"{row['peak_above_baseline'] / 2 ** 20:,.0f} MB"
            print(f"{size:>5} {name:<16} {shown}", flush=True)
        results["sizes"][size] = {"rows": rows, "summary": summarise(rows), "seconds": time.time() - t0}
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / args.results).write_text(json.dumps(results, indent=2))
    print(table(results))


def table(results: dict) -> str:
    lines = ["| model | weights | forward | SGD step | dense | candidates c=1e-2 | + checkpointing | CLI pair | "
             "CLI + ckpt | + lottery-zero | + baselines | step ÷ fwd/bwd (dense / cand. / +ckpt) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, entry in results["sizes"].items():
        by = {r["phase"]: r for r in entry["rows"] if "error" not in r}
        s = entry["summary"]
        any_row = next(iter(by.values()), None)
        if any_row is None:
            continue

        def cell(name):
            if name not in by:
                return "—"
            mb = by[name]["peak_above_baseline"] / 2 ** 20
            ratio = s.get(f"{name}:peak_vs_forward")
            return f"{mb:,.0f} MB ({ratio:.2f}×)" if ratio else f"{mb:,.0f} MB"

        steps = " / ".join(f"{s[k]:.2f}" if k in s else "—" for k in
                           ("dense:step_vs_forward_backward", "candidates:step_vs_forward_backward",
                            "candidates+ckpt:step_vs_forward_backward"))
        params = f" ({any_row['params'] / 1e6:.0f}M)" if "params" in any_row else ""
        lines.append(f"| {size}{params} | {any_row['weights_bytes'] / 2 ** 20:,.0f} MB | "
                     f"{cell('forward')} | {cell('sgd')} | {cell('dense')} | {cell('candidates')} | "
                     f"{cell('candidates+ckpt')} | {cell('cli')} | {cell('cli+ckpt')} | {cell('cli+lottery')} | "
                     f"{cell('cli+baselines')} | "
                     f"{steps} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
