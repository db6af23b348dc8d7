"""An output's target checked before any work: it does not exist (or ``--overwrite``), it can be created, it is no
input of its own run (``check_target``, ``check_apart``); a replacement a kill interrupted rolled back
(``roll_back``); an output that appeared while the command ran (``TargetExists``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.paths import absolute, old_sibling, path_problem, same_file


def check_target(path: str | os.PathLike, overwrite: bool = False,
                 inputs: Mapping[str, str | os.PathLike | None] | None = None) -> Path:
    """Refuse an existing output ``path`` unless ``overwrite``, and one that cannot be created (a file where
    a folder should be, a folder we may not write into): call it before any work.

    ``inputs`` (``{"--cache": store root, "--finetuned": run, …}``): paths the command reads or fills (a store
    may not exist yet); one that is ``path`` itself or lies inside it is refused (:func:`check_apart`): putting
    the output in place would delete it.

    A replacement that a kill interrupted (the old ``path`` moved aside, the new one not yet in place) is rolled
    back first: the old ``path`` returns, and is refused like any other unless ``overwrite``."""
    path = Path(path)
    check_apart(path, inputs or {})
    roll_back(path)
    if os.path.lexists(path) and overwrite:  # `--out . --overwrite`, `--out ..`: renaming it fails after all the work
        cwd, target = absolute(os.getcwd()), absolute(path)
        if target == cwd or target in cwd.parents:
            raise SkillgraftError(f"{path} is the current folder or holds it ({cwd}): it cannot be replaced whole from "
                                  "inside; run from outside it, or choose another output path")
    if os.path.lexists(path) and not overwrite:
        what = "folder" if path.is_dir() else "file"
        raise SkillgraftError(f"{path} already exists ({what}); refusing to replace it. Pass --overwrite to "
                              "replace it whole, or choose another output path")
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent  # the nearest existing ancestor: where the first new folder will be made
    if not parent.is_dir():
        raise SkillgraftError(f"cannot create {path}: {parent} is {path_problem(parent, 'folder') or 'not a folder'}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SkillgraftError(f"cannot create {path}: {parent} is not writable (permission denied or a "
                              "read-only file system)")
    return path


def roll_back(path: str | os.PathLike) -> None:
    """Undo a replacement of ``path`` a kill interrupted (the old one moved aside, the new not yet in place): a verb
    that reads its output before replacing it (``continual add``) calls this first, so such a kill loses nothing."""
    path = Path(path)
    if not os.path.lexists(path) and os.path.lexists(old_sibling(path)):
        with contextlib.suppress(OSError):
            os.replace(old_sibling(path), path)


def check_apart(out: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None]) -> None:
    """Refuse an output target ``out`` that is, or holds, one of ``inputs`` (option name → path; None and paths
    that do not exist — hub names — are skipped, except a store, ``--cache``, filled during the run): an output is
    written beside itself and renamed into place, and with ``--overwrite`` the old one is deleted, so an input or a
    store inside it would be lost (before, `graft --cache X/store --out X` deleted the store it had just filled)."""
    target = absolute(out)
    for option, value in inputs.items():
        if value is None or str(value) == "":
            continue
        where = absolute(value)
        if not option.startswith("--cache") and not os.path.lexists(where):
            continue
        if where == target or same_file(where, target):
            kind = "folder" if where.is_dir() else "file"
            raise SkillgraftError(f"{option} {value} is the output {kind} {out} itself: putting the output in place "
                                  "would delete it (with --overwrite too: an output never replaces an input of its "
                                  "own run); choose another output path")
        if target in where.parents:
            raise SkillgraftError(f"{option} {value} is inside the output folder {out}: putting the output in place "
                                  f"would delete it; choose an output path outside it (or move {option})")


class TargetExists(SkillgraftError):
    """An output that did not exist when the command started appeared before its result was put in place
    (another process wrote it meanwhile, or the user made it); it is left as it is and nothing is written."""

    def __init__(self, path: Path):
        what = "folder" if Path(path).is_dir() else "file"
        super().__init__(f"{path} appeared while this command ran ({what}; another process wrote it?); left as it "
                         "is and nothing of this run was written. Pass --overwrite to replace it, or choose "
                         "another output path")
        self.path = Path(path)
