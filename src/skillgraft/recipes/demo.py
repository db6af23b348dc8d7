"""The main job (``make demo``): MiniLM, SST-2 64-shot → fine-tune → grafts at 3 sizes → report.

The demo is the ``graft`` recipe with the settings below. Its stages live in the store (``runs/cache`` by
default): a second run finds the fine-tuned model and the regions there and only re-scores and re-writes
the report, which replaces ``runs/demo`` whole when complete.
"""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.recipes.base import RECIPES, run_spec
from skillgraft.recipes.graft import GraftRecipeSpec
from skillgraft.train import FinetuneConfig

DEMO = GraftRecipeSpec(
    recipe="graft", task="SST-2", k=64, seed=42, progress=True,
    finetune=FinetuneConfig(optimizer="sgd", lr=0.1, batch_size=8, steps=400, eval_every=100),
    localize=LocalizeConfig(sparsity=1e-4, steps=50, budgets=[1e-4, 3e-4, 1e-3], eval_every=10),
)


def run_demo(out: str | os.PathLike = "runs/demo", *, seed: int = 42, data_dir: str | os.PathLike | None = None,
             cache: str | os.PathLike | None = None) -> Path:
    """Run (or resume) the demo; returns the path of ``report.md``."""
    spec = DEMO.replace(seed=seed, data_dir=data_dir)
    return run_spec(RECIPES["graft"], spec, out, cache=cache, overwrite=True) / "report.md"
