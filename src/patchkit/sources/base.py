"""What every source shares: the protocol family, the known packages, and the checks on what callers ask for.

Two protocols, one family, declared here only:
- `Source`: the text of the packages patchkit patches, what every planner input satisfies (a directory,
  an sdist, a wheel, a git ref, several of them combined, a base image's files);
- `ImageFiles`: a base image's files as an image build reads them, a `Source` that also knows each
  file's image path and metadata and the bytecode that could run instead of a module. Both image routes
  satisfy it: `oci.source.ImageLayersSource` (a registry or layout base's layers) and
  `images.engine_files.ContainerSource` (the local engine's copy).

Every method a caller may need is declared, so callers call methods and never ask a source what it has
(`getattr`): a source without batching, files beside its packages or a listing inherits `SourceDefaults`.

Paths are checked here, once, before any source touches its storage: a patch file is input like any
other, and a path that climbs out of the package root must stop the run, not read a neighbour's file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from patchkit.errors import PatchkitError

DISTRIBUTIONS = {"vllm": "vllm", "flashinfer": "flashinfer-python"}
"""Import package -> the distribution that ships it on the package index."""

PACKAGES = tuple(DISTRIBUTIONS)


class Source(Protocol):
    """Read-only view of the packages patchkit patches."""

    description: str

    def versions(self) -> dict[str, str]:
        """Import package -> version, as the source itself states it."""
        ...

    def read(self, package: str, path: str) -> bytes | None:
        """Bytes of `path` (POSIX, relative to the package root); None when the file or package is absent."""
        ...

    def read_many(self, package: str, paths: list[str]) -> dict[str, bytes | None]:
        """`read` of several files of one package; a source that pays per pass over its storage (an sdist,
        an image's layers, an engine) reads them in one."""
        ...

    def distribution_file(self, path: str) -> bytes | None:
        """A file of the distribution beside its packages (vLLM's `requirements/cuda.txt`); None when absent,
        or when the source holds no such files (a wheel, an installed site-packages, an image)."""
        ...

    def package_files(self, package: str) -> list[str] | None:
        """Every file of `package`, relative to its root (what rebase searches for a moved file); None when
        the package is absent or the source cannot list it."""
        ...


class SourceDefaults:
    """The answers of a source that reads one file at a time, holds nothing beside its packages and cannot
    list them; a source inherits these and overrides what it does better."""

    description: str

    def versions(self) -> dict[str, str]:
        raise NotImplementedError

    def read(self, package: str, path: str) -> bytes | None:
        raise NotImplementedError

    def read_many(self, package: str, paths: list[str]) -> dict[str, bytes | None]:
        return {path: self.read(package, path) for path in paths}

    def distribution_file(self, path: str) -> bytes | None:
        return None

    def package_files(self, package: str) -> list[str] | None:
        return None


class FileMeta(Protocol):
    """What a build keeps of a base's file: its kind ("file", "dir", ...), mode and owner
    (`oci.layer.Member` is one)."""

    @property
    def kind(self) -> str: ...

    @property
    def mode(self) -> int: ...

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...


class ImageFiles(Source, Protocol):
    """A base image's files as an image build reads them, wherever the base is."""

    def prefetch(self, files: Iterable[tuple[str, str]]) -> None:
        """Announce the (package, path) files about to be read, so the storage is passed over once
        (`read_many` of one package is the same announcement, then the reads)."""
        ...

    def image_path(self, package: str, path: str) -> str:
        """The absolute image path of a package file ('/usr/.../vllm/models/x.py')."""
        ...

    def meta(self, image_path: str) -> FileMeta | None:
        """The visible entry at an image path, None when the base has none."""
        ...

    def bytecode(self, package: str, path: str) -> list[str]:
        """Image paths of the bytecode that could run instead of module `path` once it is patched: each is
        whited out (daemonless) or overwritten by a stub (the engine routes)."""
        ...


def check_package(package: str) -> None:
    """A package name outside DISTRIBUTIONS is a typo in a patch, not an absent package."""
    if package not in DISTRIBUTIONS:
        raise PatchkitError(f"unknown package {package!r}: patchkit knows {', '.join(PACKAGES)}")


def relative_path(path: str) -> str:
    """`path` normalised ("a/./b" -> "a/b"); refuses anything that could leave the package root."""
    if not isinstance(path, str) or not path.strip():
        raise PatchkitError(f"empty path {path!r}: give a file path relative to the package root")
    if path.startswith("/"):
        raise PatchkitError(f"absolute path {path!r}: give a file path relative to the package root")
    if "\\" in path or "\0" in path:
        raise PatchkitError(f"path {path!r} is not a POSIX path (backslash or NUL character)")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PatchkitError(f"path {path!r} climbs out of the package root ('..')")
    if not parts:
        raise PatchkitError(f"path {path!r} names the package root itself, not a file")
    return "/".join(parts)


def find_package_root(package: str, is_file: Callable[[str], bool], base: str = "") -> str | None:
    """The directory (`base` + `pkg` or `base` + `src/pkg`) holding `pkg/__init__.py`; None if neither does.

    Two candidates both holding the package would make every read a guess, so that is an error.
    """
    found = [root for root in (f"{base}{package}", f"{base}src/{package}") if is_file(f"{root}/__init__.py")]
    if len(found) > 1:
        raise PatchkitError(f"package {package!r} found twice ({' and '.join(found)}): point at one of them")
    return found[0] if found else None
