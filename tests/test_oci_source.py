"""ImageLayersSource: the merged view of a base image's layers, read without unpacking the image."""

import pytest

from patchkit.oci.base import WrongPlatform, open_base
from patchkit.oci.media import Platform
from patchkit.oci.verified import BlobMismatch
from patchkit.sources.base import InvalidSourcePath, NotARegularMember
from patchkit.sources.image_files import PackageRoot
from patchkit.sources.image_layers import ImageLayersSource
from patchkit.sources.installed_version import VersionsDisagree, VersionUnconfirmed
from patchkit.untrusted import InputTooLarge
from registry import raw_layer, small_layout, tar_gz

SITE = "usr/lib/python3.12/site-packages"
ARM64 = Platform.parse("linux/arm64")


def source(tmp_path, layers, declared="1.2.3", required=True):
    small_layout(tmp_path / "img", layers)
    base = open_base(str(tmp_path / "img"), ARM64, cache=tmp_path / "cache")
    return ImageLayersSource(base, [PackageRoot("vllm", f"/{SITE}/vllm", "vllm", declared, required)])


def meta(version="1.2.3"):
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\nbody\n".encode()


def test_top_most_layer_wins_and_lower_layers_are_not_read(tmp_path):
    bottom = tar_gz({"etc/os-release": b"x", f"{SITE}/vllm/a.py": b"old\n"})
    middle = tar_gz({f"{SITE}/vllm/a.py": b"new\n", f"{SITE}/vllm/b.py": b"b\n",
                     f"{SITE}/vllm-1.2.3.dist-info/METADATA": meta()})
    top = tar_gz({"etc/motd": b"hi"})
    src = source(tmp_path, [bottom, middle, top])
    src.prefetch([("vllm", "a.py"), ("vllm", "b.py")])
    assert src.read("vllm", "a.py") == b"new\n"
    assert src.read("vllm", "b.py") == b"b\n"
    assert src.versions() == {"vllm": "1.2.3"}
    assert src.layers_read == [src.base.layers[2]["digest"], src.base.layers[1]["digest"]]
    # proving a file absent needs every layer
    assert src.read("vllm", "missing.py") is None
    assert len(src.layers_read) == 3


def test_the_install_layers_record_bounds_how_far_down_an_absent_file_is_looked_for(tmp_path):
    """pip's RECORD lists every file of an install: a path it does not list, absent from the install layer
    and above, is absent; the layers below (the OS, CUDA and torch gigabytes of a real base) are not read.
    A path RECORD lists but the install layer lacks is looked for further down (fail closed)."""
    bottom = tar_gz({"etc/os-release": b"x", f"{SITE}/vllm/stray.py": b"from an older install\n"})
    record = b"vllm/__init__.py,sha256=x,1\nvllm/a.py,,\nvllm/stray.py,,\nvllm-1.2.3.dist-info/RECORD,,\n"
    install = tar_gz({f"{SITE}/vllm/__init__.py": b"\n", f"{SITE}/vllm/a.py": b"a\n",
                      f"{SITE}/vllm-1.2.3.dist-info/METADATA": meta(),
                      f"{SITE}/vllm-1.2.3.dist-info/RECORD": record})
    top = tar_gz({"etc/motd": b"hi"})
    src = source(tmp_path, [bottom, install, top])
    assert src.read("vllm", "a.py") == b"a\n"
    assert src.read("vllm", "missing.py") is None
    assert src.versions() == {"vllm": "1.2.3"}
    assert len(src.layers_read) == 2, "the layer below the install was not needed"
    assert src.read("vllm", "stray.py") == b"from an older install\n"  # listed, so looked for below
    assert len(src.layers_read) == 3


def test_a_record_removed_by_an_upper_layer_bounds_nothing(tmp_path):
    bottom = tar_gz({f"{SITE}/vllm/old.py": b"old\n"})
    install = tar_gz({f"{SITE}/vllm/__init__.py": b"\n", f"{SITE}/vllm-1.2.3.dist-info/METADATA": meta(),
                      f"{SITE}/vllm-1.2.3.dist-info/RECORD": b"vllm/__init__.py,,\n"})
    top = raw_layer([(f"{SITE}/.wh.vllm-1.2.3.dist-info", b""), (f"{SITE}/vllm-1.2.3.dist-info", None),
                     (f"{SITE}/vllm-1.2.3.dist-info/METADATA", meta())])
    src = source(tmp_path, [bottom, install, top])
    assert src.read("vllm", "old.py") == b"old\n"


def test_whiteouts_and_opaque_directories_hide_lower_files(tmp_path):
    bottom = tar_gz({f"{SITE}/vllm/a.py": b"a\n", f"{SITE}/vllm/sub/c.py": b"c\n", f"{SITE}/vllm/d.py": b"d\n",
                     f"{SITE}/vllm-1.2.3.dist-info/METADATA": meta()})
    top = raw_layer([(f"{SITE}/vllm/.wh.a.py", b""), (f"{SITE}/vllm/sub/.wh..wh..opq", b""),
                     (f"{SITE}/vllm/sub/e.py", b"e\n")])
    src = source(tmp_path, [bottom, top])
    assert src.read("vllm", "a.py") is None
    assert src.read("vllm", "sub/c.py") is None
    assert src.read("vllm", "sub/e.py") == b"e\n"
    assert src.read("vllm", "d.py") == b"d\n"


def test_a_whited_out_package_directory_hides_everything_below(tmp_path):
    bottom = tar_gz({f"{SITE}/vllm/a.py": b"a\n", f"{SITE}/vllm-1.2.3.dist-info/METADATA": meta()})
    top = raw_layer([(f"{SITE}/.wh.vllm", b"")])
    src = source(tmp_path, [bottom, top])
    assert src.read("vllm", "a.py") is None


def test_links_are_refused(tmp_path):
    layer = tar_gz({f"{SITE}/vllm-1.2.3.dist-info/METADATA": meta()}, symlinks={f"{SITE}/vllm/a.py": "/etc/passwd"})
    src = source(tmp_path, [layer])
    with pytest.raises(NotARegularMember) as info:
        src.read("vllm", "a.py")
    assert (info.value.member, info.value.found) == (f"/{SITE}/vllm/a.py", "a symlink")


def test_declared_version_is_checked_against_metadata(tmp_path):
    layer = tar_gz({f"{SITE}/vllm/a.py": b"a\n", f"{SITE}/vllm-0.33.0.dist-info/METADATA": meta("0.33.0")})
    src = source(tmp_path, [layer], declared="0.1.dev20051+g487ecf187")
    with pytest.raises(VersionsDisagree, match=r"declares vllm 0\.1\.dev20051\+g487ecf187 but the base") as info:
        src.versions()
    assert (info.value.distribution, info.value.metadata) == ("vllm", "0.33.0")


def test_undeclared_version_comes_from_metadata_and_is_required(tmp_path):
    layer = tar_gz({f"{SITE}/vllm/a.py": b"a\n", f"{SITE}/vllm-0.33.0.dist-info/METADATA": meta("0.33.0")})
    assert source(tmp_path / "1", [layer], declared=None).versions() == {"vllm": "0.33.0"}
    bare = tar_gz({f"{SITE}/vllm/a.py": b"a\n"})
    with pytest.raises(VersionUnconfirmed) as info:
        source(tmp_path / "2", [bare], declared=None).versions()
    assert (info.value.distribution, info.value.declared) == ("vllm", None)
    assert source(tmp_path / "3", [bare], declared=None, required=False).versions() == {}


def test_paths_outside_the_package_are_refused(tmp_path):
    src = source(tmp_path, [tar_gz({f"{SITE}/vllm/a.py": b"a\n"})])
    with pytest.raises(InvalidSourcePath) as info:
        src.read("vllm", "../../../../etc/passwd")
    assert (info.value.path, info.value.problem) == ("../../../../etc/passwd", "climbs-out")
    assert src.read("flashinfer", "x.py") is None


def test_a_corrupted_layer_blob_is_detected(tmp_path):
    good = tar_gz({f"{SITE}/vllm/a.py": b"a\n"})
    src = source(tmp_path, [good])
    path = src.base.layout.blob_path(src.base.layers[0]["digest"])
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    with pytest.raises(BlobMismatch, match="does not match its digest") as err:
        src.read("vllm", "a.py")
    assert err.value.problem == "digest" and err.value.digest == src.base.layers[0]["digest"]


def test_a_layer_blob_longer_than_its_descriptor_is_read_no_further(tmp_path):
    good = tar_gz({f"{SITE}/vllm/a.py": b"a\n"})
    src = source(tmp_path, [good])
    path = src.base.layout.blob_path(src.base.layers[0]["digest"])
    path.write_bytes(path.read_bytes() + b"\0" * (1 << 20))
    with pytest.raises(BlobMismatch) as err:
        src.read("vllm", "a.py")
    assert (err.value.problem, err.value.size) == ("longer", len(good[0]))


def test_a_member_past_the_member_limit_is_refused_unread(tmp_path, monkeypatch):
    src = source(tmp_path, [tar_gz({f"{SITE}/vllm/a.py": b"x" * 4096})])
    monkeypatch.setenv("PATCHKIT_LIMIT_MEMBER", "1000")
    with pytest.raises(InputTooLarge) as err:
        src.read("vllm", "a.py")
    assert (err.value.kind, err.value.size) == ("member", 4096)


def test_bytecode_of_a_module_is_what_its_interpreter_loads_and_what_the_layers_show(tmp_path):
    """The interpreter's three names (python3.12 in the path) whether or not a layer holds them, and every
    bytecode file of the module a layer read shows (another tag, a legacy pyc beside it); not a neighbour's."""
    folder = f"{SITE}/vllm/m"
    layer = tar_gz({f"{folder}/a.py": b"a\n", f"{folder}/__pycache__/a.cpython-312.pyc": b"pyc",
                    f"{folder}/__pycache__/a.cpython-311.pyc": b"pyc", f"{folder}/a.pyc": b"legacy",
                    f"{folder}/__pycache__/ab.cpython-312.pyc": b"other module"})
    src = source(tmp_path, [layer])
    src.read("vllm", "m/a.py")
    assert src.bytecode("vllm", "m/a.py") == sorted(
        [f"/{folder}/__pycache__/a.cpython-311.pyc", f"/{folder}/a.pyc",
         *(f"/{folder}/__pycache__/a.cpython-312{opt}.pyc" for opt in ("", ".opt-1", ".opt-2"))])


def test_a_base_for_another_platform_is_refused(tmp_path):
    small_layout(tmp_path / "img", [tar_gz({"a": b"1"})], arch="amd64")
    with pytest.raises(WrongPlatform, match="linux/amd64 image, not linux/arm64") as info:
        open_base(str(tmp_path / "img"), ARM64, cache=tmp_path / "cache")
    assert (info.value.wanted, info.value.found) == ("linux/arm64", "linux/amd64")
