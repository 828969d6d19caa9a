"""A wheel (.whl): the packages at its top level, versioned by its single `*.dist-info/METADATA`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from patchkit.sources.archives import ArchiveSource, ZipArchive
from patchkit.sources.base import MetadataDisagrees, NoSuchSource, NotADistribution
from patchkit.sources.metadata import core_metadata, same_distribution, same_version
from patchkit.untrusted import open_regular


class WheelSource(ArchiveSource):
    def __init__(self, path: str | Path, *, origin: str | None = None, discard: Callable[[], None] | None = None):
        """The file name, the METADATA and (for index downloads) the asked-for version must all agree."""
        path = Path(path)
        if not path.is_file():
            if path.exists():  # a FIFO, device or directory: refused as what it is, never opened blocking
                open_regular(path, "archive", f"wheel {path}").close()
            raise NoSuchSource("wheel", path, "does not exist")
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename as error:
            raise NotADistribution(path, "not a wheel file name", "NAME-VERSION(-BUILD)-PY-ABI-PLATFORM.whl",
                                   str(error)) from error
        archive = ZipArchive(path, discard=discard)
        dist_infos = sorted({n.split("/")[0] for n in archive.listing() if n.split("/")[0].endswith(".dist-info")})
        if len(dist_infos) != 1:
            raise NotADistribution(path, "not a wheel", "one *.dist-info directory", str(dist_infos or "none"))
        super().__init__(archive, prefix="")
        metadata = self._member(f"{dist_infos[0]}/METADATA")
        if metadata is None:
            raise NotADistribution(path, "no METADATA", f"{dist_infos[0]}/METADATA", "none")
        stated_name, stated = core_metadata(metadata)
        if not same_distribution(stated_name, name) or stated is None or not same_version(stated, str(version)):
            raise MetadataDisagrees(path, "METADATA", "name and version", f"{stated_name} {stated}",
                                    f"{name} {version}", "the file name")
        self._versions = dict.fromkeys(self._roots, stated)
        packages = ", ".join(f"{package} {stated}" for package in self._roots)
        self.description = f"{packages} wheel ({origin or path})"

    def versions(self) -> dict[str, str]:
        return dict(self._versions)
