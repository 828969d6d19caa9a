"""The local-engine route (`patchkit build IMAGE --load`) with real components: podman's Docker-API service
(started here, private storage), the realistic base (tests/realistic_base.py, scaled down) pulled into it
from a real registry, the real patch set and image definitions. And the image metadata rules: a source
label only for a URL people can open, the creation time from the commit when SOURCE_DATE_EPOCH is unset."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from contextlib import contextmanager
from pathlib import Path

import git
import pytest

from engines import (  # noqa: F401
    CountingProxy,
    client,
    dockerd_service,
    engine,
    engine_client,
    engine_realistic,
    engine_service,
    patched_files,
    podman,
    podman_service,
    realistic,
)
from patchkit.engine import EngineError
from patchkit.errors import PatchFailed
from patchkit.images.build import build
from patchkit.images.engine import UnreadablePush, annotate_pushed, engine_build, tags_for
from patchkit.images.labels import build_epoch, git_source_url, public_url
from patchkit.images.new_layer import BYTECODE_STUB
from patchkit.oci.media import OCI_INDEX
from patchkit.oci.progress import Quiet
from patchkit.oci.registry import RegistryClient
from registry import (  # noqa: F401
    free_port,
    images_pinned_to,
    make_base,
    make_stand_in,
    pinned_stand_in,
    push_base,
    registry_server,
    vllm_sdist,
)

IMAGE = "glm53-flash-nvfp4-4p67"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SOURCE = "https://example.invalid/patchkit"
EPOCH = 1_700_000_000


def run(tmp_path, **kw):
    return build(IMAGE, revision=REVISION, source_url=SOURCE, epoch=EPOCH, cache=tmp_path / "cache", **kw)


def read_back(client, image_id: str, path: str) -> tuple[tarfile.TarInfo, bytes]:
    container = client.containers.create(image_id, command=["/x"], entrypoint=[])
    try:
        chunks, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            info = tar.next()
            return info, tar.extractfile(info).read()
    finally:
        container.remove(force=True)


@pytest.mark.registry
def test_load_builds_from_the_engine_copy_moving_only_the_patched_files(realistic, client, podman, tmp_path):
    ref, made = realistic
    # The same digest under a registry nobody answers at: only the engine's copy can serve this build.
    offline = f"127.0.0.1:{free_port()}/vllm/realistic@{made['manifest']}"
    result = run(tmp_path / "load", base=offline, load=True, engine_url=podman)
    assert result.route == "local-engine"
    loaded = result.built
    # Read from the engine: the originals of the patched files only (under 1 MiB). Sent: the layer, those
    # files and the image's pinned extra wheels' (4p67: instanttensor), compressed.
    extras = sum(len(f.data) for f in loaded.prepared.extras.files)
    assert extras > 0 and 0 < loaded.prepared.source.received < 1 << 20, loaded.prepared.source.received
    assert loaded.sent < (1 << 20) + extras, (loaded.sent, extras)

    # the same plan, files and labels as the daemonless build of the same base from the registry
    daemonless = run(tmp_path / "daemonless", base=ref, dry_run=True).built
    assert patched_files(loaded) == patched_files(daemonless)
    assert loaded.version == daemonless.version and [p.id for p in loaded.prepared.carried] == \
           [p.id for p in daemonless.prepared.carried]
    assert {k: v for k, v in loaded.labels.items() if "base." not in k} == \
           {k: v for k, v in daemonless.labels.items() if "base." not in k}
    assert loaded.prepared.versions == {"vllm": "0.33.0", "flashinfer": "0.7.2.post1"}, "both read from the engine"

    # the engine's image: the base's layers untouched, underneath; the patched files and stubs on top
    base_attrs = client.images.get(ref.split(":base@")[0] + "@" + made["manifest"]).attrs
    attrs = client.images.get(loaded.image_id).attrs
    base_layers = base_attrs["RootFS"]["Layers"]
    assert attrs["RootFS"]["Layers"][:len(base_layers)] == base_layers
    assert attrs["Architecture"] == "arm64" and attrs["Config"]["Labels"]["dev.patchkit.series"] == \
           loaded.labels["dev.patchkit.series"]
    assert all(f"{k}={v}" in attrs["Config"]["Env"] for k, v in loaded.prepared.image.env.items())
    for f in loaded.prepared.files:
        info, data = read_back(client, loaded.image_id, f.path)
        assert data == f.data != f.change.old
        assert (info.mode & 0o7777, info.uid, info.gid) == (f.mode & 0o7777, f.uid, f.gid)
    pyc = next(p for p in loaded.prepared.stale_bytecode if p.endswith(".cpython-312.pyc"))
    assert read_back(client, loaded.image_id, pyc)[1] == BYTECODE_STUB
    assert client.images.get(f"patchkit/{IMAGE}:{loaded.tag}").id == loaded.image_id


def _drift(data: bytes, anchor: str) -> bytes:
    half = len(anchor) // 2
    return data.replace(anchor.encode(), (anchor[:half] + "  # drifted upstream\n" + anchor[half:]).encode())


@pytest.mark.registry
def test_a_rebuild_on_the_same_base_asks_the_engine_for_nothing(realistic, client, podman, tmp_path):
    ref, _ = realistic
    first = run(tmp_path, base=ref, load=True, engine_url=podman).built
    assert first.prepared.source.requests > 10 and first.prepared.source.containers >= 1

    again = run(tmp_path, base=ref, load=True, engine_url=podman).built
    source = again.prepared.source
    assert (source.requests, source.received, source.containers) == (0, 0, 0), "no container, no request"
    assert patched_files(again) == patched_files(first) and again.prepared.versions == first.prepared.versions
    assert again.sent < (1 << 20) + sum(len(f.data) for f in again.prepared.extras.files)

    # A damaged cache entry is found by its sha256 and read again from the engine, alone.
    blobs = sorted((tmp_path / "cache" / "files" / "blobs").rglob("*"), key=lambda p: p.stat().st_size)
    blob = next(b for b in blobs if b.is_file() and b.stat().st_size > 1000)
    blob.write_bytes(b"# not what the engine holds\n" + blob.read_bytes())
    healed = run(tmp_path, base=ref, load=True, engine_url=podman).built
    assert healed.prepared.source.requests == 1 and patched_files(healed) == patched_files(first)

    # A listing nobody could have written vouches for nothing: the absent paths are asked for again (the
    # present files stand on their checked archives).
    (listing,) = (tmp_path / "cache" / "files" / "archives").glob("engine-image-*/members.json")
    records = json.loads(listing.read_text())
    listing.write_text(json.dumps({path: "file rwx root" for path in records}))
    reread = run(tmp_path, base=ref, load=True, engine_url=podman).built
    absent = sum(r == "absent" for r in records.values())
    assert 0 < absent == reread.prepared.source.requests and patched_files(reread) == patched_files(first)
    assert not client.containers.list(all=True), "every container made to read from is gone"


def _named(client) -> dict[str, str]:
    """This image's tags in the engine: name -> image id."""
    return {t.removeprefix("docker.io/").removeprefix("localhost/"): i.id
            for i in client.images.list(name=f"patchkit/{IMAGE}") for t in i.tags}


@pytest.mark.registry
def test_a_rebuild_of_an_unchanged_image_moves_only_its_tags(engine_realistic, engine_client, engine, tmp_path):
    """The engine already holds the image (found by the content key patchkit labels it with): only the tags
    move, under 1 MiB on the wire (counted by a proxy, both ways). A patched byte changed rebuilds and sends
    its layer; the unchanged image built again after it is found again and gets `:latest` back."""
    ref, _ = engine_realistic
    latest = f"patchkit/{IMAGE}:latest"

    def measured(**kw):
        with CountingProxy(tmp_path / "count.sock", engine) as proxy:
            built = build(IMAGE, base=ref, load=True, engine_url=proxy.url, revision=REVISION, source_url=SOURCE,
                          epoch=EPOCH + 7, cache=tmp_path / "cache", **kw).built
        print(f"{engine}: {built.local_tag} {built.image_id[:19]} sent {built.sent} B of context, "
              f"{proxy.sent} B to and {proxy.received} B from the engine")
        return built, proxy.sent + proxy.received

    first, moved_first = measured()
    wheels = sum(len(f.data) for f in first.prepared.extras.files)
    assert first.sent > 0 and moved_first > first.sent, "the first build sends its layer"
    assert _named(engine_client)[latest] == _named(engine_client)[first.local_tag] == first.image_id

    again, moved = measured()
    assert moved < 1 << 20 < wheels, (moved, wheels)
    assert (again.image_id, again.sent, again.prepared.source.requests) == (first.image_id, 0, 0)
    named = _named(engine_client)
    assert named[latest] == named[first.local_tag] == first.image_id

    patches = shutil.copytree(Path(__file__).resolve().parents[1] / "patches", tmp_path / "patches")
    defs = patches / "packed-modules-4p67" / "model_defs.py.txt"
    defs.write_text(defs.read_text() + "# one byte changed\n")
    changed, moved_changed = measured(patches_dir=patches)
    assert patched_files(changed) != patched_files(first) and changed.local_tag != first.local_tag
    assert changed.image_id != first.image_id and moved_changed > changed.sent > 0, "rebuilt, its layer sent"
    named = _named(engine_client)
    assert named[latest] == named[changed.local_tag] == changed.image_id
    assert named[first.local_tag] == first.image_id

    back, moved_back = measured()
    assert back.image_id == first.image_id and back.sent == 0 and moved_back < 1 << 20, moved_back
    named = _named(engine_client)
    assert named[latest] == named[first.local_tag] == first.image_id
    assert named[changed.local_tag] == changed.image_id
    assert not [t for t in named if ":was-latest." in t], named


@pytest.mark.registry
def test_the_next_build_clears_patchkits_untagged_images_never_a_users_built_from_one(
        engine_realistic, engine_client, engine, tmp_path):
    """An image a user built `FROM patchkit/...:latest` carries every patchkit label (labels inherit); left
    untagged (its tag moved to another image) it is still the user's: the next build's recover keeps it.
    patchkit's own image, left untagged the same way (as a cut-off rebuild leaves one), is removed by it."""
    from patchkit.images.leftovers import IMAGE_LABEL, built_by_patchkit, recover

    ref, _ = engine_realistic
    first = build(IMAGE, base=ref, load=True, engine_url=engine, revision=REVISION, source_url=SOURCE,
                  epoch=EPOCH + 11, cache=tmp_path / "cache").built
    latest = f"patchkit/{IMAGE}:latest"
    base_id = engine_client.images.get(ref).id
    engine_client.api.tag(base_id, "keep/base", "held")   # a name of its own: untagging what moved never deletes it

    def dangle(image_id: str) -> list[str]:
        """Every name of `image_id` moved onto the base (a tag move never deletes): it is left untagged."""
        names = [t.removeprefix("docker.io/").removeprefix("localhost/") for t in engine_client.images.get(image_id).tags]
        assert names, image_id
        for name in names:
            repo, _, tag = name.rpartition(":")
            engine_client.api.tag(base_id, repo, tag)
        return names

    users, moved = {}, []
    for kind, steps in (("env", 'ENV USERS_OWN="1"'), ("label", 'LABEL org.example.mine="1"')):
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            data = f"FROM {latest}\n{steps}\n".encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        context.seek(0)
        image, _ = engine_client.images.build(fileobj=context, custom_context=True, tag=f"mine/{kind}:1", rm=True)
        assert IMAGE_LABEL in image.labels and image.id != first.image_id
        assert not built_by_patchkit(engine_client, image.id), engine_client.api.history(image.id)[:4]
        moved += dangle(image.id)
        users[kind] = image.id
    assert built_by_patchkit(engine_client, first.image_id), engine_client.api.history(first.image_id)[:4]
    try:
        done = recover(engine_client)
        assert set(users.values()) <= {i.id for i in engine_client.images.list(all=True)}, (done, users)
        assert not any(u[:19] in line for u in users.values() for line in done), done

        for image_id in users.values():   # the user's to remove (an engine keeps a parent while children stand)
            engine_client.api.remove_image(image_id)
        moved += dangle(first.image_id)   # patchkit's image, every name off it
        done = recover(engine_client)
        assert any(first.image_id[:19] in line for line in done), done
        assert first.image_id not in {i.id for i in engine_client.images.list(all=True)}
    finally:
        for name in set(moved):   # the base keeps its own name
            engine_client.api.remove_image(name)


@pytest.mark.registry
def test_load_asserts_every_anchor_on_the_engine_copy(registry_server, realistic, client, podman, tmp_path):
    from patchkit.patching.patchset import load_patchset

    patchset = load_patchset(os.path.join(os.path.dirname(__file__), "..", "patches"))
    edit = next(e for e in patchset.patch("pool-topk-init").edits if e.action != "assert")
    target = next(c for c in edit.candidates if c.startswith("models/"))
    drifted = make_base(vllm_sdist(), tmp_path / "drifted",
                        edit=lambda rel, data: _drift(data, edit.anchor) if rel == f"vllm/{target}" else data)
    ref = push_base(drifted, registry_server.host, "drift/local")
    # the same cache holds an intact base's files first: a base's files never answer for another base
    run(tmp_path, base=realistic[0], load=True, engine_url=podman)
    client.api.pull(f"{registry_server.host}/drift/local", tag=drifted["index"], platform="linux/arm64")
    before = {i.id for i in client.images.list()}
    with pytest.raises(PatchFailed) as info:
        build("glm53-flash-nvfp4", base=ref, load=True, engine_url=podman, revision=REVISION,
              source_url=SOURCE, epoch=EPOCH, cache=tmp_path / "cache")
    assert "pool-topk-init" in str(info.value) and "anchor expected" in str(info.value)
    assert {i.id for i in client.images.list()} == before, "nothing was built"
    assert not client.containers.list(all=True), "the container the files were read from is gone"


@pytest.mark.registry
def test_load_without_the_base_in_the_engine_says_so_and_takes_the_engine_route(registry_server, podman, client,
                                                                                 tmp_path, monkeypatch):
    base = make_base(vllm_sdist(), tmp_path / "absent")
    ref = push_base(base, registry_server.host, "absent/base")
    notes = []

    class Say:
        def note(self, text):
            notes.append(text)

        @contextmanager
        def task(self, description, total):
            yield lambda n: None

    monkeypatch.setattr("patchkit.images.build.Quiet", Say)
    result = run(tmp_path, base=ref, load=True, engine_url=podman)
    assert result.route == "engine" and result.engine_image
    assert any(n.startswith("route: engine") and "not in the engine" in n for n in notes), notes
    # the engine route moves :latest too: `patchkit smoke --image patchkit/IMAGE:latest` runs this build
    named = {t.removeprefix("docker.io/").removeprefix("localhost/"): i.id for i in client.images.list()
             for t in i.tags}
    assert named[f"patchkit/{IMAGE}:latest"] == named[f"patchkit/{IMAGE}:{result.built.tag}"] == result.engine_image


def test_a_build_the_engine_refuses_is_an_engine_error_naming_the_build(client):
    """A context whose Dockerfile ADDs a file it does not hold: the engine refuses the build (in its stream
    or by its status), and nothing of it is left under the tags."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w:gz") as tar:
        data = b"FROM scratch\nADD absent.tar /\n"
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tags = tags_for("refused-test", "1", ())
    with pytest.raises(EngineError) as err:
        engine_build(client, context.getvalue(), tags, "linux/arm64", Quiet())
    assert err.value.step == "building the image" and "absent.tar" in err.value.detail, err.value
    assert not {t for i in client.images.list() for t in i.tags if "refused-test" in t}


@pytest.mark.registry
def test_a_pushed_name_holding_no_image_manifest_is_refused_naming_it(registry_server):
    """annotate_pushed reads back what the engine pushed: an index there (no manifest) is refused, typed."""
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode()
    RegistryClient(registry_server.host).put_manifest("pushed/index", "1", index, OCI_INDEX)
    tag = f"{registry_server.host}/pushed/index:1"
    with pytest.raises(UnreadablePush) as err:
        annotate_pushed(tag, {})
    assert (err.value.tag, err.value.media_type, err.value.problem) == (tag, OCI_INDEX, "")


@pytest.mark.registry
def test_load_push_reports_what_was_pushed_with_the_daemonless_annotations(registry_server, engine_realistic,
                                                                           engine_client, engine, tmp_path):
    """`--load --push`: each pushed ref is reported (name:tag@digest), and the manifest in the registry, read
    back by skopeo, carries the annotations the daemonless build of the same base writes."""
    ref, _ = engine_realistic
    repo = f"{registry_server.host}/pushed/{engine.rsplit('/', 1)[-1].split('.')[0]}"
    result = run(tmp_path, base=ref, load=True, engine_url=engine, push=[repo])
    assert result.route == "local-engine"
    tag = result.built.tag
    (pushed,) = result.pushed
    assert pushed.startswith(f"{repo}:{tag}@sha256:"), result.pushed
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{repo}:{tag}"],
                         capture_output=True, check=True).stdout
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == pushed.rsplit("@", 1)[1]
    manifest = json.loads(raw)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    daemonless = run(tmp_path / "daemonless", base=ref, dry_run=True).built
    # the same annotations, the one the local route adds aside (which engine image it built on)
    local_only = manifest["annotations"].pop("dev.patchkit.base.image-id")
    assert local_only == result.built.prepared.base.image_id
    assert manifest["annotations"] == daemonless.annotations
    # the layers the engine pushed are the manifest's: the image pulls back whole
    config = subprocess.run(["skopeo", "inspect", "--config", "--tls-verify=false", f"docker://{repo}:{tag}"],
                            capture_output=True, check=True).stdout
    assert json.loads(config)["config"]["Labels"]["dev.patchkit.series"] == result.built.labels["dev.patchkit.series"]
    # and the local names moved with it
    named = {t.removeprefix("docker.io/").removeprefix("localhost/"): i.id for i in engine_client.images.list()
             for t in i.tags}
    assert named[f"patchkit/{IMAGE}:latest"] == named[f"patchkit/{IMAGE}:{tag}"] == result.built.image_id


# -- image metadata ------------------------------------------------------------------------------------
@pytest.mark.parametrize("url, public", [
    ("https://github.com/owner/patchkit", "https://github.com/owner/patchkit"),
    ("https://github.com/owner/patchkit.git", "https://github.com/owner/patchkit"),
    ("https://user:token@github.com/owner/patchkit.git", "https://github.com/owner/patchkit"),
    ("git@github.com:owner/patchkit.git", "https://github.com/owner/patchkit"),
    ("ssh://git@gitlab.example.org/group/patchkit.git", "https://gitlab.example.org/group/patchkit"),
    ("/srv/git/patchkit", None),
    ("../patchkit", None),
    ("file:///srv/git/patchkit", None),
    ("C:\\src\\patchkit", None),
    ("unknown", None),
])
def test_only_a_url_people_can_open_is_a_source_label(url, public):
    assert public_url(url) == public


def test_a_clone_of_a_local_directory_has_no_source_and_the_commit_time(tmp_path, monkeypatch):
    upstream = git.Repo.init(tmp_path / "upstream")
    (tmp_path / "upstream" / "f").write_text("x\n")
    upstream.index.add(["f"])
    when = "1772600767 +0000"  # 2026-03-04T05:06:07Z
    upstream.index.commit("one", author_date=when, commit_date=when)
    clone = git.Repo.clone_from(str(tmp_path / "upstream"), tmp_path / "clone")
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert clone.remotes.origin.url == str(tmp_path / "upstream")
    assert git_source_url(tmp_path / "clone") is None
    assert build_epoch(None, tmp_path / "clone") == 1_772_600_767
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert build_epoch(None, tmp_path / "clone") == 1_700_000_000
    assert build_epoch(None, tmp_path) == 1_700_000_000
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert build_epoch(None, tmp_path) == 0, "outside a checkout, and only there, 1970"


IMAGES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "images").iterdir() if (p / "image.toml").exists())


def _entries(tar: tarfile.TarFile) -> dict[str, tuple]:
    """A layer's entries: path -> (kind, mode, bytes or None)."""
    found = {}
    for info in tar:
        data = tar.extractfile(info).read() if info.isreg() else None
        found["/" + info.name.lstrip("./")] = ("file" if info.isreg() else "dir" if info.isdir() else "other",
                                               info.mode & 0o7777, data)
    return found


@pytest.fixture(scope="module")
def engine_pinned(registry_server, engine_client, tmp_path_factory):
    """The pinned base's stand-in (vLLM 0.30.0's files under the base's dev version, tests/registry.py) in
    the registry and pulled into this engine, and a copy of images/ whose root definition pins it by
    digest: `--load` without `--base` must find it in the engine by that digest, as on a Spark."""
    made = make_stand_in(pinned_stand_in(), tmp_path_factory.mktemp("pinned") / "layout")
    ref = push_base(made, registry_server.host, "vllm/vllm-openai", tag="glm53-flash-arm64-cu130")
    engine_client.api.pull(ref.split("@")[0].rsplit(":", 1)[0], tag=ref.split("@")[1], platform="linux/arm64")
    return ref, images_pinned_to(ref, tmp_path_factory.mktemp("images") / "images")


@pytest.mark.registry
@pytest.mark.parametrize("image_name", IMAGES)
@pytest.mark.parametrize("base_kind", ["realistic", "pinned-stand-in"])
def test_every_image_loads_and_the_engine_image_matches_the_daemonless_layer(image_name, base_kind, request,
                                                                              engine_client, engine, tmp_path):
    """Checked independently of patchkit's own account: the engine's image, exported with `docker save`,
    has the base's layers unchanged and on top exactly the daemonless layer of the same inputs: the same
    patched files, bytes and modes, each stale bytecode the daemonless layer whites out overwritten by the
    stub, and nothing else (directories aside: the engine records the parents of what it adds). On the
    realistic base (vLLM 0.33.0's files, given by --base) and on the pinned base's stand-in (0.30.0's
    layout, found in the engine by the digest the definition pins)."""
    if base_kind == "realistic":
        ref, _ = request.getfixturevalue("engine_realistic")
        where = {"base": ref}
    else:
        ref, images = request.getfixturevalue("engine_pinned")
        where = {"images_dir": images}
    loaded = build(image_name, load=True, engine_url=engine, revision=REVISION, source_url=SOURCE,
                   epoch=EPOCH, cache=tmp_path / "cache", **where).built
    daemonless = build(image_name, dry_run=True, revision=REVISION, source_url=SOURCE, epoch=EPOCH,
                       cache=tmp_path / "cache", **where).built
    saved = tmp_path / "saved.tar"
    with open(saved, "wb") as out:
        for chunk in engine_client.images.get(loaded.image_id).save(named=False):
            out.write(chunk)
    base_layers = len(engine_client.images.get(ref.split("@")[0].rsplit(":", 1)[0] + "@" + ref.split("@")[1]).attrs["RootFS"]["Layers"])
    with tarfile.open(saved) as outer:
        (manifest,) = json.load(outer.extractfile("manifest.json"))
        added = manifest["Layers"][base_layers:]
        assert len(added) == 1, f"one layer on top of the base's {base_layers}, not {len(added)}"
        with tarfile.open(fileobj=outer.extractfile(added[0])) as top:
            engine_layer = _entries(top)
    with tarfile.open(fileobj=io.BytesIO(daemonless.layer.blob), mode="r:*") as layer:
        expected = _entries(layer)
    whiteouts = {p.replace("/.wh.", "/") for p in expected if "/.wh." in p}
    files = {p: v for p, v in expected.items() if v[0] == "file" and "/.wh." not in p}
    got_files = {p: v for p, v in engine_layer.items() if v[0] == "file"}
    assert {p: v for p, v in got_files.items() if p not in whiteouts} == files
    assert {p: v for p, v in got_files.items() if p in whiteouts} == {p: ("file", 0o644, BYTECODE_STUB)
                                                                      for p in whiteouts}
    assert not [p for p, v in engine_layer.items() if v[0] == "other"], "no links or devices"
    assert files and whiteouts, "the series changed files and whited out their bytecode"
