"""A Python interpreter that never imported skillgraft, for the tests that read what skillgraft wrote as a user's own
tools would (plain transformers / peft / safetensors) or call the library from a program that never touched the CLI.

Starting a fresh interpreter per such test paid torch's and transformers' imports each time (≈ 5 s). Instead one
*clean* interpreter per pytest worker imports those libraries once, and nothing of skillgraft, and forks a child per
program: each child starts as a fresh interpreter would after those imports (skillgraft not in ``sys.modules``), runs
the program as ``python -c CODE ARGS…`` runs it, and exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ZYGOTE = r"""
import json, os, sys, traceback
import torch, transformers, peft, safetensors.torch  # the readers' libraries, imported once
assert not any(m.startswith("skillgraft") for m in sys.modules)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            sys.argv = ["-c", *job["args"]]
            try:
                exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class CleanPython:
    """``run(code, *args)``: ``python -c CODE ARGS…`` in a child of the clean interpreter; a CompletedProcess."""

    def __init__(self, folder: Path):
        self.folder, self.count, self.lock = folder, 0, threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=os.environ.copy())

    def run(self, code: str, *args, cwd: Path | None = None, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        with self.lock:
            self.count += 1
            out, err = self.folder / f"{self.count}.stdout", self.folder / f"{self.count}.stderr"
            job = {"code": code, "args": [str(a) for a in args], "cwd": str(cwd or os.getcwd()),
                   "env": {**os.environ, **(env or {})}, "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            said = self.proc.stdout.readline()
            if not said:
                raise RuntimeError(f"the clean interpreter ended (exit {self.proc.wait()})")
        done = subprocess.CompletedProcess(["python", "-c", code, *job["args"]], int(said), out.read_text(),
                                           err.read_text())
        if check and done.returncode:
            raise AssertionError(f"python -c … exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)
