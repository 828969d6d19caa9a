"""sources.tarscan against tarfile, the reference reader: the same members, kinds and bodies, on archives
Python's tarfile writes (ustar, PAX and GNU formats, long names, links, directories) and on the real vLLM
0.33.0 sdist; damage is refused."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patchkit.inflate import open_gzip
from patchkit.sources.tarscan import TarError, scan
from registry import vllm_sdist

segment = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x17F, blacklist_characters="/\\"),
                  min_size=1, max_size=60)
member = st.tuples(st.lists(segment, min_size=1, max_size=5).map("/".join),
                   st.sampled_from(["file", "dir", "symlink", "hardlink"]), st.binary(max_size=3000))


def make(members, fmt) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
            info.linkname = "target" if kind != "dir" else ""
            tar.addfile(info)
    return raw.getvalue()


def reference(data: bytes):
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            kind = "file" if m.isreg() else "dir" if m.isdir() else "link" if m.issym() or m.islnk() else "other"
            out.append((m.name.removeprefix("./").rstrip("/"), kind,
                        tar.extractfile(m).read() if m.isreg() else None))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(member, max_size=12), st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_scan_reads_what_tarfile_reads(members, fmt):
    try:
        data = make(members, fmt)
    except ValueError:  # a name ustar cannot store: tarfile refuses to write it
        return
    assert list(scan(io.BytesIO(data), lambda n, k, s: True)) == reference(data)
    skipped = list(scan(io.BytesIO(data), lambda n, k, s: False))
    assert [(n, k) for n, k, _ in skipped] == [(n, k) for n, k, _ in reference(data)]
    assert all(body is None for _, _, body in skipped)


def test_scan_of_the_real_vllm_sdist_matches_tarfile():
    path = vllm_sdist()
    wanted = lambda name, kind, size: name in ("vllm-0.33.0/vllm/envs.py", "vllm-0.33.0/PKG-INFO")  # noqa: E731
    with open_gzip(path) as stream:
        mine = list(scan(stream, wanted))
    with gzip.open(path) as stream:
        ref = reference(stream.read())
    assert [(n, k) for n, k, _ in mine] == [(n, k) for n, k, _ in ref]
    bodies = {n: b for n, _, b in mine if b is not None}
    assert set(bodies) == {"vllm-0.33.0/vllm/envs.py", "vllm-0.33.0/PKG-INFO"}
    assert bodies == {n: b for n, _, b in ref if n in bodies}


@pytest.mark.parametrize("damage", ["truncated", "garbage-after-end"])
def test_damaged_archives_are_refused(damage):
    data = make([("a/b.py", "file", b"x" * 2000), ("a/c.py", "file", b"y")], tarfile.PAX_FORMAT)
    data = data[:1500] if damage == "truncated" else data + b"junk" + bytes(508)
    with pytest.raises(TarError):
        list(scan(io.BytesIO(data), lambda n, k, s: True))
