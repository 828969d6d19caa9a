"""The deterministic layer writer and the streaming layer reader."""

import gzip
import hashlib
import io
import tarfile

import pytest

from patchkit.oci.layer import (
    MAX_EXTENDED_HEADER,
    Entry,
    ExtendedHeaderTooLarge,
    InvalidLayerEntry,
    UnreadableLayer,
    build_layer,
    iter_layer,
    normalize,
    whiteout_path,
)

ENTRIES = [
    Entry("/usr/lib/py/vllm", "dir", mode=0o755),
    Entry("/usr/lib/py/vllm/a.py", "file", b"x = 1\n", mode=0o644),
    Entry("/usr/lib/py/vllm-b/c.py", "file", b"y = 2\n", mode=0o600, uid=1000, gid=1000),
    Entry(whiteout_path("/usr/lib/py/vllm/__pycache__/a.cpython-312.pyc"), "whiteout"),
]


def test_same_entries_in_any_order_give_the_same_bytes():
    a = build_layer(ENTRIES, epoch=0)
    b = build_layer(list(reversed(ENTRIES)), epoch=0)
    assert a.blob == b.blob and a.digest == b.digest and a.diff_id == b.diff_id
    assert a.digest == "sha256:" + hashlib.sha256(a.blob).hexdigest()
    assert a.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(a.blob)).hexdigest()


def test_the_epoch_and_the_content_change_the_digest():
    base = build_layer(ENTRIES, epoch=0).digest
    assert build_layer(ENTRIES, epoch=1_700_000_000).digest != base
    changed = [*ENTRIES[:1], Entry("/usr/lib/py/vllm/a.py", "file", b"x = 2\n"), *ENTRIES[2:]]
    assert build_layer(changed, epoch=0).digest != base


def test_tar_headers_carry_nothing_that_varies():
    layer = build_layer(ENTRIES, epoch=1234)
    raw = layer.blob
    assert raw[:3] == b"\x1f\x8b\x08" and raw[3] & 0x08 == 0, "gzip must not store a file name"
    assert raw[4:8] == b"\0\0\0\0", "gzip mtime must be 0"
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    # parents before children, by path components ("vllm/" before "vllm-b/")
    assert names == ["usr/lib/py/vllm", "usr/lib/py/vllm/__pycache__/.wh.a.cpython-312.pyc",
                     "usr/lib/py/vllm/a.py", "usr/lib/py/vllm-b/c.py"]
    assert {m.mtime for m in members} == {1234}
    assert {m.uname for m in members} == {""} and {m.gname for m in members} == {""}
    assert [m.uid for m in members] == [0, 0, 0, 1000]
    assert members[3].mode == 0o600 and members[0].isdir()


@pytest.mark.parametrize("bad,path,problem", [
    ([Entry("/a/../b", "file", b"")], "/a/../b", "outside"),
    ([Entry("/", "dir")], "/", "outside"),
    ([Entry("/a", "file", b"1"), Entry("a", "file", b"2")], "a", "twice"),
    ([Entry("/a/b", "whiteout")], "a/b", "whiteout-name"),
    ([Entry("/a", "fifo")], "a", "kind"),
])
def test_bad_entries_are_refused(bad, path, problem):
    with pytest.raises(InvalidLayerEntry) as info:
        build_layer(bad, epoch=0)
    assert (info.value.path, info.value.problem) == (path, problem)


def test_normalize():
    assert normalize("./usr/x/") == "usr/x"
    assert normalize("/usr//a/./b") == "usr/a/b"
    assert normalize("/") == ""


def _tar(members, compress=True) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "elsewhere"
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return gzip.compress(raw.getvalue()) if compress else raw.getvalue()


@pytest.mark.parametrize("compress", [True, False])
def test_reader_classifies_whiteouts_and_opaque_dirs(compress):
    blob = _tar([("./etc/", "dir"), ("etc/.wh.gone", "file"), ("opt/app/.wh..wh..opq", "file"),
                 ("opt/app/x.py", "file"), ("bin/sh", "link")], compress)
    got = [(m.name, m.kind) for m, _, _ in iter_layer(io.BytesIO(blob), "test")]
    assert got == [("etc", "dir"), ("etc/gone", "whiteout"), ("opt/app", "opaque"), ("opt/app/x.py", "file"),
                   ("bin/sh", "symlink")]


def test_reader_reports_a_truncated_layer():
    blob = _tar([("a/b.py", "file")] * 50)
    with pytest.raises(UnreadableLayer) as info:
        list(iter_layer(io.BytesIO(blob[: len(blob) // 2]), "cut"))
    assert info.value.what == "cut" and str(info.value) == f"cannot read layer cut: {info.value.reason}"


def test_an_extended_header_claiming_more_than_a_real_one_needs_is_refused_before_it_is_read():
    """tarfile reads a PAX header whole before the member it describes; 2 MiB of it (gzip packs gigabytes
    of one into megabytes) is refused on the header's size, and a real long path still reads."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a")
        info.pax_headers, info.size = {"comment": "x" * (2 << 20)}, 1
        tar.addfile(info, io.BytesIO(b"1"))
    with pytest.raises(ExtendedHeaderTooLarge) as err:
        list(iter_layer(io.BytesIO(gzip.compress(raw.getvalue(), mtime=0)), "hostile"))
    assert err.value.what == "hostile" and err.value.size > MAX_EXTENDED_HEADER
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("d/" * 1000 + "f")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    assert [m.name for m, _, _ in iter_layer(io.BytesIO(raw.getvalue()), "long path")] == ["d/" * 1000 + "f"]
