"""``skillgraft graft``, ``sweep`` and ``localizers``: grafts learned and compared, and the localizers that learn
them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from skillgraft.cli.group import COMMON, Cache, LocalizerFlags, app
from skillgraft.cli.options import Options, build, from_specs
from skillgraft.cli.output import (DATA, KEEP, MODEL, OUTPUT, REPORT, console, friendly, localizer_flags, model_verb,
                                   print_keep, report as _report)
from skillgraft.cli.config import config_option
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.export.base import human_size
from skillgraft.keep.spec import KeepSpec
from skillgraft.graft.localizers import LOCALIZERS, LocalizeConfig
from skillgraft.models.spec import MAX_LENGTH
from skillgraft.pipeline.frontier import FrontierSpec
from skillgraft.spec import COUNT_MAX
from skillgraft.verbs.graft import ReportSpec
from skillgraft.verbs.sweep import SweepSpec

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
    # the chosen localizer's own defaults + the options the user set: resolved once, here, before any work (a bad
    # value is one line naming its --flag); the verb and the report take them typed
    options = localizer_options(report.localizer, localize.given(), build=lambda cls, v: build(Options(cls), v))
    result = run_graft(GraftInputs(finetuned, pretrained, mode, task, max_length, data, user), report=report,
                       localize=options, keep=keep, frontier=frontier, out=out, overwrite=overwrite, cache=cache)
    console.print(f"evaluated on {result.report.evaluated_on}")  # where the test rows came from
    for r in result.shown():  # typed ResultRows: FT, the learned grafts, the keep targets
        size = f", {human_size(r.file_bytes)}" if r.file_bytes else ""
        extra = f" loss {r.loss:.4f}" if r.loss is not None else ""
        console.print(f"{r.model:>22}: {result.report.task} test {r.score:.4f} ECE {r.ece:.4f}{extra} "
                      f"| {r.params:,} params ({r.density:.2e}){size}")
    for line in result.report.fit_lines:
        console.print(line, highlight=False)
    print_keep(result.report.keep, result.report.frontier)
    if result.data_note:
        console.print(f"data: {escape(result.data_note)}")
    if result.labels_note:
        console.print(f"labels: {escape(result.labels_note)}")
    console.print(f"[bold green]done[/] → {result.out}/report.md")
    _report(result.document())


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
    _report(result.document())




@app.command()
@friendly
def localizers(name: Optional[str] = typer.Argument(None, help="a registered localizer: show its options")) -> None:
    """The registered localizers, or one localizer's options with their defaults and help."""
    from rich.table import Column, Table  # noqa: PLC0415

    from skillgraft.verbs.localizers import localizer_info, localizer_rows  # noqa: PLC0415

    def short(verdict: str) -> str:
        return "yes" if verdict == "yes" else "refused"

    if name is None:
        table = Table("what it does", "--candidates", "FSDP", "generative")
        table.columns.insert(0, Column("localizer", no_wrap=True))
        rows = localizer_rows()
        for row in rows:
            table.add_row(row.name, row.summary, short(row.candidates), short(row.sharded), short(row.generative))
        console.print(table)
        _report([r.document() for r in rows])
        console.print("options and reasons of one: skillgraft localizers NAME; "
                      "use: skillgraft graft --localizer NAME …")
        return
    info = localizer_info(name)  # an unknown name is one line listing the known ones
    table = Table("option", "default", "help", title=f"localizer {name!r}: {info.summary}")
    for o in info.options:
        table.add_row(f"--{o.option.replace('_', '-')}", o.default, o.help)
    console.print(table)
    row = info.support
    where = Table("setting", "with the default options", title=f"where {name!r} runs")
    for setting, verdict in (("--candidates", row.candidates), ("FSDP (sharded)", row.sharded),
                             ("generative data", row.generative)):
        where.add_row(setting, verdict)
    console.print(where)
    _report(info.document())

