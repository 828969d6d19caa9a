"""A minimal OCI distribution client: manifests and blobs by digest, token auth, cross-repo mount.

Only what an append-one-layer build needs (distribution-spec v1.1): GET/HEAD/PUT manifests, GET/HEAD
blobs, monolithic blob upload (POST then PUT ?digest=), and `POST /v2/<name>/blobs/uploads/
?mount=<digest>&from=<repo>` so base layers already in the registry are linked into the target
repository instead of being downloaded and uploaded again; a mount the registry declines or refuses is
warned about and the blob uploaded. Every request is retried as `oci.transport` says (bounded, with
backoff, whole attempts with rebuilt bodies). Every byte read is checked against the digest it was asked
for: a registry cannot hand back different content than the reference pins. Every answer is outside
input: a manifest or token answer is read up to the manifest limit and no further, a blob stops at the
size its descriptor gives (oci.verified), an error body is read for its first 64 KiB, and JSON answers
are decoded against their shape.

Credentials come from the files `docker login`/`podman login` write (`$REGISTRY_AUTH_FILE`,
`$DOCKER_CONFIG/config.json`, `~/.docker/config.json`), inline entries and credential helpers alike
(read by the docker SDK), so CI logs in with the usual action and a workstation with its credential store.
Loopback registries are spoken to over plain HTTP, as Docker does; others over HTTPS unless listed in
`$PATCHKIT_INSECURE_REGISTRIES` (comma-separated host[:port]).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import requests

from patchkit.errors import PatchkitError
from patchkit.jsondata import decode, load_json_object
from patchkit.localfiles import adjacent_tmp_file
from patchkit.oci.bodies import Download, Sending, Sent, once
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
from patchkit.oci.transport import (
    BODY_DEADLINE_S,
    TIMEOUT,
    Body,
    Cancelled,
    Reader,
    RegistryError,
    RetryPolicy,
    Transport,
    read_body,
    with_retries,
)
from patchkit.oci.verified import BlobMismatch, VerifiedStream
from patchkit.untrusted import open_regular, read_file

MANIFEST_ACCEPT = ", ".join([OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST])
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
CHUNK = 1 << 20

_REF_RE = re.compile(
    r"^(?P<repo>[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


class NotAnImageReference(PatchkitError):
    """`text` is not an image reference ([registry/]repository[:tag][@sha256:...]) (exit 2)."""

    def __init__(self, text: str):
        super().__init__(f"{text!r} is not an image reference ([registry/]repository[:tag][@sha256:...])")
        self.text = text


class UnreadableCredentials(PatchkitError):
    """The credentials file `path` (docker/podman login's) cannot be read for `registry`: `problem` (malformed,
    unreadable, or its credential helper failed) (exit 2)."""

    def __init__(self, path: str, registry: str, problem: str):
        super().__init__(f"{path}: cannot read the credentials for {registry}: {problem}")
        self.path, self.registry, self.problem = path, registry, problem


class ManifestDigestMismatch(PatchkitError):
    """`registry` answered the manifest `repo`@`digest` with bytes that hash to `found` (exit 2)."""

    def __init__(self, registry: str, repo: str, digest: str, found: str):
        super().__init__(f"{registry}/{repo}@{digest}: the registry returned a manifest with digest {found}")
        self.registry, self.repo, self.digest, self.found = registry, repo, digest, found


class StoredDigestMismatch(PatchkitError):
    """`registry` says it stored the manifest pushed as `repo`:`ref` as `stored` (its Docker-Content-Digest),
    not the `expected` digest of the bytes sent (exit 2)."""

    def __init__(self, registry: str, repo: str, ref: str, stored: str, expected: str):
        super().__init__(f"registry {registry} stored {repo}:{ref} as {stored}, expected {expected}")
        self.registry, self.repo, self.ref, self.stored, self.expected = registry, repo, ref, stored, expected


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
            raise NotAnImageReference(text)
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
            raise UnreadableCredentials(path, registry, str(exc)) from None
        # inline entries come back as username/password, credential helpers' as Username/Password
        entry = {k.lower(): v for k, v in (entry or {}).items()}
        if entry.get("username") is not None:
            return entry["username"], entry.get("password") or ""
    return None



class ManifestNotFound(RegistryError):
    """A tag or digest the registry does not hold (exit 2); `registry` the host asked, the rest as RegistryError."""

    def __str__(self) -> str:
        return f"{self.detail} not found in the registry"


class Outcome(StrEnum):
    """How a blob came to be in the target repository."""

    EXISTING = "existing"   # it was there already
    MOUNTED = "mounted"     # linked from another repository of the registry
    UPLOADED = "uploaded"


# A thread that pushes one of several blobs at once folds its transfers into the push's one bar: rich
# draws one live display at a time, and bars opened and closed by parallel threads would garble it.
_folded = threading.local()


@contextmanager
def transfers_folded() -> Iterator[None]:
    """Within it, blob transfers on this thread open no progress bar of their own."""
    _folded.on = True
    try:
        yield
    finally:
        _folded.on = False


class RegistryClient:
    def __init__(self, registry: str, *, progress: Progress | None = None, session: requests.Session | None = None,
                 retry: RetryPolicy | None = None, timeout: tuple[float, float] = TIMEOUT):
        """`retry`: the retry policy (default: from the environment, `RetryPolicy.from_env`)."""
        self.registry = registry
        insecure = {h.strip() for h in os.environ.get("PATCHKIT_INSECURE_REGISTRIES", "").split(",") if h.strip()}
        scheme = "http" if _is_loopback(registry) or registry in insecure else "https"
        host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
        self.base_url = f"{scheme}://{host}/v2/"
        self.progress = progress or Quiet()
        self.retry = retry or RetryPolicy.from_env()
        self.transport = Transport(registry, self.base_url, credentials=lambda: _credentials(registry),
                                   session=session, timeout=timeout)

    def _retrying(self, attempt, *, blob: str | None = None, cancel: threading.Event | None = None):
        return with_retries(attempt, self.retry, note=self.progress.note, blob=blob, cancel=cancel)

    def _task(self, label: str, total: int | None):
        return Quiet().task(label, total) if getattr(_folded, "on", False) else self.progress.task(label, total)

    # -- manifests ------------------------------------------------------------------------------
    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str]:
        """(bytes, media type) of a manifest or index by tag or digest; a digest is verified."""
        what = f"manifest {self.registry}/{repo}{'@' if ref.startswith('sha256:') else ':'}{ref}"

        def attempt() -> tuple[bytes, str]:
            resp = self.transport.send("GET", f"{repo}/manifests/{ref}", (f"repository:{repo}:pull",),
                                       ok=(200, 404), headers={"Accept": MANIFEST_ACCEPT}, keep_open=True)
            if resp.status_code == 404:
                resp.close()
                raise ManifestNotFound(self.registry, f"GET {resp.url}", 404, f"{self.registry}/{repo}:{ref}")
            media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
            return read_body(resp, "manifest", what, registry=self.registry, deadline_s=BODY_DEADLINE_S), media_type

        data, media_type = self._retrying(attempt)
        if ref.startswith("sha256:") and sha256_digest(data) != ref:
            raise ManifestDigestMismatch(self.registry, repo, ref, sha256_digest(data))
        return data, decode(data, Typed, what).mediaType or media_type

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> str:
        resp = self._retrying(lambda: self.transport.send(
            "PUT", f"{repo}/manifests/{ref}", (f"repository:{repo}:pull,push",), ok=(200, 201), body=data,
            headers={"Content-Type": media_type}))
        digest = sha256_digest(data)
        served = resp.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise StoredDigestMismatch(self.registry, repo, ref, served, digest)
        return digest

    # -- blobs ----------------------------------------------------------------------------------
    def blob_exists(self, repo: str, digest: str) -> bool:
        return self._retrying(lambda: self._exists(repo, digest))

    def _exists(self, repo: str, digest: str) -> bool:
        resp = self.transport.send("HEAD", f"{repo}/blobs/{check_digest(digest)}", (f"repository:{repo}:pull",),
                                   ok=(200, 404))
        return resp.status_code == 200

    def download_blob(self, repo: str, digest: str, dest: Path, size: int | None = None) -> Path:
        """Stream a blob to `dest` (via a temporary file in the same directory), never past `size` bytes,
        verifying its digest before it is renamed into place; a download that breaks off starts again."""
        dest.parent.mkdir(parents=True, exist_ok=True)

        def attempt() -> None:  # a blob is in place whole and durable, or not at all (localfiles)
            with self._open_blob(repo, digest, size) as stream, adjacent_tmp_file(dest) as out:
                while chunk := stream.read(CHUNK):
                    out.write(chunk)
                stream.finish()

        self._retrying(attempt, blob=digest)
        return dest

    def stream_blob(self, repo: str, digest: str, size: int | None = None) -> VerifiedStream:
        """A reader over a blob as it arrives (nothing on disk), stopping at `size` (the descriptor's) and
        checking the digest when the last byte arrives. The request is retried until its answer begins;
        a body that breaks off later is the reader's caller's to start again (`push_blob` does)."""
        return self._retrying(lambda: self._open_blob(repo, digest, size), blob=digest)

    def _open_blob(self, repo: str, digest: str, size: int | None) -> VerifiedStream:
        what = f"registry {self.registry}: {repo}"
        resp = self.transport.send("GET", f"{repo}/blobs/{check_digest(digest)}", (f"repository:{repo}:pull",),
                                   keep_open=True)
        length = resp.headers.get("Content-Length", "")
        if size is not None and length.isdigit() and int(length) != size:
            resp.close()
            raise BlobMismatch(what, digest, "longer" if int(length) > size else "shorter", size,
                               f"a Content-Length of {int(length):,} B")
        if size is None and length.isdigit():
            size = int(length)
        return VerifiedStream(Download(self.registry, resp, size, self._task(f"pull {digest[7:19]}", size)),
                              digest, size, what)

    def push_blob(self, repo: str, digest: str, content: bytes | Path | Callable[[], Reader], *,
                  mount_from: str | None = None, advance: Callable[[int], None] | None = None,
                  cancel: threading.Event | None = None) -> Outcome:
        """Blob `digest` into `repo` the cheapest way: there already (HEAD), mounted from `mount_from` (a
        repository of this registry), else uploaded whole. A mount the registry declines (202: it opened
        an upload session instead) or refuses (an error that would not pass) is a warning, and the blob
        is uploaded (into the session it opened). Each retry starts from the HEAD again, so a blob that
        arrived although its answer was lost is not sent twice. `content` as for `upload_blob`."""
        body, mount = self._body(digest, content), [mount_from]

        def attempt() -> Outcome:
            if self._exists(repo, digest):
                return Outcome.EXISTING
            location = None
            if mount[0]:
                location = self._mount(repo, digest, mount[0])
                if location is None:
                    return Outcome.MOUNTED
                mount[0] = None  # declined or refused: upload from now on, warned once
            self._upload(repo, digest, body, location or self._start_upload(repo), advance, cancel)
            return Outcome.UPLOADED

        return self._retrying(attempt, blob=digest, cancel=cancel)

    def _mount(self, repo: str, digest: str, from_repo: str) -> str | None:
        """None when mounted; else the upload session to put the blob into ("": none, start one)."""
        scopes = (f"repository:{repo}:pull,push", f"repository:{from_repo}:pull")
        try:
            resp = self.transport.send("POST", f"{repo}/blobs/uploads/?mount={check_digest(digest)}&from={from_repo}",
                                       scopes, ok=(201, 202))
        except RegistryError as err:
            if err.retryable:
                raise
            self.progress.note(f"warning: registry {self.registry} refused to mount {digest[:19]} from {from_repo} "
                               f"({err.status}: {err.detail[:200]}); uploading it instead")
            return ""
        if resp.status_code == 201:
            return None
        self.progress.note(f"warning: registry {self.registry} declined to mount {digest[:19]} from {from_repo} "
                           "(it opened an upload session instead); uploading it")
        return resp.headers.get("Location") or ""

    def upload_blob(self, repo: str, digest: str,
                    content: bytes | Path | Callable[[], Reader] | VerifiedStream) -> None:
        """Monolithic upload; `content` may be bytes, a file, a callable that opens the blob at its start
        (another registry's `stream_blob`, copied through without touching the disk), or one such stream
        (sent once: a retry then has nothing to send). A file or stream is hashed as it is sent and the
        last chunk withheld unless it matches, so no registry is handed a wrong blob."""
        body = self._body(digest, content)
        total = (len(content) if isinstance(content, bytes) else content.size if isinstance(content, VerifiedStream)
                 else content.stat().st_size if isinstance(content, Path) else None)
        with self._task(f"push {digest[7:19]}", total) as advance:
            self._retrying(lambda: self._upload(repo, digest, body, self._start_upload(repo), advance, None),
                           blob=digest)

    def _start_upload(self, repo: str) -> str:
        resp = self.transport.send("POST", f"{repo}/blobs/uploads/", (f"repository:{repo}:pull,push",), ok=(202,))
        if not resp.headers.get("Location"):
            raise RegistryError(self.registry, f"POST {resp.url}", 202, "answered without the Location of the upload")
        return resp.headers["Location"]

    def _upload(self, repo: str, digest: str, body: Body, location: str, advance: Callable[[int], None] | None,
                cancel: threading.Event | None) -> None:
        """PUT the whole blob into upload session `location`, committing it."""
        url = self.transport.url(location)
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        sent = Sent(advance or (lambda n: None))
        if isinstance(body, bytes):
            data: Body = body
        else:
            def data() -> Reader | bytes:
                reader = body()
                if isinstance(reader, bytes):
                    return reader
                if not len(reader):  # an empty blob: requests would send a length-0 stream chunked
                    empty = reader.read()
                    reader.close()
                    return empty
                return Sending(reader, sent, cancel)
        if cancel is not None and cancel.is_set():
            raise Cancelled(digest)
        resp = self.transport.send("PUT", url, (f"repository:{repo}:pull,push",), ok=(201,), body=data,
                                   headers={"Content-Type": "application/octet-stream"}, lost_session=True)
        if isinstance(body, bytes):
            sent.to(len(body))
        served = resp.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryError(self.registry, f"PUT {url}", 201, f"stored the blob as {served}", blob=digest)

    def _body(self, digest: str, content: bytes | Path | Callable[[], Reader] | VerifiedStream) -> Body:
        """`content` as something each send opens afresh at its start."""
        check_digest(digest)
        if isinstance(content, bytes):
            return content
        if isinstance(content, Path):
            def reopen() -> Reader:
                f = open_regular(content, "layer")
                return VerifiedStream(f, digest, os.fstat(f.fileno()).st_size, str(content))
            return reopen
        if isinstance(content, VerifiedStream):
            return once(content, digest)
        return content
