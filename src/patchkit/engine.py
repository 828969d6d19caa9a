"""The one connection to a Docker-API engine (Docker, or podman's API service) through the docker SDK, and
its one fault policy: what counts as the engine failing, and how that becomes an exit-2 error naming the
step. The build's --engine and --load routes (images/) and the hardware smoke's containers (smoke/) both
connect and fail through here.

And the run a container patchkit creates is marked with (RUN_LABEL: this_run(), whose ids a run cut off
may never learn), with the command that clears them, which every EngineError of those reads names, and
whether a marked run is over (images.leftovers clears what such runs left).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import importlib.util
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from patchkit.errors import PatchkitError

# The Docker API version the build speaks. Naming it saves the SDK's /version round trip, which podman answers
# in ~0.4 s (it gathers host facts). 1.41 is Docker 20.10's; every later Docker and podman 3+ serve it, and
# it has everything the build uses (build with platform, archive reads, push).
API_VERSION = "1.41"
NEGOTIATED = "auto"  # the SDK asks the engine its version (the smoke's hosts are whatever their owners run)
DEFAULT_SOCKET = "/var/run/docker.sock"
REQUEST_TIMEOUT_S = 60  # each request's socket timeout (the docker SDK's own default, named here)
RUN_LABEL = "dev.patchkit.run"          # on every container patchkit creates: the run that made it
STALE_S = 6 * 3600                       # a run on another host older than this is over (no build lasts it)
RUN_ID = re.compile(r"([0-9a-f]{8})\.(\d+)\.(\d+)\.(\d+)")   # host hash . pid . start ticks . unix time


class EngineError(PatchkitError):
    """The engine failed or stopped answering during `step` (exit 2): `cause` is what the transport or the
    SDK raised, `detail` the engine's own words, `clean` the commands that remove what the engine may keep
    from this build."""

    def __init__(self, step: str, cause: str, detail: str = "", clean: Sequence[str] = ()):
        self.step, self.cause, self.detail, self.clean = step, cause, detail, list(clean)
        text = f"the engine failed while {step} ({cause}{': ' + detail if detail else ''})"
        super().__init__(text + (f"; what it may keep: {'; '.join(self.clean)}" if self.clean else ""))


class NoEngine(PatchkitError):
    """No Docker-API engine answers where --engine/--load looked (exit 2): `where` it looked (the URL,
    DOCKER_HOST or the default socket) and the `cause`, the name of what the SDK raised."""

    def __init__(self, where: str, cause: str):
        self.where, self.cause = where, cause
        super().__init__(f"no Docker-API engine at {where} ({cause}): the default daemonless build needs none, "
                         "run `patchkit build` without --engine/--load")


def engine_faults() -> tuple[type[BaseException], ...]:
    """What a Docker-API call raises when the engine errs or goes away: the SDK's errors (its APIError is
    requests' HTTPError), requests' (ConnectionError, ChunkedEncodingError, ReadTimeout), urllib3's that
    leak through a streamed body (ProtocolError), http.client's, the socket's (OSError), and the SDK's
    StreamParseError (a RuntimeError) for a JSON stream cut inside an object."""
    import docker
    import requests
    import urllib3

    return (docker.errors.DockerException, docker.errors.StreamParseError, requests.exceptions.RequestException,
            urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


def engine_refusals() -> tuple[type[BaseException], ...]:
    """What the SDK raises where the engine answered with an error status (its APIError, NotFound among
    them): one of engine_faults() (an APIError is a requests HTTPError), so a caller that tells the engine
    refusing a step from the engine going away catches these first."""
    import docker

    return (docker.errors.APIError,)


def explain(exc: BaseException, limit: int = 500) -> str:
    """The engine's own words for an API error, else the exception's, at most `limit` characters."""
    return str(getattr(exc, "explanation", None) or exc).strip()[:limit]


def answer(exc: BaseException, limit: int = 2000) -> str:
    """What the engine answered (its own words, where the SDK raised its error) or that it did not answer
    (a transport's fault, named by its type), at most `limit` characters."""
    import docker

    if isinstance(exc, docker.errors.DockerException):
        return explain(exc, limit)
    return f"the engine did not answer: {type(exc).__name__}: {exc}"[:limit]


def engine_error(step: str, exc: BaseException, clean: Sequence[str] = ()) -> EngineError:
    """The engine's fault `exc` during `step` as an EngineError: its type, the engine's own words, `clean`."""
    return EngineError(step, exc.__class__.__name__, explain(exc), clean)


@contextmanager
def engine_step(step: str, clean: Callable[[], Sequence[str]] = lambda: (),
                error: Callable[[str, BaseException, Sequence[str]], PatchkitError] = engine_error) -> Iterator[None]:
    """Run one step against the engine: any engine fault becomes `error(step, fault, clean())` (by default an
    EngineError naming the step and what to clean, `clean()` evaluated at the failure); patchkit's own
    errors pass as they are."""
    try:
        yield
    except PatchkitError:
        raise
    except engine_faults() as exc:
        raise error(step, exc, clean()) from None


def _socket_path(engine_url: str | None) -> str | None:
    url = engine_url or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    return url.removeprefix("unix://") if url.startswith(("unix://", "/")) else None


def _refused_by_permission(path: str) -> bool:
    """Whether connecting to the unix socket `path` fails with EACCES (a user outside the docker group)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
    except OSError as exc:
        return exc.errno in (errno.EACCES, errno.EPERM)
    return False


def connect(engine_url: str | None = None, *, version: str = API_VERSION, timeout: int = REQUEST_TIMEOUT_S,
            refuse: Callable[[str, str], PatchkitError] | None = None):
    """A docker SDK client for `engine_url` (else DOCKER_HOST, else the default socket), pinged; each request
    bounded by `timeout` seconds. `ssh://` goes through the system's ssh client, which the SDK's transport
    module imports paramiko for (the `docker[ssh]` extra): refused up front without it.

    Refused: `refuse(step, detail)` where given (a caller's own error kind); else NoEngine, or an EngineError
    naming the permission where the socket refuses this user."""
    import docker

    ssh = bool(engine_url and engine_url.startswith("ssh://"))
    if ssh and importlib.util.find_spec("paramiko") is None:
        detail = ("an ssh:// host needs paramiko, which the docker SDK's ssh transport imports (pip install "
                  "'docker[ssh]'); or forward the host's socket and give unix://")
        raise refuse("connect", detail) if refuse else EngineError("connecting", "no paramiko", detail)
    try:
        client = (docker.DockerClient(base_url=engine_url, version=version, timeout=timeout, use_ssh_client=ssh)
                  if engine_url else docker.from_env(version=version, timeout=timeout))
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' or OSError's by transport
        if refuse is not None:
            raise refuse("connect to the Docker API", answer(exc)) from None
        where = engine_url or os.environ.get("DOCKER_HOST", "the default Docker socket")
        path = _socket_path(engine_url)
        if path is not None and _refused_by_permission(path):
            raise EngineError("connecting", "EACCES", f"permission denied on the engine's socket {path}: this user "
                              "may not use it; join the docker group with `sudo usermod -aG docker $USER`, then "
                              "log out and in again (or run the daemonless build: `patchkit build` without "
                              "--engine/--load)") from None
        raise NoEngine(where, exc.__class__.__name__) from None
    return client


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _start_ticks(pid: int) -> int | None:
    """The process's start time since boot (/proc/PID/stat field 22): with the pid, one process ever."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().decode()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@cache
def this_run() -> str:
    """This process's run id (tag-safe: host hash, pid, start ticks, unix time, dot-separated)."""
    pid = os.getpid()
    return f"{_host()}.{pid}.{_start_ticks(pid) or 0}.{int(time.time())}"


def run_labels() -> dict[str, str]:
    """The labels of a container this run creates."""
    return {RUN_LABEL: this_run()}


def clear_command() -> str:
    """The command that removes every container this run made, the ones whose ids it never learnt too."""
    return f"docker rm -f $(docker ps -aq --filter label={RUN_LABEL}={this_run()})"


def is_over(run: str) -> bool:
    """Whether the run `run` has ended (a value patchkit did not write is no run of its: never over)."""
    found = RUN_ID.fullmatch(run or "")
    if found is None:
        return False
    host, pid, ticks, started = found.group(1), int(found.group(2)), int(found.group(3)), int(found.group(4))
    if host != _host():
        return time.time() - started > STALE_S
    if pid == os.getpid() and ticks == (_start_ticks(pid) or 0):
        return False
    now = _start_ticks(pid)
    if now is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False  # no /proc here and the pid lives: taken for the same run
    return now != ticks
