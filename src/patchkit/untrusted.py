"""The one way in for bytes from outside: every read bounded by a limit declared per kind of input, regular
files only, refused with exit 2 (a typed error naming the file, the limit and how to raise it).

Why by hand: no library opens a path without blocking on a FIFO, checks that what it opened is a regular
file, and caps the read at a per-kind limit in one step; `Path.read_bytes()` does none of the three (a
FIFO blocks it forever, `/dev/zero` or a sparse 4 GiB file is read whole).

Symbolic links are followed on purpose: a Hugging Face cache snapshot is a folder of links into its
`blobs/`. What the link leads to must still be a regular file within the limit.

The limits are sized to the largest real instance of each kind with room to spare, and each names the
environment variable that raises it (PATCHKIT_LIMIT_<KIND>, in bytes).
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from patchkit.errors import PatchkitError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class Limit:
    kind: str
    default: int
    why: str

    @property
    def env(self) -> str:
        return "PATCHKIT_LIMIT_" + self.kind.upper().replace("-", "_")

    @property
    def bytes(self) -> int:
        value = os.environ.get(self.env, "")
        return int(value) if value.isdigit() else self.default


# The largest real instance of each kind, and the limit above it.
LIMITS = {limit.kind: limit for limit in (
    Limit("config", 16 * MiB, "a checkpoint's config.json / hf_quant_config.json: tens of KiB in every public checkpoint"),
    Limit("checkpoint-index", 64 * MiB, "model.safetensors.index.json: GLM-5.3's is under 2 MiB"),
    Limit("safetensors-header", 100 * MiB, "the safetensors library's own MAX_HEADER_SIZE (100,000,000 B)"),
    Limit("safetensors-shard", 1 << 40, "a safetensors shard, of which only the 8-byte prefix and the header are read: GLM-5.3-Flash's are ~6.2 GB, no public checkpoint ships a 1 TiB file"),
    Limit("definition", 4 * MiB, "patch.toml, variant.toml, image.toml, series.toml, patchkit.json, a patch's text file"),
    Limit("boot-log", 1 * GiB, "a boot log or `docker logs` capture: a 12-minute boot writes a few MiB"),
    Limit("log-line", 64 * KiB, "one boot-log line: vLLM's longest (the engine config dump) is a few KiB"),
    Limit("manifest", 4 * MiB, "an OCI index, manifest or config: the limit Docker's distribution registry sets "
          "(maxManifestBodySize = 4 << 20)"),
    Limit("member", 256 * MiB, "one source file read out of an sdist, wheel or image layer: vLLM's largest .py is under 1 MiB"),
    Limit("metadata", 16 * MiB, "a wheel's METADATA, RECORD or WHEEL; an sdist's PKG-INFO"),
    Limit("index-page", 64 * MiB, "one package index project page (PyPI's vllm page, JSON, is ~1 MiB)"),
    Limit("binary", 2 * GiB, "one compiled extension in a release wheel, read for the kernel census: vLLM 0.33.0's largest (_vllm_fa2_C) is 294 MiB"),
    Limit("archive", 8 * GiB, "a release sdist or wheel downloaded from the index: vLLM's aarch64 wheel is ~500 MiB"),
    Limit("tar", 2 * GiB, "the tar stream of one .tar.gz sdist, inflated: FlashInfer 0.7.2.post1's is 440 MB, vLLM 0.33.0's 150 MB"),
    Limit("layer-tar", 128 * GiB, "one image layer's tar inflated by `patchkit load` (spooled to disk, never held): a CUDA vLLM base's largest inflate to ~10 GiB"),
    Limit("inflated", 8 * GiB, "a wheel's members inflated, each and all together, while their RECORD hashes are checked (streamed, never held whole): vLLM 0.33.0's x86_64 wheel inflates to 835 MB, its largest member to 308 MB"),
    Limit("layer", 64 * GiB, "one image layer blob in a layout or the blob cache (read against its descriptor's size): a CUDA base's largest are a few GiB"),
    Limit("api-answer", 16 * MiB, "one answer of the served OpenAI API to the smoke (a chat completion of at most 512 tokens): a few KiB"),
    Limit("github-answer", 4 * MiB, "one GitHub REST API answer (a pull request or issue object, from `gh api` or a recorded "
          "file) for `patchkit upstream`: vLLM's are a few KiB, the body field included"),
    Limit("run-record", 64 * MiB, "a recorded run read by `patchkit retire` and `bump body`: a test run's record "
          "(tests/release_record.py: ~200 KiB for the whole suite), `rebase`/`verify`/`census` --json"),
    Limit("tool-output", 16 * MiB, "what one host tool prints for `doctor host` (nvidia-smi, nvcc --version, free -b, docker version): a few KiB"),
)}


class InputTooLarge(PatchkitError):
    """An input past the limit declared for its kind (exit 2): `what` names it, `kind` the kind of input
    (a key of LIMITS), `limit` its limit in bytes, `size` its size (None when it was not told and only
    found to be more)."""

    def __init__(self, what: str, kind: str, limit: int, size: int | None = None):
        self.what, self.kind, self.limit, self.size = what, kind, limit, size
        env = LIMITS[kind].env if kind in LIMITS else "its limit"
        found = f"{size:,} B" if size is not None else f"more than {limit:,} B"
        super().__init__(f"{what}: {found}, over the {limit:,} B limit for a {kind} ({LIMITS[kind].why if kind in LIMITS else ''}); "
                         f"refused unread. If it is genuine, raise the limit with {env}=BYTES")


class NotARegularFile(PatchkitError):
    """A FIFO, device, socket or directory where a file is expected (exit 2): `what` names it, `found`
    what it is ("FIFO", "directory"...)."""

    def __init__(self, what: str, found: str):
        self.what, self.found = what, found
        super().__init__(f"{what}: is a {found}, not a regular file; refused unread")


class UnreadableFile(PatchkitError):
    """A file that is missing or that the system will not let patchkit read (exit 2): `what` names it,
    `reason` the system's why ("not found" for a missing one), `errno` its error number (None when not
    the system's)."""

    def __init__(self, what: str, reason: str, errno: int | None = None):
        self.what, self.reason, self.errno = what, reason, errno
        super().__init__(f"{what}: not found" if reason == "not found" else f"{what}: cannot be read: {reason}")


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def limit_of(kind: str) -> int:
    return LIMITS[kind].bytes


def open_regular(path: Path | str, kind: str, what: str | None = None) -> io.BufferedReader:
    """`path` opened for reading: never blocks on a FIFO, refuses anything but a regular file within `kind`'s
    limit. A missing or unreadable file is an UnreadableFile naming it."""
    what = what or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise UnreadableFile(what, "not found", exc.errno) from None
    except IsADirectoryError:
        raise NotARegularFile(what, "directory") from None
    except OSError as exc:
        raise UnreadableFile(what, exc.strerror or str(exc), exc.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(what, _kind_of(st.st_mode))
        limit = limit_of(kind)
        if st.st_size > limit:
            raise InputTooLarge(what, kind, limit, st.st_size)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_file(path: Path | str, kind: str, what: str | None = None) -> bytes:
    """The whole of a regular file within `kind`'s limit (a file grown past it while read is refused too)."""
    what = what or str(path)
    with open_regular(path, kind, what) as f:
        try:
            return read_stream(f, kind, what)
        except OSError as exc:
            raise UnreadableFile(what, exc.strerror or str(exc), exc.errno) from None


class Readable(Protocol):
    """What read_stream reads from: a file, a pipe, an HTTP response, a verified download."""

    def read(self, size: int = ..., /) -> bytes: ...


def read_stream(stream: Readable, kind: str, what: str, limit: int | None = None) -> bytes:
    """At most `limit` (default: `kind`'s) bytes of `stream`, refusing a stream that holds more."""
    limit = limit_of(kind) if limit is None else limit
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputTooLarge(what, kind, limit)
    return data


def lines(stream: BinaryIO, what: str) -> Iterator[tuple[str, bool]]:
    """Each line of `stream` (decoded, errors replaced, newline stripped) and whether it was cut: a line
    longer than the log-line limit is kept to that length and the rest of it skipped unread into memory.
    The whole stream is bounded by the boot-log limit."""
    cap, total_cap = limit_of("log-line"), limit_of("boot-log")
    total = 0
    while True:
        raw = stream.readline(cap + 1)
        if not raw:
            return
        total += len(raw)
        cut = len(raw) > cap or (not raw.endswith(b"\n") and len(raw) == cap + 1)
        if cut:  # drop the rest of this line, a bounded chunk at a time
            while True:
                more = stream.readline(cap)
                total += len(more)
                if not more or more.endswith(b"\n"):
                    break
                if total > total_cap:
                    break
            raw = raw[:cap]
        if total > total_cap:
            raise InputTooLarge(what, "boot-log", total_cap)
        yield raw.rstrip(b"\r\n").decode("utf-8", "replace"), cut
