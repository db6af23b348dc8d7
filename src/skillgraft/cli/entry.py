"""The ``skillgraft`` program: ``--version`` without importing the command line, everything else through
:func:`skillgraft.cli.commands.main`.

``--help`` needs no cache: importing :mod:`skillgraft.cli.commands` reads the typed specs without importing torch,
transformers or matplotlib (:mod:`skillgraft.lazy`; ``tests/test_cli_help.py`` checks the modules a help request
imports), so every command's help is built from the code itself in well under a second (bench/RESULTS.md).
"""

from __future__ import annotations

import sys


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as installed  # noqa: PLC0415

    try:
        return installed("skillgraft")
    except PackageNotFoundError:  # a source tree, not installed
        from skillgraft import __version__  # noqa: PLC0415

        return __version__


def main() -> None:  # pragma: no cover - the console script (tests call cli.main through CliRunner)
    if sys.argv[1:] == ["--version"]:
        print(f"skillgraft {version()}")
        sys.exit(0)
    from skillgraft.errors import SkillgraftError  # noqa: PLC0415
    from skillgraft.heap import require_limit  # noqa: PLC0415

    try:
        require_limit()  # a ulimit -v too low for torch's import: one line before it (it may abort in C++)
    except SkillgraftError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(2)
    try:
        from skillgraft.cli.commands import main as cli_main  # noqa: PLC0415
    except Exception as e:  # under a tight memory limit the imports themselves fail: one line, not a traceback
        from skillgraft.cli.errors import memory_line, out_of_memory  # noqa: PLC0415

        if not out_of_memory(e):
            raise
        sys.stderr.write(f"error: {memory_line(e)}\n")
        sys.exit(2)
    cli_main()
