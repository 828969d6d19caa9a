"""Pure mutations (config, manifest, layout index) and the layout writer."""

import json

import pytest

from patchkit.oci.image import (
    InvalidBaseImage,
    epoch_timestamp,
    layout_index,
    merge_env,
    new_config,
    new_manifest,
)
from patchkit.oci.layer import Entry, build_layer
from patchkit.oci.layout import InvalidLayout, Layout, OutputTaken, write_layout
from patchkit.oci.media import (
    OCI_CONFIG,
    OCI_LAYER_GZIP,
    OCI_MANIFEST,
    Platform,
    canonical_json,
    sha256_digest,
)
from patchkit.oci.schema import PlatformSpec
from patchkit.oci.verified import BlobMismatch

LAYER = build_layer([Entry("/a.py", "file", b"x\n")], epoch=0)
BASE_CONFIG = {"architecture": "arm64", "os": "linux",
               "config": {"Env": ["PATH=/bin", "A=old"], "Labels": {"keep": "1"}},
               "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "1" * 64]},
               "history": [{"created_by": "base"}]}
BASE_MANIFEST = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                 "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "2" * 64, "size": 1},
                 "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                             "digest": "sha256:" + "3" * 64, "size": 10}],
                 "annotations": {"from.base": "x"}}


def test_merge_env_replaces_in_place_and_appends_in_order():
    assert merge_env(["PATH=/bin", "A=old"], {"B": "1", "A": "new"}) == ["PATH=/bin", "A=new", "B=1"]


def test_new_config_appends_layer_history_labels_env():
    cfg = new_config(BASE_CONFIG, LAYER, created="1970-01-01T00:00:00Z", created_by="patchkit", comment="c",
                     labels={"new": "2"}, env={"A": "new"}, n_base_layers=1)
    assert cfg["rootfs"]["diff_ids"] == ["sha256:" + "1" * 64, LAYER.diff_id]
    assert cfg["history"][-1] == {"created": "1970-01-01T00:00:00Z", "created_by": "patchkit", "comment": "c"}
    assert cfg["config"]["Labels"] == {"keep": "1", "new": "2"}
    assert cfg["config"]["Env"] == ["PATH=/bin", "A=new"]
    assert cfg["created"] == "1970-01-01T00:00:00Z"
    assert BASE_CONFIG["rootfs"]["diff_ids"] == ["sha256:" + "1" * 64], "the base config must not be mutated"


def test_inconsistent_base_is_refused():
    with pytest.raises(InvalidBaseImage) as info:
        new_config(BASE_CONFIG, LAYER, created="", created_by="", comment="", labels={}, env={}, n_base_layers=2)
    assert info.value.part == "config"
    assert str(info.value) == ("base image config: expected 2 diff_ids, one per manifest layer, found 1: the base "
                               "image is inconsistent")
    with pytest.raises(InvalidBaseImage) as info:
        new_config({**BASE_CONFIG, "rootfs": {}}, LAYER, created="", created_by="", comment="", labels={}, env={},
                   n_base_layers=1)
    assert (info.value.part, info.value.found) == ("config", "none")


def test_new_manifest_is_oci_with_renamed_base_descriptors():
    config_bytes = canonical_json({"x": 1})
    m = new_manifest(BASE_MANIFEST, config_bytes, LAYER, {"org.opencontainers.image.version": "v"})
    assert m["mediaType"] == OCI_MANIFEST
    assert m["config"] == {"mediaType": OCI_CONFIG, "digest": sha256_digest(config_bytes), "size": len(config_bytes)}
    assert [layer["mediaType"] for layer in m["layers"]] == [OCI_LAYER_GZIP, OCI_LAYER_GZIP]
    assert m["layers"][0]["digest"] == "sha256:" + "3" * 64 and m["layers"][1] == LAYER.descriptor()
    assert m["annotations"] == {"org.opencontainers.image.version": "v"}


def test_canonical_json_is_stable():
    assert canonical_json({"b": 1, "a": [1, {"d": "é", "c": 2}]}) == '{"a":[1,{"c":2,"d":"é"}],"b":1}'.encode()
    assert epoch_timestamp(0) == "1970-01-01T00:00:00Z"


def test_layout_round_trip(tmp_path):
    manifest = canonical_json({"schemaVersion": 2})
    index = layout_index(manifest, Platform.parse("linux/arm64"), "t1")
    write_layout(tmp_path / "out", index, {sha256_digest(manifest): manifest, LAYER.digest: LAYER.blob})
    layout = Layout(tmp_path / "out")
    assert layout.resolve("t1").platform == PlatformSpec("arm64", "linux")
    assert layout.read_blob(LAYER.digest) == LAYER.blob
    assert json.loads((tmp_path / "out" / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    with pytest.raises(InvalidLayout) as info:
        layout.resolve("t2")
    assert (info.value.path, info.value.problem, info.value.name) == (tmp_path / "out", "no-such-image", "t2")
    # replacing an existing layout works and leaves nothing beside it
    write_layout(tmp_path / "out", index, {sha256_digest(manifest): manifest})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not (tmp_path / "out" / "blobs" / "sha256" / LAYER.digest[7:]).exists()


def test_layout_writer_never_clobbers_or_half_writes(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "file").write_text("mine")
    manifest = canonical_json({"schemaVersion": 2})
    index = layout_index(manifest, Platform.parse("linux/arm64"), "t")
    with pytest.raises(OutputTaken) as info:
        write_layout(tmp_path / "precious", index, {sha256_digest(manifest): manifest})
    assert info.value.path == tmp_path / "precious"
    assert (tmp_path / "precious" / "file").read_text() == "mine"
    with pytest.raises(BlobMismatch) as mismatch:
        write_layout(tmp_path / "new", index, {"sha256:" + "0" * 64: b"wrong"})
    assert (mismatch.value.digest, mismatch.value.problem) == ("sha256:" + "0" * 64, "digest")
    with pytest.raises(InvalidLayout) as info:
        Layout(tmp_path / "precious")
    assert info.value.problem == "not-a-layout"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]
