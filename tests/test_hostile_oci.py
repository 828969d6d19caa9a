"""Hostile OCI layouts and registries: every index, manifest, config and blob patchkit reads is bounded,
checked against its shape and verified against its digest, and anything else is refused with exit 2.

The attacks are crafted here, on real small images: layouts written on disk, and a hostile registry on
127.0.0.1 (tests/hostile_registry.py) answering chosen requests with wrong shapes, wrong sizes, endless
bodies, wrong digests and non-JSON token answers. The memory and hang attacks run `patchkit` in a fresh
interpreter under an address-space limit and a timeout (tests/hostile.py); the others call the library
and assert the typed error's fields. The fuzz tests (hypothesis, depth from the profile) feed the
decoders and `open_base` generated documents: always a base image or a PatchkitError.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bases import DOCKER_CONFIG, DOCKER_LAYER, DOCKER_LIST, DOCKER_MANIFEST, tar_gz
from hostile import assert_refused, run_patchkit
from hostile_registry import Answer, HostileRegistry, endless, sha256
from patchkit.errors import PatchkitError
from patchkit.images.build import build
from patchkit.jsondata import MalformedJson, load_json_object
from patchkit.oci.base import NoPlatformImage, NoSuchLayout, UnsupportedBase, open_base
from patchkit.oci.media import Platform
from patchkit.oci.registry import ManifestDigestMismatch, RegistryClient, StoredDigestMismatch
from patchkit.oci.schema import ImageConfig, Index, Manifest, parse
from patchkit.oci.transport import AnswerPastDeadline
from patchkit.oci.verified import BlobMismatch
from patchkit.sources.image_files import PackageRoot
from patchkit.sources.image_layers import ImageLayersSource
from patchkit.untrusted import InputTooLarge, limit_of
from realistic_base import realistic_layout
from registry import registry_server  # noqa: F401  (session fixture)

ARM64 = Platform.parse("linux/arm64")
IMAGE = "glm53-flash-nvfp4"
LAYER, _ = tar_gz({"etc/os-release": b"ID=hostile\n"})
HUGE_INT = "1" * 4301  # one digit past Python's int-from-string limit
SCALE = 0.001  # the realistic base as tests/engines.py scales it (the same cached layout)


# -- layouts ----------------------------------------------------------------------------------------
def documents() -> dict:
    """The documents of a valid one-layer linux/arm64 image, as dicts to break."""
    config = {"architecture": "arm64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": {"a": "b"}},
              "rootfs": {"type": "layers", "diff_ids": [sha256(b"diff")]}}
    return {"config": config, "manifest": {
        "schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": DOCKER_CONFIG, "digest": "", "size": 0},
        "layers": [{"mediaType": DOCKER_LAYER, "digest": sha256(LAYER), "size": len(LAYER)}]},
        "index": {"schemaVersion": 2, "manifests": [{"mediaType": DOCKER_MANIFEST, "digest": "", "size": 0}]}}


def _raw(doc) -> bytes:
    return doc if isinstance(doc, bytes) else json.dumps(doc).encode()


def write_layout(dest: Path, config=None, manifest=None, index=None) -> Path:
    """A layout of the image in `documents()`; a document given replaces it (dict or raw bytes), the
    descriptors pointing at it fixed up when they are still there to fix."""
    docs = documents()
    blobs = {sha256(LAYER): LAYER}
    config_bytes = _raw(config if config is not None else docs["config"])
    blobs[sha256(config_bytes)] = config_bytes
    manifest = manifest if manifest is not None else docs["manifest"]
    if isinstance(manifest, dict) and isinstance(manifest.get("config"), dict) and manifest["config"].get("digest") == "":
        manifest["config"].update(digest=sha256(config_bytes), size=len(config_bytes))
    manifest_bytes = _raw(manifest)
    blobs[sha256(manifest_bytes)] = manifest_bytes
    index = index if index is not None else docs["index"]
    if isinstance(index, dict) and isinstance(index.get("manifests"), list) and index["manifests"] \
            and isinstance(index["manifests"][0], dict) and index["manifests"][0].get("digest") == "":
        index["manifests"][0].update(digest=sha256(manifest_bytes), size=len(manifest_bytes))
    (dest / "blobs" / "sha256").mkdir(parents=True)
    for digest, data in blobs.items():
        (dest / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (dest / "index.json").write_bytes(_raw(index))
    return dest


def _with(part: str, edit) -> dict:
    docs = documents()
    edit(docs[part])
    return {part: docs[part]}


SHAPES = {  # name: (documents to write, the JSON path the refusal names)
    "manifests is a string": ({"index": {"schemaVersion": 2, "manifests": "abc"}}, "$.manifests"),
    "layers are numbers": (_with("manifest", lambda m: m.update(layers=[1, 2])), "$.layers[0]"),
    "Env holds numbers": (_with("config", lambda c: c["config"].update(Env=[1, 2])), "$.config.Env[0]"),
    "Labels is a list": (_with("config", lambda c: c["config"].update(Labels=[])), "$.config.Labels"),
    "a descriptor without mediaType": (_with("index", lambda i: i["manifests"][0].pop("mediaType")), "$.manifests[0]"),
    "a size that is a string": (_with("manifest", lambda m: m["layers"][0].update(size="10")), "$.layers[0].size"),
    "diff_ids are not digests": (_with("config", lambda c: c["rootfs"].update(diff_ids=["x"])), "$.rootfs.diff_ids[0]"),
    "a manifest that is a list": ({"manifest": b"[1, 2]"}, "$"),
    "a config that is a string": ({"config": b'"arm64"'}, "$"),
    "a 4301-digit schemaVersion": ({"index": f'{{"schemaVersion": {HUGE_INT}, "manifests": []}}'.encode()},
                                   "$.schemaVersion"),
}


@pytest.mark.parametrize("name", SHAPES)
def test_a_layout_document_of_the_wrong_shape_is_refused_naming_the_field(name, tmp_path):
    docs, at = SHAPES[name]
    root = write_layout(tmp_path / "img", **docs)
    with pytest.raises(MalformedJson) as err:
        open_base(str(root), ARM64, cache=tmp_path / "cache")
    assert err.value.at == at, str(err.value)


def test_an_integer_past_pythons_digit_limit_in_a_field_patchkit_does_not_model_is_refused(tmp_path):
    """msgspec skips an unknown field; Python's json then meets the 4,301-digit integer (ValueError)."""
    with pytest.raises(MalformedJson) as err:
        load_json_object(f'{{"x": {HUGE_INT}}}'.encode(), "doc")
    assert (err.value.what, err.value.at) == ("doc", "$")
    index = documents()["index"]
    root = write_layout(tmp_path / "img", index=index)
    text = (root / "index.json").read_text()
    (root / "index.json").write_text(text[:-1] + f', "x-vendor": {HUGE_INT}}}')
    with pytest.raises(MalformedJson) as err:
        open_base(str(root), ARM64, cache=tmp_path / "cache")
    assert (err.value.what, err.value.at) == (f"{root}/index.json", "$")


@pytest.mark.parametrize("name", ["manifests is a string", "layers are numbers", "Labels is a list",
                                  "a 4301-digit schemaVersion", "a manifest that is a list"])
def test_the_build_command_refuses_a_malformed_layout_with_exit_2(name, tmp_path):
    docs, at = SHAPES[name]
    root = write_layout(tmp_path / "img", **docs)
    outcome = run_patchkit("build", IMAGE, "--base", str(root), "--output", str(tmp_path / "out"))
    assert_refused(outcome, str(root), *([at] if at != "$" else []))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("part", ["index.json", "config"])
def test_a_4_gib_sparse_layout_document_is_refused_unread(part, tmp_path):
    root = write_layout(tmp_path / "img")
    if part == "index.json":
        path = root / "index.json"
    else:
        path = root / "blobs" / "sha256" / sha256(_raw(documents()["config"]))[7:]
    with open(path, "r+b") as f:
        f.truncate(4 << 30)
    outcome = run_patchkit("build", IMAGE, "--base", str(root), "--dry-run")
    assert_refused(outcome, f"{4 << 30:,} B", "PATCHKIT_LIMIT_MANIFEST")


def test_a_layer_member_past_the_member_limit_is_refused_before_it_is_read(tmp_path):
    """A tar header may claim 4 GiB for a file that gzip squeezes to nothing: refused on the header."""
    site = "usr/lib/python3.12/site-packages"
    info = tarfile.TarInfo(f"{site}/vllm/a.py")
    info.size = 4 << 30
    import gzip
    blob = gzip.compress(info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 4096, mtime=0)
    manifest = documents()["manifest"]
    manifest["layers"] = [{"mediaType": DOCKER_LAYER, "digest": sha256(blob), "size": len(blob)}]
    root = write_layout(tmp_path / "img", manifest=manifest)
    (root / "blobs" / "sha256" / sha256(blob)[7:]).write_bytes(blob)
    src = ImageLayersSource(open_base(str(root), ARM64, cache=tmp_path / "c"),
                            [PackageRoot("vllm", f"/{site}/vllm", "vllm", "1.0")])
    with pytest.raises(InputTooLarge) as err:
        src.prefetch([("vllm", "a.py")])  # the build announces its files: the layer is read for them
    assert (err.value.kind, err.value.size) == ("member", 4 << 30)


# -- base layers into --output ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_base():
    """The realistic base's shape, scaled down (tests/realistic_base.py): real vLLM and FlashInfer files
    with the RECORD pip writes, so the build reads only the layers from the vLLM install up and leaves
    the OS, CUDA and torch layers below unread."""
    made = realistic_layout(SCALE)
    return {"layout": Path(made["layout"]), "layers": [layer["digest"] for layer in made["layers"]]}


def _copy_layout(base: dict, dest: Path) -> Path:
    (dest / "blobs" / "sha256").mkdir(parents=True)
    for p in (base["layout"] / "blobs" / "sha256").iterdir():
        os.link(p, dest / "blobs" / "sha256" / p.name)
    for name in ("oci-layout", "index.json"):
        (dest / name).write_bytes((base["layout"] / name).read_bytes())
    return dest


def _unread(base: dict, tmp_path: Path) -> list[str]:
    """The base layers a build does not read, as the dry run reports them (checked against the source's
    own record of what it streamed)."""
    outcome = run_patchkit("build", IMAGE, "--base", f"{base['layout']}:base", "--dry-run",
                           env={"PATCHKIT_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "400"})
    assert outcome.code == 0, outcome.output[-3000:]
    said = [d for d in base["layers"] if f"base layer {d}" in outcome.output]
    assert said and all("not read" in line for line in outcome.output.splitlines() if "base layer sha256:" in line)
    result = build(IMAGE, base=f"{base['layout']}:base", dry_run=True, cache=tmp_path / "cache")
    assert said == [d for d in base["layers"] if d not in result.built.prepared.source.layers_read]
    return said


def test_a_tampered_base_layer_the_build_does_not_read_never_reaches_the_output(real_base, tmp_path):
    unread = _unread(real_base, tmp_path)
    root = _copy_layout(real_base, tmp_path / "img")
    blob = root / "blobs" / "sha256" / unread[0][7:]
    data = blob.read_bytes()
    blob.unlink()  # (a hard link to the fixture's blob: replaced, not written through)
    blob.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, not the bytes its name promises
    outcome = run_patchkit("build", IMAGE, "--base", f"{root}:base", "--output", str(tmp_path / "out"),
                           env={"PATCHKIT_CACHE_DIR": str(tmp_path / "cache")})
    assert_refused(outcome, unread[0], "does not match its digest")
    assert not (tmp_path / "out").exists()


def test_a_base_blob_that_is_a_symlink_goes_into_the_output_as_a_verified_regular_file(real_base, tmp_path):
    unread = _unread(real_base, tmp_path)
    root = _copy_layout(real_base, tmp_path / "img")
    outside = tmp_path / "outside"
    outside.mkdir()
    blob = root / "blobs" / "sha256" / unread[0][7:]
    (outside / "good").write_bytes(blob.read_bytes())
    blob.unlink()
    blob.symlink_to(outside / "good")
    result = build(IMAGE, base=f"{root}:base", output=tmp_path / "out", cache=tmp_path / "cache")
    out_blob = result.output / "blobs" / "sha256" / unread[0][7:]
    assert not out_blob.is_symlink() and out_blob.read_bytes() == (outside / "good").read_bytes()
    assert not [p for p in result.output.rglob("*") if p.is_symlink()]
    # the same link to bytes that are not the blob's: refused, nothing written
    (outside / "evil").write_bytes(b"\0" * blob.stat().st_size)
    blob.unlink()
    blob.symlink_to(outside / "evil")
    with pytest.raises(BlobMismatch) as err:
        build(IMAGE, base=f"{root}:base", output=tmp_path / "out2", cache=tmp_path / "cache")
    assert (err.value.problem, err.value.digest) == ("digest", unread[0])
    assert not (tmp_path / "out2").exists()


@pytest.mark.registry
def test_a_tampered_base_layer_is_never_pushed(real_base, registry_server, tmp_path):
    """A push from a layout uploads every base layer (no mount across registries): the tampered one is
    hashed as it is sent and its last chunk withheld, so the registry never stores it, nor the manifest."""
    unread = _unread(real_base, tmp_path)
    root = _copy_layout(real_base, tmp_path / "img")
    blob = root / "blobs" / "sha256" / unread[0][7:]
    data = blob.read_bytes()
    blob.unlink()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(BlobMismatch) as err:
        build(IMAGE, base=f"{root}:base", push=[f"{registry_server.host}/tampered/img:t"], cache=tmp_path / "cache")
    assert (err.value.problem, err.value.digest) == ("digest", unread[0])
    client = RegistryClient(registry_server.host)
    assert not client.blob_exists("tampered/img", unread[0])
    assert "tampered/img" not in registry_server.catalog() or not registry_server.tags("tampered/img")


# -- a hostile registry -------------------------------------------------------------------------------
@pytest.fixture
def hostile():
    with HostileRegistry() as reg:
        yield reg


def _base(ref: str, tmp_path: Path, keep: bool = True):
    return open_base(ref, ARM64, cache=tmp_path / "cache", keep=keep)


def test_a_registry_manifest_that_is_a_json_list_is_refused(hostile, tmp_path):
    served = hostile.image("x/y", [LAYER])
    hostile.manifest("x/y", "base", b"[1, 2, 3]", DOCKER_LIST)
    with pytest.raises(MalformedJson) as err:
        _base(served["ref"], tmp_path)
    assert err.value.at == "$" and "x/y:base" in err.value.what


def test_registry_documents_of_the_wrong_shape_are_refused(hostile, tmp_path):
    manifest = documents()["manifest"]
    manifest["layers"] = [1, 2]
    manifest["config"] = {"mediaType": DOCKER_CONFIG, "digest": sha256(b"{}"), "size": 2}
    served = hostile.image("x/y", [LAYER], manifest=manifest)
    with pytest.raises(MalformedJson) as err:
        _base(served["ref"], tmp_path)
    assert err.value.at == "$.layers[0]"
    config = documents()["config"]
    config["config"]["Env"] = [1, 2]
    served = hostile.image("x/z", [LAYER], config=config)
    with pytest.raises(MalformedJson) as err:
        _base(served["ref"], tmp_path)
    assert err.value.at == "$.config.Env[0]"


def test_a_token_service_that_answers_something_other_than_json_is_named(tmp_path):
    with HostileRegistry(token=True) as reg:
        served = reg.image("x/y", [LAYER])
        reg.route("GET", "/token", Answer(200, b"<html>login</html>"))
        with pytest.raises(MalformedJson) as err:
            _base(served["ref"], tmp_path)
        assert "token service" in err.value.what and "not valid JSON" in err.value.problem
        reg.route("GET", "/token", Answer(200, b'{"token": 7}'))
        with pytest.raises(MalformedJson) as err:
            _base(served["ref"], tmp_path)
        assert err.value.at == "$.token"
        reg.route("GET", "/token", Answer(200, b'{"token": "t"}'))
        assert _base(served["ref"], tmp_path).config["os"] == "linux"  # and a real token is used


@pytest.mark.parametrize("answer, problem", [
    (lambda data: Answer(200, endless()), "longer"),                       # chunked, never ends
    (lambda data: Answer(200, data + b"more"), "longer"),                  # past its descriptor's size
    (lambda data: Answer(200, data[:-1]), "shorter"),
    (lambda data: Answer(200, bytes([data[0] ^ 1]) + data[1:]), "digest"),  # same size, other bytes
])
def test_a_config_blob_is_read_no_further_than_its_size_and_verified(answer, problem, hostile, tmp_path):
    served = hostile.image("x/y", [LAYER])
    hostile.blob("x/y", served["config"], answer(served["config"]))
    with pytest.raises(BlobMismatch) as err:
        _base(served["ref"], tmp_path)
    assert (err.value.problem, err.value.digest) == (problem, served["config_digest"])
    assert not list((tmp_path / "cache").rglob("*.part-*")) and not [
        p for p in (tmp_path / "cache").rglob("*") if p.is_file()], "nothing unverified is kept"


@pytest.mark.parametrize("keep", [True, False])
def test_a_layer_blob_with_the_wrong_bytes_is_refused_cached_or_streamed(keep, hostile, tmp_path):
    site = "usr/lib/python3.12/site-packages"
    layer, _ = tar_gz({f"{site}/vllm/a.py": b"a\n"})
    served = hostile.image("x/y", [layer])
    hostile.blob("x/y", layer, Answer(200, layer[:-1] + bytes([layer[-1] ^ 1])))
    src = ImageLayersSource(_base(served["ref"], tmp_path, keep=keep),
                            [PackageRoot("vllm", f"/{site}/vllm", "vllm", "1.0")])
    with pytest.raises(BlobMismatch) as err:
        src.read("vllm", "a.py")
    assert err.value.problem == "digest"
    assert not (tmp_path / "cache" / "blobs" / "sha256" / sha256(layer)[7:]).exists()


def test_a_cached_blob_that_no_longer_matches_is_refused_and_removed(hostile, tmp_path):
    served = hostile.image("x/y", [LAYER])
    _base(served["ref"], tmp_path)
    cached = tmp_path / "cache" / "blobs" / "sha256" / served["config_digest"][7:]
    cached.write_bytes(b" " * len(served["config"]))
    with pytest.raises(BlobMismatch) as err:
        _base(served["ref"], tmp_path)
    assert (err.value.problem, err.value.removed) == ("digest", cached) and not cached.exists()
    assert f"(cached copy {cached} removed: the next run downloads it again)" in str(err.value)
    assert _base(served["ref"], tmp_path).config_bytes == served["config"]  # fetched again, verified


def test_nested_indexes_past_the_depth_limit_are_refused(hostile, tmp_path):
    served = hostile.image("x/y", [LAYER])
    child = served["index"]
    for _ in range(6):
        child = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": [
            {"mediaType": DOCKER_LIST, "digest": sha256(child), "size": len(child),
             "platform": {"architecture": "arm64", "os": "linux"}}]}).encode()
        hostile.manifest("x/y", sha256(child), child, DOCKER_LIST)
    hostile.manifest("x/y", "deep", child, DOCKER_LIST)
    with pytest.raises(UnsupportedBase) as err:
        _base(f"{hostile.host}/x/y:deep", tmp_path)
    assert err.value.spec == f"{hostile.host}/x/y:deep" and "nested more than" in err.value.problem


def _index(hostile, tag: str, entries: list[tuple[str, str]]) -> str:
    """An index tagged `tag` of one served image manifest per (os/architecture, digest seed)."""
    served = hostile.image("x/y", [LAYER])
    listed = json.loads(served["index"])["manifests"][0]
    manifests = []
    for where, seed in entries:
        os_, arch = where.split("/")
        body = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": listed, "layers": [],
                           "seed": seed}).encode()
        hostile.manifest("x/y", sha256(body), body, DOCKER_MANIFEST)
        manifests.append({"mediaType": DOCKER_MANIFEST, "digest": sha256(body), "size": len(body),
                          "platform": {"architecture": arch, "os": os_}})
    index = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": manifests}).encode()
    hostile.manifest("x/y", tag, index, DOCKER_LIST)
    return f"{hostile.host}/x/y:{tag}"


def test_an_index_without_one_arm64_image_is_refused_naming_what_it_has(hostile, tmp_path):
    none = _index(hostile, "amd64-only", [("linux/amd64", "a"), ("linux/ppc64le", "b")])
    with pytest.raises(NoPlatformImage) as err:
        _base(none, tmp_path)
    assert (err.value.spec, err.value.platform, err.value.found) == (none, "linux/arm64", 0)
    assert err.value.has == ["linux/amd64", "linux/ppc64le"]
    two = _index(hostile, "two-arm64", [("linux/arm64", "a"), ("linux/arm64", "b")])
    with pytest.raises(NoPlatformImage) as err:
        _base(two, tmp_path)
    assert (err.value.found, "name one by digest" in str(err.value)) == (2, True)


def test_a_base_in_a_form_patchkit_does_not_read_or_a_missing_layout_path_is_refused(hostile, tmp_path):
    hostile.image("x/y", [LAYER])
    hostile.manifest("x/y", "odd", b'{"schemaVersion": 2}', "application/vnd.example.thing+json")
    with pytest.raises(UnsupportedBase) as err:
        _base(f"{hostile.host}/x/y:odd", tmp_path)
    assert "unsupported manifest type 'application/vnd.example.thing+json'" in err.value.problem
    for spec in ("./no-such-layout", str(tmp_path / "missing")):
        with pytest.raises(NoSuchLayout) as err:
            _base(spec, tmp_path)
        assert err.value.spec == spec


def test_a_manifest_asked_by_digest_that_hashes_to_another_is_refused(hostile):
    served = hostile.image("x/y", [LAYER])
    asked = sha256(served["manifest"])
    hostile.manifest("x/y", asked, served["index"], DOCKER_LIST)  # the index's bytes under the manifest's digest
    with pytest.raises(ManifestDigestMismatch) as err:
        RegistryClient(hostile.host).get_manifest("x/y", asked)
    assert (err.value.registry, err.value.repo, err.value.digest) == (hostile.host, "x/y", asked)
    assert err.value.found == sha256(served["index"])


def test_a_pushed_manifest_the_registry_says_it_stored_as_another_digest_is_refused(hostile):
    sent = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST}).encode()
    other = sha256(b"not what was sent")
    hostile.route("PUT", "/v2/x/y/manifests/t", Answer(201, b"", {"Docker-Content-Digest": other}))
    with pytest.raises(StoredDigestMismatch) as err:
        RegistryClient(hostile.host).put_manifest("x/y", "t", sent, DOCKER_MANIFEST)
    assert (err.value.registry, err.value.repo, err.value.ref) == (hostile.host, "x/y", "t")
    assert (err.value.stored, err.value.expected) == (other, sha256(sent))


def test_an_upload_answer_without_its_location_is_refused(hostile):
    hostile.route("POST", "/v2/x/y/blobs/uploads/", Answer(202, b""))
    with pytest.raises(PatchkitError, match="without the Location"):
        RegistryClient(hostile.host).upload_blob("x/y", sha256(b"a"), b"a")


@pytest.mark.registry
def test_a_blob_copied_between_registries_is_verified_on_the_way(hostile, registry_server):
    """The base registry serves other bytes under a layer's name: the copy into the push registry stops
    before the last chunk, and the push registry never holds the blob."""
    data = os.urandom(3 << 20)
    digest = hostile.blob("x/y", data, Answer(200, data[:-1] + bytes([data[-1] ^ 1])))
    target = RegistryClient(registry_server.host)
    with pytest.raises(BlobMismatch) as err:
        target.upload_blob("copy/dst", digest, RegistryClient(hostile.host).stream_blob("x/y", digest, len(data)))
    assert err.value.problem == "digest"
    assert not target.blob_exists("copy/dst", digest)


def _gzip_bomb(size: int) -> bytes:
    """`size` zero bytes gzipped: one 16 MiB gzip member (~1000:1) repeated, as gzip allows members to follow
    one another, so it costs a few milliseconds to make."""
    import gzip
    member = gzip.compress(b"\0" * (16 << 20), compresslevel=9, mtime=0)
    return member * (size // (16 << 20))


BOMB = _gzip_bomb(2 << 30)  # 2 GiB inflated, ~2 MiB on the wire: past the 1.5 GiB the command may use

# The bodies that never end, through the command itself: bounded memory (1.5 GiB address space), no hang.
ENDLESS = {
    "manifest, a gzip bomb sent unasked": ("GET", "/v2/x/y/manifests/base",
                                           Answer(200, BOMB, {"Content-Type": DOCKER_LIST, "Content-Encoding": "gzip"}),
                                           "PATCHKIT_LIMIT_MANIFEST"),
    "manifest, chunked": ("GET", "/v2/x/y/manifests/base", Answer(200, endless(), {"Content-Type": DOCKER_LIST}),
                          "PATCHKIT_LIMIT_MANIFEST"),
    "manifest, declaring 3 GiB": ("GET", "/v2/x/y/manifests/base",
                                  Answer(200, endless(), {"Content-Type": DOCKER_LIST}, length=3 << 30),
                                  f"{3 << 30:,} B"),
    "an error answer": ("GET", "/v2/x/y/manifests/base", Answer(500, endless()), "answered 500"),
    "a config blob": ("GET", "config", Answer(200, endless()), "holds more than"),
}


@pytest.mark.parametrize("name", ENDLESS)
def test_an_endless_answer_is_refused_in_bounded_memory(name, hostile):
    method, path, answer, needle = ENDLESS[name]
    served = hostile.image("x/y", [LAYER])
    hostile.route(method, f"/v2/x/y/blobs/{served['config_digest']}" if path == "config" else path, answer)
    outcome = run_patchkit("build", IMAGE, "--base", served["ref"], "--dry-run")
    assert_refused(outcome, needle)


@pytest.mark.parametrize("attack, needle", [
    ("a manifest that is a JSON list", "expected `object`, got `array`"),
    ("a token answer that is not JSON", "token service"),
    ("layers that are numbers", "$.layers[0]"),
])
def test_the_build_command_refuses_a_hostile_registry_with_exit_2(attack, needle):
    with HostileRegistry(token=attack.startswith("a token")) as reg:
        manifest = None
        if attack.startswith("layers"):
            config = _raw(documents()["config"])  # served, so only the layers are wrong
            manifest = documents()["manifest"] | {"layers": [1, 2]}
            manifest["config"] = {"mediaType": DOCKER_CONFIG, "digest": reg.blob("x/y", config), "size": len(config)}
        served = reg.image("x/y", [LAYER], manifest=manifest)
        if attack.startswith("a manifest"):
            reg.manifest("x/y", "base", b"[1, 2, 3]", DOCKER_LIST)
        reg.route("GET", "/token", Answer(200, b"<html>sign in</html>"))
        assert_refused(run_patchkit("build", IMAGE, "--base", served["ref"], "--dry-run"), needle)


def test_a_manifest_dripped_a_byte_at_a_time_is_given_up_on_at_the_deadline(hostile, tmp_path, monkeypatch):
    """Each byte inside the read timeout, the whole never done: the answer has a deadline of its own."""
    import time

    def drip():
        while True:
            time.sleep(0.05)
            yield b" "

    served = hostile.image("x/y", [LAYER])
    hostile.route("GET", "/v2/x/y/manifests/base", Answer(200, drip, {"Content-Type": DOCKER_LIST}))
    monkeypatch.setattr("patchkit.oci.registry.BODY_DEADLINE_S", 1.0)
    from concurrent.futures import ThreadPoolExecutor, TimeoutError
    pool = ThreadPoolExecutor(1)  # a regression hangs the open, not the test run
    future = pool.submit(_base, served["ref"], tmp_path)
    try:
        error = future.exception(timeout=20)
    except TimeoutError:
        pytest.fail("the dripped manifest was still being read after 20 s")
    finally:
        pool.shutdown(wait=False)
    assert isinstance(error, AnswerPastDeadline), error
    assert error.what == f"manifest {hostile.host}/x/y:base" and error.deadline_s == 1.0 and error.received > 0


def test_a_token_service_that_never_stops_answering_is_cut_at_the_limit(tmp_path):
    with HostileRegistry(token=True) as reg:
        served = reg.image("x/y", [LAYER])
        reg.route("GET", "/token", Answer(200, endless(b" " * (1 << 20))))
        with pytest.raises(InputTooLarge) as err:
            _base(served["ref"], tmp_path)
        assert err.value.kind == "manifest" and err.value.limit == limit_of("manifest")


# -- fuzz ---------------------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.just(int(HUGE_INT[:30])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12)
DIGESTS = st.sampled_from([sha256(LAYER), "sha256:" + "0" * 64, "sha256:xyz", "md5:00", ""])
DESCRIPTOR = st.fixed_dictionaries({}, optional={
    "mediaType": st.sampled_from([DOCKER_MANIFEST, DOCKER_LIST, DOCKER_LAYER, DOCKER_CONFIG]) | JSON,
    "digest": DIGESTS | JSON, "size": st.integers(-1, 1 << 40) | JSON,
    "platform": st.fixed_dictionaries({}, optional={"os": st.just("linux") | JSON,
                                                    "architecture": st.just("arm64") | JSON}) | JSON,
    "annotations": st.dictionaries(st.text(max_size=4), st.text(max_size=4) | JSON, max_size=2) | JSON})
DOCUMENT = st.fixed_dictionaries({}, optional={
    "schemaVersion": st.just(2) | JSON, "mediaType": st.sampled_from([DOCKER_MANIFEST, DOCKER_LIST]) | JSON,
    "manifests": st.lists(DESCRIPTOR, max_size=3) | JSON, "config": DESCRIPTOR | JSON,
    "layers": st.lists(DESCRIPTOR, max_size=3) | JSON,
    "architecture": st.just("arm64") | JSON, "os": st.just("linux") | JSON,
    "rootfs": st.fixed_dictionaries({"type": st.just("layers") | JSON,
                                     "diff_ids": st.lists(DIGESTS, max_size=2) | JSON}) | JSON})


@given(doc=DOCUMENT | JSON, raw=st.binary(max_size=64))
def test_fuzz_the_decoders_give_a_document_or_a_patchkit_error(doc, raw):
    for data in (json.dumps(doc).encode(), raw):
        for schema in (Index, Manifest, ImageConfig):
            try:
                value, plain = parse(data, schema, "fuzzed")
            except PatchkitError:
                continue
            assert isinstance(value, schema) and isinstance(plain, dict)


@given(index=DOCUMENT, manifest=DOCUMENT, config=DOCUMENT)
def test_fuzz_a_layout_opens_as_a_base_or_is_refused(index, manifest, config):
    with tempfile.TemporaryDirectory() as tmp:
        root = write_layout(Path(tmp) / "img", config=config, manifest=manifest, index=index)
        try:
            base = open_base(str(root), ARM64, cache=Path(tmp) / "cache")
        except PatchkitError:
            return
        assert base.platform == ARM64 and isinstance(base.config, dict)


@pytest.fixture(scope="module")
def fuzzed_registry():
    with HostileRegistry() as reg:
        yield reg, reg.image("x/y", [LAYER])


@given(manifest=DOCUMENT | JSON)
def test_fuzz_a_registry_manifest_is_a_base_or_a_patchkit_error(manifest, fuzzed_registry):
    reg, served = fuzzed_registry
    reg.manifest("x/y", "base", json.dumps(manifest).encode(), DOCKER_LIST)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _base(served["ref"], Path(tmp))
        except PatchkitError:
            pass
