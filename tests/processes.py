"""The CLI's real entry point (``skillgraft.cli.main``) in another process, for the tests that stop it with a signal:
forked where that is safe (imports shared, quick), spawned where the parent already ran CUDA."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SPAWNED = "import sys; from skillgraft.cli import main; sys.argv = ['skillgraft', *sys.argv[1:]]; main()"


def must_spawn() -> bool:
    """A child forked after this process ran CUDA (a GPU machine's suite: the verbs run there) can neither start
    CUDA nor run autograd's backward (PyTorch's fork limits); such a child is spawned instead (slower: imports)."""
    import torch

    return os.environ.get("SKILLGRAFT_TEST_SPAWN") == "1" or (torch.cuda.is_available() and torch.cuda.is_initialized())


def run_main_forked(args: list[str], wait_at: str, folder: Path, sig, stderr_file: Path) -> int:
    """Run ``skillgraft.cli.main`` (the real entry point, its signal handlers included) in a forked child that
    waits at ``SKILLGRAFT_WAIT_AT=dir-opened:<wait_at>``; once its temporary sibling in ``folder`` exists, send
    ``sig`` from here. Returns the child's exit code (its stderr in ``stderr_file``)."""
    proc = None
    if must_spawn():
        with open(stderr_file, "w") as err:
            proc = subprocess.Popen([sys.executable, "-c", SPAWNED, *args], stdout=subprocess.DEVNULL, stderr=err,
                                    env={**os.environ, "SKILLGRAFT_WAIT_AT": f"dir-opened:{wait_at}"})
        pid = proc.pid
    else:
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.environ["SKILLGRAFT_WAIT_AT"] = f"dir-opened:{wait_at}"
            out = os.open(os.devnull, os.O_WRONLY)
            err = os.open(stderr_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            sys.argv = ["skillgraft", *args]
            from skillgraft.cli import main

            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - shown in the assertion (os._exit would drop the traceback)
                import traceback

                traceback.print_exc()
                code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + 300
    temp = f".{wait_at}.{pid}-*.tmp"  # the child's own temporary sibling of its output
    while not (folder.is_dir() and any(fnmatch.fnmatchcase(p.name, temp) for p in folder.iterdir())):
        ended = proc.poll() is not None if proc is not None else os.waitpid(pid, os.WNOHANG) != (0, 0)
        if ended or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            raise AssertionError(f"no {temp} appeared in {folder}: {stderr_file.read_text()[-3000:]}")
        time.sleep(0.01)
    os.kill(pid, sig)
    if proc is not None:
        code = proc.wait()
        return code  # an exit code, or -N for a signal (as below)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
