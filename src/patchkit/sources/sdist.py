"""A source distribution (.tar.gz): the packages under its single top-level directory, versioned by the
`PKG-INFO` there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from patchkit.sources.archives import ArchiveSource, TarGzArchive
from patchkit.sources.base import PACKAGES, MetadataDisagrees, NoSuchSource, NotADistribution
from patchkit.sources.cache import FileCache
from patchkit.sources.metadata import core_metadata, same_distribution, same_version
from patchkit.untrusted import open_regular

# Files beside the packages that say which companion releases a release pins (vLLM: its FlashInfer).
PIN_FILES = ("requirements/cuda.txt",)


def _in_package_dirs(name: str) -> bool:
    """Members worth holding after a pass: metadata, pin files, everything under `<top>/[src/]<package>/`."""
    parts = name.split("/")
    if parts[1:] == ["PKG-INFO"] or "/".join(parts[1:]) in PIN_FILES:
        return True
    if len(parts) > 2 and parts[1] == "src":
        parts = parts[1:]
    return len(parts) > 2 and parts[1] in PACKAGES


class SdistSource(ArchiveSource):
    def __init__(
        self,
        path: str | Path,
        *,
        dist: str | None = None,
        version: str | None = None,
        origin: str | None = None,
        files: FileCache | None = None,
        key: str | None = None,
        discard: Callable[[], None] | None = None,
    ):
        """`dist`/`version`, when given, must match what PKG-INFO says; `files`/`key` cache members on disk."""
        path = Path(path)
        if not path.is_file():
            if path.exists():  # a FIFO, device or directory: refused as what it is, never opened blocking
                open_regular(path, "archive", f"sdist {path}").close()
            raise NoSuchSource("sdist", path, "does not exist")
        archive = TarGzArchive(path, keep=_in_package_dirs, files=files, key=key, discard=discard)
        tops = sorted(
            {
                name.split("/")[0]
                for name, kind in archive.listing().items()
                if name.count("/") == 1 and name.endswith("/PKG-INFO") and kind == "file"
            }
        )
        if len(tops) != 1:
            raise NotADistribution(path, "not an sdist", "one top-level directory with a PKG-INFO",
                                   str(tops or "none"))
        super().__init__(archive, prefix=f"{tops[0]}/")
        pkg_info = self._member(f"{tops[0]}/PKG-INFO")
        assert pkg_info is not None  # listed as a file just above
        name, stated = core_metadata(pkg_info)
        if stated is None:
            raise NotADistribution(path, f"{tops[0]}/PKG-INFO states no Version", "a Version field", "none")
        if dist is not None and not same_distribution(name, dist):
            raise MetadataDisagrees(path, "PKG-INFO", "name", repr(name), repr(dist), "the request")
        if version is not None and not same_version(stated, version):
            raise MetadataDisagrees(path, "PKG-INFO", "version", stated, version, "the request")
        self._top = tops[0]
        self._versions = dict.fromkeys(self._roots, stated)
        packages = ", ".join(f"{package} {stated}" for package in self._roots)
        self.description = f"{packages} sdist ({origin or path})"

    def versions(self) -> dict[str, str]:
        return dict(self._versions)

    def distribution_file(self, path: str) -> bytes | None:
        """A file of the sdist outside its packages (e.g. requirements/cuda.txt); None when absent."""
        return self._member(f"{self._top}/{path}")
