"""The on-disk cache: downloaded archives, bare git clones, and member bytes read out of archives.

Everything enters the cache by writing a temporary file beside its final name and renaming it, so a
crash, a full disk or a failed check never leaves a half-written entry that a later run would trust.

No byte of the cache reaches the planner unverified. Member bytes are content-addressed and checked
against their sha256 on every read (FileCache). An archive's sha256 (the index's, checked while it
downloaded) is checked again whenever the file is not the very file last verified: the record keeps
that file's device, inode, size, mtime and ctime, and any write to it, any replacement, even one that
keeps its size and restores its mtime, changes its ctime or inode. So the warm path costs one stat, and
an archive altered in place is hashed, found out, reported, removed and downloaded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import platformdirs
from packaging.utils import canonicalize_name
from packaging.version import Version

from patchkit.errors import PatchkitError


def default_cache_root() -> Path:
    override = os.environ.get("PATCHKIT_CACHE_DIR")
    return Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("patchkit"))


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _temporary_beside(path) as (out, temporary):
        out.write(data)
        out.close()
        temporary.replace(path)


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """A temporary file in `path`'s directory (same filesystem, so the rename is atomic), gone on error."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out, temporary
    finally:
        temporary.unlink(missing_ok=True)


@dataclass(frozen=True)
class CachedArchive:
    path: Path
    url: str
    sha256: str


class SdistCache:
    """Layout under the root: downloads/ (archives + one JSON record per dist version), git/, files/."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_root()
        self.downloads = self.root / "downloads"
        self.git = self.root / "git"
        self.files = FileCache(self.root / "files")

    def lookup(self, dist: str, version: str) -> CachedArchive | None:
        """The archive downloaded and verified earlier for this version, if it still hashes as it did."""
        try:
            record = json.loads(self._record(dist, version).read_text())
            path = self.downloads / _plain_filename(record["filename"])
            found = path.stat()
            if found.st_size != record["size"]:
                return None
            archive = CachedArchive(path, record["url"], record["sha256"])
            if record.get("verified") == _stamp(found):
                return archive
            actual = _file_sha256(path)
        except (OSError, ValueError, KeyError, TypeError, RecursionError, PatchkitError):
            return None
        if actual != archive.sha256:
            self.forget(dist, version, path)
            print(f"patchkit: cached {path} does not match its recorded sha256 (expected {archive.sha256}, "
                  f"found {actual}): removed it, downloading it again", file=sys.stderr)
            return None
        self._write_record(dist, version, record | {"verified": _stamp(found)})
        return archive

    @contextlib.contextmanager
    def new_archive(self, dist: str, version: str, filename: str, url: str, sha256: str) -> Iterator[BinaryIO]:
        """Yields a file to fill; it enters the cache only when the block ends without an exception."""
        final = self.downloads / _plain_filename(filename)
        self.downloads.mkdir(parents=True, exist_ok=True)
        with _temporary_beside(final) as (out, temporary):
            yield out
            out.close()
            temporary.replace(final)
        found = final.stat()  # the download hashed these very bytes against the index's sha256
        record = {"filename": final.name, "url": url, "sha256": sha256, "size": found.st_size, "verified": _stamp(found)}
        self._write_record(dist, version, record)

    def _write_record(self, dist: str, version: str, record: dict) -> None:
        atomic_write(self._record(dist, version), json.dumps(record, indent=1).encode())

    def forget(self, dist: str, version: str, archive: Path) -> None:
        """Drop an archive found corrupt (record first), so the next run downloads it afresh."""
        self._record(dist, version).unlink(missing_ok=True)
        archive.unlink(missing_ok=True)

    def _record(self, dist: str, version: str) -> Path:
        return self.downloads / f"{canonicalize_name(dist)}-{Version(version)}.json"


def _stamp(found: os.stat_result) -> list[int]:
    """What identifies the file last verified: any write or replacement changes ctime or inode."""
    return [found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns]


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _plain_filename(filename: str) -> str:
    """The index names the file; a name with a directory part must not write outside the cache."""
    if not filename or "/" in filename or "\\" in filename or filename.startswith("."):
        raise PatchkitError(f"refusing archive file name {filename!r} from the index")
    return filename


class FileCache:
    """Member bytes of archives, content-addressed, so a warm run decompresses nothing.

    blobs/<sha256[:2]>/<sha256>        the bytes, checked against their name on every read
    archives/<key>/members.json        the archive's member list (so absent files need no pass either)
    archives/<key>/refs/<sha256(name)> "<blob sha256> <member name>"
    Blobs are shared, so files unchanged between two versions are stored once.
    """

    def __init__(self, root: Path):
        self.root = root

    def listing(self, key: str) -> dict[str, str] | None:
        """The listing, or None when there is none or it is not an object of strings (then it is rebuilt)."""
        try:
            found = json.loads((self.root / "archives" / key / "members.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
            return None
        return found

    def put_listing(self, key: str, listing: dict[str, str]) -> None:
        atomic_write(self.root / "archives" / key / "members.json", json.dumps(listing).encode())

    def get(self, key: str, member: str) -> bytes | None:
        ref = self._ref(key, member)
        try:
            digest, _, named = ref.read_text().partition(" ")
            blob = self._blob(digest)
            data = blob.read_bytes()
        except (OSError, ValueError):
            return None
        if named != member:  # a ref copied from another member's: its blob is intact but not this member
            ref.unlink(missing_ok=True)
            return None
        if hashlib.sha256(data).hexdigest() != digest:
            blob.unlink(missing_ok=True)
            ref.unlink(missing_ok=True)
            return None
        return data

    def put(self, key: str, member: str, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        blob = self._blob(digest)
        if not blob.is_file():
            atomic_write(blob, data)
        atomic_write(self._ref(key, member), f"{digest} {member}".encode())

    def _blob(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256: {digest!r}")
        return self.root / "blobs" / digest[:2] / digest

    def _ref(self, key: str, member: str) -> Path:
        return self.root / "archives" / key / "refs" / hashlib.sha256(member.encode()).hexdigest()
