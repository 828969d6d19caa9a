"""A blob read as it streams, checked against its descriptor: never a byte past the size the descriptor
gives, and the sha256 compared the moment the last byte arrives (before that byte is handed on), so a
layer reader, a layout writer or a push body never passes on a blob that does not match its name.

Why the check sits on the last read and not after it: a push streams the blob straight into a request
body; refusing before the final chunk is sent means the registry never receives a complete wrong blob.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.untrusted import Readable

CHUNK = 1 << 20


class BlobMismatch(PatchkitError):
    """A blob that is longer or shorter than its descriptor says, or does not hash to its digest (exit 2).
    `what` names where it was read, `digest` and `size` are its descriptor's, `problem` is "longer",
    "shorter" or "digest", `found` what was read instead (a length, or the digest its bytes hash to),
    `removed` the cache file that held it, removed so the next run fetches it again (None otherwise)."""

    def __init__(self, what: str, digest: str, problem: str, size: int | None, found: str,
                 removed: Path | None = None):
        self.what, self.digest, self.problem, self.size, self.found = what, digest, problem, size, found
        self.removed = removed
        detail = {"longer": f"holds more than the {size or 0:,} B its descriptor gives",
                  "shorter": f"ends after {found}, its descriptor gives {size or 0:,} B",
                  "digest": f"does not match its digest: its bytes hash to {found}"}[problem]
        where = what if removed is None else f"{what} (cached copy {removed} removed: the next run downloads it again)"
        super().__init__(f"{where}: blob {digest} {detail}; refused")


class VerifiedStream:
    """`read(n)` over `raw`, at most `size` bytes in all (None: unknown, bounded by the stream's end),
    hashing as it goes; the digest is checked when `size` bytes have been read or the stream ends."""

    def __init__(self, raw: Readable, digest: str, size: int | None, what: str, discard: Path | None = None):
        """`discard`: a cache file `raw` reads, removed when it does not match (the next run fetches it again)."""
        self._raw, self.digest, self.size, self.what, self._discard = raw, digest, size, what, discard
        self._sha = hashlib.sha256()
        self.count = 0
        self._done = False

    def __len__(self) -> int:
        return self.size or 0

    def read(self, n: int | None = -1) -> bytes:
        if self._done:
            return b""
        want = CHUNK if n is None or n < 0 else n
        if self.size is not None:
            want = min(want, self.size - self.count)
            if want <= 0:
                self._end()
                return b""
        data = self._raw.read(want)
        if not data:
            self._end()
            return b""
        self.count += len(data)
        self._sha.update(data)
        if self.count == self.size:
            self._end()
        return data

    def finish(self) -> str:
        """Read what the consumer left (a tar reader stops at its end-of-archive blocks) and check; the digest."""
        while self.read(CHUNK):
            pass
        self._end()
        return self.digest

    def _end(self) -> None:
        if self._done:
            return
        if self.size is not None and self.count < self.size:
            self._refuse("shorter", f"{self.count:,} B")
        if self.size is not None and self._raw.read(1):
            self._refuse("longer", "more")
        got = "sha256:" + self._sha.hexdigest()
        if got != self.digest:
            self._refuse("digest", got)
        self._done = True

    def _refuse(self, problem: str, found: str) -> None:
        self._done = True
        if self._discard is not None:
            self._discard.unlink(missing_ok=True)
        raise BlobMismatch(self.what, self.digest, problem, self.size, found, self._discard)

    def close(self) -> None:
        close = getattr(self._raw, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> VerifiedStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_bytes(data: bytes, digest: str, size: int | None, what: str, discard: Path | None = None) -> bytes:
    """`data` (a whole small blob) if it has its descriptor's size and digest; BlobMismatch otherwise."""
    VerifiedStream(io.BytesIO(data), digest, size, what, discard).finish()
    return data
