"""The registry client under faults: a real multi-layer image (the synthetic vLLM 0.33.0 base of
tests/bases.py and the layer `patchkit build` assembles on it) pushed through tests/faultproxy.py to the
real registry (Debian's docker-registry), with connections dropped, answers lost, 500s and 429s at each
request of the push in turn; mounts declined and refused; a persistent failure; parallel uploads; a pull
whose answers break off.

Which request is faulted is named by its kind and blob (`PUSH_SHAPE`), not by its place in the log:
blobs are pushed in parallel, so the fifth request of one push is another blob's than the fifth of the
next. The clean push checks that the shape is exactly what the client sends.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest
import requests

from bases import tar_gz
from faultproxy import FaultProxy, Rule
from hostile_registry import Answer, HostileRegistry
from patchkit.images.assemble import push_image
from patchkit.images.build import build
from patchkit.oci.base import open_base
from patchkit.oci.media import Platform
from patchkit.oci.progress import Quiet
from patchkit.oci.registry import RegistryClient
from patchkit.oci.transport import RegistryError, RetryPolicy
from registry import make_base, pull_blob, pull_manifest, push_base, registry_server, vllm_sdist  # noqa: F401

pytestmark = pytest.mark.registry

IMAGE = "glm53-flash-nvfp4-4p67"
BASE_LAYERS = 4          # tests/bases.make_base: OS, vllm, flashinfer, top
BLOBS = BASE_LAYERS + 2  # and the patched layer and the config
FAULTS = ["drop", "lose", 500, 429]


class Recorder(Quiet):
    """A Progress that keeps what it is told (list.append holds for notes from several threads)."""

    def __init__(self):
        self.notes: list[str] = []

    def note(self, message):
        self.notes.append(message)


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch):
    """Retries wait milliseconds (the first 10 ms, none over 0.2 s), not the half second a real push waits."""
    monkeypatch.setenv("PATCHKIT_REGISTRY_BACKOFF_S", "0.01")


@pytest.fixture(scope="module")
def proxy(registry_server):
    with FaultProxy(registry_server.host) as p:
        yield p


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    made = make_base(vllm_sdist(), tmp_path_factory.mktemp("base") / "layout")
    assert len(made["layers"]) == BASE_LAYERS
    return made


def _built(base_ref: str, cache):
    return build(IMAGE, base=base_ref, dry_run=True, cache=cache, epoch=1_700_000_000,
                 revision="0" * 40, source_url="https://example.invalid/patchkit").built


@pytest.fixture(scope="module")
def images(base, registry_server, proxy, tmp_path_factory):
    """The image built on the base twice: the base reached directly ("upload": a push through the proxy is
    to another registry, so every base layer is streamed across) and through the proxy ("mount": the same
    registry, so base layers are mounted)."""
    direct = push_base(base, registry_server.host, "faults/base")
    proxy.reset()
    return {"upload": _built(direct, tmp_path_factory.mktemp("c1")),
            "mount": _built(direct.replace(registry_server.host, proxy.host), tmp_path_factory.mktemp("c2"))}


def blob_digests(built) -> list[str]:
    """In the order push_image hands them to the pool."""
    config = "sha256:" + hashlib.sha256(built.config_bytes).hexdigest()
    return [d["digest"] for d in built.prepared.base.layers] + [built.layer.digest, config]


def shape(scenario: str) -> list[tuple[str, str, int]]:
    """(method, kind, blob or occurrence) of every request of a clean push, in no particular order."""
    blobs = range(BLOBS)
    mounted = range(BASE_LAYERS) if scenario == "mount" else range(0)
    uploaded = [i for i in blobs if i not in mounted]
    return ([("HEAD", "blob", i) for i in blobs] + [("POST", "mount", i) for i in mounted]
            + [("POST", "upload", n) for n in range(1, len(uploaded) + 1)]
            + [("PUT", "upload", i) for i in uploaded] + [("PUT", "manifest", 0), ("PUT", "manifest", 1)])


PUSH_SHAPE = [(scenario, *request) for scenario in ("upload", "mount") for request in shape(scenario)]


def rule_for(action, built, repo: str, method: str, kind: str, which: int, **kw) -> Rule:
    digests = blob_digests(built)
    if kind == "upload" and method == "POST":   # the same path for every blob: the n-th of them
        return Rule(action, method, rf"^/v2/{repo}/blobs/uploads/$", nth=which, **kw)
    path = {("HEAD", "blob"): rf"^/v2/{repo}/blobs/{{d}}$",
            ("POST", "mount"): rf"^/v2/{repo}/blobs/uploads/\?mount={{d}}&",
            ("PUT", "upload"): rf"^/v2/{repo}/blobs/uploads/[^?]+\?.*digest={{d}}$"}.get((method, kind))
    if path is None:
        ref = built.digest if which == 0 else built.tag
        return Rule(action, method, rf"^/v2/{repo}/manifests/{ref}$", **kw)
    return Rule(action, method, path.format(d=digests[which]), **kw)


def classify(seen, built, repo: str) -> tuple[str, str, int]:
    """The PUSH_SHAPE entry a logged request is (POST uploads numbered as they arrive)."""
    digests = blob_digests(built)
    path = seen.path
    if "/manifests/" in path:
        return (seen.method, "manifest", 0 if path.endswith(built.digest) else 1)
    if "?mount=" in path:
        return (seen.method, "mount", digests.index(path.split("mount=")[1].split("&")[0]))
    if seen.method == "POST":
        return (seen.method, "upload", -1)
    digest = path.rsplit("digest=", 1)[-1] if seen.method == "PUT" else path.rsplit("/", 1)[-1]
    return (seen.method, "upload" if seen.method == "PUT" else "blob", digests.index(digest))


def assert_pushed(registry_server, built, repo: str) -> None:
    """The registry (asked directly, not through the proxy) serves the built manifest under its tag, and
    every blob it names hashes to its digest."""
    data, _ = pull_manifest(registry_server.host, repo, built.tag)
    assert data == built.manifest_bytes
    manifest = json.loads(data)
    for desc in [manifest["config"], *manifest["layers"]]:
        blob = pull_blob(registry_server.host, repo, desc["digest"])
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == desc["digest"] and len(blob) == desc["size"]


@pytest.mark.parametrize("scenario", ["upload", "mount"])
def test_a_clean_push_sends_exactly_the_shape_the_faults_are_placed_on(scenario, images, proxy, registry_server):
    built, repo = images[scenario], f"clean-{scenario}/img"
    proxy.reset()
    recorder = Recorder()
    pushed = push_image(built, [f"{proxy.host}/{repo}"], progress=recorder)
    assert pushed == [f"{proxy.host}/{repo}:{built.tag}@{built.digest}"]
    assert_pushed(registry_server, built, repo)
    log = proxy.requests()
    got = [classify(s, built, repo) for s in log]
    posts = iter(range(1, len(got) + 1))
    got = [(m, k, next(posts)) if (m, k, w) == ("POST", "upload", -1) else (m, k, w) for m, k, w in got]
    assert sorted(got) == sorted(shape(scenario))
    assert [classify(s, built, repo)[1] for s in log[-2:]] == ["manifest", "manifest"]  # after every blob
    assert sum(n.startswith("mounted sha256:") for n in recorder.notes) == (BASE_LAYERS if scenario == "mount" else 0)
    assert not [n for n in recorder.notes if "warning" in n or "attempt" in n]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("scenario, method, kind, which", PUSH_SHAPE)
def test_a_push_survives_a_fault_at_each_request(scenario, method, kind, which, fault, images, proxy,
                                                 registry_server):
    built = images[scenario]
    repo = f"f-{scenario}-{method}-{kind}-{which}-{fault}".lower()
    rule = rule_for(fault, built, repo, method, kind, which)
    proxy.reset([rule])
    recorder = Recorder()
    pushed = push_image(built, [f"{proxy.host}/{repo}"], progress=recorder)
    assert rule.fired == 1, f"the fault never fired: {[(s.method, s.path) for s in proxy.requests()]}"
    assert pushed == [f"{proxy.host}/{repo}:{built.tag}@{built.digest}"]   # the clean push's digest
    assert_pushed(registry_server, built, repo)
    retried = [n for n in recorder.notes if "attempt 2 of 4" in n]
    assert len(retried) == 1, recorder.notes


def test_a_declined_mount_falls_back_to_an_upload_with_a_warning(base, registry_server, proxy, tmp_path):
    """The base repository no longer holds its OS layer: the real registry declines that mount (202, an
    upload session), and the layer is uploaded from the cache into the session it opened."""
    direct = push_base(base, registry_server.host, "faults/declining")
    built = _built(direct.replace(registry_server.host, proxy.host), tmp_path / "cache")
    os_layer = built.prepared.base.layers[0]
    built.prepared.base.blob(os_layer["digest"], os_layer["size"])   # cached: the fallback reads it there
    assert requests.delete(f"http://{registry_server.host}/v2/faults/declining/blobs/{os_layer['digest']}",
                           timeout=30).status_code == 202
    proxy.reset()
    recorder = Recorder()
    assert push_image(built, [f"{proxy.host}/declined/img"], progress=recorder) == [
        f"{proxy.host}/declined/img:{built.tag}@{built.digest}"]
    assert_pushed(registry_server, built, "declined/img")
    assert [n for n in recorder.notes if n.startswith("warning:")] == [
        f"warning: registry {proxy.host} declined to mount {os_layer['digest'][:19]} from faults/declining "
        "(it opened an upload session instead); uploading it"]
    assert sum(n.startswith("mounted sha256:") for n in recorder.notes) == BASE_LAYERS - 1
    # uploaded into the session the declined mount opened: no plain POST for it
    assert len(proxy.requests(r"^POST .*/blobs/uploads/$")) == 2


def test_a_refused_mount_falls_back_to_an_upload_with_a_warning(images, proxy, registry_server):
    built = images["mount"]
    proxy.reset([Rule(403, "POST", r"\?mount=", nth=0)])
    recorder = Recorder()
    assert push_image(built, [f"{proxy.host}/refused/img"], progress=recorder) == [
        f"{proxy.host}/refused/img:{built.tag}@{built.digest}"]
    assert_pushed(registry_server, built, "refused/img")
    warnings = sorted(n for n in recorder.notes if n.startswith("warning:"))
    assert len(warnings) == BASE_LAYERS and all("refused to mount" in w and "403: FAULT: injected 403" in w
                                                for w in warnings)
    assert len(proxy.requests(r"^POST .*\?mount=")) == BASE_LAYERS   # a refusal is not retried


def test_a_persistent_500_ends_in_a_typed_error_and_nothing_is_pushed(images, proxy, registry_server):
    built = images["upload"]
    vllm_layer = blob_digests(built)[1]
    proxy.reset([Rule(500, "PUT", rf"/blobs/uploads/.*digest={vllm_layer}$", nth=0)])
    recorder = Recorder()
    with pytest.raises(RegistryError) as err:
        push_image(built, [f"{proxy.host}/persistent/img"], progress=recorder)
    assert (err.value.status, err.value.blob, err.value.attempts) == (500, vllm_layer, 4)
    assert err.value.request.startswith(f"PUT http://{proxy.host}/v2/persistent/img/blobs/uploads/")
    assert err.value.detail == "FAULT: injected 500" and vllm_layer in str(err.value)
    assert len(proxy.requests(rf"^PUT .*digest={vllm_layer}$")) == 4
    seen = len(proxy.requests())
    time.sleep(0.5)
    assert len(proxy.requests()) == seen, "a blob push was still running after the push failed"
    assert not [n for n in recorder.notes if n.startswith("pushed")]
    assert registry_server.tags("persistent/img") == []
    assert not proxy.requests(r"/manifests/")


@pytest.mark.parametrize("value", ["0", "65", "four", "-1", " 2"])
def test_a_push_jobs_setting_outside_1_to_64_is_refused(value, monkeypatch):
    from patchkit.oci.push import BadPushJobs, push_jobs

    monkeypatch.setenv("PATCHKIT_PUSH_JOBS", value)
    with pytest.raises(BadPushJobs) as bad:
        push_jobs()
    assert bad.value.value == value and bad.value.exit_code == 2
    monkeypatch.setenv("PATCHKIT_PUSH_JOBS", "64")
    assert push_jobs() == 64


def test_blobs_are_pushed_in_parallel_and_one_failure_cancels_the_rest(images, proxy, monkeypatch):
    built = images["upload"]
    digests = blob_digests(built)
    slow = Rule("delay", "PUT", r"/blobs/uploads/.+digest=", nth=0, seconds=0.3)
    proxy.reset([slow])
    push_image(built, [f"{proxy.host}/parallel/img"])
    assert proxy.most_at_once(r"^PUT /v2/parallel/img/blobs/uploads/") >= 2
    monkeypatch.setenv("PATCHKIT_PUSH_JOBS", "1")
    proxy.reset([slow])
    push_image(built, [f"{proxy.host}/serial/img"])
    assert proxy.most_at_once(r"^PUT /v2/serial/img/blobs/uploads/") == 1
    # two at a time: the first blob fails for good while the second is slow; the four behind them never start
    monkeypatch.setenv("PATCHKIT_PUSH_JOBS", "2")
    proxy.reset([Rule(500, "HEAD", rf"/blobs/{digests[0]}$", nth=0),
                 Rule("delay", "PUT", r"/blobs/uploads/.+digest=", nth=0, seconds=1.0)])
    with pytest.raises(RegistryError) as err:
        push_image(built, [f"{proxy.host}/cancelled/img"])
    assert (err.value.status, err.value.blob) == (500, digests[0])
    heads = [digests.index(s.path.rsplit("/", 1)[1]) for s in proxy.requests(r"^HEAD ")]
    assert set(heads) == {0, 1}, [(s.method, s.path, s.fault) for s in proxy.requests()]
    assert not proxy.requests(r"/manifests/")


@pytest.mark.parametrize("fault", ["drop", "cut", 500, 429])
@pytest.mark.parametrize("request_kind", [r"/manifests/base$", r"/manifests/sha256:", r"/blobs/sha256:"])
def test_a_pull_survives_a_fault_at_each_request(request_kind, fault, images, proxy, registry_server, tmp_path):
    """Opening the base (index, manifest, config) and downloading a layer, each answer faulted in turn."""
    direct = f"{proxy.host}/faults/base:base"
    rule = Rule(fault, "GET", request_kind)
    proxy.reset([rule])
    base = open_base(direct, Platform.parse("linux/arm64"), cache=tmp_path / "cache")
    layer = base.layers[1]
    base.blob(layer["digest"], layer["size"])
    assert rule.fired == 1
    assert base.manifest_bytes == images["upload"].prepared.base.manifest_bytes
    assert hashlib.sha256(base.cached_path(layer["digest"]).read_bytes()).hexdigest() == layer["digest"][7:]


def test_retry_after_is_honoured_and_capped(proxy, registry_server):
    client = RegistryClient(proxy.host, retry=RetryPolicy(attempts=3, backoff_s=0.01, max_wait_s=1.5, budget_s=10))
    for retry_after, least, most in (("1", 1.0, 1.4), ("3600", 1.5, 1.9)):
        proxy.reset([Rule(429, "HEAD", r"/blobs/", retry_after=retry_after)])
        assert client.blob_exists("nothing/here", "sha256:" + "0" * 64) is False
        first, second = proxy.requests(r"^HEAD ")
        assert least <= second.start - first.start <= most


def test_a_read_timeout_mid_request_is_retried(images, proxy):
    built = images["upload"]
    proxy.reset()
    push_image(built, [f"{proxy.host}/timeout/img:t"])
    recorder = Recorder()
    client = RegistryClient(proxy.host, timeout=(5, 0.3), progress=recorder)
    proxy.reset([Rule("delay", "GET", r"/manifests/t$", seconds=1.0)])
    assert client.get_manifest("timeout/img", "t")[0] == built.manifest_bytes
    assert len(proxy.requests(r"^GET .*/manifests/t$")) == 2
    assert len(recorder.notes) == 1 and recorder.notes[0].startswith(
        f"registry {proxy.host}: GET http://{proxy.host}/v2/timeout/img/manifests/t failed; attempt 2 of 4 in ")


@pytest.mark.parametrize("code, survives", [("BLOB_UPLOAD_UNKNOWN", True), ("NAME_UNKNOWN", False)])
def test_an_upload_session_the_registry_lost_is_started_again_and_another_404_is_final(code, survives, proxy):
    data = b"a blob whose session is lost\n" * 1000
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    proxy.reset([Rule(404, "PUT", r"/blobs/uploads/", code=code)])
    client = RegistryClient(proxy.host)
    if survives:
        client.upload_blob(f"lost/{code.lower()}", digest, data)
        assert client.blob_exists(f"lost/{code.lower()}", digest)
        assert len(proxy.requests(r"^POST ")) == 2   # a new session for the second attempt
    else:
        with pytest.raises(RegistryError) as err:
            client.upload_blob(f"lost/{code.lower()}", digest, data)
        assert (err.value.status, err.value.attempts) == (404, 1) and "NAME_UNKNOWN" in err.value.detail


def test_a_token_request_is_retried_like_any_other(tmp_path):
    """tests/hostile_registry.py's token service (the real docker-registry here runs without auth) behind
    the proxy, which rewrites the challenge's realm to itself."""
    with HostileRegistry(token=True) as reg:
        reg.image("x/y", [tar_gz({"etc/os-release": b"ID=token\n"})[0]])
        reg.route("GET", "/token", Answer(200, b'{"token": "t"}'))
        with FaultProxy(reg.host) as p:
            p.reset([Rule(500, "GET", r"^/token", nth=1), Rule("drop", "GET", r"^/token", nth=2)])
            base = open_base(f"{p.host}/x/y:base", Platform.parse("linux/arm64"), cache=tmp_path / "cache")
            assert base.config["os"] == "linux"
            assert [s.fault for s in p.requests(r"^GET /token")][:3] == [500, "drop", None]
