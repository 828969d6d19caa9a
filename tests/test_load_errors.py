"""`patchkit load LAYOUT` on a layout that is not what it says: each fault is refused, typed and naming
the layout and the layer, before the engine is asked for anything (the engine here is a socket nobody
listens on: reaching it would fail as NoEngine instead). The layouts are small hand-made ones
(tests/bases.small_layout); what a real base's layout holds is exercised by tests/test_spark_host.py."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from bases import small_layout, tar_gz
from patchkit.images.load import BadLayer, BadLoadTag, NotALayout, load_layout

NOBODY = "unix:///nonexistent/patchkit-test.sock"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _load(layout: Path, tmp_path: Path, tag: str = "patchkit/test:load"):
    return load_layout(str(layout), tag=tag, engine_url=NOBODY, cache=tmp_path / "cache")


def _layout(tmp_path: Path, layers: list[tuple[bytes, str]], **kw) -> Path:
    dest = tmp_path / "layout"
    small_layout(dest, layers, **kw)
    return dest


GOOD = tar_gz({"etc/os-release": b"ID=debian\n"})
TAR = gzip.decompress(GOOD[0])
TRUNCATED = GOOD[0][: len(GOOD[0]) // 2]


@pytest.mark.parametrize("layers, media_type, problem", [
    ([(TAR, GOOD[1])], None, "is not gzip data"),
    ([(TRUNCATED, GOOD[1])], None, "ends inside its gzip stream"),
    ([(GOOD[0], _sha(b"another tar"))], None, f"uncompresses to {GOOD[1]}, not the diff_id {_sha(b'another tar')}"),
    ([GOOD], "application/vnd.oci.image.layer.v1.tar+zstd", "is application/vnd.oci.image.layer.v1.tar+zstd; gzip or plain tar"),
], ids=["plain tar called gzip", "truncated gzip", "another diff_id", "zstd"])
def test_a_layer_that_is_not_what_its_descriptor_says_is_refused_naming_it(layers, media_type, problem, tmp_path):
    layout = _layout(tmp_path, layers, **({"media_type": media_type} if media_type else {}))
    with pytest.raises(BadLayer) as err:
        _load(layout, tmp_path)
    assert err.value.spec == str(layout) and err.value.digest == _sha(layers[0][0])
    assert problem in err.value.problem, err.value.problem


def test_a_config_naming_another_number_of_layers_is_refused(tmp_path):
    layout = _layout(tmp_path, [GOOD])
    config_path = next(p for p in (layout / "blobs" / "sha256").iterdir() if b'"rootfs"' in p.read_bytes())
    config = json.loads(config_path.read_bytes())
    config["rootfs"]["diff_ids"].append(GOOD[1])
    data = json.dumps(config).encode()
    manifest_path = next(p for p in (layout / "blobs" / "sha256").iterdir() if b'"layers"' in p.read_bytes())
    manifest = json.loads(manifest_path.read_bytes())
    manifest["config"].update(digest=_sha(data), size=len(data))
    (layout / "blobs" / "sha256" / _sha(data)[7:]).write_bytes(data)
    mdata = json.dumps(manifest).encode()
    (layout / "blobs" / "sha256" / _sha(mdata)[7:]).write_bytes(mdata)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0].update(digest=_sha(mdata), size=len(mdata))
    (layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(BadLayer) as err:
        _load(layout, tmp_path)
    assert err.value.digest is None and "the config names 2 layers (rootfs.diff_ids), the manifest 1" in err.value.problem


def test_a_file_or_a_registry_reference_is_no_layout(tmp_path):
    (tmp_path / "image.tar").write_bytes(b"not a layout")
    for spec in (str(tmp_path / "image.tar"), "ghcr.io/owner/image:tag"):
        with pytest.raises(NotALayout) as err:
            load_layout(spec, tag="patchkit/test:load", engine_url=NOBODY, cache=tmp_path / "cache")
        assert err.value.spec == spec


@pytest.mark.parametrize("tag, problem", [
    ("patchkit/test@sha256:" + "0" * 64, "give NAME:TAG (no digest)"),
    ("Not A Tag", ""),
])
def test_a_tag_the_engine_cannot_name_an_image_by_is_refused_first(tag, problem, tmp_path):
    with pytest.raises(BadLoadTag) as err:
        _load(tmp_path / "missing-layout", tmp_path, tag=tag)
    assert err.value.tag == tag and problem in err.value.problem
