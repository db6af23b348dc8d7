"""``skillgraft serve ROUTED_DIR``: routed skills behind an OpenAI-compatible HTTP endpoint (docs/serve.md).

The folder is checked (routed.json and its paths) and the port bound before the model loads; the model loads
under the command's placement (``--device``, ``--precision``); the web layer is :mod:`skillgraft.verbs.serve_app`
(FastAPI) run by uvicorn on one socket bound here, so ``--port 0`` takes a free port and the address is known
before the first request. SIGTERM or Ctrl-C stops accepting connections and lets the requests in flight finish
(at most ``drain_seconds``), then returns.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.spec import Spec
from skillgraft.verbs.result import VerbResult


class ServeSpec(Spec):
    """Where ``skillgraft serve`` listens and what one request may ask."""

    host: str = Field("127.0.0.1", description="address to listen on (127.0.0.1: this machine only)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0: a free one, printed when ready)")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="largest request body (bytes); larger: HTTP 413")
    max_rows: int = Field(64, ge=1, description="most prompts or texts in one request")
    max_tokens: int = Field(512, ge=1, description="most tokens one completion may ask for")
    threshold: float | None = Field(None, ge=0, le=1, description="model `auto`: rows whose likeliest skill has a "
                                                                  "lower router probability go to the base model "
                                                                  "(default: the router's own, 0)")
    drain_seconds: float = Field(30.0, ge=0, description="on SIGTERM / Ctrl-C, how long requests in flight may "
                                                         "still run")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"not a host name or address: {value!r}")
        return value


@dataclasses.dataclass
class ServeResult(VerbResult):
    """What a finished ``serve`` did: where it listened, what it served, how many requests it answered, and the
    signal that stopped it (None: stopped by the caller)."""

    url: str
    skills: list[str]
    requests: int
    stopped_by: str | None


def check_folder(folder: str | os.PathLike) -> Path:
    """``folder`` is a routed folder (routed.json readable, its paths inside it): one line otherwise, before any
    model loads."""
    from skillgraft.graft.routed import read_routed  # noqa: PLC0415

    folder = Path(folder)
    if not folder.is_dir():
        raise SkillgraftError(f"{folder}: no such folder (serve takes the routed/ folder `skillgraft merge "
                              "--routed` writes)")
    if not (folder / "routed.json").is_file():
        raise SkillgraftError(f"{folder}: no routed.json (serve takes the routed/ folder `skillgraft merge --routed` "
                              "writes)")
    read_routed(folder)
    return folder


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on (host, port); a port in use or an unknown host is one line."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
    except OSError as e:
        raise SkillgraftError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def serve(folder: str | os.PathLike, spec: ServeSpec | None = None, *,
          on_ready: Callable[[str, list[str]], None] | None = None, runtime=None) -> ServeResult:
    """Serve the routed skills of ``folder`` until SIGTERM / Ctrl-C (``on_ready(url, model ids)`` once listening).
    ``runtime``: where the model loads and computes (None: the placement the command line activated)."""
    import uvicorn  # noqa: PLC0415

    from skillgraft.graft.routed import RoutedSkills  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415
    from skillgraft.verbs.serve_app import build_app  # noqa: PLC0415

    runtime = boundary(runtime)  # the one read of the placement the command line activated
    spec = spec or ServeSpec()
    folder = check_folder(folder)
    sock = bind(spec.host, spec.port)  # a port in use is refused before the model loads
    try:
        skills = RoutedSkills.from_pretrained(folder, runtime=runtime)
        app, state = build_app(skills, spec)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started and on_ready is not None:
                on_ready(url, state.model_ids)

        def handle_exit(self, sig, frame):  # drain, then return (uvicorn would raise the signal again after)
            self.stopped_by = sig
            if self.should_exit:
                self.force_exit = True
            else:
                self.should_exit = True

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=spec.drain_seconds, lifespan="off",
                            access_log=False, server_header=False)
    server = Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    name = signal.Signals(server.stopped_by).name if server.stopped_by else None
    return ServeResult(url, skills.tasks, state.requests, name)
