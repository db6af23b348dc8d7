"""The ``skillgraft`` app and what its command groups share: the short ``--help`` of each verb (``COMMON``), the
options several groups take (``--data-dir``, ``--cache``), the localizers' union of options and the seam through
which a caller hands a command a stand-in (:func:`injected`). Each group's commands live in their own module
(``cli/train.py``, ``cli/graft.py``, ``cli/use.py``, ``cli/merge.py``, ``cli/continual.py``, ``cli/recipes.py``);
``cli/commands.py`` registers them in order."""

from __future__ import annotations

import os

import typer

from skillgraft.cli.help import App
from skillgraft.cli.output import DATA, OUTPUT, print_version
from skillgraft.graft.localizers import options_union

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LocalizerFlags = options_union()  # every registered localizer's options; the chosen one validates what is set

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

Cache = typer.Option(None, help="store of finished stages (default: $SKILLGRAFT_CACHE or runs/cache)",
                     rich_help_panel=OUTPUT)

continual_app = App(no_args_is_help=True, help="Forget-free continual learning by grafting (paper §5.2).")
app.add_typer(continual_app, name="continual")


def injected(name: str):
    """What a caller put in the command's context object (``CliRunner().invoke(app, args, obj={name: …})``): the
    seam through which tests give a verb a stand-in (a fake mergekit runner) without patching a module."""
    try:
        from typer._click.globals import get_current_context  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a typer on the system's click
        from click import get_current_context  # noqa: PLC0415
    ctx = get_current_context(silent=True)
    return (ctx.obj or {}).get(name) if ctx is not None and isinstance(ctx.obj, dict) else None
