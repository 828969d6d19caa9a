"""Registry credentials come from where `docker login` put them: inline in config.json, or in a credential
helper (`credsStore`, `credHelpers`), spoken to over the real docker-credential protocol."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest

from hostile_registry import Answer, HostileRegistry
from patchkit.errors import PatchkitError
from patchkit.oci.registry import RegistryClient, UnreadableCredentials, _credentials
from patchkit.oci.transport import CredentialsNeeded, UnsupportedAuth

HOST = "127.0.0.1:5999"


@pytest.fixture
def docker_config(tmp_path, monkeypatch):
    """An empty DOCKER_CONFIG, no other auth file, and a PATH holding only our helper's folder first."""
    for var in ("REGISTRY_AUTH_FILE",):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "docker").mkdir()
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def helper(root, name: str, secrets: dict[str, tuple[str, str]]) -> None:
    """A docker-credential-<name> program answering `get` with the stored secret, as real helpers do."""
    script = root / "bin" / f"docker-credential-{name}"
    script.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                      f"secrets = {json.dumps({k: list(v) for k, v in secrets.items()})}\n"
                      "server = sys.stdin.read().strip()\n"
                      "if sys.argv[1] != 'get' or server not in secrets:\n"
                      "    print('credentials not found in native keychain'); sys.exit(1)\n"
                      "user, secret = secrets[server]\n"
                      "print(json.dumps({'ServerURL': server, 'Username': user, 'Secret': secret}))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def write_config(root, doc: dict) -> None:
    (root / "docker" / "config.json").write_text(json.dumps(doc))


def test_inline_auth(docker_config):
    write_config(docker_config, {"auths": {HOST: {"auth": base64.b64encode(b"ci:token").decode()}}})
    assert _credentials(HOST) == ("ci", "token")


def test_a_per_registry_credential_helper(docker_config):
    helper(docker_config, "patchkit-test", {HOST: ("alice", "s3cret")})
    write_config(docker_config, {"credHelpers": {HOST: "patchkit-test"}})
    assert _credentials(HOST) == ("alice", "s3cret")


def test_the_default_credential_store(docker_config):
    helper(docker_config, "store", {HOST: ("bob", "pw")})
    write_config(docker_config, {"credsStore": "store"})
    assert _credentials(HOST) == ("bob", "pw")


def test_no_entry_means_anonymous(docker_config):
    write_config(docker_config, {"auths": {"other.example:5000": {"auth": base64.b64encode(b"x:y").decode()}}})
    assert _credentials(HOST) is None


def test_a_broken_config_is_a_clear_error_naming_it(docker_config):
    (docker_config / "docker" / "config.json").write_text('{"auths": ')
    with pytest.raises(PatchkitError, match=r"config\.json"):
        _credentials(HOST)


@pytest.mark.filterwarnings("ignore:docker-credential-absent not installed")  # the docker SDK's, before it raises
@pytest.mark.parametrize("store", ["absent", "broken"])
def test_a_credential_helper_that_cannot_answer_is_a_clear_error_naming_the_file(store, docker_config):
    """A credsStore naming a helper not on PATH, or one that fails other than "not found"."""
    if store == "broken":
        script = docker_config / "bin" / "docker-credential-broken"
        script.write_text("#!/bin/sh\necho 'the keyring is locked'\nexit 3\n")
        script.chmod(0o755)
    write_config(docker_config, {"credsStore": store})
    with pytest.raises(UnreadableCredentials) as err:
        _credentials(HOST)
    assert (err.value.path, err.value.registry) == (str(docker_config / "docker" / "config.json"), HOST)
    assert f"docker-credential-{store}" in err.value.problem


@pytest.mark.parametrize("challenge, kind, scheme", [
    ('Basic realm="hostile"', CredentialsNeeded, None),  # asked for a login, and none is stored
    ('Negotiate', UnsupportedAuth, "negotiate"),
    ('Bearer service="hostile"', UnsupportedAuth, "bearer"),  # a bearer challenge without the realm to ask
])
def test_a_registry_challenge_patchkit_cannot_answer_is_refused(challenge, kind, scheme, docker_config):
    """tests/hostile_registry.py answers the manifest with a 401 and the challenge (the real docker-registry
    here runs without auth)."""
    with HostileRegistry() as reg:
        reg.route("GET", "/v2/x/y/manifests/base", Answer(401, b"", {"WWW-Authenticate": challenge}))
        with pytest.raises(kind) as err:
            RegistryClient(reg.host).get_manifest("x/y", "base")
    assert err.value.registry == reg.host
    if scheme is not None:
        assert err.value.scheme == scheme
