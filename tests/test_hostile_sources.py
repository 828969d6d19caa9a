"""Hostile archives and caches against patchkit.sources: each attack found on the tar scanner, the zip
reader, the index download and the member cache, crafted here byte by byte, must end in a result or a
clean refusal (exit 2, a PatchkitError with fields), never a hang, a MemoryError or an exit 3.

End to end through `patchkit check --source FILE` in a fresh interpreter under tests/hostile.py's
address-space limit (1.5 GiB) and timeout; in process for the cache and the index (the real HTTP index
of test_sources on 127.0.0.1); fuzzed with hypothesis over tar header fields and zip central directories.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import tarfile
import time
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_sources
from hostile import assert_refused, run_patchkit
from patchkit.errors import PatchkitError
from patchkit.sources import ArchiveCache, FileCache, SdistSource, WheelSource, open_source
from patchkit.sources.archives import UnsafeArchiveError
from patchkit.sources.cache import UnsafeFileName
from patchkit.sources.index import CHUNK, OversizedDownload
from patchkit.sources.tarscan import TarError, scan
from patchkit.untrusted import GiB, InputTooLarge, MiB
from test_sources import VLLM_FILES, sdist_bytes, sha256
from wheel_files import record_of

cache, index = test_sources.cache, test_sources.index  # the fixtures, by the names tests ask for

TOP = "vllm-0.33.0"
PKG_INFO = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n\n"
# A small wheel's members (a RECORD listing them is added where one is written): an attack on one of them
# gets past the RECORD check to the reader it is aimed at.
WHEEL_FILES = {"vllm/__init__.py": b"", "vllm/envs.py": b"x = 1\n" * 100,
               "vllm-0.33.0.dist-info/METADATA": b"Name: vllm\nVersion: 0.33.0\n",
               "vllm-0.33.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n"}


# --- raw tar, written by hand: the fields an attacker controls ------------------------------------


def header(name: bytes, size: bytes, flag: bytes = b"0") -> bytes:
    """One ustar header block with a valid checksum; `size` is the raw 12-byte field."""
    block = bytearray(512)
    block[0:len(name[:100])] = name[:100]
    block[100:108], block[108:116], block[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    block[124:136] = size.ljust(12, b"\0")[:12]
    block[136:148] = b"00000000000\0"
    block[156:157] = flag
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def octal(n: int) -> bytes:
    return b"%011o\0" % n


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def member(name: str, data: bytes) -> bytes:
    return header(name.encode(), octal(len(data))) + padded(data)


def pax(records: bytes) -> bytes:
    return header(b"././@PaxHeader", octal(len(records)), b"x") + padded(records)


def record(key: str, value: str) -> bytes:
    """One PAX record, its length counting its own digits."""
    body = f" {key}={value}\n".encode()
    length = len(body) + len(str(len(body)))
    length = len(body) + len(str(length))
    return str(length).encode() + body


def sdist_around(*hostile: bytes) -> bytes:
    """A minimal vLLM sdist (PKG-INFO, vllm/__init__.py) with `hostile` blocks after it, gzipped."""
    tar = member(f"{TOP}/PKG-INFO", PKG_INFO) + member(f"{TOP}/vllm/__init__.py", b"")
    return gzip.compress(tar + b"".join(hostile) + bytes(1024), compresslevel=1)


def check(tmp_path: Path, data: bytes, name: str = "vllm-0.33.0.tar.gz", **env: str):
    path = tmp_path / name
    path.write_bytes(data)
    return run_patchkit("check", "--source", str(path), env={"PATCHKIT_CACHE_DIR": str(tmp_path / "cache"), **env}), path


def test_the_helpers_write_what_tarfile_reads():
    """The hand-written blocks are real tar: tarfile reads the PAX path and the members back."""
    data = gzip.decompress(sdist_around(pax(record("path", f"{TOP}/vllm/long.py")), member("x", b"abc")))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = [m.name for m in tar]
    assert names == [f"{TOP}/PKG-INFO", f"{TOP}/vllm/__init__.py", f"{TOP}/vllm/long.py"]


# --- hangs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("records", [
    pytest.param(record("size", "-1536"), id="pax-size-negative"),
    pytest.param(b"0 ", id="pax-record-length-zero"),
    pytest.param(b"3 a\n", id="pax-record-shorter-than-its-field"),
    pytest.param(b"99 path=x\n", id="pax-record-past-the-header"),
    pytest.param(b"x path=y\n", id="pax-length-not-a-number"),
    pytest.param(b"7 path\n", id="pax-record-without-equals"),
    pytest.param(record("size", "0x10"), id="pax-size-not-decimal"),
])
def test_malformed_pax_is_refused_end_to_end(tmp_path, records):
    started = time.monotonic()
    outcome, path = check(tmp_path, sdist_around(pax(records), member(f"{TOP}/vllm/envs.py", b"x = 1\n")))
    assert_refused(outcome, str(path), "corrupt or truncated", "TarError")
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("size", [b"-0003000", b"0009", b"1_000", b"\xff" * 12, b"+17"],
                         ids=["negative", "not-octal", "underscore", "base-256-negative", "plus-sign"])
def test_a_size_field_that_is_not_a_size_is_refused(size):
    data = header(b"a.py", size) + bytes(2048)
    with pytest.raises(TarError, match=r"bad number field"):
        list(scan(io.BytesIO(data), lambda n, k, s: True))


def test_a_negative_pax_size_cannot_move_the_scanner_back():
    """The attack's exact archive: size=-1536 would point the scan three blocks back, at this header."""
    data = pax(record("size", "-1536")) + header(b"a.py", octal(0)) + bytes(1024)
    with pytest.raises(TarError, match=r"not a decimal number"):
        list(scan(io.BytesIO(data), lambda n, k, s: False))


# --- unbounded memory ------------------------------------------------------------------------------


def test_a_gnu_long_name_claiming_8_gib_is_refused_unread(tmp_path):
    claim = b"\x80" + (8 * GiB).to_bytes(11, "big")
    outcome, path = check(tmp_path, sdist_around(header(b"././@LongLink", claim, b"L"), bytes(4096)))
    assert_refused(outcome, str(path), "GNU long name", "8,589,934,592 B", "PATCHKIT_LIMIT_MEMBER")


def test_a_pax_header_past_the_member_limit_is_refused_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_LIMIT_MEMBER", str(4096))
    path = tmp_path / "vllm-0.33.0.tar.gz"
    records = record("comment", "x" * 5000)
    path.write_bytes(sdist_around(pax(records)))
    with pytest.raises(InputTooLarge) as err:
        SdistSource(path)
    assert (err.value.kind, err.value.limit, err.value.size) == ("member", 4096, len(records))
    assert str(path) in str(err.value)


def deflated_zeros(prefix: bytes, zeros: int, suffix: bytes) -> tuple[bytes, int]:
    """(raw deflate stream, CRC-32) of `prefix`, `zeros` zero bytes, `suffix`: a bomb, made without deflating
    every zero (after a full flush the compressor starts afresh, so each 64 MiB of zeros is the same bytes)."""
    squeeze, chunk = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(64 * MiB)
    head = squeeze.compress(prefix) + squeeze.flush(zlib.Z_FULL_FLUSH)
    piece = squeeze.compress(chunk) + squeeze.flush(zlib.Z_FULL_FLUSH)
    assert piece == squeeze.compress(chunk) + squeeze.flush(zlib.Z_FULL_FLUSH)
    count, rest = divmod(zeros, len(chunk))
    crc = zlib.crc32(prefix)
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    end = bytes(rest) + suffix
    return head + piece * count + squeeze.compress(end) + squeeze.flush(), zlib.crc32(end, crc)


def test_a_one_gib_member_the_patches_read_is_refused_and_never_held(tmp_path):
    """envs.py (a patch target) of 1 GiB: the old pass held it whole (2 GB peak, a MemoryError under the
    1.5 GiB bound); now the member limit refuses it by name. 1 MiB on disk."""
    head = gzip.decompress(sdist_around())[:-1024] + header(f"{TOP}/vllm/envs.py".encode(), octal(1 * GiB))
    stream, crc = deflated_zeros(head, 1 * GiB, bytes(1024))
    total = len(head) + 1 * GiB + 1024
    data = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + stream + struct.pack("<II", crc, total & 0xFFFFFFFF)
    outcome, path = check(tmp_path, data)
    assert_refused(outcome, f"{path}: {TOP}/vllm/envs.py", "1,073,741,824 B", "PATCHKIT_LIMIT_MEMBER")


def test_members_kept_for_later_are_bounded_and_read_again_when_asked(tmp_path, monkeypatch):
    """Speculative holding stops at the member limit; a member left out is read by a later pass."""
    monkeypatch.setenv("PATCHKIT_LIMIT_MEMBER", str(64 * 1024))
    files = {"__init__.py": b"", **{f"m{i}.py": bytes([65 + i]) * 20_000 for i in range(6)}}
    path = tmp_path / "vllm-0.33.0.tar.gz"
    path.write_bytes(sdist_bytes("vllm", "0.33.0", files))
    source = SdistSource(path)
    held = source._archive._held
    assert sum(map(len, held.values())) <= 64 * 1024 and len(held) < len(files) + 1
    assert source.read("vllm", "m5.py") == files["m5.py"]
    monkeypatch.setenv("PATCHKIT_LIMIT_MEMBER", str(10_000))
    with pytest.raises(InputTooLarge) as err:
        SdistSource(path).read("vllm", "m4.py")
    assert (err.value.kind, err.value.size) == ("member", 20_000)


def test_the_members_one_read_asks_for_are_bounded_together(tmp_path, monkeypatch):
    """Many targets each under the limit cannot add up past it: 40 KB twice under a 64 KiB limit."""
    monkeypatch.setenv("PATCHKIT_LIMIT_MEMBER", str(64 * 1024))
    files = {"__init__.py": b"", "a.py": b"a" * 40_000, "b.py": b"b" * 40_000}
    path = tmp_path / "vllm-0.33.0.tar.gz"
    path.write_bytes(sdist_bytes("vllm", "0.33.0", files))
    source = SdistSource(path)
    source._archive._held.clear()  # as if the pass had kept nothing: both come from one new pass
    with pytest.raises(InputTooLarge, match=r"with the members read before it") as err:
        source.read_many("vllm", ["a.py", "b.py"])
    assert (err.value.kind, err.value.size) == ("member", 40_000)


def test_an_inflated_tar_past_the_tar_limit_is_refused_even_in_zero_padding(tmp_path):
    """Zeros after the end-of-archive marker are read to check the gzip trailer: bounded like the rest."""
    stream, crc = deflated_zeros(gzip.decompress(sdist_around(member(f"{TOP}/vllm/envs.py", b"x\n"))), 128 * MiB, b"")
    total = len(gzip.decompress(sdist_around(member(f"{TOP}/vllm/envs.py", b"x\n")))) + 128 * MiB
    data = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + stream + struct.pack("<II", crc, total & 0xFFFFFFFF)
    outcome, path = check(tmp_path, data, PATCHKIT_LIMIT_TAR=str(64 * MiB))
    assert_refused(outcome, str(path), "the tar stream of the archive, inflated", "PATCHKIT_LIMIT_TAR")


def zip_of(entries: list[tuple[str, int, bytes, int, int]]) -> bytes:
    """A zip written by hand from (name, method, stored bytes, CRC-32, inflated size) entries."""
    out, central = bytearray(), bytearray()
    for name, method, data, crc, size in entries:
        raw, offset = name.encode(), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data), size, len(raw), 0)
        out += raw + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, len(data), size,
                               len(raw), 0, 0, 0, 0, 0o100644 << 16, offset) + raw
    return bytes(out + central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries),
                                             len(central), len(out), 0))


def stored(name: str, data: bytes) -> tuple[str, int, bytes, int, int]:
    return name, zipfile.ZIP_STORED, data, zlib.crc32(data), len(data)


def bomb_wheel(target: str, inflated: int) -> bytes:
    """A wheel whose `target` is a deflate bomb of `inflated` zero bytes, its sizes and CRC honest."""
    name = f"vllm-0.33.0.dist-info/{target}" if target == "METADATA" else f"vllm/{target}"
    entries = [stored("vllm/__init__.py", b"")]
    if target != "METADATA":
        entries.append(stored("vllm-0.33.0.dist-info/METADATA", b"Name: vllm\nVersion: 0.33.0\n"))
    bomb, crc = deflated_zeros(b"", inflated, b"")
    return zip_of([*entries, (name, zipfile.ZIP_DEFLATED, bomb, crc, inflated)])


@pytest.mark.parametrize("target, kind", [("METADATA", "metadata"), ("envs.py", "inflated")])
def test_a_deflate_bomb_in_a_wheel_is_refused_by_its_limit(tmp_path, target, kind):
    """2 GiB of zeros in 2 MB: read whole, it is a MemoryError under the 1.5 GiB bound. The declared sizes
    are held against the limits before anything is inflated: the dist-info's by `metadata`, the rest by
    `inflated` (here 1 GiB; 8 GiB by default, streamed while hashing, never held)."""
    data = bomb_wheel(target, 2 * GiB)
    assert len(data) < 4 * MiB
    outcome, path = check(tmp_path, data, "vllm-0.33.0-py3-none-any.whl", PATCHKIT_LIMIT_INFLATED=str(1 * GiB))
    assert_refused(outcome, str(path), target, "2,147,483,648 B", f"PATCHKIT_LIMIT_{kind.upper()}")


def zip_offsets(data: bytes) -> list[int]:
    starts, at = [], data.find(b"PK\x01\x02")
    while at != -1:
        starts.append(at)
        at = data.find(b"PK\x01\x02", at + 1)
    return starts


def test_a_central_directory_past_the_metadata_limit_is_refused_before_zipfile_reads_it(tmp_path):
    """zipfile makes an object per entry: 3 million empty entries in a 280 MB file would be 1.5 GB."""
    entries = [stored("vllm/__init__.py", b""), stored("vllm-0.33.0.dist-info/METADATA", b"Name: vllm\nVersion: 0.33.0\n")]
    data = zip_of(entries + [stored(f"vllm/m{i}.py", b"") for i in range(200)])
    outcome, path = check(tmp_path, data, "vllm-0.33.0-py3-none-any.whl", PATCHKIT_LIMIT_METADATA=str(4096))
    assert_refused(outcome, f"{path}: central directory", "PATCHKIT_LIMIT_METADATA")
    zip64 = io.BytesIO()
    with zipfile.ZipFile(zip64, "w") as archive:
        for i in range(200):
            archive.writestr(f"vllm/m{i}.py", b"")
    raw = bytearray(zip64.getvalue())
    end = raw.rindex(b"PK\x05\x06")  # the same, deferred to a zip64 end record, as zipfile writes one
    cd_size, cd_offset = struct.unpack_from("<II", raw, end + 12)
    record = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 200, 200, cd_size, cd_offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, end, 1)
    raw[end + 12:end + 16] = b"\xff\xff\xff\xff"
    raw = raw[:end] + record + locator + raw[end:]
    outcome, path = check(tmp_path, bytes(raw), "vllm-0.33.0-py3-none-any.whl", PATCHKIT_LIMIT_METADATA=str(4096))
    assert_refused(outcome, f"{path}: central directory", f"{cd_size:,} B")


# --- exit 3 for malformed input ----------------------------------------------------------------------


def zip_with(method: int, flags: int = 0, corrupt: bool = False) -> bytes:
    """A wheel whose vllm/envs.py is stored with `method` and `flags` (patched into both its headers)."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        for name, data in WHEEL_FILES.items():
            archive.writestr(name, data,
                             compress_type=zipfile.ZIP_LZMA if method == zipfile.ZIP_LZMA else zipfile.ZIP_STORED)
        archive.writestr("vllm-0.33.0.dist-info/RECORD", record_of(WHEEL_FILES, "vllm-0.33.0.dist-info"))
        local = archive.getinfo("vllm/envs.py").header_offset
    data = bytearray(raw.getvalue())
    central = zip_offsets(bytes(data))[list(WHEEL_FILES).index("vllm/envs.py")]
    struct.pack_into("<HH", data, local + 6, flags, method)
    struct.pack_into("<HH", data, central + 8, flags, method)
    if corrupt:  # the LZMA properties byte (lc/lp/pb) past its range: lzma refuses the stream
        data[local + 30 + len("vllm/envs.py") + 4] = 0xFF
    return bytes(data)


@pytest.mark.parametrize("data, needle", [
    pytest.param(zip_with(99), "compression method 99", id="unknown-method"),
    pytest.param(zip_with(0, flags=1), "encrypted: pip cannot read it", id="encrypted"),
    pytest.param(zip_with(zipfile.ZIP_LZMA, corrupt=True), "its LZMA data does not read back", id="corrupt-lzma"),
])
def test_wheel_members_that_cannot_be_read_are_refused(tmp_path, data, needle):
    outcome, path = check(tmp_path, data, "vllm-0.33.0-py3-none-any.whl")
    assert_refused(outcome, str(path), needle)


def gnu_tar(names: dict[bytes, bytes]) -> bytes:
    raw = b"".join(header(name, octal(len(data))) + padded(data) for name, data in names.items())
    return gzip.compress(raw + bytes(1024))


def test_a_non_utf8_top_level_directory_is_refused_from_a_file_and_from_the_index(tmp_path, index, cache):
    data = gnu_tar({b"vllm-\xff/PKG-INFO": PKG_INFO, b"vllm-\xff/vllm/__init__.py": b""})
    outcome, path = check(tmp_path, data)
    assert_refused(outcome, str(path), r"'vllm-\udcff/PKG-INFO'", "is not UTF-8")
    index.add("vllm", "vllm-0.33.0.tar.gz", data)
    with pytest.raises(UnsafeArchiveError) as err:
        open_source("0.33.0", cache=cache, progress=False)
    assert err.value.problem == "is not UTF-8"


# --- aliases and links -------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", [f"{TOP}/vllm/./envs.py", f"//{TOP}/vllm/envs.py", f"./{TOP}//vllm/envs.py"])
def test_an_aliased_second_copy_of_a_member_is_stored_twice(tmp_path, alias):
    data = sdist_around(member(f"{TOP}/vllm/envs.py", b"good = 1\n"), member(alias, b"evil = 1\n"))
    outcome, path = check(tmp_path, data)
    assert_refused(outcome, "vllm/envs.py is stored twice", str(path))


def test_a_package_directory_that_is_a_symlink_is_refused(tmp_path):
    link = header(f"{TOP}/vllm".encode(), octal(0), b"2")
    link = link[:157] + b"/tmp/elsewhere".ljust(100, b"\0") + link[257:]
    block = bytearray(link)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    data = gzip.compress(member(f"{TOP}/PKG-INFO", PKG_INFO) + bytes(block)
                         + member(f"{TOP}/vllm/__init__.py", b"") + member(f"{TOP}/vllm/envs.py", b"x\n") + bytes(1024))
    outcome, path = check(tmp_path, data)
    assert_refused(outcome, str(path), f"lies under {TOP}/vllm, which the archive stores as a link")


def test_a_member_climbing_out_of_the_archive_is_refused(tmp_path):
    outcome, path = check(tmp_path, sdist_around(member(f"{TOP}/../evil.py", b"")))
    assert_refused(outcome, str(path), "climbs out of the archive")


# --- the index ---------------------------------------------------------------------------------------


def test_a_download_past_the_size_the_index_lists_is_stopped_there(index, cache):
    """The attack: the index lists 1,000 bytes, the server sends on (no Content-Length, then close)."""
    index.add("vllm", "vllm-0.33.0.tar.gz", sdist_bytes("vllm", "0.33.0") + bytes(16 * MiB))
    index.projects["vllm"][0]["size"] = 1000
    index.faults["vllm-0.33.0.tar.gz"] = "no-length"
    with pytest.raises(OversizedDownload) as err:
        open_source("0.33.0", cache=cache, progress=False)
    assert (err.value.expected, err.value.said_by) == (1000, "the index lists")
    assert 1000 < err.value.received <= 1000 + CHUNK  # stopped at the first chunk past it
    assert not list(cache.downloads.glob("*.tar.gz*"))  # nothing cached, no temporary left


def test_a_download_announced_longer_than_the_index_lists_is_not_read(index, cache):
    index.add("vllm", "vllm-0.33.0.tar.gz", sdist_bytes("vllm", "0.33.0") + bytes(4 * MiB))
    index.projects["vllm"][0]["size"] = 1000
    with pytest.raises(OversizedDownload) as err:
        open_source("0.33.0", cache=cache, progress=False)
    assert (err.value.received, err.value.announced) == (0, len(index.bodies["vllm-0.33.0.tar.gz"]))


def test_a_download_with_no_listed_size_is_bounded_by_its_content_length_and_the_limit(index, cache, monkeypatch):
    index.content_type = "text/html"  # PEP 503 lists no size
    index.add("vllm", "vllm-0.33.0.tar.gz", sdist_bytes("vllm", "0.33.0") + bytes(2 * MiB))
    monkeypatch.setenv("PATCHKIT_LIMIT_ARCHIVE", str(1 * MiB))
    with pytest.raises(InputTooLarge) as err:
        open_source("0.33.0", cache=cache, progress=False)
    assert (err.value.kind, err.value.size) == ("archive", len(index.bodies["vllm-0.33.0.tar.gz"]))
    index.faults["vllm-0.33.0.tar.gz"] = "no-length"  # nor a Content-Length: the limit stops it
    with pytest.raises(OversizedDownload) as err:
        open_source("0.33.0", cache=cache, progress=False)
    assert (err.value.expected, err.value.said_by) == (1 * MiB, "the archive limit allows")


def test_an_index_page_past_its_limit_is_refused(index, cache, monkeypatch):
    for i in range(200):
        index.add("vllm", f"vllm-0.{i}.0.tar.gz", b"x")
    monkeypatch.setenv("PATCHKIT_LIMIT_INDEX_PAGE", str(4096))
    with pytest.raises(InputTooLarge) as err:
        open_source("vllm==0.5.0", cache=cache, progress=False)
    assert (err.value.kind, err.value.limit) == ("index-page", 4096) and "/simple/vllm/" in err.value.what


# --- the cache: what a writer of the cache can and cannot make patchkit do ---------------------------


EVIL = b"class ModelConfig:\n    max_len = 6666\n"


def warm(index, cache) -> tuple[SdistSource, Path]:
    index.add("vllm", "vllm-0.33.0.tar.gz", sdist_bytes("vllm", "0.33.0", VLLM_FILES | {"evil.py": EVIL}))
    source = open_source("0.33.0", cache=cache, progress=False)
    assert source.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert source.read("vllm", "evil.py") == EVIL  # its blob is now in the cache too: a well-formed one
    (key,) = (cache.files.root / "archives").iterdir()
    return source, key


def ref_of(key: Path, member: str) -> Path:
    return key / "refs" / hashlib.sha256(member.encode()).hexdigest()


def read_model(cache) -> bytes:
    return open_source("0.33.0", cache=cache, progress=False).read("vllm", "config/model.py")


def test_cannot_repoint_a_member_at_another_well_formed_blob(index, cache):
    _, key = warm(index, cache)
    model, evil = ref_of(key, f"{TOP}/vllm/config/model.py"), ref_of(key, f"{TOP}/vllm/evil.py")
    digest, _, mac = evil.read_text().partition(" ")
    for forged in (f"{digest} {mac}", f"{digest} {TOP}/vllm/config/model.py", f"{digest} " + "0" * 64):
        model.write_text(forged)
        assert read_model(cache) == VLLM_FILES["config/model.py"]
    shutil.copy(evil, model)
    assert read_model(cache) == VLLM_FILES["config/model.py"]


def test_cannot_swap_a_blob_or_plant_one_under_a_digest(index, cache):
    warm(index, cache)
    digest = sha256(VLLM_FILES["config/model.py"])
    blob = cache.files.root / "blobs" / digest[:2] / digest
    blob.write_bytes(EVIL)
    assert read_model(cache) == VLLM_FILES["config/model.py"]
    assert blob.read_bytes() == VLLM_FILES["config/model.py"]  # the planted bytes were replaced
    blob.unlink()
    os.mkfifo(blob)  # a FIFO where a blob was: neither a hang nor a crash
    assert read_model(cache) == VLLM_FILES["config/model.py"]


def test_cannot_edit_or_copy_in_a_listing(index, cache):
    _, key = warm(index, cache)
    listing = json.loads((key / "members.json").read_text())
    listing[f"{TOP}/vllm/config/model.py"] = "dir"  # would make the file unreadable
    (key / "members.json").write_text(json.dumps(listing))
    assert read_model(cache) == VLLM_FILES["config/model.py"]
    assert json.loads((key / "members.json").read_text())[f"{TOP}/vllm/config/model.py"] == "file"  # rebuilt
    mac = (key / "members.mac").read_bytes()  # this listing's MAC over another listing
    (key / "members.json").write_text(json.dumps({f"{TOP}/PKG-INFO": "file", f"{TOP}/vllm/__init__.py": "file"}))
    (key / "members.mac").write_bytes(mac)
    assert read_model(cache) == VLLM_FILES["config/model.py"]
    cache.files.put_listing("another-archive", {f"{TOP}/PKG-INFO": "file", f"{TOP}/vllm/__init__.py": "file"})
    for name in ("members.json", "members.mac"):  # a listing valid for another archive, copied in whole
        shutil.copy(cache.files.root / "archives" / "another-archive" / name, key / name)
    assert read_model(cache) == VLLM_FILES["config/model.py"]


def test_cannot_substitute_the_archive_or_its_record(index, cache, capsys):
    warm(index, cache)
    shutil.rmtree(cache.files.root)
    evil = sdist_bytes("vllm", "0.33.0", VLLM_FILES | {"config/model.py": EVIL})
    archive, record_path = cache.downloads / "vllm-0.33.0.tar.gz", cache.downloads / "vllm-0.33.0.json"
    archive.write_bytes(evil)  # and a record of its own, every field consistent but the MAC
    record = json.loads(record_path.read_text())
    found = archive.stat()
    record |= {"sha256": sha256(evil), "size": len(evil),
               "verified": [found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns]}
    record_path.write_text(json.dumps(record))
    assert read_model(cache) == VLLM_FILES["config/model.py"]
    assert index.file_requests() == ["/files/vllm-0.33.0.tar.gz"] * 2  # not adopted: downloaded again


def test_a_cache_from_elsewhere_is_verified_before_use(index, cache, tmp_path):
    """A cache restored from another machine (another key): the archive is adopted only because it hashes
    as the index says now; its members are read from it again, not from the copied blobs."""
    warm(index, cache)
    digest = sha256(VLLM_FILES["config/model.py"])
    (cache.files.root / "blobs" / digest[:2] / digest).write_bytes(EVIL)  # would be caught anyway: swap it
    elsewhere = ArchiveCache(cache.root, secret=b"k" * 32)
    source = open_source("0.33.0", cache=elsewhere, progress=False)
    assert source.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert index.file_requests() == ["/files/vllm-0.33.0.tar.gz"]  # adopted, not downloaded again
    assert ArchiveCache(cache.root, secret=b"k" * 32).lookup("vllm", "0.33.0") is not None


def test_cache_entries_that_are_not_files_are_absent(index, cache):
    _, key = warm(index, cache)
    (key / "members.json").unlink()
    os.mkfifo(key / "members.json")
    ref = ref_of(key, f"{TOP}/vllm/config/model.py")
    ref.unlink()
    ref.symlink_to("/dev/zero")
    assert read_model(cache) == VLLM_FILES["config/model.py"]


def test_cannot_name_a_file_outside_the_cache(index, cache):
    warm(index, cache)
    record_path = cache.downloads / "vllm-0.33.0.json"
    record = json.loads(record_path.read_text())
    assert cache.lookup("vllm", "0.33.0") is not None
    with pytest.raises(UnsafeFileName, match=r"refusing archive file name '../../etc/passwd' from the index") as info:
        cache.adopt("vllm", "0.33.0", "../../etc/passwd", record["url"], record["sha256"])
    assert info.value.filename == "../../etc/passwd"


# --- fuzz: tar headers and zip central directories -----------------------------------------------------


numbers = st.one_of(
    st.integers(0, 1 << 40).map(octal),
    st.integers(-(1 << 20), -1).map(lambda n: str(n).encode()),
    st.integers(0, 1 << 90).map(lambda n: b"\x80" + (n % (1 << 88)).to_bytes(11, "big")),
    st.binary(min_size=0, max_size=12),
    st.just(b"\xff" * 12),
)
pax_records = st.lists(st.one_of(
    st.tuples(st.sampled_from(["path", "size", "linkpath", "comment"]), st.text(max_size=30)).map(lambda kv: record(*kv)),
    st.tuples(st.integers(-5, 200), st.binary(max_size=30)).map(lambda lb: str(lb[0]).encode() + b" " + lb[1]),
    st.sampled_from([b"0 ", b"1 ", b" ", b"\n", b"00000000000000000000000000 x=y\n"]),
), max_size=4).map(b"".join)
blocks = st.one_of(
    st.tuples(st.binary(min_size=1, max_size=100), numbers, st.sampled_from(list(b"0125 7xgLKS3")),
              st.binary(max_size=1500)).map(lambda t: header(t[0], t[1], bytes([t[2]])) + padded(t[3])),
    pax_records.map(pax),
    st.binary(max_size=1024),
)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(blocks, max_size=6), st.booleans())
def test_fuzzed_tar_headers_end_in_a_listing_or_a_refusal(tmp_path, parts, end):
    data = b"".join(parts) + (bytes(1024) if end else b"")
    try:
        for name, kind, _body in scan(io.BytesIO(data), lambda n, k, s: s < 1 << 20):
            assert isinstance(name, str) and kind in ("file", "dir", "link", "other")
    except (TarError, PatchkitError):
        pass
    path = tmp_path / "fuzz.tar.gz"
    path.write_bytes(gzip.compress(member(f"{TOP}/PKG-INFO", PKG_INFO) + member(f"{TOP}/vllm/__init__.py", b"")
                                   + data, compresslevel=1))
    try:
        SdistSource(path).read("vllm", "envs.py")
    except PatchkitError:
        pass


central_fields = st.sampled_from([(4, "H"), (6, "H"), (8, "H"), (10, "H"), (16, "I"), (20, "I"), (24, "I"),
                                  (28, "H"), (30, "H"), (32, "H"), (38, "I"), (42, "I")])


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), central_fields, st.integers(0, 1 << 32)), max_size=4),
       st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]))
def test_fuzzed_zip_central_directories_end_in_a_wheel_or_a_refusal(tmp_path, edits, method):
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", method) as archive:
        for name, data in WHEEL_FILES.items():
            archive.writestr(name, data)
        archive.writestr("vllm-0.33.0.dist-info/RECORD", record_of(WHEEL_FILES, "vllm-0.33.0.dist-info"))
    data = bytearray(raw.getvalue())
    entries = zip_offsets(bytes(data))
    for which, (offset, fmt), value in edits:
        at = entries[which % len(entries)] + offset
        struct.pack_into("<" + fmt, data, at, value % (1 << (8 * struct.calcsize(fmt))))
    path = tmp_path / "vllm-0.33.0-py3-none-any.whl"
    path.write_bytes(bytes(data))
    try:
        source = WheelSource(path)
    except PatchkitError:
        return
    assert source.read_many("vllm", ["envs.py", "__init__.py"]) == {  # verified: these bytes or a refusal
        "envs.py": WHEEL_FILES["vllm/envs.py"], "__init__.py": b""}


def test_a_file_cache_without_a_fixed_secret_uses_one_key_per_user(tmp_path, monkeypatch):
    """The key lives outside the cache root, is made once, and two caches share it."""
    monkeypatch.setenv("PATCHKIT_STATE_DIR", str(tmp_path / "state"))
    from patchkit.sources import cache as cache_module

    monkeypatch.setattr(cache_module, "_SECRETS", {})
    one, two = FileCache(tmp_path / "a"), FileCache(tmp_path / "b")
    one.put("k", "m", b"data")
    assert (tmp_path / "state" / "cache-key").stat().st_mode & 0o777 == 0o600
    shutil.copytree(tmp_path / "a", tmp_path / "b", dirs_exist_ok=True)
    assert two.get("k", "m") == b"data"  # same user, same key
    assert FileCache(tmp_path / "b", secret=b"z" * 32).get("k", "m") is None  # another key: not trusted



@pytest.mark.parametrize("name", ["vllm-0.33.0.tar.gz", "vllm-0.33.0-py3-none-any.whl"])
def test_an_archive_that_is_a_fifo_is_refused_unopened(tmp_path, name):
    os.mkfifo(tmp_path / name)
    outcome = run_patchkit("check", "--source", str(tmp_path / name), env={"PATCHKIT_CACHE_DIR": str(tmp_path / "c")})
    assert_refused(outcome, f"{tmp_path / name}: is a FIFO, not a regular file")
