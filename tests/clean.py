"""A Python interpreter that never imported skillgraft, for the tests that read what skillgraft wrote as a user's own
tools would (plain transformers / peft / safetensors) or call the library from a program that never touched the CLI.

Starting a fresh interpreter per such test paid torch's and transformers' imports each time (≈ 5 s). Instead each
pytest worker, before it collects any test (so before anything imports skillgraft), imports those libraries — which
its tests need anyway — and forks a *clean* process (:func:`fork_clean`) that waits for programs. For each program the
clean process forks a child that starts as a fresh interpreter would after those imports (skillgraft not in
``sys.modules``), runs the program as ``python -c CODE ARGS…`` runs it, and exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path


def _serve(jobs: int, results: int) -> None:
    """The clean process: a job per line on ``jobs`` (JSON), the exit code of its program per line on ``results``
    (-N: ended by signal N, as subprocess reports it)."""
    from processes import fork_call

    assert not any(m.startswith("skillgraft") for m in sys.modules), "the clean interpreter imported skillgraft"
    with os.fdopen(jobs) as lines, os.fdopen(results, "w") as said:
        for line in lines:
            job = json.loads(line)

            def program(job=job):
                os.chdir(job["cwd"])
                os.environ.clear()
                os.environ.update(job["env"])
                sys.argv = ["-c", *job["args"]]
                exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})

            said.write(f"{fork_call(program, Path(job['stderr']), stdout_file=Path(job['stdout'])).wait()}\n")
            said.flush()


class CleanPython:
    """``run(code, *args)``: ``python -c CODE ARGS…`` in a child of the clean process; a CompletedProcess. Without a
    clean process (``pid`` None: none was forked before collection), each program runs in a fresh interpreter."""

    def __init__(self, pid: int | None = None, jobs: int | None = None, results: int | None = None):
        self.pid, self.count, self.lock = pid, 0, threading.Lock()
        self.jobs, self.results = (os.fdopen(jobs, "w"), os.fdopen(results)) if pid is not None else (None, None)
        self.folder: Path | None = None

    def run(self, code: str, *args, cwd: Path | None = None, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        if self.pid is None:
            done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                                  cwd=cwd, env={**os.environ, **(env or {})})
            if check and done.returncode:
                raise AssertionError(f"python -c … exited {done.returncode}: {done.stderr[-3000:]}")
            return done
        with self.lock:
            self.count += 1
            out, err = self.folder / f"{self.count}.stdout", self.folder / f"{self.count}.stderr"
            job = {"code": code, "args": [str(a) for a in args], "cwd": str(cwd or os.getcwd()),
                   "env": {**os.environ, **(env or {})}, "stdout": str(out), "stderr": str(err)}
            self.jobs.write(json.dumps(job) + "\n")
            self.jobs.flush()
            said = self.results.readline()
            if not said:
                raise RuntimeError("the clean interpreter ended")
        done = subprocess.CompletedProcess(["python", "-c", code, *job["args"]], int(said), out.read_text(),
                                           err.read_text())
        if check and done.returncode:
            raise AssertionError(f"python -c … exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def close(self) -> None:
        if self.pid is not None:
            self.jobs.close()
            self.results.close()
            os.waitpid(self.pid, 0)


def fork_clean() -> CleanPython:
    """Fork the clean process from this one, which must not have imported skillgraft (its readers' libraries
    imported first: the child shares them). The child keeps only its two pipes (not pytest's or xdist's files)."""
    import peft  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    jobs_r, jobs_w = os.pipe()
    results_r, results_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            low, high = sorted((jobs_r, results_w))  # every other descriptor closed (pytest's, xdist's pipes)
            os.closerange(3, low)
            os.closerange(low + 1, high)
            os.closerange(high + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
            _serve(jobs_r, results_w)
            code = 0
        finally:
            os._exit(code)
    os.close(jobs_r)
    os.close(results_w)
    return CleanPython(pid, jobs_w, results_r)
