"""kill -9 at any point of ``skillgraft graft`` never leaves an artifact that disagrees with its report: either
no report folder, or a complete one whose metrics.json lists exactly the graft folders present (each loads, each
of the size its row says); the store holds only finished entries; the re-run finishes and sweeps the leftovers.

One kill comes from outside (SIGKILL to a real ``python -m skillgraft.cli graft`` once its report is being
written); the others are exact: a forked child runs the verb with ``SKILLGRAFT_CRASH_AT=<point>:<name>``
(skillgraft.io.crash_point) and SIGKILLs itself there — a finished store entry not yet renamed, a graft folder
written, metrics.json written, the whole report written, the report in place, and an old report moved aside
with the new one not yet in place (rolled back by the next run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillgraft.cli import app
from skillgraft.graft import Graft

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
runner = CliRunner()


@pytest.fixture(scope="module")
def ft_run(tiny_bert, toy_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("kill") / "ft"
    r = runner.invoke(app, [str(a) for a in (
        "finetune", "--task", "SST-2", "--k", 8, "--seed", 13, "--model", tiny_bert, "--optimizer", "adamw", "--lr",
        1e-3, "--steps", 6, "--eval-every", 3, "--data-dir", toy_data, "--test-limit", 8, "--out", out)])
    assert r.exit_code == 0, r.output
    return out


def graft_args(ft_run, toy_data, out, store, *extra) -> list[str]:
    return [str(a) for a in ("graft", "--finetuned", ft_run, "--out", out, "--cache", store, "--budgets", "0.01,0.1",
                             "--steps", 3, "--test-limit", 8, "--baselines", "movement", "--no-lottery-zero",
                             "--data-dir", toy_data, *extra)]


def run_forked(args: list[str], crash_at: str | None = None):
    """Run the CLI in a forked child (imports shared, so it is quick); its exit code, or 'SIGKILL'."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            if crash_at:
                os.environ["SKILLGRAFT_CRASH_AT"] = crash_at
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = runner.invoke(app, args).exit_code
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "SIGKILL" if os.WTERMSIG(status) == signal.SIGKILL else f"signal {os.WTERMSIG(status)}"
    return os.WEXITSTATUS(status)


def consistent(out: Path, store: Path) -> str:
    """The invariant after any kill; returns 'absent' or 'complete'."""
    if store.exists():
        unfinished = [p.name for p in store.iterdir() if not p.name.startswith(".") and not (p / "key.json").is_file()]
        assert not unfinished, f"store entries without key.json: {unfinished}"
    if not out.exists():
        return "absent"
    metrics = json.loads((out / "metrics.json").read_text())
    report = (out / "report.md").read_text()
    assert (out / "results.csv").is_file()
    rows = {r["model"].removeprefix("graft "): r for r in metrics["rows"] if r["kind"] == "graft"}
    folders = {p.name.removeprefix("budget-"): p for p in (out / "grafts").iterdir()}
    assert sorted(folders) == sorted(rows), (sorted(folders), sorted(rows))  # nothing more, nothing less
    for label, folder in folders.items():
        assert Graft.from_pretrained(folder).size == rows[label]["params"]
        assert rows[label]["model"] in report
    return "complete"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_kill_9_never_leaves_a_report_that_disagrees(ft_run, toy_data, tmp_path):
    out, store = tmp_path / "K", tmp_path / "store"

    # 1. From outside: SIGKILL a real `skillgraft graft` process once its report folder is being written.
    proc = subprocess.Popen([sys.executable, "-m", "skillgraft.cli", *graft_args(ft_run, toy_data, out,
                                                                                 tmp_path / "store-1")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not any(
            p.name.startswith(".K.") for p in tmp_path.iterdir()):
        time.sleep(0.01)
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    assert consistent(out, tmp_path / "store-1") in ("absent", "complete")
    if out.exists():  # it finished before the kill landed: start from nothing again
        import shutil

        shutil.rmtree(out)

    # 2. Exact points, each in a forked child that SIGKILLs itself there.
    args = graft_args(ft_run, toy_data, out, store)
    for point, expect in [("dir-written:regions-*", "absent"),   # store entry complete, not yet renamed
                          ("dir-written:budget-*", "absent"),    # a graft folder written inside the report
                          ("file-written:metrics.json", "absent"),
                          ("dir-written:K", "absent"),           # the whole report written, not yet renamed
                          ("dir-renamed:K", "complete")]:        # the report in place
        assert run_forked(args, point) == "SIGKILL", f"{point} was never reached"
        assert consistent(out, store) == expect, point
    done = (out / "metrics.json").read_bytes()
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")]  # the regions entry was finished

    # an existing report is refused without --overwrite, and left as it was
    assert runner.invoke(app, args).exit_code == 2
    assert (out / "metrics.json").read_bytes() == done

    # 3. Killed while replacing: the old report moved aside, the new one not yet in place → no report folder;
    # the next run rolls the replacement back (the old report returns, refused again without --overwrite).
    assert run_forked([*args, "--overwrite"], "dir-swapped:K") == "SIGKILL"
    assert consistent(out, store) == "absent"
    assert runner.invoke(app, args).exit_code == 2
    assert consistent(out, store) == "complete" and (out / "metrics.json").read_bytes() == done

    # 4. The re-run with --overwrite finishes, and the leftovers of the killed runs are gone.
    r = runner.invoke(app, [*args, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert consistent(out, store) == "complete"
    assert leftovers(tmp_path) == [] and leftovers(store) == []
