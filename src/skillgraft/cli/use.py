"""``skillgraft apply``, ``inspect``, ``export`` and ``serve``: what is done with a graft once learned."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from skillgraft.cli.group import COMMON, DataDir, app
from skillgraft.cli.options import Options, default_of, from_specs
from skillgraft.cli.output import console, exporter_lines, friendly, model_verb, region_table, report as _report
from skillgraft.export.base import ExportSpec, human_size
from skillgraft.spec import COUNT_MAX
from skillgraft.verbs.apply import apply as verbs_apply  # light modules: the options' defaults live there
from skillgraft.verbs.serve import ServeSpec

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
    if result.exported_to is not None:  # what the exporter that wrote it says of it
        exporter_lines(result.exported_to, result.export, out=result.export_dir)
    if result.metrics is not None:
        console.print(result.line())
    _report(result.document())


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
    for line in r.lines():
        console.print(line)
    dist = r.distribution
    for item in region_table(dist, console.width):
        console.print(item)
    if r.out is not None:
        console.print(f"→ {r.out / 'distribution.png'}")
    _report(r.document())


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
    _report(r.document())


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
    _report(r.document())
