"""What every source shares: the protocol, the known packages, and the checks on what callers ask for.

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


def read_many(source: Source, package: str, paths: Iterable[str]) -> dict[str, bytes | None]:
    """Read several files at once; sources that pay per pass over an archive (sdists) batch them."""
    paths = list(paths)
    batch = getattr(source, "read_many", None)
    if batch is not None:
        return batch(package, paths)
    return {path: source.read(package, path) for path in paths}
