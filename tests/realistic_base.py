"""A base image with the shape of the real one, for the scale benchmarks and the local-engine tests.

The real base (`vllm/vllm-openai:glm53-flash-arm64-cu130`, linux/arm64) is about ten gigabytes in a
dozen layers: an OS layer, the CUDA libraries, Python, torch, the common requirements, then vLLM and
FlashInfer each in a large layer of their own (their compiled kernels dwarf their Python files), and a
few small upper layers (a pip upgrade touching site-packages, a clean-up made of whiteouts, the
entrypoint). The layer order follows the vllm-openai stage of vLLM's own `docker/Dockerfile` (in the
vLLM 0.33.0 sdist); the sizes are this module's estimate, hand-written (no public listing of the GB10
base's layers is reachable from here).

What is real: every file of the vllm package of the vLLM 0.33.0 sdist and of the flashinfer package of
the FlashInfer release it pins (flashinfer-python 0.7.2.post1, requirements/cuda.txt), at their
site-packages paths, with the dist-info METADATA and RECORD pip writes and stale bytecode for every vLLM module.
What is filler: everything else, files of a repeated 4 KiB pseudo-random block, which gzip packs about
80:1, so the full-size base costs ~130 MB of disk and the reader still does real inflate work.

`scale` multiplies every filler size and count (1.0: ~10 GB uncompressed; the tests use 0.001). A
generated layout is cached under `$PATCHKIT_CACHE_DIR/realistic-base/<generation>-<scale>/` (user cache by
default) and reused: the layer tars are deterministic (fixed mtimes, sorted entries, one gzip level).

    python tests/realistic_base.py layout [--scale 1.0]      # print the layout directory
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from isal import isal_zlib

from registry import (
    DOCKER_CONFIG,
    DOCKER_LAYER,
    DOCKER_MANIFEST,
    SITE,
    VLLM_VERSION,
    stale_bytecode,
    vllm_files,
    vllm_sdist,
)

FLASHINFER_VERSION = "0.7.2.post1"      # vLLM 0.33.0's requirements/cuda.txt pin
GENERATION = "v2"                       # bump when the shape changes: cached layouts are keyed by it
MTIME = 1_700_000_000
GB, MB = 1 << 30, 1 << 20
_BLOCK = random.Random(13).randbytes(4096)
_CHUNK = _BLOCK * 256                   # 1 MiB of filler


@dataclass
class Filler:
    """`count` files summing to `size` bytes under `folder`, named <stem><i><suffix>."""

    folder: str
    count: int
    size: int
    stem: str = "lib"
    suffix: str = ".so"


@dataclass
class LayerShape:
    created_by: str
    fillers: list[Filler] = field(default_factory=list)
    real: str | None = None              # "vllm" | "flashinfer" | "vllm-envs": real files from the sdists
    files: dict[str, bytes] = field(default_factory=dict)
    whiteouts: list[str] = field(default_factory=list)     # paths deleted from the layers below
    opaque: list[str] = field(default_factory=list)        # directories emptied


def shape() -> list[LayerShape]:
    cuda = "usr/local/cuda-13.0/targets/sbsa-linux/lib"
    return [
        LayerShape("ubuntu 24.04 (arm64)", [Filler("usr/lib/aarch64-linux-gnu", 2500, 75 * MB)],
                   files={"etc/os-release": b'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\n',
                          "root/.cache/pip/selfcheck.json": b"{}\n"}),
        LayerShape("apt-get install cuda-libraries-13-0 libcudnn9-cuda-13", [
            Filler(cuda, 120, 3200 * MB), Filler("var/lib/apt/lists", 50, 40 * MB, "list", "")]),
        LayerShape("python3.12, pip, build tools", [Filler("usr/lib/python3.12", 4000, 300 * MB, "mod", ".py"),
                                                    Filler("usr/bin", 200, 50 * MB, "tool", "")]),
        LayerShape("pip install torch torchvision triton", [
            Filler(f"{SITE}/torch/lib", 60, 2900 * MB), Filler(f"{SITE}/torch", 600, 60 * MB, "mod", ".py"),
            Filler(f"{SITE}/triton", 300, 350 * MB)]),
        LayerShape("pip install -r requirements/common.txt", [
            Filler(f"{SITE}/transformers", 2000, 120 * MB, "mod", ".py"),
            Filler(f"{SITE}/numpy/_core", 80, 100 * MB), Filler(f"{SITE}/xformers", 100, 280 * MB)],
            files={f"{SITE}/huggingface_hub-0.36.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: huggingface-hub\nVersion: 0.36.0\n\n"}),
        LayerShape("pip install vllm (wheel)", [Filler(f"{SITE}/vllm", 6, 900 * MB, "_C", ".abi3.so"),
                                                Filler(f"{SITE}/vllm/vllm_flash_attn", 4, 300 * MB, "_fa_C", ".abi3.so")],
                   real="vllm"),
        LayerShape("pip install flashinfer-python flashinfer-cubin", [
            Filler(f"{SITE}/flashinfer_cubin/cubins", 300, 1400 * MB, "kernel", ".cubin")], real="flashinfer"),
        LayerShape("pip install --upgrade huggingface_hub", [Filler(f"{SITE}/huggingface_hub", 200, 20 * MB, "mod", ".py")],
                   files={f"{SITE}/huggingface_hub-0.36.2.dist-info/METADATA": b"Metadata-Version: 2.1\nName: huggingface-hub\nVersion: 0.36.2\n\n"},
                   whiteouts=[f"{SITE}/huggingface_hub-0.36.0.dist-info"]),
        LayerShape("pip install --force-reinstall --no-deps vllm envs (same bytes)", real="vllm-envs"),
        LayerShape("rm -rf /var/lib/apt/lists/* /root/.cache", opaque=["var/lib/apt/lists"], whiteouts=["root/.cache"]),
        LayerShape("COPY entrypoint", files={"usr/local/bin/vllm-entrypoint.sh": b"#!/bin/sh\nexec vllm serve \"$@\"\n"}),
    ]


def flashinfer_sdist() -> Path:
    from patchkit.sources import open_source
    from patchkit.sources.cache import ArchiveCache

    open_source(f"flashinfer-python=={FLASHINFER_VERSION}", progress=False)
    cached = ArchiveCache().lookup("flashinfer-python", FLASHINFER_VERSION)
    assert cached is not None, "patchkit.sources did not cache the FlashInfer sdist"
    return cached.path


def flashinfer_files(sdist: Path) -> dict[str, bytes]:
    top = f"flashinfer_python-{FLASHINFER_VERSION}/"
    out = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for info in tar:
            if info.isfile() and info.name.startswith(top + "flashinfer/"):
                out[f"{SITE}/{info.name[len(top):]}"] = tar.extractfile(info).read()
    return out


def real_files(kind: str) -> dict[str, bytes]:
    if kind == "vllm":
        files = vllm_files(vllm_sdist())
        meta = f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n\n".encode()
        return {**files, **stale_bytecode(files), f"{SITE}/vllm-{VLLM_VERSION}.dist-info/METADATA": meta}
    if kind == "flashinfer":
        meta = f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {FLASHINFER_VERSION}\n\n".encode()
        return {**flashinfer_files(flashinfer_sdist()),
                f"{SITE}/flashinfer_python-{FLASHINFER_VERSION}.dist-info/METADATA": meta}
    if kind == "vllm-envs":
        return {f"{SITE}/vllm/envs.py": vllm_files(vllm_sdist())[f"{SITE}/vllm/envs.py"]}
    raise ValueError(kind)


class LayerSink:
    """Tar bytes in; sha256 of the tar (diff_id) and of the gzip (digest) out, gzip written to a file."""

    def __init__(self, out):
        self.out, self.tar_sha, self.gz_sha = out, hashlib.sha256(), hashlib.sha256()
        self.gz = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
        self.raw = 0

    def write(self, data: bytes) -> None:
        self.tar_sha.update(data)
        self.raw += len(data)
        self._emit(self.gz.compress(data))

    def _emit(self, packed: bytes) -> None:
        self.out.write(packed)
        self.gz_sha.update(packed)

    def close(self) -> tuple[str, str]:
        self._emit(self.gz.flush())
        return "sha256:" + self.gz_sha.hexdigest(), "sha256:" + self.tar_sha.hexdigest()


def _entries(layer: LayerShape, scale: float) -> Iterator[tuple[str, str, int, bytes | None]]:
    """(name, kind, size, data or None for filler) of one layer, parents first, sorted."""
    files: dict[str, tuple[int, bytes | None]] = {k: (len(v), v) for k, v in layer.files.items()}
    if layer.real:
        files.update({k: (len(v), v) for k, v in real_files(layer.real).items()})
    for f in layer.fillers:
        count = max(1, round(f.count * scale))
        each = max(1, round(f.size * scale / count))
        for i in range(count):
            files[f"{f.folder}/{f.stem}{i}{f.suffix}"] = (each, None)
    if layer.real in ("vllm", "flashinfer"):
        # pip's RECORD lists every file of the install (hash and size columns left empty here)
        info = next(k for k in files if k.endswith(".dist-info/METADATA"))
        record = info.replace("/METADATA", "/RECORD")
        lines = [f"{k[len(SITE) + 1:]},," for k in sorted(files) if k.startswith(SITE + "/")] + [
            f"{record[len(SITE) + 1:]},,"]
        data = ("\n".join(lines) + "\n").encode()
        files[record] = (len(data), data)
    for w in layer.whiteouts:
        head, _, tail = w.rpartition("/")
        files[f"{head}/.wh.{tail}" if head else f".wh.{tail}"] = (0, b"")
    for d in layer.opaque:
        files[f"{d}/.wh..wh..opq"] = (0, b"")
    dirs = {"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)}
    for name in sorted(dirs | set(files), key=lambda n: n.split("/")):
        if name in files:
            yield name, "file", files[name][0], files[name][1]
        else:
            yield name, "dir", 0, None


def write_layer(layer: LayerShape, scale: float, blobs: Path) -> dict:
    tmp = blobs / "layer.partial"
    with open(tmp, "wb") as out:
        sink = LayerSink(out)
        for name, kind, size, data in _entries(layer, scale):
            info = tarfile.TarInfo(name)
            info.mtime = MTIME
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = size, 0o755 if name.endswith((".so", ".sh")) else 0o644
            sink.write(info.tobuf(tarfile.PAX_FORMAT))
            if kind == "file" and data is not None:
                sink.write(data)
            elif kind == "file":
                left = size
                while left:
                    piece = _CHUNK[:min(left, len(_CHUNK))]
                    sink.write(piece)
                    left -= len(piece)
            if size % 512:
                sink.write(bytes(512 - size % 512))
        sink.write(bytes(1024))
        digest, diff_id = sink.close()
    os.replace(tmp, blobs / digest[7:])
    return {"mediaType": DOCKER_LAYER, "digest": digest, "size": (blobs / digest[7:]).stat().st_size,
            "diff_id": diff_id, "uncompressed": sink.raw, "created_by": layer.created_by}


def cache_dir(scale: float) -> Path:
    from patchkit.cache_root import default_cache_root

    return default_cache_root() / "realistic-base" / f"{GENERATION}-{scale:g}"


def realistic_layout(scale: float = 1.0, dest: Path | None = None) -> dict:
    """The realistic base as an OCI layout (generated once, then reused). Returns
    {"layout", "manifest" (digest), "layers": [descriptor + diff_id, uncompressed, created_by]}."""
    dest = dest or cache_dir(scale)
    summary = dest / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text()) | {"layout": str(dest)}
    shutil.rmtree(dest, ignore_errors=True)
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layers = [write_layer(layer, scale, blobs) for layer in shape()]

    def put(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (blobs / digest[7:]).write_bytes(data)
        return {"digest": digest, "size": len(data)}

    config = json.dumps({
        "architecture": "arm64", "variant": "v8", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "VLLM_USAGE_SOURCE=production-docker-image"],
                   "Entrypoint": ["/usr/local/bin/vllm-entrypoint.sh"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": layer["created_by"]} for layer in layers],
    }, sort_keys=True).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                           "config": {"mediaType": DOCKER_CONFIG, **put(config)},
                           "layers": [{k: layer[k] for k in ("mediaType", "digest", "size")} for layer in layers]},
                          sort_keys=True).encode()
    top = put(manifest)
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": DOCKER_MANIFEST, **top, "annotations": {"org.opencontainers.image.ref.name": "base"}}]}))
    result = {"manifest": top["digest"], "layers": layers, "scale": scale}
    summary.write_text(json.dumps(result, indent=1))
    return result | {"layout": str(dest)}


def push_layout(made: dict, host: str, repo: str, tag: str = "base") -> str:
    """Push the realistic base to `host` (blobs streamed from the layout); its pinned reference."""
    from patchkit.oci.registry import RegistryClient

    client = RegistryClient(host)
    blobs = Path(made["layout"]) / "blobs" / "sha256"
    manifest = (blobs / made["manifest"][7:]).read_bytes()
    doc = json.loads(manifest)
    for desc in [doc["config"], *doc["layers"]]:
        if not client.blob_exists(repo, desc["digest"]):
            client.upload_blob(repo, desc["digest"], blobs / desc["digest"][7:])
    client.put_manifest(repo, made["manifest"], manifest, DOCKER_MANIFEST)
    client.put_manifest(repo, tag, manifest, DOCKER_MANIFEST)
    return f"{host}/{repo}:{tag}@{made['manifest']}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Generate the realistic base as an OCI layout (once).")
    parser.add_argument("command", choices=["layout"])
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    made = realistic_layout(args.scale)
    total = sum(layer["uncompressed"] for layer in made["layers"])
    packed = sum(layer["size"] for layer in made["layers"])
    print(f"{made['layout']}:base  {len(made['layers'])} layers, {total / GB:.2f} GiB uncompressed, "
          f"{packed / MB:.0f} MiB compressed, manifest {made['manifest']}")
