"""``--help`` at 80 columns (issue 37): every verb's options grouped into panels, each option name whole, one style
for types / ranges / defaults; ``-h``; ``--version``."""

import re

import pytest
import typer
from typer.testing import CliRunner

from skillgraft.cli import app

runner = CliRunner()


def commands(group, path=()):
    """(path, click command) of every command under ``group``."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


ALL = list(commands(typer.main.get_command(app)))


def help_of(*args, columns=80):
    r = runner.invoke(app, [*args], env={"COLUMNS": str(columns), "TERMINAL_WIDTH": str(columns)})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_option_name_whole_at_80_columns(path, cmd):
    text = help_of(*path, "--help")
    assert max(len(line) for line in text.splitlines()) <= 80
    assert not re.search(r"-[\w-]*…", text)  # no name cut
    for param in cmd.params:
        if getattr(param, "hidden", False):  # a former name kept as an alias (it warns)
            continue
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("--no-") and f"--[no-]{opt[5:]}" in text:
                continue
            if opt.startswith("--") and f"--[no-]{opt[2:]}" in text:
                continue
            shown = opt.upper() if not opt.startswith("-") else opt
            assert re.search(rf"(?<![\w-]){re.escape(shown)}(?![\w-])", text), f"{' '.join(path)}: {opt} not whole"
    # one style for types, ranges and defaults
    for bad in ("<list[", "<str>", "<int", "2147483647", "4294967295", "10000000.0", "[default: (", "{graft_dir}"):
        assert bad not in text, f"{' '.join(path)}: {bad!r} in --help"


def test_graft_help_is_grouped_and_shows_every_localizer_default():
    text = help_of("graft", "--help")
    for panel in ("Model", "Data", "Localizer", "Keep / frontier", "Output", "Report"):
        assert f"─ {panel}" in text, panel
    localizer = text.split("─ Localizer")[1].split("╰")[0]
    rows = re.split(r"\n│ (?=--)", localizer)[1:]
    assert len(rows) > 10
    for row in rows:
        assert "default" in row, row.split()[0]
    assert "--lr FLOAT" in localizer and "[default: 1e+07]" in localizer
    assert "--max-length INT" in text and "[x ≥ 8]" in text


def test_merge_help_has_panels():
    text = help_of("merge", "--help")
    for panel in ("Model", "Data", "Merge", "Localizer", "Output"):
        assert f"─ {panel}" in text, panel


def test_short_help_and_version():
    assert help_of("graft", "-h") == help_of("graft", "--help")
    assert "Commands" in help_of("-h") and "Commands" in help_of("continual", "-h")
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"skillgraft {version('skillgraft')}"


FAST = """
import sys
from skillgraft.entry import fast_help
sys.argv = ["skillgraft"]
assert fast_help(sys.argv[1:] + {args!r})
print("MODULES", *sorted(m for m in ("torch", "transformers", "numpy", "skillgraft.cli") if m in sys.modules))
"""


def run_fast(args, cache):
    import os
    import subprocess
    import sys

    env = {**os.environ, "SKILLGRAFT_HELP_CACHE": str(cache), "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-c", FAST.format(args=list(args))], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out, _, mods = r.stdout.rpartition("MODULES")
    return out, mods.split()


def test_help_answers_from_the_cache_without_importing_torch(tmp_path):
    """The first --help fills the cache (imports the verbs); every later one imports neither torch, transformers
    nor the verbs, and says exactly what the command line's own --help says (the time: bench/RESULTS.md)."""
    first, mods = run_fast(["graft", "--help"], tmp_path)
    assert "skillgraft.cli" in mods and len(list(tmp_path.glob("help-*.json"))) == 1
    again, mods = run_fast(["graft", "--help"], tmp_path)
    assert mods == [], mods
    assert again == first
    assert again.rstrip() == help_of("graft", "--help").replace("Usage: root", "Usage: skillgraft", 1).rstrip()
    sub, mods = run_fast(["continual", "add", "-h"], tmp_path)
    assert mods == [] and "Usage: skillgraft continual add [OPTIONS]" in sub


def test_help_requests_and_cache_key(tmp_path):
    from skillgraft.entry import help_path, source_key

    assert help_path(["graft", "--finetuned", "x", "-h"]) == "graft"
    assert help_path(["continual", "add", "--help"]) == "continual add"
    assert help_path(["--help"]) == "" and help_path(["graft", "--finetuned", "x"]) is None
    assert help_path(["run", "--", "--help"]) is None
    (tmp_path / "a.py").write_text("x = 1\n")
    key = source_key(tmp_path)
    (tmp_path / "a.py").write_text("x = 22\n")  # an edited source: a new key, never a stale help
    assert source_key(tmp_path) != key
