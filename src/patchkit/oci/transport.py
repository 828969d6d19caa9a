"""One request to a registry, retried as go-containerregistry retries it, and its failures typed.

The unit that is retried is an *attempt*: a function that makes one or more requests (a blob push is HEAD,
POST, PUT) and reads what it needs of the answers. An attempt that fails for a reason that may pass (an
answer of 408, 429, 500, 502, 503 or 504, a connection refused, reset or timed out, an answer that broke
off) is made again from its start after a wait that doubles, with jitter, within a small total budget; a
429's Retry-After is honoured up to the longest single wait. Anything else (400, 403, 404, a digest that
does not match, an answer over its limit) ends it at once. Why whole attempts and not single requests:
a blob whose PUT failed half-way cannot be re-sent on the same upload session (the registry may hold
half of it), so its retry starts a new session and sends the whole blob again (ggcr's `uploadOne`).

Request bodies are rebuilt for every send, never rewound (Go's `GetBody`): bytes, or a callable that
opens the content at its start (`Body`).
"""

from __future__ import annotations

import base64
import email.utils
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urljoin

import msgspec
import requests
import requests.adapters
import urllib3

from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson, decode
from patchkit.untrusted import InputTooLarge, limit_of

T = TypeVar("T")
TIMEOUT = (10, 300)  # connect, read (seconds)
ERROR_TEXT = 64 << 10  # what is read of an error answer's body: its message is in the first few hundred bytes
# A bounded body is read this much at a time: a Content-Encoding a server sends unasked is inflated a chunk
# at a time by urllib3, so one step of a deflate bomb (~1000:1) stays under 64 MiB.
BODY_STEP = 64 << 10
# A manifest or token answer arrives in well under a second; one dripped a byte at a time, each inside the
# read timeout, would otherwise keep a build waiting for ever.
BODY_DEADLINE_S = 120.0
# go-containerregistry's defaultRetryStatusCodes, less its nginx-only 499.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# What requests and urllib3 raise for a connection refused, reset, closed or timed out mid-request.
CONNECTION_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                     urllib3.exceptions.HTTPError)


class Reader(Protocol):
    def read(self, n: int = -1) -> bytes: ...
    def __len__(self) -> int: ...
    def close(self) -> None: ...


Body = bytes | Callable[[], Reader | bytes]   # a callable opens the content at its start, once per send


class BadRetrySetting(PatchkitError):
    """PATCHKIT_REGISTRY_ATTEMPTS / PATCHKIT_REGISTRY_BACKOFF_S are not what a retry policy takes (exit 2):
    `attempts` and `backoff` as read (the environment's strings where they are not numbers, else the numbers
    they give, defaults for one unset), `expected` what they should be."""

    def __init__(self, attempts: str | int, backoff: str | float, expected: str):
        shown = f"{backoff!r}" if isinstance(backoff, str) else f"{backoff:g}"
        super().__init__(f"PATCHKIT_REGISTRY_ATTEMPTS={attempts!r} / PATCHKIT_REGISTRY_BACKOFF_S={shown}: "
                         f"expected {expected}")
        self.attempts, self.backoff, self.expected = attempts, backoff, expected


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a failed attempt is made again. `from_env` reads PATCHKIT_REGISTRY_ATTEMPTS
    (4) and PATCHKIT_REGISTRY_BACKOFF_S (the first wait, 0.5 s); each next wait doubles, none is longer
    than 20 times the first (10 s) and all together no longer than 60 times it (30 s)."""

    attempts: int = 4
    backoff_s: float = 0.5
    factor: float = 2.0
    jitter: float = 0.1
    max_wait_s: float = 10.0
    budget_s: float = 30.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        attempts = os.environ.get("PATCHKIT_REGISTRY_ATTEMPTS", "")
        backoff = os.environ.get("PATCHKIT_REGISTRY_BACKOFF_S", "")
        try:
            first = float(backoff) if backoff else cls.backoff_s
            tries = int(attempts) if attempts else cls.attempts
        except ValueError:
            raise BadRetrySetting(attempts, backoff, "a whole number of attempts and a number of seconds") from None
        if tries < 1 or not 0 <= first <= 60:
            raise BadRetrySetting(tries, first, "at least 1 attempt and a first wait of 0 to 60 s")
        return cls(attempts=tries, backoff_s=first, max_wait_s=20 * first, budget_s=60 * first)

    def wait(self, failed: int, retry_after: float | None) -> float:
        """Seconds to wait after the `failed`-th attempt failed: the registry's Retry-After if it gave one,
        else the doubling backoff with jitter; capped at `max_wait_s` either way."""
        if retry_after is not None:
            return min(retry_after, self.max_wait_s)
        wait = self.backoff_s * self.factor ** (failed - 1)
        return min(wait * random.uniform(1 - self.jitter, 1 + self.jitter), self.max_wait_s)


class RegistryError(PatchkitError):
    """A request the registry did not answer as asked (exit 2): `request` ("PUT <url>"), `status` (None: no
    answer: the connection was refused, reset or timed out), `detail` (the registry's own words, bounded),
    `attempts` made, `registry` the host, and `blob` when it was part of a blob's push. `retryable` says whether the failure may
    pass; `retry_after` is the wait the registry asked for."""

    def __init__(self, registry: str, request: str, status: int | None, detail: str, *,
                 retryable: bool = False, retry_after: float | None = None, blob: str | None = None):
        self.registry, self.request, self.status, self.detail = registry, request, status, detail
        self.retryable, self.retry_after, self.blob = retryable, retry_after, blob
        self.attempts = 1
        self.gave_up = ""   # why no further attempt was made when one could have been
        super().__init__(registry, request, status, detail)

    def __str__(self) -> str:
        blob = f" (pushing blob {self.blob})" if self.blob else ""
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        what = (f"answered {self.status}" if self.status is not None else "got no answer")
        return (f"registry {self.registry}: {self.request}{blob} {what}{tries}: {self.detail}"
                + (f" ({self.gave_up})" if self.gave_up else ""))


class RegistryUnreachable(RegistryError):
    """No answer at all (retryable): the connection to `registry` was refused, reset or timed out during
    `request`; `detail` says which."""

    def __init__(self, registry: str, request: str, detail: str, **kw):
        super().__init__(registry, request, None, detail, retryable=True, **kw)

    def __str__(self) -> str:
        return f"cannot reach registry {self.registry} ({super().__str__()})"


class Cancelled(PatchkitError):
    """An attempt stopped because another blob of the same push failed (never reported on its own): the
    `blob` it was for (None when the attempt names none)."""

    def __init__(self, blob: str | None = None):
        self.blob = blob
        super().__init__(f"cancelled{f' {blob}' if blob else ''}: another blob of this push failed")


class AnswerPastDeadline(PatchkitError):
    """`what` (a registry's answer) was still arriving after `deadline_s` seconds, `received` bytes of it so
    far (exit 2): dripped to keep a build waiting."""

    def __init__(self, what: str, deadline_s: float, received: int):
        super().__init__(f"{what}: the answer is still arriving after {deadline_s:g} s "
                         f"({received:,} B so far); a registry sends a manifest in well under a second")
        self.what, self.deadline_s, self.received = what, deadline_s, received


class CredentialsNeeded(PatchkitError):
    """`registry` asked for credentials (HTTP basic) and none are stored for it (exit 2)."""

    def __init__(self, registry: str):
        super().__init__(f"registry {registry} needs credentials: log in with docker/podman login")
        self.registry = registry


class UnsupportedAuth(PatchkitError):
    """`registry` challenged with an authentication `scheme` patchkit does not speak (only basic, and bearer
    with a realm) (exit 2)."""

    def __init__(self, registry: str, scheme: str):
        super().__init__(f"registry {registry} asked for unsupported authentication {scheme!r}")
        self.registry, self.scheme = registry, scheme


def retry_after_s(resp: requests.Response) -> float | None:
    """A 429/503's Retry-After: delay-seconds or an HTTP-date (RFC 9110 10.2.3); None when absent or unreadable."""
    value = resp.headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def with_retries(attempt: Callable[[], T], policy: RetryPolicy, *, note: Callable[[str], None],
                 blob: str | None = None, cancel: threading.Event | None = None) -> T:
    """`attempt()`'s result, made again while it fails retryably (see the module docstring); the last
    failure raised with the number of attempts. `cancel` set stops it between attempts and in a wait."""
    spent = 0.0
    for made in range(1, policy.attempts + 1):
        if cancel is not None and cancel.is_set():
            raise Cancelled(blob)
        try:
            return attempt()
        except RegistryError as err:
            err.attempts, err.blob = made, err.blob or blob
            if not err.retryable:
                raise
            if made == policy.attempts:
                if made > 1:
                    err.gave_up = f"{policy.attempts} attempts in {spent:.1f} s of waiting"
                raise
            wait = policy.wait(made, err.retry_after)
            if spent + wait > policy.budget_s:
                err.gave_up = f"waiting {wait:.1f} s more would pass the {policy.budget_s:g} s retry budget"
                raise
            spent += wait
            note(f"registry {err.registry}: {err.request} {'answered ' + str(err.status) if err.status else 'failed'}"
                 f"{f' (blob {blob[:19]})' if blob else ''}; attempt {made + 1} of {policy.attempts} in {wait:.1f} s")
            if cancel is not None:
                if cancel.wait(wait):
                    raise Cancelled(blob) from None
            else:
                time.sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises


class _ErrorItem(msgspec.Struct):
    code: str = ""
    message: str = ""


class _Errors(msgspec.Struct):
    errors: list[_ErrorItem] = []


def error_answer(resp: requests.Response) -> tuple[str, set[str]]:
    """The registry's own words for a failure and its error codes, from the first 64 KiB of its answer."""
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
    words = "; ".join(f"{e.code}: {e.message}" for e in errors)[:2000] or text or resp.reason or ""
    return words, {e.code for e in errors}


def read_body(resp: requests.Response, kind: str, what: str, *, registry: str,
              deadline_s: float = BODY_DEADLINE_S) -> bytes:
    """A response body up to `kind`'s limit, refused past it (a declared Content-Length over it before
    a byte is read); a connection lost mid-body is a retryable RegistryError, not a short document."""
    limit = limit_of(kind)
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        resp.close()
        raise InputTooLarge(what, kind, limit, int(declared))
    data = bytearray()
    deadline = time.monotonic() + deadline_s
    read1 = getattr(resp.raw, "read1", None)  # urllib3 2: what has arrived, without waiting for a full step
    chunks = iter(lambda: read1(BODY_STEP, decode_content=True), b"") if read1 else resp.iter_content(BODY_STEP)
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > limit:
                raise InputTooLarge(what, kind, limit)
            if time.monotonic() > deadline:
                raise AnswerPastDeadline(what, deadline_s, len(data))
    except CONNECTION_ERRORS as exc:
        raise RegistryError(registry, f"{resp.request.method} {resp.url}", resp.status_code,
                            f"{what}: the answer broke off: {exc.__class__.__name__}: {exc}", retryable=True) from None
    finally:
        resp.close()
    return bytes(data)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, params = header.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


class _Token(msgspec.Struct):
    token: str = ""
    access_token: str = ""


def pooled_session(size: int = 16) -> requests.Session:
    """A session whose connection pool holds `size` connections per host: a parallel push uses several."""
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=size, pool_maxsize=size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class Transport:
    """The requests of one registry: its base URL, a session shared by threads, its credentials, and the
    tokens its token service hands out (per set of scopes)."""

    def __init__(self, registry: str, base_url: str, *, credentials: Callable[[], tuple[str, str] | None],
                 session: requests.Session | None = None, timeout: tuple[float, float] = TIMEOUT):
        self.registry, self.base_url, self.timeout = registry, base_url, timeout
        self.session = session or pooled_session()
        self._credentials = credentials
        self._tokens: dict[str, str] = {}
        self._basic: str | None = None

    def url(self, path_or_url: str) -> str:
        return path_or_url if path_or_url.startswith("http") else urljoin(self.base_url, path_or_url)

    def send(self, method: str, path_or_url: str, scopes: tuple[str, ...], *, ok: tuple[int, ...] = (200,),
             body: Body | None = None, headers: dict[str, str] | None = None, keep_open: bool = False,
             lost_session: bool = False) -> requests.Response:
        """The answer to one request (after one round of authentication, the body rebuilt for it), its status
        in `ok`; closed unread unless `keep_open` (the caller then reads the body, bounded, and closes it).
        Anything else is a RegistryError, retryable as the module docstring says; `lost_session`: a 404
        BLOB_UPLOAD_UNKNOWN is too (the registry lost the upload session: a new attempt opens another)."""
        url = self.url(path_or_url)
        request = f"{method} {url}"
        headers = dict(headers or {})
        for challenged in (False, True):
            auth = self._tokens.get(" ".join(scopes)) or self._basic
            if auth:
                headers["Authorization"] = auth
            data = body() if callable(body) else body
            try:
                # Always streamed: a body is read only by the caller that wants it, and then bounded.
                resp = self.session.request(method, url, headers=headers, data=data, timeout=self.timeout,
                                            stream=True)
            except CONNECTION_ERRORS as exc:
                raise RegistryUnreachable(self.registry, request, f"{exc.__class__.__name__}: {exc}") from None
            except requests.RequestException as exc:
                raise RegistryError(self.registry, request, None, f"{exc.__class__.__name__}: {exc}") from None
            finally:
                if data is not None and not isinstance(data, bytes):
                    data.close()
            if resp.status_code == 401 and not challenged:
                resp.close()
                self._authenticate(resp, scopes)
                continue
            break
        if resp.status_code not in ok:
            raise self._refused(resp, request, lost_session)
        if not keep_open:
            resp.close()
        return resp

    def _refused(self, resp: requests.Response, request: str, lost_session: bool = False) -> RegistryError:
        """The error for an answer with a status other than asked for, the registry's words read bounded."""
        status, wait = resp.status_code, retry_after_s(resp)
        words, codes = error_answer(resp)
        retryable = status in RETRYABLE_STATUS or (lost_session and status == 404 and "BLOB_UPLOAD_UNKNOWN" in codes)
        return RegistryError(self.registry, request, status, words, retryable=retryable,
                             retry_after=wait if status in (429, 503) else None)

    def _authenticate(self, resp: requests.Response, scopes: tuple[str, ...]) -> None:
        scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        creds = self._credentials()
        if scheme == "basic":
            if not creds:
                raise CredentialsNeeded(self.registry)
            self._basic = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            return
        if scheme != "bearer" or "realm" not in params:
            raise UnsupportedAuth(self.registry, scheme)
        query = {"service": params.get("service", ""), "scope": list(scopes)}
        what = f"the token service of {self.registry} ({params['realm']})"
        request = f"GET {params['realm']} (a token for {' '.join(scopes)})"
        try:
            tok = self.session.get(params["realm"], params=query, auth=creds, timeout=self.timeout, stream=True)
        except CONNECTION_ERRORS as exc:
            raise RegistryUnreachable(self.registry, request, f"{exc.__class__.__name__}: {exc}") from None
        except requests.RequestException as exc:
            raise RegistryError(self.registry, request, None, f"{exc.__class__.__name__}: {exc}") from None
        if tok.status_code != 200:
            raise self._refused(tok, request)
        body = decode(read_body(tok, "manifest", what, registry=self.registry), _Token, what)
        token = body.token or body.access_token
        if not token:
            raise MalformedJson(what, "the answer holds no token (neither 'token' nor 'access_token')")
        self._tokens[" ".join(scopes)] = "Bearer " + token
