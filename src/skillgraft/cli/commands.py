"""The command line: ``skillgraft <verb>``. Each verb is a thin wrapper over a typed library function.

Options that configure the work come from the typed specs (``options.from_specs``): their names, defaults,
ranges and help are declared once, on the spec's fields.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.markup import escape
from rich.table import Table

from skillgraft.cli.help import App
from skillgraft.cli.output import (DATA, KEEP, MODEL, OUTPUT, REPORT, TRAIN, console, err, exporter_lines, friendly,
                                   localizer_flags, model_verb, plain as _plain, print_keep, print_routed_keep,
                                   print_version, region_table, report as _report, run_app)
from skillgraft.cli.config import config_option
from skillgraft.cli.options import Options, build, default_of, from_specs, guard_empty_paths
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.fisher.fisher import FisherConfig
from skillgraft.export.base import ExportSpec, human_size
from skillgraft.keep.spec import KeepSpec
from skillgraft.graft.localizers import LOCALIZERS, LocalizeConfig, options_union
from skillgraft.verbs.apply import apply as verbs_apply  # light modules: the options' defaults live there
from skillgraft.verbs.continual import continual_add as verbs_continual_add
from skillgraft.verbs.evaluate import evaluate as verbs_evaluate
from skillgraft.verbs.serve import ServeSpec
from skillgraft.verbs.fim import fim as verbs_fim

LocalizerFlags = options_union()  # every registered localizer's options; the chosen one validates what is set
from skillgraft.models.placement import Placement
from skillgraft.models.spec import MAX_LENGTH, ModelSpec
from skillgraft.pipeline.frontier import FrontierSpec
from skillgraft.verbs.graft import ReportSpec
from skillgraft.verbs.sweep import SweepSpec
from skillgraft.spec import COUNT_MAX, DEMO_OUT, DEMO_SEED, SEED_MAX
from skillgraft.train.config import FinetuneConfig

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# the options each verb's short --help shows (the rest: --help-all; issue 80: one screen at 80 columns)
COMMON = {
    "finetune": ("--task", "--k", "--seed", "--model", "--mode", "--optimizer", "--lr", "--steps", "--layers",
        "--out", "--overwrite", "--json", "--device"),
    "evaluate": ("--task", "--split", "--data", "--eval-data", "--labels", "--out", "--json", "--device"),
    "graft": ("--finetuned", "--pretrained", "--task", "--data", "--eval-data", "--budgets", "--steps",
        "--localizer", "--baselines", "--keep", "--out", "--overwrite", "--json", "--config", "--device"),
    "export": ("--to", "--out", "--model", "--non-linear", "--gguf-type", "--overwrite", "--json"),
    "sweep": ("--finetuned", "--levels", "--localizers", "--steps", "--frontier", "--out", "--overwrite", "--json",
        "--device"),
    "merge": ("--pretrained", "--finetuned", "--data", "--eval-data", "--names", "--budgets", "--mergekit",
        "--routed", "--keep", "--out", "--overwrite", "--json", "--config", "--device"),
    "continual add": ("--state", "--task", "--k", "--seed", "--model", "--steps", "--localize-steps", "--json",
        "--device"),
}

app = App(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
          help="Find where a fine-tuned model keeps a task's skill, store it as a sparse graft, use it.")

@app.callback()
def _main_options(version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True,
                                               help="print skillgraft's version and exit")) -> None:
    """Find where a fine-tuned model keeps a task's skill, store it as a sparse graft, use it."""


DataDir = typer.Option(None, "--data-dir", help="data root (default: $SKILLGRAFT_DATA, ./data, ../shared/data)",
                       rich_help_panel=DATA)


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
    _report([{**_plain(t), "sizes": dict(zip(("train", "dev", "test"), t.sizes))} for t in rows])


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
    _report({"out": result.out, **result.metrics})
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
    _report({**_plain(result), "out": out})


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


Cache = typer.Option(None, help="store of finished stages (default: $SKILLGRAFT_CACHE or runs/cache)",
                     rich_help_panel=OUTPUT)


@app.command(common=COMMON["graft"])
@model_verb
@from_specs(localize=localizer_flags(LocalizerFlags), report=Options(ReportSpec, help={"localizer": (
                f"localizer of the grafts: {', '.join(LOCALIZERS)}; its own options: `skillgraft localizers NAME`")},
                                                                   panel=REPORT),
            data=Options(DataSpec, skip=("task", "k", "seed", "test_limit", "dev_limit"), panel=DATA),
            user=Options(UserDataSpec, rename={"seed": "data_seed"}, panel=DATA), keep=Options(KeepSpec, panel=KEEP),
            frontier=Options(FrontierSpec, panel=KEEP))
def graft(
    config: Optional[Path] = config_option(),
    finetuned: str = typer.Option(..., help="the fine-tuned model: a Hugging Face checkpoint (hub name or folder saved "
                                             "by plain transformers) with --pretrained, or a skillgraft run directory",
                                   rich_help_panel=MODEL),
    pretrained: Optional[str] = typer.Option(None, help="the checkpoint --finetuned was fine-tuned from (hub name or "
                                                        "folder); needed unless --finetuned is a skillgraft run",
                                             rich_help_panel=MODEL),
    mode: Optional[str] = typer.Option(None, help="how to score a checkpoint pair: classifier | prompt | causal | "
                                                  "generative (default: from the fine-tuned checkpoint's class)",
                                       rich_help_panel=MODEL),
    task: Optional[str] = typer.Option(None, help="a registered task to graft a checkpoint pair on, instead of --data",
                                       rich_help_panel=DATA),
    max_length: int = typer.Option(MAX_LENGTH, min=8, max=COUNT_MAX, help="max tokens per example (checkpoint pairs)",
                                   rich_help_panel=MODEL),
    out: Optional[Path] = typer.Option(
        None, help="output folder (default: <run>/graft, or runs/graft-<checkpoint name>)", rich_help_panel=OUTPUT),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (checked before any work)",
                                   rich_help_panel=OUTPUT),
    cache: Optional[Path] = Cache,
    *, localize: LocalizerFlags, report: ReportSpec, data: DataSpec, user: UserDataSpec, keep: KeepSpec,
    frontier: FrontierSpec,
) -> None:
    """Learn sparse grafts from a pre-trained + fine-tuned pair and compare them (writes report.md).

    --keep 0.95,0.99: the smallest graft keeping each share of FT's score (on a selection split); --frontier: share of
    FT vs density against closed-form peers (frontier.csv, frontier.png)."""
    from skillgraft.heap import return_large_blocks  # noqa: PLC0415
    from skillgraft.pipeline.regions import localizer_options  # noqa: PLC0415
    from skillgraft.verbs.graft import GraftInputs, graft as run_graft  # noqa: PLC0415

    return_large_blocks()  # tensor-sized temporaries freed go back to the OS at once (the peak is the work's)

    keep.refuse_options_without_targets(frontier=frontier.frontier)
    user.refuse_options_without_data()
    # the chosen localizer's own defaults + the options the user set; checked before any work
    options = localizer_options(report.localizer, localize.given(), build=lambda cls, v: build(Options(cls), v))
    result = run_graft(GraftInputs(finetuned, pretrained, mode, task, max_length, data, user), report=report,
                       localize=options, keep=keep, frontier=frontier, out=out, overwrite=overwrite, cache=cache)
    console.print(f"evaluated on {result.metrics.get('evaluated_on', '?')}")  # where the test rows came from
    for r in result.rows:  # typed ResultRows
        if r.kind in ("graft", "ft", "keep"):
            size = f", {r.file_bytes / 1024:.1f} KiB" if r.file_bytes else ""
            extra = f" loss {r.metrics['loss']:.4f}" if "loss" in r.metrics else ""
            console.print(f"{r.model:>22}: {result.metrics['task']} test {r.score:.4f} ECE {r.metrics['ece']:.4f}{extra} "
                          f"| {r.params:,} params ({r.density:.2e}){size}")
    for line in (result.metrics.get("fit") or {}).get("lines", []):
        console.print(line, highlight=False)
    print_keep(result.metrics.get("keep"), result.metrics.get("frontier"))
    if result.data_note:
        console.print(f"data: {escape(result.data_note)}")
    if result.labels_note:
        console.print(f"labels: {escape(result.labels_note)}")
    console.print(f"[bold green]done[/] → {result.out}/report.md")
    _report({"out": result.out, "report": result.out / "report.md", "data_note": result.data_note,
             "labels_note": result.labels_note, **result.metrics})


@app.command()
@model_verb
def apply(
    graft_dir: Path = typer.Argument(..., help="a graft folder (graft_config.json + graft.safetensors)"),
    model: Optional[str] = typer.Option(None, help="base model (default: the one recorded in the graft)"),
    task: Optional[str] = typer.Option(None, help="task (default: the graft's task)"),
    mode: Optional[str] = typer.Option(None, help="scorer mode, for a graft that records none (default: the mode "
                                                  "recorded in the graft, else head)"),
    export: Optional[Path] = typer.Option(None, help="write the grafted model as a Hugging Face checkpoint here (a "
                                                     "FILE.gguf: one GGUF file llama.cpp runs, as --to gguf)"),
    overwrite: bool = typer.Option(False, help="replace an existing --export folder (it is never mixed into)"),
    evaluate_on: Optional[str] = typer.Option(default_of(verbs_apply, "evaluate_on"),
                                              help="split to evaluate on (empty: skip)"),
    limit: Optional[int] = typer.Option(None, min=1, max=COUNT_MAX, help="first N examples only"),
    force: bool = typer.Option(False, help="apply even if the base fingerprint differs or the graft records none"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Apply a graft to its base model: evaluate it and/or export the grafted model in the user's own class."""
    from skillgraft.verbs.apply import apply as run_apply  # noqa: PLC0415

    result = run_apply(graft_dir, model=model, task=task, mode=mode, export=export, overwrite=overwrite,
                       evaluate_on=evaluate_on, limit=limit, force=force, data_dir=data_dir)
    if result.export is not None and result.export.get("to") == "gguf":
        exporter_lines("gguf", result.export)
        console.print(f"exported grafted model → {export} (GGUF: llama.cpp, or transformers' gguf_file=)")
    elif result.export is not None and result.export["complete"]:
        console.print(f"exported grafted model → {export} (loads with transformers.{result.export['loads_with']})")
    elif result.export is not None:
        err.print(f"[yellow]warning:[/] exported → {export}, but head mode has no Hugging Face class: the task "
                  "head is in head.safetensors (marked incomplete; load with skillgraft's Scorer.from_pretrained)")
    if result.metrics is not None:
        console.print(result.line())
    _report({**_plain(result), "export_dir": export})


@app.command()
@friendly
def inspect(
    graft_dir: Path = typer.Argument(..., help="a graft folder, or a PEFT SHiRA adapter folder"),
    out: Optional[Path] = typer.Option(None, help="write the distribution PNG + JSON into this folder (default: "
                                                  "printed only; nothing is written into the graft folder)"),
    model: Optional[str] = typer.Option(None, help="base model of a PEFT adapter (default: its "
                                                   "base_model_name_or_path)"),
    compare: Optional[Path] = typer.Option(None, help="another graft or SHiRA adapter folder: overlap and IoU"),
) -> None:
    """Size, density and where a graft's parameters sit (per layer × module type; paper Figs. 9/10)."""
    from skillgraft.verbs.inspect import inspect as run_inspect  # noqa: PLC0415

    r = run_inspect(graft_dir, out=out, model=model, compare=compare)
    for line in r.lines(graft_dir, compare):
        console.print(line)
    dist = r.distribution
    for item in region_table(dist, console.width):
        console.print(item)
    if r.out is not None:
        console.print(f"→ {r.out / 'distribution.png'}")
    _report(r.document(graft_dir, compare))


@app.command()
@model_verb
@from_specs(spec=Options(ServeSpec, panel="Serve"))
def serve(
    routed_dir: Path = typer.Argument(..., help="a routed/ folder (written by skillgraft merge --routed)"),
    *, spec: ServeSpec,
) -> None:
    """Serve routed skills over an OpenAI-compatible HTTP API: /v1/models, /v1/completions, /v1/chat/completions,
    /v1/classify (docs/serve.md)."""
    from skillgraft.verbs.serve import serve as run_serve  # noqa: PLC0415

    def ready(url: str, models: list[str]) -> None:
        console.print(f"serving {', '.join(models)} on {url}/v1 (Ctrl-C or SIGTERM: stop after the requests in "
                      "flight)", soft_wrap=True)

    r = run_serve(routed_dir, spec, on_ready=ready)
    console.print(f"stopped{f' by {r.stopped_by}' if r.stopped_by else ''}: {r.requests} request(s) answered")
    _report(_plain(r))


@app.command("export", common=COMMON["export"])
@model_verb
@from_specs(spec=Options(ExportSpec, panel="Export"))
def export_cmd(
    graft_dir: Path = typer.Argument(..., help="a graft folder (graft_config.json + graft.safetensors)"),
    out: Path = typer.Option(..., help="output folder; --to gguf: one FILE.gguf (refused if it exists, unless "
                                       "--overwrite)"),
    *, spec: ExportSpec,
) -> None:
    """Write a graft as a PEFT SHiRA adapter, a plain safetensors delta, an HF checkpoint or a GGUF file
    (docs/export.md)."""
    from skillgraft.verbs.export import export as run_export  # noqa: PLC0415

    r = run_export(graft_dir, out, spec)
    exporter_lines(spec.to, r.summary)
    size = f" ({human_size(r.bytes)})" if r.bytes is not None else ""
    console.print(f"[bold green]exported[/] {r.coordinates:,} grafted coordinates as {r.to} → {out}{size}")
    _report({"out": out, **r.to_dict()})


@app.command()
@friendly
def localizers(name: Optional[str] = typer.Argument(None, help="a registered localizer: show its options")) -> None:
    """The registered localizers, or one localizer's options with their defaults and help."""
    from rich.table import Column, Table  # noqa: PLC0415

    from skillgraft.graft.localizers import get_localizer, options_table, support, support_table  # noqa: PLC0415

    def short(verdict: str) -> str:
        return "yes" if verdict == "yes" else "refused"

    if name is None:
        table = Table("what it does", "--candidates", "FSDP", "generative")
        table.columns.insert(0, Column("localizer", no_wrap=True))
        rows = support_table()
        for row in rows:
            table.add_row(row.name, LOCALIZERS[row.name].summary or "", short(row.candidates), short(row.sharded),
                          short(row.generative))
        console.print(table)
        _report([{"name": r.name, "summary": LOCALIZERS[r.name].summary or "", "candidates": r.candidates,
                  "sharded": r.sharded, "generative": r.generative} for r in rows])
        console.print("options and reasons of one: skillgraft localizers NAME; "
                      "use: skillgraft graft --localizer NAME …")
        return
    get_localizer(name)  # an unknown name is one line listing the known ones
    table = Table("option", "default", "help", title=f"localizer {name!r}: {get_localizer(name).summary}")
    for field, default, text in options_table(name):
        table.add_row(f"--{field.replace('_', '-')}", default, text)
    console.print(table)
    row = support(name)
    where = Table("setting", "with the default options", title=f"where {name!r} runs")
    for setting, verdict in (("--candidates", row.candidates), ("FSDP (sharded)", row.sharded),
                             ("generative data", row.generative)):
        where.add_row(setting, verdict)
    console.print(where)
    _report({"name": name, "summary": get_localizer(name).summary,
             "options": [{"option": f, "default": d, "help": t} for f, d, t in options_table(name)],
             "support": {"candidates": row.candidates, "sharded": row.sharded, "generative": row.generative}})


@app.command(common=COMMON["sweep"])
@model_verb
@from_specs(sweep=Options(SweepSpec, panel="Sweep"), localize=Options(LocalizeConfig, skip=("budgets",),
                                                                     panel="Localizer (learned)"),
            data=Options(DataSpec, skip=("task", "k", "seed", "dev_limit"), panel=DATA),
            frontier=Options(FrontierSpec, panel=KEEP))
def sweep(
    finetuned: Path = typer.Option(..., help="a fine-tuning run directory", rich_help_panel=MODEL),
    out: Optional[Path] = typer.Option(None, help="output folder (default: <finetuned>/sweep)", rich_help_panel=OUTPUT),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (checked before any work)",
                                   rich_help_panel=OUTPUT),
    cache: Optional[Path] = Cache,
    *, sweep: SweepSpec, localize: LocalizeConfig, data: DataSpec, frontier: FrontierSpec,
) -> None:
    """Accuracy vs region size for learned, top-movement and random regions (paper Figs. 2/4): CSV + PNG.

    --frontier also draws share of FT vs density against closed-form peers (frontier.csv, frontier.png)."""
    from skillgraft.verbs.sweep import sweep as run_sweep  # noqa: PLC0415

    result = run_sweep(finetuned, sweep, localize, data=data, frontier=frontier, out=out, overwrite=overwrite,
                       cache=cache)
    for r in result.rows:  # typed SweepRows
        console.print(f"{r.localizer:>13} {float(r.level):.0e}: {r.score:.4f} (ECE {r.ece:.4f})")
    print_keep(frontier=result.frontier)
    console.print(f"[bold green]done[/] → {result.out}/sweep.csv, {result.out}/sweep.png")
    _report({"out": result.out, "rows": result.rows, **({"frontier": result.frontier} if result.frontier else {})})


def _merge_specs():
    from skillgraft.verbs.merge import MergeSpec  # noqa: PLC0415

    return from_specs(spec=Options(MergeSpec, panel="Merge", rename={"budget": "budgets"}, old={"budget": "budget"},
                                   help={"budget": "region size of each task's graft: a fraction of the graftable "
                                                   "parameters in (0, 1] or a count (one here; graft's --budgets "
                                                   "takes several); the former --budget still works, with a warning"}),
                      localize=localizer_flags(LocalizerFlags, skip=("budgets",)),
                      user=Options(UserDataSpec, rename={"seed": "data_seed"},
                                   skip=("data", "eval_data", "data_config", "data_split", "eval_split"), panel=DATA))


@app.command(common=COMMON["merge"])
@model_verb
@_merge_specs()
def merge(
    config: Optional[Path] = config_option(mergekit=True),
    pretrained: Optional[str] = typer.Option(None, help="the checkpoint every model was fine-tuned from",
                                             rich_help_panel=MODEL),
    finetuned: list[str] = typer.Option([], help="a fine-tuned Hugging Face checkpoint (repeat: once per model)",
                                        rich_help_panel=MODEL),
    data: list[str] = typer.Option([], help="each model's data, in the --finetuned order (repeat); a .yaml file is a "
                                            "data spec with that model's own fields (data, eval_data, text_field, …)",
                                   rich_help_panel=DATA),
    eval_data: list[str] = typer.Option([], help="each model's held-out test rows (repeat; default: see --data)",
                                        rich_help_panel=DATA),
    dev_data: list[str] = typer.Option([], help="each model's dev rows for the mergekit grid (repeat; default: a "
                                                "seeded --dev-fraction of its --data)", rich_help_panel=DATA),
    grafts: list[str] = typer.Option([], help="use these grafts instead of localizing (repeat: once per model)",
                                     rich_help_panel=MODEL),
    names: list[str] = typer.Option([], help="each model's name in the report, grafts/ and routed/skills/ (repeat, "
                                             "in the --finetuned order; default: its folder name)",
                                    rich_help_panel=MODEL),
    out: Path = typer.Option(..., help="output folder: merged model, grafts, report.md (refused if it exists)",
                             rich_help_panel=OUTPUT),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (checked before any work)",
                                   rich_help_panel=OUTPUT),
    cache: Optional[Path] = Cache, *, spec, localize, user: UserDataSpec,
) -> None:
    """Merge several fine-tuned models of one base by stitching their grafts; compare with mergekit (report.md)."""
    from skillgraft.pipeline.regions import localizer_options  # noqa: PLC0415
    from skillgraft.verbs.merge import run_merge  # noqa: PLC0415

    localize = localizer_options(spec.localizer, localize.given(), build=lambda cls, v: build(Options(cls), v))
    s = run_merge(pretrained=pretrained, finetuned=finetuned, data=data, eval_data=eval_data, dev_data=dev_data,
                  grafts=grafts, names=names, shared=user, spec=spec, localize=localize, out=out, cache=cache,
                  overwrite=overwrite, mergekit_runner=_injected("mergekit_runner"), progress=True)
    for name, t in s.record["tasks"].items():  # where each task's test rows came from (issue 80)
        console.print(f"{name}: evaluated on {t.get('evaluated_on', '?')}")
    for r in s.rows:
        if r.error is None and r.on_test:
            console.print(f"{r.method:>26} {r.config:<24} mean acc {r.mean_accuracy:.4f} normalized "
                          f"{r.mean_normalized():.4f} | {r.bytes_per_task:,.0f} bytes/task")
    print_routed_keep(s.to_dict())
    where = ('tasks/<task>' if s.mode == 'classifier' else 'model') if s.headline.get("written") else None
    if s.headline.get("written"):
        console.print(f"written: {escape(s.headline['written'])} — {escape(s.headline.get('written_why') or '')}")
    console.print(f"[bold green]done[/] → {out}/report.md (merged model: {f'{out}/{where}' if where else 'none'})")
    _report({"out": out, "report": out / "report.md", **s.to_dict()})


def _injected(name: str):
    """What a caller put in the command's context object (``CliRunner().invoke(app, args, obj={name: …})``): the
    seam through which tests give a verb a stand-in (a fake mergekit runner) without patching a module."""
    try:
        from typer._click.globals import get_current_context  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a typer on the system's click
        from click import get_current_context  # noqa: PLC0415
    ctx = get_current_context(silent=True)
    return (ctx.obj or {}).get(name) if ctx is not None and isinstance(ctx.obj, dict) else None


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
    _report({"task": r.task, "k": r.k, "seed": r.seed, "kind": r.kind, "aggregate": r.aggregate, "out": r.out,
             "ranking": r.scores.ranking(), "scores": r.scores.scores, "parameters": r.scores.num_parameters})


continual_app = App(no_args_is_help=True, help="Forget-free continual learning by grafting (paper §5.2).")
app.add_typer(continual_app, name="continual")


# continual add: fine-tuning and localization options are FinetuneConfig / LocalizeConfig fields (their defaults);
# the localizer's options that share a name with a fine-tuning one get a localize- prefix.
_CONTINUAL_LOCALIZE = {n: f"localize_{n}" for n in ("steps", "lr", "batch_size", "micro_batch", "sigmoid_bias", "l1",
                                                     "seed", "eval_every", "select_on", "optimizer", "init")}


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
                  f"test {added.test['score']:.4f} → {state}/continual.json")
    _report({"state": state, **added.to_dict()})


@continual_app.command("show")
@friendly
def continual_show_cmd(state: Path = typer.Argument(..., help="continual state folder")) -> None:
    """Arrival order, region sizes, owned coordinates and test scores of a continual state."""
    from skillgraft.verbs.continual import read_state  # noqa: PLC0415

    st = read_state(state)
    table = Table(title=f"continual state {state} (base {st.get('base_model')})")
    for col in ("order", "task", "|γ|", "owned", "shared w/ earlier", "test (latest)"):
        table.add_column(col)
    for e in st["tasks"]:
        hist = e.get("test_history") or []
        table.add_row(str(e["order"]), e["task"], str(e.get("region_size")), str(e.get("owned_size")),
                      str(e.get("shared_with_earlier")), f"{hist[-1]['score']:.4f}" if hist else "-")
    console.print(table)
    _report(st)


guard_empty_paths(app)  # every path option refuses '' (an unset variable) by name


def main() -> None:  # pragma: no cover - entry point
    """Entry point of ``skillgraft``: the app under the one-line error contract (:func:`output.run_app`)."""
    run_app(app)


if __name__ == "__main__":  # pragma: no cover
    main()
