"""A minimal OCI distribution client: manifests and blobs by digest, token auth, cross-repo mount.

Only what an append-one-layer build needs (distribution-spec v1.1): GET/HEAD/PUT manifests, GET/HEAD
blobs, monolithic blob upload (POST then PUT ?digest=), and `POST /v2/<name>/blobs/uploads/
?mount=<digest>&from=<repo>` so base layers already in the registry are linked into the target
repository instead of being downloaded and uploaded again. Every byte read is checked against the
digest it was asked for: a registry cannot hand back different content than the reference pins. Every
answer is outside input: a manifest or token answer is read up to the manifest limit and no further, a
blob stops at the size its descriptor gives (oci.verified), an error body is read for its first 64 KiB,
and JSON answers are decoded against their shape.

Credentials come from the files `docker login`/`podman login` write (`$REGISTRY_AUTH_FILE`,
`$DOCKER_CONFIG/config.json`, `~/.docker/config.json`), inline entries and credential helpers alike
(read by the docker SDK), so CI logs in with the usual action and a workstation with its credential store. Loopback registries are spoken to over plain HTTP, as Docker does; others over HTTPS
unless listed in `$PATCHKIT_INSECURE_REGISTRIES` (comma-separated host[:port]).
"""

from __future__ import annotations

import base64
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import msgspec
import requests
import urllib3

from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson, decode, load_json_object
from patchkit.oci.media import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    check_digest,
    sha256_digest,
)
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.schema import Typed
from patchkit.oci.verified import BlobMismatch, VerifiedStream
from patchkit.untrusted import InputTooLarge, limit_of, open_regular, read_file

MANIFEST_ACCEPT = ", ".join([OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST])
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
TIMEOUT = (10, 300)  # connect, read (seconds)
CHUNK = 1 << 20
ERROR_TEXT = 64 << 10  # what is read of an error answer's body: its message is in the first few hundred bytes
# A bounded body is read this much at a time: a Content-Encoding a server sends unasked is inflated a chunk
# at a time by urllib3, so one step of a deflate bomb (~1000:1) stays under 64 MiB.
BODY_STEP = 64 << 10
# A manifest or token answer arrives in well under a second; one dripped a byte at a time, each inside the
# read timeout, would otherwise keep a build waiting for ever.
BODY_DEADLINE_S = 120.0

_REF_RE = re.compile(
    r"^(?P<repo>[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


@dataclass(frozen=True)
class Reference:
    """`[registry/]repository[:tag][@sha256:...]`, normalized as Docker does (docker.io, library/)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        first, _, rest = text.partition("/")
        # The first component is a registry only if it looks like a host (Docker's rule).
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, remainder = first, rest
        else:
            registry, remainder = DOCKER_HUB, text
        m = _REF_RE.match(remainder)
        if not m:
            raise PatchkitError(f"{text!r} is not an image reference ([registry/]repository[:tag][@sha256:...])")
        repo = m.group("repo")
        if registry == DOCKER_HUB and "/" not in repo:
            repo = f"library/{repo}"
        return cls(registry, repo, m.group("tag"), m.group("digest"))

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    def with_tag(self, tag: str | None) -> Reference:
        return Reference(self.registry, self.repository, tag, None)


def _is_loopback(host: str) -> bool:
    hostname = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return hostname in ("localhost", "[::1]") or hostname.startswith("127.")


def _credentials(registry: str) -> tuple[str, str] | None:
    """(user, password) for `registry` from the files `docker login` / `podman login` write, read by the
    docker SDK: inline `auths` entries and the credential helpers (`credsStore`, `credHelpers`) that
    Docker Desktop, `docker-credential-pass` and cloud logins store them in."""
    import docker.auth
    import docker.errors

    files = [os.environ.get("REGISTRY_AUTH_FILE"),
             os.path.join(os.environ["DOCKER_CONFIG"], "config.json") if os.environ.get("DOCKER_CONFIG") else None,
             os.path.expanduser("~/.docker/config.json")]
    name = "index.docker.io" if registry == DOCKER_HUB else registry
    for path in filter(None, files):
        if not os.path.isfile(path):
            continue
        try:
            load_json_object(read_file(path, "config"), path)  # the SDK would skip a malformed file without a word
            entry = docker.auth.resolve_authconfig(docker.auth.load_config(config_path=path), name)
        except (docker.errors.DockerException, OSError, ValueError) as exc:
            raise PatchkitError(f"{path}: cannot read the credentials for {registry}: {exc}") from None
        # inline entries come back as username/password, credential helpers' as Username/Password
        entry = {k.lower(): v for k, v in (entry or {}).items()}
        if entry.get("username") is not None:
            return entry["username"], entry.get("password") or ""
    return None


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, params = header.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


class _Token(msgspec.Struct):
    token: str = ""
    access_token: str = ""


class _ErrorItem(msgspec.Struct):
    code: str = ""
    message: str = ""


class _Errors(msgspec.Struct):
    errors: list[_ErrorItem] = []


class _Upload:
    """A verified blob body with a length (so requests sends Content-Length, not chunked) and progress."""

    def __init__(self, stream: VerifiedStream, advance):
        self._stream = stream
        self._advance = advance

    def __len__(self) -> int:
        return len(self._stream)

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._advance(len(data))
        return data


def read_body(resp: requests.Response, kind: str, what: str) -> bytes:
    """A response body up to `kind`'s limit, refused past it (a declared Content-Length over it before
    a byte is read); a connection lost mid-body is an error, not a short document."""
    limit = limit_of(kind)
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        resp.close()
        raise InputTooLarge(what, kind, limit, int(declared))
    data = bytearray()
    deadline = time.monotonic() + BODY_DEADLINE_S
    read1 = getattr(resp.raw, "read1", None)  # urllib3 2: what has arrived, without waiting for a full step
    chunks = iter(lambda: read1(BODY_STEP, decode_content=True), b"") if read1 else resp.iter_content(BODY_STEP)
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > limit:
                raise InputTooLarge(what, kind, limit)
            if time.monotonic() > deadline:
                raise PatchkitError(f"{what}: the answer is still arriving after {BODY_DEADLINE_S:g} s "
                                    f"({len(data):,} B so far); a registry sends a manifest in well under a second")
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise PatchkitError(f"{what}: the answer broke off: {exc.__class__.__name__}: {exc}") from None
    finally:
        resp.close()
    return bytes(data)


class RegistryClient:
    def __init__(self, registry: str, *, progress: Progress | None = None, session: requests.Session | None = None):
        self.registry = registry
        insecure = {h.strip() for h in os.environ.get("PATCHKIT_INSECURE_REGISTRIES", "").split(",") if h.strip()}
        scheme = "http" if _is_loopback(registry) or registry in insecure else "https"
        host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
        self.base_url = f"{scheme}://{host}/v2/"
        self.session = session or requests.Session()
        self.progress = progress or Quiet()
        self._tokens: dict[str, str] = {}
        self._basic: str | None = None

    # -- plumbing -------------------------------------------------------------------------------
    def _request(self, method: str, path_or_url: str, scopes: tuple[str, ...], *, ok=(200,), keep_open=False,
                 **kw) -> requests.Response:
        """The answer to one request (after one round of authentication), its status in `ok`; closed
        unread unless `keep_open` (the caller then reads the body, bounded, and closes it)."""
        url = path_or_url if path_or_url.startswith("http") else urljoin(self.base_url, path_or_url)
        headers = dict(kw.pop("headers", {}))
        for attempt in range(2):
            auth = self._tokens.get(" ".join(scopes)) or self._basic
            if auth:
                headers["Authorization"] = auth
            if attempt and hasattr(kw.get("data"), "read"):
                raise PatchkitError(f"registry {self.registry} asked for credentials again in the middle of "
                                    f"{method} {url}; a streamed body cannot be sent twice")
            try:
                # Always streamed: a body is read only by the caller that wants it, and then bounded.
                resp = self.session.request(method, url, headers=headers, timeout=TIMEOUT, stream=True, **kw)
            except requests.RequestException as exc:
                raise PatchkitError(f"cannot reach registry {self.registry}: {exc.__class__.__name__}: {exc}") from None
            if resp.status_code == 401 and attempt == 0:
                resp.close()
                self._authenticate(resp, scopes)
                continue
            break
        if resp.status_code not in ok:
            raise PatchkitError(f"registry {self.registry}: {method} {url} answered {resp.status_code}: "
                                f"{_error_text(resp)}")
        if not keep_open:
            resp.close()
        return resp

    def _authenticate(self, resp: requests.Response, scopes: tuple[str, ...]) -> None:
        scheme, params = _parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        creds = _credentials(self.registry)
        if scheme == "basic":
            if not creds:
                raise PatchkitError(f"registry {self.registry} needs credentials: log in with docker/podman login")
            self._basic = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            return
        if scheme != "bearer" or "realm" not in params:
            raise PatchkitError(f"registry {self.registry} asked for unsupported authentication {scheme!r}")
        query = {"service": params.get("service", ""), "scope": list(scopes)}
        what = f"the token service of {self.registry} ({params['realm']})"
        try:
            tok = self.session.get(params["realm"], params=query, auth=creds, timeout=TIMEOUT, stream=True)
        except requests.RequestException as exc:
            raise PatchkitError(f"cannot reach {what}: {exc}") from None
        if tok.status_code != 200:
            raise PatchkitError(f"registry {self.registry} refused a token for {' '.join(scopes)} "
                                f"({tok.status_code}): {_error_text(tok)}")
        body = decode(read_body(tok, "manifest", what), _Token, what)
        token = body.token or body.access_token
        if not token:
            raise MalformedJson(what, "the answer holds no token (neither 'token' nor 'access_token')")
        self._tokens[" ".join(scopes)] = "Bearer " + token

    # -- manifests ------------------------------------------------------------------------------
    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str]:
        """(bytes, media type) of a manifest or index by tag or digest; a digest is verified."""
        resp = self._request("GET", f"{repo}/manifests/{ref}", (f"repository:{repo}:pull",),
                             ok=(200, 404), headers={"Accept": MANIFEST_ACCEPT}, keep_open=True)
        if resp.status_code == 404:
            resp.close()
            raise PatchkitError(f"{self.registry}/{repo}:{ref} not found in the registry")
        what = f"manifest {self.registry}/{repo}{'@' if ref.startswith('sha256:') else ':'}{ref}"
        data = read_body(resp, "manifest", what)
        if ref.startswith("sha256:") and sha256_digest(data) != ref:
            raise PatchkitError(f"{self.registry}/{repo}@{ref}: the registry returned a manifest with "
                                f"digest {sha256_digest(data)}")
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        return data, decode(data, Typed, what).mediaType or media_type

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> str:
        resp = self._request("PUT", f"{repo}/manifests/{ref}", (f"repository:{repo}:pull,push",), ok=(200, 201),
                             data=data, headers={"Content-Type": media_type})
        digest = sha256_digest(data)
        served = resp.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise PatchkitError(f"registry {self.registry} stored {repo}:{ref} as {served}, expected {digest}")
        return digest

    # -- blobs ----------------------------------------------------------------------------------
    def blob_exists(self, repo: str, digest: str) -> bool:
        resp = self._request("HEAD", f"{repo}/blobs/{check_digest(digest)}", (f"repository:{repo}:pull",),
                             ok=(200, 404))
        return resp.status_code == 200

    def download_blob(self, repo: str, digest: str, dest: Path, size: int | None = None) -> Path:
        """Stream a blob to `dest` (via a temporary file in the same directory), never past `size` bytes,
        verifying its digest before it is renamed into place."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self.stream_blob(repo, digest, size) as stream:
            fd, tmp = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    while chunk := stream.read(CHUNK):
                        out.write(chunk)
                    stream.finish()
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return dest

    def stream_blob(self, repo: str, digest: str, size: int | None = None) -> VerifiedStream:
        """A reader over a blob as it arrives (nothing on disk), stopping at `size` (the descriptor's) and
        checking the digest when the last byte arrives; `upload_blob` accepts it as a body."""
        what = f"registry {self.registry}: {repo}"
        resp = self._request("GET", f"{repo}/blobs/{check_digest(digest)}", (f"repository:{repo}:pull",),
                             keep_open=True)
        length = resp.headers.get("Content-Length", "")
        if size is not None and length.isdigit() and int(length) != size:
            resp.close()
            raise BlobMismatch(what, digest, "longer" if int(length) > size else "shorter", size,
                               f"a Content-Length of {int(length):,} B")
        if size is None and length.isdigit():
            size = int(length)
        return VerifiedStream(_Download(resp, size, self.progress, f"pull {digest[7:19]}"), digest, size, what)

    def mount_blob(self, repo: str, digest: str, from_repo: str) -> bool:
        """Link a blob from another repository of this registry. False if the registry declined (it
        then opened an upload session, which is cancelled)."""
        resp = self._request("POST", f"{repo}/blobs/uploads/?mount={check_digest(digest)}&from={from_repo}",
                             (f"repository:{repo}:pull,push", f"repository:{from_repo}:pull"), ok=(201, 202))
        if resp.status_code == 201:
            return True
        location = resp.headers.get("Location")
        if location:
            try:
                self.session.delete(urljoin(self.base_url, location), timeout=TIMEOUT, stream=True,
                                    headers={"Authorization": self._tokens.get(f"repository:{repo}:pull,push "
                                                                               f"repository:{from_repo}:pull", "")}).close()
            except requests.RequestException:
                pass  # an abandoned session expires on its own
        return False

    def upload_blob(self, repo: str, digest: str, content: bytes | Path | VerifiedStream) -> None:
        """Monolithic upload; `content` may be bytes, a file, or a verified stream (another registry's
        `stream_blob`, copied through without touching the disk). A file or stream is hashed as it is sent
        and the last chunk withheld unless it matches, so no registry is handed a wrong blob."""
        scopes = (f"repository:{repo}:pull,push",)
        resp = self._request("POST", f"{repo}/blobs/uploads/", scopes, ok=(202,))
        if not resp.headers.get("Location"):
            raise PatchkitError(f"registry {self.registry}: POST {repo}/blobs/uploads/ answered 202 without "
                                "the Location of the upload")
        location = urljoin(self.base_url, resp.headers["Location"])
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(content, bytes):
            with self.progress.task(f"push {digest[7:19]}", len(content)) as advance:
                self._request("PUT", location, scopes, ok=(201,), data=content, headers=headers)
                advance(len(content))
            return
        if isinstance(content, Path):
            f = open_regular(content, "layer")
            content = VerifiedStream(f, digest, os.fstat(f.fileno()).st_size, str(content))
        with content:
            if content.size is None:
                raise PatchkitError(f"cannot copy blob {digest}: its size is unknown")
            with self.progress.task(f"push {digest[7:19]}", content.size) as advance:
                self._request("PUT", location, scopes, ok=(201,), data=_Upload(content, advance),
                              headers={**headers, "Content-Length": str(content.size)})


class _Download:
    """A streaming blob body: `read(n)` with progress, and a length so it can be re-sent as a body."""

    def __init__(self, resp: requests.Response, size: int | None, progress: Progress, label: str):
        self._resp = resp
        self._raw = resp.raw
        self._raw.decode_content = False  # the blob's bytes as stored, never transfer-decoded
        self.size = size
        self._task = progress.task(label, size)
        self._advance = self._task.__enter__()

    def __len__(self) -> int:
        return self.size or 0

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._raw.read(None if n is None or n < 0 else n)
        except Exception as exc:  # urllib3 errors: a dropped connection mid-blob
            raise PatchkitError(f"download interrupted: {exc.__class__.__name__}: {exc}") from None
        self._advance(len(data))
        return data

    def close(self) -> None:
        if self._task is not None:
            self._task.__exit__(None, None, None)
            self._task = None
        self._resp.close()

    def __enter__(self) -> _Download:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _error_text(resp: requests.Response) -> str:
    """The registry's own words for a failure, from the first 64 KiB of its answer."""
    try:
        raw = resp.raw.read(ERROR_TEXT, decode_content=False) or b""  # never inflated: a message, not a bomb
    except Exception:  # urllib3's errors: the message is a courtesy, the status already says it failed
        raw = b""
    finally:
        resp.close()
    try:
        errors = msgspec.json.decode(raw, type=_Errors).errors
    except (msgspec.MsgspecError, RecursionError):
        errors = []
    text = raw.decode("utf-8", "replace")[:200]
    return "; ".join(f"{e.code}: {e.message}" for e in errors)[:2000] or text or resp.reason or ""
