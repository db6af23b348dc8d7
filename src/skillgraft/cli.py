"""The command line: ``skillgraft <verb>``. Each verb is a thin wrapper over a typed library function."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from skillgraft.errors import SkillgraftError

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find where a fine-tuned model keeps a task's skill, store it as a sparse graft, use it.")
console = Console(stderr=False, soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def friendly(fn):
    """Turn SkillgraftError into one red line and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SkillgraftError as e:
            err.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2) from None

    return wrapper


def _warnings_to_console() -> None:
    def show(message, category, filename, lineno, file=None, line=None):
        err.print(f"[yellow]warning:[/] {message}")

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
def finetune(
    task: str = typer.Option(..., help="task name (see `skillgraft tasks`)"),
    k: int = typer.Option(64, help="examples per label (k-shot)"),
    seed: int = typer.Option(42, help="data seed (LM-BFF: 13, 21, 42, 87, 100)"),
    model: Optional[str] = typer.Option(None, help="hub name or local path (default: bundled all-MiniLM-L6-v2)"),
    mode: str = typer.Option("head", help="scorer: head | prompt | causal"),
    pooling: Optional[str] = typer.Option(None, help="head pooling: cls | mean | last (default: mean; last for LMs)"),
    optimizer: str = typer.Option("sgd", help="sgd | adamw"),
    lr: Optional[float] = typer.Option(None, help="learning rate (default: 0.1 for SGD, 2e-5 for AdamW)"),
    batch_size: int = typer.Option(8, help="examples per step"),
    steps: Optional[int] = typer.Option(None, help="training steps (default: 16·n·k capped at 400)"),
    weight_decay: float = typer.Option(1e-4, help="weight decay"),
    l1: float = typer.Option(0.0, help="L1 penalty λ on ‖θ−θ_pre‖₁ (1e-3 helps AdamW localize)"),
    freeze_embeddings: bool = typer.Option(True, help="freeze embeddings"),
    freeze_head: bool = typer.Option(False, help="freeze the (LM) head"),
    bias_only: bool = typer.Option(False, help="train biases only (BitFit)"),
    layers: Optional[str] = typer.Option(None, help="train only these blocks: '0,3,5', or fim:top-K / fim:bottom-K / random-K"),
    model_seed: int = typer.Option(0, help="model seed (head init, batch order)"),
    eval_every: int = typer.Option(100, help="dev evaluation interval"),
    max_length: int = typer.Option(128, help="max tokens per example"),
    test_limit: Optional[int] = typer.Option(None, help="evaluate on a fixed seeded sample of N test examples"),
    out: Optional[Path] = typer.Option(None, help="run directory (default: runs/ft-<task>-<k>-<seed>)"),
    overwrite: bool = typer.Option(False, help="replace an existing run directory"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Fine-tune a model on a k-shot task and write a run directory (model, config, metrics, plots)."""
    from skillgraft.train import FinetuneConfig, run_finetune  # noqa: PLC0415

    lr = lr if lr is not None else (0.1 if optimizer == "sgd" else 2e-5)
    layer_list = parse_layers(layers, task=task, model=model, mode=mode, k=k, seed=seed, data_dir=data_dir)
    config = FinetuneConfig.build(dict(optimizer=optimizer, lr=lr, batch_size=batch_size, weight_decay=weight_decay,
                                       steps=steps, l1=l1, freeze_embeddings=freeze_embeddings, freeze_head=freeze_head,
                                       bias_only=bias_only, layers=layer_list, seed=model_seed, eval_every=eval_every),
                                  where="finetune")
    out = out or Path("runs") / f"ft-{task}-{k}-{seed}"
    m = run_finetune(task, k, seed, out, model=model, mode=mode, pooling=pooling, config=config, data_dir=data_dir,
                     max_length=max_length, test_limit=test_limit, overwrite=overwrite)
    if "test" in m:
        t = m["test"]
        extra = f" F1 {t['f1']:.4f}" if "f1" in t else ""
        console.print(f"[bold green]done[/] {m['task']} k={k} seed={seed}: test acc {t['accuracy']:.4f}{extra} "
                      f"ECE {t['ece']:.4f} | {m['steps']} steps in {m['train_seconds']:.0f}s "
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
def evaluate(
    model_dir: Path = typer.Argument(..., help="a fine-tuned model folder (run dir or its model/)"),
    task: Optional[str] = typer.Option(None, help="task to evaluate on (default: the model's task)"),
    split: str = typer.Option("test", help="train | dev | test"),
    data_dir: Optional[Path] = DataDir,
    limit: Optional[int] = typer.Option(None, help="first N examples only"),
    out: Optional[Path] = typer.Option(None, help="write metrics JSON + plots into this folder"),
) -> None:
    """Evaluate a saved model: accuracy/F1, ECE, and (with --out) plots."""
    from skillgraft.data import get_task, load_split  # noqa: PLC0415
    from skillgraft.evaluate import evaluate as run_eval, labels_of  # noqa: PLC0415
    from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram  # noqa: PLC0415
    from skillgraft.io import write_json  # noqa: PLC0415
    from skillgraft.models import Scorer  # noqa: PLC0415

    folder = model_dir / "model" if (model_dir / "model").is_dir() else model_dir
    scorer = Scorer.from_pretrained(folder, task=task)
    examples = load_split(get_task(task or scorer.task.name) if task else scorer.task, split, data_dir)[:limit]
    metrics, probs = run_eval(scorer, examples, progress=split)
    if out:
        write_json(out / "metrics.json", metrics)
        confidence_histogram({"model": probs}, out / "confidence.png")
        reliability_diagram({"model": (probs, labels_of(examples))}, out / "reliability.png")
    console.print(f"{scorer.task.name} {split} (n={metrics['n']}): acc {metrics['accuracy']:.4f} "
                  f"ECE {metrics['ece']:.4f}" + (f" F1 {metrics['f1']:.4f}" if "f1" in metrics else ""))


@app.command("run")
@friendly
def run_cmd(
    recipe_file: Path = typer.Argument(..., help="a recipe YAML (see recipes/)"),
    out: Optional[Path] = typer.Option(None, help="run directory (default: runs/<yaml name>)"),
    cache: Optional[Path] = typer.Option(None, help="cache of fine-tuned models (default: runs/cache)"),
) -> None:
    """Run a paper experiment described by a recipe YAML; writes metrics, CSVs, plots and report.md."""
    from skillgraft.recipes import run_recipe  # noqa: PLC0415

    path = run_recipe(recipe_file, out, cache=cache)
    console.print(f"[bold green]done[/] {recipe_file} → {path}/report.md")


def _floats(spec: Optional[str]) -> Optional[list[float]]:
    if not spec:
        return None
    try:
        return [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SkillgraftError(f"expected comma-separated numbers, got {spec!r}") from None


@app.command()
@friendly
def graft(
    finetuned: Path = typer.Option(..., help="a fine-tuning run directory (from `skillgraft finetune`)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: <finetuned>/graft)"),
    sparsity: float = typer.Option(1e-4, help="base patch γ_base: top fraction of |θ_ft − θ_pre| (Eq. 3)"),
    budgets: Optional[str] = typer.Option(None, help="exact region sizes, comma-separated fractions of graftable "
                                          "parameters (one trajectory, top-k of γ); default: round γ at 0.5"),
    steps: int = typer.Option(100, help="localization steps"),
    lr: float = typer.Option(1e7, help="learning rate on S"),
    graftable: str = typer.Option("body", help="body | body+embeddings | all | bias"),
    l1: float = typer.Option(0.0, help="L1 on γ (Localize-and-Stitch style)"),
    eval_every: int = typer.Option(1, help="score the rounded graft every N steps"),
    seed: int = typer.Option(0, help="seed of S's initialisation"),
    test_limit: Optional[int] = typer.Option(None, help="evaluate on a fixed seeded sample of N test examples"),
    baselines: bool = typer.Option(True, help="also score matched-size baselines"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Learn sparse grafts from a pre-trained + fine-tuned pair and compare them (writes report.md)."""
    from skillgraft.graft import LocalizeConfig  # noqa: PLC0415
    from skillgraft.graft.run import run_graft  # noqa: PLC0415

    cfg = LocalizeConfig.build(dict(sparsity=sparsity, budgets=budgets, steps=steps, lr=lr, graftable=graftable, l1=l1,
                                    eval_every=eval_every, seed=seed), where="graft")
    out = out or finetuned / "graft"
    m = run_graft(finetuned, out, config=cfg, data_dir=str(data_dir) if data_dir else None, test_limit=test_limit,
                  baselines=baselines)
    for r in m["rows"]:
        if r["model"].startswith("graft") or r["model"] == "fine-tuned":
            size = f", {r['file_bytes'] / 1024:.1f} KiB" if r.get("file_bytes") else ""
            console.print(f"{r['model']:>22}: {m['task']} {r['score']:.4f} ECE {r['ece']:.4f} "
                          f"| {r['params']:,} params ({r['density']:.2e}){size}")
    console.print(f"[bold green]done[/] → {out}/report.md")


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
    limit: Optional[int] = typer.Option(None, help="first N examples only"),
    force: bool = typer.Option(False, help="apply even if the base fingerprint differs or the graft records none"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Apply a graft to its base model: evaluate it and/or export the grafted model."""
    from skillgraft.data import load_split  # noqa: PLC0415
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.scoring import evaluate_graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415
    from skillgraft.models import build_scorer  # noqa: PLC0415

    if export:
        check_target(export, overwrite)  # before any work: an existing folder is never deleted by surprise
    g = Graft.from_pretrained(graft_dir)
    task = task or g.metadata.get("task")
    if not task:
        raise SkillgraftError(f"{graft_dir}: the graft records no task; pass --task")
    ft_mode = g.metadata.get("mode", mode)
    pre = build_scorer(model or g.base_model or None, task, ft_mode)
    if export:
        g.export(pre, export, force=force, overwrite=overwrite)
        console.print(f"exported grafted model → {export}")
    if evaluate_on:
        examples = load_split(task, evaluate_on, data_dir)[:limit]
        m, _ = evaluate_graft(pre, g, examples, force=force, progress=evaluate_on)
        console.print(f"graft {graft_dir}: {task} {evaluate_on} (n={m['n']}) acc {m['accuracy']:.4f} "
                      f"ECE {m['ece']:.4f} | {g.size:,} params ({g.region.density:.2e})")


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
    write_json(out / "distribution.json", dist)
    plot_distribution(dist, out / "distribution.png", title=f"{g.metadata.get('task', '')} graft")
    console.print(f"→ {out / 'distribution.png'}")


@app.command("export")
@friendly
def export_cmd(
    graft_dir: Path = typer.Argument(..., help="a graft folder (graft_config.json + graft.safetensors)"),
    to: str = typer.Option("peft", help="peft: a PEFT SHiRA adapter folder | hf: the grafted model as a Hugging Face "
                                        "checkpoint | delta: delta.safetensors of per-tensor int32 indices + values"),
    out: Path = typer.Option(..., help="output folder (refused if it exists, unless --overwrite)"),
    overwrite: bool = typer.Option(False, help="replace an existing output folder whole (never mixed into)"),
    model: Optional[str] = typer.Option(None, help="base model (default: the one recorded in the graft)"),
    force: bool = typer.Option(False, help="export even if the base model's fingerprint differs from the graft's"),
    non_linear: str = typer.Option("modules_to_save", "--non-linear",
                                   help="coordinates SHiRA cannot hold (biases, norms, embeddings, Conv1D, tied "
                                        "weights): modules_to_save (their modules stored whole, peft's own route) | "
                                        "tensors (just those tensors, loaded into the base model like LoRA's "
                                        "bias='all': small, but disabling the adapter does not undo them) | refuse"),
    head: str = typer.Option("separate", help="a head-mode graft's task head: separate (skillgraft_head.safetensors "
                                              "beside the adapter) | refuse"),
) -> None:
    """Write a graft as a PEFT SHiRA adapter, a plain safetensors delta or an HF checkpoint (docs/export.md)."""
    from skillgraft.graft import Graft  # noqa: PLC0415
    from skillgraft.graft.export import ExportSpec, export_graft  # noqa: PLC0415
    from skillgraft.io import check_target  # noqa: PLC0415

    spec = ExportSpec.build(dict(to=to, model=model, non_linear=non_linear, head=head, overwrite=overwrite,
                                 force=force), where="export")
    check_target(out, overwrite)  # before any work
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
def sweep(
    finetuned: Path = typer.Option(..., help="a fine-tuning run directory"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: <finetuned>/sweep)"),
    levels: str = typer.Option("1e-5,1e-4,1e-3,1e-2,1e-1,1", help="sparsity levels (fractions of graftable)"),
    learned: bool = typer.Option(True, help="include learned grafts (one trajectory, top-k of γ per level ≤ 1e-2)"),
    steps: int = typer.Option(100, help="localization steps"),
    eval_every: int = typer.Option(10, help="score interval during localization"),
    test_limit: Optional[int] = typer.Option(None, help="evaluate on a fixed seeded sample of N test examples"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Accuracy vs region size for learned, top-movement and random regions (paper Figs. 2/4): CSV + PNG."""
    from skillgraft.graft.sweep import run_sweep  # noqa: PLC0415

    out = out or finetuned / "sweep"
    rows = run_sweep(finetuned, out, levels=_floats(levels), learned=learned, steps=steps, eval_every=eval_every,
                     test_limit=test_limit, data_dir=str(data_dir) if data_dir else None)
    for r in rows:
        console.print(f"{r['localizer']:>13} {r['level']:.0e}: {r['score']:.4f} (ECE {r['ece']:.4f})")
    console.print(f"[bold green]done[/] → {out}/sweep.csv, {out}/sweep.png")


@app.command()
@friendly
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="demo folder (stages are cached here and reused)"),
    seed: int = typer.Option(42, help="data seed"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """The main job: fine-tune MiniLM 64-shot on SST-2, learn grafts at 3 sizes, compare, write report.md."""
    from skillgraft.demo import run_demo  # noqa: PLC0415

    report = run_demo(out, seed=seed, data_dir=str(data_dir) if data_dir else None)
    console.print(f"[bold green]done[/] → {report}")


@app.command()
@friendly
def fim(
    task: str = typer.Option(..., help="task name (see `skillgraft tasks`)"),
    model: Optional[str] = typer.Option(None, help="hub name or local path (default: bundled all-MiniLM-L6-v2)"),
    mode: str = typer.Option("head", help="scorer: head | prompt | causal"),
    pooling: Optional[str] = typer.Option(None, help="head pooling: cls | mean | last"),
    k: int = typer.Option(16, help="examples per label of the k-shot training set the Fisher is taken over"),
    seed: int = typer.Option(42, help="data seed"),
    n_examples: Optional[int] = typer.Option(None, "--n", help="use the first N training examples (default: all)"),
    kind: str = typer.Option("empirical", help="empirical | true | sampled"),
    aggregate: str = typer.Option("sum", help="block score: sum (of Fisher entries) | frobenius (reference code)"),
    normalize: bool = typer.Option(False, help="divide each block's score by its parameter count"),
    chunk_size: Optional[int] = typer.Option(None, help="examples per vectorised chunk (default: hooks 16; vmap 4 "
                                                        "on CPU, 32 on GPU)"),
    method: str = typer.Option("auto", help="per-example gradients: auto | hooks | vmap | loop (reference)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: runs/fim-<task>-<k>-<seed>)"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Per-layer FIM scores of the pre-trained model (surgical fine-tuning): ranking table, fim.json, fim.png."""
    from skillgraft.data import load_kshot  # noqa: PLC0415
    from skillgraft.fisher import FisherConfig, fim_layer_scores  # noqa: PLC0415
    from skillgraft.fisher.plots import layer_scores_bar  # noqa: PLC0415
    from skillgraft.io import write_json  # noqa: PLC0415
    from skillgraft.models import build_scorer  # noqa: PLC0415

    if aggregate not in ("sum", "frobenius"):
        raise SkillgraftError(f"--aggregate must be sum or frobenius, got {aggregate!r}")
    config = FisherConfig.build(dict(kind=kind, n_examples=n_examples, chunk_size=chunk_size, method=method),
                                where="fim")
    data = load_kshot(task, k, seed, data_dir)
    scorer = build_scorer(model, data.task, mode, pooling=pooling)
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
    write_json(out / "fim.json", {"task": data.task.name, "k": k, "seed": seed, "model": scorer.base_model,
                                  "mode": mode, "n_examples": n_used, **scores.to_dict()})
    layer_scores_bar(scores, out / "fim.png", title=f"{data.task.name} FIM per block (N={n_used})")
    console.print(f"top → bottom: {scores.ranking()}  → {out}/fim.json, {out}/fim.png")


continual_app = typer.Typer(no_args_is_help=True, help="Forget-free continual learning by grafting (paper §5.2).")
app.add_typer(continual_app, name="continual")


@continual_app.command("add")
@friendly
def continual_add_cmd(
    state: Path = typer.Option(..., help="continual state folder (created on first use)"),
    task: str = typer.Option(..., help="the task that arrives now"),
    k: int = typer.Option(16, help="examples per label"),
    seed: int = typer.Option(13, help="data seed"),
    data_dir: Optional[Path] = DataDir,
    model: Optional[str] = typer.Option(None, help="base model (only when creating the state; default MiniLM)"),
    mode: str = typer.Option("head", help="head | prompt (only when creating the state)"),
    region: Optional[Path] = typer.Option(None, help="γ_task: a region or graft folder (default: learn it from a "
                                                     "single-task fine-tune + localize)"),
    lr: float = typer.Option(0.01, help="learning rate (SGD) of fine-tuning and of the owned-region training"),
    steps: int = typer.Option(400, help="training steps"),
    sparsity: float = typer.Option(1e-4, help="γ_base sparsity when learning γ_task"),
    localize_steps: int = typer.Option(30, help="localization steps when learning γ_task"),
    init: str = typer.Option("current", help="current (paper: train owned coordinates from the current model) | "
                                             "graft (start them from the single-task graft)"),
    test_limit: Optional[int] = typer.Option(None, help="evaluate on a fixed seeded sample of N test examples"),
) -> None:
    """Learn TASK on its region minus earlier tasks' regions; earlier tasks' coordinates never change."""
    from skillgraft.continual import continual_add  # noqa: PLC0415
    from skillgraft.graft import LocalizeConfig  # noqa: PLC0415
    from skillgraft.train import FinetuneConfig  # noqa: PLC0415

    cfg = FinetuneConfig.build(dict(lr=lr, steps=steps, eval_every=max(1, steps // 4)), where="continual add")
    entry = continual_add(state, task, k=k, seed=seed, data_dir=data_dir, model=model, mode=mode, region=region,
                          finetune_config=cfg, localize_config=LocalizeConfig(sparsity=sparsity, steps=localize_steps),
                          init=init, test_limit=test_limit)
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
    st = read_json(state / "continual.json")
    table = Table(title=f"continual state {state} (base {st.get('base_model')})")
    for col in ("order", "task", "|γ|", "owned", "shared w/ earlier", "test (latest)"):
        table.add_column(col)
    for e in st["tasks"]:
        hist = e.get("test_history") or []
        table.add_row(str(e["order"]), e["task"], str(e.get("region_size")), str(e.get("owned_size")),
                      str(e.get("shared_with_earlier")), f"{hist[-1]['score']:.4f}" if hist else "-")
    console.print(table)


def main() -> None:  # pragma: no cover - entry point
    try:
        app()
    except KeyboardInterrupt:
        err.print("[red]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
