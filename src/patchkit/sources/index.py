"""The Python package index, through its JSON simple API (PEP 691): list a project's files, pick one
archive for a version, download it once with its sha256 checked while streaming.

Hand-written rather than pip's internals (not a library API) or a resolver: patchkit needs one exact
file per version and its hash, which is a single JSON request.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urljoin

from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from patchkit.errors import PatchkitError

DEFAULT_INDEX_URL = "https://pypi.org/simple"
JSON_SIMPLE_API = "application/vnd.pypi.simple.v1+json"
TIMEOUT = (15, 60)  # seconds: connect, and between two reads
CHUNK = 1 << 20


def index_url() -> str:
    return os.environ.get("PATCHKIT_INDEX_URL", DEFAULT_INDEX_URL).rstrip("/")


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None
    yanked: bool
    kind: str  # "sdist" | "wheel"
    version: Version
    platforms: frozenset[str]  # wheel platform tags; empty for an sdist


def project_files(dist: str) -> tuple[str, list[IndexFile]]:
    """(project page URL, the .tar.gz sdists and wheels of `dist` listed there)."""
    import requests  # the HTTP client loads only when the index is asked (a warm verify never is)

    page = f"{index_url()}/{canonicalize_name(dist)}/"
    try:
        response = requests.get(page, headers={"Accept": JSON_SIMPLE_API}, timeout=TIMEOUT)
    except requests.RequestException as error:
        raise PatchkitError(f"cannot reach the package index at {page}: {error}") from error
    if response.status_code == 404:
        raise PatchkitError(f"{dist} is not on the package index ({page} answered HTTP 404)")
    if not response.ok:
        raise PatchkitError(f"the package index answered HTTP {response.status_code} {response.reason} for {page}")
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    try:
        if content_type != JSON_SIMPLE_API:
            raise ValueError(f"content type {content_type!r}")
        entries = response.json()["files"]
        files = [file for entry in entries if (file := _index_file(entry, page, dist)) is not None]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise PatchkitError(
            f"{page} is not a JSON simple API (PEP 691) project page ({error}); "
            "PATCHKIT_INDEX_URL must name such an index"
        ) from error
    return page, files


def _index_file(entry: dict, page: str, dist: str) -> IndexFile | None:
    filename = entry["filename"]
    try:
        if filename.endswith(".whl"):
            name, version, _, tags = parse_wheel_filename(filename)
            kind, platforms = "wheel", frozenset(tag.platform for tag in tags)
        elif filename.endswith(".tar.gz"):
            name, version = parse_sdist_filename(filename)
            kind, platforms = "sdist", frozenset()
        else:
            return None  # eggs, .zip sdists, installers: not archives patchkit reads
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None  # ancient uploads with names no tool can parse
    if name != canonicalize_name(dist):
        return None
    return IndexFile(
        filename=filename,
        url=urljoin(page, entry["url"]),
        sha256=(entry.get("hashes") or {}).get("sha256"),
        size=entry.get("size"),
        yanked=bool(entry.get("yanked", False)),
        kind=kind,
        version=version,
        platforms=platforms,
    )


def choose_archive(dist: str, version: str) -> IndexFile:
    """The sdist of `dist` `version`, else its most portable wheel (the Python files are the same).

    A yanked file is taken only when nothing else exists for that exact version, as PEP 592 allows.
    """
    page, files = project_files(dist)
    wanted = Version(version)
    matching = [file for file in files if file.version == wanted]
    if not matching:
        latest = ", ".join(str(v) for v in sorted(_releases(files, None, False), reverse=True)[:5])
        raise PatchkitError(
            f"{dist} {version} is not on the package index {page} (latest releases: {latest or 'none'})"
        )
    chosen = min(matching, key=lambda file: (file.yanked, _portability(file), file.filename))
    if chosen.sha256 is None:
        raise PatchkitError(f"the index gives no sha256 for {chosen.url}: refusing an archive that cannot be verified")
    return chosen


def _portability(file: IndexFile) -> int:
    if file.kind == "sdist":
        return 0
    if "any" in file.platforms:
        return 1
    if any(p.startswith("manylinux") and p.endswith(("_x86_64", "_aarch64")) for p in file.platforms):
        return 2
    return 3


def download(file: IndexFile, out: BinaryIO, *, progress: bool = True) -> None:
    """Stream `file` into `out`, checking its sha256; any failure raises (the caller discards `out`)."""
    import requests
    import urllib3

    digest = hashlib.sha256()
    received = 0
    try:
        with requests.get(file.url, stream=True, timeout=TIMEOUT) as response:
            response.raise_for_status()
            total = int(response.headers.get("content-length") or 0) or file.size
            with _progress(progress, file.filename, total) as advance:
                # The raw bytes, as pip does: a server's transfer Content-Encoding must not be undone
                # before hashing, or a gzip archive would hash as its decompressed contents.
                for chunk in response.raw.stream(CHUNK, decode_content=False):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    advance(len(chunk))
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        raise PatchkitError(f"download of {file.url} failed after {received} bytes: {error}") from error
    actual = digest.hexdigest()
    if actual != file.sha256:
        raise PatchkitError(
            f"download of {file.url} does not match the index: sha256 expected {file.sha256}, "
            f"got {actual} ({received} bytes received, {file.size} expected)"
        )


@contextlib.contextmanager
def _progress(enabled: bool, filename: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A rich download bar on stderr (stdout carries reports); yields `advance(nbytes)`."""
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), disable=not enabled) as bar:
        task = bar.add_task(f"downloading {filename}", total=total)
        yield lambda size: bar.advance(task, size)


def discover_releases(
    dist: str = "vllm", spec: SpecifierSet | None = None, *, prereleases: bool = False
) -> list[Version]:
    """Versions of `dist` on the index with at least one file not yanked, oldest first."""
    _, files = project_files(dist)
    return _releases(files, spec, prereleases)


def _releases(files: list[IndexFile], spec: SpecifierSet | None, prereleases: bool) -> list[Version]:
    found = {file.version for file in files if not file.yanked}
    return sorted(
        version
        for version in found
        if (prereleases or not version.is_prerelease) and (spec is None or spec.contains(version, prereleases=True))
    )
