"""Issue 11 figures: graft a checkpoint pair trained by plain transformers code, from the CLI.

1. MiniLM SST-2 classifier: the bundled all-MiniLM-L6-v2 fine-tuned as AutoModelForSequenceClassification
   with AdamW on 64 examples per label (no skillgraft training code), grafted at 1e-4 and 1e-3 of the body,
   evaluated on the 872 SST-2 test sentences. Optionally with an L1 penalty on the movement (--l1).
2. Generative example: a tiny random Llama (tests/tiny.py) SFT-ed on prompt → completion pairs with plain torch,
   grafted with the completion-token loss.

    python bench/open_world.py [--l1 0.0] [--out bench/results/open_world.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def finetune_minilm(base: Path, rows: list[dict], out: Path, *, lr: float, steps: int, l1: float) -> None:
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    order = list(range(len(rows)))
    model.train()
    for step in range(steps):
        if step % (len(rows) // 16) == 0:
            random.Random(step).shuffle(order)
        batch = [rows[order[(step * 16 + i) % len(rows)]] for i in range(16)]
        enc = tok([r["text"] for r in batch], return_tensors="pt", padding=True, truncation=True, max_length=128)
        loss = model(**enc, labels=torch.tensor([int(r["label"]) for r in batch])).loss
        if l1:
            loss = loss + l1 * sum((p - start[n]).abs().sum() for n, p in model.named_parameters()
                                   if not n.startswith("classifier"))
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    tok.save_pretrained(out)


def run_cli(*args) -> None:
    from typer.testing import CliRunner

    from skillgraft.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exit_code:
        raise SystemExit(f"skillgraft {' '.join(map(str, args))} failed: {r.output}\n{r.exception!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--l1", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "SST-2")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "open_world.json")
    args = ap.parse_args()
    from skillgraft.models.loading import bundled_minilm_path

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lines = (args.data / "train.jsonl").read_text().splitlines()
        pool = [json.loads(x) for x in lines]
        rng = random.Random(42)
        rows = [r for lab in ("0", "1") for r in rng.sample([r for r in pool if str(r["label"]) == lab], 64)]
        (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        t0 = time.perf_counter()
        finetune_minilm(bundled_minilm_path(), rows, tmp / "ft", lr=args.lr, steps=args.steps, l1=args.l1)
        t1 = time.perf_counter()
        run_cli("graft", "--pretrained", "all-MiniLM-L6-v2", "--finetuned", tmp / "ft", "--data", tmp / "train.jsonl",
                "--eval-data", args.data / "test.jsonl", "--budgets", "1e-4,1e-3", "--out", tmp / "report")
        t2 = time.perf_counter()
        m = json.loads((tmp / "report" / "metrics.json").read_text())
        results["minilm_sst2"] = {"finetune": {"optimizer": "AdamW", "lr": args.lr, "steps": args.steps, "batch": 16,
                                               "examples": len(rows), "l1": args.l1, "seconds": t1 - t0},
                                  "graft_seconds": t2 - t1, "rows": m["rows"], "localization": m["localization"]}

        from tiny import build_tiny, sentence
        from test_open_world import sft_rows, train_sft, write_rows

        a = build_tiny("llama", tmp / "llama")
        data = write_rows(tmp / "sft.jsonl", sft_rows(200))
        b = train_sft(a, tmp / "llama-sft", sft_rows(200), steps=60)
        del sentence
        run_cli("graft", "--pretrained", a, "--finetuned", b, "--data", data, "--prompt-field", "prompt",
                "--completion-field", "completion", "--budgets", "1e-3,1e-2,1e-1", "--out", tmp / "gen")
        g = json.loads((tmp / "gen" / "metrics.json").read_text())
        results["generative_toy"] = {"rows": g["rows"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=float))
    for name, res in results.items():
        print(f"## {name}")
        for r in res["rows"]:
            if r["kind"] in ("pre", "head-only", "ft", "graft") or r["model"].startswith("top-movement"):
                loss = f" loss {r['loss']:.4f} recovered {r.get('loss_recovered', float('nan')):.3f}" if "loss" in r else ""
                print(f"{r['model']:>32} {r['params']:>9,} score {r['score']:.4f} share "
                      f"{r.get('share_of_ft', float('nan')):.3f} ECE {r['ece']:.4f}{loss}")


if __name__ == "__main__":
    main()
