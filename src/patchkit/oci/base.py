"""The image a build starts from (`Base`), and opening one for one platform, from a registry or an OCI
layout, with a blob cache (`BaseImage`); the local engine's copy of one is a `LocalBase`, found by
images.local and read by sources.container_files.

A base is named by a registry reference (`[registry/]repo[:tag]@sha256:...`) or a layout directory
(`DIR` or `DIR:NAME`). An index is resolved to its entry for the requested platform; every manifest
and blob is checked against its digest. Registry blobs are fetched only when asked for (the layers
holding the files to patch, or all of them for a layout output) into a cache keyed by digest, so a
second build reads nothing from the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from patchkit.cache_root import default_cache_root
from patchkit.errors import PatchkitError
from patchkit.jsondata import decode
from patchkit.oci.layout import Layout, LocalBlob
from patchkit.oci.media import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Platform,
    check_digest,
    sha256_digest,
)
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference, RegistryClient
from patchkit.oci.schema import Descriptor, ImageConfig, Index, Manifest, Typed, parse
from patchkit.oci.verified import VerifiedStream, check_bytes
from patchkit.untrusted import open_regular, read_file

# An index may name an index (a nested list); real ones nest once. Deeper is refused, so a registry
# cannot keep a build following an endless chain of generated indexes.
MAX_INDEX_DEPTH = 4


def default_cache() -> Path:
    """`oci/` in patchkit's one cache root (`$PATCHKIT_CACHE_DIR`, else the user cache directory)."""
    return default_cache_root() / "oci"


@dataclass(kw_only=True)
class Base:
    """The image a build adds its layer to, as every build route knows it: a registry or layout base read
    daemonless (`BaseImage`, also what the --engine route plans on) or the local engine's copy of it
    (`LocalBase`, the --load route). The annotations naming the base (images.labels) read
    these fields, and only these."""

    spec: str                     # as given (image.toml or --base)
    name: str                     # for org.opencontainers.image.base.name
    digest: str                   # what a registry serves it by (index or manifest); else the engine's image id
    platform: Platform
    reference: Reference | None = None   # the registry reference it was named by; None for a layout or an id
    image_id: str | None = None          # the engine's id of it (its config's digest); None outside an engine
    repo_digests: tuple[str, ...] = ()   # the engine's RepoDigests of it (name@digest it was pulled by)


@dataclass(kw_only=True)
class BaseImage(Base):
    """A registry or OCI-layout base, its manifest and config checked, its blobs read on demand."""

    manifest_bytes: bytes
    manifest: dict                # checked against oci.schema.Manifest before it is kept here
    manifest_digest: str
    config_bytes: bytes
    config: dict                  # checked against oci.schema.ImageConfig
    layout: Layout | None = None
    cache: Path = field(default_factory=default_cache)
    client: RegistryClient | None = None
    fetched: list[str] = field(default_factory=list)   # blobs downloaded by this run
    keep: bool = True     # cache fetched blobs on disk; False streams them (a push-only build of a
                          # many-gigabyte base then needs no disk for it)

    @property
    def layers(self) -> list[dict]:
        return list(self.manifest.get("layers") or [])

    def cached_path(self, digest: str) -> Path:
        return self.cache / "blobs" / "sha256" / check_digest(digest).split(":", 1)[1]

    def blob(self, digest: str, size: int | None = None) -> Path:
        """A local file holding blob `digest`: in the base layout, or in the cache (downloaded once,
        verified on the way in). Whoever reads it checks it again (`open_blob`, `local_blob`): a file on
        disk can change after it was written."""
        if self.layout is not None:
            return self.layout.blob_path(digest)
        path = self.cached_path(digest)
        if not path.is_file():
            assert self.client is not None and self.reference is not None
            self.client.download_blob(self.reference.repository, digest, path, size)
            self.fetched.append(digest)
        return path

    def local_blob(self, digest: str, size: int) -> LocalBlob:
        """Blob `digest` on disk for an output layout, which hashes it on the way in."""
        return LocalBlob(self.blob(digest, size), size, cached=self.layout is None)

    def small_blob(self, digest: str, size: int) -> bytes:
        """A manifest or config blob whole (bounded by the manifest limit), checked against its descriptor."""
        if self.layout is not None:
            return self.layout.read_blob(digest, size)
        what, path = f"base {self.spec}", self.blob(digest, size)
        return check_bytes(read_file(path, "manifest", f"{what}: blob {digest}"), digest, size, what, discard=path)

    def open_blob(self, digest: str, size: int) -> VerifiedStream:
        """A reader over blob `digest` that stops at `size` bytes and checks the digest at its end (call
        `finish()`): a local file when there is one (layout, cache), else a download that is cached
        (`keep`) or streamed."""
        what = f"base {self.spec}"
        if self.layout is not None or self.keep or self.cached_path(digest).is_file():
            path = self.blob(digest, size)
            return VerifiedStream(open_regular(path, "layer", f"{what}: blob {digest}"), digest, size, what,
                                  discard=path if self.layout is None else None)
        assert self.client is not None and self.reference is not None
        return self.client.stream_blob(self.reference.repository, digest, size)

    def copy_source(self, digest: str, size: int) -> VerifiedStream:
        """What to upload blob `digest` from, verified as it is read: its local file, or a stream from the
        base's registry."""
        if self.layout is None and not self.cached_path(digest).is_file():
            assert self.client is not None and self.reference is not None
            return self.client.stream_blob(self.reference.repository, digest, size)
        return self.open_blob(digest, size)


@dataclass(kw_only=True)
class LocalBase(Base):
    """The local engine's copy of the base (the --load route): `digest` is the registry digest the engine
    recorded for it, else its image id; `repo_digests` the engine's RepoDigests (labels.base_annotations)."""

    image_id: str          # always known: the engine found the image by it
    from_ref: str          # what the Dockerfile's FROM names (resolved locally, never pulled)
    layers: tuple[str, ...] = ()   # its RootFS diff_ids, as the engine lists them (images.reuse checks them)


def open_base(spec: str, platform: Platform, *, cache: Path | None = None,
              progress: Progress | None = None, keep: bool = True) -> BaseImage:
    """Resolve `spec` to its `platform` image. Raises PatchkitError for anything unreadable."""
    progress = progress or Quiet()
    local = _layout_spec(spec)
    if local is not None:
        return _from_layout(spec, Layout(local[0]), local[1], platform, cache)
    ref = Reference.parse(spec)
    client = RegistryClient(ref.registry, progress=progress)
    wanted = ref.digest or ref.tag or "latest"
    data, media_type = client.get_manifest(ref.repository, wanted)
    top_digest = sha256_digest(data)

    def fetch_manifest(desc: Descriptor) -> tuple[bytes, str]:
        child, child_type = client.get_manifest(ref.repository, desc.digest)
        return check_bytes(child, desc.digest, desc.size, f"base {spec}"), child_type

    manifest_bytes, manifest_digest = _select(spec, data, media_type, platform, fetch_manifest)
    doc, manifest = parse(manifest_bytes, Manifest, f"manifest {manifest_digest} of {spec}")
    base = BaseImage(spec=spec, name=str(ref.with_tag(ref.tag)), digest=top_digest, platform=platform,
                     manifest_bytes=manifest_bytes, manifest=manifest, manifest_digest=manifest_digest,
                     config_bytes=b"", config={}, reference=ref, cache=cache or default_cache(), client=client, keep=keep)
    return _finish(base, base.small_blob(doc.config.digest, doc.config.size))


def _layout_spec(spec: str) -> tuple[Path, str | None] | None:
    """(directory, name) when `spec` names a layout directory, `DIR` or `DIR:NAME`; None otherwise."""
    if Path(spec).is_dir():
        return Path(spec), None
    head, sep, tail = spec.rpartition(":")
    if sep and head and Path(head).is_dir():
        return Path(head), tail
    if spec.startswith(("/", "./", "../", "~")):
        raise NoSuchLayout(spec)
    return None


def _media_type(data: bytes, what: str) -> str:
    """The media type a manifest or index names itself by ("" when it names none)."""
    return decode(data, Typed, what).mediaType or ""


def _from_layout(spec: str, layout: Layout, ref: str | None, platform: Platform, cache: Path | None) -> BaseImage:
    entry = layout.resolve(ref)
    top = layout.read_blob(entry.digest, entry.size)

    def fetch_manifest(desc: Descriptor) -> tuple[bytes, str]:
        data = layout.read_blob(desc.digest, desc.size)
        return data, _media_type(data, f"{spec} blob {desc.digest}")

    media_type = _media_type(top, f"{spec} manifest {entry.digest}") or entry.mediaType
    manifest_bytes, manifest_digest = _select(spec, top, media_type, platform, fetch_manifest)
    doc, manifest = parse(manifest_bytes, Manifest, f"manifest {manifest_digest} of {spec}")
    config_bytes = layout.read_blob(doc.config.digest, doc.config.size)
    base = BaseImage(spec=spec, name=f"oci-layout:{layout.root.resolve()}" + (f":{ref}" if ref else ""),
                     digest=entry.digest, platform=platform, manifest_bytes=manifest_bytes, manifest=manifest,
                     manifest_digest=manifest_digest, config_bytes=b"", config={}, layout=layout,
                     cache=cache or default_cache())
    return _finish(base, config_bytes)


def _select(spec: str, data: bytes, media_type: str, platform: Platform, fetch, depth: int = 0) -> tuple[bytes, str]:
    """The platform manifest: `data` itself, or the one entry of the index `data` for `platform`."""
    if media_type in MANIFEST_TYPES:
        return data, sha256_digest(data)
    if media_type not in INDEX_TYPES:
        raise UnsupportedBase(spec, f"unsupported manifest type {media_type!r}")
    if depth >= MAX_INDEX_DEPTH:
        raise UnsupportedBase(spec, f"indexes nested more than {MAX_INDEX_DEPTH} deep; refused")
    index = decode(data, Index, f"index {sha256_digest(data)} of {spec}")
    platforms = [(m, msgspec.structs.asdict(m.platform) if m.platform else {}) for m in index.manifests]
    matches = [m for m, p in platforms if platform.matches(p)]
    if not matches:
        have = sorted(str(Platform(p["os"], p["architecture"], p.get("variant"))) for _, p in platforms if p)
        raise NoPlatformImage(spec, str(platform), 0, have)
    if len({m.digest for m in matches}) > 1:
        raise NoPlatformImage(spec, str(platform), len(matches), [])
    child, child_type = fetch(matches[0])
    child_type = child_type or matches[0].mediaType
    if child_type in INDEX_TYPES:
        return _select(spec, child, child_type, platform, fetch, depth + 1)
    return child, matches[0].digest


class NoSuchLayout(PatchkitError):
    """The base `spec` is a path (it starts with /, ./, ../ or ~) where no OCI layout directory is (exit 2)."""

    def __init__(self, spec: str):
        super().__init__(f"base {spec}: no such OCI layout directory")
        self.spec = spec


class UnsupportedBase(PatchkitError):
    """The base `spec` is served in a form patchkit does not read: `problem` (exit 2)."""

    def __init__(self, spec: str, problem: str):
        super().__init__(f"base {spec}: {problem}")
        self.spec, self.problem = spec, problem


class NoPlatformImage(PatchkitError):
    """The base `spec`'s index has no one image for `platform`: `found` of them differ (0: none; the
    platforms it `has` are listed) (exit 2)."""

    def __init__(self, spec: str, platform: str, found: int, has: list[str]):
        why = (f"has no {platform} image (it has: {', '.join(has) or 'none'})" if not found else
               f"has {found} different {platform} images; name one by digest")
        super().__init__(f"base {spec} {why}")
        self.spec, self.platform, self.found, self.has = spec, platform, found, has


class WrongPlatform(PatchkitError):
    """A base of another platform than the one asked for (exit 2): the base `spec`, the platform it was
    `wanted` for and the one it was `found` to be (os/architecture), by its config or, `in_engine`, by the
    local engine's copy of it (then the wanted one is to be pulled)."""

    def __init__(self, spec: str, wanted: str, found: str, *, in_engine: bool = False):
        self.spec, self.wanted, self.found, self.in_engine = spec, wanted, found, in_engine
        super().__init__(f"the engine's {spec} is {found}, not {wanted}: pull the {wanted} image (docker pull "
                         f"--platform {wanted} ...)" if in_engine else f"base {spec} is a {found} image, not {wanted}")


def _finish(base: BaseImage, config_bytes: bytes) -> BaseImage:
    base.config_bytes = config_bytes
    doc, base.config = parse(config_bytes, ImageConfig, f"config of {base.spec}")
    if not base.platform.matches(msgspec.structs.asdict(doc)):
        raise WrongPlatform(base.spec, str(base.platform), f"{doc.os}/{doc.architecture}")
    return base
