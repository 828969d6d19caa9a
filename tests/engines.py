"""podman's Docker-API service for the local-engine tests and benchmarks: private storage (overlay, in a
directory of its own), the 127.0.0.1 registries as insecure, stopped by its pid on exit.

    with PodmanService(workdir) as url:   # "unix:///.../podman.sock"

And the fixtures of the local-engine tests (tests/test_build_local.py, tests/test_engine_files_faults.py),
one service per test module: `podman_service`, `podman` (its URL), `client` (a docker SDK client of it),
`realistic` (the realistic base at SCALE in the test registry and pulled into the engine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from realistic_base import push_layout, realistic_layout

SCALE = 0.001   # the realistic base, scaled down: the real vLLM and FlashInfer files, little filler


class PodmanService:
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def remove_storage(self) -> None:
        """Delete the engine's storage (the overlay layers need podman's own unmount first)."""
        subprocess.run(["podman", "system", "reset", "--force"], env=self.env, capture_output=True, check=False)
        # podman keeps its overlay directory bind-mounted on itself after the service has stopped
        for mount in [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]:
            if mount.startswith(f"{self.root}/"):
                subprocess.run(["umount", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def podman_service(tmp_path_factory):
    """podman's Docker-API service on a private socket and storage; the test registry as insecure."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman): the --load route is not exercised")
    service = PodmanService(tmp_path_factory.mktemp("podman"))
    with service:
        yield service
    service.remove_storage()


@pytest.fixture(scope="module")
def podman(podman_service):
    return podman_service.url


@pytest.fixture(scope="module")
def client(podman):
    import docker

    return docker.DockerClient(base_url=podman, timeout=600)


@pytest.fixture(scope="module")
def realistic(registry_server, client):
    """The scaled realistic base in the registry and pulled into the engine: (its pinned reference, layout)."""
    made = realistic_layout(SCALE)
    ref = push_layout(made, registry_server.host, "vllm/realistic")
    client.api.pull(ref.split(":base@")[0], tag=made["manifest"])
    return ref, made


def patched_files(loaded) -> list[tuple]:
    """A build's patched files as (path, bytes, mode, uid, gid), for comparing two builds."""
    return [(f.path, f.data, f.mode, f.uid, f.gid) for f in loaded.prepared.files]
