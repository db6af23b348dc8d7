"""Issue 24 figures: merge MiniLM classifiers fine-tuned on different tasks — skillgraft's stitch vs mergekit.

1. Data (from ../shared/data): per task K examples per label drawn from train (seed 42) to fine-tune and localize
   on, the next ``--dev`` per label as dev rows (mergekit's grid and the stitch rule are chosen on these only), and
   a seeded ``--test`` rows of test.
2. Fine-tuning with plain transformers, as users do: the bundled all-MiniLM-L6-v2 as
   AutoModelForSequenceClassification (new head), AdamW, linear decay with 10% warm-up, batch 16, ``--epochs``;
   saved with save_pretrained. Kept under ``--root`` (keyed by the settings), so an interrupted run resumes.
3. ``skillgraft merge`` per (localizer, budget); the first run also runs mergekit's grid (its rows are the same
   for every run: same checkpoints, same rows). Outputs under ``--root``; merge.json and report.md are copied to
   bench/results/merge/.

    SKILLGRAFT_CACHE=/work/store python bench/merge.py [--tasks SST-2,ag_news,QNLI,subj] [--k 256]

Issue 35 adds ``--refit-heads N`` (each task's head refitted on the merged body), ``--routed`` (routed/ written, the
switch timed) and ``--peers tall,tswitch,emr`` (task-aware merges at the grafts' bytes per task); ``--routed --keep τ``
sizes each routed graft by a keep target with a stated confidence (issues 35 and 38).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
PAIR = {"text_field": "text_a", "text_pair_field": "text_b"}


def rows_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare(task: str, k: int, dev: int, test: int, root: Path) -> Path:
    """train (k per label), dev (the next ``dev`` per label) and a seeded test sample, plus spec.yaml."""
    folder = root / "data" / task
    if (folder / "spec.yaml").is_file():
        return folder
    pool = rows_of(DATA / task / "train.jsonl")
    rng = random.Random(42)
    rng.shuffle(pool)
    labels = sorted({r["label"] for r in pool})
    train, held = [], []
    for lab in labels:
        mine = [r for r in pool if r["label"] == lab]
        if len(mine) < k + dev:
            raise SystemExit(f"{task}: label {lab} has {len(mine)} training rows, fewer than k + dev = {k + dev}")
        train += mine[:k]
        held += mine[k:k + dev]
    tests = rows_of(DATA / task / "test.jsonl")
    tests = random.Random(13).sample(tests, min(test, len(tests)))
    write(folder / "train.jsonl", train)
    write(folder / "dev.jsonl", held)
    write(folder / "test.jsonl", tests)
    fields = PAIR if "text_a" in pool[0] else {}
    spec = {"data": "train.jsonl", "eval_data": "test.jsonl", **fields, "labels": labels}
    import yaml

    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def finetune(base: Path, data: Path, out: Path, *, lr: float, epochs: int, seed: int = 0,
             optimizer: str = "adamw") -> dict:
    """Plain transformers fine-tuning of a sequence classifier; returns its settings and seconds.

    ``adamw``: torch's AdamW (what users run); ``sgd``: SGD with momentum 0.9 and gradient clipping at 1 (the
    grafting paper's optimizer family, under which skills localize: its Fig. 5)."""
    import transformers as tf
    import yaml

    spec = yaml.safe_load((data / "spec.yaml").read_text())
    labels = spec["labels"]
    rows = rows_of(data / "train.jsonl")
    tok = tf.AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    steps = epochs * ((len(rows) + 15) // 16)
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=lr))
    sched = tf.get_linear_schedule_with_warmup(opt, steps // 10, steps)
    first, second = spec.get("text_field", "text"), spec.get("text_pair_field")
    model.train()
    t0 = time.perf_counter()
    step = 0
    for epoch in range(epochs):
        order = list(range(len(rows)))
        random.Random(seed * 1000 + epoch).shuffle(order)
        for start in range(0, len(order), 16):
            batch = [rows[i] for i in order[start:start + 16]]
            enc = tok([r[first] for r in batch], [r[second] for r in batch] if second else None, return_tensors="pt",
                      padding=True, truncation=True, max_length=128)
            loss = model(**enc, labels=torch.tensor([labels.index(r["label"]) for r in batch])).loss
            loss.backward()
            if optimizer == "sgd":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    tok.save_pretrained(tmp)
    info = {"optimizer": {"sgd": "SGD (momentum 0.9, clip 1)"}.get(optimizer, "AdamW"), "lr": lr, "epochs": epochs, "steps": step, "batch": 16, "warmup": 0.1,
            "schedule": "linear", "rows": len(rows), "seed": seed, "seconds": time.perf_counter() - t0}
    (tmp / "finetune.json").write_text(json.dumps(info, indent=2))
    tmp.rename(out)
    return info


def run_merge(args: list[str]) -> None:
    from typer.testing import CliRunner

    from skillgraft.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    print(r.output, flush=True)
    if r.exit_code:
        raise SystemExit(f"skillgraft {' '.join(map(str, args))} failed: {r.output}\n{r.exception!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="SST-2,ag_news,QNLI,subj")
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--dev", type=int, default=64)
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                    help="fine-tuning optimizer (adamw: what users run; sgd: momentum 0.9, clip 1)")
    ap.add_argument("--stitch-scales", default="1,1.5,2,3,4,6", help="λ grid of the stitch (chosen on dev)")
    ap.add_argument("--runs", default="movement:0.01:mergekit,learned:0.01,movement:0.005",
                    help="localizer:budget[:mergekit] per merge run (the mergekit grid runs once)")
    ap.add_argument("--densities", default="0.2,0.5", help="density grid of ties / dare_ties")
    ap.add_argument("--scales", default="0.3,0.5,1,1.5", help="λ grid of task_arithmetic / ties / dare_ties")
    ap.add_argument("--learned", default="--steps,50,--batch-size,64,--eval-every,10",
                    help="extra options of the learned localizer (comma-separated)")
    ap.add_argument("--rules", default="average,max-delta,disjoint", help="overlap rules of the stitch")
    ap.add_argument("--mergekit-methods", default="linear,task_arithmetic,ties,dare_ties",
                    help="mergekit methods of the run flagged :mergekit")
    ap.add_argument("--refit-heads", type=int, default=None, help="merge --refit-heads N (issue 35)")
    ap.add_argument("--routed", action="store_true", help="merge --routed: write routed/ and time the switch")
    ap.add_argument("--keep", type=float, default=None,
                    help="with --routed: each task's graft sized by merge --keep τ (issues 35, 38)")
    ap.add_argument("--keep-confidence", type=float, default=None, help="merge --keep-confidence c")
    ap.add_argument("--peers", default="", help="task-aware peers of the run flagged :mergekit (tall,tswitch,emr)")
    ap.add_argument("--root", type=Path, default=Path("/work/store/merge-bench"))
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "merge")
    args = ap.parse_args()
    from skillgraft.models.loading import bundled_minilm_path

    tasks = args.tasks.split(",")
    base = bundled_minilm_path()
    key = [args.k, args.dev, args.test, args.lr, args.epochs] + ([args.optimizer] if args.optimizer != "adamw" else [])
    setting = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:8]
    root = args.root / f"k{args.k}-{setting}"
    timings: dict = {"finetune": {}}
    for task in tasks:
        data = prepare(task, args.k, args.dev, args.test, root)
        ft = root / "ft" / task
        if not ft.is_dir():
            info = finetune(base, data, ft, lr=args.lr, epochs=args.epochs, optimizer=args.optimizer)
            print(f"fine-tuned {task}: {info}", flush=True)
        timings["finetune"][task] = json.loads((ft / "finetune.json").read_text())
    for run in args.runs.split(","):
        localizer, budget, *flags = run.split(":")
        label = f"{localizer}-{budget}" + (f"-keep{args.keep:g}" if args.keep else "") + (
            f"-c{args.keep_confidence:g}" if args.keep and args.keep_confidence else "")
        out = root / "out" / label
        if not (out / "merge.json").is_file():
            cli = ["merge", "--pretrained", "all-MiniLM-L6-v2", "--out", out, "--overwrite", "--localizer", localizer,
                   "--budgets", budget, "--mergekit", args.mergekit_methods if "mergekit" in flags
                   else "", "--densities", args.densities, "--scales", args.scales,
                   "--stitch-scales", args.stitch_scales, "--rules", args.rules,
                   "--peers", args.peers if "mergekit" in flags else ""]
            cli += (["--refit-heads", args.refit_heads] if args.refit_heads else []) + (
                ["--routed"] if args.routed else []) + (["--keep", args.keep] if args.keep else []) + (
                ["--keep-confidence", args.keep_confidence] if args.keep_confidence else [])
            for task in tasks:
                cli += ["--finetuned", root / "ft" / task, "--data", root / "data" / task / "spec.yaml",
                        "--dev-data", root / "data" / task / "dev.jsonl"]
            if localizer == "learned":
                cli += args.learned.split(",")
            t0 = time.perf_counter()
            run_merge(cli)
            timings[label] = time.perf_counter() - t0
        dest = args.results / label
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("merge.json", "report.md"):
            shutil.copy(out / name, dest / name)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "timings.json").write_text(json.dumps(timings, indent=2))
    suffix = (f"-keep{args.keep:g}" if args.keep else "") + (
        f"-c{args.keep_confidence:g}" if args.keep and args.keep_confidence else "")
    (args.results / "summary.md").write_text(summary(args.results, [r.split(":")[0] + "-" + r.split(":")[1] + suffix
                                                                    for r in args.runs.split(",")]))
    print(json.dumps(timings, indent=2))
    print((args.results / "summary.md").read_text())


def summary(results: Path, labels: list[str]) -> str:
    """One table over the runs: every test-scored row (fine-tuned and mergekit once), per-task normalized accuracy."""
    out, seen = [], set()
    for label in labels:
        path = results / label / "merge.json"
        if not path.is_file():
            continue
        s = json.loads(path.read_text())
        names = list(s["tasks"])
        if not out:
            out += [f"| method | settings | {' | '.join(names)} | mean acc | mean norm | dev mean norm | bytes / task | "
                    "share of a checkpoint |", "|---|---|" + "---:|" * (len(names) + 5)]
        ckpt = s["headline"]["checkpoint_bytes"]
        for r in s["rows"]:
            if not r.get("on_test"):
                continue
            method = r["method"] if r["method"] not in ("stitch", "graft") else f"{r['method']} ({label})"
            if r["method"] == "graft" and s.get("routed"):
                method += f", routed: switch {s['routed']['switch_ms']:.2f} ms"
            key = (method, r["config"])
            if key in seen:
                continue
            seen.add(key)
            cells = [f"{r[f'{n}:test']:.4f} / {r[f'{n}:normalized']:.3f}" for n in names]
            mark = " *(dev-chosen)*" if r.get("chosen_on_dev") else ""
            out.append(f"| {method} | {r['config']}{mark} | {' | '.join(cells)} | {r['mean_accuracy']:.4f} | "
                       f"{r['mean_normalized']:.4f} | {r['dev_mean_normalized']:.4f} | {r['bytes_per_task']:,.0f} | "
                       f"{100 * r['bytes_per_task'] / ckpt:.2f}% |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
