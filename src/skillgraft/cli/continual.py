"""``skillgraft continual add`` and ``continual show``: forget-free continual learning by grafting."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from skillgraft.cli.group import COMMON, Cache, DataDir, continual_app
from skillgraft.cli.options import Options, default_of, from_specs
from skillgraft.cli.output import TRAIN, console, friendly, model_verb, report as _report
from skillgraft.graft.localizers import LocalizeConfig
from skillgraft.spec import COUNT_MAX, SEED_MAX
from skillgraft.train.config import FinetuneConfig
from skillgraft.verbs.continual import continual_add as verbs_continual_add

# continual add: fine-tuning and localization options are FinetuneConfig / LocalizeConfig fields (their defaults);
# the localizer's options that share a name with a fine-tuning one get a localize- prefix.
_CONTINUAL_LOCALIZE = {n: f"localize_{n}" for n in ("steps", "lr", "batch_size", "micro_batch", "sigmoid_bias", "l1",
                                                     "seed", "eval_every", "select_on", "optimizer", "init", "compile")}


@continual_app.command("add", common=COMMON["continual add"])
@model_verb
@from_specs(finetune=Options(FinetuneConfig, rename={"seed": "model_seed"}, skip=("layers",), panel=TRAIN),
            localize=Options(LocalizeConfig, rename=_CONTINUAL_LOCALIZE, skip=("budgets", "graftable"),
                             panel="Localizer (learned)"))
def continual_add_cmd(
    state: Path = typer.Option(..., help="continual state folder (created on first use)"),
    task: str = typer.Option(..., help="the task that arrives now"),
    k: int = typer.Option(default_of(verbs_continual_add, "k"), min=1, max=COUNT_MAX, help="examples per label"),
    seed: int = typer.Option(default_of(verbs_continual_add, "seed"), min=0, max=SEED_MAX, help="data seed"),
    data_dir: Optional[Path] = DataDir,
    model: Optional[str] = typer.Option(None, help="base model (only when creating the state; default MiniLM)"),
    mode: str = typer.Option(default_of(verbs_continual_add, "mode"),
                             help="head | prompt (only when creating the state)"),
    region: Optional[Path] = typer.Option(None, help="γ_task: a region or graft folder (default: learn it from a "
                                                     "single-task fine-tune + localize)"),
    init: str = typer.Option(default_of(verbs_continual_add, "init"),
                             help="current (paper: train owned coordinates from the current model) | "
                             "graft (start them from the single-task graft)"),
    test_limit: Optional[int] = typer.Option(None, min=1, max=COUNT_MAX,
                                             help="evaluate on a fixed seeded sample of N test examples"),
    cache: Optional[Path] = Cache,
    *,
    finetune: FinetuneConfig,
    localize: LocalizeConfig,
) -> None:
    """Learn TASK on its region minus earlier tasks' regions; earlier tasks' coordinates never change.

    Fine-tuning options: the single-task run γ_task is learned from and the owned-region training.
    """
    from skillgraft.verbs.continual import continual_add  # noqa: PLC0415 - looked up when run (tests replace it)

    added = continual_add(state, task, k=k, seed=seed, data_dir=data_dir, model=model, mode=mode, region=region,
                          finetune_config=finetune, localize_config=localize, init=init, test_limit=test_limit,
                          cache=cache)
    console.print(f"[bold green]added[/] {added.task} as task #{added.order}: |γ|={added.region_size}, "
                  f"owned {added.owned_size} (shared with earlier {added.shared_with_earlier}); "
                  f"test {added.test_score:.4f} → {state}/continual.json")
    _report(added.document())


@continual_app.command("show")
@friendly
def continual_show_cmd(state: Path = typer.Argument(..., help="continual state folder")) -> None:
    """Arrival order, region sizes, owned coordinates and test scores of a continual state."""
    from skillgraft.verbs.continual import continual_show  # noqa: PLC0415

    st = continual_show(state)
    table = Table(title=f"continual state {state} (base {st.base_model})")
    for col in ("order", "task", "|γ|", "owned", "shared w/ earlier", "test (latest)"):
        table.add_column(col)
    for t in st.tasks:
        table.add_row(str(t.order), t.task, str(t.region_size), str(t.owned_size), str(t.shared_with_earlier),
                      "-" if t.latest_test is None else f"{t.latest_test:.4f}")
    console.print(table)
    _report(st.document())
