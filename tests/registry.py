"""The real OCI registry the image tests push to and pull from: Debian's `docker-registry` (CNCF
distribution 2.8) on 127.0.0.1 with its own config, filesystem storage in a temporary directory and a
free port; stopped (by its pid) on exit. The synthetic bases it serves are built by tests/bases.py,
re-exported here for the tests that import them from this module.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from bases import (  # noqa: F401  (re-exported for the image tests)
    DOCKER_CONFIG,
    DOCKER_LAYER,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    FLASHINFER_VERSION,
    RELEASE,
    ROOT_IMAGE,
    SITE,
    VLLM_VERSION,
    StandIn,
    dist_info,
    flashinfer_sdist,
    flatten,
    make_base,
    make_stand_in,
    package_files,
    pinned_stand_in,
    raw_layer,
    small_layout,
    stale_bytecode,
    tar_gz,
    vllm_files,
    vllm_sdist,
)

REGISTRY_BINARY = "/usr/bin/docker-registry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`with Registry(tmpdir) as reg:` -> reg.host ("127.0.0.1:PORT")."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Registry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.workdir / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n  secret: patchkit-tests\n"
        )
        self.log = open(self.workdir / "registry.log", "wb")
        self.proc = subprocess.Popen([REGISTRY_BINARY, "serve", str(config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}: "
                                   f"{(self.workdir / 'registry.log').read_text()[-2000:]}")
            try:
                if requests.get(f"http://{self.host}/v2/", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError("docker-registry did not answer /v2/ within 15 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def tags(self, repo: str) -> list[str]:
        r = requests.get(f"http://{self.host}/v2/{repo}/tags/list", timeout=10)
        return [] if r.status_code == 404 else (r.json().get("tags") or [])

    def catalog(self) -> list[str]:
        return requests.get(f"http://{self.host}/v2/_catalog", timeout=10).json().get("repositories") or []


@pytest.fixture(scope="session")
def registry_server(tmp_path_factory):
    """A running docker-registry for the test session (import this name into a test module)."""
    if not os.path.exists(REGISTRY_BINARY):
        pytest.skip(f"{REGISTRY_BINARY} is absent: apt-get install docker-registry (Debian's CNCF distribution)")
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


def push_base(base: dict, host: str, repo: str, tag: str = "base") -> str:
    """Push the synthetic base (every blob, both manifests, the list under `tag`) with plain HTTP calls."""
    for digest, data in base["blobs"].items():
        if digest == base["index"] or digest in base["manifests"]:
            continue
        start = requests.post(f"http://{host}/v2/{repo}/blobs/uploads/", timeout=30)
        start.raise_for_status()
        loc = start.headers["Location"]
        loc = loc if loc.startswith("http") else f"http://{host}{loc}"
        requests.put(f"{loc}{'&' if '?' in loc else '?'}digest={digest}", data=data, timeout=60).raise_for_status()
    for digest, data in base["manifests"].items():
        requests.put(f"http://{host}/v2/{repo}/manifests/{digest}", data=data,
                     headers={"Content-Type": DOCKER_MANIFEST}, timeout=30).raise_for_status()
    requests.put(f"http://{host}/v2/{repo}/manifests/{tag}", data=base["index_bytes"],
                 headers={"Content-Type": DOCKER_LIST}, timeout=30).raise_for_status()
    return f"{host}/{repo}:{tag}@{base['index']}"


# -- reading images back ------------------------------------------------------------------------------
def pull_manifest(host: str, repo: str, ref: str) -> tuple[bytes, str]:
    r = requests.get(f"http://{host}/v2/{repo}/manifests/{ref}", timeout=30,
                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                        "application/vnd.oci.image.index.v1+json"})
    r.raise_for_status()
    return r.content, r.headers["Content-Type"]


def pull_blob(host: str, repo: str, digest: str) -> bytes:
    r = requests.get(f"http://{host}/v2/{repo}/blobs/{digest}", timeout=60)
    r.raise_for_status()
    return r.content


def images_pinned_to(ref: str, dest: Path) -> Path:
    """A copy of images/ at `dest` whose root definition pins `ref` (a stand-in of the pinned base) by
    digest; children inherit the base, everything else is the repository's definitions byte for byte."""
    import re
    import shutil

    shutil.copytree(Path(__file__).resolve().parents[1] / "images", dest)
    root = dest / "glm53-flash-nvfp4" / "image.toml"
    text, n = re.subn(r'^ref = "vllm/vllm-openai:glm53-flash-arm64-cu130@sha256:[0-9a-f]{64}"$', f'ref = "{ref}"',
                      root.read_text(), flags=re.MULTILINE)
    assert n == 1, "the root image no longer pins vllm/vllm-openai:glm53-flash-arm64-cu130 by digest"
    root.write_text(text)
    return dest
