"""The ``skillgraft`` program: answers ``--help`` / ``-h`` and ``--version`` without importing the verbs (issue 37).

Importing :mod:`skillgraft.cli` builds every verb's options from the typed specs, which live beside the code that
uses torch: 4–5 s before anything prints. ``--help`` needs none of it once the help is known, so the first help
request writes every command's help (:func:`skillgraft.clihelp.describe_all`, width-independent) to a cache keyed
by skillgraft's version and the size and modification time of each of its source files; later requests show it
from there (torch, transformers and the verbs are never imported). Any change to a source file is a new key, so a
cached help is never stale. Everything else goes to :func:`skillgraft.cli.main`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
HELP = ("-h", "--help")


def cache_dir() -> Path:
    """Where the help cache lives: ``$SKILLGRAFT_HELP_CACHE``, else ``$XDG_CACHE_HOME/skillgraft`` (~/.cache)."""
    if os.environ.get("SKILLGRAFT_HELP_CACHE"):
        return Path(os.environ["SKILLGRAFT_HELP_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skillgraft"


def source_key(root: Path = PACKAGE) -> str:
    """A digest of skillgraft's version and every source file's path, size and mtime (stat only: milliseconds)."""
    from skillgraft import __version__  # noqa: PLC0415

    h = hashlib.sha256(__version__.encode())
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def help_path(args: list[str]) -> str | None:
    """The command path a help request is for (``"graft"``, ``"continual add"``, ``""``), or None when ``args``
    ask for something else."""
    if "--" in args:
        args = args[: args.index("--")]
    if not any(a in HELP for a in args):
        return None
    path = []
    for a in args:
        if a.startswith("-"):
            break
        path.append(a)
    return " ".join(path)


def load_helps(key: str) -> dict | None:
    try:
        return json.loads((cache_dir() / f"help-{key}.json").read_text())
    except (OSError, ValueError):
        return None


def write_helps(key: str) -> dict:
    """Every command's help, described from the app itself, written to the cache (atomically; best effort)."""
    from skillgraft.cli import app  # noqa: PLC0415
    from skillgraft.clihelp import describe_all  # noqa: PLC0415

    helps = describe_all(app)
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".help-{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(helps))
        os.replace(tmp, folder / f"help-{key}.json")
        for old in folder.glob("help-*.json"):  # earlier keys: other versions or edited sources
            if old.name != f"help-{key}.json":
                old.unlink(missing_ok=True)
    except OSError:  # a read-only home: help still works, only not faster next time
        pass
    return helps


def fast_help(args: list[str]) -> bool:
    """Show the help ``args`` ask for from the cache (filling it on a miss); False when it is no help request or
    names no known command (then the full command line answers, with its own error)."""
    path = help_path(args)
    if path is None:
        return False
    key = source_key()
    helps = load_helps(key)
    if helps is None or path not in helps:
        if helps is not None:
            return False  # an unknown command: click says so
        helps = write_helps(key)
        if path not in helps:
            return False
    from skillgraft.clihelp import show  # noqa: PLC0415

    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "skillgraft"
    show(helps[path], " ".join([prog if prog != "__main__.py" else "skillgraft", *path.split()]))
    return True


def main() -> None:  # pragma: no cover - the console script (tests call fast_help / cli.main)
    args = sys.argv[1:]
    if args == ["--version"]:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            print(f"skillgraft {version('skillgraft')}")
        except PackageNotFoundError:  # a source tree, not installed
            from skillgraft import __version__  # noqa: PLC0415

            print(f"skillgraft {__version__}")
        sys.exit(0)
    if os.environ.get("SKILLGRAFT_HELP_CACHE") != "off" and fast_help(args):
        sys.exit(0)
    from skillgraft.cli import main as cli_main  # noqa: PLC0415

    cli_main()
