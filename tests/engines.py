"""podman's Docker-API service for the local-engine tests and benchmarks: private storage (overlay, in a
directory of its own), the 127.0.0.1 registries as insecure, stopped by its pid on exit.

    with PodmanService(workdir) as url:   # "unix:///.../podman.sock"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


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
