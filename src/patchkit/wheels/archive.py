"""A reproducible zip: members copied from another zip without recompressing, or written afresh.

The stdlib's zipfile recompresses everything it writes and has no call that copies a member's
compressed bytes; recompressing vLLM's 336 MB wheel would cost tens of seconds and change the bytes of
its compiled extensions' deflate streams for nothing. So a member is copied raw: its compressed bytes
are read from behind its local header, and a fresh local header (fixed timestamp, same CRC, sizes and
method) is written before them through zipfile's own header encoder; zipfile then writes the central
directory as usual. Every entry gets the same timestamp and a mode made from its permission bits only,
so the archive's bytes depend on the contents and the order of the entries alone.

New members (the patched files, METADATA, RECORD: about 1 MB of a 336 MB wheel) are stored, not
deflated: deflate's output differs between zlib builds (zlib, zlib-ng, distribution patches), and the
same inputs must give the same wheel on any machine.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterator
from typing import BinaryIO

EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest zip (DOS) date: no clock or SOURCE_DATE_EPOCH in the bytes


def mode_of(info: zipfile.ZipInfo) -> int:
    """The permission bits a member carries (0o644 when the zip was made without Unix modes)."""
    return (info.external_attr >> 16) & 0o777 or 0o644


class ReproducibleZip:
    """Writes entries in the order given; the caller sorts them. Either `close()` (the central directory
    written) or `abort()` (nothing more written, the caller removes the file) ends it."""

    def __init__(self, out: BinaryIO):
        self._zip = zipfile.ZipFile(out, "w", allowZip64=True)

    def _info(self, name: str, mode: int, compress_type: int) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=EPOCH)
        info.create_system = 3  # Unix, so the mode below is read back on every OS
        info.external_attr = (0o100000 | (mode & 0o777)) << 16
        info.compress_type = compress_type
        return info

    def write(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """A new member, stored (see above)."""
        self._zip.writestr(self._info(name, mode, zipfile.ZIP_STORED), data)

    def copy_raw(self, source: zipfile.ZipInfo, raw: Iterator[bytes], name: str | None = None) -> str:
        """A member of another zip (renamed to `name` if given), its compressed bytes `raw` kept as they
        are; returns the sha256 of the bytes written, for the caller to hold against what it verified."""
        info = self._info(name or source.filename, mode_of(source), source.compress_type)
        info.CRC, info.compress_size, info.file_size = source.CRC, source.compress_size, source.file_size
        zip64 = max(info.file_size, info.compress_size) > zipfile.ZIP64_LIMIT
        archive, out = self._zip, self._zip.fp
        if out is None:
            raise ValueError("ReproducibleZip.copy_raw after close() or abort()")
        # What ZipFile.writestr does around its compressor, minus the compressor.
        info.header_offset = out.tell()
        out.write(info.FileHeader(zip64))
        digest = hashlib.sha256()
        for chunk in raw:
            digest.update(chunk)
            out.write(chunk)
        archive.filelist.append(info)
        archive.NameToInfo[info.filename] = info
        archive.start_dir = out.tell()
        return digest.hexdigest()

    def close(self) -> None:
        self._zip.close()

    def abort(self) -> None:
        """Stop without the central directory: zipfile would otherwise write it from `__del__`, onto a file
        already closed, and print a traceback nobody can act on."""
        # zipfile's private state (no public call closes without the central directory)
        self._zip._didModify = False  # type: ignore[attr-defined]
        self._zip._writing = False  # type: ignore[attr-defined]
        self._zip.close()
