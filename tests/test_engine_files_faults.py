"""Fault injection on the local-engine route's reads (`patchkit build IMAGE --load`): concurrent builds
on one cache, builds killed mid-way, hostile member caches, engine errors in the middle, bases whose
target files are not regular files. Real podman (private storage), real registry, the realistic base at
SCALE 0.001, with the fixtures of tests/engines.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
from pathlib import Path

import pytest

from engines import REFUSAL, FaultProxy, client, patched_files, podman, podman_service, realistic  # noqa: F401
from patchkit.engine import RUN_LABEL, EngineError, clear_command
from patchkit.errors import PatchkitError
from patchkit.images.build import build
from patchkit.images.local import find_local_base
from patchkit.oci.base import LocalBase, WrongPlatform
from patchkit.oci.media import Platform
from patchkit.sources.base import NotARegularMember
from patchkit.sources.cache import FileCache
from patchkit.sources.container_files import (
    BytecodeUnknown,
    ContainerRemoved,
    ContainerSource,
    GarbledArchive,
    NotAnImageId,
    VersionUnknown,
    cache_key,
)
from patchkit.sources.image_files import PackageRoot
from registry import registry_server  # noqa: F401

IMAGE = "glm53-flash-nvfp4-4p67"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SOURCE = "https://example.invalid/patchkit"
EPOCH = 1_700_000_000
HERE = Path(__file__).resolve().parent


def run(cache: Path, ref: str, podman: str, **kw):
    return build(IMAGE, base=ref, load=True, engine_url=podman, revision=REVISION, source_url=SOURCE,
                 epoch=EPOCH, cache=cache, **kw)


@pytest.fixture(scope="module")
def reference(realistic, client, podman, tmp_path_factory):
    """One cold build: its files, versions, request count and a copy of the warm cache it left."""
    ref, _ = realistic
    cache = tmp_path_factory.mktemp("reference") / "cache"
    loaded = run(cache, ref, podman).built
    assert not client.containers.list(all=True)
    (listing,) = (cache / "files" / "archives").glob("engine-image-*/members.json")
    return {"ref": ref, "cache": cache, "files": patched_files(loaded), "versions": loaded.prepared.versions,
            "requests": loaded.prepared.source.requests, "listing": json.loads(listing.read_text()),
            "key": listing.parent.name, "image_id": loaded.prepared.base.image_id,
            "loaded": loaded}


def warm_copy(reference, dest: Path) -> Path:
    shutil.copytree(reference["cache"], dest / "cache", symlinks=True)
    return dest / "cache"


def archive_dir(cache: Path, reference) -> Path:
    return cache / "files" / "archives" / reference["key"]


def ref_file(cache: Path, reference, member: str) -> Path:
    return archive_dir(cache, reference) / "refs" / hashlib.sha256(member.encode()).hexdigest()


def blob_of(cache: Path, reference, member: str) -> Path:
    digest = ref_file(cache, reference, member).read_text().split(" ", 1)[0]
    return cache / "files" / "blobs" / digest[:2] / digest


def leftover_containers(client):
    return client.containers.list(all=True)


def remove_containers(client):
    for c in client.containers.list(all=True):
        c.remove(force=True)


def outcome(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


def assert_clean_failure(got):
    """The project's standard: a PatchkitError, or an OSError naming what it could not do."""
    assert isinstance(got, BaseException), "the build was expected to fail"
    assert isinstance(got, (PatchkitError, OSError)), f"a {type(got).__name__} reached the user: {got}"
    if isinstance(got, OSError) and not isinstance(got, PatchkitError):
        assert got.filename, f"an OSError naming no path: {got}"


def assert_like_reference(got, reference):
    assert not isinstance(got, BaseException), f"{type(got).__name__}: {got}"
    assert patched_files(got.built) == reference["files"] and got.built.prepared.versions == reference["versions"]


# == 1. two builds at once on one cache ==================================================================
@pytest.mark.registry
def test_two_builds_at_once_in_threads_agree_and_leave_a_cache_that_serves_a_third(reference, podman, client,
                                                                                   tmp_path):
    cache = tmp_path / "cache"
    results, start = [None, None], threading.Barrier(2)

    def one(i):
        start.wait()
        results[i] = outcome(lambda: run(cache, reference["ref"], podman))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        assert_like_reference(got, reference)
    assert not leftover_containers(client)
    third = run(cache, reference["ref"], podman)
    assert third.built.prepared.source.requests == 0 and patched_files(third.built) == reference["files"]


BUILD_SCRIPT = textwrap.dedent(f"""
    import json, os, signal, sys
    from pathlib import Path
    from patchkit.images.build import build
    from patchkit.images import local
    from patchkit.sources import container_files
    from patchkit.sources import cache as cache_mod

    cache, ref, url, kill_at = sys.argv[1:5]
    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if kill_at.startswith("read:"):
        n, calls, original = int(kill_at[5:]), [], container_files.ContainerSource._from_engine
        def hooked(self, name):
            calls.append(name)
            if len(calls) == n:
                die()
            return original(self, name)
        container_files.ContainerSource._from_engine = hooked
    elif kill_at == "between-blob-and-ref":
        original_write = cache_mod.atomic_write
        def write(path, data):
            original_write(path, data)
            if "blobs" in path.parts:
                die()
        cache_mod.atomic_write = write
    elif kill_at == "listing":
        def put_listing(self, key, listing):
            die()
        cache_mod.FileCache.put_listing = put_listing
    elif kill_at == "engine-build":   # the engine's step: a build, or the tags moved onto the image it holds
        def engine_build(*a, **k):
            die()
        local.engine_build = local.engine_retag = engine_build
    result = build("{IMAGE}", base=ref, load=True, engine_url=url, revision="{REVISION}", source_url="{SOURCE}",
                   epoch={EPOCH:d}, cache=Path(cache))
    print(json.dumps({{"requests": result.built.prepared.source.requests,
                      "files": [[f.path, f.data.hex(), f.mode, f.uid, f.gid] for f in result.built.prepared.files]}}))
""")


def build_process(cache: Path, ref: str, podman: str, kill_at: str = "never") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    return subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(cache), ref, podman, kill_at], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.registry
def test_two_builds_at_once_in_processes_agree_and_leave_a_cache_that_serves_a_third(reference, podman, client,
                                                                                     tmp_path):
    cache = tmp_path / "cache"
    procs = [build_process(cache, reference["ref"], podman) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        done = json.loads(out.strip().splitlines()[-1])
        assert [(f[0], bytes.fromhex(f[1]), f[2], f[3], f[4]) for f in done["files"]] == reference["files"]
    assert not leftover_containers(client)
    third = run(cache, reference["ref"], podman)
    assert third.built.prepared.source.requests == 0 and patched_files(third.built) == reference["files"]


# == 2. a build killed at various points =================================================================
@pytest.mark.registry
@pytest.mark.parametrize("kill_at", ["read:1", "read:12", "between-blob-and-ref", "listing", "engine-build"])
def test_a_build_killed_leaves_a_cache_the_next_build_trusts_correctly(kill_at, reference, podman, client,
                                                                       tmp_path):
    cache = tmp_path / "cache"
    proc = build_process(cache, reference["ref"], podman, kill_at)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, err[-2000:])
    left = leftover_containers(client)
    print(f"\n{kill_at}: {len(left)} container(s) left behind by the killed build")
    # every container the killed run made carries its run's label (one whose create it never heard answered too)
    assert all(RUN_LABEL in c.labels for c in left), [c.labels for c in left]
    got = outcome(lambda: run(cache, reference["ref"], podman))
    assert_like_reference(got, reference)
    # the next build removes them as it connects, and its own as it ends
    assert not leftover_containers(client), [(c.id[:12], c.labels) for c in leftover_containers(client)]
    warm = run(cache, reference["ref"], podman)
    assert warm.built.prepared.source.requests == 0 and patched_files(warm.built) == reference["files"]


# == 3. hostile cache contents ===========================================================================
MODEL = "/usr/local/lib/python3.12/dist-packages/vllm/models/glm5next/common/model.py"
KDA = "/usr/local/lib/python3.12/dist-packages/vllm/models/glm5next/common/kda.py"


def listing_path(cache: Path, reference) -> Path:
    return archive_dir(cache, reference) / "members.json"


def edit_record(record):
    def apply(cache, reference):
        listing = json.loads(listing_path(cache, reference).read_text())
        listing[MODEL] = record
        listing_path(cache, reference).write_text(json.dumps(listing))
    return apply


def write_listing(raw: bytes):
    def apply(cache, reference):
        listing_path(cache, reference).write_bytes(raw)
    return apply


def blob_symlink_to_another_file(cache, reference):
    blob = blob_of(cache, reference, MODEL)
    other = blob_of(cache, reference, KDA)
    blob.unlink()
    blob.symlink_to(other)


def blob_symlink_to_a_directory(cache, reference):
    blob = blob_of(cache, reference, MODEL)
    blob.unlink()
    blob.symlink_to(cache)


# A damaged entry the cache must notice and read again from the engine: the build then matches the
# reference exactly.
HEALS = {
    "listing-not-json": write_listing(b"{not json"),
    "listing-null": write_listing(b"null"),
    "listing-truncated": write_listing(b'{"/usr/local/lib/python3.12/dist'),
    "listing-a-list": write_listing(b'["/usr/local/lib/python3.12/dist-packages/vllm/_version.py"]'),
    "listing-a-string": write_listing(b'"absent"'),
    "listing-a-number": write_listing(b"5"),
    "record-3-fields": edit_record("file 644 0"),
    "record-5-fields": edit_record("file 644 0 0 0"),
    "record-a-directory": edit_record("dir 755 0 0"),
    "record-a-number": edit_record(5),
    "record-a-list": edit_record(["file", "644", "0", "0"]),
    "record-bad-octal": edit_record("file 999 0 0"),
    "record-mode-beyond-permission-bits": edit_record("file 7777777777 0 0"),
    "record-negative-uid": edit_record("file 644 -7 0"),
    "blob-symlink-to-another-file": blob_symlink_to_another_file,
    "blob-symlink-to-a-directory": blob_symlink_to_a_directory,
}


@pytest.mark.registry
@pytest.mark.parametrize("case", sorted(HEALS))
def test_a_damaged_cache_entry_is_read_again_and_the_build_is_exact(case, reference, podman, client, tmp_path):
    cache = warm_copy(reference, tmp_path)
    HEALS[case](cache, reference)
    got = outcome(lambda: run(cache, reference["ref"], podman))
    assert_like_reference(got, reference)
    assert not leftover_containers(client)


def blob_is_a_directory(cache, reference):
    blob = blob_of(cache, reference, MODEL)
    blob.unlink()
    blob.mkdir()


def blob_folder_is_a_file(cache, reference):
    blob = blob_of(cache, reference, MODEL)
    shutil.rmtree(blob.parent)
    blob.parent.write_bytes(b"x")


@pytest.mark.registry
@pytest.mark.parametrize("damage", [blob_is_a_directory, blob_folder_is_a_file], ids=lambda f: f.__name__)
def test_a_cache_path_of_the_wrong_kind_heals_or_fails_naming_it(damage, reference, podman, client, tmp_path):
    cache = warm_copy(reference, tmp_path)
    damage(cache, reference)
    got = outcome(lambda: run(cache, reference["ref"], podman))
    if isinstance(got, Exception):
        assert_clean_failure(got)
        assert str(cache / "files" / "blobs") in str(got.filename)
    else:
        assert patched_files(got.built) == reference["files"]
    assert not leftover_containers(client)


@pytest.mark.registry
def test_a_cache_dir_that_cannot_be_created_fails_naming_it_and_leaves_no_container(reference, podman, client,
                                                                                    tmp_path):
    (tmp_path / "plain").write_bytes(b"a regular file")
    got = outcome(lambda: run(tmp_path / "plain" / "cache", reference["ref"], podman))
    assert_clean_failure(got)
    assert str(tmp_path / "plain") in got.filename
    assert not leftover_containers(client)
    assert (tmp_path / "plain").read_bytes() == b"a regular file"


@pytest.mark.registry
def test_a_listing_cannot_give_a_file_setuid_bits(reference, podman, client, tmp_path):
    """A file's mode and owner come from the engine's own archive of it, kept as a checked blob: the
    listing only says which paths are absent, so a record claiming other metadata changes nothing."""
    cache = warm_copy(reference, tmp_path)
    absent = sum(v == "absent" for v in json.loads(listing_path(cache, reference).read_text()).values())
    edit_record("file 4777 0 0")(cache, reference)
    got = run(cache, reference["ref"], podman)
    # the edited listing fails its MAC, so it vouches for nothing: only the absent paths are asked again
    assert 0 < got.built.prepared.source.requests == absent
    assert_like_reference(got, reference)


def ref_copied_from_another_member(cache, reference):
    shutil.copy(ref_file(cache, reference, KDA), ref_file(cache, reference, MODEL))


def ref_naming_another_blob(cache, reference):
    digest = ref_file(cache, reference, KDA).read_text().split(" ", 1)[0]
    ref_file(cache, reference, MODEL).write_text(f"{digest} {MODEL}")


@pytest.mark.registry
def test_a_ref_copied_from_another_member_is_noticed(reference, podman, client, tmp_path):
    """refs/<sha256(name)> holds "<blob sha256> <name>": a ref whose name is another member's is damaged."""
    cache = warm_copy(reference, tmp_path)
    ref_copied_from_another_member(cache, reference)
    got = outcome(lambda: run(cache, reference["ref"], podman))
    assert_like_reference(got, reference)


@pytest.mark.registry
@pytest.mark.parametrize("damage", [edit_record("absent"), ref_naming_another_blob],
                         ids=["record-absent-for-a-present-file", "ref-naming-another-valid-blob"])
def test_a_wrong_cache_entry_does_not_make_an_intact_base_fail_forever(damage, reference, podman, client,
                                                                      tmp_path):
    """A wrong but well-formed entry makes the plan fail against the base; the base is intact, so the
    failure must not be reported as the base's, again and again, while the cache holds the entry."""
    cache = warm_copy(reference, tmp_path)
    damage(cache, reference)
    first = outcome(lambda: run(cache, reference["ref"], podman))
    second = outcome(lambda: run(cache, reference["ref"], podman))
    for got in (first, second):
        if isinstance(got, Exception):
            assert_clean_failure(got)
            assert "cache" in str(got), f"the failure blames the base, not the cache: {got}"
    assert not isinstance(second, Exception), f"still failing on the next build: {second}"
    assert patched_files(second.built) == reference["files"]


def cli(cache: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATCHKIT_CACHE_DIR": str(cache), "SOURCE_DATE_EPOCH": str(EPOCH),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    env.pop("PATCHKIT_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "patchkit", "build", IMAGE, *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.registry
def test_the_command_line_on_a_listing_that_is_a_list_is_no_internal_error(reference, podman, client, tmp_path):
    cache = warm_copy(reference, tmp_path)
    listing_path(cache, reference).write_text('["not", "a", "mapping"]')
    done = cli(cache, "--load", "--engine-url", podman, "--base", reference["ref"], "--revision", REVISION,
               "--source-url", SOURCE)
    assert done.returncode in (0, 2), done.stderr[-1500:]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


# == 4. the engine failing in the middle =================================================================
@pytest.mark.registry
def test_containers_removed_under_a_read_are_not_taken_for_absent_files(reference, podman, client, tmp_path,
                                                                        monkeypatch):
    """Someone runs `docker rm -f $(docker ps -aq)` / `docker container prune` while patchkit reads: every
    later read answers 404 for the container, which is not "the base has no such file"."""
    from patchkit.sources.container_files import ContainerSource

    original, calls = ContainerSource._from_engine, []

    def hooked(self, name):
        calls.append(name)
        if len(calls) == 10:
            remove_containers(client)
        return original(self, name)

    monkeypatch.setattr(ContainerSource, "_from_engine", hooked)
    cache = tmp_path / "cache"
    got = outcome(lambda: run(cache, reference["ref"], podman))
    monkeypatch.undo()
    print(f"\ncontainers removed: {type(got).__name__}: {got}")
    if isinstance(got, Exception):
        assert isinstance(got, ContainerRemoved), f"{type(got).__name__}: {got}"
        assert got.spec == reference["ref"] and not got.path.endswith("METADATA"), f"a misleading failure: {got}"
    else:
        assert patched_files(got.built) == reference["files"]
    listing = json.loads(listing_path(cache, reference).read_text()) if listing_path(cache, reference).exists() else {}
    wrong = {k: v for k, v in listing.items() if reference["listing"].get(k) != v}
    assert not wrong, f"the cache now says these files of the base are absent: {sorted(wrong)}"
    again = outcome(lambda: run(cache, reference["ref"], podman))
    assert_like_reference(again, reference)


@pytest.mark.registry
def test_the_base_removed_between_finding_and_reading_is_a_clean_error(reference, realistic, podman, client,
                                                                       tmp_path, monkeypatch):
    import patchkit.images.build as build_mod

    found = build_mod.find_local_base

    def find_then_remove(*a, **k):
        local = found(*a, **k)
        client.images.remove(local.image_id, force=True)
        return local

    monkeypatch.setattr(build_mod, "find_local_base", find_then_remove)
    try:
        got = outcome(lambda: run(tmp_path / "cache", reference["ref"], podman))
    finally:
        monkeypatch.undo()
        ref, made = realistic
        client.api.pull(ref.split(":base@")[0], tag=made["manifest"])
    assert isinstance(got, EngineError), f"{type(got).__name__}: {got}"
    assert got.step == f"creating a container of {reference['ref']} to read its files" and got.cause != "", got
    assert not leftover_containers(client)
    listing = json.loads(listing_path(tmp_path / "cache", reference).read_text()) \
        if listing_path(tmp_path / "cache", reference).exists() else {}
    assert "absent" not in listing.values()


@pytest.mark.registry
def test_a_container_create_failing_after_others_were_made_removes_them(reference, podman, client, tmp_path,
                                                                        monkeypatch):
    import docker
    from docker.models.containers import ContainerCollection

    original, made, asked, lock = ContainerCollection.create, [], [], threading.Lock()
    both = threading.Barrier(2, timeout=120)

    def create(self, *a, **k):
        """The first create waits for a second reader to ask for one too; every later one fails."""
        with lock:
            asked.append(1)
            n = len(asked)
        if n <= 2:
            both.wait()
        if n == 1:
            made.append(original(self, *a, **k))
            return made[-1]
        raise docker.errors.APIError("no space left on device", explanation="no space left on device")

    monkeypatch.setattr(ContainerCollection, "create", create)
    got = outcome(lambda: run(tmp_path / "cache", reference["ref"], podman))
    monkeypatch.undo()
    assert isinstance(got, EngineError), f"{type(got).__name__}: {got}"
    assert (got.step, got.cause, got.detail) == (f"creating a container of {reference['ref']} to read its files",
                                                 "APIError", "no space left on device")
    assert len(made) == 1 and not leftover_containers(client)
    assert_like_reference(outcome(lambda: run(tmp_path / "cache", reference["ref"], podman)), reference)


@pytest.mark.registry
def test_the_engine_stopping_mid_read_is_a_clean_error(reference, podman_service, podman, client, tmp_path,
                                                       monkeypatch):
    from patchkit.sources.container_files import ContainerSource

    original, calls = ContainerSource._from_engine, []

    def hooked(self, name):
        calls.append(name)
        if len(calls) == 10:
            podman_service.__exit__()
        return original(self, name)

    monkeypatch.setattr(ContainerSource, "_from_engine", hooked)
    try:
        got = outcome(lambda: run(tmp_path / "cache", reference["ref"], podman))
    finally:
        monkeypatch.undo()
        podman_service.sock.unlink(missing_ok=True)
        podman_service.__enter__()
    left = leftover_containers(client)
    remove_containers(client)
    print(f"\nengine stopped: {type(got).__name__}: {got}; {len(left)} container(s) left")
    # (where the engine stops during a read, removing the containers made fails too, and its error is the one raised)
    assert isinstance(got, EngineError) and reference["ref"] in got.step, f"{type(got).__name__}: {got}"
    assert not isinstance(got, OSError) or isinstance(got, PatchkitError) or got.filename
    if left:
        # named by the command that removes them all, by this run's label (ids it never learnt included)
        assert clear_command() in str(got), f"{len(left)} container(s) left, not named: {got}"
        assert all(c.labels.get(RUN_LABEL) == clear_command().rsplit("=", 1)[1].rstrip(")") for c in left)


def faulted(podman, tmp_path, action: str, matching: bytes, call):
    """What `call(url)` gives through a FaultProxy before podman that answers `action` to every request
    whose path `matching` finds."""
    proxy = FaultProxy(tmp_path / "fault.sock", podman, lambda: None, action=action, matching=matching)
    try:
        return outcome(lambda: call(proxy.url))
    finally:
        proxy.close()


@pytest.mark.registry
def test_the_engine_refusing_every_read_is_an_engine_error_naming_the_read(reference, podman, client, tmp_path):
    got = faulted(podman, tmp_path, "refuse", rb"/archive\?", lambda url: run(tmp_path / "cache", reference["ref"], url))
    assert isinstance(got, EngineError), f"{type(got).__name__}: {got}"
    assert got.step.startswith("reading /") and got.step.endswith(f" from {reference['ref']}"), got.step
    assert (got.cause, got.detail, got.clean) == ("APIError", REFUSAL, [])
    assert not leftover_containers(client)


@pytest.mark.registry
def test_an_archive_answer_that_is_no_tar_is_a_garbled_archive(reference, podman, client, tmp_path):
    got = faulted(podman, tmp_path, "not-a-tar", rb"/archive\?",
                  lambda url: run(tmp_path / "cache", reference["ref"], url))
    assert isinstance(got, GarbledArchive), f"{type(got).__name__}: {got}"
    assert got.path.startswith("/usr/local/lib/python3.12/") and got.problem == "unreadable" and got.found, got
    assert not leftover_containers(client)


@pytest.mark.registry
def test_the_engine_refusing_a_lookup_by_name_is_an_engine_error(reference, podman, tmp_path):
    import docker

    def look_up(url):
        return find_local_base(docker.DockerClient(base_url=url, timeout=60), "localhost/patchkit-test:refused",
                               Platform.parse("linux/arm64"))

    got = faulted(podman, tmp_path, "refuse", rb"/images/localhost/", look_up)
    assert isinstance(got, EngineError), f"{type(got).__name__}: {got}"
    assert (got.step, got.cause, got.detail) == ("looking up the base localhost/patchkit-test:refused", "APIError",
                                                 REFUSAL)


@pytest.mark.registry
def test_a_base_of_another_platform_in_the_engine_is_refused_naming_both(reference, client):
    got = outcome(lambda: find_local_base(client, reference["ref"], Platform.parse("linux/amd64")))
    assert isinstance(got, WrongPlatform), f"{type(got).__name__}: {got}"
    assert (got.spec, got.found, got.wanted, got.in_engine) == (reference["ref"], "linux/arm64", "linux/amd64", True)
    assert "pull the linux/amd64 image" in str(got), got


# == 5. bases whose target files are not plain files =====================================================
COMMON = MODEL.rsplit("/", 1)[0]


def derived_base(client, reference, tag: str, entries) -> str:
    """An image FROM the engine's base with one more layer (entries: (TarInfo, bytes | None)), built by the
    engine itself (ADD only, nothing runs): its local tag."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for info, data in entries:
            info.mtime = EPOCH
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", f"FROM {reference['image_id']}\nADD layer.tar /\n".encode()),
                           ("layer.tar", layer.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for _ in client.api.build(fileobj=io.BytesIO(context.getvalue()), custom_context=True, tag=tag,
                              platform="linux/arm64", rm=True, decode=True):
        pass
    return tag


def entry(path: str, data: bytes | None = None, kind=tarfile.REGTYPE, link: str = "", mode=0o644):
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.linkname, info.mode = kind, link, mode
    info.size = len(data) if data is not None else 0
    return info, data


def kind_in(client, image_id: str, path: str) -> str:
    """What `path` is in the image, from the archive of its parent (podman follows a link named last)."""
    parent, name = path.rsplit("/", 1)
    container = client.containers.create(image_id, command=["/x"], entrypoint=[])
    try:
        chunks, _ = container.get_archive(parent)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            for info in tar:
                if info.name.rstrip("/") == f"{parent.rsplit('/', 1)[1]}/{name}":
                    return "symlink" if info.issym() else "directory" if info.isdir() else "file"
        return "absent"
    finally:
        container.remove(force=True)


def read_back(client, image_id: str, path: str):
    container = client.containers.create(image_id, command=["/x"], entrypoint=[])
    try:
        chunks, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            info = tar.next()
            return info, (tar.extractfile(info).read() if info.isreg() else None)
    finally:
        container.remove(force=True)


@pytest.mark.registry
@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_a_target_that_is_not_a_regular_file_is_refused_by_name(kind, reference, podman, client, tmp_path):
    model = dict((p, d) for p, d, *_ in reference["files"])[MODEL]
    if kind == "symlink":
        old = next(f.change.old for f in reference["loaded"].prepared.files if f.path == MODEL)
        made = [entry(MODEL + ".real", old),
                entry(MODEL, kind=tarfile.SYMTYPE, link="model.py.real")]
    else:
        made = [entry(MODEL, kind=tarfile.DIRTYPE, mode=0o755), entry(MODEL + "/x", b"x\n")]
    assert model
    tag = derived_base(client, reference, f"localhost/target-{kind}:1", made)
    got = outcome(lambda: run(tmp_path / "cache", tag, podman))
    assert isinstance(got, NotARegularMember), f"{type(got).__name__}: {got}"
    assert (got.member, got.where) == (MODEL, f"the engine's {tag}")
    # podman archives the link's target, naming it in its path-stat header; a directory's archive holds it
    assert (got.found, got.target) == (("a symbolic link", MODEL + ".real") if kind == "symlink"
                                       else ("a directory", None))
    assert not leftover_containers(client)


@pytest.mark.registry
def test_a_target_under_a_symlinked_directory_keeps_the_link_and_its_other_files(reference, podman, client,
                                                                                  tmp_path):
    """The base's vllm/models/glm5next/common is a symlink to common_real (as a vendor's relocation would
    leave it): the new layer must not turn it into a directory holding only the patched files."""
    originals = {f.path: f.change.old for f in reference["loaded"].prepared.files if f.path.startswith(COMMON + "/")}
    real = COMMON + "_real"
    made = [entry(real, kind=tarfile.DIRTYPE, mode=0o755), entry(real + "/sentinel.py", b"# kept\n")]
    made += [entry(real + p[len(COMMON):], data) for p, data in originals.items()]
    made += [entry(real + "/mtp.py" if COMMON + "/mtp.py" not in originals else real + "/unused.py", b"\n")]
    made += [entry(COMMON, kind=tarfile.SYMTYPE, link="common_real")]
    tag = derived_base(client, reference, "localhost/symlinked-dir:1", made)
    assert kind_in(client, tag, COMMON) == "symlink", "the derived base has the symlink"
    got = outcome(lambda: run(tmp_path / "cache", tag, podman))
    if isinstance(got, Exception):
        assert_clean_failure(got)
        assert COMMON in str(got)
        return
    image_id = got.built.image_id
    assert kind_in(client, image_id, COMMON) == "symlink", f"{COMMON} is a {kind_in(client, image_id, COMMON)} now"
    assert read_back(client, image_id, COMMON + "/sentinel.py")[1] == b"# kept\n"
    patched = dict((p, d) for p, d, *_ in reference["files"])
    assert read_back(client, image_id, real + "/model.py")[1] == patched[MODEL]


# == 6. what earlier runs left =============================================================================
@pytest.mark.registry
def test_recover_removes_only_the_containers_of_runs_that_are_over(reference, client):
    """A container labelled by a run whose process is gone is removed; one of a live run (this process), one
    whose label patchkit did not write and one with no label stay."""
    from patchkit.engine import this_run
    from patchkit.images.leftovers import recover

    gone = subprocess.run([sys.executable, "-c", "from patchkit.engine import this_run; print(this_run())"],
                          env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")}, capture_output=True, text=True,
                          check=True).stdout.strip()
    made = {label: client.containers.create(reference["image_id"], command=["/x"], entrypoint=[],
                                            labels={RUN_LABEL: label} if label else {}).id
            for label in (gone, this_run(), "someone-else", "")}
    try:
        done = recover(client)
        there = {c.id for c in client.containers.list(all=True)}
        assert made[gone] not in there and any(made[gone][:12] in line for line in done), done
        assert {made[this_run()], made["someone-else"], made[""]} <= there
    finally:
        remove_containers(client)


# == 7. what the engine's names and the base's paths cannot tell (no engine asked) ==========================
def test_an_image_id_that_is_not_sha256_is_refused():
    with pytest.raises(NotAnImageId) as err:
        cache_key("md5:0123", Platform.parse("linux/arm64"))
    assert err.value.image_id == "md5:0123"


ROOT = "/opt/vllm"     # a package root under no pythonX.Y
ID = "sha256:" + "ab" * 32


def offline_source(tmp_path, absent: list[str]) -> ContainerSource:
    """A ContainerSource over a member cache that knows `absent` paths are absent: it asks no engine for them."""
    base = LocalBase(spec="localhost/offline:1", name="localhost/offline:1", digest=ID,
                     platform=Platform.parse("linux/arm64"), image_id=ID, from_ref="localhost/offline:1")
    cache = FileCache(tmp_path / "cache", secret=b"test")
    cache.put_listing(cache_key(ID, base.platform), dict.fromkeys(absent, "absent"))
    return ContainerSource(None, base, [PackageRoot("vllm", ROOT.lstrip("/"), "vllm")], cache)


def test_a_module_under_no_pythonxy_is_refused_naming_it(tmp_path):
    with pytest.raises(BytecodeUnknown) as err:
        offline_source(tmp_path, []).bytecode("vllm", "models/x.py")
    assert (err.value.spec, err.value.path) == ("localhost/offline:1", f"{ROOT}/models/x.py")


def test_a_base_stating_no_version_is_refused_naming_the_package(tmp_path):
    source = offline_source(tmp_path, [f"{ROOT}/_version.py", f"{ROOT}/__init__.py"])
    with pytest.raises(VersionUnknown) as err:
        source.versions()
    assert (err.value.spec, err.value.package, err.value.module) == ("localhost/offline:1", "vllm", "_version.py")
