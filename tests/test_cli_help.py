"""``--help`` at 80 columns (issue 37): every verb's options grouped into panels, each option name whole, one style
for types / ranges / defaults; ``-h``; ``--version``."""

import functools
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
def test_help_fits_one_screen_and_the_rest_is_one_flag_away(path, cmd):
    """Issue 80: ``--help`` is at most 60 lines at 80 columns (graft's was 253, merge's 228); a command with more
    options shows its common ones, a clause of help each, and names what ``--help-all`` adds."""
    text = help_of(*path, "--help")
    assert len(text.splitlines()) <= 60, f"{' '.join(path)}: {len(text.splitlines())} lines"
    if getattr(cmd, "common", ()):
        assert "--help-all" in text and "more:" in text
        full = help_of(*path, "--help-all")
        assert len(full.splitlines()) > len(text.splitlines())
        assert full.startswith(text.split("\n", 1)[0])  # the same usage line


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_option_name_whole_at_80_columns(path, cmd):
    text = help_of(*path, "--help-all" if getattr(cmd, "common", ()) else "--help")
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
    text = help_of("graft", "--help-all")
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
    text = help_of("merge", "--help-all")
    for panel in ("Model", "Data", "Merge", "Localizer", "Output"):
        assert f"─ {panel}" in text, panel


def test_short_help_and_version():
    assert help_of("graft", "-h") == help_of("graft", "--help")
    assert "Commands" in help_of("-h") and "Commands" in help_of("continual", "-h")
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"skillgraft {version('skillgraft')}"


HELP = """
import sys
from skillgraft.cli.entry import main
for args in {runs!r}:
    sys.argv = ["skillgraft", *args]
    try:
        main()
    except SystemExit as e:
        assert e.code in (0, None), (args, e.code)
    sys.stdout.flush()
    print("@@ENDED@@", *sorted(m for m in {heavy!r} if m in sys.modules), flush=True)
"""
HEAVY = ("torch", "transformers", "matplotlib", "numpy", "safetensors", "peft", "accelerate", "datasets", "fastapi",
         "uvicorn")
HELP_ARGS = [["--help"], ["graft", "--help"], ["merge", "-h"], ["continual", "add", "--help"], ["graft", "--help-all"],
             ["serve", "--help"], ["--version"]]


@functools.cache
def _imported_in_turn() -> dict:
    """Every HELP_ARGS command in turn in one fresh interpreter (one start instead of seven): each one's output, and
    the heavy libraries imported by the time it ended (cumulative: the first command to import one shows it)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-c", HELP.format(runs=HELP_ARGS, heavy=HEAVY)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    chunks = r.stdout.split("@@ENDED@@")  # each command's output, then the line of what was imported by then
    outs = [chunks[0]] + [c.partition("\n")[2] for c in chunks[1:-1]]
    mods = [c.partition("\n")[0].split() for c in chunks[1:]]
    assert len(outs) == len(mods) == len(HELP_ARGS), r.stdout
    return {tuple(args): (out, m) for args, out, m in zip(HELP_ARGS, outs, mods)}


def imported_by(args):
    """What ``skillgraft ARGS`` prints, and which heavy libraries it (or a command of HELP_ARGS before it) imported
    (a fresh interpreter)."""
    return _imported_in_turn()[tuple(args)]


@pytest.mark.parametrize("args", HELP_ARGS)
def test_help_imports_no_torch(args):
    """``--help`` is built from the typed specs themselves, with no cache: torch, transformers and matplotlib are
    never imported (skillgraft.lazy), which is what makes it answer in well under a second (bench/RESULTS.md)."""
    out, mods = imported_by(args)
    assert mods == [], mods
    if args != ["--version"]:
        assert "Usage: skillgraft" in out
    if args == ["graft", "--help"]:
        assert out.rstrip() == help_of("graft", "--help").replace("Usage: root", "Usage: skillgraft", 1).rstrip()


def test_a_launcher_naming_the_old_entry_path_still_runs():
    """../shared/gpu/probe.sh writes a launcher with ``from skillgraft.entry import main`` (the path before cli/)."""
    import subprocess
    import sys
    from importlib.metadata import version

    code = "import sys; sys.argv = ['skillgraft', '--version']; from skillgraft.entry import main; main()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"skillgraft {version('skillgraft')}"


def test_continual_add_reads_its_defaults_from_the_verb():
    import inspect

    from skillgraft.cli.commands import continual_add_cmd
    from skillgraft.verbs.continual import continual_add

    verb = inspect.signature(continual_add).parameters
    cli = inspect.signature(continual_add_cmd).parameters
    for name in ("k", "seed", "mode", "init"):
        assert cli[name].default.default == verb[name].default, name


def test_demo_defaults_are_the_recipe_s():
    """`skillgraft demo`'s --out and --seed defaults are run_demo's (one source: skillgraft.spec's DEMO_OUT/SEED)."""
    import inspect
    from pathlib import Path

    from skillgraft.cli.commands import demo
    from skillgraft.recipes.graft import DEMO, run_demo

    cli = inspect.signature(demo).parameters
    verb = inspect.signature(run_demo).parameters
    assert cli["out"].default.default == Path(verb["out"].default)
    assert cli["seed"].default.default == verb["seed"].default == DEMO.seed
