"""What the command line prints, beside the parsing in commands.py: the consoles, the one-line error contract and
``--json`` of every verb (:func:`friendly`), ``--version``, the --help panels, the localizer options' help and the
region table of ``inspect`` at the terminal's width (issue 37)."""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from pathlib import Path
from collections.abc import Mapping

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skillgraft.cli.errors import interrupted_line, one_line_error, usage_line
from skillgraft.cli.help import shown_default
from skillgraft.cli.options import Options
from skillgraft.signals import Interrupted, handle_signals, stopped_by

# --help panels (help.render): each option sits in one; options with none go to "Options", shown last
MODEL, DATA, LOCALIZER, REPORT, KEEP, OUTPUT, TRAIN = ("Model", "Data", "Localizer", "Report",
                                                       "Keep / frontier", "Output", "Training")



console = Console(stderr=False, soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


_JSON = {"on": False}  # --json of the running verb: its report is one JSON document on stdout, nothing else there


def friendly(fn):
    """Turn SkillgraftError and I/O errors into one red line and exit code 2 (no traceback; docs/reliability.md);
    give the verb ``--json`` (its human lines silenced, :func:`report`'s document printed instead).

    ``SKILLGRAFT_DEBUG=1`` re-raises them with their traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        printable_streams()
        progress_lines()
        _JSON["on"] = bool(kwargs.pop("json_output", False))
        console.quiet = _JSON["on"]
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            signum = stopped_by()
            if signum is not None:  # a stopping signal's Interrupted, wrapped by a library it crossed (pydantic's
                raise Interrupted(signum) from e  # serializers): unwound as the interruption it is, not an error
            line = one_line_error(e)
            if line is None or os.environ.get("SKILLGRAFT_DEBUG") == "1":
                raise
            say_error(line)
            raise typer.Exit(2) from None
        finally:
            console.quiet = False
            _JSON["on"] = False

    import inspect as _inspect  # noqa: PLC0415

    sig = _inspect.signature(fn)
    flag = _inspect.Parameter("json_output", _inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                              default=typer.Option(False, "--json", rich_help_panel=OUTPUT,
                                                   help="print the report as one JSON document on stdout (for "
                                                        "scripts; progress and warnings stay on stderr)"))
    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), flag])
    return wrapper


def plain(obj):
    """``obj`` as JSON values: paths and other objects as text, NaN / ∞ as null, dataclasses as dicts."""
    import dataclasses  # noqa: PLC0415
    import math  # noqa: PLC0415

    if isinstance(obj, Mapping):  # a typed report row: its CSV / metrics.json columns (score at the top level)
        return {str(k): plain(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return plain({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [plain(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # a NumPy / torch scalar
        return plain(obj.item())
    return str(obj)


def report(obj) -> None:
    """With --json: the verb's report, one JSON document on stdout."""
    if _JSON["on"]:
        import json  # noqa: PLC0415

        doc = plain(obj)
        if isinstance(doc, dict) and "placement" not in doc and _PLACED.get("runtime") is not None:
            doc["placement"] = _PLACED["runtime"].as_dict()  # every report names its device and precision
        typer.echo(json.dumps(doc, indent=2))


_PLACED: dict = {"runtime": None}


_OUTPUTS = frozenset({"out", "export", "output"})


def vet_inputs(kwargs: dict) -> None:
    """Walk the headers of the single-file models a verb was given (a ``.gguf`` or ``.safetensors`` path, itself or
    a spec's field) before anything heavy is imported: a crafted header is refused in one line, in milliseconds,
    not after torch's import (the loaders walk it again, from the same code: models/headers.py). Outputs are not
    read."""
    from skillgraft.models.headers import check_gguf, check_safetensors  # noqa: PLC0415  (no torch)

    def values(mapping):
        for name, value in mapping.items():
            if name in _OUTPUTS:
                continue
            if hasattr(value, "model_fields"):  # a typed spec: its own fields (one level)
                yield from values({f: getattr(value, f, None) for f in type(value).model_fields})
            elif isinstance(value, (str, os.PathLike)):
                yield Path(value)

    for path in values(kwargs):
        suffix = path.suffix.lower()
        if suffix in (".gguf", ".safetensors") and path.is_file():
            check_gguf(path) if suffix == ".gguf" else check_safetensors(path)


def placed(fn):
    """Give the verb ``--device`` and ``--precision`` (the fields of
    :class:`~skillgraft.models.placement.Placement`: one default, one help text; ``--config`` files set them too)
    and run it under that placement: every model it loads is placed there, and its report names it."""
    from skillgraft.cli.options import from_specs  # noqa: PLC0415
    from skillgraft.models.placement import Placement  # noqa: PLC0415

    @functools.wraps(fn)
    def run(*args, placement: Placement, **kwargs):
        from skillgraft.models.placement import using  # noqa: PLC0415

        vet_inputs(kwargs)  # a damaged GGUF / safetensors input: one line before torch is imported (issue 77)
        with using(placement) as runtime:
            _PLACED["runtime"] = runtime
            try:
                return fn(*args, **kwargs)
            finally:
                _PLACED["runtime"] = None

    sig = inspect.signature(fn)
    own = inspect.Parameter("placement", inspect.Parameter.KEYWORD_ONLY, annotation=Placement)
    run.__signature__ = sig.replace(parameters=[*sig.parameters.values(), own])
    return from_specs(placement=Options(Placement, panel=MODEL))(run)


def model_verb(fn):
    """A verb that loads models: :func:`friendly` (one-line errors, ``--json``) and :func:`placed` (``--device``,
    ``--precision``)."""
    return friendly(placed(fn))


def progress_lines() -> None:
    """One line per phase into a file or a CI log (:func:`skillgraft.progress.lines_when_logged`, the one owner of
    progress bars: the Python API's bars log the same way)."""
    from skillgraft.progress import lines_when_logged  # noqa: PLC0415

    lines_when_logged()


def warnings_to_console() -> None:
    def show(message, category, filename, lineno, file=None, line=None):
        err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)

    warnings.showwarning = show


warnings_to_console()


def print_version(value: bool) -> None:
    """``--version``: print the installed version and exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            v = version("skillgraft")
        except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
            v = "unknown"
        console.print(f"skillgraft {v}")
        raise typer.Exit()


def localizer_flags(flags, skip: tuple[str, ...] = (), panel: str = "Localizer (defaults: learned's)") -> Options:
    """Every localizer's options for --help: each with its own help, the localizers that take it when only one or
    two do, and the default of ``learned`` (the default localizer; another's: ``skillgraft localizers NAME``)."""
    from skillgraft.graft.localizers import LOCALIZERS  # noqa: PLC0415

    owners: dict[str, list[str]] = {}
    texts: dict[str, str] = {}
    defaults: dict[str, dict] = {}
    for name, loc in LOCALIZERS.items():
        resolved = loc.Options.build({})  # validators fill derived defaults (e.g. lr from relaxation × optimizer)
        for field, info in loc.Options.model_fields.items():
            owners.setdefault(field, []).append(name)
            texts.setdefault(field, info.description or "")
            defaults.setdefault(name, {})[field] = getattr(resolved, field, None)
    helps, shown = {}, {}
    for field in flags.model_fields:
        who = owners.get(field, [])
        scope = f" (only {' and '.join(who)})" if len(who) <= 2 and len(who) < len(LOCALIZERS) else ""
        helps[field] = texts.get(field, "") + scope
        source = "learned" if "learned" in who else (who[0] if who else None)
        value = shown_default(defaults.get(source, {}).get(field)) if source else None
        if value is None and "default" not in texts.get(field, ""):
            value = "none"
        if value is not None:
            shown[field] = value if source == "learned" else f"{value} ({source})"
    return Options(flags, skip=skip, help=helps, shown=shown, panel=panel)


def short(module_type: str) -> str:
    """A module type in a few characters: ``attn.query`` → ``a.query``, ``ffn.intermediate`` → ``f.in``."""
    for long, short in (("attn.", "a."), ("ffn.", "f."), ("intermediate", "in"), ("output", "out"),
                        ("layernorm", "norm"), ("embeddings", "emb")):
        module_type = module_type.replace(long, short)
    return module_type


def region_table(dist: dict, width: int) -> list:
    """Where a region sits, readable at ``width`` columns: a table of layers × module types (biases summed into
    one column), or, when even that is wider, one line per layer listing its non-zero module types."""
    weights = [c for c in dist["module_types"] if not c.endswith("(bias)")]
    cols = [*weights, "bias", "total"]
    rows = []
    for layer, row in dist["table"].items():
        cells = {c: row.get(c, 0) for c in weights}
        cells["bias"] = sum(v for c, v in row.items() if c.endswith("(bias)"))
        cells["total"] = sum(row.values())
        rows.append((layer, cells))
    headers = {c: short(c) for c in cols}
    need = max([len("layer"), *(len(r[0]) for r in rows)]) + 1
    need += sum(max([len(headers[c]), *(len(f"{r[1][c]:,}") for r in rows)]) + 1 for c in cols)
    if need <= width:
        table = Table(title="region by layer × module type (coordinates)", box=None, pad_edge=False,
                      padding=(0, 0, 0, 1), title_justify="left")
        table.add_column("layer", no_wrap=True)
        for c in cols:
            table.add_column(headers[c], justify="right", no_wrap=True)
        for layer, cells in rows:
            table.add_row(layer, *[f"{cells[c]:,}" for c in cols])
        return [table]
    out = ["region by layer (coordinates per module type)"]
    for layer, cells in rows:
        parts = [f"{short(c)} {cells[c]:,}" for c in [*weights, "bias"] if cells[c]]
        out.append(f"{layer}: {cells['total']:,} — {', '.join(parts) or 'none'}")
    return out


def print_routed_keep(kept) -> None:
    """``merge --routed --keep``: one line per task's keep-sized routed graft (size, shares, bound, test share), each a
    :class:`~skillgraft.verbs.merge_report.RoutedKeep` of the result."""
    for r in kept:
        console.print(f"routed {escape(r.task)}: {r.line()}")


def print_keep(keep=None, frontier=None) -> None:
    """One line per keep target of ``keep`` (a :class:`~skillgraft.keep.report.KeepSummary`: size found,
    selection and test shares, cost) and per keep density of ``frontier`` (a
    :class:`~skillgraft.pipeline.frontier.FrontierResult`)."""
    from skillgraft.keep.report import keep_line  # noqa: PLC0415

    for t in keep.targets if keep else []:
        console.print(keep_line(t))
    if keep:
        console.print(f"keep selection split: {escape(keep.selection)}")
    for k in frontier.keep if frontier else []:
        need = f"density {k.density:.2e}" if k.reached else f"not reached (best {k.best_share:.3f})"
        bound = "" if k.bound is None else f", {k.confidence:.0%} lower bound {k.bound:.3f}"
        console.print(f"frontier {escape(k.method)} keep {k.target:g}: {need}{bound}, test share "
                      f"{k.test_share:.3f}")


def exporter_lines(to: str, s: dict, out=None) -> None:
    """Print what the exporter ``to`` says to print of its summary ``s``: ``skillgraft export``'s lines, or with
    ``out``, ``apply --export``'s (the grafted model written there)."""
    from skillgraft.export import get_exporter  # noqa: PLC0415

    exporter = get_exporter(to)
    for kind, text in exporter.lines(s) if out is None else exporter.applied(s, out):  # each exporter says what
        if kind == "warning":
            err.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)
        elif kind == "hint":
            console.print(f"[yellow]hint:[/] {escape(text)}")
        elif kind == "note":
            console.print(f"[yellow]{escape(text)}[/]")
        else:
            console.print(escape(text))


def say_error(line: str) -> None:
    """``error: LINE`` on stderr (red on a terminal); as plain text when printing it fails for want of memory."""
    try:
        err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
    except Exception:  # noqa: BLE001 - rich importing or allocating under a memory limit (MemoryError, SystemError)
        import sys  # noqa: PLC0415

        sys.stderr.write(f"error: {line}\n")


def printable_streams() -> None:
    """stdout and stderr in a locale that is not UTF-8 (``LANG=en_US.ISO-8859-1``, ``PYTHONIOENCODING=ascii``) write
    what they cannot encode as ``\\xd7`` escapes: printing θ or × crashed ``inspect`` after it had written its files."""
    import sys  # noqa: PLC0415

    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def run_app(app) -> None:  # pragma: no cover - the console script (tests call the app through CliRunner)
    """Run ``app`` as the ``skillgraft`` program: a usage error or a failure outside a verb is one line; Ctrl-C,
    SIGTERM and SIGHUP clean up, print one line and exit 128 + the signal's number (130, 143, 129)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from typer import Abort  # noqa: PLC0415

    handle_signals()  # SIGTERM / SIGHUP unwind like Ctrl-C: no temporary sibling is left behind
    try:  # typer ≥ 0.20 vendors click: its usage errors live under typer._click
        from typer._click.exceptions import ClickException  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a typer on the system's click
        from click.exceptions import ClickException  # noqa: PLC0415

    try:
        from skillgraft.heap import START_ROOM, require_room  # noqa: PLC0415

        require_room(0, "a skillgraft command", START_ROOM)  # under a tight ulimit -v: one line, before any work
        code = app(standalone_mode=False)  # usage errors come back here: one line, not click's box
    except ClickException as e:  # a bad option or value, named by click; exit 2 as click would
        err.print(f"[bold red]error:[/] {escape(usage_line(e))}", highlight=False)
        sys.exit(e.exit_code)
    except (Abort, KeyboardInterrupt):
        code = 130  # typer turns Ctrl-C into exit code 130 itself; older versions raise
    except Exception as e:  # outside a verb (e.g. while importing or parsing): the same one-line contract
        if stopped_by() is None:
            line = one_line_error(e)
            if line is None or os.environ.get("SKILLGRAFT_DEBUG") == "1":
                raise
            say_error(line)
            sys.exit(2)
        code = 1  # the signal's Interrupted, wrapped by a library it crossed (pydantic's serializers): interrupted
    signum = stopped_by()
    if signum is not None:  # every atomic writer cleaned up on the way out
        try:
            err.print(f"[red]{escape(interrupted_line(signum, sys.argv[1:]))}[/]", highlight=False)
        except OSError:  # the terminal that sent SIGHUP is gone
            pass
        sys.exit(128 + int(signum))
    sys.exit(code if isinstance(code, int) else 0)
