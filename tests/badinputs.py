"""Helpers of the bad-input tests (tests/test_*_bad_inputs.py): run the CLI in-process and check the one-line
contract (exit 2, no traceback, one ``error:`` line naming the culprits) and that nothing changed on disk."""

from __future__ import annotations

import codecs
import errno
import json
import os
import pathlib
import re

from safetensors.torch import load_file, save_file
from userland import invoke  # noqa: F401 - the bad-input tests' runner (Click's result, whatever the exit code)


def enospc() -> OSError:
    """What a write on a full disk raises (no file name: os.write knows only a descriptor)."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def snapshot(root: pathlib.Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones included) with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def one_line(r, *culprits: str) -> str:
    """Exit 2, no traceback, exactly one ``error:`` line, naming every culprit; returns that line."""
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), f"{type(r.exception).__name__}: {r.exception}"
    assert "Traceback" not in r.output
    lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.output
    for c in culprits:
        assert str(c) in lines[0], f"{c!r} not in {lines[0]!r}"
    return lines[0]


def usage_error(r, *culprits: str) -> None:
    """click's usage error (bad choice or range of an option): exit 2, no traceback, naming the option."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())
    for c in culprits:
        assert str(c) in text, f"{c!r} not in {text!r}"


def refused(root: pathlib.Path, args, *culprits: str, usage: bool = False) -> str | None:
    """Run ``args``; it fails naming ``culprits`` and leaves ``root`` exactly as it was."""
    before = snapshot(root)
    r = invoke(*args)
    line = usage_error(r, *culprits) if usage else one_line(r, *culprits)
    after = snapshot(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k, 0) != after.get(k, 0))
    assert not changed, f"the failed command changed files: {changed}"
    return line


def graft_args(ft_run, toy_data, out, store, *extra):
    """A quick `skillgraft graft` (2 localization steps, one budget, no baselines, 8 test examples)."""
    return ("graft", "--finetuned", ft_run, "--out", out, "--cache", store, "--budgets", "0.05", "--steps", 2,
            "--test-limit", 8, "--baselines", "", "--no-lottery-zero", "--data-dir", toy_data, *extra)


# ---------------------------------------------------------------------------------------------- damage
def edit_json(rel, change):
    def edit(run):
        cfg = json.loads((run / rel).read_text())
        change(cfg)
        (run / rel).write_text(json.dumps(cfg))
    return edit


def edit_tensors(rel, change, metadata=None):
    """Rewrite a safetensors file with ``change`` applied to its tensors."""
    def edit(run):
        tensors = load_file(str(run / rel))
        change(tensors)
        save_file(tensors, str(run / rel), metadata=metadata)
    return edit


def truncate(rel, keep):
    def edit(run):
        path = run / rel
        path.write_bytes(path.read_bytes()[:keep])
    return edit


def as_other_tools_write(text: str, how: str) -> bytes:
    """``text`` as Windows tools save it: a UTF-8 byte-order mark, CRLF line ends, trailing blank lines, or
    UTF-16 with its byte-order mark (Notepad's "Unicode", PowerShell 5's ``>``)."""
    crlf = text.replace("\n", "\r\n")
    return {"bom": codecs.BOM_UTF8 + text.encode(),
            "crlf": crlf.encode(),
            "trailing-blank-lines": text.encode() + b"\n\n \n",
            "bom-crlf-blank": codecs.BOM_UTF8 + crlf.encode() + b"\r\n\r\n",
            "utf-16": crlf.encode("utf-16")}[how]
