"""The local-engine route (`patchkit build IMAGE --load`): the base is already in the Docker or podman
engine (a Spark owner pulled it to run it), so only the patched files move.

1. find the base in the engine: by the digest the image file pins (any of the image's RepoDigests), or
   by the name or id given with --base; it must be the image's platform;
2. read the files the series names out of a created, never started, container of it
   (`GET /containers/{id}/archive?path=` per file: kilobytes), and plan on them, so every anchor is
   still asserted against the base's real files, read from the engine's copy, not from the network;
3. build a context of a Dockerfile (`FROM base`, `ADD layer.tar /`, LABEL, ENV; no RUN) and one small
   uncompressed tar of the patched files (mode and owner as in the base) and the bytecode stubs
   (images.engine), and let the engine build it: the base's layers stay where they are.

Versions come from the package's own version module (vLLM's `_version.py`, FlashInfer's
`_build_meta.py`) and must agree with the `<dist>-<version>.dist-info/METADATA` beside it: listing
site-packages through the engine API would transfer all of it.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from patchkit.errors import PatchkitError
from patchkit.images.definitions import Image
from patchkit.images.engine import BYTECODE_STUB, dockerfile, engine_build, engine_push
from patchkit.images.labels import describe_image
from patchkit.images.prepare import Prepared, is_own_base, package_roots, plan_on
from patchkit.oci.layer import Member, normalize
from patchkit.oci.media import Platform
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference
from patchkit.oci.source import PackagePaths, PackageRoot
from patchkit.patching.patchset import PatchSet

VERSION_MODULES = {"vllm": "_version.py", "flashinfer": "_build_meta.py"}
_VERSION_RE = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)


@dataclass
class LocalBase:
    spec: str
    name: str              # for org.opencontainers.image.base.name
    digest: str            # the registry digest the engine recorded for it, else its image id
    platform: Platform
    image_id: str
    from_ref: str          # what the Dockerfile's FROM names (resolved locally, never pulled)
    reference: Reference | None = None


def find_local_base(client, spec: str, platform: Platform) -> LocalBase | None:
    """The engine's copy of `spec`, or None when the engine does not have it."""
    import docker

    try:
        ref = Reference.parse(spec)
    except PatchkitError:
        ref = None
    found, from_ref = None, spec
    if ref is not None and ref.digest:
        for img in client.images.list():
            match = next((rd for rd in img.attrs.get("RepoDigests") or [] if rd.endswith("@" + ref.digest)), None)
            if match:
                found, from_ref = img, match
                break
    else:
        try:
            found = client.images.get(spec)
        except (docker.errors.ImageNotFound, docker.errors.NotFound):
            found = None
        except docker.errors.APIError as exc:
            raise PatchkitError(f"the engine cannot look up {spec}: {exc.explanation or exc}") from None
    if found is None:
        return None
    attrs = found.attrs
    have = {"os": attrs.get("Os"), "architecture": attrs.get("Architecture"), "variant": attrs.get("Variant")}
    if not platform.matches(have):
        raise PatchkitError(f"the engine's {spec} is {have['os']}/{have['architecture']}, not {platform}: "
                            f"pull the {platform} image (docker pull --platform {platform} ...)")
    digest = ref.digest if ref is not None and ref.digest else next(
        (rd.split("@", 1)[1] for rd in attrs.get("RepoDigests") or []), found.id)
    name = str(ref.with_tag(ref.tag)) if ref is not None else spec
    return LocalBase(spec, name, digest, platform, found.id, from_ref, ref)


class ContainerSource(PackagePaths):
    """`patchkit.sources.Source` over the files of a created (never started) container of the base."""

    def __init__(self, client, base: LocalBase, packages: Iterable[PackageRoot]):
        self.client, self.base = client, base
        self.packages = {p.name: p for p in packages}
        self.received = 0                                               # bytes read from the engine
        self._count = threading.Lock()
        self._files: dict[str, tuple[Member, bytes] | None] = {}        # image path -> (entry, bytes)
        self.description = f"{base.name} ({base.image_id[:19]}) in the local engine"
        self.container = client.containers.create(base.image_id, command=["/patchkit-never-runs"],
                                                  entrypoint=[], network_disabled=True)
        self._mount_once()

    def _mount_once(self) -> None:
        """podman mounts a created container's file system again for every archive request (~0.3 s each
        here); mounting it once through its own API (libpod, beside the Docker one) halves the reads.
        Docker keeps no such cost and has no such endpoint: nothing to do there."""
        components = {c.get("Name", "") for c in self.client.version().get("Components") or []}
        if any("Podman" in name for name in components):
            self.client.api.post(self.client.api._url("/libpod/containers/{0}/mount", self.container.id))

    def close(self) -> None:
        self.container.remove(force=True)

    def read(self, package: str, path: str) -> bytes | None:
        name = self._path(package, path)
        found = self._fetch("/" + name) if name else None
        return found[1] if found else None

    def prefetch(self, files: Iterable[tuple[str, str]]) -> None:
        """Read every file the series may name, a few requests at a time (each is one round trip)."""
        from concurrent.futures import ThreadPoolExecutor

        names = {"/" + n for package, path in files if (n := self._path(package, path))}
        names |= {"/" + normalize(f"{p.root}/{m}") for p in self.packages.values()
                  if (m := VERSION_MODULES.get(p.name))}
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(self._fetch, sorted(names)))

    def meta(self, image_path: str) -> Member | None:
        found = self._fetch(image_path)
        return found[0] if found else None

    def pycache(self, package: str, path: str) -> list[str]:
        """None listed: listing `__pycache__` would move every pyc in it; the stubs cover the names the
        image's interpreter uses (images.prepare.bytecode_names)."""
        return []

    def _fetch(self, name: str) -> tuple[Member, bytes] | None:
        import docker

        if name in self._files:
            return self._files[name]
        try:
            chunks, _ = self.container.get_archive(name)
            raw = b"".join(chunks)
        except docker.errors.NotFound:
            self._files[name] = None
            return None
        except docker.errors.APIError as exc:
            raise PatchkitError(f"the engine cannot read {name} from {self.base.spec}: {exc.explanation or exc}"
                                ) from None
        with self._count:
            self.received += len(raw)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            info = tar.next()
            if info is None:
                raise PatchkitError(f"the engine sent an empty archive for {name}")
            if not info.isreg():
                kind = "directory" if info.isdir() else "link" if info.issym() or info.islnk() else "special file"
                raise PatchkitError(f"{self.base.spec}: {name} is a {kind}; patchkit reads and patches regular "
                                    "files only")
            member = Member(normalize(name), "file", info.mode, info.uid, info.gid, info.size)
            self._files[name] = (member, tar.extractfile(info).read())
        return self._files[name]

    def _version(self, pkg) -> str | None:
        module = VERSION_MODULES.get(pkg.name)
        stated = None
        if module and (found := self._fetch("/" + normalize(f"{pkg.root}/{module}"))):
            m = _VERSION_RE.search(found[1].decode("utf-8", "replace"))
            stated = m.group(1) if m else None
        version = pkg.declared or stated
        if version is None:
            if self._fetch("/" + normalize(f"{pkg.root}/__init__.py")) is None and not pkg.required:
                return None
            raise PatchkitError(f"{self.base.spec}: the {pkg.name} version is unknown (no {module} stating "
                                "__version__ and no version in the image file)")
        site = posixpath.dirname("/" + normalize(pkg.root))
        dist = canonicalize_name(pkg.distribution).replace("-", "_")
        metadata = self._fetch(f"{site}/{dist}-{version}.dist-info/METADATA")
        if metadata is None:
            raise PatchkitError(f"{self.base.spec}: no {site}/{dist}-{version}.dist-info/METADATA, so the "
                                f"{pkg.name} version in this base is not confirmed")
        actual = next((line.split(":", 1)[1].strip() for line in metadata[1].decode("utf-8", "replace").splitlines()
                       if line.startswith("Version:")), None)
        if actual != version or (stated is not None and stated != version):
            raise PatchkitError(f"{self.base.spec}: {pkg.distribution} versions disagree: image file "
                                f"{pkg.declared}, {module} {stated}, METADATA {actual}")
        return version


def prepare_local(image: Image, patchset: PatchSet, client, base: LocalBase, *, explicit: bool) -> Prepared:
    own = is_own_base(image, base.spec if explicit else None, {base.digest})
    patches = patchset.series(list(image.series))
    source = ContainerSource(client, base, package_roots(image, patches, own))
    try:
        return plan_on(image, patchset, base, source, own=own, spec=base.spec, dirs=False)
    finally:
        source.close()


@dataclass
class Loaded:
    """An image built in the local engine from its copy of the base."""

    prepared: Prepared
    version: str
    tag: str
    labels: dict[str, str]
    annotations: dict[str, str]
    epoch: int
    image_id: str = ""
    local_tag: str = ""
    sent: int = 0                 # build context bytes sent to the engine

    @property
    def digest(self) -> str:
        return self.image_id

    @property
    def transferred(self) -> int:
        return self.prepared.source.received + self.sent


def layer_tar(prepared: Prepared, epoch: int) -> bytes:
    """The patched files (mode, owner as in the base) and the bytecode stubs, uncompressed, no directories
    (they exist in the base; an entry for one would overwrite its metadata)."""
    raw = io.BytesIO()
    entries = [(f.path, f.data, f.mode, f.uid, f.gid) for f in prepared.files]
    entries += [(p, BYTECODE_STUB, 0o644, 0, 0) for p in prepared.stale_bytecode]
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data, mode, uid, gid in sorted(entries):
            info = tarfile.TarInfo(normalize(path))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode & 0o7777, uid, gid, epoch
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def build_local(prepared: Prepared, client, *, push: Sequence[str] = (), epoch: int | None = None,
                revision: str | None = None, source_url: str | None = None,
                progress: Progress | None = None) -> Loaded:
    progress = progress or Quiet()
    meta = describe_image(prepared, epoch=epoch, revision=revision, source_url=source_url)
    loaded = Loaded(prepared, meta.version, meta.tag, meta.labels, meta.annotations, meta.epoch)
    tags = [str(Reference.parse(r).with_tag(Reference.parse(r).tag or meta.tag)) for r in push]
    loaded.local_tag = tags[0] if tags else f"patchkit/{prepared.image.name}:{meta.tag}"
    layer = layer_tar(prepared, meta.epoch)
    text = dockerfile(prepared.image.name, prepared.base.from_ref, "ADD layer.tar /", meta.labels,
                      prepared.image.env).encode()
    context = io.BytesIO()
    # The context goes gzip-compressed (Python source packs ~4:1): what is sent is what is counted.
    with tarfile.open(fileobj=context, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("Dockerfile", text), ("layer.tar", layer)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), meta.epoch, 0o644
            tar.addfile(info, io.BytesIO(data))
    loaded.sent = len(context.getvalue())
    loaded.image_id = engine_build(client, context.getvalue(), loaded.local_tag, str(prepared.base.platform),
                                   progress)
    engine_push(client, loaded.image_id, loaded.local_tag, tags)
    if not tags:  # a moving name for scripts (`patchkit smoke --image patchkit/IMAGE:latest`)
        client.images.get(loaded.image_id).tag(f"patchkit/{prepared.image.name}", "latest")
    return loaded
