"""Open a base image for one platform, from a registry or an OCI layout, with a blob cache.

A base is named by a registry reference (`[registry/]repo[:tag]@sha256:...`) or a layout directory
(`DIR` or `DIR:NAME`). An index is resolved to its entry for the requested platform; every manifest
and blob is checked against its digest. Registry blobs are fetched only when asked for (the layers
holding the files to patch, or all of them for a layout output) into a cache keyed by digest, so a
second build reads nothing from the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from patchkit.errors import PatchkitError
from patchkit.oci.layout import Layout
from patchkit.oci.media import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Platform,
    check_digest,
    load_json,
    sha256_digest,
)
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference, RegistryClient
from patchkit.sources.cache import default_cache_root


def default_cache() -> Path:
    """`oci/` in patchkit's one cache root (`$PATCHKIT_CACHE_DIR`, else the user cache directory)."""
    return default_cache_root() / "oci"


@dataclass
class BaseImage:
    spec: str                     # as given (image.toml or --base)
    name: str                     # for org.opencontainers.image.base.name
    digest: str                   # what the spec resolved to (index or manifest): base.digest
    platform: Platform
    manifest_bytes: bytes
    manifest: dict
    manifest_digest: str
    config_bytes: bytes
    config: dict
    reference: Reference | None = None
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
        """A local file holding blob `digest`: in the base layout, or in the cache (downloaded once)."""
        if self.layout is not None:
            return self.layout.blob_path(digest)
        path = self.cached_path(digest)
        if not path.is_file():
            assert self.client is not None and self.reference is not None
            self.client.download_blob(self.reference.repository, digest, path, size)
            self.fetched.append(digest)
        return path


    def open_blob(self, digest: str, size: int | None = None) -> BinaryIO:
        """A reader over blob `digest`: a local file when there is one (layout, cache), else a download
        that is cached (`keep`) or streamed. Callers that need certainty hash what they read."""
        if self.layout is not None or self.keep or self.cached_path(digest).is_file():
            return open(self.blob(digest, size), "rb")
        assert self.client is not None and self.reference is not None
        return self.client.stream_blob(self.reference.repository, digest, size)

    def copy_source(self, digest: str, size: int | None = None) -> Path | object:
        """What to upload blob `digest` from: its local file, or a stream from the base's registry."""
        if self.layout is not None or self.cached_path(digest).is_file():
            return self.blob(digest, size)
        assert self.client is not None and self.reference is not None
        return self.client.stream_blob(self.reference.repository, digest, size)


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

    def fetch_manifest(digest: str) -> tuple[bytes, str]:
        return client.get_manifest(ref.repository, digest)

    manifest_bytes, manifest_digest = _select(spec, data, media_type, platform, fetch_manifest)
    manifest = load_json(manifest_bytes, f"manifest {manifest_digest} of {spec}")
    base = BaseImage(spec=spec, name=str(ref.with_tag(ref.tag)), digest=top_digest, platform=platform,
                     manifest_bytes=manifest_bytes, manifest=manifest, manifest_digest=manifest_digest,
                     config_bytes=b"", config={}, reference=ref, cache=cache or default_cache(), client=client, keep=keep)
    cfg_desc = _config_descriptor(manifest, spec)
    config_bytes = base.blob(cfg_desc["digest"]).read_bytes()
    return _finish(base, config_bytes)


def _layout_spec(spec: str) -> tuple[Path, str | None] | None:
    """(directory, name) when `spec` names a layout directory, `DIR` or `DIR:NAME`; None otherwise."""
    if Path(spec).is_dir():
        return Path(spec), None
    head, sep, tail = spec.rpartition(":")
    if sep and head and Path(head).is_dir():
        return Path(head), tail
    if spec.startswith(("/", "./", "../", "~")):
        raise PatchkitError(f"base {spec}: no such OCI layout directory")
    return None


def _from_layout(spec: str, layout: Layout, ref: str | None, platform: Platform, cache: Path | None) -> BaseImage:
    entry = layout.resolve(ref)
    top = layout.read_blob(check_digest(entry.get("digest", ""), f"{spec} index entry"))

    def fetch_manifest(digest: str) -> tuple[bytes, str]:
        data = layout.read_blob(digest)
        return data, load_json(data, f"{spec} blob {digest}").get("mediaType", "")

    media_type = load_json(top, f"{spec} manifest").get("mediaType") or entry.get("mediaType", "")
    manifest_bytes, manifest_digest = _select(spec, top, media_type, platform, fetch_manifest)
    manifest = load_json(manifest_bytes, f"manifest {manifest_digest} of {spec}")
    config_bytes = layout.read_blob(_config_descriptor(manifest, spec)["digest"])
    base = BaseImage(spec=spec, name=f"oci-layout:{layout.root.resolve()}" + (f":{ref}" if ref else ""),
                     digest=entry["digest"], platform=platform, manifest_bytes=manifest_bytes, manifest=manifest,
                     manifest_digest=manifest_digest, config_bytes=b"", config={}, layout=layout,
                     cache=cache or default_cache())
    return _finish(base, config_bytes)


def _select(spec: str, data: bytes, media_type: str, platform: Platform, fetch) -> tuple[bytes, str]:
    """The platform manifest: `data` itself, or the one entry of the index `data` for `platform`."""
    if media_type in MANIFEST_TYPES:
        return data, sha256_digest(data)
    if media_type not in INDEX_TYPES:
        raise PatchkitError(f"base {spec}: unsupported manifest type {media_type!r}")
    index = load_json(data, f"index of {spec}")
    matches = [m for m in index.get("manifests") or [] if platform.matches(m.get("platform") or {})]
    if not matches:
        have = sorted(str(Platform(**{k: p.get(k) for k in ("os", "architecture", "variant")}))
                      for p in (m.get("platform") or {} for m in index.get("manifests") or [])
                      if p.get("os") and p.get("architecture"))
        raise PatchkitError(f"base {spec} has no {platform} image (it has: {', '.join(have) or 'none'})")
    if len({m["digest"] for m in matches}) > 1:
        raise PatchkitError(f"base {spec} has {len(matches)} different {platform} images; name one by digest")
    digest = check_digest(matches[0]["digest"], f"{spec} {platform} entry")
    child, child_type = fetch(digest)
    if sha256_digest(child) != digest:
        raise PatchkitError(f"base {spec}: {platform} manifest does not match {digest}")
    child_type = child_type or matches[0].get("mediaType", "")
    if child_type in INDEX_TYPES:
        return _select(spec, child, child_type, platform, fetch)
    return child, digest


def _config_descriptor(manifest: dict, spec: str) -> dict:
    cfg = manifest.get("config")
    if not isinstance(cfg, dict) or "digest" not in cfg:
        raise PatchkitError(f"base {spec}: manifest has no config descriptor")
    check_digest(cfg["digest"], f"base {spec} config")
    return cfg


def _finish(base: BaseImage, config_bytes: bytes) -> BaseImage:
    cfg_digest = base.manifest["config"]["digest"]
    if sha256_digest(config_bytes) != cfg_digest:
        raise PatchkitError(f"base {base.spec}: config blob does not match {cfg_digest}")
    base.config_bytes = config_bytes
    base.config = load_json(config_bytes, f"config of {base.spec}")
    if not base.platform.matches(base.config):
        got = f"{base.config.get('os')}/{base.config.get('architecture')}"
        raise PatchkitError(f"base {base.spec} is a {got} image, not {base.platform}")
    for desc in base.layers:
        check_digest(desc.get("digest", ""), f"base {base.spec} layer")
    return base
