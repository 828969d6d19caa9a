"""A release's own binary wheel for one platform, from the package index, downloaded once.

The sources package picks the most portable archive of a version (the sdist) for reading Python files;
a patched wheel needs the one binary wheel pip would install on the target machine instead, so the
choice is by platform here, and the download and cache are the sources package's own (sha256 checked
against the index while streaming, entered into the cache by rename). Each platform gets its own cache
folder because the cache records one archive per distribution version.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from patchkit.cache_root import default_cache_root
from patchkit.errors import PatchkitError
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.index import IndexFile, project_files
from patchkit.sources.pins import pinned_in_metadata
from patchkit.sources.release import fetch_archive
from patchkit.sources.verified_wheel import open_wheel
from patchkit.wheels import ARCHES


class UnknownPlatform(PatchkitError):
    """`arch` is not a platform patchkit builds wheels for (wheels.ARCHES) (exit 2)."""

    def __init__(self, arch: str):
        super().__init__(f"unknown platform {arch!r}: patchkit builds wheels for {', '.join(ARCHES)}")
        self.arch = arch


class NoReleaseWheel(PatchkitError):
    """The index's project `page` lists `found` (0, or more than one) manylinux `arch` wheels of `dist`
    `version` where one is wanted; `listed` are the file names of that version's wheels (exit 2)."""

    def __init__(self, page: str, dist: str, version: str, arch: str, found: int, listed: list[str]):
        what = "no" if not found else "more than one"
        super().__init__(f"{page} lists {what} manylinux {arch} wheel of {dist} {version} "
                         f"(its wheels: {', '.join(listed) or 'none'})")
        self.page, self.dist, self.version, self.arch, self.found, self.listed = page, dist, version, arch, found, listed


class UnverifiableWheel(PatchkitError):
    """The index gives no sha256 for the wheel at `url`: it is not downloaded (exit 2)."""

    def __init__(self, url: str):
        super().__init__(f"the index gives no sha256 for {url}: refusing a wheel that cannot be verified")
        self.url = url


def release_wheel(version: str, arch: str, *, dist: str = "vllm", cache_root: Path | None = None,
                  progress: bool = True) -> Path:
    """The cached manylinux `arch` wheel of `dist` `version`: no network when it was fetched before."""
    if arch not in ARCHES:
        raise UnknownPlatform(arch)
    cache = ArchiveCache((cache_root or default_cache_root()) / "wheels" / arch)
    # rehashed on every use (0.2 s for vLLM's wheel): the copied members' RECORD hashes come from the
    # release's RECORD, which is only as good as the bytes on disk
    cached = fetch_archive(cache, dist, version, lambda: choose_wheel(dist, version, arch), progress=progress,
                           rehash=True)
    return cached.path


def choose_wheel(dist: str, version: str, arch: str) -> IndexFile:
    """The one manylinux wheel of that version and architecture; refuses yanked files and missing hashes."""
    page, files = project_files(dist)
    wanted = Version(version)
    of_version = [f for f in files if f.version == wanted and f.kind == "wheel" and not f.yanked]
    matching = [f for f in of_version if any(p.startswith("manylinux") and p.endswith(f"_{arch}") for p in f.platforms)]
    if len(matching) != 1:
        raise NoReleaseWheel(page, dist, version, arch, len(matching), sorted(f.filename for f in of_version))
    chosen = matching[0]
    if chosen.sha256 is None:
        raise UnverifiableWheel(chosen.url)
    return chosen


def pinned_companion(release: Path) -> str | None:
    """The exact flashinfer-python the release wheel's METADATA requires (its vLLM's own pin), read from the
    wheel verified whole; None when it requires none exactly."""
    with open_wheel(release) as wheel:
        return pinned_in_metadata(wheel.read(f"{wheel.dist_info}/METADATA", "metadata"))
