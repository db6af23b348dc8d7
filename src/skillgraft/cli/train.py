"""``skillgraft finetune``, ``evaluate`` and ``fim``: a model trained, scored, or its layers ranked."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer
from rich.markup import escape
from rich.table import Table

from skillgraft.cli.group import COMMON, DataDir, app
from skillgraft.cli.options import Options, default_of, from_specs
from skillgraft.cli.output import DATA, MODEL, OUTPUT, TRAIN, console, model_verb, report as _report
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.fisher.fisher import FisherConfig
from skillgraft.models.spec import ModelSpec
from skillgraft.spec import COUNT_MAX
from skillgraft.train.config import FinetuneConfig
from skillgraft.verbs.evaluate import evaluate as verbs_evaluate  # light modules: the options' defaults live there
from skillgraft.verbs.fim import fim as verbs_fim

@app.command(common=COMMON["finetune"])
@model_verb
@from_specs(data=Options(DataSpec, panel=DATA), model=Options(ModelSpec, panel=MODEL),
            finetune=Options(FinetuneConfig, rename={"seed": "model_seed"}, skip=("layers",), panel=TRAIN))
def finetune(
    layers: Optional[str] = typer.Option(None, help="train only these blocks: '0,3,5', or fim:top-K / fim:bottom-K / "
                                                    "random-K (surgical fine-tuning)", rich_help_panel=TRAIN),
    out: Optional[Path] = typer.Option(None, help="run directory (default: runs/ft-<task>-<k>-<seed>)",
                                       rich_help_panel=OUTPUT),
    overwrite: bool = typer.Option(False, help="replace an existing run directory whole (checked before training)",
                                   rich_help_panel=OUTPUT),
    *, data: DataSpec, model: ModelSpec, finetune: FinetuneConfig,
) -> None:
    """Fine-tune a model on a k-shot task and write a run directory (model, config, metrics, plots)."""
    from skillgraft.verbs.finetune import finetune as run  # noqa: PLC0415

    result = run(data, model, finetune, out=out, layers=layers, overwrite=overwrite)
    _report(result.document())
    console.print(f"[bold green]done[/] {escape(result.line())}")


@app.command(common=COMMON["evaluate"])
@model_verb
@from_specs(user=Options(UserDataSpec, skip=("k", "seed", "eval_fraction", "test_limit"), panel=DATA))
def evaluate(
    model_dir: str = typer.Argument(..., help="a model folder: a skillgraft run (or its model/), or any Hugging Face "
                                                "checkpoint (sequence classifier, masked LM, causal LM) or hub name"),
    task: Optional[str] = typer.Option(None, help="task to evaluate on (default: the model's task)",
                                       rich_help_panel=DATA),
    split: str = typer.Option(default_of(verbs_evaluate, "split"), help="train | dev | test", rich_help_panel=DATA),
    mode: Optional[str] = typer.Option(None, help=(
        "a Hugging Face checkpoint: classifier | prompt | causal | generative (default: from its class and the data)")),
    data_dir: Optional[Path] = DataDir,
    limit: Optional[int] = typer.Option(None, min=1, max=COUNT_MAX, help="first N examples only", rich_help_panel=DATA),
    out: Optional[Path] = typer.Option(None, help="write metrics JSON + plots into this folder",
                                       rich_help_panel=OUTPUT),
    *, user: UserDataSpec,
) -> None:
    """Evaluate a model: accuracy/F1, ECE (generative data: completion loss, exact match), (with --out) plots.

    A Hugging Face checkpoint is evaluated on every row of --eval-data (else of --data), or on --task's split.
    """
    from skillgraft.verbs.evaluate import evaluate as run_evaluate  # noqa: PLC0415

    result = run_evaluate(model_dir, user=user, task=task, split=split, mode=mode, data_dir=data_dir, limit=limit,
                          out=out)
    if result.labels_note:
        console.print(f"labels: {escape(result.labels_note)}")
    console.print(result.line())
    _report(result.document())


@app.command()
@model_verb
@from_specs(data=Options(DataSpec, skip=("test_limit",), panel=DATA), model=Options(ModelSpec, panel=MODEL),
            fisher=Options(FisherConfig, rename={"n_examples": "n", "seed": "fisher_seed"}, panel="Fisher"))
def fim(
    aggregate: Literal["sum", "frobenius"] = typer.Option(default_of(verbs_fim, "aggregate"),
                                                          help="block score: sum (of Fisher entries) | frobenius "
                                                               "(reference code)"),
    normalize: bool = typer.Option(False, help="divide each block's score by its parameter count"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: runs/fim-<task>-<k>-<seed>)"),
    *, data: DataSpec, model: ModelSpec, fisher: FisherConfig,
) -> None:
    """Per-layer FIM scores of the pre-trained model (surgical fine-tuning): ranking table, fim.json, fim.png."""
    from skillgraft.verbs.fim import fim as run_fim  # noqa: PLC0415

    r = run_fim(data, model, fisher, aggregate=aggregate, normalize=normalize, out=out)
    ranks = r.scores.rank_of()
    table = Table(title=f"FIM layer ranking: {r.task} k={r.k} seed={r.seed} ({r.kind}, {r.aggregate})")
    for col in ("block", "score", "rank", "parameters"):
        table.add_column(col, justify="right")
    for i in r.scores.ranking():
        table.add_row(str(i), f"{r.scores.scores[i]:.4g}", str(ranks[i] + 1), f"{r.scores.num_parameters[i]:,}")
    console.print(table)
    console.print(f"top → bottom: {r.scores.ranking()}  → {r.out}/fim.json, {r.out}/fim.png")
    _report(r.document())
