"""Where the host checks run their commands: this machine, or a host over ssh, behind one small interface
(`Commands.run(argv)`), so the tests feed recorded outputs of the real tools through the same one.

Every command's output is read bounded (the tool-output limit) and the command is killed, its whole
process group, at its timeout. A tool that is absent answers as a shell does (exit 127); a host that
cannot be reached at all is bad input (HostUnreachable, exit 2).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

from patchkit.bounded_process import run_bounded
from patchkit.errors import PatchkitError

TIMEOUT_S = 30.0
IMAGE_TIMEOUT_S = 300.0  # `docker run --rm IMAGE nvcc --version` may first pull the image
NOT_FOUND = 127  # what a shell answers for a command it cannot find; LocalCommands answers the same


@dataclass(frozen=True)
class Output:
    """What a command printed (stdout and stderr together) and its exit status; `code` None: timed out."""

    code: int | None
    text: str


class Commands(Protocol):
    """Where the checks run their commands: `where` names the host in every finding."""

    where: str

    def run(self, argv: tuple[str, ...], timeout: float = TIMEOUT_S) -> Output: ...


class HostUnreachable(PatchkitError):
    """ssh could not reach or log in to `host` (exit 2; `detail` is ssh's own words): no check can say
    anything of it."""

    def __init__(self, host: str, detail: str):
        self.host, self.detail = host, detail
        super().__init__(f"{host}: cannot run commands there over ssh: {detail}")


class InvalidHost(PatchkitError):
    """A host given as `url` that is neither `local` nor ssh://[USER@]HOST[:PORT] (`port` None), or whose
    `port` is not a number (exit 2)."""

    def __init__(self, url: str, port: str | None = None):
        self.url, self.port = url, port
        super().__init__(f"host {url!r}: give `local` or ssh://[USER@]HOST[:PORT]" if port is None
                         else f"host {url!r}: the port {port!r} is not a number")


def _bounded(argv: list[str], timeout: float, what: str) -> Output:
    """Run `argv`, reading at most the tool-output limit of what it prints; killed (its whole process
    group) at `timeout`."""
    try:
        finished = run_bounded(argv, timeout=timeout, kind="tool-output", what=what)
    except FileNotFoundError:
        return Output(NOT_FOUND, f"{argv[0]}: command not found")
    except OSError as exc:
        return Output(NOT_FOUND, f"{argv[0]}: cannot be run: {exc.strerror or exc}")
    return Output(None if finished.timed_out else finished.code, finished.output.decode("utf-8", "replace"))


class LocalCommands:
    """This machine."""

    where = "local"

    def run(self, argv: tuple[str, ...], timeout: float = TIMEOUT_S) -> Output:
        return _bounded(list(argv), timeout, f"the output of `{shlex.join(argv)}`")


class SshCommands:
    """`ssh://[user@]host[:port]`, through the system's ssh client (keys and ~/.ssh/config as for a login;
    BatchMode: never a password prompt). ssh's own exit status 255 is a host not reached."""

    def __init__(self, url: str):
        if not url.startswith("ssh://") or not url[len("ssh://"):]:
            raise InvalidHost(url)
        self.where = url
        rest = url[len("ssh://"):].rstrip("/")
        dest, _, port = rest.rpartition(":") if ":" in rest.split("@")[-1] else (rest, "", "")
        if port and not port.isdigit():
            raise InvalidHost(url, port)
        self.dest, self.port = dest, port

    def run(self, argv: tuple[str, ...], timeout: float = TIMEOUT_S) -> Output:
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *(["-p", self.port] if self.port else []),
               self.dest, "--", shlex.join(argv)]
        out = _bounded(ssh, timeout, f"{self.where}: the output of `{shlex.join(argv)}`")
        if out.code == 255:
            raise HostUnreachable(self.where, out.text.strip()[-500:] or "ssh exited 255")
        if out.code == NOT_FOUND and not out.text and argv:  # the remote shell's "not found" is on its stderr
            return Output(NOT_FOUND, f"{argv[0]}: command not found")
        return out


def commands_for(host: str) -> Commands:
    return LocalCommands() if host in ("local", "localhost") else SshCommands(host)
