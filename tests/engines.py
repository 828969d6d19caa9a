"""The two Docker-API engines of the local-engine tests and benchmarks, each started here on a private
socket and storage, the 127.0.0.1 registries as insecure, stopped by its pid on exit:

    with PodmanService(workdir) as url:   # podman's API service, "unix:///.../podman.sock"
    with DockerdService(workdir) as url:  # the real Docker Engine (dockerd, as root), "unix:///.../docker.sock"

And the fixtures of the local-engine tests (tests/test_build_local.py, tests/test_engine_files_faults.py),
one service per test module: `podman_service`, `podman` (its URL), `client` (a docker SDK client of it),
`realistic` (the realistic base at SCALE in the test registry and pulled into the engine); and the same
over both engines, one module-scoped parameter each ("podman", "docker"): `engine_service` (the service,
its `.kind` and `.url`), `engine` (its URL), `engine_client`, `engine_realistic`. And the two proxies put
between patchkit and an engine: CountingProxy (bytes each way) and FaultProxy (a fault at request N, or
wrong answers to the requests of one path).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from realistic_base import push_layout, realistic_layout

SCALE = 0.001   # the realistic base, scaled down: the real vLLM and FlashInfer files, little filler


def stop(proc: subprocess.Popen | None, grace: float = 30) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; waited for either way."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Engine:
    """What the fault tests do to either engine: SIGKILL it (a crash: podman's in-process build dies with
    it; dockerd's containerd and what it made stay) and start it again on the same storage."""

    proc: subprocess.Popen | None
    sock: Path

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> str:
        self.__exit__()
        self.sock.unlink(missing_ok=True)
        return self.__enter__()


class PodmanService(Engine):
    kind = "podman"

    def __init__(self, workdir: Path, driver: str = "overlay"):
        self.root = Path(workdir)
        self.driver = driver
        self.proc: subprocess.Popen | None = None
        self.sock = self.root / "podman.sock"
        self.env = {**os.environ, "CONTAINERS_REGISTRIES_CONF": str(self.root / "registries.conf"),
                    "CONTAINERS_STORAGE_CONF": str(self.root / "storage.conf")}

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def __enter__(self) -> str:
        binary = shutil.which("podman")
        if binary is None:
            raise RuntimeError("podman is not installed (apt-get install podman)")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "registries.conf").write_text('unqualified-search-registries = []\n'
                                                   '[[registry]]\nlocation = "127.0.0.1"\ninsecure = true\n')
        (self.root / "storage.conf").write_text(f'[storage]\ndriver = "{self.driver}"\nrunroot = "{self.root}/run"\n'
                                                f'graphroot = "{self.root}/graph"\n')
        if "CONTAINERS_CONF" not in self.env:
            # podman's default tmp_dir, /run/libpod, is shared by every service on the machine: another
            # service's start or reset removed it under this one ("creating runtime status file: open
            # /run/libpod/alive", 6 setup errors in one full run with two services at once)
            (self.root / "containers.conf").write_text(f'[engine]\ntmp_dir = "{self.root}/tmp"\n')
            self.env["CONTAINERS_CONF"] = str(self.root / "containers.conf")
        self.log = open(self.root / "log", "wb")
        self.proc = subprocess.Popen([binary, "system", "service", "--time=0", self.url], env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.sock.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not self.sock.exists():
            self.__exit__()
            raise RuntimeError(f"podman system service did not start: {(self.root / 'log').read_text()[-800:]}")
        return self.url

    def __exit__(self, *exc) -> None:
        stop(self.proc)
        self.log.close()

    def remove_storage(self) -> None:
        """Delete the engine's storage (the overlay layers need podman's own unmount first)."""
        subprocess.run(["podman", "system", "reset", "--force"], env=self.env, capture_output=True, check=False)
        # podman keeps its overlay directory bind-mounted on itself after the service has stopped
        for mount in [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]:
            if mount.startswith(f"{self.root}/"):
                subprocess.run(["umount", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


class DockerdService(Engine):
    """dockerd with its own data root, exec root (where it starts its own containerd), pid file and socket:
    several run side by side and none touches /var/lib/docker. No bridge, no iptables (nothing here runs a
    container; it only creates them). The storage driver is overlay2 (the default; it works in this
    container), or `driver` ("vfs" where overlay mounts are refused)."""

    kind = "docker"

    def __init__(self, workdir: Path, driver: str | None = None):
        self.root = Path(workdir)
        self.driver = driver
        self.proc: subprocess.Popen | None = None
        self.sock = self.root / "docker.sock"
        self.env = {**os.environ}

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def __enter__(self) -> str:
        binary = shutil.which("dockerd") or next((b for b in ("/usr/sbin/dockerd", "/usr/bin/dockerd")
                                                  if os.access(b, os.X_OK)), None)
        if binary is None:
            raise RuntimeError("dockerd is not installed (apt-get install docker.io)")
        if os.geteuid() != 0:
            raise RuntimeError("dockerd needs root here (the tests start it on a private socket)")
        self.root.mkdir(parents=True, exist_ok=True)
        args = [binary, "--host", self.url, "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "pid"),
                "--bridge", "none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
                "--insecure-registry", "127.0.0.0/8", "--log-level", "warn", "--config-file", str(self.root / "daemon.json")]
        (self.root / "daemon.json").write_text("{}\n")
        if self.driver:
            args += ["--storage-driver", self.driver]
        self.log = open(self.root / "log", "wb")
        self.proc = subprocess.Popen(args, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while self.proc.poll() is None and time.monotonic() < deadline and not self._pings():
            time.sleep(0.2)
        if not self._pings():
            self.__exit__()
            raise RuntimeError(f"dockerd did not start: {(self.root / 'log').read_text()[-800:]}")
        return self.url

    def _pings(self) -> bool:
        if not self.sock.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(str(self.sock))
                s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return b"OK" in s.recv(4096)
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        stop(self.proc)
        self._stop_containerd()
        if getattr(self, "log", None) is not None:
            self.log.close()

    def _stop_containerd(self) -> None:
        """Stop the containerd dockerd started under its exec root, by its pid, should it outlive dockerd;
        then remove the sockets it leaves (a stale `containerd.sock.ttrpc` keeps the next one from starting)."""
        state = self.root / "exec" / "containerd"
        try:
            pid = int((state / "containerd.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            pid, cmdline = None, b""
        if pid is not None and str(self.root).encode() in cmdline:   # else not ours (a pid reused)
            os.kill(pid, 15)
            deadline = time.monotonic() + 15
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, 9)
        # dockerd takes a live pid in containerd.pid for a running containerd and waits on its socket
        for stale in [*state.glob("*.sock*"), state / "containerd.pid"]:
            stale.unlink(missing_ok=True)

    def remove_storage(self) -> None:
        """Delete the data root (unmounting what overlay2 left mounted under it first)."""
        for mount in reversed([line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]):
            if mount.startswith(f"{self.root}/"):
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def podman_service(tmp_path_factory):
    """podman's Docker-API service on a private socket and storage; the test registry as insecure."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman): the --load route is not exercised")
    yield from _running(PodmanService(tmp_path_factory.mktemp("podman")))


def _running(service):
    """A fixture's body: the service started, yielded, stopped, its storage removed."""
    with service:
        yield service
    service.remove_storage()


def sdk_client(url: str):
    """A docker SDK client of `url`, with a timeout long enough for a build on 2 loaded cores."""
    import docker

    return docker.DockerClient(base_url=url, timeout=600)


@pytest.fixture(scope="module")
def podman(podman_service):
    return podman_service.url


@pytest.fixture(scope="module")
def client(podman):
    return sdk_client(podman)


@pytest.fixture(scope="module")
def realistic(registry_server, client):
    """The scaled realistic base in the registry and pulled into the engine: (its pinned reference, layout)."""
    return pull_realistic(registry_server, client)


@pytest.fixture(scope="module")
def dockerd_service(tmp_path_factory):
    """The Docker Engine on a private socket and storage; the test registry as insecure. Not installed is a
    failure, not a skip (.ci/run installs docker.io)."""
    yield from _running(DockerdService(tmp_path_factory.mktemp("dockerd")))


ENGINES = ("podman", "docker")


@pytest.fixture(scope="module", params=ENGINES)
def engine_service(request):
    """Each engine in turn (a test using it runs once on podman, once on the Docker Engine)."""
    return request.getfixturevalue("podman_service" if request.param == "podman" else "dockerd_service")


@pytest.fixture(scope="module")
def engine(engine_service):
    return engine_service.url


@pytest.fixture(scope="module")
def engine_client(engine):
    return sdk_client(engine)


@pytest.fixture(scope="module")
def engine_realistic(registry_server, engine_client):
    """The scaled realistic base in the registry and pulled into this engine: (its pinned reference, layout)."""
    return pull_realistic(registry_server, engine_client)


def pull_realistic(registry_server, client) -> tuple[str, dict]:
    made = realistic_layout(SCALE)
    ref = push_layout(made, registry_server.host, "vllm/realistic")
    client.api.pull(ref.split(":base@")[0], tag=made["manifest"])
    return ref, made


def patched_files(loaded) -> list[tuple]:
    """A build's patched files as (path, bytes, mode, uid, gid), for comparing two builds."""
    return [(f.path, f.data, f.mode, f.uid, f.gid) for f in loaded.prepared.files]


def shut(*sockets: socket.socket) -> None:
    """Shut both ways each socket of a proxied connection (the other side's pipe then sees its end)."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class CountingProxy:
    """A unix socket forwarding every connection to the engine's, counting the bytes each way: what a build
    moved to and from the engine, measured on the wire, not by patchkit's own account."""

    def __init__(self, path: Path, upstream: str):
        self.path, self.upstream = path, upstream.removeprefix("unix://")
        self.sent = self.received = 0
        self._lock = threading.Lock()
        path.unlink(missing_ok=True)
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(str(path))
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, "sent"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, "received"), daemon=True).start()

    def _pipe(self, source: socket.socket, dest: socket.socket, counter: str) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
                dest.sendall(data)
        except OSError:
            pass
        finally:
            shut(source, dest)


GARBLED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"Id\": \"sha2"
REQUEST = re.compile(rb"(?:GET|POST|PUT|DELETE|HEAD) /v1\.\d+/\S* HTTP/1\.[01]\r\n")
REFUSAL = "injected refusal"
NOT_A_TAR = b"not a tar archive " * 40


def _answer(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


ANSWERS = {"refuse": _answer(b"500 Internal Server Error", b"application/json",
                             json.dumps({"message": REFUSAL}).encode()),
           "not-a-tar": _answer(b"200 OK", b"application/x-tar", NOT_A_TAR)}


class FaultProxy:
    """A unix socket forwarding each connection to the engine's, counting the HTTP requests sent through it
    (keep-alive connections carry several). At request `at` (1-based) it does `action`:
    - "drop": closes the connection before the engine sees the request;
    - "kill": forwards the request and SIGKILLs the engine as the first bytes of its answer arrive;
    - "garble": forwards the request and answers it, in the engine's place, with a 200 whose JSON body is cut
      after a few bytes;
    - "kill-tagged": SIGKILLs the engine as soon as an answer says `Successfully tagged` (at any request);
    - "refuse", "not-a-tar": answers every request whose path `matching` finds, in the engine's place and
      never forwarding it, with a 500 whose message is REFUSAL, or a 200 whose body is no tar (NOT_A_TAR).
    """

    def __init__(self, path: Path, upstream: str, kill, at: int | None = None, action: str = "drop",
                 matching: bytes | None = None):
        self.path, self.upstream, self.kill_engine = path, upstream.removeprefix("unix://"), kill
        self.at, self.action, self.matching = at, action, matching
        self.count, self.fired, self.requests = 0, False, []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX)
        path.unlink(missing_ok=True)
        self._server.bind(str(path))
        self._server.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _fire(self) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        self.kill_engine()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(self.upstream)
        except OSError:
            client.close()
            return
        armed = threading.Event()       # "kill": the request at `at` went through this connection
        done = threading.Event()

        def answers() -> None:
            try:
                while (data := upstream.recv(65536)):
                    if self.action == "kill-tagged" and b"Successfully tagged" in data:
                        client.sendall(data.split(b"Successfully tagged")[0])
                        self._fire()
                        break
                    if armed.is_set() and self.action == "garble":
                        self.fired = True
                        client.sendall(GARBLED)
                        break
                    if armed.is_set():
                        self._fire()
                        break
                    client.sendall(data)
            except OSError:
                pass
            finally:
                done.set()
                shut(client, upstream)

        threading.Thread(target=answers, daemon=True).start()
        try:
            while not done.is_set() and (data := client.recv(65536)):
                starts = list(REQUEST.finditer(data))
                with self._lock:
                    first = self.count + 1
                    self.count += len(starts)
                    self.requests += [tuple(m.group(0).split(b" ")[:2]) for m in starts]
                if self.action in ANSWERS and len(starts) == 1 and re.search(self.matching or b"", starts[0].group(0)):
                    self.fired = True      # (one request a chunk: the SDK never pipelines)
                    client.sendall(ANSWERS[self.action])
                    continue
                hit = next((m for i, m in enumerate(starts) if self.at == first + i), None)
                if hit is not None and self.action == "drop":
                    self.fired = True
                    upstream.sendall(data[:hit.start()])
                    break
                if hit is not None and self.action in ("kill", "garble"):
                    armed.set()
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            shut(client, upstream)
            done.wait(30)
            client.close()
            upstream.close()
