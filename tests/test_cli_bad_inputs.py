"""Bad command-line options and click's usage errors (cli.py).

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (docs/reliability.md; helpers: tests/badinputs.py)."""

from __future__ import annotations


import pytest

from badinputs import refused, snapshot


# ---------------------------------------------------------------------------------------------- CLI options
OPTION_CASES = {
    # id: (verb and options after the common ones, culprits, is click's usage error)
    "finetune-k-zero": (["finetune", "--k", 0], ["--k", "got 0"], False),
    "finetune-k-negative": (["finetune", "--k", -1], ["--k", "got -1"], False),
    "finetune-lr-zero": (["finetune", "--lr", 0], ["--lr", "got 0.0"], False),
    "finetune-steps-negative": (["finetune", "--steps", -5], ["--steps", "got -5"], False),
    "finetune-batch-size-zero": (["finetune", "--batch-size", 0], ["--batch-size", "got 0"], False),
    "finetune-max-length-zero": (["finetune", "--max-length", 0], ["--max-length", "got 0"], False),
    "finetune-test-limit-zero": (["finetune", "--test-limit", 0], ["--test-limit", "got 0"], False),
    "finetune-unknown-optimizer": (["finetune", "--optimizer", "adagrad"], ["--optimizer", "adagrad"], True),
    "finetune-unknown-mode": (["finetune", "--mode", "seq2seq"], ["--mode", "seq2seq"], True),
    "finetune-bad-layers": (["finetune", "--layers", "a,b"], ["--layers", "'a,b'"], False),
    "finetune-unknown-task": (["finetune", "--task", "SST-9"], ["unknown task 'SST-9'"], False),
    "graft-budgets-zero-and-fraction": (["graft", "--budgets", "0,2.5"], ["--budgets", "budget 0 ", "budget 2.5"],
                                        False),
    "graft-budgets-not-a-number": (["graft", "--budgets", "abc"], ["--budgets", "'abc'"], False),
    "graft-test-limit-zero": (["graft", "--test-limit", 0], ["--test-limit", "got 0"], False),
    "graft-steps-negative": (["graft", "--steps", -3], ["--steps", "got -3"], False),
    "graft-lr-negative": (["graft", "--lr", -1], ["--lr", "got -1"], False),
    "graft-sparsity-above-one": (["graft", "--sparsity", 2], ["--sparsity", "got 2"], False),
    "graft-unknown-localizer": (["graft", "--localizer", "oracle"], ["oracle"], False),
    "graft-unknown-baseline": (["graft", "--baselines", "oracle"], ["oracle"], False),
    "sweep-level-zero": (["sweep", "--levels", "0,0.5"], ["--levels", "budget 0 "], False),
    "evaluate-limit-zero": (["evaluate", "{run}", "--limit", 0], ["--limit", "greater than or equal to 1"], True),
    "evaluate-limit-negative": (["evaluate", "{run}", "--limit", -1], ["--limit", "greater than or equal to 1"], True),
    "evaluate-unknown-split": (["evaluate", "{run}", "--split", "validation"], ["'validation'"], False),
    "apply-limit-zero": (["apply", "{graft}", "--limit", 0], ["--limit", "greater than or equal to 1"], True),
    "export-unknown-target": (["export", "{graft}", "--out", "{tmp}/e", "--to", "onnx"], ["--to", "onnx"], True),
    "fim-n-zero": (["fim", "--task", "SST-2", "--n", 0], ["--n", "got 0"], False),
    "fim-unknown-kind": (["fim", "--task", "SST-2", "--kind", "exact"], ["--kind", "'exact'"], True),
    "continual-sparsity-negative": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--sparsity", -1],
                                    ["--sparsity", "got -1"], False),
    "continual-steps-negative": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--steps", -1],
                                 ["--steps", "got -1"], False),
    # numbers out of range: seeds in [0, 2**32 - 1], counts up to 2**31 - 1, floats finite and within float32
    "finetune-seed-negative": (["finetune", "--seed", -1], ["--seed", "greater than or equal to 0", "got -1"], False),
    "finetune-seed-too-large": (["finetune", "--seed", 2**32], ["--seed", "less than or equal to 4294967295"],
                                False),
    "finetune-model-seed-negative": (["finetune", "--model-seed", -1], ["--model-seed", "got -1"], False),
    "finetune-lr-nan": (["finetune", "--lr", "nan"], ["--lr", "finite number"], False),
    "finetune-lr-overflow": (["finetune", "--lr", 1e39], ["--lr", "less than or equal to"], False),
    "finetune-weight-decay-overflow": (["finetune", "--weight-decay", 1e308], ["--weight-decay", "less than"], False),
    "finetune-steps-huge": (["finetune", "--steps", 2**64], ["--steps", "less than or equal to 2147483647"], False),
    "finetune-max-length-huge": (["finetune", "--max-length", 2**64], ["--max-length", "less than or equal"], False),
    "finetune-max-length-beyond-positions": (["finetune", "--max-length", 129],
                                             ["--max-length 129", "128 positions", "at most 128"], False),
    "graft-seed-negative": (["graft", "--seed", -1], ["--seed", "got -1"], False),
    "graft-steps-huge": (["graft", "--steps", 2**64], ["--steps", "less than or equal"], False),
    "graft-sigmoid-bias-inf": (["graft", "--sigmoid-bias", "inf"], ["--sigmoid-bias", "finite number"], False),
    "graft-lr-overflow": (["graft", "--lr", 1e308], ["--lr", "less than or equal"], False),
    "graft-max-length-zero": (["graft", "--max-length", 0], ["--max-length"], True),
    "sweep-seed-too-large": (["sweep", "--seed", 2**40], ["--seed", "less than or equal"], False),
    "fim-fisher-seed-negative": (["fim", "--task", "SST-2", "--fisher-seed", -1], ["--fisher-seed", "got -1"], False),
    "fim-seed-negative": (["fim", "--task", "SST-2", "--seed", -1], ["--seed", "got -1"], False),
    "continual-seed-negative": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--seed", -1],
                                ["--seed", "greater than or equal to 0"], True),
    "continual-k-zero": (["continual", "add", "--state", "{tmp}/state", "--task", "SST-2", "--k", 0], ["--k"], True),
    "demo-seed-negative": (["demo", "--seed", -1], ["--seed", "greater than or equal to 0"], True),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_bad_option(case, ft_run, tiny_graft, tiny_bert, toy_data, tmp_path):
    args, culprits, usage = OPTION_CASES[case]
    names = {"run": ft_run, "graft": tiny_graft, "tmp": tmp_path}
    args = [str(a).format(**names) for a in args]
    verb = args[0] if args[0] != "continual" else "continual add"
    common = {"finetune": ["--task", "SST-2", "--model", tiny_bert, "--out", tmp_path / "run"],
              "graft": ["--finetuned", ft_run, "--out", tmp_path / "g", "--cache", tmp_path / "store"],
              "sweep": ["--finetuned", ft_run, "--out", tmp_path / "s", "--cache", tmp_path / "store"],
              "fim": ["--model", tiny_bert, "--out", tmp_path / "fim"],
              "continual add": ["--model", tiny_bert],
              "demo": ["--out", tmp_path / "demo", "--cache", tmp_path / "store"]}.get(verb, [])
    n = len(verb.split())
    args = [*args[:n], *common, *args[n:]]  # the case's own options come last, so they win
    if verb != "export":
        args += ["--data-dir", toy_data]
    before = snapshot(ft_run)
    refused(tmp_path, args, *culprits, usage=usage)
    assert snapshot(ft_run) == before


@pytest.mark.parametrize("args, says", [
    (["graft", "--bogus"], "No such option: --bogus"),
    (["graft"], "Missing option '--finetuned'"),
])
def test_usage_errors_from_the_installed_command_are_one_line(args, says):
    """click's own usage errors (before any verb runs) get the same one-line contract, exit code 2."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "skillgraft.cli", *args], capture_output=True, text=True, timeout=120)
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and says in lines[0] and "Traceback" not in lines[0]


@pytest.mark.parametrize("args", [
    ["evaluate", "RUN", "--out", ""], ["inspect", "G", "--out", ""], ["fim", "--out", ""],
    ["export", "G", "--to", "peft", "--out", ""], ["graft", "--finetuned", "RUN", "--cache", ""],
    ["continual", "show", ""]], ids=lambda a: "-".join(x for x in a[:2] if x.isalpha()))
def test_an_empty_path_is_refused_not_read_as_this_folder(args, tmp_path, monkeypatch):
    """`--out "$OUT"` with OUT unset: typer would read '' as '.', and evaluate/inspect/fim wrote into the current
    folder; every path option and argument refuses it by name, before any work, writing nothing."""
    from typer.testing import CliRunner

    from skillgraft.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "an empty path" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_every_path_option_has_the_empty_path_guard():
    """No command's path option or argument escapes the guard (a new command gets it when registered)."""
    import inspect
    import typing

    import typer

    from skillgraft.cli import app
    from skillgraft.cli.options import _unwrap_optional, nonempty_path
    from pathlib import Path

    def commands(a):
        yield from a.registered_commands
        for g in a.registered_groups:
            yield from commands(g.typer_instance)

    seen = 0
    for command in commands(app):
        hints = typing.get_type_hints(command.callback)
        for name, p in inspect.signature(command.callback).parameters.items():
            if _unwrap_optional(hints.get(name))[0] is Path and isinstance(p.default, (typer.models.OptionInfo,
                                                                                      typer.models.ArgumentInfo)):
                assert p.default.parser is nonempty_path, (command.callback.__name__, name)
                seen += 1
    assert seen >= 25


def test_a_run_whose_relative_base_is_not_found_from_here_names_its_config(tiny_bert, toy_data, tmp_path,
                                                                            monkeypatch):
    """finetune --model <relative folder> records the name as typed; opened from another folder the base is not
    found: the line names the run's config.json, its field and the folder it was read from."""
    from pathlib import Path

    from typer.testing import CliRunner

    from skillgraft.cli import app

    monkeypatch.chdir(Path(tiny_bert).parent)
    run = tmp_path / "ft"
    r = CliRunner().invoke(app, ["finetune", "--task", "SST-2", "--k", "4", "--seed", "13", "--model",
                                 Path(tiny_bert).name, "--steps", "1", "--eval-every", "0", "--data-dir",
                                 str(toy_data), "--out", str(run)])
    assert r.exit_code == 0, r.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = CliRunner().invoke(app, ["graft", "--finetuned", str(run), "--budgets", "1e-2", "--out", "g"])
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert f"{run / 'config.json'}: its field 'model' ('{Path(tiny_bert).name}'" in line and str(elsewhere) in line
    assert list(elsewhere.iterdir()) == []
