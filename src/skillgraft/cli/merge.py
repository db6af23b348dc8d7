"""``skillgraft merge``: several fine-tuned models of one base merged by stitching their grafts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from skillgraft.cli.group import COMMON, Cache, LocalizerFlags, app, injected
from skillgraft.cli.options import Options, build, from_specs
from skillgraft.cli.output import (DATA, MODEL, OUTPUT, console, localizer_flags, model_verb, print_routed_keep,
                                   report as _report)
from skillgraft.cli.config import config_option
from skillgraft.data.spec import UserDataSpec

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

    # resolved once, here (a bad value names its --flag); run_merge takes them typed
    localize = localizer_options(spec.localizer, localize.given(), build=lambda cls, v: build(Options(cls), v))
    s = run_merge(pretrained=pretrained, finetuned=finetuned, data=data, eval_data=eval_data, dev_data=dev_data,
                  grafts=grafts, names=names, shared=user, spec=spec, localize=localize, out=out, cache=cache,
                  overwrite=overwrite, mergekit_runner=injected("mergekit_runner"), progress=True)
    for name, source in s.evaluated_on.items():  # where each task's test rows came from (issue 80)
        console.print(f"{name}: evaluated on {source}")
    for r in s.rows:
        if r.error is None and r.on_test:
            console.print(f"{r.method:>26} {r.config:<24} mean acc {r.mean_accuracy:.4f} normalized "
                          f"{r.mean_normalized():.4f} | {r.bytes_per_task:,.0f} bytes/task")
    print_routed_keep(s.routed_keep)
    if s.written:
        console.print(f"written: {escape(s.written)} — {escape(s.written_why)}")
    console.print(f"[bold green]done[/] → {out}/report.md (merged model: {s.model_folder or 'none'})")
    _report(s.document())
