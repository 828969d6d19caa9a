"""The bodies of blob transfers: an upload body that each send opens afresh (with progress that counts a
re-sent byte once, and a stop when another blob of the same push failed), and a download body read as it
arrives whose broken-off connection is a retryable failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import requests

from patchkit.errors import PatchkitError
from patchkit.oci.transport import CONNECTION_ERRORS, Cancelled, Reader, RegistryError
from patchkit.oci.verified import VerifiedStream


def once(stream: VerifiedStream, digest: str) -> Callable[[], Reader]:
    """A stream given as a body: sent once; a second send names why it cannot be."""
    given = [stream]

    def take() -> Reader:
        if not given:
            raise PatchkitError(f"blob {digest}: a stream given as the body cannot be sent twice; pass a "
                                "callable that opens it again (a patchkit bug: please report it)")
        if given[0].size is None:
            raise PatchkitError(f"cannot copy blob {digest}: its size is unknown (a patchkit bug: please report it; "
                                "a copied blob's size is its descriptor's)")
        return given.pop()
    return take


class Sent:
    """Bytes sent of one blob over all its sends: progress advances only past the most sent before."""

    def __init__(self, advance: Callable[[int], None]):
        self._advance, self._most, self._lock = advance, 0, threading.Lock()

    def to(self, count: int) -> None:
        with self._lock:
            if count > self._most:
                self._advance(count - self._most)
                self._most = count


class Sending:
    """A verified blob body with a length (so requests sends Content-Length, not chunked), progress, and a
    stop when another blob of the push failed."""

    def __init__(self, stream: Reader, sent: Sent, cancel: threading.Event | None):
        self._stream, self._sent, self._cancel, self._count = stream, sent, cancel, 0

    def __len__(self) -> int:
        return len(self._stream)

    def read(self, n: int = -1) -> bytes:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled("cancelled: another blob of this push failed")
        data = self._stream.read(n)
        self._count += len(data)
        self._sent.to(self._count)
        return data

    def close(self) -> None:
        self._stream.close()


class Download:
    """A streaming blob body: `read(n)` with progress, and a length so it can be re-sent as a body."""

    def __init__(self, registry: str, resp: requests.Response, size: int | None, task):
        self._registry, self._resp, self._raw = registry, resp, resp.raw
        self._raw.decode_content = False  # the blob's bytes as stored, never transfer-decoded
        self.size, self.count = size, 0
        self._task = task
        self._advance = self._task.__enter__()

    def __len__(self) -> int:
        return self.size or 0

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._raw.read(None if n is None or n < 0 else n)
        except CONNECTION_ERRORS as exc:  # a dropped connection mid-blob: the attempt starts again
            raise RegistryError(self._registry, f"GET {self._resp.url}", self._resp.status_code,
                                f"the blob broke off after {self.count:,} B: {exc.__class__.__name__}: {exc}",
                                retryable=True) from None
        self.count += len(data)
        self._advance(len(data))
        return data

    def close(self) -> None:
        if self._task is not None:
            self._task.__exit__(None, None, None)
            self._task = None
        self._resp.close()

    def __enter__(self) -> Download:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
