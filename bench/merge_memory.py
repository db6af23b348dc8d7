"""Peak resident memory of ``skillgraft merge`` with N fine-tuned models, as a ratio to one model's weights
(issue 34: θ_pre once and one θ_ft at a time, so the peak stays near two models' weights whatever N is).

Usage: flock /work/heavy.lock .venv/bin/python bench/merge_memory.py [--n 2 4] [--old-src DIR]

A random Llama (hidden 512, 8 layers, vocab 32000: 58M parameters, 232 MB fp32) is saved as θ_pre, and N
"fine-tuned" copies (θ_pre + seeded noise) with 30 prompt → completion rows each. Each merge runs in a fresh
process: the peak RSS above the process's baseline (VmHWM after /proc/self/clear_refs, baseline taken after the
imports) ÷ one checkpoint's weight bytes. As the command line does, glibc's mmap threshold is fixed first
(``skillgraft.heap.return_large_blocks``: freed tensor-sized blocks go back to the OS); ``--no-heap`` leaves it. Settings: localizer ``movement`` (reads θ_ft from its files), budget
1e-3, the stitch at λ = 1 under ``average``, no mergekit grid (its ``mergekit-yaml`` runs in a process of its
own; in-process it holds one merged body at a time). ``--old-src`` runs the same merge on another source tree
(``git archive <commit> src | tar -x -C DIR``) for a before / after. Writes bench/results/merge_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

MERGE = r"""
import json, sys, importlib
from pathlib import Path
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
import torch
torch.set_num_threads(1)
if "--no-heap" not in sys.argv:
    from skillgraft.heap import return_large_blocks
    return_large_blocks()  # as `skillgraft merge` (and `graft`) set for their process
from skillgraft.data.spec import UserDataSpec
from skillgraft.pipeline.store import Store
try:
    mod = importlib.import_module("skillgraft.verbs.merge")
except ImportError:
    mod = importlib.import_module("skillgraft.recipes.merge")
root, n, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
inputs = [mod.ModelInput(str(root / f"ft{i}"), UserDataSpec(data=str(root / f"d{i}.jsonl"), prompt_field="prompt",
                                                             completion_field="completion", max_length=32)
          if "max_length" in UserDataSpec.model_fields else
          UserDataSpec(data=str(root / f"d{i}.jsonl"), prompt_field="prompt", completion_field="completion"),
          None, None, f"t{i}") for i in range(n)]
spec = mod.MergeSpec(localizer="movement", budget=1e-3, mergekit=[], rules=["average"], stitch_scales=[1.0],
                     dev_limit=6, max_length=32)
base = rss("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
mod.merge_models(str(root / "base"), inputs, spec, {}, out, store=Store(out.parent / "store"))
print(json.dumps({"baseline": base, "peak": rss("VmHWM:")}))
"""


def build(root: Path, n: int) -> int:
    """θ_pre and ``n`` fine-tuned copies with their data; returns one checkpoint's weight bytes."""
    import torch
    import transformers as tf

    sys.path.insert(0, str(HERE.parent / "tests"))
    from tiny import _bpe_tokenizer

    tok = _bpe_tokenizer({"bos": "<s>", "eos": "</s>", "unk": "<unk>"})
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    if not (root / "base" / "model.safetensors").is_file():
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(cfg)
        model.save_pretrained(root / "base")
        tok.save_pretrained(root / "base")
    for i in range(n):
        if (root / f"ft{i}" / "model.safetensors").is_file():
            continue
        model = tf.LlamaForCausalLM.from_pretrained(root / "base")
        gen = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
        model.save_pretrained(root / f"ft{i}")
        tok.save_pretrained(root / f"ft{i}")
        words = [" yes", " no"] if i % 2 else [" good", " bad"]
        rows = [{"prompt": f"item {j} of task {i} is", "completion": words[j % 2]} for j in range(30)]
        (root / f"d{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return (root / "base" / "model.safetensors").stat().st_size


def measure(root: Path, n: int, src: Path, extra: tuple = ()) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        r = subprocess.run([sys.executable, "-c", MERGE, str(root), str(n), str(Path(tmp) / "out"), *extra],
                           capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--old-src", type=Path, default=None, help="another source tree to compare (its src/ folder)")
    ap.add_argument("--no-heap", action="store_true", help="leave glibc's dynamic mmap threshold")
    ap.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "skillgraft-merge-memory")
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    weights = build(args.root, max(args.n))
    out = {"model": "random Llama, hidden 512, 8 layers, vocab 32000 (fp32)", "weight_bytes": weights, "runs": []}
    trees = [("this tree", SRC)] + ([("old tree", args.old_src)] if args.old_src else [])
    for label, src in trees:
        for n in args.n:
            m = measure(args.root, n, src, ("--no-heap",) if args.no_heap else ())
            row = {"tree": label, "n": n, "heap_threshold_fixed": not args.no_heap, "peak_above_baseline": m["peak"] - m["baseline"],
                   "ratio_to_one_model": (m["peak"] - m["baseline"]) / weights}
            out["runs"].append(row)
            print(f"{label}: N={n}: peak {row['peak_above_baseline'] / 2**20:.0f} MiB above baseline = "
                  f"{row['ratio_to_one_model']:.2f}× one model's weights ({weights / 2**20:.0f} MiB)", flush=True)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "merge_memory.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
