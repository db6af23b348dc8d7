"""The ``graft`` recipe (``make demo``: the recipe with :data:`DEMO`): fine-tune a model (or find it in the store),
then the grafting report of :mod:`skillgraft.verbs.graft`."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import Field

from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.pipeline.regions import localizer_options
from skillgraft.pipeline.report import RunDir
from skillgraft.recipes.base import RECIPES, ExperimentSpec, recipe, run_spec
from skillgraft.spec import DEMO_OUT, DEMO_SEED, SEED_MAX
from skillgraft.train import FinetuneConfig
from skillgraft.verbs.graft import ReportSpec, graft_report


class GraftRecipeSpec(ExperimentSpec):
    """Fine-tune a model (or find it in the store), then the grafting report (``recipe: graft``; the demo)."""

    task: str = Field("SST-2", description="task name (see `skillgraft tasks`)")
    seed: int = Field(42, ge=0, le=SEED_MAX, description="data seed")
    localize: LocalizeConfig = Field(default_factory=LocalizeConfig, description="the learned localizer's settings")
    report: ReportSpec = Field(default_factory=ReportSpec, description="what the report compares")


@recipe("graft", GraftRecipeSpec)
def graft_recipe(spec: GraftRecipeSpec, run: RunDir) -> dict:
    options = localizer_options(spec.report.localizer, spec.localize)  # refused before any fine-tuning
    t0 = time.perf_counter()
    member = spec.member(run, spec.task, spec.seed)
    t1 = time.perf_counter()
    metrics = graft_report(member, run, spec.report, options, progress=spec.progress)
    t2 = time.perf_counter()
    ft = spec.finetune
    text = (run.path / "report.md").read_text()
    text += (f"\nFine-tuning: {ft.steps} {ft.optimizer.upper()} steps, lr {ft.lr:g}, batch {ft.batch_size}, "
             f"{member.pre.pooling} pooling, {'frozen' if ft.freeze_embeddings else 'trained'} embeddings "
             f"(stored in `{member.inputs.ft_dir.parent.name}`).\n\n"
             f"Wall time of this run: fine-tuning stage {t1 - t0:.0f} s (≈0 when stored), grafting and "
             f"evaluation {t2 - t1:.0f} s.\n")
    run.report(text)
    return metrics.to_dict()  # the typed report as metrics.json's mapping

# ---------------------------------------------------------------------------------------------- the demo
# The main job (``make demo``): MiniLM, SST-2 64-shot → fine-tune → grafts at 3 sizes → report. Its stages live in
# the store (``runs/cache`` by default): a second run finds the fine-tuned model and the regions there and only
# re-scores and re-writes the report, which replaces ``runs/demo`` whole when complete.
DEMO = GraftRecipeSpec(
    recipe="graft", task="SST-2", k=64, seed=DEMO_SEED, progress=True,
    finetune=FinetuneConfig(optimizer="sgd", lr=0.1, batch_size=8, steps=400, eval_every=100),
    localize=LocalizeConfig(sparsity=1e-4, steps=50, budgets=[1e-4, 3e-4, 1e-3], eval_every=10),
)


def run_demo(out: str | os.PathLike = DEMO_OUT, *, seed: int = DEMO_SEED,
             data_dir: str | os.PathLike | None = None,
             cache: str | os.PathLike | None = None) -> Path:
    """Run (or resume) the demo; returns the path of ``report.md``."""
    spec = DEMO.replace(seed=seed, data_dir=data_dir)
    return run_spec(RECIPES["graft"], spec, out, cache=cache, overwrite=True) / "report.md"
