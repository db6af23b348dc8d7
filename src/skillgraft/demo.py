"""The main job (`make demo`): MiniLM, SST-2 64-shot → fine-tune → grafts at 3 sizes → report.

Stages are cached under the demo folder and reused on re-runs: the fine-tuned model (``cache/``) and
the localization trajectory (``.cache/``), so a second run only re-scores and re-writes the report.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.graft.run import run_graft
from skillgraft.recipes.base import cached_finetune
from skillgraft.train.finetune import FinetuneConfig

TASK, K = "SST-2", 64
DEMO_FINETUNE = FinetuneConfig(optimizer="sgd", lr=0.1, batch_size=8, steps=400, eval_every=100)
DEMO_LOCALIZE = LocalizeConfig(sparsity=1e-4, steps=50, budgets=[1e-4, 3e-4, 1e-3], eval_every=10)


def run_demo(out: str | os.PathLike = "runs/demo", *, seed: int = 42, data_dir: str | None = None) -> Path:
    """Run (or resume) the demo; returns the path of ``report.md``."""
    out = Path(out)
    t0 = time.perf_counter()
    ft_dir = cached_finetune(TASK, K, seed, cache=out / "cache", config=DEMO_FINETUNE, data_dir=data_dir)
    t1 = time.perf_counter()
    run_graft(ft_dir, out, config=DEMO_LOCALIZE, data_dir=data_dir)
    t2 = time.perf_counter()
    report = out / "report.md"
    text = report.read_text()
    text += (f"\nFine-tuning: `{ft_dir}` ({DEMO_FINETUNE.steps} SGD steps, lr {DEMO_FINETUNE.lr}, batch "
             f"{DEMO_FINETUNE.batch_size}, mean pooling, frozen embeddings).\n\n"
             f"Wall time of this run: fine-tuning stage {t1 - t0:.0f} s (0 when cached), grafting and "
             f"evaluation {t2 - t1:.0f} s.\n")
    report.write_text(text)
    return report
