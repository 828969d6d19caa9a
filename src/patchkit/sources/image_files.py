"""What every source over a base image's file system shares, the `patchkit.sources.base.ImageFiles`
protocol's common part: where each import package lives in the image (`PackageRoot`), package-relative
paths to image paths, a batch read as an announcement then the reads, the versions worked out once
(`PackagePaths`), and the bytecode an interpreter would load instead of a module (`bytecode_names`).
Its two sources: sources.image_layers (a registry or layout base's layers) and sources.container_files
(the local engine's copy).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from patchkit.errors import PatchkitError
from patchkit.oci.layer import normalize
from patchkit.sources.base import InvalidSourcePath, SourceDefaults


@dataclass(frozen=True)
class PackageRoot:
    """Where an import package lives in the image, and the version the image file declares for it
    (None: take it from the image's dist-info METADATA, which must then exist)."""

    name: str
    root: str
    distribution: str
    declared: str | None = None
    required: bool = True  # False: a base without this package simply has no version for it


def bytecode_names(py_path: str) -> list[str]:
    """The pyc names the image's interpreter would load for a module, from `pythonX.Y` in its path: the
    only bytecode that can run instead of the source (a pyc of another tag is another interpreter's, and a
    sourceless `<stem>.pyc` beside the source is shadowed by it: FileFinder tries the source loader first).
    None when the path names no interpreter."""
    m = re.search(r"/python(\d)\.(\d+)/", py_path)
    if not m:
        return []
    folder, stem = posixpath.split(py_path[:-3])
    tag = f"cpython-{m.group(1)}{m.group(2)}"
    return [f"{folder}/__pycache__/{stem}.{tag}{opt}.pyc" for opt in ("", ".opt-1", ".opt-2")]


class PackagePaths(SourceDefaults):
    """What every source over an image's file system shares (the `ImageFiles` protocol's common part):
    package-relative paths to image paths, batches read as an announcement then the reads, and the
    versions, worked out once (`_version(root)`, `prefetch`, `read`, `meta` by the subclass)."""

    packages: dict[str, PackageRoot]
    description: str
    _versions: dict[str, str] | None = None

    def prefetch(self, files: Iterable[tuple[str, str]]) -> None:
        raise NotImplementedError

    def read_many(self, package: str, paths: list[str]) -> dict[str, bytes | None]:
        self.prefetch((package, path) for path in paths)
        return {path: self.read(package, path) for path in paths}

    def versions(self) -> dict[str, str]:
        if self._versions is None:
            self._versions = {p.name: v for p in self.packages.values() if (v := self._version(p))}
        return dict(self._versions)

    def image_path(self, package: str, path: str) -> str:
        """The absolute image path of a package file ('/usr/.../vllm/models/x.py')."""
        name = self._path(package, path)
        if name is None:
            raise PatchkitError(f"package {package!r} has no path in this image definition, yet a change was planned "
                                "in it (a patchkit bug: please report it)")
        return "/" + name

    def bytecode(self, package: str, path: str) -> list[str]:
        """The names the image's interpreter would load for module `path` (`bytecode_names`)."""
        return bytecode_names(self.image_path(package, path)) if path.endswith(".py") else []

    def _path(self, package: str, path: str) -> str | None:
        pkg = self.packages.get(package)
        if pkg is None:
            return None
        if path.startswith("/") or ".." in path.split("/"):
            raise InvalidSourcePath(path, "absolute" if path.startswith("/") else "climbs-out")
        return f"{normalize(pkg.root)}/{normalize(path)}"

    def _version(self, pkg: PackageRoot) -> str | None:
        raise NotImplementedError
