"""The on-disk cache: downloaded archives, bare git clones, and member bytes read out of archives.

Everything enters the cache by writing a temporary file beside its final name and renaming it, so a
crash, a full disk or a failed check never leaves a half-written entry that a later run would trust.

The cache is trusted for nothing it cannot verify now. What binds its entries together is an
HMAC-SHA256 under a key kept outside the cache (`cache-key` in the user's state directory, or in
PATCHKIT_STATE_DIR; 0600, made on first use; a key that cannot be kept is one per process, so nothing
carries over). Each archive record (index URL, sha256, size, the stamp of the file last verified), each
member listing (bound to its archive's key, which names the archive's full verified sha256) and each
member reference (archive key, member name, blob sha256) carries its MAC; a blob is hashed on every read.
The bare git clones (git/) are outside what follows: a clone is what its last fetch left.

What a process that can write the cache, but not the user's state directory, can and cannot do:

- It cannot make patchkit read, for a member of an archive, any bytes but that member's bytes in the
  archive whose sha256 the index gave: a reference re-pointed at another blob, a reference or a listing
  copied from another member or archive, an edited listing or record, a swapped blob all fail their MAC
  or hash and are read again from the archive.
- It cannot make patchkit use an archive the index did not name: a replaced or edited archive does not
  hash as its MAC'd record says (found, reported, removed, downloaded again); a record it wrote itself
  fails its MAC (the file is kept only if it hashes as the index says now, else downloaded again).
- It cannot make patchkit crash, hang or write outside the cache: entries are read as regular files
  within a limit, a file name from the index with a directory part is refused, malformed entries are
  absent entries.
- It can make patchkit slower (every forged entry means a pass over the archive or a download) or stop
  it: an archive can be deleted, and disk filled.
- With the key too (write access to the user's state directory), it can do anything: that user's
  patchkit installation itself is then as writable.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
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

from patchkit.cache_root import default_cache_root
from patchkit.errors import PatchkitError
from patchkit.localfiles import adjacent_tmp_file, atomic_write, file_sha256
from patchkit.untrusted import read_file

_SECRETS: dict[str, bytes] = {}


def key_path() -> Path:
    """Where the cache's key lives: outside every cache root, so a cache copied in cannot bring its own."""
    override = os.environ.get("PATCHKIT_STATE_DIR")
    return Path(override or platformdirs.user_state_dir("patchkit")).expanduser() / "cache-key"


def user_secret() -> bytes:
    """The key that MACs this user's cache entries: 32 random bytes, made once (first writer wins)."""
    path = key_path()
    if str(path) in _SECRETS:
        return _SECRETS[str(path)]
    secret = None
    try:
        found = read_file(path, "definition")
        if len(found) == 32 and path.stat().st_mode & 0o077 == 0:
            secret = found
    except PatchkitError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=".cache-key.", suffix=".part")  # mode 0600
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(os.urandom(32))
                    out.flush()
                    os.fsync(out.fileno())
                with contextlib.suppress(FileExistsError):  # another process made one meanwhile: use it
                    os.link(name, path)  # never replaces a key (so not localfiles.adjacent_tmp_file)
            finally:
                os.unlink(name)
            secret = read_file(path, "definition")
        except (OSError, PatchkitError):
            secret = None
    _SECRETS[str(path)] = secret if secret is not None and len(secret) == 32 else os.urandom(32)
    return _SECRETS[str(path)]


def _mac(secret: bytes, *parts: str | bytes) -> str:
    joined = b"\0".join(p if isinstance(p, bytes) else p.encode("utf-8", "surrogateescape") for p in parts)
    return hmac.new(secret, joined, hashlib.sha256).hexdigest()


def _record_mac(secret: bytes, record: dict) -> str:
    fields = {k: record.get(k) for k in ("filename", "url", "sha256", "size", "verified")}
    return _mac(secret, "record", json.dumps(fields, sort_keys=True))


@dataclass(frozen=True)
class CachedArchive:
    path: Path
    url: str
    sha256: str


class ArchiveCache:
    """Archives downloaded from the index (sdists and wheels), each checked against the index's sha256 and
    recorded under a MAC; the layout under the root: downloads/ (archives + one JSON record per dist version),
    git/, files/."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, secret: bytes | None = None):
        """`secret`: the MAC key (default: the user's, `user_secret()`)."""
        self.root = Path(root).expanduser() if root is not None else default_cache_root()
        self.downloads = self.root / "downloads"
        self.git = self.root / "git"
        self._secret = secret
        self.files = FileCache(self.root / "files", secret=secret)

    @property
    def secret(self) -> bytes:
        return self._secret if self._secret is not None else user_secret()

    def lookup(self, dist: str, version: str) -> CachedArchive | None:
        """The archive downloaded and verified earlier for this version, if it still hashes as it did.
        A record without this user's MAC is no record (see `adopt`)."""
        try:
            record = json.loads(read_file(self._record(dist, version), "metadata"))
            if not hmac.compare_digest(str(record.get("mac")), _record_mac(self.secret, record)):
                return None
            path = self.downloads / _plain_filename(record["filename"])
            found = path.stat()
            if found.st_size != record["size"]:
                return None
            archive = CachedArchive(path, record["url"], record["sha256"])
            if record.get("verified") == _stamp(found):
                return archive
            actual = file_sha256(path)
        except (OSError, ValueError, KeyError, TypeError, RecursionError, AttributeError, PatchkitError):
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
        with adjacent_tmp_file(final) as out:
            yield out
        found = final.stat()  # the download hashed these very bytes against the index's sha256
        record = {"filename": final.name, "url": url, "sha256": sha256, "size": found.st_size, "verified": _stamp(found)}
        self._write_record(dist, version, record)

    def adopt(self, dist: str, version: str, filename: str, url: str, sha256: str) -> CachedArchive | None:
        """An archive already in downloads/ without a record of this user's (a cache restored from elsewhere,
        or one from before records carried a MAC), taken if it hashes as the index says now."""
        path = self.downloads / _plain_filename(filename)
        try:
            found = path.stat()
            if not path.is_file() or file_sha256(path) != sha256:
                return None
        except OSError:
            return None
        record = {"filename": path.name, "url": url, "sha256": sha256, "size": found.st_size, "verified": _stamp(found)}
        self._write_record(dist, version, record)
        return CachedArchive(path, url, sha256)

    def _write_record(self, dist: str, version: str, record: dict) -> None:
        record = {k: v for k, v in record.items() if k != "mac"}
        record["mac"] = _record_mac(self.secret, record)
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


class UnsafeFileName(PatchkitError):
    """An archive file name from the index with a directory part, which would write outside the cache
    (exit 2): the `filename` as the index gave it."""

    def __init__(self, filename: str):
        self.filename = filename
        super().__init__(f"refusing archive file name {filename!r} from the index")


def _plain_filename(filename: str) -> str:
    """The index names the file; a name with a directory part must not write outside the cache."""
    if not filename or "/" in filename or "\\" in filename or filename.startswith("."):
        raise UnsafeFileName(filename)
    return filename


class FileCache:
    """Member bytes of archives, content-addressed, so a warm run decompresses nothing.

    blobs/<sha256[:2]>/<sha256>        the bytes, checked against their name on every read
    archives/<key>/members.json        the archive's member list (so absent files need no pass either)
    archives/<key>/members.mac         its MAC, bound to the key
    archives/<key>/refs/<sha256(name)> "<blob sha256> <mac>": the MAC binds key, member name and blob
    Blobs are shared, so files unchanged between two versions are stored once. An entry whose MAC or hash
    does not hold is absent (and removed): the caller reads the archive again.
    """

    def __init__(self, root: Path, *, secret: bytes | None = None):
        self.root = root
        self._secret = secret

    @property
    def secret(self) -> bytes:
        return self._secret if self._secret is not None else user_secret()

    def listing(self, key: str) -> dict[str, str] | None:
        """The listing, or None when there is none, its MAC fails or it is not an object of strings."""
        where = self.root / "archives" / key
        try:
            body = read_file(where / "members.json", "metadata")
            mac = read_file(where / "members.mac", "metadata")
            if not hmac.compare_digest(mac, _mac(self.secret, "listing", key, body).encode()):
                return None
            found = json.loads(body)
        except (OSError, ValueError, RecursionError, PatchkitError):
            return None
        if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
            return None
        return found

    def put_listing(self, key: str, listing: dict[str, str]) -> None:
        """The listing, then its MAC: a reader between the two sees a MAC that fails, so no listing."""
        body = json.dumps(listing).encode()
        atomic_write(self.root / "archives" / key / "members.json", body)
        atomic_write(self.root / "archives" / key / "members.mac", _mac(self.secret, "listing", key, body).encode())

    def get(self, key: str, member: str) -> bytes | None:
        ref = self._ref(key, member)
        try:
            digest, _, mac = read_file(ref, "metadata").decode("ascii").partition(" ")
            if not hmac.compare_digest(mac, _mac(self.secret, "member", key, member, digest)):
                ref.unlink(missing_ok=True)  # forged, or copied from another member or archive
                return None
            blob = self._blob(digest)
            data = read_file(blob, "member")
        except (OSError, ValueError, PatchkitError):
            return None
        if hashlib.sha256(data).hexdigest() != digest:
            blob.unlink(missing_ok=True)
            ref.unlink(missing_ok=True)
            return None
        return data

    def put(self, key: str, member: str, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        blob = self._blob(digest)
        try:
            intact = file_sha256(blob) == digest if blob.is_file() else False
        except OSError:
            intact = False
        if not intact:  # absent, or a planted file under this name
            atomic_write(blob, data)
        atomic_write(self._ref(key, member), f"{digest} {_mac(self.secret, 'member', key, member, digest)}".encode())

    def _blob(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256: {digest!r}")
        return self.root / "blobs" / digest[:2] / digest

    def _ref(self, key: str, member: str) -> Path:
        return self.root / "archives" / key / "refs" / hashlib.sha256(member.encode("utf-8", "surrogateescape")).hexdigest()
