"""The command line: ``skillgraft <verb>``. Each verb is a thin wrapper over a typed library function.

Options that configure the work come from the typed specs (``clispec.from_specs``): their names, defaults,
ranges and help are declared once, on the spec's fields.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skillgraft.clispec import Options, build, from_specs
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.fisher.fisher import FisherConfig
from skillgraft.graft.export import ExportSpec
from skillgraft.graft.keep import KeepSpec
from skillgraft.graft.localizers import LOCALIZERS, LocalizeConfig, options_union

LocalizerFlags = options_union()  # every registered localizer's options; the chosen one validates what is set
from skillgraft.models.spec import ModelSpec
from skillgraft.pipeline.frontier import FrontierSpec
from skillgraft.recipes.graft import ReportSpec, SweepSpec
from skillgraft.spec import COUNT_MAX, SEED_MAX
from skillgraft.train.config import FinetuneConfig

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find where a fine-tuned model keeps a task's skill, store it as a sparse graft, use it.")
console = Console(stderr=False, soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def one_line_error(e: BaseException) -> str | None:
    """The user-facing line for an error users or their machine can cause (a SkillgraftError, an I/O error
    naming its path: ``<path>: no space left on device``); None for a bug, which keeps its traceback."""
    from skillgraft.io import describe_io_error  # noqa: PLC0415

    if isinstance(e, SkillgraftError):
        from skillgraft.spec import readable_bounds  # noqa: PLC0415

        return readable_bounds(str(e))
    return describe_io_error(e)


def friendly(fn):
    """Turn SkillgraftError and I/O errors into one red line and exit code 2 (no traceback; docs/reliability.md).

    ``SKILLGRAFT_DEBUG=1`` re-raises them with their traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            line = one_line_error(e)
            if line is None or os.environ.get("SKILLGRAFT_DEBUG") == "1":
                raise
            err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
            raise typer.Exit(2) from None

    return wrapper


def _warnings_to_console() -> None:
    def show(message, category, filename, lineno, file=None, line=None):
        err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)

    warnings.showwarning = show


_warnings_to_console()

DataDir = typer.Option(None, "--data-dir", help="data root (default: $SKILLGRAFT_DATA, ./data, ../shared/data)")


@app.command()
@friendly
def tasks(data_dir: Optional[Path] = DataDir,
          task_file: Optional[Path] = typer.Option(None, help="YAML file of extra tasks to register first")) -> None:
    """List every registered task, where its data was found, and its split sizes."""
    from skillgraft.data import TASKS, load_task_yaml  # noqa: PLC0415
    from skillgraft.data.loading import find_split_file, read_file, resolve_data_dir  # noqa: PLC0415

    if task_file:
        load_task_yaml(task_file)
    table = Table(title="skillgraft tasks")
    for col in ("task", "kind", "labels", "metric", "data", "train", "dev", "test"):
        table.add_column(col)
    for task in TASKS.values():
        try:
            root = resolve_data_dir(data_dir, task)
        except SkillgraftError:
            table.add_row(task.name, task.kind, str(task.num_labels), task.metric, "[red]not found[/]", "-", "-", "-")
            continue
        sizes = []
        for split in ("train", "dev", "test"):
            path = find_split_file(task, split, root)
            sizes.append(str(len(read_file(task, path))) if path else "-")
        table.add_row(task.name, task.kind, str(task.num_labels), task.metric, str(root / task.data_folder), *sizes)
    console.print(table)


@app.command()
@friendly
@from_specs(data=Options(DataSpec), model=Options(ModelSpec),
            finetune=Options(FinetuneConfig, rename={"seed": "model_seed"}, skip=("layers",)))
def finetune(
    layers: Optional[str] = typer.Option(None, help="train only these blocks: '0,3,5', or fim:top-K / fim:bottom-K / "
                                                    "random-K (surgical fine-tuning)"),
    out: Optional[Path] = typer.Option(None, help="run directory (default: runs/ft-<task>-<k>-<seed>)"),
    overwrite: bool = typer.Option(False, help="replace an existing run directory whole (checked before training)"),
    *, data: DataSpec, model: ModelSpec, finetune: FinetuneConfig,
) -> None:
    """Fine-tune a model on a k-shot task and write a run directory (model, config, metrics, plots)."""
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.train import run_finetune  # noqa: PLC0415

    out = check_target(out or Path("runs") / f"ft-{data.task}-{data.k}-{data.seed}", overwrite)  # before any work
    if layers is not None:
        finetune = finetune.replace(layers=parse_layers(layers, task=data.task, model=model.model, mode=model.mode,
                                                        k=data.k, seed=data.seed, data_dir=data.data_dir))
    m = run_finetune(data, out, model=model, finetune=finetune, overwrite=overwrite)
    if "test" in m:
        t = m["test"]
        extra = f" F1 {t['f1']:.4f}" if "f1" in t else ""
        console.print(f"[bold green]done[/] {m['task']} k={data.k} seed={data.seed}: test acc {t['accuracy']:.4f}"
                      f"{extra} ECE {t['ece']:.4f} | {m['steps']} steps in {m['train_seconds']:.0f}s "
                      f"({m['train_examples_per_second']:.1f} ex/s) → {out}")


def parse_layers(spec: Optional[str], **context) -> Optional[list[int]]:
    """'0,3,5' → [0, 3, 5]; 'fim:top-2' etc. are resolved by the Fisher module."""
    if spec is None:
        return None
    if ":" in spec or spec.startswith("random"):
        from skillgraft.fisher.surgical import resolve_layer_spec  # noqa: PLC0415

        return resolve_layer_spec(spec, **context)
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SkillgraftError(f"--layers {spec!r}: expected block indices like '0,3,5' or fim:top-K") from None


@app.command()
@friendly
@from_specs(user=Options(UserDataSpec, skip=("k", "seed", "eval_fraction", "test_limit")))
def evaluate(
    model_dir: Path = typer.Argument(..., help="a model folder: a skillgraft run (or its model/), or any Hugging Face "
                                                "checkpoint (sequence classifier, masked LM, causal LM) or hub name"),
    task: Optional[str] = typer.Option(None, help="task to evaluate on (default: the model's task)"),
    split: str = typer.Option("test", help="train | dev | test"),
    mode: Optional[str] = typer.Option(None, help="a Hugging Face checkpoint: classifier | prompt | causal | generative "
                                                  "(default: from its class and the data)"),
    data_dir: Optional[Path] = DataDir,
    limit: Optional[int] = typer.Option(None, min=1, max=COUNT_MAX, help="first N examples only"),
    out: Optional[Path] = typer.Option(None, help="write metrics JSON + plots into this folder"),
    *, user: UserDataSpec,
) -> None:
    """Evaluate a model: accuracy/F1, ECE (generative data: completion loss, exact match), (with --out) plots.

    A Hugging Face checkpoint is evaluated on every row of --eval-data (else of --data), or on --task's split.
    """
    from skillgraft.data import get_task, load_split  # noqa: PLC0415
    from skillgraft.evaluate import evaluate as run_eval, labels_of  # noqa: PLC0415
    from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram  # noqa: PLC0415
    from skillgraft.finite import refuse_non_finite_model  # noqa: PLC0415
    from skillgraft.io import write_json  # noqa: PLC0415
    from skillgraft.models import Scorer  # noqa: PLC0415
    from skillgraft.models.scorer import SCORER_CONFIG  # noqa: PLC0415

    folder = model_dir / "model" if (model_dir / "model").is_dir() else model_dir
    if (folder / SCORER_CONFIG).is_file() and user.data is None:
        scorer = Scorer.from_pretrained(folder, task=task)
        examples = load_split(get_task(task or scorer.task.name) if task else scorer.task, split, data_dir)[:limit]
    else:
        from skillgraft.pipeline.setup import open_checkpoint  # noqa: PLC0415

        if user.data is None and task is None:
            raise SkillgraftError(f"{model_dir}: a Hugging Face checkpoint needs data: --data FILE (with its field names) "
                                  "or --task NAME")
        scorer, examples, note = open_checkpoint(str(model_dir), user if user.data is not None else task, mode=mode,
                                                 split=split, data_dir=data_dir)
        examples = examples[:limit]
        split = "data" if user.data is not None else split
        if note:
            console.print(f"labels: {escape(note)}")
    refuse_non_finite_model(scorer, str(model_dir), "its scores would be meaningless (its fine-tuning diverged, "
                                                    "or the file is damaged)")
    metrics, probs = run_eval(scorer, examples, progress=split)
    if "loss" in metrics:  # generative data
        if out:
            write_json(out / "metrics.json", metrics)
        em = f" exact match {metrics['exact_match']:.4f}" if "exact_match" in metrics else ""
        console.print(f"{scorer.task.name} {split} (n={metrics['n']}): completion loss {metrics['loss']:.4f} token "
                      f"accuracy {metrics['token_accuracy']:.4f}{em}")
        return
    if out:
        from skillgraft.io import atomic_files  # noqa: PLC0415

        with atomic_files(out) as tmp:  # the three files, or none of them
            write_json(tmp / "metrics.json", metrics)
            confidence_histogram({"model": probs}, tmp / "confidence.png")
            reliability_diagram({"model": (probs, labels_of(examples))}, tmp / "reliability.png")
    console.print(f"{scorer.task.name} {split} (n={metrics['n']}): acc {metrics['accuracy']:.4f} "
                  f"ECE {metrics['ece']:.4f}" + (f" F1 {metrics['f1']:.4f}" if "f1" in metrics else ""))


@app.command("run")
@friendly
def run_cmd(
    recipe_file: Path = typer.Argument(..., help="a recipe YAML (see recipes/ and docs/recipes.md)"),
    out: Optional[Path] = typer.Option(None, help="run directory (default: runs/<yaml name>)"),
    cache: Optional[Path] = typer.Option(None, help="store of finished stages (default: the recipe's cache_dir, "
                                                    "$SKILLGRAFT_CACHE or runs/cache)"),
    overwrite: bool = typer.Option(False, help="replace an existing run directory whole (checked before any work)"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress",
                                            help="progress bars for every stage (default: the recipe's `progress:`)"),
) -> None:
    """Run an experiment described by a recipe YAML; writes metrics, CSVs, plots and report.md."""
    from skillgraft.recipes import run_recipe  # noqa: PLC0415

    path = run_recipe(recipe_file, out, cache=cache, overwrite=overwrite,
                      overrides=None if progress is None else {"progress": progress})
    console.print(f"[bold green]done[/] {recipe_file} → {path}/report.md")


def _report_folder(out: Path, overwrite: bool, cache: Optional[Path], write) -> None:
    """Run ``write(RunDir)`` into a temporary sibling of ``out``; it becomes ``out`` only when complete."""
    from skillgraft.io import atomic_dir  # noqa: PLC0415
    from skillgraft.pipeline import RunDir, Store  # noqa: PLC0415

    with atomic_dir(out, overwrite=overwrite) as tmp:
        write(RunDir(tmp, Store(cache)))


Cache = typer.Option(None, help="store of finished stages (default: $SKILLGRAFT_CACHE or runs/cache)")


def _inputs(cache: Optional[Path], inputs: dict) -> dict:
    """What a verb reads or fills, for check_target: its store (the default one too) and its inputs."""
    from skillgraft.pipeline.store import Store  # noqa: PLC0415

    return {"--cache": Store(cache).root, **inputs}


@app.command()
@friendly
@from_specs(localize=Options(LocalizerFlags), report=Options(ReportSpec, help={"localizer": (
                f"localizer of the grafts: {', '.join(LOCALIZERS)}; its own options: `skillgraft localizers NAME`")}),
            data=Options(DataSpec, skip=("task", "k", "seed", "test_limit")),
            user=Options(UserDataSpec, rename={"seed": "data_seed"}), keep=Options(KeepSpec),
            frontier=Options(FrontierSpec))
def graft(
    finetuned: Path = typer.Option(..., help="the fine-tuned model: a Hugging Face checkpoint (hub name or folder saved "
                                             "by plain transformers) with --pretrained, or a skillgraft run directory"),
    pretrained: Optional[str] = typer.Option(None, help="the checkpoint --finetuned was fine-tuned from (hub name or "
                                                        "folder); needed unless --finetuned is a skillgraft run"),
    mode: Optional[str] = typer.Option(None, help="how to score a checkpoint pair: classifier | prompt | causal | "
                                                  "generative (default: from the fine-tuned checkpoint's class)"),
    task: Optional[str] = typer.Option(None, help="a registered task to graft a checkpoint pair on, instead of --data"),
    max_length: int = typer.Option(128, min=8, max=COUNT_MAX, help="max tokens per example (checkpoint pairs)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: <run>/graft, or runs/graft-<checkpoint name>)"),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (checked before any work)"),
    cache: Optional[Path] = Cache,
    *, localize: LocalizerFlags, report: ReportSpec, data: DataSpec, user: UserDataSpec, keep: KeepSpec,
    frontier: FrontierSpec,
) -> None:
    """Learn sparse grafts from a pre-trained + fine-tuned pair and compare them (writes report.md).

    --keep 0.95,0.99: the smallest graft keeping each share of FT's score (on a selection split); --frontier: share of
    FT vs density against closed-form peers (frontier.csv, frontier.png)."""
    from skillgraft.heap import return_large_blocks  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.pipeline.setup import from_pair, from_run, is_run_dir  # noqa: PLC0415
    from skillgraft.recipes.graft import graft_report, localizer_options, releases_ft  # noqa: PLC0415

    return_large_blocks()  # tensor-sized temporaries freed go back to the OS at once (the peak is the work's)
    apart = _inputs(cache, {"--finetuned": finetuned, "--pretrained": pretrained, "--data": user.data,
                            "--eval-data": user.eval_data, "--data-dir": data.data_dir})  # never inside --out
    # the chosen localizer's own defaults + the options the user set; checked before any work
    localize = localizer_options(report.localizer, localize.given(), build=lambda cls, v: build(Options(cls), v))
    if is_run_dir(finetuned) or (pretrained is None and not (finetuned / "config.json").is_file()):
        if user.data is not None or task is not None:
            raise SkillgraftError(f"--finetuned {finetuned} is a skillgraft run: it grafts on its own task data "
                                  "(drop --data/--task, or give a Hugging Face checkpoint with --pretrained)")
        out = check_target(out or finetuned / "graft", overwrite, apart)
        setup = from_run(finetuned, data_dir=data.data_dir, test_limit=user.test_limit)
    else:
        if pretrained is None:
            raise SkillgraftError(f"--finetuned {finetuned} is a Hugging Face checkpoint: give --pretrained, the "
                                  "checkpoint it was fine-tuned from")
        if user.data is None and task is None:
            raise SkillgraftError("a checkpoint pair needs data: --data FILE (with its field names) or --task NAME")
        if user.data is not None and task is not None:
            raise SkillgraftError("give --data FILE or --task NAME, not both")
        out = check_target(out or Path("runs") / f"graft-{finetuned.name or 'model'}", overwrite, apart)  # before work
        spec = user if user.data is not None else DataSpec.build(
            {"task": task, "k": user.k or 64, "seed": user.seed, "data_dir": data.data_dir,
             "test_limit": user.test_limit}, where="--task")
        setup = from_pair(pretrained, str(finetuned), spec, mode=mode, max_length=max_length, data_dir=data.data_dir,
                          lean=releases_ft(report, keep, frontier))  # θ_ft scored, released, then read from files
    result = {}

    def write(run) -> None:
        result.update(graft_report(setup, run, report, localize, keep=keep, frontier=frontier))
        if setup.labels_note or setup.graft_metadata.to_dict():
            text = (run.path / "report.md").read_text()
            lines = ["", "## Models and data", "",
                     f"- pre-trained: `{setup.pre.base_model}`; fine-tuned: `{setup.ft.base_model}`; scored as "
                     f"`{setup.pre.mode}`"]
            if setup.data_files:
                more = ", …" if len(setup.data_files) > 6 else ""
                shown = ", ".join(f"`{f}`" for f in setup.data_files[:6]) + more
                lines.append(f"- data: {setup.data_note or shown}; {len(setup.data.train)} examples to localize on, "
                             f"{len(setup.test)} held out" + (f" (files: {shown})" if setup.data_note else ""))
            if setup.labels_note:
                lines.append(f"- labels: {setup.labels_note}")
            run.report(text + "\n".join(lines) + "\n")

    _report_folder(out, overwrite, cache, write)
    for r in result["rows"]:
        if r["kind"] in ("graft", "ft", "keep"):
            size = f", {r['file_bytes'] / 1024:.1f} KiB" if r.get("file_bytes") else ""
            extra = f" loss {r['loss']:.4f}" if "loss" in r else ""
            console.print(f"{r['model']:>22}: {result['task']} {r['score']:.4f} ECE {r['ece']:.4f}{extra} "
                          f"| {r['params']:,} params ({r['density']:.2e}){size}")
    _print_keep(result)
    if setup.data_note:
        console.print(f"data: {escape(setup.data_note)}")
    if setup.labels_note:
        console.print(f"labels: {escape(setup.labels_note)}")
    console.print(f"[bold green]done[/] → {out}/report.md")


def _print_keep(result: dict) -> None:
    """One line per keep target (size found, selection and test shares, cost) and per frontier keep density."""
    keep = result.get("keep")
    for t in (keep or {}).get("targets", []):
        size = t["size"] if t["reached"] else t["best_size"]
        head = (f"keep {t['target']:g}: {size:,} params ({size / t['universe']:.2e})" if t["reached"] else
                f"keep {t['target']:g}: [yellow]not reached[/] by any size; best {t['best_share']:.3f} at {size:,}")
        test = "" if t.get("test_share") is None else f", test share {t['test_share']:.3f}"
        console.print(f"{head}, selection share {t['selection_share'] or t['best_share']:.3f}{test} "
                      f"| {t['probe_count']} probes, {t['search_seconds']:.0f} s")
    if keep:
        console.print(f"keep selection split: {escape(keep['selection'])}")
    for k in (result.get("frontier") or {}).get("keep", []):
        need = f"density {k['density']:.2e}" if k["reached"] else f"not reached (best {k['best_share']:.3f})"
        console.print(f"frontier {escape(k['method'])} keep {k['target']:g}: {need}, test share {k['test_share']:.3f}")


@app.command()
@friendly
def apply(
    graft_dir: Path = typer.Argument(..., help="a graft folder (graft_config.json + graft.safetensors)"),
    model: Optional[str] = typer.Option(None, help="base model (default: the one recorded in the graft)"),
    task: Optional[str] = typer.Option(None, help="task (default: the graft's task)"),
    mode: str = typer.Option("head", help="scorer mode the graft was learned with"),
    export: Optional[Path] = typer.Option(None, help="write the grafted model as a Hugging Face checkpoint here"),
    overwrite: bool = typer.Option(False, help="replace an existing --export folder (it is never mixed into)"),
    evaluate_on: Optional[str] = typer.Option("test", help="split to evaluate on (empty: skip)"),
    limit: Optional[int] = typer.Option(None, min=1, max=COUNT_MAX, help="first N examples only"),
    force: bool = typer.Option(False, help="apply even if the base fingerprint differs or the graft records none"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Apply a graft to its base model: evaluate it and/or export the grafted model in the user's own class."""
    from skillgraft.data import load_split  # noqa: PLC0415
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.export import export_hf, graft_task  # noqa: PLC0415
    from skillgraft.graft.scoring import evaluate_graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.models import build_scorer  # noqa: PLC0415

    if export:
        check_target(export, overwrite, {"graft": graft_dir, "--model": model, "--data-dir": data_dir})  # before work
    g = Graft.from_pretrained(graft_dir)
    task = task or graft_task(g)
    if not task:
        raise SkillgraftError(f"{graft_dir}: the graft records no task; pass --task")
    ft_mode = g.metadata.mode or mode
    pre = build_scorer(model or g.base_model or None, task, ft_mode)
    if export:
        s = export_hf(g, pre, export, force=force, overwrite=overwrite)
        if s["complete"]:
            console.print(f"exported grafted model → {export} (loads with transformers.{s['loads_with']})")
        else:
            err.print(f"[yellow]warning:[/] exported → {export}, but head mode has no Hugging Face class: the task "
                      "head is in head.safetensors (marked incomplete; load with skillgraft's Scorer.from_pretrained)")
    if evaluate_on:
        recorded = g.metadata.user_data
        if recorded:  # a checkpoint pair's graft: the held-out rows of the user's data it was learned on
            from skillgraft.data.spec import UserDataSpec  # noqa: PLC0415

            spec = UserDataSpec.build(recorded, where=f"{graft_dir} metadata user_data")
            examples = spec.load(pre.task.labels if ft_mode == "classifier" else None).test[:limit]
        else:
            examples = load_split(task, evaluate_on, data_dir)[:limit]
        m, _ = evaluate_graft(pre, g, examples, force=force, progress=evaluate_on)
        score = f"acc {m['accuracy']:.4f}" if "accuracy" in m else f"token accuracy {m['token_accuracy']:.4f}"
        extra = f" completion loss {m['loss']:.4f}" if "loss" in m else ""
        console.print(f"graft {graft_dir}: {pre.task.name} {'held-out' if recorded else evaluate_on} (n={m['n']}) "
                      f"{score} ECE {m['ece']:.4f}{extra} | {g.size:,} params ({g.region.density:.2e})")


@app.command()
@friendly
def inspect(
    graft_dir: Path = typer.Argument(..., help="a graft folder, or a PEFT SHiRA adapter folder"),
    out: Optional[Path] = typer.Option(None, help="write the distribution PNG + JSON here (default: the graft folder)"),
    model: Optional[str] = typer.Option(None, help="base model of a PEFT adapter (default: its "
                                                   "base_model_name_or_path)"),
    compare: Optional[Path] = typer.Option(None, help="another graft or SHiRA adapter folder: overlap and IoU"),
) -> None:
    """Size, density and where a graft's parameters sit (per layer × module type; paper Figs. 9/10)."""
    from skillgraft.graft.export import read_graft_or_adapter  # noqa: PLC0415
    from skillgraft.graft.inspect import distribution, plot_distribution  # noqa: PLC0415
    from skillgraft.io import write_json  # noqa: PLC0415

    g, weights = read_graft_or_adapter(graft_dir, model)
    dist = distribution(g.region)
    size = weights.stat().st_size
    console.print(f"[bold]{graft_dir}[/]: {g.size:,} grafted parameters, density {g.region.density:.3e} of "
                  f"{g.region.universe_size:,} graftable; carried {g.carried_size:,}; file {size / 1024:.1f} KiB "
                  f"({size / max(1, g.size):.1f} bytes/parameter); base {g.base_model} [{g.base_fingerprint[:12]}]")
    if compare is not None:
        other = read_graft_or_adapter(compare, model)[0].region
        console.print(f"vs {compare}: shared {len(g.region & other):,}; overlap |A∩B|/|B| "
                      f"{g.region.overlap(other):.4f}; |A∩B|/|A| {other.overlap(g.region):.4f}; "
                      f"IoU {g.region.iou(other):.4f}")
    table = Table(title="region by layer × module type")
    table.add_column("layer")
    for col in dist["module_types"]:
        table.add_column(col, justify="right")
    table.add_column("total", justify="right")
    for layer, row in dist["table"].items():
        table.add_row(layer, *[str(row.get(c, 0)) for c in dist["module_types"]], str(sum(row.values())))
    console.print(table)
    out = out or graft_dir
    from skillgraft.io import atomic_files  # noqa: PLC0415

    with atomic_files(out) as tmp:  # both files, or neither
        write_json(tmp / "distribution.json", dist)
        plot_distribution(dist, tmp / "distribution.png", title=f"{g.metadata.task or ''} graft")
    console.print(f"→ {out / 'distribution.png'}")


@app.command("export")
@friendly
@from_specs(spec=Options(ExportSpec))
def export_cmd(
    graft_dir: Path = typer.Argument(..., help="a graft folder (graft_config.json + graft.safetensors)"),
    out: Path = typer.Option(..., help="output folder (refused if it exists, unless --overwrite)"),
    *, spec: ExportSpec,
) -> None:
    """Write a graft as a PEFT SHiRA adapter, a plain safetensors delta or an HF checkpoint (docs/export.md)."""
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.export import export_graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415

    check_target(out, spec.overwrite, {"graft": graft_dir, "--model": spec.model})  # before any work
    s = export_graft(Graft.from_pretrained(graft_dir), out, spec)
    routes = s.get("routes", {})
    if "shira" in routes:
        sh, ms, ts = routes["shira"], routes["modules_to_save"], routes["tensors"]
        console.print(f"SHiRA: {sh['coordinates']:,} coordinates in {sh['modules']} Linear weight(s) "
                      f"(+{sh['padding_entries']:,} zero entries, r={sh['r']})"
                      + (f", zero placeholder target {sh['placeholder']}" if sh["placeholder"] else ""))
        if ms["modules"]:
            console.print(f"modules_to_save: {ms['coordinates']:,} coordinates in {len(ms['modules'])} module(s) "
                          f"stored whole ({ms['stored_parameters']:,} parameters)")
            if ms["stored_parameters"] > 20 * max(1, s["coordinates"]):
                console.print("[yellow]hint:[/] --non-linear tensors stores only the grafted tensors (biases and "
                              "norms, not whole modules); --to delta stores only the coordinates")
        if ts["tensors"]:
            console.print(f"tensors: {ts['coordinates']:,} coordinates in {len(ts['tensors'])} tensor(s) stored whole "
                          f"({ts['stored_parameters']:,} parameters; loaded into the base model, not undone by "
                          "disabling the adapter)")
    head_info = routes.get("head") or s.get("head")
    if head_info:
        console.print(f"[yellow]task head ({head_info['parameters']:,} parameters) written separately to "
                      f"{out}/skillgraft_head.safetensors: the adapter alone outputs hidden states, not labels[/]")
    if s.get("inexact"):
        err.print(f"[yellow]warning:[/] {s['inexact']} coordinate(s) are not reproduced bit for bit by the additive "
                  "form (within an ulp)")
    size = f" ({s['bytes'] / 1024:.1f} KiB)" if "bytes" in s else ""
    console.print(f"[bold green]exported[/] {s['coordinates']:,} grafted coordinates as {s['to']} → {out}{size}")


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
        for row in support_table():
            table.add_row(row.name, LOCALIZERS[row.name].summary or "", short(row.candidates), short(row.sharded),
                          short(row.generative))
        console.print(table)
        console.print("options and reasons of one: skillgraft localizers NAME; use: skillgraft graft --localizer NAME …")
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


@app.command()
@friendly
@from_specs(sweep=Options(SweepSpec), localize=Options(LocalizeConfig, skip=("budgets",)),
            data=Options(DataSpec, skip=("task", "k", "seed")), frontier=Options(FrontierSpec))
def sweep(
    finetuned: Path = typer.Option(..., help="a fine-tuning run directory"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: <finetuned>/sweep)"),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (checked before any work)"),
    cache: Optional[Path] = Cache,
    *, sweep: SweepSpec, localize: LocalizeConfig, data: DataSpec, frontier: FrontierSpec,
) -> None:
    """Accuracy vs region size for learned, top-movement and random regions (paper Figs. 2/4): CSV + PNG.

    --frontier also draws share of FT vs density against closed-form peers (frontier.csv, frontier.png)."""
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.pipeline.setup import from_run  # noqa: PLC0415
    from skillgraft.recipes.graft import sweep_report  # noqa: PLC0415

    out = check_target(out or finetuned / "sweep", overwrite,
                       _inputs(cache, {"--finetuned": finetuned, "--data-dir": data.data_dir}))
    setup = from_run(finetuned, data_dir=data.data_dir, test_limit=data.test_limit)
    rows: list = []
    found: dict = {}

    def write(run) -> None:
        rows.extend(sweep_report(setup, run, sweep, localize))
        if frontier.frontier:
            from skillgraft.pipeline.frontier import frontier_report  # noqa: PLC0415

            found["frontier"] = frontier_report(setup, run, frontier, "learned", localize)

    _report_folder(out, overwrite, cache, write)
    for r in rows:
        console.print(f"{r['localizer']:>13} {float(r['level']):.0e}: {r['score']:.4f} (ECE {r['ece']:.4f})")
    _print_keep(found)
    console.print(f"[bold green]done[/] → {out}/sweep.csv, {out}/sweep.png")


def _merge_specs():
    from skillgraft.recipes.merge import MergeSpec  # noqa: PLC0415

    return from_specs(spec=Options(MergeSpec), localize=Options(LocalizerFlags, skip=("budgets",)),
                      user=Options(UserDataSpec, rename={"seed": "data_seed"},
                                   skip=("data", "eval_data", "data_config", "data_split", "eval_split")))


@app.command()
@friendly
@_merge_specs()
def merge(
    pretrained: Optional[str] = typer.Option(None, help="the checkpoint every model was fine-tuned from"),
    finetuned: list[str] = typer.Option([], help="a fine-tuned Hugging Face checkpoint (repeat: once per model)"),
    data: list[str] = typer.Option([], help="each model's data, in the --finetuned order (repeat); a .yaml file is a "
                                            "data spec with that model's own fields (data, eval_data, text_field, …)"),
    eval_data: list[str] = typer.Option([], help="each model's held-out test rows (repeat; default: see --data)"),
    dev_data: list[str] = typer.Option([], help="each model's dev rows for the mergekit grid (repeat; default: a "
                                                "seeded --dev-fraction of its --data)"),
    grafts: list[str] = typer.Option([], help="use these grafts instead of localizing (repeat: once per model)"),
    out: Path = typer.Option(..., help="output folder: merged model, grafts, report.md (refused if it exists)"),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (checked before any work)"),
    cache: Optional[Path] = Cache,
    *, spec, localize, user: UserDataSpec,
) -> None:
    """Merge several fine-tuned models of one base by stitching their grafts; compare with mergekit (report.md)."""
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.pipeline import Store  # noqa: PLC0415
    from skillgraft.recipes.graft import localizer_options  # noqa: PLC0415
    from skillgraft.recipes.merge import merge_models, resolve_inputs  # noqa: PLC0415

    check_target(out, overwrite)
    localize = localizer_options(spec.localizer, localize.given(), build=lambda cls, v: build(Options(cls), v))
    pretrained, inputs = resolve_inputs(pretrained=pretrained, finetuned=finetuned, data=data, eval_data=eval_data,
                                        dev_data=dev_data, grafts=grafts, shared=user)
    s = merge_models(pretrained, inputs, spec, localize, out, store=Store(cache), overwrite=overwrite)
    for r in s["rows"]:
        if r.get("on_test"):
            console.print(f"{r['method']:>26} {r['config']:<24} mean acc {r['mean_accuracy']:.4f} normalized "
                          f"{r['mean_normalized']:.4f} | {r['bytes_per_task']:,.0f} bytes/task")
    console.print(f"[bold green]done[/] → {out}/report.md (merged model: {out}/"
                  f"{'tasks/<task>' if s['mode'] == 'classifier' else 'model'})")


@app.command()
@friendly
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="demo folder (replaced whole when the run is complete)"),
    seed: int = typer.Option(42, min=0, max=SEED_MAX, help="data seed"),
    data_dir: Optional[Path] = DataDir,
    cache: Optional[Path] = Cache,
) -> None:
    """The main job: fine-tune MiniLM 64-shot on SST-2, learn grafts at 3 sizes, compare, write report.md."""
    from skillgraft.recipes.graft import run_demo  # noqa: PLC0415

    report = run_demo(out, seed=seed, data_dir=data_dir, cache=cache)
    console.print(f"[bold green]done[/] → {report}")


@app.command()
@friendly
@from_specs(data=Options(DataSpec, skip=("test_limit",)), model=Options(ModelSpec),
            fisher=Options(FisherConfig, rename={"n_examples": "n", "seed": "fisher_seed"}))
def fim(
    aggregate: Literal["sum", "frobenius"] = typer.Option("sum", help="block score: sum (of Fisher entries) | "
                                                                      "frobenius (reference code)"),
    normalize: bool = typer.Option(False, help="divide each block's score by its parameter count"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: runs/fim-<task>-<k>-<seed>)"),
    *, data: DataSpec, model: ModelSpec, fisher: FisherConfig,
) -> None:
    """Per-layer FIM scores of the pre-trained model (surgical fine-tuning): ranking table, fim.json, fim.png."""
    from skillgraft.finite import refuse_non_finite_model  # noqa: PLC0415
    from skillgraft.fisher import fim_layer_scores  # noqa: PLC0415
    from skillgraft.fisher.plots import layer_scores_bar  # noqa: PLC0415
    from skillgraft.io import write_json  # noqa: PLC0415

    k, seed, n_examples, kind, config = data.k, data.seed, fisher.n_examples, fisher.kind, fisher
    data = data.load()
    scorer = model.scorer(data.task)
    refuse_non_finite_model(scorer, scorer.base_model, "its Fisher scores would be meaningless")
    scores = fim_layer_scores(scorer, data.train, aggregate=aggregate, normalize=normalize, config=config,
                              progress="fisher")
    ranks = scores.rank_of()
    table = Table(title=f"FIM layer ranking: {data.task.name} k={k} seed={seed} ({kind}, {aggregate})")
    for col in ("block", "score", "rank", "parameters"):
        table.add_column(col, justify="right")
    for i in scores.ranking():
        table.add_row(str(i), f"{scores.scores[i]:.4g}", str(ranks[i] + 1), f"{scores.num_parameters[i]:,}")
    console.print(table)
    out = out or Path("runs") / f"fim-{data.task.name}-{k}-{seed}"
    n_used = min(len(data.train), n_examples or len(data.train))
    from skillgraft.io import atomic_files  # noqa: PLC0415

    with atomic_files(out) as tmp:  # both files, or neither
        write_json(tmp / "fim.json", {"task": data.task.name, "k": k, "seed": seed, "model": scorer.base_model,
                                      "mode": model.mode, "n_examples": n_used, **scores.to_dict()})
        layer_scores_bar(scores, tmp / "fim.png", title=f"{data.task.name} FIM per block (N={n_used})")
    console.print(f"top → bottom: {scores.ranking()}  → {out}/fim.json, {out}/fim.png")


continual_app = typer.Typer(no_args_is_help=True, help="Forget-free continual learning by grafting (paper §5.2).")
app.add_typer(continual_app, name="continual")


# continual add: fine-tuning and localization options are FinetuneConfig / LocalizeConfig fields (their defaults);
# the localizer's options that share a name with a fine-tuning one get a localize- prefix.
_CONTINUAL_LOCALIZE = {n: f"localize_{n}" for n in ("steps", "lr", "batch_size", "micro_batch", "sigmoid_bias", "l1",
                                                     "seed", "eval_every", "select_on")}


@continual_app.command("add")
@friendly
@from_specs(finetune=Options(FinetuneConfig, rename={"seed": "model_seed"}, skip=("layers",)),
            localize=Options(LocalizeConfig, rename=_CONTINUAL_LOCALIZE, skip=("budgets", "graftable")))
def continual_add_cmd(
    state: Path = typer.Option(..., help="continual state folder (created on first use)"),
    task: str = typer.Option(..., help="the task that arrives now"),
    k: int = typer.Option(16, min=1, max=COUNT_MAX, help="examples per label"),
    seed: int = typer.Option(13, min=0, max=SEED_MAX, help="data seed"),
    data_dir: Optional[Path] = DataDir,
    model: Optional[str] = typer.Option(None, help="base model (only when creating the state; default MiniLM)"),
    mode: str = typer.Option("head", help="head | prompt (only when creating the state)"),
    region: Optional[Path] = typer.Option(None, help="γ_task: a region or graft folder (default: learn it from a "
                                                     "single-task fine-tune + localize)"),
    init: str = typer.Option("current", help="current (paper: train owned coordinates from the current model) | "
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
    from skillgraft.pipeline.continual import continual_add  # noqa: PLC0415

    entry = continual_add(state, task, k=k, seed=seed, data_dir=data_dir, model=model, mode=mode, region=region,
                          finetune_config=finetune, localize_config=localize, init=init, test_limit=test_limit,
                          cache=cache)
    console.print(f"[bold green]added[/] {entry['task']} as task #{entry['order']}: |γ|={entry['region_size']}, "
                  f"owned {entry['owned_size']} (shared with earlier {entry['shared_with_earlier']}); "
                  f"test {entry['test']['score']:.4f} → {state}/continual.json")


@continual_app.command("show")
@friendly
def continual_show_cmd(state: Path = typer.Argument(..., help="continual state folder")) -> None:
    """Arrival order, region sizes, owned coordinates and test scores of a continual state."""
    from skillgraft.io import read_json  # noqa: PLC0415

    if not (state / "continual.json").is_file():
        raise SkillgraftError(f"{state}: no continual.json; not a continual state folder")
    st = read_json(state / "continual.json", required=("tasks",), what="continual state")
    table = Table(title=f"continual state {state} (base {st.get('base_model')})")
    for col in ("order", "task", "|γ|", "owned", "shared w/ earlier", "test (latest)"):
        table.add_column(col)
    for e in st["tasks"]:
        hist = e.get("test_history") or []
        table.add_row(str(e["order"]), e["task"], str(e.get("region_size")), str(e.get("owned_size")),
                      str(e.get("shared_with_earlier")), f"{hist[-1]['score']:.4f}" if hist else "-")
    console.print(table)


def interrupted_line(signum: int, argv: list[str]) -> str:
    """The one line for a verb stopped by Ctrl-C, SIGTERM or SIGHUP: which verb, and what was written."""
    import signal  # noqa: PLC0415

    from skillgraft.io import written  # noqa: PLC0415

    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    words = [a for a in argv[:2] if not a.startswith("-")]
    verb = " ".join(words[:2] if words[:1] == ["continual"] else words[:1])
    done = written()
    what = "nothing was written" if not done else (f"nothing else was written (complete before it: "
                                                    f"{', '.join(str(p) for p in done[-3:])})")
    return f"interrupted ({name}) during skillgraft {verb}: {what}"


def main() -> None:  # pragma: no cover - entry point
    """Entry point of ``skillgraft``: runs the app; Ctrl-C, SIGTERM and SIGHUP clean up, print one line and exit
    128 + the signal's number (130, 143, 129)."""
    from typer import Abort  # noqa: PLC0415

    from skillgraft.io import handle_signals, stopped_by  # noqa: PLC0415

    handle_signals()  # SIGTERM / SIGHUP unwind like Ctrl-C: no temporary sibling is left behind

    try:  # typer ≥ 0.20 vendors click: its usage errors live under typer._click
        from typer._click.exceptions import ClickException  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a typer on the system's click
        from click.exceptions import ClickException  # noqa: PLC0415

    try:
        code = app(standalone_mode=False)  # usage errors come back here: one line, not click's box
    except ClickException as e:  # a bad option or value, named by click; exit 2 as click would
        ctx = getattr(e, "ctx", None)
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        err.print(f"[bold red]error:[/] {escape(e.format_message())}{escape(hint)}", highlight=False)
        sys.exit(e.exit_code)
    except (Abort, KeyboardInterrupt):
        code = 130  # typer turns Ctrl-C into exit code 130 itself; older versions raise
    except Exception as e:  # outside a verb (e.g. while importing or parsing): the same one-line contract
        line = one_line_error(e)
        if line is None or os.environ.get("SKILLGRAFT_DEBUG") == "1":
            raise
        err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
        sys.exit(2)
    signum = stopped_by()
    if signum is not None:  # every atomic writer cleaned up on the way out
        try:
            err.print(f"[red]{escape(interrupted_line(signum, sys.argv[1:]))}[/]", highlight=False)
        except OSError:  # the terminal that sent SIGHUP is gone
            pass
        sys.exit(128 + int(signum))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
