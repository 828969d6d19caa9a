"""One node's container of the hardware smoke through the Docker API of its host (the docker SDK;
`ssh://user@host` reaches a host's own daemon): created with its GPU request, host networking and IPC,
labelled so the smoke only ever removes its own, its log read bounded before it is removed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from patchkit.engine import NEGOTIATED, answer, connect, engine_step
from patchkit.errors import PatchkitError
from patchkit.untrusted import InputTooLarge, limit_of


class Runner(Protocol):
    """One container on one host. `stop` stops it and removes it (its log was read first)."""

    host: str

    def start(self, image: str, argv: tuple[str, ...], env: dict[str, str], name: str) -> None: ...
    def running(self) -> bool: ...
    def logs(self) -> str: ...
    def image_digest(self) -> str | None: ...
    def stop(self) -> None: ...


def host_name(host: str) -> str:
    """The machine a Docker host URL names: `ssh://user@spark-1:22` -> `spark-1`; a local socket
    (`unix:///run/docker.sock`, `npipe://`) is this machine, 127.0.0.1."""
    if host.startswith(("unix://", "npipe://")) or ("://" not in host and host.startswith("/")):
        return "127.0.0.1"
    return host.split("://")[-1].split("@")[-1].split(":")[0].split("/")[0]


SMOKE_LABEL = "io.patchkit.smoke"  # on every container the smoke creates: only those it ever removes
GPU_CHOICES = ("auto", "all", "none")
STOP_TIMEOUT_S = 30  # vLLM shuts down on SIGTERM; a wedged engine gets SIGKILL after this
REQUEST_TIMEOUT_S = 120  # each request to a host's engine (an ssh:// host's round trips are slower)


class RunnerError(PatchkitError):
    """A host's container engine refused or failed a step of the smoke (exit 2): `host` the engine asked,
    `step` what it was asked, `detail` its answer (patchkit.engine.EngineError is the build's)."""

    def __init__(self, host: str, step: str, detail: str):
        self.host, self.step, self.detail = host, step, detail
        super().__init__(f"{host}: {step}: {detail}")


def _engine(host: str, step: str):
    """An engine fault during `step` (patchkit.engine's policy) as one RunnerError naming the host and the step."""
    def refused(step: str, fault: BaseException, clean: Sequence[str]) -> RunnerError:
        return RunnerError(host, step, answer(fault))

    return engine_step(step, error=refused)


class RemoteHomeUnknown(PatchkitError):
    """`--hf-cache` `path` starts with ~ for the remote `host`, whose home directory is not known here
    (exit 2): the engine's API takes an absolute path on its own machine."""

    def __init__(self, path: str, host: str):
        self.path, self.host = path, host
        super().__init__(f"--hf-cache {path}: the home directory on {host} is not known here; give the absolute "
                         "path of the Hugging Face cache on that host (e.g. /home/USER/.cache/huggingface)")


class DockerRunner:
    """A container through the Docker API of `host` (`ssh://user@spark1`, `unix:///...`, `tcp://...`).

    GPU access, host networking and IPC (NCCL across the two Sparks; host IPC is the host's /dev/shm, so
    no shm size is set: podman refuses one beside it, dockerd ignores it), the Hugging Face cache mounted
    read-only. `gpus`: `all` requests every GPU (`--gpus all`), `none`
    none, `auto` (the default) all when the engine reports the nvidia runtime and none otherwise (an engine
    without it refuses the request outright). The container carries SMOKE_LABEL; the smoke reads its log
    before `stop` removes it (field records "Measured recipes" lost a failed boot's logs to --rm, so the
    receipt keeps them instead). Exercised on podman and dockerd with a stand-in image
    (tests/test_smoke_hardware.py); never with a GPU."""

    def __init__(self, host: str, hf_cache: str, gpus: str = "auto") -> None:
        if gpus not in GPU_CHOICES:
            raise PatchkitError(f"--gpus takes one of {', '.join(GPU_CHOICES)}, not {gpus!r} (a patchkit bug: please "
                                "report it; the command line takes only these)")
        self.host = host
        self.hf_cache = _host_path(host, hf_cache)
        self.client = _client(host)
        self.gpus = _detect_gpus(self.client, host) if gpus == "auto" else gpus
        self.container: Any = None  # the docker SDK's Container (the SDK is untyped) once start() made it
        self.name = ""
        self.image = ""

    def start(self, image: str, argv: tuple[str, ...], env: dict[str, str], name: str) -> None:
        import docker

        self.image, self.name = image, name
        self._remove_stale(name)
        kwargs = dict(
            entrypoint=[argv[0]], command=list(argv[1:]), environment=env, name=name, detach=True,
            labels={SMOKE_LABEL: name}, network_mode="host", ipc_mode="host",
            volumes={self.hf_cache: {"bind": "/root/.cache/huggingface", "mode": "ro"}},
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if self.gpus == "all" else None,
        )
        with _engine(self.host, f"create the container {name} from {image}"):
            try:
                self.container = self.client.containers.create(image, **kwargs)
            except docker.errors.ImageNotFound:
                self.client.images.pull(image)
                self.container = self.client.containers.create(image, **kwargs)
        with _engine(self.host, f"start the container {name}"):
            self.container.start()
        if self.gpus == "all":
            self._check_gpus()

    def _check_gpus(self) -> None:
        """An engine that accepts the GPU request but drops it (podman 4.3's Docker API keeps no
        DeviceRequests) would boot vLLM without a GPU and call it a model failure: refused, naming it."""
        with _engine(self.host, f"inspect the container {self.name}"):
            self.container.reload()
        if not (self.container.attrs.get("HostConfig") or {}).get("DeviceRequests"):
            raise RunnerError(self.host, f"start the container {self.name}",
                              "the engine accepted the GPU request (--gpus all) but the container has none: this "
                              "engine's Docker API does not pass GPUs (podman: use its CDI devices, or dockerd with "
                              "nvidia-container-toolkit)")

    def _remove_stale(self, name: str) -> None:
        """A container of this name left by an earlier smoke (killed before its cleanup) is removed; one
        that is not the smoke's is never touched: refused, naming it."""
        import docker

        with _engine(self.host, f"look for an earlier container named {name}"):
            try:
                old = self.client.containers.get(name)
            except docker.errors.NotFound:
                return
            if old.labels.get(SMOKE_LABEL) != name:
                raise RunnerError(self.host, f"create the container {name}",
                                  f"a container of that name exists and is not a patchkit smoke's (id {old.short_id}); "
                                  "remove or rename it")
            old.remove(force=True)

    def running(self) -> bool:
        with _engine(self.host, f"inspect the container {self.name}"):
            self.container.reload()
        return self.container.status in ("created", "running")

    def exit_code(self) -> int | None:
        """The container's exit status; None while it runs."""
        if self.running():
            return None
        return ((self.container.attrs or {}).get("State") or {}).get("ExitCode")

    def logs(self) -> str:
        """The container's whole log, bounded by the boot-log limit (read in chunks, never whole past it)."""
        with _engine(self.host, f"read the log of {self.name}"):
            stream = self.container.logs(stream=True, follow=False)
            return _bounded_log(stream, f"{self.host}: the log of {self.name}").decode("utf-8", "replace")

    def image_digest(self) -> str | None:
        """The image's digest under the repository it was asked by (`repo@sha256:...`), else its id."""
        with _engine(self.host, f"inspect the image {self.image}"):
            attrs = self.client.images.get(self.image).attrs
        same = [d for d in attrs.get("RepoDigests") or [] if d.split("@")[0] == _repository(self.image)]
        return same[0] if same else attrs.get("Id")

    def stop(self) -> None:
        """Stop and remove every container this runner created under its name (one created just as an
        interrupt arrived included: found by its label)."""
        if not self.name:
            return
        with _engine(self.host, f"stop and remove the container {self.name}"):
            for container in self.client.containers.list(all=True, filters={"label": f"{SMOKE_LABEL}={self.name}"}):
                if container.status == "running":
                    container.stop(timeout=STOP_TIMEOUT_S)
                container.remove(force=True)
        self.container = None


def _repository(reference: str) -> str:
    """`registry:5000/org/name:tag@sha256:...` -> `registry:5000/org/name` (a port is not a tag)."""
    head, _, last = reference.split("@")[0].rpartition("/")
    return f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]


def _host_path(host: str, path: str) -> str:
    """A bind-mount source the engine can take: the API wants an absolute path on the engine's machine, so
    `~` is expanded for a local socket and refused for a remote host, whose home is not known here."""
    if not path.startswith("~"):
        return path
    if host.startswith("unix://"):
        return os.path.expanduser(path)
    raise RemoteHomeUnknown(path, host)


def _client(host: str):
    """A docker SDK client of `host`, the API version the engine names (patchkit.engine.connect)."""
    return connect(host, version=NEGOTIATED, timeout=REQUEST_TIMEOUT_S,
                   refuse=lambda step, detail: RunnerError(host, step, detail))


def _detect_gpus(client, host: str) -> str:
    """`all` when the engine reports the nvidia runtime (nvidia-container-toolkit, as on DGX OS), else `none`."""
    with _engine(host, "read the engine's info"):
        info = client.info()
    runtimes = set(info.get("Runtimes") or {}) | {info.get("DefaultRuntime") or ""}
    return "all" if "nvidia" in runtimes else "none"


def _bounded_log(stream, what: str) -> bytes:
    limit = limit_of("boot-log")
    chunks, size = [], 0
    for chunk in stream:
        size += len(chunk)
        if size > limit:
            close = getattr(stream, "close", None)
            if close:
                close()
            raise InputTooLarge(what, "boot-log", limit)
        chunks.append(chunk)
    return b"".join(chunks)
