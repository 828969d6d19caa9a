"""`patchkit load LAYOUT[:REF]`: an OCI layout's linux/arm64 image into the local Docker or podman engine,
so `patchkit build IMAGE --load --base TAG` can build on it (the demo base of `nox -s demo-base`, say).

Why not skopeo: Debian's skopeo 1.9.3 refuses the demo layout (`no descriptor found for reference
"base"`): the layout's index entry is a manifest list, which that version does not descend. patchkit
selects the platform's manifest itself (oci.base, as every build does) and sends the engine a
docker-archive, the format `docker save` writes and `docker load` / podman's `POST /images/load`
take: `manifest.json` (`[{"Config", "RepoTags", "Layers"}]`), the image config, and each layer as
the uncompressed tar its config's `rootfs.diff_ids` name. Every blob is checked against its digest and
every layer's uncompressed bytes against its diff_id as it is written; the archive is spooled to a
temporary file in bounded chunks, never held in memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from patchkit.errors import PatchkitError
from patchkit.oci.base import BaseImage, open_base
from patchkit.oci.media import OCI_LAYER_TAR, READABLE_LAYERS, Platform
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference
from patchkit.untrusted import InputTooLarge, limit_of

PLATFORM = "linux/arm64"
CHUNK = 1 << 20


class NotALayout(PatchkitError):
    """`spec` given to `patchkit load` is not an OCI layout directory (DIR or DIR:REF) (exit 2)."""

    def __init__(self, spec: str):
        super().__init__(f"patchkit load {spec}: not an OCI layout directory (DIR or DIR:REF); an image in "
                         "a registry is pulled by the engine itself (docker pull)")
        self.spec = spec


class BadLayer(PatchkitError):
    """Layer `digest` of the layout `spec` (None: its list of layers) cannot be loaded as it stands: `problem`
    says what it is and what was expected of it (exit 2). Nothing was sent to the engine."""

    def __init__(self, spec: str, digest: str | None, problem: str):
        super().__init__(f"{spec}: layer {digest} {problem}" if digest else f"{spec}: {problem}")
        self.spec, self.digest, self.problem = spec, digest, problem


class BadLoadTag(PatchkitError):
    """`--tag` `tag` is not a NAME:TAG the engine can name a loaded image by: `problem` (exit 2)."""

    def __init__(self, tag: str, problem: str):
        super().__init__(f"--tag {tag!r}: {problem}")
        self.tag, self.problem = tag, problem


class LoadRefused(PatchkitError):
    """The engine did not end up holding the image as `tag`: `problem` says where it stopped (exit 2)."""

    def __init__(self, tag: str, problem: str):
        super().__init__(f"loading {tag}: {problem}")
        self.tag, self.problem = tag, problem


@dataclass(frozen=True)
class LoadedLayout:
    """What `patchkit load` did: a receipt, not a base. A build on it finds it in the engine by its tag,
    as any image there (oci.base.LocalBase)."""

    tag: str           # the name the engine now has it under
    image_id: str      # the engine's id of it (the config's digest)
    config_digest: str
    layers: int
    sent: int          # archive bytes sent to the engine


def default_tag(spec: str) -> str:
    """`patchkit/<layout folder>:<ref>` (`build/demo-base:base` -> `patchkit/demo-base:base`)."""
    folder, ref = (spec, "") if Path(spec).is_dir() or ":" not in spec else spec.rsplit(":", 1)
    name = re.sub(r"[^a-z0-9._-]+", "-", Path(folder).resolve().name.lower()).strip("._-") or "base"
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", ref or "latest")[:128]
    return f"patchkit/{name}:{tag}"


def open_layout(spec: str, cache: Path, progress: Progress) -> BaseImage:
    """The layout's linux/arm64 image; anything that is not an OCI layout directory is refused."""
    head = spec.rpartition(":")[0]
    if not (Path(spec).is_dir() or (head and Path(head).is_dir())):
        raise NotALayout(spec)
    return open_base(spec, Platform.parse(PLATFORM), cache=cache, progress=progress)


def write_archive(base: BaseImage, tag: str, out: BinaryIO, workdir: Path) -> int:
    """The docker-archive of `base` tagged `tag` into `out`; the number of layers."""
    diff_ids = list((base.config.get("rootfs") or {}).get("diff_ids") or [])
    if len(diff_ids) != len(base.layers):
        raise BadLayer(base.spec, None, f"the config names {len(diff_ids)} layers (rootfs.diff_ids), "
                       f"the manifest {len(base.layers)}")
    config_name = base.manifest["config"]["digest"].removeprefix("sha256:") + ".json"
    names = []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, config_name, base.config_bytes)
        for desc, diff_id in zip(base.layers, diff_ids, strict=True):  # (same length, checked above)
            name = f"{diff_id.removeprefix('sha256:')}/layer.tar"
            spool = workdir / "layer.tar"
            with open(spool, "wb") as raw:
                _uncompressed(base, desc, diff_id, raw)
            tar.add(spool, arcname=name, filter=_plain)
            spool.unlink()
            names.append(name)
        manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": names}]
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return len(names)


def _uncompressed(base: BaseImage, desc: dict, diff_id: str, out: BinaryIO) -> None:
    """Layer `desc`'s tar into `out`, its blob checked against its digest and the tar against diff_id."""
    digest, media_type = desc.get("digest", ""), desc.get("mediaType", "")
    if media_type not in READABLE_LAYERS:
        raise BadLayer(base.spec, digest, f"is {media_type}; gzip or plain tar layers only")
    blob_sha, tar_sha = hashlib.sha256(), hashlib.sha256()
    inflate = None if media_type == OCI_LAYER_TAR else zlib.decompressobj(16 + zlib.MAX_WBITS)
    limit, written = limit_of("layer-tar"), 0
    with base.open_blob(digest, desc["size"]) as raw:  # oci.schema.Manifest requires every layer's size
        while chunk := raw.read(CHUNK):
            blob_sha.update(chunk)
            pending = chunk
            while pending:  # inflated a bounded piece at a time: a gzip bomb is never held or written whole
                try:
                    data = inflate.decompress(pending, CHUNK) if inflate else pending
                except zlib.error as exc:
                    raise BadLayer(base.spec, digest, f"is not gzip data ({exc})") from None
                pending = inflate.unconsumed_tail if inflate else b""
                written += len(data)
                if written > limit:
                    raise InputTooLarge(f"{base.spec}: layer {digest} inflated", "layer-tar", limit, written)
                tar_sha.update(data)
                out.write(data)
    if inflate is not None and not inflate.eof:
        raise BadLayer(base.spec, digest, "ends inside its gzip stream")
    if "sha256:" + blob_sha.hexdigest() != digest:
        raise BadLayer(base.spec, digest, "does not match its digest")
    if "sha256:" + tar_sha.hexdigest() != diff_id:
        raise BadLayer(base.spec, digest, f"uncompresses to sha256:{tar_sha.hexdigest()}, not the diff_id {diff_id} "
                       "its config names")


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode, info.mtime = 0o644, 0
    return info


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def load_layout(spec: str, *, tag: str | None = None, engine_url: str | None = None, cache: Path | None = None,
                progress: Progress | None = None) -> LoadedLayout:
    """Load the layout `spec`'s linux/arm64 image into the engine under `tag` (default_tag)."""
    from patchkit.cache_root import default_cache_root
    from patchkit.engine import connect

    progress = progress or Quiet()
    tag = tag or default_tag(spec)
    try:
        parsed = Reference.parse(tag)
    except PatchkitError as exc:
        raise BadLoadTag(tag, str(exc)) from None
    if parsed.digest or not parsed.tag:
        raise BadLoadTag(tag, "give NAME:TAG (no digest): the engine names what it loads by a tag")
    base = open_layout(spec, cache or default_cache_root() / "oci", progress)
    with tempfile.TemporaryDirectory(prefix="patchkit-load-") as tmp:
        archive = Path(tmp) / "image.tar"
        with open(archive, "wb") as out:  # whole and checked before the engine is asked for anything
            layers = write_archive(base, tag, out, Path(tmp))
        sent = archive.stat().st_size
        client = connect(engine_url)
        progress.note(f"sending {base.spec} ({PLATFORM}, {layers} layers, {sent} bytes) to the engine as {tag}")
        with open(archive, "rb") as data:
            _send(client, data, tag)
    image_id = _loaded_id(client, tag)
    return LoadedLayout(tag, image_id, base.manifest["config"]["digest"], layers, sent)


def _send(client, data: BinaryIO, tag: str) -> None:
    import docker
    import requests

    try:
        for chunk in client.api.load_image(data):
            if isinstance(chunk, dict) and chunk.get("error"):
                raise LoadRefused(tag, f"the engine refused the image: {str(chunk['error']).strip()}")
    except docker.errors.APIError as exc:
        raise LoadRefused(tag, f"the engine refused the image: {exc.explanation or exc}") from None
    except (requests.exceptions.RequestException, OSError) as exc:
        raise LoadRefused(tag, f"the engine stopped answering ({exc.__class__.__name__})") from None


def _loaded_id(client, tag: str) -> str:
    import docker

    try:
        return client.images.get(tag).id
    except docker.errors.NotFound:
        raise LoadRefused(tag, "the engine took the archive but has no image of that tag after it") from None
    except docker.errors.APIError as exc:
        raise LoadRefused(tag, f"the engine cannot look it up after loading it: {exc.explanation or exc}") from None

