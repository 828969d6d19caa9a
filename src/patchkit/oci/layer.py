"""Deterministic layer tars (writer) and a streaming layer reader.

The writer makes the same bytes from the same entries on every run and machine with the same zlib:
entries sorted by path components, every mtime the build epoch (SOURCE_DATE_EPOCH or 0), owners
numeric only (no user/group names), PAX format; gzip with mtime 0, no file name, fixed level. The
layer digest (of the gzip) and diff_id (of the tar) both follow.

The reader streams a layer once, front to back, as the registry serves it: no random access, so a
multi-gigabyte layer is never held in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from patchkit.errors import PatchkitError
from patchkit.inflate import INFLATE_ERRORS, open_gzip
from patchkit.oci.media import OCI_LAYER_GZIP
from patchkit.untrusted import Readable

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
GZIP_LEVEL = 9

Kind = Literal["file", "dir", "whiteout"]


def normalize(path: str) -> str:
    """An image path as layer tars name it: relative to /, no './', no trailing slash ("" for /)."""
    # normpath against a leading "/" clamps "..", folds "./" and "//"; lstrip drops POSIX's "//".
    return posixpath.normpath("/" + path).lstrip("/")


@dataclass(frozen=True)
class Entry:
    """One entry of a layer being written. `path` is an image path (with or without a leading /)."""

    path: str
    kind: Kind
    data: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Layer:
    blob: bytes           # the gzip-compressed tar, as pushed
    digest: str           # sha256 of blob (the descriptor digest)
    diff_id: str          # sha256 of the uncompressed tar (the config's rootfs.diff_ids entry)
    media_type: str = OCI_LAYER_GZIP

    @property
    def size(self) -> int:
        return len(self.blob)

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


class InvalidLayerEntry(PatchkitError):
    """An entry a layer cannot hold (exit 2): `path` as given, `problem` "outside" (not a path inside the
    image), "twice", "whiteout-name" (a whiteout not named .wh.<name>) or "kind" (`kind` unknown)."""

    def __init__(self, path: str, problem: str, kind: str = ""):
        self.path, self.problem, self.kind = path, problem, kind
        super().__init__({"outside": f"layer entry path {path!r} is not a path inside the image",
                          "twice": f"layer entry {path!r} appears twice",
                          "whiteout-name": f"whiteout entry {path!r} must be named .wh.<name>",
                          "kind": f"layer entry {path!r} is of unknown kind {kind!r}"}[problem])


class UnreadableLayer(PatchkitError):
    """A layer blob that does not read as a (gzipped) tar to its end (exit 2): `what` names the layer,
    `reason` the reader's complaint."""

    def __init__(self, what: str, reason: str):
        self.what, self.reason = what, reason
        super().__init__(f"cannot read layer {what}: {reason}")


def _sort_key(entry: Entry) -> list[str]:
    # By components, so a directory always precedes its children ("a/b" < "a/b/c" < "a/b-c" would not
    # hold for plain string order, where "-" sorts before "/").
    return normalize(entry.path).split("/")


def in_layer_order(entries: Iterable[Entry]) -> list[Entry]:
    """`entries` sorted as a layer holds them (by path components), each checked: a path inside the image,
    named once, of a known kind, a whiteout named .wh.<name>."""
    ordered = sorted(entries, key=_sort_key)
    seen: set[str] = set()
    for entry in ordered:
        name = normalize(entry.path)
        if not name or ".." in entry.path.split("/"):
            raise InvalidLayerEntry(entry.path, "outside")
        if name in seen:
            raise InvalidLayerEntry(name, "twice")
        seen.add(name)
        if entry.kind == "whiteout" and not posixpath.basename(name).startswith(WHITEOUT_PREFIX):
            raise InvalidLayerEntry(name, "whiteout-name")
        if entry.kind not in ("file", "dir", "whiteout"):
            raise InvalidLayerEntry(name, "kind", entry.kind)
    return ordered


def layer_tar(entries: Iterable[Entry], *, epoch: int) -> bytes:
    """The uncompressed tar of `entries` in layer order (its sha256 is the layer's diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in in_layer_order(entries):
            info = tarfile.TarInfo(normalize(entry.path))
            info.mtime = epoch
            info.uid, info.gid = entry.uid, entry.gid
            info.uname = info.gname = ""
            info.mode = entry.mode & 0o7777
            payload = None
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
            else:   # a file, or a whiteout: an empty regular file
                info.type = tarfile.REGTYPE
                if entry.kind == "file":
                    info.size = len(entry.data)
                    payload = io.BytesIO(entry.data)
            tar.addfile(info, payload)
    return raw.getvalue()


def build_layer(entries: Iterable[Entry], *, epoch: int) -> Layer:
    tar_bytes = layer_tar(entries, epoch=epoch)
    packed = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header free of anything that varies between runs.
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=GZIP_LEVEL) as gz:
        gz.write(tar_bytes)
    blob = packed.getvalue()
    return Layer(blob=blob, digest="sha256:" + hashlib.sha256(blob).hexdigest(),
                 diff_id="sha256:" + hashlib.sha256(tar_bytes).hexdigest())


def whiteout_path(path: str) -> str:
    """The whiteout entry that deletes `path` from the layers below."""
    head, tail = posixpath.split(normalize(path))
    return posixpath.join(head, WHITEOUT_PREFIX + tail)


def whited_out(whiteout: str) -> str:
    """The path a whiteout entry deletes (whiteout_path's inverse)."""
    head, tail = posixpath.split(normalize(whiteout))
    return posixpath.join(head, tail.removeprefix(WHITEOUT_PREFIX))


MemberKind = Literal["file", "dir", "symlink", "hardlink", "whiteout", "opaque", "other"]


@dataclass(frozen=True)
class Member:
    """One entry of a layer being read, its name normalized. `whiteout` names the hidden path."""

    name: str
    kind: MemberKind
    mode: int
    uid: int
    gid: int
    size: int
    linkname: str = ""


def _kind(info: tarfile.TarInfo) -> MemberKind:
    if info.isreg():
        return "file"
    if info.isdir():
        return "dir"
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    return "other"


# A PAX or GNU long-name header is read whole into memory by tarfile before the member it describes: a
# hostile layer can claim gigabytes for one (zeros gzip ~1000:1). Real ones hold a path, a link name and a
# few times, under PATH_MAX (4 KiB) each; 1 MiB leaves room for any xattr a real image carries.
MAX_EXTENDED_HEADER = 1 << 20
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)


class ExtendedHeaderTooLarge(PatchkitError):
    """A layer's PAX or GNU extended header past MAX_EXTENDED_HEADER (exit 2); refused before it is read.
    `what` names the layer, `size` the header's declared size."""

    def __init__(self, what: str, size: int):
        self.what, self.size = what, size
        super().__init__(f"layer {what}: an extended tar header of {size:,} B, over the {MAX_EXTENDED_HEADER:,} B "
                         "a real one needs (a path and a few attributes); refused unread")


class _HeaderSize(Exception):
    """Raised inside tarfile, which cannot be told the layer's name; iter_layer raises it named."""

    def __init__(self, size: int):
        self.size = size


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header with the size of extended headers checked before tarfile reads them."""

    def _proc_member(self, tarfile_):  # tarfile's hook for each header it meets (stable since 3.x)
        if self.type in _EXTENDED and self.size > MAX_EXTENDED_HEADER:
            raise _HeaderSize(self.size)
        return super()._proc_member(tarfile_)


def iter_layer(stream: Readable, what: str) -> Iterator[tuple[Member, tarfile.TarFile, tarfile.TarInfo]]:
    """Stream a layer's members front to back. Whiteouts come back as kind 'whiteout' with `name` the
    hidden path, opaque markers as kind 'opaque' with `name` the directory they empty.

    gzip is recognised by its magic bytes rather than the media type: some registries mislabel.
    """
    head = stream.read(2)
    rest = _Prefixed(head, stream)
    # patchkit.inflate's (ISA-L's, ~2.5x zlib: a vLLM layer is gigabytes). Like gzip.GzipFile it checks
    # the CRC and length at the end of the stream (tarfile's own "r|gz" does not,
    # and takes a truncated archive for a short one), so the stream is drained to its end below.
    inner = open_gzip(rest) if head == b"\x1f\x8b" else rest
    try:
        with tarfile.open(fileobj=inner, mode="r|", tarinfo=_BoundedTarInfo) as tar:
            for info in tar:
                name = normalize(info.name)
                if not name:
                    continue
                head_dir, base = posixpath.split(name)
                if base == OPAQUE_MARKER:
                    member = Member(head_dir, "opaque", 0, 0, 0, 0)
                elif base.startswith(WHITEOUT_PREFIX):
                    member = Member(whited_out(name), "whiteout", 0, 0, 0, 0)
                else:
                    member = Member(name, _kind(info), info.mode, info.uid, info.gid, info.size,
                                    normalize(info.linkname) if info.islnk() else info.linkname)
                yield member, tar, info
        while inner.read(1 << 20):
            pass
    except _HeaderSize as exc:  # the first header is read inside tarfile.open, before any name could be set
        raise ExtendedHeaderTooLarge(what, exc.size) from None
    except (tarfile.TarError, *INFLATE_ERRORS) as exc:
        raise UnreadableLayer(what, f"{exc.__class__.__name__}: {exc}") from None


class _Prefixed(io.RawIOBase):
    """A stream with already-read bytes put back in front (tarfile's stream mode cannot seek)."""

    def __init__(self, prefix: bytes, stream: Readable):
        self._prefix = prefix
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        if self._prefix:
            n = min(len(buf), len(self._prefix))
            buf[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._stream.read(len(buf))
        buf[: len(data)] = data
        return len(data)
