"""Cache integrity: no byte from the cache reaches the planner unverified.

A cached sdist replaced in place by a same-size archive with altered source (a valid gzip, mtime put
back) is hashed, reported, removed and downloaded again; the planner sees the index's bytes. Hand-written
sdists on the local fake index of test_sources (nothing public is needed to show a cache check).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import test_sources
from patchkit.sources import open_source
from test_sources import VLLM_FILES, sha256

cache, index = test_sources.cache, test_sources.index  # the fixtures, by the names tests ask for


def stored_sdist(files: dict[str, bytes]) -> bytes:
    """An sdist whose gzip stores without compressing: same-length content gives a same-size archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=0) as archive:
        members = {"vllm-0.33.0/PKG-INFO": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n\n"}
        members |= {f"vllm-0.33.0/vllm/{name}": data for name, data in files.items()}
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_same_size_archive_altered_in_place_is_detected_removed_and_fetched_again(index, cache, capsys):
    body = stored_sdist(VLLM_FILES)
    index.add("vllm", "vllm-0.33.0.tar.gz", body)
    assert open_source("0.33.0", cache=cache, progress=False).read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    archive = cache.downloads / "vllm-0.33.0.tar.gz"
    record = json.loads((cache.downloads / "vllm-0.33.0.json").read_text())
    assert record["verified"]  # the download's own check stands for the file it wrote

    evil = stored_sdist(VLLM_FILES | {"config/model.py": VLLM_FILES["config/model.py"].replace(b"4096", b"6666")})
    assert len(evil) == len(body) and evil != body
    times = archive.stat()
    with archive.open("r+b") as f:  # same inode, same size, and the mtime put back: only ctime tells
        f.write(evil)
    os.utime(archive, ns=(times.st_atime_ns, times.st_mtime_ns))
    shutil.rmtree(cache.files.root)  # no member cache: the next read must come from an archive

    source = open_source("0.33.0", cache=cache, progress=False)
    assert source.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]  # the index's bytes
    err = capsys.readouterr().err
    assert f"{archive} does not match its recorded sha256" in err and sha256(evil) in err and sha256(body) in err
    assert index.file_requests() == ["/files/vllm-0.33.0.tar.gz"] * 2  # removed, then downloaded again
    assert archive.read_bytes() == body


def test_warm_lookup_trusts_the_stamp_of_the_file_it_verified(index, cache):
    body = stored_sdist(VLLM_FILES)
    index.add("vllm", "vllm-0.33.0.tar.gz", body)
    open_source("0.33.0", cache=cache, progress=False)
    first = cache.lookup("vllm", "0.33.0")
    stamp = json.loads((cache.downloads / "vllm-0.33.0.json").read_text())["verified"]
    assert cache.lookup("vllm", "0.33.0") == first
    assert json.loads((cache.downloads / "vllm-0.33.0.json").read_text())["verified"] == stamp
    link = cache.downloads.parent / "elsewhere.tar.gz"
    os.link(cache.downloads / "vllm-0.33.0.tar.gz", link)  # a new link changes the inode's ctime
    assert cache.lookup("vllm", "0.33.0") == first  # hashed again, still whole: re-stamped
    assert json.loads((cache.downloads / "vllm-0.33.0.json").read_text())["verified"] != stamp
