"""``skillgraft tasks``, ``run`` and ``demo``: the registered tasks and the papers' experiments."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from skillgraft.cli.group import Cache, DataDir, app
from skillgraft.cli.options import Options, from_specs
from skillgraft.cli.output import MODEL, console, friendly, model_verb, report as _report
from skillgraft.models.placement import Placement
from skillgraft.spec import DEMO_OUT, DEMO_SEED, SEED_MAX

@app.command()
@friendly
def tasks(data_dir: Optional[Path] = DataDir,
          task_file: Optional[Path] = typer.Option(None, help="YAML file of extra tasks to register first")) -> None:
    """List every registered task, where its data was found, and its split sizes."""
    from skillgraft.verbs.tasks import tasks as list_tasks  # noqa: PLC0415

    table = Table(title="skillgraft tasks")
    for col in ("task", "kind", "labels", "metric", "data", "train", "dev", "test"):
        table.add_column(col)
    rows = list_tasks(data_dir, task_file)
    for t in rows:
        table.add_row(t.name, t.kind, str(t.labels), t.metric, t.data or "[red]not found[/]", *t.sizes)
    console.print(table)
    _report([t.document() for t in rows])


@app.command("run")
@friendly
@from_specs(placement=Options(Placement, panel=MODEL))
def run_cmd(
    recipe_file: Path = typer.Argument(..., help="a recipe YAML (see recipes/ and docs/recipes.md)"),
    out: Optional[Path] = typer.Option(None, help="run directory (default: runs/<yaml name>)"),
    cache: Optional[Path] = typer.Option(None, help="store of finished stages (default: the recipe's cache_dir, "
                                                    "$SKILLGRAFT_CACHE or runs/cache)"),
    overwrite: bool = typer.Option(False, help="replace an existing run directory whole (checked before any work)"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress",
                                            help="progress bars for every stage (default: the recipe's `progress:`)"),
    *, placement: Placement,
) -> None:
    """Run an experiment described by a recipe YAML; writes metrics, CSVs, plots and report.md."""
    from skillgraft.recipes import run_recipe  # noqa: PLC0415

    overrides = {**placement.given(), **({} if progress is None else {"progress": progress})}  # over the recipe's
    path = run_recipe(recipe_file, out, cache=cache, overwrite=overwrite, overrides=overrides or None)
    console.print(f"[bold green]done[/] {recipe_file} → {path}/report.md")
    _report({"recipe": recipe_file, "out": path, "report": Path(path) / "report.md"})


@app.command()
@model_verb
def demo(
    out: Path = typer.Option(Path(DEMO_OUT), help="demo folder (replaced whole when the run is complete)"),
    seed: int = typer.Option(DEMO_SEED, min=0, max=SEED_MAX, help="data seed"),
    data_dir: Optional[Path] = DataDir,
    cache: Optional[Path] = Cache,
) -> None:
    """The main job: fine-tune MiniLM 64-shot on SST-2, learn grafts at 3 sizes, compare, write report.md."""
    from skillgraft.recipes.graft import run_demo  # noqa: PLC0415

    report = run_demo(out, seed=seed, data_dir=data_dir, cache=cache)
    console.print(f"[bold green]done[/] → {report}")
    _report({"out": out, "report": report})
