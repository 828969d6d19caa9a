"""A source that is a directory on disk: a git checkout, a package directory, or a site-packages.

Package roots are found (`<pkg>/__init__.py`), never assumed, and resolved, so `package_root()` gives
the writer the real directory even when site-packages links elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from packaging.utils import canonicalize_name

from patchkit.errors import PatchkitError
from patchkit.sources.base import (
    DISTRIBUTIONS,
    PACKAGES,
    NoPackages,
    NoSuchSource,
    NotADistribution,
    NotARegularMember,
    SourceDefaults,
    check_package,
    find_package_root,
    relative_path,
)
from patchkit.sources.installed_version import VERSION_MODULES, held_version
from patchkit.sources.metadata import (
    core_metadata,
    same_distribution,
    static_project_version,
    version_py,
)
from patchkit.untrusted import UnreadableFile


class OutsidePackageRoot(PatchkitError):
    """A package file that resolves (through a link) outside its package root (exit 2): the `member` asked
    for, the path it is `resolved` to and the package `root`."""

    def __init__(self, member: str, resolved: Path, root: Path):
        self.member, self.resolved, self.root = member, resolved, root
        super().__init__(f"{member} resolves to {resolved}, outside the package root {root}")


class DirectorySource(SourceDefaults):
    def __init__(self, root: str | os.PathLike[str]):
        given = Path(root).expanduser()
        if not given.is_dir():
            what = "is not a directory" if given.exists() else "does not exist"
            raise NoSuchSource("source directory", given, what)
        self.root = given.resolve()
        self._roots = {package: found for package in PACKAGES if (found := self._find(package)) is not None}
        if not self._roots:
            raise NoPackages(str(self.root), [f"{package}/__init__.py" for package in PACKAGES],
                             "point at a checkout, a package directory or a site-packages")
        self._versions = {package: self._detect_version(package, found) for package, found in self._roots.items()}
        packages = ", ".join(f"{package} {version}" for package, version in self._versions.items())
        self.description = f"{packages} directory {self.root}"

    def versions(self) -> dict[str, str]:
        return dict(self._versions)

    def package_root(self, package: str) -> Path:
        """The real directory of `package`, for writing."""
        check_package(package)
        if package not in self._roots:
            raise PatchkitError(f"package {package!r} is not in {self.root} (a patchkit bug: please report it; "
                                "its callers ask only for the packages it holds)")
        return self._roots[package]

    def read(self, package: str, path: str) -> bytes | None:
        check_package(package)
        relative = relative_path(path)
        root = self._roots.get(package)
        if root is None:
            return None
        try:
            real = (root / relative).resolve()
        except (OSError, RuntimeError) as error:  # a symlink loop
            raise NotARegularMember(f"{package}/{relative}", f"a link that does not resolve ({error})",
                                    str(root)) from error
        if not real.is_relative_to(root):
            raise OutsidePackageRoot(f"{package}/{relative}", real, root)
        if not real.exists():
            return None
        if not real.is_file():
            raise NotARegularMember(f"{package}/{relative}", "not a regular file", f"{root} ({real})")
        try:
            return real.read_bytes()
        except OSError as error:
            raise UnreadableFile(str(real), error.strerror or str(error), error.errno) from error

    def distribution_file(self, path: str) -> bytes | None:
        """A file of a checkout beside its packages (e.g. requirements/cuda.txt); None when absent."""
        real = (self.root / relative_path(path)).resolve()
        if not real.is_relative_to(self.root) or not real.is_file():
            return None
        return real.read_bytes()

    def package_files(self, package: str) -> list[str] | None:
        """Every file under the package's directory, bytecode folders left out."""
        root = self._roots.get(package)
        if root is None:
            return None
        out = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            out += [(Path(dirpath) / f).relative_to(root).as_posix() for f in filenames]
        return out

    def _find(self, package: str) -> Path | None:
        if self.root.name == package and (self.root / "__init__.py").is_file():
            return self.root
        found = find_package_root(package, lambda relative: (self.root / relative).is_file())
        return (self.root / found).resolve() if found is not None else None

    @staticmethod
    def _detect_version(package: str, root: Path) -> str:
        """dist-info METADATA, else `_version.py`, else PKG-INFO, else a static pyproject/setup.cfg version."""
        dist = DISTRIBUTIONS[package]
        dist_infos = [
            found
            for found in root.parent.glob("*.dist-info")
            if canonicalize_name(found.name.removesuffix(".dist-info").split("-")[0]) == canonicalize_name(dist)
        ]
        if len(dist_infos) > 1:
            names = ", ".join(sorted(found.name for found in dist_infos))
            raise NotADistribution(root.parent, f"several installed versions of {dist}",
                                   "one *.dist-info, the stale ones removed", names)
        version_file = root / VERSION_MODULES.get(package, "_version.py")
        if dist_infos:
            metadata = dist_infos[0] / "METADATA"
            if not metadata.is_file():
                raise NotADistribution(dist_infos[0], "no METADATA file, the installation is broken",
                                       "a METADATA file", "none")
            return held_version(str(root), dist, metadata=metadata.read_bytes(), metadata_path=str(metadata),
                                module_name=version_file.name, module=_maybe_read(version_file))
        if version_file.is_file() and (version := version_py(version_file.read_bytes())):
            return version
        # A src layout keeps the project files one level further up.
        for project_dir in [root.parent] + ([root.parent.parent] if root.parent.name == "src" else []):
            pkg_info = project_dir / "PKG-INFO"
            if pkg_info.is_file():
                name, version = core_metadata(pkg_info.read_bytes())
                if version and same_distribution(name, dist):
                    return version
            version = static_project_version(
                _maybe_read(project_dir / "pyproject.toml"), _maybe_read(project_dir / "setup.cfg"), dist
            )
            if version:
                return version
        return "unknown"


def _maybe_read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None
