"""Everything a build decides before it writes anything: the plan against the base's real files and the
files of the new layer.

The base's files come from a source that reads them where the base is (`sources.base.ImageFiles`:
`ImageLayersSource` over a registry or layout's layers, or `sources.container_files.ContainerSource` over the
local engine's copy); the planner asserts every anchor against them. What the image carries is
patching.carry's one rule: a broken or partial patch raises `PatchFailed` with the planner's diagnostic,
a series that changes nothing in the base raises `PatchkitError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from patchkit.cache_root import default_cache_root
from patchkit.errors import PatchkitError
from patchkit.images.definitions import Image
from patchkit.images.extras import NO_EXTRAS, ExtraLayer, extra_layer
from patchkit.oci.base import Base, BaseImage, open_base
from patchkit.oci.layer import Entry, normalize
from patchkit.oci.media import Platform
from patchkit.oci.progress import Progress, Quiet
from patchkit.patching.carry import carry
from patchkit.patching.patchset import Edit, Patch, PatchSet, Probe
from patchkit.patching.planner import FileChange, Plan, plan
from patchkit.sources.base import ImageFiles
from patchkit.sources.image_files import PackageRoot
from patchkit.sources.image_layers import ImageLayersSource
from patchkit.sources.installed_version import release_layouts

BaseT = TypeVar("BaseT", bound=Base)
FilesT = TypeVar("FilesT", bound=ImageFiles)


@dataclass(frozen=True)
class PatchedFile:
    path: str            # absolute image path
    data: bytes
    mode: int
    uid: int
    gid: int
    change: FileChange


@dataclass
class Prepared(Generic[BaseT, FilesT]):
    """Everything decided before anything is written: the plan and the files of the new layer. A route's
    own steps see their own base and files: `Prepared[BaseImage, ImageLayersSource]` (daemonless,
    --engine), `Prepared[LocalBase, ContainerSource]` (--load)."""

    image: Image
    base: BaseT
    source: FilesT
    plan: Plan
    versions: dict[str, str]             # what the base carries
    engine_versions: dict[str, str]      # what ranges were judged against
    carried: list[Patch]                 # patches the image carries, in order
    skipped: list[tuple[Patch, str, str]]   # (patch, state, why)
    files: list[PatchedFile]
    dirs: list[Entry]                    # parent directories, with the base's metadata
    stale_bytecode: list[str]            # image paths deleted (daemonless) or stubbed (engine)
    extras: ExtraLayer = NO_EXTRAS       # the pinned wheels' files (images.extras), on every route


def is_image_id(spec: str) -> bool:
    """An engine's image id as `--base` may give it: `sha256:<hex>` (the reference grammar would read
    it as repository `sha256`, tag `<hex>`) or 64 hex, which Docker refuses as a repository name."""
    return re.fullmatch(r"sha256:[0-9a-f]{1,64}|[0-9a-f]{64}", spec) is not None


def is_own_base(image: Image, base_spec: str | None, digests: set[str]) -> bool:
    """The image file's versions and layout describe its own base; any other base speaks for itself."""
    return base_spec is None or image.base_digest in digests


def package_roots(image: Image, patches: list[Patch], own: bool) -> list[PackageRoot]:
    # Only the packages the series touches (and vllm, whose version every range names): proving another
    # package absent would mean reading every layer.
    touched = {"vllm"} | {e.package for p in patches for e in p.edits}
    return [PackageRoot(p.name, p.path, p.distribution, p.version if own else None, required=p.name == "vllm")
            for p in image.packages.values() if p.name in touched]


def wanted_files(patches: list[Patch]) -> list[tuple[str, str]]:
    targets: list[Edit | Probe] = [e for p in patches for e in p.edits]
    targets += [p.upstreamed for p in patches if p.upstreamed]
    return [(t.package, c) for t in targets for c in t.candidates]


class ImageIdIsNoBase(PatchkitError):
    """`--base` gave an engine's image id, which names no registry image, for a daemonless build (exit 2):
    the `spec` as given."""

    def __init__(self, spec: str):
        self.spec = spec
        super().__init__(f"--base {spec}: an engine's image id names no registry image and the engine has no such "
                         "image (a --load build looks ids up there): pass the name or id of an image in the engine "
                         "with --load, a registry reference, or an OCI layout directory")


class NotADirectoryInBase(PatchkitError):
    """A parent directory of a patched file is a `kind` ("file", "symlink", ...) in the base (`where`, the
    base's description) at `path`, so the layer cannot give it the base's directory metadata (exit 2)."""

    def __init__(self, where: str, path: str, kind: str):
        self.where, self.path, self.kind = where, path, kind
        super().__init__(f"{where}: {path} is a {kind}, not a directory")


class BaseUnusable(PatchkitError):
    """The base image could not be opened (exit 2): the `spec` as given and the `cause`, the error opening
    it raised (unreachable registry, missing layout, wrong platform, ...)."""

    def __init__(self, spec: str, cause: PatchkitError):
        self.spec, self.cause = spec, cause
        super().__init__(f"cannot use base image {spec}: {cause}\n  Pass a reachable base with --base: an OCI layout "
                         "directory (DIR or DIR:NAME) or a registry reference (REGISTRY/REPO@sha256:...)")


def prepare(image: Image, patchset: PatchSet, *, base: str | None = None, cache: Path | None = None,
            progress: Progress | None = None, keep: bool = True) -> Prepared[BaseImage, ImageLayersSource]:
    """Plan against a registry or OCI-layout base, reading only the layers that hold the files."""
    progress = progress or Quiet()
    spec = base or image.base
    platform = Platform.parse(image.platform)
    if is_image_id(spec) and not Path(spec).exists():
        raise ImageIdIsNoBase(spec)
    try:
        base_image = open_base(spec, platform, cache=cache or default_cache_root() / "oci", progress=progress,
                               keep=keep)
    except PatchkitError as exc:
        raise BaseUnusable(spec, exc) from None
    own = is_own_base(image, base, {base_image.digest, base_image.manifest_digest})
    patches = patchset.series(list(image.series))
    source = ImageLayersSource(base_image, package_roots(image, patches, own))
    return plan_on(image, patchset, base_image, source, own=own, spec=spec)


def plan_on(image: Image, patchset: PatchSet, base_image: BaseT, source: FilesT, *, own: bool, spec: str,
            dirs: bool = True) -> Prepared[BaseT, FilesT]:
    """Plan the image's series on `source` (the base's files) and collect the new layer's contents."""
    patches = patchset.series(list(image.series))
    extras = extra_layer(image)  # first: a wrong pin fails before the base is read
    source.prefetch(wanted_files(patches))
    versions = source.versions()
    # The release whose files each package holds: a declared layout for the image's own base, else a
    # final release's public version when a device suffix (+cu130) hides it (sources.installed_version).
    engine_versions = {**release_layouts(versions), **(image.engine_versions() if own else {})}
    result = plan(patches, source, versions=engine_versions or None)
    carried = carry(result, f"image {image.name}", spec)
    skipped = [(r.patch, str(r.state), r.detail) for r in carried.left_out]
    files, dir_entries, stale = layer_contents(source, result.changes, dirs=dirs)
    return Prepared(image, base_image, source, result, versions, result.versions, carried.patches, skipped, files,
                    dir_entries, stale, extras)


def layer_contents(source: ImageFiles, changes: list[FileChange], *, dirs: bool = True):
    """(patched files, their parent directories with the base's metadata, stale bytecode paths)."""
    files: list[PatchedFile] = []
    stale: set[str] = set()
    dir_paths: set[str] = set()
    for change in changes:
        path = source.image_path(change.package, change.path)
        meta = source.meta(path)
        mode, uid, gid = (meta.mode, meta.uid, meta.gid) if meta else (0o644, 0, 0)
        files.append(PatchedFile(path, change.new, mode, uid, gid, change))
        dir_paths.update("/" + a for a in _ancestors(normalize(path)))
        stale.update(source.bytecode(change.package, change.path))
    for pyc in stale:
        dir_paths.update("/" + a for a in _ancestors(normalize(pyc)))
    entries = []
    for d in sorted(dir_paths) if dirs else ():
        meta = source.meta(d)
        if meta is not None and meta.kind == "dir":
            entries.append(Entry(d, "dir", mode=meta.mode, uid=meta.uid, gid=meta.gid))
        elif meta is not None:
            raise NotADirectoryInBase(source.description, d, meta.kind)
    return files, entries, sorted(stale)


def _ancestors(name: str) -> list[str]:
    out = []
    while "/" in name:
        name = name.rsplit("/", 1)[0]
        out.append(name)
    return out
