"""Hostile release wheels (issue 22): `patchkit wheel build` and `wheel index` refuse every wheel pip would
not install, verify before copying, and leave nothing partial.

The wheels are copies of a small real vLLM wheel: the files the real series reads, the real METADATA and
WHEEL, taken from the vLLM installed in this environment (what `nox -s tests` installs), zipped with a
RECORD as setuptools writes it. Each attack is crafted in its test on a copy of that wheel. The real
series is applied to it, so a build that gets past verification writes a real patched wheel.
"""

from __future__ import annotations

import base64
import csv
import errno
import gc
import hashlib
import importlib.metadata
import io
import json
import os
import struct
import subprocess
import sys
import unicodedata
import warnings
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import write_patchset
from hostile import assert_refused, run_patchkit
from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson
from patchkit.patching import planner
from patchkit.patching.patchset import load_patchset
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.verified_wheel import BadWheel, open_wheel
from patchkit.untrusted import InputTooLarge
from patchkit.wheels import build as build_module
from patchkit.wheels.build import HasLocalLabel, NotAVllmWheel, NotOneHeader, WheelNotWritten, build_wheel
from patchkit.wheels.index import write_index
from patchkit.wheels.manifest import WheelManifest, installed_manifests
from test_sources import wheel_bytes
from wheel_files import record_hash, record_of

pytestmark = [pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[1]
PLATFORM_TAG = "cp38-abi3-manylinux_2_28_x86_64"


def write_zip(path: Path, entries: list[tuple[str, bytes, int]]) -> Path:
    """A zip of exactly these entries, in order (zipfile warns on a repeated name and writes it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with zipfile.ZipFile(path, "w") as archive:
            for name, data, method in entries:
                info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                archive.writestr(info, data, compress_type=method)
    return path


class Wheel:
    """A small real vLLM wheel's members, to be written as they are or with an attack added."""

    def __init__(self, version: str, members: dict[str, bytes]):
        self.version, self.members = version, dict(members)
        self.dist_info = f"vllm-{version}.dist-info"

    @property
    def filename(self) -> str:
        return f"vllm-{self.version}-{PLATFORM_TAG}.whl"

    def entries(self, *, record: bytes | None = None, extra: list[tuple[str, bytes, int]] = (),
                listed: bool = True) -> list[tuple[str, bytes, int]]:
        """The members (deflated), `extra` after them (listed in RECORD unless `listed` is False), RECORD last."""
        files = {**self.members, **({n: d for n, d, _ in extra} if listed else {})}
        rows = record if record is not None else record_of(files, self.dist_info)
        return ([(n, d, zipfile.ZIP_DEFLATED) for n, d in self.members.items()] + list(extra)
                + [(f"{self.dist_info}/RECORD", rows, zipfile.ZIP_DEFLATED)])

    def write(self, folder: Path, **kwargs) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return write_zip(folder / self.filename, self.entries(**kwargs))


def _files_the_series_reads(site: Path, series) -> list[str]:
    """The vllm files the planner reads for the real series on the installed vLLM (so the small wheel
    holds what a plan on the release wheel needs, whatever the patches of the day)."""
    from patchkit.sources.directory import DirectorySource

    source, read = DirectorySource(site), set()

    class Recording:
        description = source.description

        def versions(self):
            return source.versions()

        def read(self, package, path):
            read.add((package, path))
            return source.read(package, path)

        def read_many(self, package, paths):
            return {p: self.read(package, p) for p in paths}

    assert planner.plan(series, Recording()).ok
    return sorted(path for package, path in read if package == "vllm" and (site / "vllm" / path).is_file())


@pytest.fixture(scope="session")
def small(stock_vllm) -> Wheel:
    distribution = importlib.metadata.distribution("vllm")
    site = Path(distribution.locate_file(""))
    version = distribution.version
    series = load_patchset(REPO / "patches").series()
    names = ["__init__.py", "py.typed", *_files_the_series_reads(site, series)]
    members = {f"vllm/{n}": (site / "vllm" / n).read_bytes() for n in dict.fromkeys(names)
               if (site / "vllm" / n).is_file()}
    dist_info = Path(distribution._path)
    for name in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt"):
        if (dist_info / name).is_file():
            members[f"vllm-{version}.dist-info/{name}"] = (dist_info / name).read_bytes()
    assert len(members) >= 8, sorted(members)
    return Wheel(version, members)


@pytest.fixture
def series():
    return load_patchset(REPO / "patches").series()


def refused(path: Path, problem: str, member: str | None = None) -> BadWheel:
    with pytest.raises(BadWheel) as caught, open_wheel(path):
        pass
    assert caught.value.problem == problem, caught.value
    if member is not None:
        assert caught.value.member == member, caught.value
    assert str(path) in str(caught.value)
    return caught.value


def test_the_small_wheel_is_accepted_and_the_series_builds_from_it(small, series, tmp_path):
    """The baseline every attack below departs from: verified, built, and the build verifies in turn."""
    release = small.write(tmp_path / "release")
    with open_wheel(release) as wheel:
        assert set(wheel.members) == set(small.members) | {f"{small.dist_info}/RECORD"}
    built = build_wheel(release, series, "full", tmp_path / "out")
    with open_wheel(built.path) as wheel:  # the output passes the same checks as any release
        assert wheel.version == built.manifest.version
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [built.path.name]


# -- names pip would not install


@pytest.mark.parametrize(("name", "why"), [
    ("../../outside/SENTINEL", "'..'"),
    ("/etc/cron.d/evil", "absolute"),
    ("vllm\\..\\..\\evil.py", "backslash"),
    ("C:/Windows/evil.py", "drive letter"),
    ("vllm/./evil.py", "'.'"),
    ("vllm//evil.py", "empty"),
])
def test_unsafe_member_names_are_refused(small, tmp_path, name, why):
    path = small.write(tmp_path, extra=[(name, b"print('owned')\n", zipfile.ZIP_DEFLATED)])
    error = refused(path, "unsafe-name", name)
    assert why in error.detail


def test_a_nul_in_a_member_name_is_refused(small, tmp_path):
    """zipfile cuts a name at its NUL (`vllm/evil.py\\0.txt` reads as `vllm/evil.py`): the name in the
    archive, not zipfile's cut of it, is the one checked."""
    path = small.write(tmp_path, extra=[("vllm/evil.pyX.txt", b"x", zipfile.ZIP_DEFLATED)])
    data = path.read_bytes()
    assert data.count(b"evil.pyX.txt") == 2  # its local header and central directory entry (RECORD is deflated)
    path.write_bytes(data.replace(b"evil.pyX.txt", b"evil.py\x00.txt"))
    refused(path, "unsafe-name", "vllm/evil.py\x00.txt")


@pytest.mark.parametrize("twin", ["same", "nfd", "dir"])
def test_members_with_one_name_once_normalised_are_refused(small, tmp_path, twin):
    name = "vllm/caf\u00e9.py"
    other = {"same": name, "nfd": unicodedata.normalize("NFD", name), "dir": name + "/"}[twin]
    assert other != name or twin == "same"
    path = write_zip(tmp_path / small.filename, small.entries(extra=[(name, b"a = 1\n", zipfile.ZIP_DEFLATED),
                                                                     (other, b"" if twin == "dir" else b"a = 2\n",
                                                                      zipfile.ZIP_DEFLATED)]))
    refused(path, "duplicate")


def test_a_file_that_is_also_a_folder_is_refused(small, tmp_path):
    path = small.write(tmp_path, extra=[("vllm/envs.py/inner.py", b"x = 1\n", zipfile.ZIP_DEFLATED)])
    refused(path, "duplicate", "vllm/envs.py/inner.py")


# -- whose wheel it is


def test_a_dist_info_named_for_another_project_is_refused(small, tmp_path):
    members = {n.replace(small.dist_info, f"evil-{small.version}.dist-info"): d for n, d in small.members.items()}
    other = Wheel(small.version, members)
    other.dist_info = f"evil-{small.version}.dist-info"
    path = write_zip(tmp_path / small.filename, other.entries())
    error = refused(path, "dist-info")
    assert "evil" in error.detail


def test_a_second_dist_info_is_refused(small, tmp_path):
    path = small.write(tmp_path, extra=[("torch-2.9.0.dist-info/METADATA", b"Name: torch\nVersion: 2.9.0\n",
                                         zipfile.ZIP_DEFLATED)])
    refused(path, "dist-info")


def test_a_data_folder_of_another_version_is_refused(small, tmp_path):
    path = small.write(tmp_path, extra=[("vllm-9.9.9.data/scripts/vllm", b"#!python\n", zipfile.ZIP_DEFLATED)])
    refused(path, "dist-info")


@pytest.mark.parametrize(("header", "value"), [("Name", "evil"), ("Version", "9.9.9")])
def test_metadata_naming_another_project_or_version_is_refused(small, tmp_path, header, value):
    metadata = small.members[f"{small.dist_info}/METADATA"].decode()
    lines = [f"{header}: {value}" if line.startswith(f"{header}:") else line for line in metadata.split("\n")]
    other = Wheel(small.version, {**small.members, f"{small.dist_info}/METADATA": "\n".join(lines).encode()})
    refused(other.write(tmp_path), "metadata", f"{small.dist_info}/METADATA")


def test_a_wheel_without_a_wheel_file_is_refused(small, tmp_path):
    other = Wheel(small.version, {n: d for n, d in small.members.items() if n != f"{small.dist_info}/WHEEL"})
    refused(other.write(tmp_path), "metadata")


# -- RECORD


def _rows(small: Wheel) -> list[list[str]]:
    return list(csv.reader(io.StringIO(record_of(small.members, small.dist_info).decode())))


def _csv(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def test_a_lying_record_hash_is_refused_before_anything_is_written(small, series, tmp_path):
    rows = _rows(small)
    target = next(r for r in rows if r[0] == "vllm/envs.py")
    target[1] = record_hash(b"something else")
    path = small.write(tmp_path / "release", record=_csv(rows))
    refused(path, "hash", "vllm/envs.py")
    with pytest.raises(BadWheel):
        build_wheel(path, series, "full", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_record_size_that_lies_is_refused(small, tmp_path):
    rows = _rows(small)
    rows[0][2] = str(int(rows[0][2]) + 1)
    refused(small.write(tmp_path, record=_csv(rows)), "size", rows[0][0])


@pytest.mark.parametrize("attack", ["no-record", "two-fields", "md5", "no-size", "twice", "self-hashed",
                                    "not-utf8", "nul", "huge-field"])
def test_a_record_that_is_not_a_record_is_refused(small, tmp_path, attack):
    """(Python 3.11's csv reads a NUL as any other character: that RECORD then lists no vllm/__init__.py.)"""
    rows = _rows(small)
    if attack == "no-record":
        path = write_zip(tmp_path / small.filename, [(n, d, zipfile.ZIP_DEFLATED) for n, d in small.members.items()])
    else:
        if attack == "two-fields":
            rows[0] = rows[0][:2]
        elif attack == "md5":
            rows[0][1] = "md5=" + base64.urlsafe_b64encode(hashlib.md5(b"").digest()).rstrip(b"=").decode()
        elif attack == "no-size":
            rows[0][2] = ""
        elif attack == "twice":
            rows.append(rows[0])
        elif attack == "self-hashed":
            rows[-1][1:] = [record_hash(b""), "0"]
        text = _csv(rows)
        if attack == "not-utf8":
            text += b"\xff\xfe,,\n"
        elif attack == "nul":
            text = text.replace(b"vllm/", b"vllm\x00/", 1)
        elif attack == "huge-field":  # csv.field_size_limit(): a field over 131,072 characters is csv.Error
            text += b'"' + b"a" * 131_073 + b'",sha256=x,1\n'
        path = small.write(tmp_path, record=text)
    refused(path, "unlisted" if attack == "nul" else "record")


def test_a_member_record_does_not_list_is_refused(small, tmp_path):
    path = small.write(tmp_path, extra=[("vllm/backdoor.py", b"import os\n", zipfile.ZIP_DEFLATED)], listed=False)
    refused(path, "unlisted", "vllm/backdoor.py")


def test_a_record_row_for_no_member_is_refused(small, tmp_path):
    rows = _rows(small)
    rows.insert(0, ["../../../bin/vllm", record_hash(b"x"), "1"])
    refused(small.write(tmp_path, record=_csv(rows)), "missing", "../../../bin/vllm")


# -- compression, encryption, bombs


def _patch_member(path: Path, name: str, *, method: int | None = None, flags: int | None = None,
                  size: int | None = None) -> None:
    """Rewrite the compression method, flag bits or uncompressed size of one member in both its local
    header and its central directory entry, the rest of the archive as it is."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    local = info.header_offset
    central = data.find(b"PK\x01\x02" + data[local + 4:local + 6])  # by version-needed, then by name
    while data[central + 46:central + 46 + len(name.encode())] != name.encode():
        central = data.find(b"PK\x01\x02", central + 4)
    for header, flags_at, method_at, size_at in ((local, 6, 8, 22), (central, 8, 10, 24)):
        if flags is not None:
            data[header + flags_at:header + flags_at + 2] = struct.pack("<H", flags)
        if method is not None:
            data[header + method_at:header + method_at + 2] = struct.pack("<H", method)
        if size is not None:
            data[header + size_at:header + size_at + 4] = struct.pack("<I", size)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("method", "flags", "problem"), [(99, None, "compression"), (None, 0x1, "compression"),
                                                         (None, 0x40, "compression")])
def test_unknown_methods_and_encryption_are_refused(small, tmp_path, method, flags, problem):
    path = small.write(tmp_path)
    _patch_member(path, "vllm/envs.py", method=method, flags=flags)
    refused(path, problem, "vllm/envs.py")


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_corrupt_compressed_data_is_refused(small, tmp_path, method):
    data = b"".join(b"line %d of a python file\n" % i for i in range(20_000))
    path = small.write(tmp_path, extra=[("vllm/big.py", data, method)])
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("vllm/big.py")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2
    raw[start:start + 16] = bytes(16)
    path.write_bytes(bytes(raw))
    refused(path, "corrupt", "vllm/big.py")


def test_every_method_zipfile_reads_is_accepted(small, tmp_path):
    data = b"".join(b"line %d\n" % i for i in range(50_000))
    extra = [(f"vllm/m{method}.py", data, method) for method in (0, 8, 12, 14)]
    with open_wheel(small.write(tmp_path, extra=extra)) as wheel:
        assert all(wheel.read(name) == data for name, _, _ in extra)


def test_a_deflate_bomb_is_refused_before_it_is_inflated(small, tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_LIMIT_INFLATED", str(8 << 20))
    path = small.write(tmp_path, extra=[("vllm/bomb.py", bytes(64 << 20), zipfile.ZIP_DEFLATED)])
    assert path.stat().st_size < 1 << 20
    with pytest.raises(InputTooLarge) as caught, open_wheel(path):
        pass
    assert caught.value.kind == "inflated" and caught.value.size == 64 << 20


def test_a_bomb_declaring_a_small_size_is_cut_at_that_size(small, tmp_path):
    """A member that says it inflates to 1 KiB and inflates to 64 MiB: stopped at 1 KiB, never held."""
    path = small.write(tmp_path, extra=[("vllm/bomb.py", bytes(64 << 20), zipfile.ZIP_DEFLATED)])
    _patch_member(path, "vllm/bomb.py", size=1024)
    error = refused(path, "corrupt", "vllm/bomb.py")
    assert "past its declared 1,024 B" in error.detail


def test_a_record_past_the_metadata_limit_is_refused_unread(small, tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_LIMIT_METADATA", "4096")
    path = small.write(tmp_path, record=record_of(small.members, small.dist_info) + b"#" * 8192 + b"\n")
    with pytest.raises(InputTooLarge) as caught, open_wheel(path):
        pass
    assert caught.value.kind == "metadata"


def test_overlapping_members_are_refused(small, tmp_path):
    """A second central directory entry pointing at the first member's data (the overlapped-zip bomb)."""
    path = small.write(tmp_path)
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        start = archive.start_dir
    end = data.rfind(b"PK\x05\x06")
    first = data.find(b"PK\x01\x02", start)
    name_length, extra_length, comment_length = struct.unpack("<HHH", data[first + 28:first + 34])
    entry = bytearray(data[first:first + 46 + name_length + extra_length + comment_length])
    entry[46:46 + name_length] = b"Z" * name_length
    directory = data[start:end] + bytes(entry)
    record = bytearray(data[end:end + 22])
    count = struct.unpack("<H", record[10:12])[0] + 1
    record[8:12] = struct.pack("<HH", count, count)
    record[12:16] = struct.pack("<I", len(directory))
    path.write_bytes(data[:start] + directory + bytes(record))
    refused(path, "zip")


# -- nothing partial, nothing printed from a destructor


class FullDisk:
    """The real output file, whose writes fail with ENOSPC once `budget` bytes have gone through."""

    def __init__(self, real, budget: int):
        self._real, self._budget = real, budget

    def write(self, data):
        if self._budget < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._budget -= len(data)
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


@pytest.fixture
def unraisable(monkeypatch):
    """What destructors raised (zipfile's __del__ writing a central directory onto a closed file)."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


@pytest.mark.parametrize("budget", [0, 5000, "central-directory"])
def test_a_full_disk_leaves_nothing_behind(small, series, tmp_path, monkeypatch, unraisable, budget):
    release = small.write(tmp_path / "release")
    size = build_wheel(release, series, "full", tmp_path / "reference").path.stat().st_size
    limit = size - 200 if budget == "central-directory" else budget
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: (  # as localfiles.adjacent_tmp_file opens it
        FullDisk(real_fdopen(fd, mode, *a, **k), limit) if "w" in mode else real_fdopen(fd, mode, *a, **k)))
    out = tmp_path / "out"
    with pytest.raises(PatchkitError, match="No space left on device") as caught:
        build_wheel(release, series, "full", out)
    assert "nothing of it is left" in str(caught.value) and not isinstance(caught.value, BadWheel)
    gc.collect()
    assert not out.exists() and unraisable == []


@pytest.mark.parametrize("call", ["fsync", "replace"])
def test_a_failing_fsync_or_rename_leaves_nothing_behind(small, series, tmp_path, monkeypatch, unraisable, call):
    release = small.write(tmp_path / "release")
    out = tmp_path / "out"
    out.mkdir()

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, call, fail)  # in localfiles.adjacent_tmp_file
    with pytest.raises(PatchkitError, match="Input/output error"):
        build_wheel(release, series, "full", out)
    gc.collect()
    assert list(out.iterdir()) == [] and unraisable == []


def _tiny(tmp_path: Path, dist: str = "vllm", version: str = "0.33.0", package: str = "vllm") -> tuple[Path, list]:
    """HAND-WRITTEN: a release wheel as tests/test_sources.py's wheel_bytes writes one (three small vLLM
    files, METADATA, a WHEEL of Wheel-Version alone, RECORD) and a one-edit series that applies to it. The
    refusals that use it are about the wheel's project, version and headers or the output folder, none
    about vLLM's code: so they run where vLLM is not installed (the small real wheel needs it)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    release = tmp_path / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    release.write_bytes(wheel_bytes(dist, version, package=package))
    patches = write_patchset(tmp_path / "patches", {"longer": [
        {"file": "config/model.py", "action": "replace", "anchor": "    max_len = 4096\n", "text": "    max_len = 8192\n"}]})
    return release, load_patchset(patches).series()


def test_an_output_folder_that_is_a_file_is_refused(tmp_path):
    release, series = _tiny(tmp_path)
    (tmp_path / "out").write_bytes(b"a file")
    with pytest.raises(WheelNotWritten) as caught:
        build_wheel(release, series, "full", tmp_path / "out")
    assert (caught.value.target.parent, caught.value.output) == (tmp_path / "out", tmp_path / "out")
    assert caught.value.target.name.startswith("vllm-0.33.0+glm53.") and caught.value.reason == os.strerror(errno.EEXIST)
    assert (tmp_path / "out").read_bytes() == b"a file"


def test_a_wheel_of_another_project_or_a_local_version_or_without_one_generator_is_refused(tmp_path):
    other, series = _tiny(tmp_path / "other", "flashinfer-python", "0.7.2.post1", package="flashinfer")
    with pytest.raises(NotAVllmWheel) as caught:
        build_wheel(other, series, "full", tmp_path / "out")
    assert (caught.value.release, caught.value.name, caught.value.version) == (other, "flashinfer-python",
                                                                               "0.7.2.post1")
    local, series = _tiny(tmp_path / "local", version="0.33.0+cu130")
    with pytest.raises(HasLocalLabel) as caught:
        build_wheel(local, series, "full", tmp_path / "out")
    assert caught.value.version == "0.33.0+cu130"
    plain, series = _tiny(tmp_path / "plain")  # its WHEEL has no Generator header for the build to set
    with pytest.raises(NotOneHeader) as caught:
        build_wheel(plain, series, "full", tmp_path / "out")
    where = "vllm-0.33.0.dist-info/WHEEL"
    assert (caught.value.where, caught.value.field, caught.value.found) == (where, "Generator", 0)
    assert not (tmp_path / "out").exists()


def test_a_release_changed_while_copied_leaves_nothing_behind(small, series, tmp_path, monkeypatch, unraisable):
    """Verified, then a late member's bytes changed in place (same file, same size) before the copy: the
    copy's own hash of what it wrote differs from the verified one, and the partial output goes."""
    release = small.write(tmp_path / "release", extra=[("vllm/zz_last.bin", os.urandom(4096), zipfile.ZIP_STORED)])
    with zipfile.ZipFile(release) as archive:
        info = archive.getinfo("vllm/zz_last.bin")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 100

    def plan_then_tamper(*args, **kwargs):
        result = planner.plan(*args, **kwargs)
        with open(release, "r+b") as f:
            f.seek(at)
            f.write(b"\x00" * 16)
        return result

    monkeypatch.setattr(build_module, "plan", plan_then_tamper)
    out = tmp_path / "out"
    with pytest.raises(BadWheel) as caught:
        build_wheel(release, series, "full", out)
    assert caught.value.problem == "changed" and caught.value.member == "vllm/zz_last.bin"
    gc.collect()
    assert not out.exists() and unraisable == []


def test_a_full_tmpfs_leaves_nothing_behind(small, series, tmp_path):
    """The real ENOSPC: a 64 KiB tmpfs as the output folder (root only: mounting needs CAP_SYS_ADMIN)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): the injected ENOSPC cases cover this path")
    try:
        release = small.write(tmp_path / "release")
        assert release.stat().st_size > 64 << 10
        outcome = run_patchkit(*_cli_build(tmp_path / "cache", release, mount / "out"), env=_cache_env(tmp_path))
        assert_refused(outcome, "No space left on device", "nothing of it is left")
        assert list(mount.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# -- end to end: `patchkit wheel build` and `wheel index` in a fresh, bounded interpreter


def _cache_env(tmp_path: Path) -> dict[str, str]:
    # An index that refuses every connection: a cache miss is an error here, never a 336 MB download.
    return {"PATCHKIT_CACHE_DIR": str(tmp_path / "cache"), "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple"}


def _cli_build(cache: Path, release: Path, out: Path) -> list[str]:
    """Enter `release` into a patchkit cache as the downloaded x86_64 wheel of its version, through the
    cache's own entry point (as a download from the index would), and the command line that builds from
    it."""
    name, version = release.name.split("-")[:2]
    data = release.read_bytes()
    entries = ArchiveCache(cache / "wheels" / "x86_64")
    with entries.new_archive(name, version, release.name, f"https://example.invalid/{release.name}",
                             hashlib.sha256(data).hexdigest()) as out_file:
        out_file.write(data)
    return ["wheel", "build", "--vllm", version, "--platform", "x86_64", "--series", "full", "--output", str(out)]


ATTACKS = {
    "parent": dict(extra=[("../../outside/SENTINEL", b"owned\n", zipfile.ZIP_DEFLATED)]),
    "absolute": dict(extra=[("/etc/cron.d/evil", b"* * * * * root sh\n", zipfile.ZIP_DEFLATED)]),
    "unlisted": dict(extra=[("vllm/backdoor.py", b"import os\n", zipfile.ZIP_DEFLATED)], listed=False),
    "huge-record-field": dict(record=b'"' + b"a" * 200_000 + b'",sha256=x,1\n'),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_wheel_build_refuses_hostile_wheels_and_writes_nothing(small, tmp_path, attack):
    release = small.write(tmp_path / "release", **ATTACKS[attack])
    out = tmp_path / "out"
    outcome = run_patchkit(*_cli_build(tmp_path / "cache", release, out), env=_cache_env(tmp_path))
    assert_refused(outcome, release.name, "refused")
    assert not out.exists()
    assert not (tmp_path.parent / "outside").exists()


def test_wheel_build_refuses_a_lying_record_hash(small, tmp_path):
    rows = _rows(small)
    next(r for r in rows if r[0] == "vllm/envs.py")[1] = record_hash(b"not envs.py")
    release = small.write(tmp_path / "release", record=_csv(rows))
    out = tmp_path / "out"
    outcome = run_patchkit(*_cli_build(tmp_path / "cache", release, out), env=_cache_env(tmp_path))
    assert_refused(outcome, release.name, "vllm/envs.py", "RECORD says")
    assert not out.exists()


def test_wheel_build_refuses_a_bomb_under_the_memory_bound(small, tmp_path):
    """A 2 GiB member (2 MiB on disk) under hostile.py's 1.5 GiB address space: refused by its size."""
    release = small.write(tmp_path / "release")
    _add_deflated_zeros(release, "vllm/bomb.py", 2 << 30)
    out = tmp_path / "out"
    outcome = run_patchkit(*_cli_build(tmp_path / "cache", release, out),
                           env={**_cache_env(tmp_path), "PATCHKIT_LIMIT_INFLATED": str(1 << 30)})
    assert_refused(outcome, "vllm/bomb.py", "PATCHKIT_LIMIT_INFLATED")
    assert not out.exists()


def _add_deflated_zeros(path: Path, name: str, size: int) -> None:
    """Append a member of `size` zero bytes without deflating them all: one 1 MiB block deflated up to a
    full flush (which resets the stream's history) is the same bytes every time, so it is repeated."""
    compressor, block, crc = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(1 << 20), 0
    piece = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    for _ in range(size // len(block)):
        crc = zlib.crc32(block, crc)
    raw = piece * (size // len(block)) + compressor.flush()
    with zipfile.ZipFile(path, "a") as archive:
        info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.CRC, info.compress_size, info.file_size = crc, len(raw), size
        info.header_offset = archive.fp.tell()
        archive.fp.write(info.FileHeader(True))
        archive.fp.write(raw)
        archive.filelist.append(info)
        archive.NameToInfo[name] = info
        archive.start_dir = archive.fp.tell()
        archive._didModify = True


def test_wheel_index_refuses_a_bad_wheel_naming_it(small, tmp_path):
    wheels = tmp_path / "wheels"
    small.write(wheels)
    (wheels / "vllm-0.33.0+glm53.abc-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"PK\x03\x04 not a zip")
    outcome = run_patchkit("wheel", "index", str(wheels))
    assert_refused(outcome, "vllm-0.33.0+glm53.abc-cp38-abi3-manylinux_2_28_x86_64.whl", "not a readable zip")
    assert not (wheels / "simple").exists()


@pytest.mark.parametrize("name", ["garbage.whl", "vllm-not.a.version-py3-none-any.whl"])
def test_wheel_index_refuses_a_file_not_named_as_a_wheel(small, tmp_path, name):
    wheels = tmp_path / "wheels"
    release = small.write(wheels)
    release.rename(wheels / name)
    outcome = run_patchkit("wheel", "index", str(wheels))
    assert_refused(outcome, name, "not a wheel's file name")
    assert not (wheels / "simple").exists()


def test_wheel_index_refuses_a_wheel_of_another_name(small, tmp_path):
    wheels = tmp_path / "wheels"
    release = small.write(wheels)
    release.rename(wheels / release.name.replace("vllm-", "evil-"))
    outcome = run_patchkit("wheel", "index", str(wheels))
    assert_refused(outcome, "evil-", "dist-info")


def test_wheel_index_refuses_a_manifest_of_the_wrong_types(small, tmp_path):
    manifest = {"version": small.version, "series": "full", "series_hash": 7, "release": {}, "patches": []}
    other = Wheel(small.version, {**small.members, f"{small.dist_info}/patchkit.json": json.dumps(manifest).encode()})
    wheels = tmp_path / "wheels"
    other.write(wheels)
    outcome = run_patchkit("wheel", "index", str(wheels))
    assert_refused(outcome, other.filename, "patchkit.json", "$.series_hash")


@pytest.mark.parametrize(("text", "at"), [
    (b'{"version": "1", "series": "s", "series_hash": "h", "release": {"filename": "f"}, "patches": []}', "$.release"),
    (b'{"version": "1", "series": "s", "series_hash": "h", "release": {}, "patches": [{"id": 1}]}', "$.patches[0].id"),
    (b'["not", "an", "object"]', "$"),
    (b'{"version": ', "$"),
])
def test_an_installed_record_of_the_wrong_shape_is_refused(tmp_path, text, at):
    record = tmp_path / "vllm-1.dist-info" / "patchkit.json"
    record.parent.mkdir()
    record.write_bytes(text)
    with pytest.raises(MalformedJson) as caught:
        installed_manifests(tmp_path)
    assert (caught.value.what, caught.value.at) == (f"patched-wheel record {record}", at)


def test_the_built_manifest_reads_back(small, series, tmp_path):
    built = build_wheel(small.write(tmp_path / "release"), series, "full", tmp_path / "out")
    (indexed,) = write_index(tmp_path / "out", tmp_path / "index")
    assert indexed.manifest == built.manifest == WheelManifest.from_bytes(built.manifest.to_bytes())


# -- fuzz: the reader answers with a wheel or a PatchkitError, never another exception

_names = st.one_of(
    st.sampled_from(["vllm/a.py", "vllm/b/c.py", "vllm/", "../x", "/abs", "a\\b", "C:/x", "vllm//x", "vllm/./x",
                     "vllm/a.py/", "vllm-1.0.dist-info/extra", "other-1.0.dist-info/METADATA", "vllm-2.0.data/x"]),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
)
_entries = st.lists(st.tuples(_names, st.binary(max_size=300), st.sampled_from([0, 8, 12, 14])), max_size=6)
_row_mutations = st.lists(st.sampled_from(["drop", "hash", "size", "dup", "md5", "blank", "garbage"]), max_size=3)


@given(entries=_entries, mutations=_row_mutations, flips=st.lists(st.tuples(st.integers(0, 10**6),
                                                                           st.integers(0, 255)), max_size=3))
def test_fuzz_the_reader_gives_a_wheel_or_a_patchkit_error(tmp_path_factory, entries, mutations, flips):
    folder = tmp_path_factory.mktemp("fuzz")
    dist_info = "vllm-1.0.dist-info"
    members = {f"{dist_info}/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 1.0\n",
               f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fuzz\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [[n, record_hash(d), str(len(d))] for n, d, _ in entries] + [[n, record_hash(d), str(len(d))]
                                                                      for n, d in members.items()]
    for i, mutation in enumerate(mutations):
        if not rows:
            break
        row = rows[i % len(rows)]
        if mutation == "drop":
            rows.remove(row)
        elif mutation == "hash":
            row[1] = record_hash(b"other")
        elif mutation == "size":
            row[2] = "-1"
        elif mutation == "dup":
            rows.append(list(row))
        elif mutation == "md5":
            row[1] = "md5=AAAA"
        elif mutation == "blank":
            row[1:] = ["", ""]
        else:
            row[0] = "\x00" + row[0]
    rows.append([f"{dist_info}/RECORD", "", ""])
    path = folder / "vllm-1.0-py3-none-any.whl"
    write_zip(path, [(n, d, m) for n, d, m in entries] + [(n, d, 8) for n, d in members.items()]
              + [(f"{dist_info}/RECORD", _csv(rows), 8)])
    data = bytearray(path.read_bytes())
    for at, value in flips:
        data[at % len(data)] = value
    path.write_bytes(bytes(data))
    try:
        with open_wheel(path) as wheel:
            for name in wheel.members:
                wheel.read(name, "inflated")
    except PatchkitError:
        pass


@pytest.fixture(scope="session")
def small_bytes(small, tmp_path_factory) -> bytes:
    return small.write(tmp_path_factory.mktemp("small")).read_bytes()


@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_damaged_copies_of_the_real_wheel(small, small_bytes, tmp_path_factory, flips):
    """Bytes of the small real wheel overwritten anywhere (headers, deflate streams, the central
    directory): the wheel, or a PatchkitError; and whatever is accepted reads back as RECORD says."""
    data = bytearray(small_bytes)
    for where, value in flips:
        data[int(where * len(data))] = value
    path = tmp_path_factory.mktemp("damaged") / small.filename
    path.write_bytes(bytes(data))
    try:
        with open_wheel(path) as wheel:
            for name, member in wheel.members.items():
                assert record_hash(wheel.read(name, "inflated")) == member.row.hash
    except PatchkitError:
        pass


_fields = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@given(record=st.one_of(st.binary(max_size=400), st.lists(st.lists(_fields, max_size=4), max_size=6).map(_csv)))
def test_fuzz_record_texts(small, tmp_path_factory, record):
    path = small.write(tmp_path_factory.mktemp("record"), record=record)
    try:
        with open_wheel(path):
            pass
    except PatchkitError:
        pass
