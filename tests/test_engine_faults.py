"""Engine faults at every step of `patchkit build IMAGE --load`, on podman and on the Docker Engine: a small
unix-socket proxy between patchkit and the engine counts the requests patchkit sends and, at request N,
drops the connection, or SIGKILLs the engine as its answer starts, or SIGKILLs it just after the build
says `Successfully tagged`. Whatever happens: exit 2 with a message (never exit 3, never a traceback), no
split tags (`:latest` only on the image the versioned tag names), no container left, and the next build
succeeds and moves both tags. The realistic base at tests/engines.py SCALE, the real patch set, the real
CLI in a fresh interpreter (tests/hostile.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from engines import (  # noqa: F401
    FaultProxy,
    dockerd_service,
    engine,
    engine_client,
    engine_realistic,
    engine_service,
    podman_service,
    sdk_client,
)
from hostile import assert_refused, run_patchkit
from patchkit.images.leftovers import HOLD_TAG, IMAGE_LABEL, recover
from registry import registry_server  # noqa: F401

IMAGE = "glm53-flash-nvfp4-4p67"
VERSIONED_PREFIX = f"patchkit/{IMAGE}:0.33.0-"
LATEST = f"patchkit/{IMAGE}:latest"
def load(url: str, ref: str, cache: Path, epoch: int, *extra: str):
    """`patchkit build IMAGE --load` through `url`, in a fresh interpreter (tests/hostile.py)."""
    return run_patchkit("build", IMAGE, "--base", ref, "--load", "--engine-url", url, "--json",
                        "--revision", "0" * 40, "--source-url", "https://example.invalid/patchkit", *extra,
                        env={"PATCHKIT_CACHE_DIR": str(cache), "SOURCE_DATE_EPOCH": str(epoch)}, timeout=300)


def tags(client) -> dict[str, str]:
    """This image's tags in the engine: name -> image id."""
    found = {}
    for image in client.images.list(name=f"patchkit/{IMAGE}"):
        for tag in image.tags:
            found[tag.removeprefix("docker.io/").removeprefix("localhost/")] = image.id
    return found


def assert_consistent(client, when: str) -> None:
    """No split tags."""
    named = tags(client)
    versioned = {t: i for t, i in named.items() if t.startswith(VERSIONED_PREFIX)}
    if LATEST in named:
        assert named[LATEST] in versioned.values(), f"{when}: split tags {named}"


def assert_recovered(client, when: str, before: str, built: bool) -> None:
    """After the next contact (images.leftovers.recover, which each build runs as it connects): no container
    (patchkit's, by its label, or any), `:latest` on the image it was on (or on the new one where the
    faulted build was committed, `built`), no mark of where it was, no untagged image of patchkit's."""
    left = client.containers.list(all=True)
    assert not left, f"{when}: containers left: {[(c.id[:12], c.labels) for c in left]}"
    named = tags(client)
    assert LATEST in named, f"{when}: {LATEST} is gone: {named}"
    versioned = {i for t, i in named.items() if t.startswith(VERSIONED_PREFIX)}
    assert named[LATEST] in versioned, f"{when}: split tags {named}"
    assert named[LATEST] == before or built, f"{when}: {LATEST} moved off {before} to {named[LATEST]} with no build"
    marks = [t for t in named if f":{HOLD_TAG}." in t]
    assert not marks, f"{when}: marks left: {marks}"
    untagged = client.images.list(filters={"dangling": True, "label": IMAGE_LABEL})
    assert not untagged, f"{when}: untagged images of patchkit's left: {[(i.id, i.attrs) for i in untagged]}"


def next_contact(engine_service) -> list[str]:
    """What the next build does first as it connects (images.leftovers.recover), here in this process."""
    fresh = sdk_client(engine_service.url)
    try:
        return recover(fresh)
    finally:
        fresh.close()


def warm(engine_service, engine_realistic, tmp_path) -> tuple[str, Path]:
    """A first build fills the member cache (the reads were swept file by file: test_engine_files_faults)
    and sets both tags; what follows starts from an engine where `:latest` names an image."""
    ref, _ = engine_realistic
    cache = tmp_path / "cache"
    first = load(engine_service.url, ref, cache, 1_700_000_000)
    assert first.code == 0, first.output[-3000:]
    return ref, cache


def fault_one_load(engine_service, engine_client, tmp_path, ref, cache, epoch, action, at, total) -> None:
    """One faulted `--load` (`action` at request `at` of the clean run's `total`), then what it must leave: its
    exit, consistent tags, and after the next contact's recover nothing of it."""
    before = tags(engine_client)[LATEST]
    proxy = FaultProxy(tmp_path / "fault.sock", engine_service.url, engine_service.kill, at=at, action=action)
    try:
        got = load(proxy.url, ref, cache, epoch)
    finally:
        proxy.close()
    if proxy.fired and action.startswith("kill"):
        engine_service.restart()
    where = f"{engine_service.kind} {action} at request {at} of {total} ({proxy.requests[at - 1] if at else ''})"
    # the last request removes the mark of where `:latest` was: the image is built, the build stands
    method, path = proxy.requests[at - 1] if at is not None else (b"", b"")
    releasing = method == b"DELETE" and f":{HOLD_TAG}.".encode() in path
    if proxy.fired and not releasing:
        assert got.code == 2, f"{where}: exit {got.code}: {got.output[-1500:]}"
        assert_refused(got)
    elif proxy.fired:
        said = " ".join(got.stderr.split())   # (rich wraps the notes)
        assert got.code == 0 and "`docker rmi" in said, f"{where}: exit {got.code}: {got.output[-1500:]}"
    else:
        assert got.code == 0, f"{where}: {got.output[-2000:]}"
    time.sleep(0.2)   # an engine that finishes a build after the connection was dropped
    assert_consistent(engine_client, where)
    done = next_contact(engine_service)
    named = tags(engine_client)
    built = named.get(LATEST) != before and named.get(LATEST) in {i for t, i in named.items()
                                                                  if t.startswith(VERSIONED_PREFIX)}
    assert_recovered(engine_client, f"{where} (recovered: {done})", before, got.code == 0 or built)


@pytest.mark.registry
def test_engine_faults_while_moving_the_tags_onto_an_image_the_engine_holds(
        engine_service, engine_client, engine_realistic, tmp_path):
    """The no-op rebuild (images.reuse: the engine holds the image, only the tags move) under the same sweep:
    two images of the same inputs but their epoch, each kept by a name of the user's, and each load asks
    for the one `:latest` is not on; no load builds (no /build request), every fault leaves the tags whole.
    First in the module: on podman, the step image of a build whose image a later build untagged can stay
    behind where recover does not remove it (seen after the build sweep's last build; not this route's)."""
    ref, cache = warm(engine_service, engine_realistic, tmp_path)
    epochs = {}
    for epoch, keep in ((1_700_000_000, "a"), (1_700_000_500, "b")):
        if keep == "b":
            assert load(engine_service.url, ref, cache, epoch).code == 0
        engine_client.api.tag(tags(engine_client)[LATEST], "keep/held", keep)
        epochs[tags(engine_client)[LATEST]] = epoch

    next_contact(engine_service)
    assert_recovered(engine_client, "two images held", tags(engine_client)[LATEST], False)

    def other() -> int:
        return next(e for i, e in epochs.items() if i != tags(engine_client)[LATEST])

    counting = FaultProxy(tmp_path / "count.sock", engine_service.url, engine_service.kill)
    clean = load(counting.url, ref, cache, other())
    counting.close()
    assert clean.code == 0 and "only the tags move" in " ".join(clean.stderr.split()), clean.output[-3000:]
    total = counting.count
    assert 5 <= total <= 30 and not [p for _, p in counting.requests if b"/build?" in p], counting.requests
    started = time.monotonic()
    cases = [(a, n) for a in ("drop", "kill", "garble") for n in range(1, total + 1)]
    for action, at in cases:
        fault_one_load(engine_service, engine_client, tmp_path, ref, cache, other(), action, at, total)
    assert set(tags(engine_client).values()) <= set(epochs), "no load built an image: each moved tags only"
    print(f"{engine_service.kind}: {len(cases)} faulted tag moves over {total} requests in "
          f"{time.monotonic() - started:.0f} s")


@pytest.mark.registry
def test_engine_faults_at_every_request_of_a_load_are_exit_2_and_leave_consistent_tags(
        engine_service, engine_client, engine_realistic, tmp_path):
    ref, cache = warm(engine_service, engine_realistic, tmp_path)
    epoch = 1_700_000_001

    def kill():
        engine_service.kill()

    counting = FaultProxy(tmp_path / "count.sock", engine_service.url, kill)
    clean = load(counting.url, ref, cache, epoch)
    counting.close()
    assert clean.code == 0, clean.output[-3000:]
    total = counting.count
    assert 5 <= total <= 30, counting.requests
    assert [m for m, path in counting.requests if path.startswith(b"/v1.41/build?")] == [b"POST"], counting.requests
    assert_consistent(engine_client, "a clean build")
    next_contact(engine_service)
    assert_recovered(engine_client, "a clean build", tags(engine_client)[LATEST], True)
    started = time.monotonic()
    cases = [(a, n) for a in ("drop", "kill", "garble") for n in range(1, total + 1)] + [("kill-tagged", None)]
    for action, at in cases:
        epoch += 1
        fault_one_load(engine_service, engine_client, tmp_path, ref, cache, epoch, action, at, total)
    # The engine's own record agrees after all of it, and the next build moves both tags.
    again = load(engine_service.url, ref, cache, epoch + 1)
    assert again.code == 0, again.output[-3000:]
    image_id = json.loads(again.stdout)["engine_image"]
    named = tags(engine_client)
    assert named[LATEST] == image_id and image_id in {i for t, i in named.items() if t.startswith(VERSIONED_PREFIX)}
    print(f"{engine_service.kind}: {len(cases)} faulted builds over {total} requests in "
          f"{time.monotonic() - started:.0f} s")


@pytest.mark.registry
def test_every_load_moves_latest_with_the_versioned_tag(engine_service, engine_client, engine_realistic, tmp_path):
    ref, cache = warm(engine_service, engine_realistic, tmp_path)
    before = tags(engine_client)[LATEST]
    second = load(engine_service.url, ref, cache, 1_700_000_100)
    assert second.code == 0, second.output[-3000:]
    image_id = json.loads(second.stdout)["engine_image"]
    named = tags(engine_client)
    assert image_id != before and named[LATEST] == image_id
    assert [t for t, i in named.items() if t.startswith(VERSIONED_PREFIX) and i == image_id], named


def _as_nobody(socket_path: str) -> subprocess.CompletedProcess:
    """patchkit's connect as `nobody` (uid/gid 65534, no groups) against `socket_path`: the interpreter
    starts as root (root's Python is not nobody's to run), imports, then drops to nobody before connecting."""
    code = ("import os, sys\nimport docker\nfrom patchkit.errors import PatchkitError\n"
            "from patchkit.engine import connect\n"
            "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
            "try:\n    connect(sys.argv[1])\nexcept PatchkitError as e:\n"
            "    print(type(e).__name__, getattr(e, 'cause', ''), '|', e)\n    sys.exit(2)\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    return subprocess.run([sys.executable, "-c", code, f"unix://{socket_path}"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": src}, timeout=60)


def test_a_user_the_socket_refuses_is_told_the_permission_and_the_fix():
    """A user outside the docker group: EACCES on the socket, named with the fix, not `no engine`."""
    if os.geteuid() != 0:
        pytest.fail("this test makes a root-only socket and connects as nobody: it runs as root (CI does)")
    where = Path(tempfile.mkdtemp(prefix="patchkit-sock-", dir="/tmp"))   # 0755 up to /: nobody may reach it
    where.chmod(0o755)
    path = where / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        server.listen(1)
        os.chmod(path, 0o660)   # root:root rw-rw----, as Docker's socket is root:docker
        refused = _as_nobody(str(path))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stdout.startswith("EngineError EACCES |"), refused.stdout
        assert "permission denied" in refused.stdout and str(path) in refused.stdout
        assert "sudo usermod -aG docker $USER" in refused.stdout and "log out and in" in refused.stdout
        # a socket nobody may use but nothing listens on is `no engine`, not a permission
        server.close()
        os.chmod(path, 0o666)
        absent = _as_nobody(str(path))
        assert absent.returncode == 2 and "no Docker-API engine" in absent.stdout, absent.stdout + absent.stderr
    finally:
        server.close()
        shutil.rmtree(where)
