"""Synthetic base images for the build path, from real released sources: runnable by a newcomer and
imported by the image tests (no pytest here, so `nox -s demo-base` runs it after the README's set-up).

- `make_base`: a linux/arm64 base image whose vLLM and FlashInfer are the real packages from their
  sdists (obtained through patchkit.sources, so the user cache), at the real dist-packages path, each in
  its own layer with the dist-info METADATA pip writes and stale bytecode for every module, and an amd64
  sibling in a Docker manifest list (as Docker Hub serves multi-arch images).
- Two stand-ins (`StandIn`, `make_stand_in`): `RELEASE`, vLLM 0.33.0 with the FlashInfer it pins
  (0.7.2.post1), and the stand-in for the images' pinned base vllm/vllm-openai:glm53-flash-arm64-cu130:
  vLLM 0.30.0's files (the layout of that base's nightly) under the dist-info version the image
  definition declares for it (0.1.dev20051+g487ecf187) and FlashInfer 0.6.18.post1 (the base's registry
  records; docs/field-records.md), read from images/glm53-flash-nvfp4/image.toml.
- `flatten`: an independent reading of an image's layers (plain tarfile, whiteouts applied) into a dict
  path -> bytes, to check what a container would see.

    python tests/bases.py DIR [pinned]    # the base as an OCI layout; build on it with --base DIR:base
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SITE = "usr/local/lib/python3.12/dist-packages"
VLLM_VERSION = "0.33.0"
FLASHINFER_VERSION = "0.7.2.post1"  # what vLLM 0.33.0 pins (requirements/cuda.txt)
ROOT_IMAGE = Path(__file__).resolve().parents[1] / "images" / "glm53-flash-nvfp4" / "image.toml"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


@dataclass(frozen=True)
class StandIn:
    """What a synthetic base holds in place of a real one's vLLM and FlashInfer."""

    name: str
    vllm: str               # the release whose vllm/ files it carries
    vllm_metadata: str      # the Version its vllm dist-info states
    flashinfer: str         # the flashinfer-python release it carries, dist-info included
    site: str = SITE        # dist-packages directory, no leading slash


RELEASE = StandIn("0.33.0", vllm=VLLM_VERSION, vllm_metadata=VLLM_VERSION, flashinfer=FLASHINFER_VERSION)


def pinned_stand_in() -> StandIn:
    """The stand-in for the images' pinned base, as images/glm53-flash-nvfp4/image.toml describes it: its
    vLLM dist-info version and the release layout it matches, at its package path; FlashInfer
    0.6.18.post1 unless the definition declares a version (the base's registry records say 0.6.18.post1)."""
    import tomllib

    packages = tomllib.loads(ROOT_IMAGE.read_text())["packages"]
    vllm = packages["vllm"]
    return StandIn("pinned", vllm=vllm.get("layout") or vllm["version"], vllm_metadata=vllm["version"],
                   flashinfer=packages["flashinfer"].get("version", "0.6.18.post1"),
                   site=os.path.dirname(vllm["path"]).lstrip("/"))


def _cached_sdist(spec: str, dist: str, version: str) -> Path:
    from patchkit.sources import open_source
    from patchkit.sources.cache import SdistCache

    open_source(spec, progress=False)
    cached = SdistCache().lookup(dist, version)
    assert cached is not None, f"patchkit.sources did not cache the {dist} {version} sdist"
    return cached.path


def vllm_sdist(version: str = VLLM_VERSION) -> Path:
    """A vLLM release's sdist, through patchkit.sources (downloaded once into the user cache)."""
    return _cached_sdist(f"vllm=={version}", "vllm", version)


def flashinfer_sdist(version: str = FLASHINFER_VERSION) -> Path:
    return _cached_sdist(f"flashinfer-python=={version}", "flashinfer-python", version)


def tar_gz(files: dict[str, bytes | None], *, level: int = 1, symlinks: dict[str, str] | None = None) -> tuple[bytes, str]:
    """(gzip blob, diff_id). files: path -> bytes (None = directory); ancestors added as directories."""
    import hashlib

    names = set(files)
    for name in list(files):
        parts = name.split("/")
        for i in range(1, len(parts)):
            names.add("/".join(parts[:i]))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(names | set(symlinks or {}), key=lambda n: n.split("/")):
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if symlinks and name in symlinks:
                info.type, info.linkname = tarfile.SYMTYPE, symlinks[name]
                tar.addfile(info)
            elif files.get(name) is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(files[name]), 0o644
                tar.addfile(info, io.BytesIO(files[name]))
    data = raw.getvalue()
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=level) as gz:
        gz.write(data)
    return out.getvalue(), "sha256:" + hashlib.sha256(data).hexdigest()


def package_files(sdist: Path, package: str, edit: Callable[[str, bytes], bytes] | None = None,
                  site: str = SITE) -> dict[str, bytes]:
    """Every file of `package`'s directory in the sdist (`<top>/<package>/...`), at its dist-packages
    path (optionally edited; `edit` gets the path relative to dist-packages)."""
    out: dict[str, bytes] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for info in tar:
            rel = info.name.partition("/")[2]
            if info.isfile() and rel.startswith(f"{package}/"):
                data = tar.extractfile(info).read()
                out[f"{site}/{rel}"] = edit(rel, data) if edit else data
    return out


def vllm_files(sdist: Path, edit: Callable[[str, bytes], bytes] | None = None, site: str = SITE) -> dict[str, bytes]:
    """Every file of the vllm package in the sdist, at its site-packages path (optionally edited)."""
    return package_files(sdist, "vllm", edit, site)


def dist_info(site: str, name: str, version: str) -> dict[str, bytes]:
    """The METADATA pip writes for `name` `version` (the fields patchkit reads), at its dist-info path."""
    folder = f"{name.replace('-', '_')}-{version}.dist-info"
    return {f"{site}/{folder}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode()}


def stale_bytecode(files: dict[str, bytes]) -> dict[str, bytes]:
    """A pyc for every module, with a valid 3.12 magic and the unchecked-hash flag: the kind Python
    trusts without looking at the source, i.e. the kind that would shadow a patched .py."""
    magic_312 = (3531).to_bytes(2, "little") + b"\r\n"
    out = {}
    for name in files:
        if name.endswith(".py"):
            folder, base = name.rsplit("/", 1)
            out[f"{folder}/__pycache__/{base[:-3]}.cpython-312.pyc"] = magic_312 + (1).to_bytes(4, "little") + bytes(8) + b"STALE"
    return out


def make_stand_in(stand_in: StandIn, dest: Path, *, edit: Callable[[str, bytes], bytes] | None = None) -> dict:
    """`make_base` for a stand-in: its vLLM release's files, dist-info versions and FlashInfer."""
    return make_base(vllm_sdist(stand_in.vllm), dest, edit=edit, stand_in=stand_in)


def make_base(sdist: Path, dest: Path, *, edit: Callable[[str, bytes], bytes] | None = None,
              stand_in: StandIn = RELEASE) -> dict:
    """Write the synthetic base as an OCI layout at `dest` (Docker media types inside, as Docker Hub
    serves them). Returns {"blobs": {digest: bytes}, "index": digest, "arm64": digest, "layers": [...]}.

    arm64 layers, bottom to top: an OS-like layer; the vllm package (from `sdist`) + METADATA + stale
    bytecode; the flashinfer package + METADATA + stale bytecode; a small top layer (an unrelated file,
    and a whiteout deleting an unrelated file from the OS layer). `stand_in` names the dist-info
    versions, the FlashInfer release and the dist-packages path.
    """
    site = stand_in.site
    import hashlib

    blobs: dict[str, bytes] = {}
    manifests: dict[str, bytes] = {}

    def put(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    def layer(files, **kw) -> dict:
        blob, diff_id = tar_gz(files, **kw)
        return {"mediaType": DOCKER_LAYER, "digest": put(blob), "size": len(blob), "diff_id": diff_id}

    os_layer = layer({"etc/os-release": b'ID=synthetic\nVERSION_ID="1"\n', "etc/obsolete": b"gone\n",
                      "usr/bin": None, f"{site}": None})
    vllm = vllm_files(sdist, edit, site)
    vllm_layer = layer({**vllm, **stale_bytecode(vllm), **dist_info(site, "vllm", stand_in.vllm_metadata)})
    flashinfer = package_files(flashinfer_sdist(stand_in.flashinfer), "flashinfer", edit, site)
    flashinfer_layer = layer({**flashinfer, **stale_bytecode(flashinfer),
                              **dist_info(site, "flashinfer-python", stand_in.flashinfer)})
    top_blob, top_diff = _top_layer()
    top = {"mediaType": DOCKER_LAYER, "digest": put(top_blob), "size": len(top_blob), "diff_id": top_diff}

    def image(arch: str, layers: list[dict], variant: str | None = None) -> dict:
        config = {"architecture": arch, "os": "linux",
                  "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "TORCH_CUDA_ARCH_LIST=9.0"],
                             "Cmd": ["python3"], "Labels": {"base.label": "kept"}},
                  "rootfs": {"type": "layers", "diff_ids": [l["diff_id"] for l in layers]},
                  "history": [{"created": "2026-01-01T00:00:00Z", "created_by": f"layer {i}"} for i in range(len(layers))]}
        if variant:
            config["variant"] = variant
        cfg = json.dumps(config).encode()
        manifest = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                    "config": {"mediaType": DOCKER_CONFIG, "digest": put(cfg), "size": len(cfg)},
                    "layers": [{k: l[k] for k in ("mediaType", "digest", "size")} for l in layers]}
        data = json.dumps(manifest).encode()
        manifests["sha256:" + hashlib.sha256(data).hexdigest()] = data
        platform = {"architecture": arch, "os": "linux", **({"variant": variant} if variant else {})}
        return {"mediaType": DOCKER_MANIFEST, "digest": put(data), "size": len(data), "platform": platform}

    amd64 = image("amd64", [layer({"etc/os-release": b"ID=other\n"})])
    arm64 = image("arm64", [os_layer, vllm_layer, flashinfer_layer, top], variant="v8")
    index = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": [amd64, arm64]}).encode()
    index_digest = put(index)
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "blobs" / "sha256").mkdir(parents=True)
    for digest, data in blobs.items():
        (dest / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": DOCKER_LIST, "digest": index_digest, "size": len(index),
         "annotations": {"org.opencontainers.image.ref.name": "base"}}]}))
    return {"blobs": blobs, "manifests": manifests, "index": index_digest, "layout": dest, "arm64": arm64["digest"],
            "layers": [os_layer["digest"], vllm_layer["digest"], flashinfer_layer["digest"], top["digest"]],
            "index_bytes": index, "stand_in": stand_in}


def small_layout(dest: Path, layers: list[tuple[bytes, str]], *, arch: str = "arm64", media_type: str = DOCKER_LAYER) -> str:
    """An OCI layout at `dest` holding one image of `layers` [(blob, diff_id)], bottom first; its digest."""
    import hashlib

    blobs = {}

    def put(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    config = json.dumps({"architecture": arch, "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                           "config": {"mediaType": DOCKER_CONFIG, **put(config)},
                           "layers": [{"mediaType": media_type, **put(b)} for b, _ in layers]}).encode()
    top = put(manifest)
    (dest / "blobs" / "sha256").mkdir(parents=True)
    for digest, data in blobs.items():
        (dest / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": DOCKER_MANIFEST, **top}]}))
    return top["digest"]


def raw_layer(members: list[tuple[str, bytes | None]]) -> tuple[bytes, str]:
    """A gzip layer of exactly these members in this order (None: a directory): whiteouts by name."""
    import hashlib

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    return gzip.compress(data, mtime=0), "sha256:" + hashlib.sha256(data).hexdigest()


def _top_layer() -> tuple[bytes, str]:
    import hashlib

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("etc/.wh.obsolete", b""), ("etc/motd", b"synthetic base\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(data)
    return out.getvalue(), "sha256:" + hashlib.sha256(data).hexdigest()


def flatten(layers: list[bytes]) -> dict[str, tuple[bytes | None, tarfile.TarInfo]]:
    """Apply layer tars bottom to top as a container runtime would: path -> (bytes or None, header)."""
    fs: dict[str, tuple[bytes | None, tarfile.TarInfo]] = {}
    for blob in layers:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
            for info in tar:
                name = info.name.lstrip("./").rstrip("/")
                folder, _, base = name.rpartition("/")
                if base == ".wh..wh..opq":
                    for key in [k for k in fs if k.startswith(folder + "/")]:
                        del fs[key]
                elif base.startswith(".wh."):
                    target = f"{folder}/{base[4:]}" if folder else base[4:]
                    for key in [k for k in fs if k == target or k.startswith(target + "/")]:
                        del fs[key]
                else:
                    fs[name] = (tar.extractfile(info).read() if info.isreg() else None, info)
    return fs




if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["pinned"]):
        sys.exit("usage: python tests/bases.py DIR [pinned]")
    stand_in = pinned_stand_in() if sys.argv[2:] else RELEASE
    made = make_stand_in(stand_in, Path(sys.argv[1]))
    print(f"{sys.argv[1]}:base  (linux/arm64 {made['arm64']}, index {made['index']}; vLLM {stand_in.vllm} files "
          f"as {stand_in.vllm_metadata}, FlashInfer {stand_in.flashinfer})")
