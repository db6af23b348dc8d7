"""io.written(): the "interrupted" line names only complete artifacts that are still there (issue 36: after
SIGHUP during `merge` it listed the scratch folders merge writes a graft into to measure its size, deleted by
then, as "complete before it")."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

from processes import run_main_forked
from userland import merge_args

from skillgraft import io as sio
from skillgraft.io import atomic_dir, written


def test_written_forgets_artifacts_whose_scratch_folder_is_gone(tmp_path):
    sio.handle_signals()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            with atomic_dir(Path(scratch) / "g") as tmp:
                (tmp / "f").write_text("x")
            assert written() == [Path(scratch) / "g"]
        with atomic_dir(tmp_path / "kept") as tmp:
            (tmp / "f").write_text("x")
        assert written() == [tmp_path / "kept"]
    finally:
        for s in sio.STOP_SIGNALS:
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)


def test_sighup_during_merge_names_only_what_exists(classifiers, tmp_path, tmp_path_factory):  # noqa: F811
    out = tmp_path / "m"
    args = merge_args(classifiers, out, "--localizer", "movement", "--budget", "0.05", "--mergekit", "",
                      "--cache", tmp_path / "store")
    stderr_file = tmp_path_factory.mktemp("stderr") / "stderr.txt"
    code = run_main_forked(args, "m", tmp_path, signal.SIGHUP, stderr_file)
    lines = [x.strip() for x in stderr_file.read_text().replace("\r", "\n").splitlines() if x.strip()]
    assert code == 128 + signal.SIGHUP, lines[-5:]
    head = "interrupted (SIGHUP) during skillgraft merge: "
    assert lines[-1].startswith(head), lines[-5:]
    if lines[-1] != head + "nothing was written":
        named = lines[-1].removeprefix(head + "nothing else was written (complete before it: ").rstrip(")").split(", ")
        assert all(Path(p).exists() for p in named), named  # before: /tmp/tmp…/g, deleted
        assert all(Path(p).parent == tmp_path / "store" for p in named), named
    assert not out.exists()
