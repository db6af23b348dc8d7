"""What the command line says when a verb fails or is stopped: one line, never a traceback (docs/reliability.md);
:func:`output.run_app` prints it."""

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
