"""What the wheel tests read of a wheel from outside patchkit's writer (zipfile, csv, hashlib), and the
per-test cache a real release wheel is linked into."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import zipfile
from pathlib import Path


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_of(members: dict[str, bytes], dist_info: str) -> bytes:
    """The RECORD of these members as setuptools writes one: a row each with its sha256 and size, then
    RECORD's own row without either."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name, data in members.items():
        writer.writerow([name, record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    return out.getvalue().encode()


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every member's CRC
        return {info.filename: archive.read(info) for info in archive.infolist()}


def assert_record_matches(files: dict[str, bytes], dist_info: str) -> list[list[str]]:
    """Every member listed in RECORD exactly once, each with its own sha256 and size (RECORD itself
    without either); the rows."""
    rows = list(csv.reader(io.StringIO(files[f"{dist_info}/RECORD"].decode())))
    assert sorted(r[0] for r in rows) == sorted(files), "RECORD lists every member exactly once"
    for name, algorithm_hash, size in rows:
        if name == f"{dist_info}/RECORD":
            assert (algorithm_hash, size) == ("", "")
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=").decode()
        assert (algorithm_hash, size) == (f"sha256={digest}", str(len(files[name]))), name
    return rows


def cache_release_wheel(real_wheel: Path, cache: Path, arch: str = "aarch64") -> None:
    """The real release wheel (and the record patchkit kept beside it when its sha256 matched the index's)
    in a patchkit cache of the test's own, linked where the file system allows."""
    downloads = cache / "wheels" / arch / "downloads"
    downloads.mkdir(parents=True)
    try:
        os.link(real_wheel, downloads / real_wheel.name)
    except OSError:
        shutil.copy(real_wheel, downloads)
    version = real_wheel.name.split("-")[1]
    shutil.copy(real_wheel.parent / f"vllm-{version}.json", downloads)
