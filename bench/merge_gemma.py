"""Issue 35 on a real language-model head: the routed comparison on Gemma-3-270M fine-tunes from the store.

The fine-tunes are the ones of the Gemma Table 2 recipes (bench/fidelity/gemma-table2-{a,b,c}.yaml: causal prompt
mode, K = 16 per label, SGD lr 1e-3 × 64 steps, frozen embeddings), found in the store by their key; nothing is
fine-tuned here. Each task's rows are written as a user would give them (under ``--root``, never committed):

* train: the k-shot draw the model was fine-tuned on (localization rows);
* dev: ``--dev`` rows per label from the rest of the task's training pool (seeded; the grids and ``--keep``);
* test: the recipe's seeded ``test_limit`` sample of the test set (the same 200 rows as the Table 2 rows);

with the label words as labels and the task's own causal template (``--template``), so the merge scores exactly
what the fine-tuning optimized. Then one ``skillgraft merge --mode causal --routed`` with the task-aware peers and
a dense task-arithmetic reference; merge.json and report.md are copied to ``--results``.

Causal mode has no new head (the label words are read off the tied LM head), so ``--refit-heads`` does not apply.
The localizer is top-|Δ| (``movement``): on Gemma the learned region stays at its top-|Δ| start at these sizes
(docs/fidelity.md, diagnostics), and a nested family is what ``--keep`` searches.

    SKILLGRAFT_CACHE=/work/store OMP_NUM_THREADS=1 python bench/merge_gemma.py [--tasks SST-2,mr,mpqa,ag_news]
        [--seed 13] [--keep 0.95] [--budget 1e-3]

Scale: 4 tasks × 1 data seed, 32 dev rows per label, 200 test rows, small grids (≈ 1.5 h on one core).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

FINETUNE = {"optimizer": "sgd", "lr": 0.001, "steps": 64, "l1": 0.0}  # the Table 2 recipes' fine-tuning


def find_ft(store: Path, task: str, k: int, seed: int) -> Path:
    """The Table 2 fine-tune of (task, k, seed) in the store (its model folder)."""
    for key_file in sorted(store.glob(f"ft-{task}-{k}-{seed}-causal-*/key.json")):
        key = json.loads(key_file.read_text())
        ft = key.get("finetune", {})
        if key.get("model", {}).get("model") == "gemma-3-270m" and all(ft.get(a) == b for a, b in FINETUNE.items()):
            model = key_file.parent / "run" / "model"
            if model.is_dir():
                return model
    raise SystemExit(f"no Gemma Table 2 fine-tune of {task} (k {k}, seed {seed}) in {store}: run "
                     "bench/fidelity/gemma-table2-*.yaml first")


def held_out(task, train, per_label: int, seed: int) -> list:
    """``per_label`` rows per label from the task's training pool less the k-shot ``train`` rows (seeded): rows the
    fine-tuning never saw, to choose on."""
    from skillgraft.data.loading import load_split

    seen = {e.text_a for e in train}
    pool = [e for e in load_split(task, "train") if e.text_a not in seen]
    random.Random(seed).shuffle(pool)
    return [e for lab in range(task.num_labels) for e in [x for x in pool if x.label == lab][:per_label]]


def prepare(task_name: str, k: int, seed: int, dev: int, test_limit: int, root: Path) -> Path:
    """train / dev / test JSONL (label words as labels) and spec.yaml with the task's causal template."""
    from skillgraft.data import load_kshot
    from skillgraft.data.tasks import get_task

    folder = root / "data" / task_name
    if (folder / "spec.yaml").is_file():
        return folder
    task = get_task(task_name)
    draw = load_kshot(task, k, seed, test_limit=test_limit)
    word = dict(enumerate(task.label_words))
    row = lambda e: {"text": e.text_a, "label": word[e.label]}  # noqa: E731
    held = held_out(task, draw.train, dev, seed)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, rows in (("train", draw.train), ("dev", held), ("test", draw.test)):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(row(e)) + "\n" for e in rows))
    import yaml

    spec = {"data": "train.jsonl", "eval_data": "test.jsonl", "labels": list(task.label_words),
            "template": task.causal_template or task.template}
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="SST-2,mr,mpqa,ag_news")
    ap.add_argument("--seed", type=int, default=13, help="data seed of the fine-tunes")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--dev", type=int, default=32, help="dev rows per label (grids and --keep)")
    ap.add_argument("--test-limit", type=int, default=200)
    ap.add_argument("--budget", default="1e-3", help="each task's region for the stitch and the peers' bytes")
    ap.add_argument("--keep", type=float, default=0.95, help="routed grafts sized by --keep (0: --budget)")
    ap.add_argument("--keep-confidence", type=float, default=0.9)
    ap.add_argument("--peers", default="tall,tswitch,emr")
    ap.add_argument("--tall-lambdas", default="0.4,0.6")
    ap.add_argument("--tswitch-densities", default="0.05,0.2")
    ap.add_argument("--mergekit", default="task_arithmetic", help="mergekit methods (dense references)")
    ap.add_argument("--scales", default="0.5,1")
    ap.add_argument("--stitch-scales", default="1,2")
    ap.add_argument("--rules", default="average")
    ap.add_argument("--root", type=Path, default=Path("/work/store/merge-gemma"))
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "merge_gemma")
    args = ap.parse_args()
    store = Path(os.environ.get("SKILLGRAFT_CACHE", "runs/cache"))
    tasks = args.tasks.split(",")
    root = args.root / f"k{args.k}-s{args.seed}"
    label = f"movement-{args.budget}" + (f"-keep{args.keep:g}-c{args.keep_confidence:g}" if args.keep else "")
    out = root / "out" / label
    if not (out / "merge.json").is_file():
        cli = ["merge", "--pretrained", "gemma-3-270m", "--out", out, "--overwrite", "--mode", "causal",
               "--localizer", "movement", "--budgets", args.budget, "--mergekit", args.mergekit, "--scales",
               args.scales, "--stitch-scales", args.stitch_scales, "--rules", args.rules, "--peers", args.peers,
               "--tall-lambdas", args.tall_lambdas, "--tswitch-densities", args.tswitch_densities,
               "--routed", "--cache", store, "--dev-limit", args.dev * 4]
        if args.keep:
            cli += ["--keep", args.keep, "--keep-confidence", args.keep_confidence]
        for task in tasks:
            data = prepare(task, args.k, args.seed, args.dev, args.test_limit, root)
            cli += ["--finetuned", find_ft(store, task, args.k, args.seed), "--names", task,
                    "--data", data / "spec.yaml",
                    "--dev-data", data / "dev.jsonl"]
        t0 = time.perf_counter()
        # the installed command, not CliRunner: its progress bars reach the log as the run goes (≈ 1.5 h)
        subprocess.run([str(Path(sys.executable).with_name("skillgraft")), *map(str, cli)], check=True)
        (out / "seconds.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    dest = args.results / label
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("merge.json", "report.md", "seconds.json"):
        if (out / name).is_file():
            shutil.copy(out / name, dest / name)
    from merge import summary

    (args.results / "summary.md").write_text(summary(args.results, [label]))
    print((args.results / "summary.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
