"""Reading single members out of an sdist without extracting it, and the source over an archive.

A .tar.gz cannot be seeked: reaching any member means decompressing everything before it. So a read
that misses the caches costs one streaming pass over the whole archive (`sources.tarscan`: ISA-L
inflate and a header scan, under half a second of CPU for vLLM's 47 MB sdist), and that pass keeps in
memory the files under the package directories (`keep`, ~50 MB for vLLM, at most the `member` limit in
all: past it the rest are left for a later pass): after it, a read in this process seldom decompresses
again. Members actually read also go to the on-disk FileCache together with the member list, so a warm
run decompresses nothing at all. The pass reads the gzip stream to its very end, which checks the CRC
and length of the whole archive.

Member names are compared as an extractor would write them: `vllm/./envs.py`, `//vllm/envs.py` and
`vllm/envs.py` are one file, so aliases count as stored twice; a name with `..`, a NUL or bytes that are
not UTF-8 refuses the archive, and so does a member under a name the archive stores as a link or a file
(a package directory that is a symlink: extracted, its members would be written elsewhere).

A wheel is read through its verified members instead (sources.wheel over sources.verified_wheel): a zip
seeks, and every member is held against its RECORD row before any is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from patchkit.errors import PatchkitError
from patchkit.inflate import INFLATE_ERRORS, open_gzip
from patchkit.sources.base import (
    PACKAGES,
    NoPackages,
    NotARegularMember,
    SourceDefaults,
    check_package,
    find_package_root,
    relative_path,
)
from patchkit.sources.cache import FileCache
from patchkit.sources.tarscan import TarError, scan
from patchkit.untrusted import InputTooLarge, limit_of, open_regular

_KINDS = {"dir": "a directory", "link": "a link", "other": "not a regular file", "duplicate": "stored twice"}


class CorruptArchiveError(PatchkitError):
    """The archive cannot be read to its end with valid checksums (exit 2): its `path`, the `reason` (the
    reader's error, e.g. a CRC mismatch or a damaged member header) and whether it was `removed` from the
    cache so the next run downloads it afresh."""

    def __init__(self, path: Path, reason: str, removed: bool):
        self.path, self.reason, self.removed = path, reason, removed
        note = "; removed it from the cache, the next run downloads it again" if removed else ""
        super().__init__(f"archive {path} is corrupt or truncated ({reason}){note}")


class UnsafeArchiveError(PatchkitError):
    """A member name no extractor would write where it says (exit 2): `path` the archive, `member` the
    name, `problem` what is wrong with it (`..`, not UTF-8, under a link)."""

    def __init__(self, path: Path, member: str, problem: str):
        self.path, self.member, self.problem = path, member, problem
        super().__init__(f"archive {path}: member {member} {problem}; refused")


def _corrupt(path: Path, error: BaseException, discard: Callable[[], None] | None) -> CorruptArchiveError:
    if discard is not None:  # a cache entry: drop it so the next run downloads the archive afresh
        discard()
    return CorruptArchiveError(path, f"{type(error).__name__}: {error}", removed=discard is not None)


def member_name(path: Path, raw: str) -> str:
    """`raw` as an extractor writes it ("./a//b/" -> "a/b"); refuses names that escape or do not decode."""
    if raw.isascii() and "/." not in raw and "//" not in raw and not raw.startswith((".", "/")) and "\0" not in raw:
        return raw  # the common case, decided in a few C calls: no "", "." or ".." segment, nothing to decode
    if "\0" in raw or ".." in raw.split("/"):
        raise UnsafeArchiveError(path, ascii(raw), "climbs out of the archive ('..') or holds a NUL")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeArchiveError(path, ascii(raw), "is not UTF-8") from None
    if "//" in raw or raw.startswith("/") or "." in raw.split("/"):
        return "/".join(part for part in raw.split("/") if part not in ("", "."))
    return raw


def record(listing: dict[str, str], name: str, kind: str) -> None:
    """Adds a member to a listing: a second member of that name, unless both are directories, is a duplicate."""
    previous = listing.get(name)
    listing[name] = kind if previous is None or previous == kind == "dir" else "duplicate"


def check_ancestors(path: Path, listing: dict[str, str]) -> None:
    """Refuses a member stored under a name the archive also stores as a non-directory."""
    parents: set[str] = set()
    for name in listing:
        parent = name.rpartition("/")[0]
        while parent and parent not in parents:
            parents.add(parent)
            parent = parent.rpartition("/")[0]
    for parent in sorted(parents):
        if listing.get(parent, "dir") != "dir":
            under = next(name for name in listing if name.startswith(parent + "/"))
            stored_as = {"file": "a file", "link": "a link", "duplicate": "more than one member"}
            raise UnsafeArchiveError(path, under, f"lies under {parent}, which the archive stores as "
                                                  f"{stored_as.get(listing[parent], 'a special file')}, not a directory")


class TarGzArchive:
    def __init__(
        self,
        path: Path,
        *,
        keep: Callable[[str], bool],
        files: FileCache | None = None,
        key: str | None = None,
        discard: Callable[[], None] | None = None,
    ):
        """`files`/`key`: where members go on disk; `discard`: drops the archive from its cache if corrupt."""
        if (files is None) != (key is None):
            raise ValueError("a FileCache needs the key of this archive, and a key needs a FileCache")
        self.path, self._keep, self._discard = path, keep, discard
        self._cache: tuple[FileCache, str] | None = None  # the FileCache and this archive's key in it
        self._listing: dict[str, str] | None = None
        if files is not None and key is not None:
            self._cache = (files, key)
            self._listing = files.listing(key)
        self._held: dict[str, bytes] = {}  # bytes kept from the last pass
        self._on_disk: set[str] = set()  # members known to be in the FileCache

    def listing(self) -> dict[str, str]:
        """Member name -> "file" | "dir" | "link" | "other" | "duplicate"."""
        return self._listing if self._listing is not None else self._pass(set())

    def read_many(self, members: Iterable[str]) -> dict[str, bytes]:
        """Bytes of regular-file members (the caller has checked them in `listing()`)."""
        members = list(members)
        found: dict[str, bytes] = {}
        cache = self._cache
        for member in members:
            if member in self._held:
                found[member] = self._held[member]
            elif cache is not None and (data := cache[0].get(cache[1], member)) is not None:
                found[member] = data
                self._on_disk.add(member)
        missing = [member for member in members if member not in found]
        if missing:
            self._pass(set(missing))
            for member in missing:
                if member not in self._held:
                    raise NotARegularMember(member, "not a regular file", str(self.path))
                found[member] = self._held[member]
        if cache is not None:
            for member in members:
                if member not in self._on_disk:
                    cache[0].put(cache[1], member, found[member])
                    self._on_disk.add(member)
        return found

    def _pass(self, wanted: set[str]) -> dict[str, str]:
        """One pass: the listing (returned), the `wanted` bodies (each and all within the `member` limit)
        and as many kept ones as fit in that limit again."""
        listing: dict[str, str] = {}
        limit = limit_of("member")
        budget = {"wanted": limit, "kept": limit}
        self._held = {}
        named: list = [None, None]  # the raw name `want` last saw and its normal form: each is made once

        def want(raw: str, kind: str, size: int) -> bool:
            name = named[1] = member_name(self.path, raw)
            named[0] = raw
            if name in wanted:
                if size > budget["wanted"]:
                    raise InputTooLarge(f"{self.path}: {name}" + ("" if size > limit else " (with the members "
                                        "read before it)"), "member", limit, size)
                budget["wanted"] -= size
                return True
            if self._keep(name) and size <= budget["kept"]:
                budget["kept"] -= size
                return True
            return False

        try:
            with open_regular(self.path, "archive", f"archive {self.path}") as file, open_gzip(file) as stream:
                for raw, kind, body in scan(stream, want):
                    name = named[1] if raw == named[0] else member_name(self.path, raw)
                    previous = listing.get(name)  # record(), inlined: this loop runs once per member
                    listing[name] = kind if previous is None or previous == kind == "dir" else "duplicate"
                    if body is not None:
                        self._held[name] = body
        except (TarError, *INFLATE_ERRORS) as error:
            self._held.clear()
            raise _corrupt(self.path, error, self._discard) from error
        except InputTooLarge as error:
            self._held.clear()
            if error.what.startswith(str(self.path)):
                raise
            raise InputTooLarge(f"archive {self.path}: {error.what}", error.kind, error.limit, error.size) from None
        check_ancestors(self.path, listing)
        if self._listing is None and self._cache is not None:
            self._cache[0].put_listing(self._cache[1], listing)
        self._listing = listing
        return listing


class Archive(Protocol):
    """What ArchiveSource reads through: TarGzArchive, a verified wheel's members (sources.wheel)."""

    path: Path

    def listing(self) -> dict[str, str]: ...

    def read_many(self, members: Iterable[str]) -> dict[str, bytes]: ...


class ArchiveSource(SourceDefaults):
    """The packages of an archive whose package directories sit under `prefix` ("" or "vllm-0.33.0/")."""

    description: str

    def __init__(self, archive: Archive, prefix: str):
        self._archive = archive
        listing = archive.listing()
        is_file = lambda name: listing.get(name) == "file"  # noqa: E731
        self._roots = {p: root for p in PACKAGES if (root := find_package_root(p, is_file, prefix)) is not None}
        if not self._roots:
            raise NoPackages(str(archive.path), [f"{p}/__init__.py" for p in PACKAGES])

    def read(self, package: str, path: str) -> bytes | None:
        return self.read_many(package, [path])[path]

    def read_many(self, package: str, paths: list[str]) -> dict[str, bytes | None]:
        check_package(package)
        relatives = {path: relative_path(path) for path in paths}
        root = self._roots.get(package)
        if root is None:
            return dict.fromkeys(paths)
        listing = self._archive.listing()
        members = {}
        for path, relative in relatives.items():
            kind = listing.get(f"{root}/{relative}")
            if kind not in (None, "file"):
                raise NotARegularMember(f"{package}/{relative}", _KINDS.get(kind, "not a regular file"),
                                        str(self._archive.path))
            if kind == "file":
                members[path] = f"{root}/{relative}"
        data = self._archive.read_many(members.values())
        return {path: data[members[path]] if path in members else None for path in paths}

    def package_files(self, package: str) -> list[str] | None:
        """The regular files the archive lists under the package's directory."""
        root = self._roots.get(package)
        if root is None:
            return None
        prefix = root + "/"
        return [name[len(prefix):] for name, kind in self._archive.listing().items()
                if kind == "file" and name.startswith(prefix)]

    def _member(self, name: str) -> bytes | None:
        """A member outside the packages (metadata), by its full name, within the `metadata` limit."""
        kind = self._archive.listing().get(name)
        if kind is None:
            return None
        if kind != "file":
            raise NotARegularMember(name, _KINDS.get(kind, "not a regular file"), str(self._archive.path))
        data = self._archive.read_many([name])[name]
        if len(data) > limit_of("metadata"):
            raise InputTooLarge(f"archive {self._archive.path}: {name}", "metadata", limit_of("metadata"), len(data))
        return data
