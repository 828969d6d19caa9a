"""What every source shares: the protocol family, the known packages, and the checks on what callers ask for.

Two protocols, one family, declared here only:
- `Source`: the text of the packages patchkit patches, what every planner input satisfies (a directory,
  an sdist, a wheel, a git ref, several of them combined, a base image's files);
- `ImageFiles`: a base image's files as an image build reads them, a `Source` that also knows each
  file's image path and metadata and the bytecode that could run instead of a module. Both image routes
  satisfy it: `sources.image_layers.ImageLayersSource` (a registry or layout base's layers) and
  `sources.container_files.ContainerSource` (the local engine's copy), over `sources.image_files`.

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


class UnknownPackage(PatchkitError):
    """A name patchkit does not know, a typo rather than an absent package (exit 2): `name` as given, `what`
    it was meant to name ("package" or "distribution") and the `known` ones."""

    def __init__(self, name: str, known: Iterable[str], what: str = "package"):
        self.name, self.known, self.what = name, tuple(known), what
        super().__init__(f"unknown {what} {name!r}: patchkit knows {', '.join(self.known)}")


_PATH_PROBLEMS = {
    "empty": "empty path {path!r}: give a file path relative to the package root",
    "absolute": "absolute path {path!r}: give a file path relative to the package root",
    "not-posix": "path {path!r} is not a POSIX path (backslash or NUL character)",
    "climbs-out": "path {path!r} climbs out of the package root ('..')",
    "package-root": "path {path!r} names the package root itself, not a file",
}


class InvalidSourcePath(PatchkitError):
    """A package-relative path that could leave the package root or names no file (exit 2): the `path` as
    given and the `problem`: "empty", "absolute", "not-posix" (a backslash or NUL), "climbs-out" ('..') or
    "package-root" (the root itself)."""

    def __init__(self, path: object, problem: str):
        self.path, self.problem = path, problem
        super().__init__(_PATH_PROBLEMS[problem].format(path=path))


class PackageFoundTwice(PatchkitError):
    """Two candidate roots both hold the package, so every read would be a guess (exit 2): the `package`
    and the roots `found`."""

    def __init__(self, package: str, found: Iterable[str]):
        self.package, self.found = package, tuple(found)
        super().__init__(f"package {package!r} found twice ({' and '.join(self.found)}): point at one of them")


class NotARegularMember(PatchkitError):
    """A package file that is a link, a directory or another non-file (exit 2): the `member` asked for, what
    it was `found` to be ("a link", "a directory", "a symbolic link", ...), `where` (the archive, tree, ref,
    image layer or engine's image) and a symbolic link's `target` where the source names one (else None)."""

    def __init__(self, member: str, found: str, where: str, target: str | None = None):
        self.member, self.found, self.where, self.target = member, found, where, target
        to = f" (to {target!r})" if target is not None else ""
        super().__init__(f"{member} is {found}{to} in {where}: patchkit reads regular files only")


class NoPackages(PatchkitError):
    """A source that holds none of the packages patchkit patches (exit 2): `where` it looked, what it
    `looked_for`, and a `hint` at what to point at instead ("" when none)."""

    def __init__(self, where: str, looked_for: Iterable[str], hint: str = ""):
        self.where, self.looked_for, self.hint = where, tuple(looked_for), hint
        super().__init__(f"no package found in {where}: looked for {', '.join(self.looked_for)}"
                         + (f" ({hint})" if hint else ""))


class NoSuchSource(PatchkitError):
    """A source path that is not there or not what it was given as (exit 2): the `kind` of source ("sdist",
    "wheel", "source directory", "git repository"), its `path` and the `problem` ("does not exist", "is
    not a directory", "is not a git repository")."""

    def __init__(self, kind: str, path: object, problem: str):
        self.kind, self.path, self.problem = kind, path, problem
        super().__init__(f"{kind} {path} {problem}")


class NotADistribution(PatchkitError):
    """An archive or install whose layout is not a distribution's (exit 2): its `path`, the `problem` ("not
    an sdist", "not a wheel", "no METADATA", "several installed versions of vllm"), what was `expected`
    and what was `found`."""

    def __init__(self, path: object, problem: str, expected: str, found: str):
        self.path, self.problem, self.expected, self.found = path, problem, expected, found
        super().__init__(f"{path}: {problem} (expected {expected}, found {found})")


class MetadataDisagrees(PatchkitError):
    """A distribution's core metadata contradicts what names it (exit 2): the archive `path`, the metadata
    `file` (PKG-INFO, METADATA), the `field` (name, version), what it `stated`, what was `expected` and
    who `expected_by` says so ("the request", "the file name")."""

    def __init__(self, path: object, file: str, field: str, stated: object, expected: object, expected_by: str):
        self.path, self.file, self.field = path, file, field
        self.stated, self.expected, self.expected_by = stated, expected, expected_by
        super().__init__(f"{path}: {file} says {field} {stated}, but {expected_by} says {expected}")


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
        raise UnknownPackage(package, PACKAGES)


def relative_path(path: str) -> str:
    """`path` normalised ("a/./b" -> "a/b"); refuses anything that could leave the package root."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidSourcePath(path, "empty")
    if path.startswith("/"):
        raise InvalidSourcePath(path, "absolute")
    if "\\" in path or "\0" in path:
        raise InvalidSourcePath(path, "not-posix")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidSourcePath(path, "climbs-out")
    if not parts:
        raise InvalidSourcePath(path, "package-root")
    return "/".join(parts)


def find_package_root(package: str, is_file: Callable[[str], bool], base: str = "") -> str | None:
    """The directory (`base` + `pkg` or `base` + `src/pkg`) holding `pkg/__init__.py`; None if neither does.

    Two candidates both holding the package would make every read a guess, so that is an error.
    """
    found = [root for root in (f"{base}{package}", f"{base}src/{package}") if is_file(f"{root}/__init__.py")]
    if len(found) > 1:
        raise PackageFoundTwice(package, found)
    return found[0] if found else None
