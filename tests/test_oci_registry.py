"""The distribution client against a real registry (Debian's docker-registry on 127.0.0.1)."""

import hashlib

import pytest

from patchkit.errors import PatchkitError
from patchkit.oci.media import OCI_MANIFEST, canonical_json, sha256_digest
from patchkit.oci.progress import Quiet
from patchkit.oci.registry import NotAnImageReference, Outcome, Reference, RegistryClient
from patchkit.oci.transport import BadRetrySetting, RegistryError, RegistryUnreachable
from registry import free_port, registry_server  # noqa: F401  (session fixture)

pytestmark = pytest.mark.registry


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch):
    """Retries here wait milliseconds, not the half second and more a real push waits."""
    monkeypatch.setenv("PATCHKIT_REGISTRY_BACKOFF_S", "0.01")


class Notes(Quiet):
    """A Progress that keeps what it is told."""

    def __init__(self):
        self.said: list[str] = []

    def note(self, message):
        self.said.append(message)


@pytest.mark.parametrize("text, registry, repo, tag, digest", [
    ("ubuntu", "docker.io", "library/ubuntu", None, None),
    ("vllm/vllm-openai:glm53-flash-arm64-cu130@sha256:" + "a" * 64, "docker.io", "vllm/vllm-openai",
     "glm53-flash-arm64-cu130", "sha256:" + "a" * 64),
    ("127.0.0.1:5000/a/b:t", "127.0.0.1:5000", "a/b", "t", None),
    ("ghcr.io/o/img", "ghcr.io", "o/img", None, None),
    ("localhost/x", "localhost", "x", None, None),
])
def test_reference_parse(text, registry, repo, tag, digest):
    ref = Reference.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repo, tag, digest)


@pytest.mark.parametrize("bad", ["Upper/Case", "a::b", "x@sha256:123", ""])
def test_bad_references_are_refused(bad):
    with pytest.raises(NotAnImageReference) as err:
        Reference.parse(bad)
    assert err.value.text == bad


@pytest.mark.parametrize("attempts, backoff, read", [
    ("three", "", ("three", "")),      # not numbers: the environment's strings
    ("4", "soon", ("4", "soon")),
    ("0", "", (0, 0.5)),               # numbers out of range: as parsed, the default for the one unset
    ("", "61", (4, 61.0)),
    ("2", "-1", (2, -1.0)),
])
def test_a_retry_setting_a_policy_cannot_take_is_refused(attempts, backoff, read, monkeypatch):
    monkeypatch.setenv("PATCHKIT_REGISTRY_ATTEMPTS", attempts)
    monkeypatch.setenv("PATCHKIT_REGISTRY_BACKOFF_S", backoff)
    with pytest.raises(BadRetrySetting) as err:
        RegistryClient("127.0.0.1:1")  # reads its policy from the environment before any request
    assert (err.value.attempts, err.value.backoff) == read
    assert err.value.expected.startswith("a whole number" if isinstance(read[0], str) else "at least 1 attempt")


def test_blob_and_manifest_round_trip_with_cross_repo_mount(registry_server, tmp_path):
    client = RegistryClient(registry_server.host)
    data = b"layer bytes " * 1000
    digest = sha256_digest(data)
    assert not client.blob_exists("src/repo", digest)
    client.upload_blob("src/repo", digest, data)
    assert client.blob_exists("src/repo", digest)

    # mounted, not uploaded: the registry links the blob into the other repository
    assert client.push_blob("dst/repo", digest, data, mount_from="src/repo") is Outcome.MOUNTED
    assert client.blob_exists("dst/repo", digest)
    assert client.push_blob("dst/repo", digest, data, mount_from="src/repo") is Outcome.EXISTING
    # a mount from a repository that lacks the blob is declined: a warning, and the blob uploaded into
    # the session the registry opened instead
    other = b"other"
    notes = Notes()
    client = RegistryClient(registry_server.host, progress=notes)
    assert client.push_blob("dst/repo", sha256_digest(other), other, mount_from="src/repo") is Outcome.UPLOADED
    assert client.blob_exists("dst/repo", sha256_digest(other))
    assert [n for n in notes.said if n.startswith("warning:")] == [
        f"warning: registry {registry_server.host} declined to mount {sha256_digest(other)[:19]} from src/repo "
        "(it opened an upload session instead); uploading it"]

    path = tmp_path / "blob"
    client.download_blob("dst/repo", digest, path, len(data))
    assert path.read_bytes() == data

    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 4096)
    big_digest = "sha256:" + hashlib.sha256(big.read_bytes()).hexdigest()
    client.upload_blob("dst/repo", big_digest, big)
    assert client.blob_exists("dst/repo", big_digest)

    config = canonical_json({"architecture": "arm64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
    client.upload_blob("dst/repo", sha256_digest(config), config)
    manifest = canonical_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": sha256_digest(config), "size": len(config)},
                               "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                           "digest": digest, "size": len(data)}]})
    assert client.put_manifest("dst/repo", "v1", manifest, OCI_MANIFEST) == sha256_digest(manifest)
    assert client.get_manifest("dst/repo", "v1") == (manifest, OCI_MANIFEST)
    assert client.get_manifest("dst/repo", sha256_digest(manifest))[0] == manifest
    with pytest.raises(PatchkitError, match="not found"):
        client.get_manifest("dst/repo", "nope")


def test_a_blob_that_does_not_match_its_digest_is_refused_and_not_retried(registry_server, tmp_path):
    client = RegistryClient(registry_server.host)
    with pytest.raises(RegistryError) as err:
        client.upload_blob("x/repo", sha256_digest(b"claimed"), b"actual")   # bytes: the registry checks
    assert (err.value.status, err.value.attempts, err.value.blob) == (400, 1, sha256_digest(b"claimed"))
    assert "DIGEST_INVALID" in err.value.detail
    with pytest.raises(RegistryError) as err:
        client.download_blob("x/repo", sha256_digest(b"absent"), tmp_path / "b")
    assert (err.value.status, err.value.attempts) == (404, 1)
    assert "BLOB_UNKNOWN" in err.value.detail
    assert not (tmp_path / "b").exists()


def test_an_unreachable_registry_is_a_clear_error_after_the_bounded_retries():
    client = RegistryClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(RegistryUnreachable, match=r"cannot reach registry 127\.0\.0\.1") as err:
        client.get_manifest("a/b", "latest")
    assert err.value.status is None and err.value.attempts == client.retry.attempts == 4
    assert err.value.request == f"GET http://{client.registry}/v2/a/b/manifests/latest"
