"""kill -9 at any point of ``skillgraft graft`` never leaves an artifact that disagrees with its report: either
no report folder, or a complete one whose metrics.json lists exactly the graft folders present (each loads, each
of the size its row says); the store holds only finished entries; the re-run finishes and sweeps the leftovers.

One kill comes from outside (SIGKILL to a real ``skillgraft graft``, its entry point in a forked child, once its
report is being written); the others are exact: a forked child runs the verb with
``SKILLGRAFT_CRASH_AT=<point>:<name>`` (skillgraft.io.crash_point) and SIGKILLs itself there — a finished store
entry not yet renamed, a graft folder written, metrics.json written, the whole report written, the report in place,
and an old report moved aside with the new one not yet in place (rolled back by the next run).

SIGTERM and SIGHUP (schedulers, ``timeout``, container stops, a closed terminal) get Ctrl-C's cleanup: a real
``skillgraft graft`` gets SIGTERM from outside mid-report; then every verb that writes runs in a forked child
(the real entry point, ``skillgraft.cli.main``) that waits once its output's temporary sibling exists
(``SKILLGRAFT_WAIT_AT=dir-opened:<name>``), gets each signal from outside, exits 128 + the signal's number with
one line, and leaves every folder as it was.
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

from processes import SPAWNED, fork_call, must_spawn, run_main_forked, start_main

from skillgraft.cli import app
from skillgraft.graft import Graft

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
runner = CliRunner()


def graft_args(ft_run, toy_data, out, store, *extra) -> list[str]:
    return [str(a) for a in ("graft", "--finetuned", ft_run, "--out", out, "--cache", store, "--budgets", "0.01,0.1",
                             "--steps", 3, "--test-limit", 8, "--baselines", "movement", "--no-lottery-zero",
                             "--data-dir", toy_data, *extra)]


def run_forked(args: list[str], crash_at: str | None = None):
    """Run the CLI in a forked child (imports shared, so it is quick); its exit code, or 'SIGKILL'."""
    if must_spawn():
        env = {**os.environ, **({"SKILLGRAFT_CRASH_AT": crash_at} if crash_at else {})}
        code = subprocess.run([sys.executable, "-c", SPAWNED, *args], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode
    else:
        code = fork_call(lambda: sys.exit(runner.invoke(app, args).exit_code), Path(os.devnull),
                         {"SKILLGRAFT_CRASH_AT": crash_at} if crash_at else None).wait()
    return "SIGKILL" if code == -signal.SIGKILL else (f"signal {-code}" if code < 0 else code)


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

    # 1. From outside: SIGKILL a real `skillgraft graft` process (the entry point, forked: no interpreter start; a
    # SIGKILL is never handled, so nothing differs from `python -m skillgraft.cli`) once its report is being written.
    child = start_main(graft_args(ft_run, toy_data, out, tmp_path / "store-1"), tmp_path / "stderr-1.txt")
    deadline = time.monotonic() + 120
    while not child.ended() and time.monotonic() < deadline and not any(
            p.name.startswith(".K.") for p in tmp_path.iterdir()):
        time.sleep(0.01)
    time.sleep(0.3)
    child.kill()
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


# ---------------------------------------------------------------------------------------------- SIGTERM / SIGHUP
# What schedulers, `timeout`, container stops (SIGTERM) and a closed terminal (SIGHUP) send: each unwinds like
# Ctrl-C, so no temporary sibling is left, prints one line naming the verb and exits 128 + the signal's number.
STOPS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]  # SIGINT: Ctrl-C, for comparison


def interrupted_ok(code, stderr: str, sig, verb: str, done_before: tuple[str, ...] = ()) -> None:
    """``done_before``: the kinds of store stages the verb may finish before its output folder opens (those it did
    not find in the store already)."""
    name = "Ctrl-C" if sig == signal.SIGINT else sig.name
    lines = [x.strip() for x in stderr.replace("\r", "\n").splitlines() if x.strip()]
    assert code == 128 + sig, (code, lines[-5:])
    assert "Traceback" not in stderr and not any(x.startswith("error:") for x in lines), lines[-10:]
    head = f"interrupted ({name}) during skillgraft {verb}: "
    if lines[-1] != head + "nothing was written":
        done = lines[-1].removeprefix(head + "nothing else was written (complete before it: ").rstrip(")").split(", ")
        kinds = [Path(p).name.split("-")[0] for p in done]
        assert kinds and kinds == [k for k in done_before if k in kinds], lines[-5:]
    assert sum("interrupted" in x for x in lines) == 1


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def test_sigterm_from_outside_during_graft_leaves_nothing(ft_run, toy_data, tmp_path):
    """The issue's case: a real `skillgraft graft` process (no test hook) gets SIGTERM from outside while its
    report's temporary folder exists (polled for, not slept on): before, it died leaving `.g.<pid>-….tmp`."""
    sig = signal.SIGTERM
    out, store = tmp_path / "g", tmp_path / "store"
    args = graft_args(ft_run, toy_data, out, store)
    args[args.index("--steps") + 1] = "400"  # long enough to be caught mid-localization
    err = tmp_path / "stderr.txt"
    child = start_main(args, err, {"OMP_NUM_THREADS": "1"})  # the real entry point, forked: no interpreter start
    deadline = time.monotonic() + 300
    while not child.ended() and time.monotonic() < deadline and not leftovers(tmp_path):
        time.sleep(0.01)
    assert not child.ended(), f"finished before its report folder was seen: {err.read_text()[-2000:]}"
    os.kill(child.pid, sig)
    interrupted_ok(child.wait(), err.read_text(), sig, "graft")
    assert not out.exists() and leftovers(tmp_path) == []
    assert not store.exists() or leftovers(store) == []


WRAPPED = """
import os, signal, sys
import typer
from pydantic import BaseModel, field_serializer
from skillgraft.cli.output import friendly, run_app

class Row(BaseModel):
    x: int = 1

    @field_serializer("x")
    def _x(self, v):
        os.kill(os.getpid(), signal.SIGTERM)  # handled inside pydantic's serializer, which wraps what it raises
        return v

app = typer.Typer()

@app.command()
@friendly
def graft():
    Row().model_dump()

@app.command()
def other():
    pass

sys.argv[1:] = ["graft"]
run_app(app)
"""


def test_a_signal_wrapped_by_a_library_is_still_an_interruption(tmp_path):
    """SIGTERM handled while pydantic serializes (a report row's field serializer) raises Interrupted inside
    pydantic, which re-raises it as a PydanticSerializationError: it was a traceback and exit 1 (seen once in
    test_sigterm_from_outside_during_graft_leaves_nothing under load); it is the interruption's one line and 143."""
    script = tmp_path / "wrapped.py"
    script.write_text(WRAPPED)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    interrupted_ok(r.returncode, r.stderr, signal.SIGTERM, "graft")


@pytest.fixture(scope="module")
def report(ft_run, toy_data, tmp_path_factory):
    """A complete graft report (its graft folders for apply / export / inspect) and its store."""
    root = tmp_path_factory.mktemp("report")
    r = runner.invoke(app, graft_args(ft_run, toy_data, root / "g", root / "store"))
    assert r.exit_code == 0, r.output
    return root / "g", root / "store"


def _verb_cases(ft_run, toy_data, tiny_bert, report, root: Path) -> dict:
    """verb → (arguments, the output name the child waits at, the folder its temporary sibling appears in)."""
    out_g, store = report
    graft = next((out_g / "grafts").iterdir())
    (root / "store").mkdir()  # an empty store, which must stay empty
    recipe = root / "r.yaml"
    recipe.write_text(f"recipe: graft\nmodel: {tiny_bert}\nk: 4\nseed: 13\ndata_dir: {toy_data}\ntest_limit: 8\n"
                      "finetune: {steps: 2, eval_every: 2, optimizer: adamw, lr: 0.001}\nlocalize: {steps: 1}\n"
                      "report: {baselines: [], lottery_zero: false}\n")
    q = lambda *a: [str(x) for x in a]  # noqa: E731
    return {
        "finetune": (q("finetune", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--steps", 2, "--eval-every", 2,
                       "--test-limit", 4, "--data-dir", toy_data, "--out", root / "run"), "run", root),
        "graft": (q(*graft_args(ft_run, toy_data, root / "g", store)), "g", root),
        "graft --overwrite": (q(*graft_args(ft_run, toy_data, out_g, store, "--overwrite")), "g", out_g.parent),
        "graft (store)": (q(*graft_args(ft_run, toy_data, root / "g2", root / "store", "--budgets", "0.2")),
                          "regions-*", root / "store"),
        "sweep": (q("sweep", "--finetuned", ft_run, "--out", root / "s", "--cache", root / "store", "--levels",
                    "0.01", "--no-learned", "--localizers", "movement", "--test-limit", 8, "--data-dir", toy_data),
                  "s", root),
        "apply": (q("apply", graft, "--model", tiny_bert, "--data-dir", toy_data, "--limit", 4, "--export",
                    root / "x"), "x", root),
        "export": (q("export", graft, "--model", tiny_bert, "--to", "peft", "--out", root / "e"), "e", root),
        "inspect": (q("inspect", graft, "--out", root / "i"), "i", root),
        "evaluate": (q("evaluate", ft_run, "--data-dir", toy_data, "--limit", 4, "--out", root / "ev"), "ev", root),
        "fim": (q("fim", "--task", "SST-2", "--k", 4, "--model", tiny_bert, "--n", 4, "--data-dir", toy_data,
                  "--out", root / "f"), "f", root),
        "run": (q("run", recipe, "--out", root / "rr", "--cache", root / "store"), "rr", root),
        "continual add": (q("continual", "add", "--state", root / "st", "--task", "SST-2", "--k", 4, "--model",
                            tiny_bert, "--steps", 2, "--localize-steps", 1, "--test-limit", 4, "--data-dir",
                            toy_data), "st", root),
    }


VERBS = ["finetune", "graft", "graft --overwrite", "graft (store)", "sweep", "apply", "export", "inspect", "evaluate",
         "fim", "run", "continual add"]


# Every verb under one of the three signals in turn (each signal reaches four verbs), and graft under all three: the
# guard that turns a signal into a clean exit is one (skillgraft/signals.py) and the verb decides only where its
# temporary lives, so the full verbs × signals product (36 forked runs) ran that one guard 22 more times.
CASES = [(verb, STOPS[i % len(STOPS)]) for i, verb in enumerate(VERBS)]
CASES += [("graft", s) for s in STOPS if ("graft", s) not in CASES]


@pytest.mark.parametrize("verb, sig", CASES, ids=[f"{v}-{s.name}" for v, s in CASES])
def test_each_verb_that_writes_cleans_up_on_sigterm_sighup_and_ctrl_c(verb, sig, ft_run, toy_data, tiny_bert, report,
                                                                tmp_path, tmp_path_factory):
    """The signal arrives from outside while the verb's output (or its store entry) is a temporary sibling:
    exit 128 + signal, one line, and every folder involved byte for byte as it was (an old report too)."""
    cases = _verb_cases(ft_run, toy_data, tiny_bert, report, tmp_path)
    args, wait_at, folder = cases[verb]
    roots = [tmp_path, report[0].parent]
    before = [snapshot(r) for r in roots]
    stderr_file = tmp_path_factory.mktemp("stderr") / "stderr.txt"
    code = run_main_forked(args, wait_at, folder, sig, stderr_file)
    stderr = stderr_file.read_text()
    # continual add: the single-task fine-tuning and γ are store stages (outside these roots), finished first
    interrupted_ok(code, stderr, sig, verb.split(" (")[0].split(" --")[0],
                   ("ft", "regions") if verb == "continual add" else ())
    assert [snapshot(r) for r in roots] == before, stderr[-3000:]
