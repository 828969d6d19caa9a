"""A zip member's bytes in bounded pieces: the compressed bytes behind its local header, and those inflated.

What zipfile does not give: a member's compressed bytes as stored (a patched wheel copies the very bytes
that were verified, wheels.archive), and inflating in pieces of at most CHUNK bytes whatever the
compression ratio (a wheel is verified member by member, sources.verified_wheel).
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zipfile
import zlib
from collections.abc import Iterator
from typing import BinaryIO

CHUNK = 1 << 20  # members stream through in pieces this size: a 308 MB extension is never held whole
# The local file header (PKWARE APPNOTE.TXT 4.3.7; zipfile's structFileHeader, which typeshed does not
# declare): signature, two version bytes, flags, method, time, date, CRC-32, both sizes, name length,
# extra-field length.
LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_SIGNATURE, _FLAGS, _NAME_LENGTH, _EXTRA_LENGTH = 0, 3, 10, 11
METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
           zipfile.ZIP_LZMA: "LZMA"}


def raw_chunks(fp: BinaryIO, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """The compressed bytes of `info`'s member, as stored, a chunk at a time. The local header is checked
    as zipfile.open checks it (signature, the same name as the central directory's); `fp` is sought
    before every read, so zipfile may read the same file in between."""
    fp.seek(info.header_offset)
    fixed = fp.read(LOCAL_HEADER.size)
    if len(fixed) != LOCAL_HEADER.size:
        raise zipfile.BadZipFile(f"{info.orig_filename}: truncated local header at offset {info.header_offset}")
    header = LOCAL_HEADER.unpack(fixed)
    if header[_SIGNATURE] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"{info.orig_filename}: no local file header at offset {info.header_offset}")
    raw_name = fp.read(header[_NAME_LENGTH])
    utf8 = header[_FLAGS] & 0x800
    if raw_name.decode("utf-8" if utf8 else "cp437") != info.orig_filename:
        raise zipfile.BadZipFile(f"{info.orig_filename}: its local header names it {raw_name!r}")
    position = info.header_offset + LOCAL_HEADER.size + len(raw_name) + header[_EXTRA_LENGTH]
    left = info.compress_size
    while left:
        fp.seek(position)
        chunk = fp.read(min(CHUNK, left))
        if not chunk:
            raise zipfile.BadZipFile(f"{info.orig_filename}: truncated ({info.compress_size - left} of "
                                     f"{info.compress_size} compressed bytes)")
        position += len(chunk)
        left -= len(chunk)
        yield chunk


def inflate(chunks: Iterator[bytes], method: int) -> Iterator[bytes]:
    """Inflated pieces of at most CHUNK bytes each, whatever the ratio (a bzip2 stream of zeros inflates
    a million times over: unbounded `decompress` calls would hold all of it)."""
    if method == zipfile.ZIP_STORED:
        yield from chunks
        return
    if method == zipfile.ZIP_DEFLATED:
        inflater = zlib.decompressobj(-15)
        for chunk in chunks:
            data = chunk
            while data:
                yield inflater.decompress(data, CHUNK)
                data = inflater.unconsumed_tail
        while not inflater.eof and (piece := inflater.decompress(b"", CHUNK)):
            yield piece
        if not inflater.eof:
            raise zlib.error("the deflate stream ends early")
        return
    decompressor: bz2.BZ2Decompressor | lzma.LZMADecompressor
    if method == zipfile.ZIP_BZIP2:
        decompressor = bz2.BZ2Decompressor()
    else:
        chunks, decompressor = _lzma(chunks)
    for chunk in chunks:
        if decompressor.eof:
            break
        yield decompressor.decompress(chunk, CHUNK)
        while not decompressor.eof and not decompressor.needs_input:
            yield decompressor.decompress(b"", CHUNK)
    if not decompressor.eof:
        raise EOFError(f"the {METHODS[method]} stream ends early")


def _lzma(chunks: Iterator[bytes]) -> tuple[Iterator[bytes], lzma.LZMADecompressor]:
    """zip's LZMA: a 4-byte header (version, properties size), the LZMA1 properties, then raw LZMA1."""
    head = b""
    for chunk in chunks:
        head += chunk
        if len(head) >= 4 and len(head) >= 4 + struct.unpack("<H", head[2:4])[0]:
            break
    if len(head) < 4:
        raise EOFError("no LZMA header")
    size = struct.unpack("<H", head[2:4])[0]
    if len(head) < 4 + size:
        raise EOFError("a truncated LZMA header")
    # zipfile's LZMA reader uses this private lzma call too (not in typeshed): the only decoder of the properties
    filters = [lzma._decode_filter_properties(lzma.FILTER_LZMA1, head[4:4 + size])]  # type: ignore[attr-defined]
    rest = head[4 + size:]
    return _chain(rest, chunks), lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=filters)


def _chain(first: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from chunks
