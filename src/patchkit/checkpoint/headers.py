"""A checkpoint's safetensors shard headers, read without touching tensor data.

Shard headers are read only for the shards the verified index names (identity.py), and every tensor the
index lists must be in its shard (and nothing else).

Headers are parsed by hand, not through `safetensors.safe_open`: a header is an 8-byte little-endian
length and that much JSON, and reading exactly those bytes never touches tensor data. `safe_open`
mmaps the whole shard and refuses a file shorter than its offsets claim, which is exactly the
header-only dump (just the 8 + N bytes of each shard) that lets a user preflight a 200 GB checkpoint
they have not downloaded. The parse is as strict as the library's: offsets contiguous from 0, each
tensor's byte length equal to its dtype times its shape, no holes.
"""

from __future__ import annotations

import math
import os
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import msgspec

from patchkit.checkpoint.identity import VerifiedCheckpoint
from patchkit.checkpoint.shapes import TensorEntry
from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson, decode
from patchkit.untrusted import InputTooLarge, limit_of, open_regular

# Bits per element of every dtype safetensors 0.8 writes (F4 is e2m1, stored two to a byte).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4,
}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def scalar(self) -> bool:
        return math.prod(self.shape) == 1


@dataclass(frozen=True)
class ShardHeader:
    path: Path
    tensors: dict[str, TensorInfo]
    data_bytes: int
    header_only: bool  # the file holds the header and no tensor data (a header dump)


class InvalidShard(PatchkitError):
    """A safetensors shard that is absent or whose header does not describe its bytes (exit 2): the shard's
    `path`, the `problem` ("missing", "unreadable", "short", "truncated", "dtype", "offsets", "span", "layout"
    (a hole or overlap), "file-size", "index" (its tensors are not the index's)) and the `detail` that says
    what was expected and found."""

    def __init__(self, path: Path, problem: str, detail: str = ""):
        self.path, self.problem, self.detail = path, problem, detail
        super().__init__(f"shard {path} is missing" if problem == "missing" else f"{path}: {detail}")


class ShardDisagreesWithIndex(InvalidShard):
    """A shard whose tensors are not the ones the index maps to it (exit 2): the shard's `path`, the
    `missing` tensors the index lists and the `extra` ones it holds unlisted."""

    def __init__(self, path: Path, missing: list[str], extra: list[str]):
        self.missing, self.extra = missing, extra
        super().__init__(path, "index", f"disagrees with the index: {len(missing)} listed tensors missing "
                                        f"{missing[:3]}, {len(extra)} unlisted tensors present {extra[:3]}")


def _header_bytes(path: Path) -> tuple[int, bytes, int]:
    """(N, the N header bytes, the file's size): the 8-byte prefix is checked against the header limit and
    the file's own size before a byte of the header is read."""
    what = f"shard {path}"
    if not path.exists() and not path.is_symlink():
        raise InvalidShard(path, "missing")
    with open_regular(path, "safetensors-shard", what) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) != 8:
                raise InvalidShard(path, "short", "shorter than the 8-byte safetensors length prefix")
            (length,) = struct.unpack("<Q", prefix)
            limit = limit_of("safetensors-header")
            if length > limit:
                raise InputTooLarge(f"{path}: header length prefix", "safetensors-header", limit, length)
            if 8 + length > size:
                raise InvalidShard(path, "truncated", f"header truncated: the prefix says {length:,} B, the file "
                                                      f"holds {size - 8:,} after it")
            raw = fh.read(length)
        except OSError as exc:
            raise InvalidShard(path, "unreadable", f"cannot be read: {exc.strerror or exc}") from None
    if len(raw) != length:
        raise InvalidShard(path, "truncated", f"header truncated ({len(raw)} of {length} bytes)")
    return length, raw, size


def _entry(raw: msgspec.Raw, path: Path, name: str) -> TensorEntry:
    try:
        return decode(raw, TensorEntry, str(path))
    except MalformedJson as exc:
        what = "malformed entry" if exc.at == "$" else "invalid shape or offsets"
        raise MalformedJson(str(path), f"tensor {name!r} has a {what}: {exc.problem}", exc.at) from None


def read_header(path: Path) -> ShardHeader:
    """Parse one safetensors header (8 + N bytes read, nothing more) and validate its layout."""
    length, raw, size = _header_bytes(path)
    header = decode(raw, dict[str, msgspec.Raw], f"{path}: header")
    header.pop("__metadata__", None)
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, raw_entry in header.items():
        entry = _entry(raw_entry, path, name)
        dtype, shape, (begin, end) = entry.dtype, tuple(entry.shape), entry.data_offsets
        bits = DTYPE_BITS.get(dtype)
        if bits is None:
            raise InvalidShard(path, "dtype", f"tensor {name!r} has unknown dtype {dtype!r}")
        if begin > end:
            raise InvalidShard(path, "offsets", f"tensor {name!r} has an invalid shape or offsets: {begin} > {end}")
        nbytes = (math.prod(shape) * bits + 7) // 8
        if end - begin != nbytes:
            raise InvalidShard(path, "span", f"tensor {name!r} spans {end - begin} bytes but {dtype} {list(shape)} "
                                             f"needs {nbytes}")
        tensors[name] = TensorInfo(dtype, shape, nbytes)
        spans.append((begin, end, name))
    spans.sort()
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise InvalidShard(path, "layout",
                               f"tensor {name!r} starts at {begin}, expected {cursor} (hole or overlap)")
        cursor = end
    expected = 8 + length + cursor
    if size == expected:
        header_only = False
    elif size == 8 + length and cursor > 0:
        header_only = True
    else:
        raise InvalidShard(path, "file-size", f"file is {size} bytes; the header describes {expected} (or "
                                              f"{8 + length} for a header dump)")
    return ShardHeader(path, tensors, cursor, header_only)


def read_headers(checkpoint: VerifiedCheckpoint) -> dict[str, ShardHeader]:
    """Headers of every shard the verified index names, cross-checked against the index both ways."""
    by_shard: dict[str, set[str]] = defaultdict(set)
    for tensor, shard in checkpoint.index["weight_map"].items():
        by_shard[shard].add(tensor)
    headers = {}
    for shard in sorted(by_shard):
        header = read_header(checkpoint.root / shard)
        listed, present = by_shard[shard], set(header.tensors)
        if listed != present:
            missing, extra = sorted(listed - present), sorted(present - listed)
            raise ShardDisagreesWithIndex(header.path, missing, extra)
        headers[shard] = header
    return headers
