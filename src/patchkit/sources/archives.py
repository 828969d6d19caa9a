"""Reading single members out of archives without extracting them, and the source over such an archive.

A .tar.gz cannot be seeked: reaching any member means decompressing everything before it. So a read
that misses the caches costs one streaming pass over the whole archive (`sources.tarscan`: ISA-L
inflate and a header scan, under half a second of CPU for vLLM's 47 MB sdist), and that pass keeps in
memory every file under the package directories (`keep`, ~50 MB for vLLM): after it, no read in this
process decompresses again. Members actually read also go to the on-disk FileCache together with the
member list, so a warm run decompresses nothing at all. The pass reads the gzip stream to its very end,
which checks the CRC and length of the whole archive.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.sources.base import (
    PACKAGES,
    check_package,
    find_package_root,
    relative_path,
)
from patchkit.sources.cache import FileCache
from patchkit.sources.tarscan import INFLATE_ERRORS, TarError, open_gzip, scan

_KINDS = {"dir": "a directory", "link": "a link", "other": "not a regular file", "duplicate": "stored twice"}


class CorruptArchiveError(PatchkitError):
    """The archive cannot be read to its end with valid checksums."""


def _corrupt(path: Path, error: BaseException, discard: Callable[[], None] | None) -> CorruptArchiveError:
    note = ""
    if discard is not None:  # a cache entry: drop it so the next run downloads the archive afresh
        discard()
        note = "; removed it from the cache, the next run downloads it again"
    return CorruptArchiveError(f"archive {path} is corrupt or truncated ({type(error).__name__}: {error}){note}")


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
        self.path, self._keep, self._files, self._key, self._discard = path, keep, files, key, discard
        self._listing = files.listing(key) if files is not None else None
        self._held: dict[str, bytes] = {}  # bytes kept from the last pass
        self._on_disk: set[str] = set()  # members known to be in the FileCache

    def listing(self) -> dict[str, str]:
        """Member name -> "file" | "dir" | "link" | "other" | "duplicate"."""
        if self._listing is None:
            self._pass(set())
        return self._listing

    def read_many(self, members: Iterable[str]) -> dict[str, bytes]:
        """Bytes of regular-file members (the caller has checked them in `listing()`)."""
        members = list(members)
        found: dict[str, bytes] = {}
        for member in members:
            if member in self._held:
                found[member] = self._held[member]
            elif self._files is not None and (data := self._files.get(self._key, member)) is not None:
                found[member] = data
                self._on_disk.add(member)
        missing = [member for member in members if member not in found]
        if missing:
            self._pass(set(missing))
            for member in missing:
                if member not in self._held:
                    raise PatchkitError(f"{member} is not a regular file in {self.path}")
                found[member] = self._held[member]
        if self._files is not None:
            for member in members:
                if member not in self._on_disk:
                    self._files.put(self._key, member, found[member])
                    self._on_disk.add(member)
        return found

    def _pass(self, wanted: set[str]) -> None:
        listing: dict[str, str] = {}

        def want(name: str, kind: str) -> bool:
            return name in wanted or self._keep(name)

        try:
            with open_gzip(self.path) as stream:
                for name, kind, body in scan(stream, want):
                    listing[name] = "duplicate" if name in listing and kind == "file" else kind
                    if body is not None:
                        self._held[name] = body
        except (TarError, *INFLATE_ERRORS) as error:
            self._held.clear()
            raise _corrupt(self.path, error, self._discard) from error
        if self._listing is None and self._files is not None:
            self._files.put_listing(self._key, listing)
        self._listing = listing


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    return "link" if member.issym() or member.islnk() else "other"


class ZipArchive:
    """Zip members are indexed and checksummed one by one: each read opens just that member."""

    def __init__(self, path: Path, *, discard: Callable[[], None] | None = None):
        self.path, self._discard = path, discard
        self._listing: dict[str, str] = {}
        try:
            with zipfile.ZipFile(path) as archive:
                infos = archive.infolist()
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise _corrupt(path, error, discard) from error
        for info in infos:
            name = info.filename.rstrip("/")
            kind = "dir" if info.is_dir() else "link" if stat.S_ISLNK(info.external_attr >> 16) else "file"
            self._listing[name] = "duplicate" if name in self._listing and kind == "file" else kind

    def listing(self) -> dict[str, str]:
        return self._listing

    def read_many(self, members: Iterable[str]) -> dict[str, bytes]:
        try:
            with zipfile.ZipFile(self.path) as archive:
                return {member: archive.read(member) for member in members}
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as error:
            raise _corrupt(self.path, error, self._discard) from error


class ArchiveSource:
    """The packages of an archive whose package directories sit under `prefix` ("" or "vllm-0.33.0/")."""

    description: str

    def __init__(self, archive: TarGzArchive | ZipArchive, prefix: str):
        self._archive = archive
        listing = archive.listing()
        is_file = lambda name: listing.get(name) == "file"  # noqa: E731
        self._roots = {p: root for p in PACKAGES if (root := find_package_root(p, is_file, prefix)) is not None}
        if not self._roots:
            raise PatchkitError(f"{archive.path} holds none of the packages {', '.join(PACKAGES)}")

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
                raise PatchkitError(
                    f"{package}/{relative} is {_KINDS[kind]} in {self._archive.path}: patchkit reads regular files only"
                )
            if kind == "file":
                members[path] = f"{root}/{relative}"
        data = self._archive.read_many(members.values())
        return {path: data[members[path]] if path in members else None for path in paths}

    def _member(self, name: str) -> bytes | None:
        """A member outside the packages (metadata), by its full name."""
        if self._archive.listing().get(name) != "file":
            return None
        return self._archive.read_many([name])[name]
