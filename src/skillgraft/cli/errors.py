"""What the command line says when a verb fails or is stopped: one line, never a traceback (docs/reliability.md)."""

from __future__ import annotations

from skillgraft.errors import SkillgraftError


def one_line_error(e: BaseException) -> str | None:
    """The user-facing line for an error users or their machine can cause (a SkillgraftError, an I/O error
    naming its path: ``<path>: no space left on device``); None for a bug, which keeps its traceback."""
    from skillgraft.io import describe_io_error  # noqa: PLC0415

    if isinstance(e, SkillgraftError):
        from skillgraft.spec import readable_bounds  # noqa: PLC0415

        return readable_bounds(str(e))
    return describe_io_error(e)


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


def usage_line(e) -> str:
    """The one line for click's usage error ``e`` (a bad option or value), with where to read more; a group called
    without a command (click printed its help and says nothing) is told what to run."""
    ctx = getattr(e, "ctx", None)
    message = e.format_message().strip()
    if message:
        return message + (f" (see: {ctx.command_path} --help)" if ctx is not None else "")
    where = ctx.command_path if ctx is not None else "skillgraft"
    first = " (a first run: README.md's quickstart)" if ctx is None or ctx.parent is None else ""
    return f"no command given: run `{where} COMMAND` with one of the commands above{first}"


def run_app(app) -> None:  # pragma: no cover - the console script (tests call the app through CliRunner)
    """Run ``app`` as the ``skillgraft`` program: a usage error or a failure outside a verb is one line; Ctrl-C,
    SIGTERM and SIGHUP clean up, print one line and exit 128 + the signal's number (130, 143, 129)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from rich.markup import escape  # noqa: PLC0415
    from typer import Abort  # noqa: PLC0415

    from skillgraft.cli.output import err  # noqa: PLC0415
    from skillgraft.io import handle_signals, stopped_by  # noqa: PLC0415

    handle_signals()  # SIGTERM / SIGHUP unwind like Ctrl-C: no temporary sibling is left behind
    try:  # typer ≥ 0.20 vendors click: its usage errors live under typer._click
        from typer._click.exceptions import ClickException  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a typer on the system's click
        from click.exceptions import ClickException  # noqa: PLC0415

    try:
        code = app(standalone_mode=False)  # usage errors come back here: one line, not click's box
    except ClickException as e:  # a bad option or value, named by click; exit 2 as click would
        err.print(f"[bold red]error:[/] {escape(usage_line(e))}", highlight=False)
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
