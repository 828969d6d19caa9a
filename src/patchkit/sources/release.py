"""A released version from the package index, read from its archive in the cache (downloaded once)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from patchkit.errors import PatchkitError
from patchkit.localfiles import file_sha256
from patchkit.sources.base import DISTRIBUTIONS, MetadataDisagrees, UnknownPackage
from patchkit.sources.cache import ArchiveCache, CachedArchive
from patchkit.sources.index import IndexFile, UnverifiableArchive, choose_archive, download
from patchkit.sources.metadata import same_distribution, same_version
from patchkit.sources.sdist import SdistSource
from patchkit.sources.wheel import WheelSource


class ArchiveVanished(PatchkitError):
    """The `archive` a moment ago verified into the cache (its file name, or "DIST VERSION's archive") is
    no longer in the cache's downloads folder `cache` (exit 2): another run removed it meanwhile."""

    def __init__(self, archive: str, cache: Path):
        self.archive, self.cache = archive, cache
        super().__init__(f"{archive} vanished from the cache {cache} right after it was verified (removed by "
                         "another run meanwhile?): run again")


def fetch_archive(cache: ArchiveCache, dist: str, version: str, choose: Callable[[], IndexFile], *,
                  progress: bool = True, rehash: bool = False) -> CachedArchive:
    """The archive of `dist` `version` in the cache: the one recorded there (rehashed first when `rehash`:
    the caller copies its bytes without checking each), else one on disk the index vouches for, else a
    download checked against the index's sha256. `choose` asks the index which file, only when needed."""
    cached = cache.lookup(dist, version)
    if cached is not None and rehash and file_sha256(cached.path) != cached.sha256:  # damaged since fetched
        cache.forget(dist, version, cached.path)
        cached = None
    if cached is not None:
        return cached
    file = choose()
    if file.sha256 is None:  # every chooser refuses one already; nothing unverified is cached either way
        raise UnverifiableArchive(file.url)
    cached = cache.adopt(dist, version, file.filename, file.url, file.sha256)  # on disk, as the index says
    if cached is None:
        with cache.new_archive(dist, version, file.filename, file.url, file.sha256) as out:
            download(file, out, progress=progress)
        cached = cache.lookup(dist, version)
    if cached is None:
        raise ArchiveVanished(file.filename, cache.downloads)
    return cached


def open_release(dist: str, version: str, *, cache: ArchiveCache, progress: bool = True) -> SdistSource | WheelSource:
    """The cached archive when it was downloaded and verified before (no network), else a download."""
    package = next((p for p, d in DISTRIBUTIONS.items() if same_distribution(d, dist)), None)
    if package is None:
        raise UnknownPackage(dist, DISTRIBUTIONS.values(), what="distribution")
    cached = fetch_archive(cache, dist, version, lambda: choose_archive(dist, version), progress=progress)
    origin = f"index, sha256 {cached.sha256[:12]}"
    discard = functools.partial(cache.forget, dist, version, cached.path)  # if found corrupt
    if cached.path.name.endswith(".whl"):
        source: SdistSource | WheelSource = WheelSource(
            cached.path, origin=f"{cached.path.name}, {origin}", discard=discard
        )
    else:
        key = f"{canonicalize_name(dist)}-{Version(version)}-{cached.sha256}"  # bound to the verified archive
        source = SdistSource(
            cached.path, dist=dist, version=version, origin=origin, files=cache.files, key=key, discard=discard
        )
    found = source.versions().get(package)
    if found is None or not same_version(found, version):
        raise MetadataDisagrees(cached.path, "its metadata", package, found, version, "the request")
    return source
