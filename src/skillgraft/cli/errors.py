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
    if out_of_memory(e):
        return memory_line(e)
    return describe_io_error(e)


_NO_MEMORY = ("can't start new thread", "can't allocate memory", "not enough memory", "out of memory",
              "cannot allocate memory", "failed to map segment")


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is the machine (or a memory limit) running out of memory: a MemoryError, a thread that cannot
    start (its stack cannot be mapped), torch's allocator failing."""
    import errno  # noqa: PLC0415

    if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
        return True
    if isinstance(e, (RuntimeError, ImportError)) and any(s in str(e).lower() for s in _NO_MEMORY):
        return True
    if isinstance(e, (ImportError, SystemError)):  # a library that cannot be mapped, an allocation failing inside
        from skillgraft.heap import headroom  # noqa: PLC0415 - the interpreter: near a memory limit, that is why

        left = headroom()
        return left is not None and left < 256 << 20
    return False


def memory_line(e: BaseException) -> str:
    """The one line for running out of memory: what failed, and what this process wrote (nothing, or the complete
    artifacts before it; every atomic writer has removed its temporary)."""
    from skillgraft.io import written  # noqa: PLC0415

    detail = (str(e).splitlines() or [""])[0][:200] or type(e).__name__
    done = written()
    what = "nothing was written" if not done else (f"nothing else was written (complete before it: "
                                                   f"{', '.join(str(p) for p in done[-3:])})")
    return (f"out of memory ({detail}): the machine, or this process's memory limit (ulimit -v, a container's), holds "
            f"less than this run needs; {what}")


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
