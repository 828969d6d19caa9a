"""A wheel (.whl): the packages at its top level, every file read a member verified against its RECORD.

The one wheel source, whoever names the wheel: a person's `--source x.whl`, a release the index gave
(`vllm==X` where the release has only wheels, a FlashInfer companion), the release wheel a patched wheel
is built from (wheels.build). Each is checked whole before any of it is read (sources.verified_wheel:
safe member names, one dist-info of the file name's project and version, every member against its RECORD
row, METADATA), so a plan never runs on bytes the wheel's own RECORD disowns; BadWheel (exit 2) names
the wheel, the member, what RECORD says and what was found.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

from patchkit.sources.archives import ArchiveSource
from patchkit.sources.base import NoSuchSource
from patchkit.sources.verified_wheel import BadWheel, VerifiedWheel, verify_wheel
from patchkit.untrusted import open_regular


class _Members:
    """What ArchiveSource reads through: the verified members, each read checked again against what was
    verified. One file position is shared, so reads take turns (a companion source serves several threads)."""

    def __init__(self, wheel: VerifiedWheel):
        self.path, self._wheel = wheel.path, wheel
        self._lock = threading.Lock()

    def listing(self) -> dict[str, str]:
        return dict.fromkeys(self._wheel.members, "file")

    def read_many(self, members: Iterable[str], kind: str = "member") -> dict[str, bytes]:
        with self._lock:
            return {member: self._wheel.read(member, kind) for member in members}


class WheelSource(ArchiveSource):
    def __init__(self, wheel: str | Path | VerifiedWheel, *, origin: str | None = None,
                 discard: Callable[[], None] | None = None):
        """`wheel` a path (verified here, held open while the source lives) or a wheel verified already
        (its opener closes it); `origin` what the description says it came from; `discard` drops it from
        the cache it was read from when it fails verification."""
        if not isinstance(wheel, VerifiedWheel):
            wheel = _verified(Path(wheel), discard)
            weakref.finalize(self, wheel.close)
        super().__init__(_Members(wheel), prefix="")
        self._versions = dict.fromkeys(self._roots, wheel.version)
        packages = ", ".join(f"{package} {wheel.version}" for package in self._roots)
        self.description = f"{packages} wheel ({origin or wheel.path})"

    def versions(self) -> dict[str, str]:
        return dict(self._versions)


def _verified(path: Path, discard: Callable[[], None] | None) -> VerifiedWheel:
    if not path.is_file():
        if path.exists():  # a FIFO, device or directory: refused as what it is, never opened blocking
            open_regular(path, "archive", f"wheel {path}").close()
        raise NoSuchSource("wheel", path, "does not exist")
    try:
        return verify_wheel(path)
    except BadWheel as error:
        if discard is None:  # a person's file: never deleted
            raise
        discard()  # a cache entry: the next run downloads the release afresh
        raise BadWheel(error.wheel, error.problem, error.detail, error.member, removed=True) from None
