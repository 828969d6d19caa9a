"""A wheel checked whole, the way pip and pypa/installer would install it, before any of its bytes is used.

Every wheel is outside input, a person's `--source x.whl` as much as a release's (sources.wheel reads
both through this): its member names become paths under site-packages, its files are what patches are
planned on, its RECORD is what a patched wheel's RECORD is made from, its compressed bytes are copied as
they are. So every member is
inflated once here, in bounded pieces, and held against its RECORD row (hash and size), its CRC and its
declared size; the sha256 of its compressed bytes is kept, and a copy or a read later must give the same
bytes again (the file could change under us). Refused (`BadWheel`, exit 2; `problem` says which):

- `file-name`: not a wheel's file name; `zip`: no zip, or a zip with members overlapping;
- `unsafe-name`: a member name absolute, with `..`, `.` or empty parts, a backslash, a drive letter, a NUL;
  `duplicate`: two members with one name once normalised (NFC, a trailing slash), or a file also a folder;
- `dist-info`: not exactly one `*.dist-info`, or one (or a `.data`) of another project or version than the
  file name's; `metadata`: METADATA naming another, or no WHEEL of Wheel-Version 1.x;
- `record`: no RECORD, one that is not CSV (a field over csv's 131,072-character limit), a row twice, a row
  without a sha256-or-better hash and a size, a hash for RECORD itself; `unlisted` / `missing`: a member
  RECORD does not list, a row for no member; `hash` / `size`: a member that does not match its row;
- `compression`: encrypted, or a method other than stored, deflate, bzip2, LZMA; `corrupt`: a compressed
  stream that does not inflate to its CRC and size; `changed`: bytes other than the verified ones read later.
Inflated sizes are capped before any inflating (InputTooLarge): the dist-info's by the `metadata` limit,
every other member and all together by `inflated`, a file read whole by `member`; the central directory by
`metadata`. Memory stays at a chunk per member whatever the compression ratio: every decompressor is asked
for at most CHUNK bytes at a time.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import itertools
import lzma
import re
import struct
import unicodedata
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Protocol

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patchkit.errors import PatchkitError
from patchkit.sources.metadata import core_metadata, same_distribution, same_version
from patchkit.sources.wheel_record import RecordRow, parse_record
from patchkit.sources.zip_stream import LOCAL_HEADER, METHODS, inflate, raw_chunks
from patchkit.untrusted import InputTooLarge, UnreadableFile, limit_of, open_regular

SIGNATURES = ("RECORD.jws", "RECORD.p7s")  # sign the RECORD; listed unhashed, or not at all
# The wheel spec: "sha256 or better"; md5 and sha1 are refused as pip's hash checking refuses them.
HASHES = ("sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s")
_DRIVE = re.compile(r"^[A-Za-z]:")
_B64 = re.compile(r"^[A-Za-z0-9_-]+$")
# What zipfile and the decompressors raise on a damaged archive; each becomes a BadWheel naming the member.
_BROKEN = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error, lzma.LZMAError,
           NotImplementedError, RuntimeError, ValueError, struct.error, OverflowError)


class BadWheel(PatchkitError):
    """A wheel pip or pypa/installer would refuse, or one changed while read (exit 2): `wheel` its path,
    `problem` the kind ("file-name", "zip", "unsafe-name", "duplicate", "dist-info", "record", "unlisted",
    "missing", "compression", "corrupt", "hash", "size", "metadata", "changed"), `detail` what was
    expected and found, `member` the member concerned (None for the wheel as a whole), and whether it was
    `removed` from the cache it was read from (the next run downloads it afresh; a user's file never is)."""

    def __init__(self, wheel: Path | str, problem: str, detail: str, member: str | None = None, *,
                 removed: bool = False):
        self.wheel, self.problem, self.detail, self.member, self.removed = str(wheel), problem, detail, member, removed
        where = f"{wheel}" + (f", member {member!r}" if member is not None else "")
        note = "; removed it from the cache, the next run downloads it again" if removed else ""
        super().__init__(f"{where}: {detail}; refused (pip would not install such a wheel){note}")


class RawWriter(Protocol):
    """Where `copy` puts a member's compressed bytes (wheels.archive.ReproducibleZip); returns their sha256."""

    def copy_raw(self, source: zipfile.ZipInfo, raw: Iterator[bytes], name: str | None = None) -> str: ...


@dataclass(frozen=True)
class Member:
    info: zipfile.ZipInfo
    row: RecordRow  # its sha256 and size, as measured (the RECORD's own row may use another hash)
    raw_sha256: str  # of its compressed bytes, as verified


def unsafe_name(name: str) -> str | None:
    """Why pip would refuse to install a member of this name, or None."""
    if "\x00" in name:
        return "a NUL byte in the name"
    if "\\" in name:
        return "a backslash in the name"
    if name.startswith("/"):
        return "an absolute path"
    if _DRIVE.match(name):
        return "a drive letter"
    parts = (name[:-1] if name.endswith("/") else name).split("/")
    if ".." in parts:
        return "a '..' part: it would be installed outside site-packages"
    if any(part in ("", ".") for part in parts):
        return "an empty or '.' part"
    return None


def _normal(name: str) -> str:
    return unicodedata.normalize("NFC", name.rstrip("/"))


class VerifiedWheel:
    """The members of a wheel every one of which matched its RECORD row; `open_wheel` makes one."""

    def __init__(self, path: Path, fp: io.BufferedReader):
        self.path, self._fp = path, fp
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except (InvalidWheelFilename, InvalidVersion) as error:
            raise BadWheel(path, "file-name", f"not a wheel's file name ({error})") from None
        self.name, self.version = canonicalize_name(name), str(version)
        self.sha256 = hashlib.file_digest(fp, "sha256").hexdigest()
        infos = self._central_directory()
        self.dist_info = self._check_layout(infos)
        files = [i for i in infos if not i.is_dir()]
        self._check_sizes(files)
        rows = self._record({i.filename: i for i in files})
        self.members: dict[str, Member] = {}
        for info in sorted(files, key=lambda i: i.header_offset):
            self.members[info.filename] = self._verify(info, rows.get(info.filename))
        self._check_metadata()

    # -- the archive and its names

    def _central_directory(self) -> list[zipfile.ZipInfo]:
        try:
            # zipfile's own end-record reader, private (not in typeshed): the size is checked before ZipFile
            # reads the whole central directory into memory.
            end = zipfile._EndRecData(self._fp)  # type: ignore[attr-defined]
            if end is None:
                raise zipfile.BadZipFile("no end of central directory record: not a zip archive")
            size = end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
            if size > limit_of("metadata"):
                raise InputTooLarge(f"{self.path}: central directory", "metadata", limit_of("metadata"), size)
            self._fp.seek(0)
            with zipfile.ZipFile(self._fp) as archive:
                infos = archive.infolist()
        except _BROKEN as error:
            raise BadWheel(self.path, "zip", f"not a readable zip ({type(error).__name__}: {error})") from None
        ordered = sorted(infos, key=lambda i: i.header_offset)
        for this, after in itertools.pairwise(ordered):
            name = this.orig_filename.encode("utf-8" if this.flag_bits & 0x800 else "cp437", "replace")
            end = this.header_offset + LOCAL_HEADER.size + len(name) + this.compress_size
            if end > after.header_offset:
                raise BadWheel(self.path, "zip", f"its data overlaps member {after.orig_filename!r} (a zip bomb's "
                               "trick: one compressed stream counted many times)", this.orig_filename)
        return infos

    def _check_layout(self, infos: list[zipfile.ZipInfo]) -> str:
        seen: dict[str, str] = {}
        for info in infos:
            why = unsafe_name(info.orig_filename)
            if why:
                raise BadWheel(self.path, "unsafe-name", why, info.orig_filename)
            key = _normal(info.filename)
            if key in seen:
                raise BadWheel(self.path, "duplicate", f"stored twice (also as {seen[key]!r}): which one pip "
                               "would install is a guess", info.filename)
            seen[key] = info.filename
        files = {_normal(i.filename) for i in infos if not i.is_dir()}
        for info in infos:
            parts = _normal(info.filename).split("/")
            for depth in range(1, len(parts)):
                if "/".join(parts[:depth]) in files:
                    raise BadWheel(self.path, "duplicate", f"inside {'/'.join(parts[:depth])!r}, which is a file",
                                   info.filename)
        tops = sorted({i.filename.split("/")[0] for i in infos if "/" in i.filename})
        dist_infos = [t for t in tops if t.endswith(".dist-info")]
        if len(dist_infos) != 1:
            raise BadWheel(self.path, "dist-info", f"expected one *.dist-info folder, found {dist_infos or 'none'}")
        for top in (t for t in tops if t.endswith((".dist-info", ".data"))):
            project, _, version = top.rsplit(".", 1)[0].rpartition("-")
            try:
                ours = canonicalize_name(project) == self.name and Version(version) == Version(self.version)
            except InvalidVersion:
                ours = False
            if not ours:
                raise BadWheel(self.path, "dist-info", f"folder {top} is not {self.name} {self.version}'s, "
                               "which the file name says this wheel is")
        return dist_infos[0]

    def _check_sizes(self, files: list[zipfile.ZipInfo]) -> None:
        total = 0
        for info in files:
            kind = "metadata" if info.filename.startswith(f"{self.dist_info}/") else "inflated"
            if info.file_size > limit_of(kind):
                raise InputTooLarge(f"{self.path}, member {info.filename}", kind, limit_of(kind), info.file_size)
            total += info.file_size
        if total > limit_of("inflated"):
            raise InputTooLarge(f"{self.path}: all members inflated", "inflated", limit_of("inflated"), total)

    # -- RECORD, and every member against it

    def _record(self, files: dict[str, zipfile.ZipInfo]) -> dict[str, RecordRow]:
        name = f"{self.dist_info}/RECORD"
        if name not in files:
            raise BadWheel(self.path, "record", f"no {name}: nothing to verify its members against")
        try:
            rows = parse_record(b"".join(self._inflate(files[name])))
        except ValueError as error:
            raise BadWheel(self.path, "record", f"{name} is not a RECORD: {error}") from None
        by_path: dict[str, RecordRow] = {}
        for row in rows:
            if row.path in by_path:
                raise BadWheel(self.path, "record", f"{name} lists {row.path!r} twice")
            by_path[row.path] = row
            if row.path == name:
                if row.hash or row.size:
                    raise BadWheel(self.path, "record", f"{name} gives a hash or size for itself")
            elif row.path in files and (row.hash or row.size or row.path.removeprefix(f"{self.dist_info}/")
                                        not in SIGNATURES):  # a signature may be listed unhashed
                algorithm, _, value = row.hash.partition("=")
                if algorithm not in HASHES or not _B64.match(value) or not row.size.isdigit() or len(row.size) > 20:
                    raise BadWheel(self.path, "record", f"{name}'s row for {row.path!r} is not `path,"
                                   f"<sha256 or better>=<digest>,<size>`: {row.hash!r:.100}, {row.size!r:.40}")
        signatures = {f"{self.dist_info}/{s}" for s in SIGNATURES} | {name}
        unlisted = sorted(set(files) - set(by_path) - signatures)
        if unlisted:
            raise BadWheel(self.path, "unlisted", f"not in {name} ({len(unlisted)} such, first {unlisted[:3]})",
                           unlisted[0])
        missing = sorted(set(by_path) - set(files))
        if missing:
            raise BadWheel(self.path, "missing", f"{name} lists {len(missing)} file(s) the zip does not hold, "
                           f"first {missing[:3]}", missing[0])
        return by_path

    def _inflate(self, info: zipfile.ZipInfo, raw_digest: hashlib._Hash | None = None) -> Iterator[bytes]:
        """The member's bytes, checked against its CRC and declared size, at most CHUNK at a time; the
        compressed bytes they come from go through `raw_digest` on the way."""
        name = info.orig_filename
        if info.flag_bits & 0x41:
            raise BadWheel(self.path, "compression", "encrypted: pip cannot read it", name)
        if info.compress_type not in METHODS or info.flag_bits & 0x20:
            raise BadWheel(self.path, "compression", f"compression method {info.compress_type} (zip knows it, "
                           "zipfile and so pip do not)", name)
        size, crc = 0, 0
        try:
            for piece in inflate(_tee(raw_chunks(self._fp, info), raw_digest), info.compress_type):
                size += len(piece)
                if size > info.file_size:
                    raise zipfile.BadZipFile(f"inflates past its declared {info.file_size:,} B")
                crc = zlib.crc32(piece, crc)
                yield piece
        except _BROKEN as error:
            raise BadWheel(self.path, "corrupt", f"its {METHODS[info.compress_type]} data does not read back "
                           f"({type(error).__name__}: {error})", name) from None
        if size != info.file_size or crc != info.CRC:
            raise BadWheel(self.path, "corrupt", f"inflates to {size:,} B with CRC {crc:08x}, the zip says "
                           f"{info.file_size:,} B with CRC {info.CRC:08x}", name)

    def _verify(self, info: zipfile.ZipInfo, row: RecordRow | None) -> Member:
        algorithm = row.hash.partition("=")[0] if row is not None and row.hash else "sha256"
        digests = {"sha256": hashlib.sha256(), algorithm: hashlib.new(algorithm)}
        raw = hashlib.sha256()
        for piece in self._inflate(info, raw):
            for digest in digests.values():
                digest.update(piece)
        ours = _b64(digests["sha256"].digest())
        if row is not None and row.hash:
            if f"{algorithm}={_b64(digests[algorithm].digest())}" != row.hash:
                raise BadWheel(self.path, "hash", f"RECORD says {row.hash}, its bytes hash to "
                               f"{algorithm}={_b64(digests[algorithm].digest())}", info.filename)
            if int(row.size) != info.file_size:
                raise BadWheel(self.path, "size", f"RECORD says {row.size} B, it holds {info.file_size:,} B",
                               info.filename)
        return Member(info, RecordRow(info.filename, f"sha256={ours}", str(info.file_size)), raw.hexdigest())

    def _check_metadata(self) -> None:
        metadata = self.read(f"{self.dist_info}/METADATA", "metadata")
        stated_name, stated = core_metadata(metadata)
        if not same_distribution(stated_name, self.name) or stated is None or not same_version(stated, self.version):
            raise BadWheel(self.path, "metadata", f"METADATA says {stated_name} {stated}, the file name "
                           f"{self.name} {self.version}", f"{self.dist_info}/METADATA")
        wheel = BytesHeaderParser().parsebytes(self.read(f"{self.dist_info}/WHEEL", "metadata")).get("Wheel-Version")
        wheel = wheel.strip() if wheel else None
        if wheel is None or wheel.split(".")[0] != "1":
            raise BadWheel(self.path, "metadata", f"Wheel-Version {wheel}: pip installs 1.x only",
                           f"{self.dist_info}/WHEEL")

    # -- use: reads and copies, each held against the verified bytes

    def close(self) -> None:
        self._fp.close()

    def read(self, name: str, kind: str = "member") -> bytes:
        """A member's bytes whole (a file the planner reads, METADATA), within `kind`'s limit."""
        member = self.members.get(name)
        if member is None:
            raise BadWheel(self.path, "missing" if not name.startswith(self.dist_info) else "metadata",
                           "no such file in the wheel", name)
        if member.info.file_size > limit_of(kind):
            raise InputTooLarge(f"{self.path}, member {name}", kind, limit_of(kind), member.info.file_size)
        data = b"".join(self._inflate(member.info))
        if f"sha256={_b64(hashlib.sha256(data).digest())}" != member.row.hash:
            raise BadWheel(self.path, "changed", "read back other bytes than were verified", name)
        return data

    def copy(self, writer: RawWriter, name: str, new_name: str) -> RecordRow:
        """Member `name` into `writer` as `new_name`, compressed bytes as they are; its RECORD row."""
        member = self.members[name]
        try:
            written = writer.copy_raw(member.info, raw_chunks(self._fp, member.info), name=new_name)
        except zipfile.BadZipFile as error:  # a write error is the output's, not the wheel's: it goes up
            raise BadWheel(self.path, "changed", f"could not be read again ({error})", name) from None
        if written != member.raw_sha256:
            raise BadWheel(self.path, "changed", "its compressed bytes changed since they were verified", name)
        return RecordRow(new_name, member.row.hash, member.row.size)


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _tee(chunks: Iterator[bytes], digest: hashlib._Hash | None) -> Iterator[bytes]:
    for chunk in chunks:
        if digest is not None:
            digest.update(chunk)
        yield chunk


def verify_wheel(path: Path) -> VerifiedWheel:
    """`path` verified whole (see the module's docstring), its file left open for the caller to `close()`:
    later reads are of the same file even if the name is replaced meanwhile."""
    fp = open_regular(path, "archive")
    try:
        return VerifiedWheel(Path(path), fp)
    except OSError as error:  # the disk's, not the wheel's (zip reads are caught as damage above)
        fp.close()
        raise UnreadableFile(str(path), error.strerror or str(error), error.errno) from None
    except BaseException:
        fp.close()
        raise


@contextlib.contextmanager
def open_wheel(path: Path) -> Iterator[VerifiedWheel]:
    """`verify_wheel`, closed at the end of the block."""
    wheel = verify_wheel(path)
    try:
        yield wheel
    finally:
        wheel.close()
