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
    """Run ``skillgraft.cli.main`` (the real entry point, its signal handlers included) in a child process
    (:func:`start_main`) that waits at ``SKILLGRAFT_WAIT_AT=dir-opened:<wait_at>``; once its temporary sibling in
    ``folder`` exists, send ``sig`` from here. Returns the child's exit code, or -N for signal N (its stderr in
    ``stderr_file``)."""
    child = start_main(args, stderr_file, {"SKILLGRAFT_WAIT_AT": f"dir-opened:{wait_at}"})
    deadline = time.monotonic() + 300
    temp = f".{wait_at}.{child.pid}-*.tmp"  # the child's own temporary sibling of its output
    while not (folder.is_dir() and any(fnmatch.fnmatchcase(p.name, temp) for p in folder.iterdir())):
        if child.ended() or time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"no {temp} appeared in {folder}: {stderr_file.read_text()[-3000:]}")
        time.sleep(0.01)
    os.kill(child.pid, sig)
    return child.wait()


class Child:
    """A `skillgraft` run started by :func:`start_main`: :meth:`wait` gives its exit code, or -N for signal N."""

    def __init__(self, pid: int, proc: subprocess.Popen | None = None):
        self.pid, self.proc, self.status = pid, proc, None

    def ended(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is not None
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            self.status = status if pid else None
        return self.status is not None

    def wait(self) -> int:
        if self.proc is not None:
            return self.proc.wait()
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
        return os.WEXITSTATUS(self.status) if os.WIFEXITED(self.status) else -os.WTERMSIG(self.status)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            if not self.ended():
                os.kill(self.pid, signal.SIGKILL)
            self.wait()


def start_main(args: list, stderr_file: Path, env: dict | None = None, rlimit_fsize: int | None = None,
               stdout_file: Path | None = None) -> Child:
    """Start ``skillgraft.cli.main`` with ``args`` in another process (its stderr in ``stderr_file``, its stdout in
    ``stdout_file`` or dropped, ``env`` added to its environment, files it writes limited to ``rlimit_fsize`` bytes: a
    full disk's twin), forked where that is safe and spawned after CUDA (:func:`must_spawn`); returns at once."""
    import resource

    args = [str(a) for a in args]

    def limit():
        if rlimit_fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (rlimit_fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    if must_spawn():
        with open(stderr_file, "w") as err, open(stdout_file or os.devnull, "w") as out:
            proc = subprocess.Popen([sys.executable, "-c", SPAWNED, *args], stdout=out, stderr=err,
                                    env={**os.environ, **(env or {})}, preexec_fn=limit)
        return Child(proc.pid, proc)

    def main():
        limit()
        sys.argv = ["skillgraft", *args]
        from skillgraft.cli import main

        main()

    return fork_call(main, stderr_file, env, stdout_file)


def fork_call(fn, stderr_file: Path, env: dict | None = None, stdout_file: Path | None = None) -> Child:
    """``fn()`` in a child forked from this process (its imports shared: no interpreter start), ``env`` added to its
    environment, its stderr in ``stderr_file`` and its stdout in ``stdout_file`` (or dropped); the child's exit code
    is fn's SystemExit code, 0 when it returns, 1 (its traceback in stderr) when it raises. Returns at once."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.environ.update(env or {})
            out = os.open(stdout_file or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = os.open(stderr_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.stdout = open(1, "w", closefd=False, buffering=1)
            sys.stderr = open(2, "w", closefd=False, buffering=1)
            try:
                fn()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - shown in the assertion (os._exit would drop the traceback)
                import traceback

                traceback.print_exc()
                code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return Child(pid)


def launch_ranks(launch: list, script: Path, args: list, env: dict, folder: Path) -> subprocess.CompletedProcess:
    """``accelerate launch LAUNCH… SCRIPT ARGS…`` (LAUNCH: the launcher's own flags, e.g. ``--config_file F
    --main_process_port P``, which must name the port) with ``env`` added (a None value: that variable removed), its
    processes forked from this one (their imports shared: a launch costs no interpreter start) where that is safe,
    else (:func:`must_spawn`) the real launcher. As Accelerate's launcher would, it runs torchrun's ranks (each
    with the environment ``prepare_multi_gpu_env`` prepares plus torchrun's rank variables; once one rank fails the
    others are stopped) or, for its simple launcher, one process. Returns the exit code (the first failing rank's;
    128 + N for signal N) and the processes' stderr, rank 0's first, as ``subprocess.run`` would; the stderr files
    are kept in ``folder``."""
    args = [str(a) for a in args]
    launch = [*map(str, launch), str(script), *args]
    if must_spawn():
        return subprocess.run([sys.executable, "-m", "accelerate.commands.launch", *launch], capture_output=True,
                              text=True, env=_with(os.environ, env), timeout=600)
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    parsed, _, _ = _validate_launch_command(launch_command_parser().parse_args(launch))
    # Accelerate's own choice of launcher (commands/launch.py): torchrun's ranks for FSDP / DeepSpeed / Megatron /
    # --multi_gpu without --cpu (a config's `use_cpu` is not --cpu); else its simple launcher: ONE process, however
    # many --num_processes say (`--cpu --num_processes 2` runs one process)
    ranked = (parsed.use_fsdp or parsed.use_deepspeed or parsed.use_megatron_lm or parsed.multi_gpu) and not parsed.cpu
    if not ranked:
        from accelerate.utils.launch import prepare_simple_launcher_cmd_env

        alone = _with(prepare_simple_launcher_cmd_env(parsed)[1], env)
        code = fork_call(_script(alone, script, args), folder / ".rank0.stderr").wait()
        return subprocess.CompletedProcess(launch, 128 - code if code < 0 else code, "",
                                           (folder / ".rank0.stderr").read_text())
    base = _with(prepare_multi_gpu_env(parsed), env)
    world = int(parsed.num_processes)
    logs = [folder / f".rank{rank}.stderr" for rank in range(world)]

    ranks = {rank: {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(parsed.main_process_port)} for rank in range(world)}
    pending = [fork_call(_script(ranks[rank], script, args), logs[rank]) for rank in range(world)]
    returncode, deadline = 0, time.monotonic() + 600
    while pending:
        for child in [c for c in pending if c.ended()]:
            pending.remove(child)
            code = child.wait()
            code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it
            if code and not returncode:  # torchrun's rule: one rank failed, the others are stopped
                returncode = code
                for other in pending:
                    os.kill(other.pid, signal.SIGTERM)
        if pending and time.monotonic() > deadline:
            returncode = returncode or 124
            for other in pending:
                os.kill(other.pid, signal.SIGKILL)
        time.sleep(0.01)
    return subprocess.CompletedProcess(launch, returncode, "", "".join(log.read_text() for log in logs))


def _with(environ, env: dict) -> dict:
    return {k: v for k, v in {**environ, **env}.items() if v is not None}


def run_console_script(name: str, args: list, env: dict, stderr_file: Path) -> int:
    """The installed command ``name`` (a console script, e.g. mergekit-yaml) with ``args``: its entry point run as
    its script runs it (``sys.exit(main())``), forked from this process (its imports shared) where that is safe,
    else (:func:`must_spawn`) the script itself. Its exit code; its stderr in ``stderr_file``."""
    args = [str(a) for a in args]
    if must_spawn():
        with open(stderr_file, "w") as err:
            return subprocess.run([str(Path(sys.executable).with_name(name)), *args], stdout=subprocess.DEVNULL,
                                  stderr=err, env={**os.environ, **env}).returncode
    from importlib.metadata import entry_points

    (point,) = entry_points(group="console_scripts", name=name)

    def script():
        sys.argv = [name, *args]
        sys.exit(point.load()())

    return fork_call(script, stderr_file, env).wait()


def _script(environ: dict, script: Path, args: list):
    """A launched process's body: exactly ``environ`` as its environment, no Accelerate state left from an earlier
    test of this worker, then ``script`` run as ``__main__`` with ``args``."""

    def main():
        os.environ.clear()
        os.environ.update(environ)
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        sys.argv = [str(script), *args]
        import runpy

        runpy.run_path(str(script), run_name="__main__")

    return main
