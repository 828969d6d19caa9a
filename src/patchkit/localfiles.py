"""Writing and hashing patchkit's own files: the one way a file is replaced, and the one file hash.

Every file patchkit writes outside a patched tree (cache records and downloads, built wheels, blobs fetched
from a registry) goes through `adjacent_tmp_file`, as pip's `adjacent_tmp_file` does: the bytes go to a
temporary name in the same directory (same filesystem, so the rename is atomic), are fsynced, and only
then renamed over the target, whose directory is fsynced in turn. A failure or a kill at any point leaves
the old file or none, never a torn one, and no temporary behind on a failure Python sees.

Patched trees are not written here: patching/fsops.py and the journal hold their own stricter protocol
(directory fds, fault injection at every step), since a target tree must also survive a kill between
files, not only within one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def adjacent_tmp_file(path: Path, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file to fill; it replaces `path` (with `mode`) only when the block ends without an exception."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    temporary = Path(name)
    try:
        with os.fdopen(fd, "w+b") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
        fsync_directory(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """`path` holds exactly `data`, or what it held before."""
    with adjacent_tmp_file(path, mode=mode) as out:
        out.write(data)


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable (POSIX: the entry lives in the directory, not the file)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in chunks (hashlib.file_digest)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
