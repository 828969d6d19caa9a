"""The Python package index: list a project's files, pick one archive for a version, download it once
with its sha256 checked while streaming.

pypi-simple parses the project page (fetched here as its client would, bounded by the `index-page`
limit): the JSON simple API (PEP 691) asked for first, a PEP 503 HTML page read too (a mirror served
as static files); it resolves each file's URL against the page, and gives
its digests, size (JSON only), yanked state (PEP 592) and, from the file name, its project, version and
type. What stays here, and why:

- which files count: `.tar.gz` sdists and wheels of exactly that project (patchkit reads tar and zip
  archives, not eggs or `.zip` sdists); a wheel's platform tags come from packaging's parser, as
  pypi-simple gives none; one archive per version is chosen by portability.
- the download: pypi-simple's `download_package` writes to a path and deletes it itself on failure,
  where the cache hands out an open temporary file that it renames into place only when the download
  ends cleanly; and it reads through requests' `iter_content`, which undoes a transfer
  Content-Encoding before hashing, so a gzip-encoded `.tar.gz` would hash as its decompressed bytes.
  Here the raw bytes are written and hashed as they arrive (as pip does), behind a rich progress bar.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
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
from patchkit.untrusted import InputTooLarge, limit_of

if TYPE_CHECKING:
    from pypi_simple import DistributionPackage

DEFAULT_INDEX_URL = "https://pypi.org/simple"
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


class IndexUnavailable(PatchkitError):
    """The package index could not be asked (exit 2): the page `url`, the `reason` (the HTTP reason phrase
    or the connection error) and the HTTP `status` when it answered (None when it could not be reached)."""

    def __init__(self, url: str, reason: str, status: int | None = None):
        self.url, self.reason, self.status = url, reason, status
        super().__init__(f"the package index answered HTTP {status} {reason} for {url}" if status is not None
                         else f"cannot reach the package index at {url}: {reason}")


class NotOnIndex(PatchkitError):
    """The index lists no such project or version (exit 2): the `dist`, the `version` asked for (None when
    the project itself is absent), the project `page` and the `latest` releases it does list."""

    def __init__(self, dist: str, version: str | None, page: str, latest: tuple[str, ...] = ()):
        self.dist, self.version, self.page, self.latest = dist, version, page, latest
        super().__init__(f"{dist} is not on the package index ({page} answered HTTP 404)" if version is None else
                         f"{dist} {version} is not on the package index {page} "
                         f"(latest releases: {', '.join(latest) or 'none'})")


class NotAProjectPage(PatchkitError):
    """The index answered something that is not a simple API project page (exit 2): the `page` and the
    `detail` (its content type, or the fields PEP 691 misses)."""

    def __init__(self, page: str, detail: str):
        self.page, self.detail = page, detail
        super().__init__(f"{page} is not a simple API project page, PEP 691 JSON or PEP 503 HTML ({detail}); "
                         "PATCHKIT_INDEX_URL must name such an index")


def project_files(dist: str) -> tuple[str, list[IndexFile]]:
    """(project page URL, the .tar.gz sdists and wheels of `dist` listed there)."""
    # pypi-simple (requests, pydantic) loads only when the index is asked: a warm verify never is.
    import requests
    from pypi_simple import ACCEPT_JSON_PREFERRED, PyPISimple, UnsupportedRepoVersionError

    with PyPISimple(endpoint=index_url(), accept=ACCEPT_JSON_PREFERRED) as client:
        page = client.get_project_url(dist)
    try:
        listed = _project_page(dist, page, ACCEPT_JSON_PREFERRED)
    except requests.HTTPError as error:
        answer = error.response  # raise_for_status: always there
        raise IndexUnavailable(page, answer.reason, answer.status_code) from error
    except requests.RequestException as error:
        raise IndexUnavailable(page, str(error)) from error
    except (ValueError, UnsupportedRepoVersionError) as error:  # another content type, or files not per PEP 691
        raise _not_a_project_page(page, error) from error
    return page, [file for package in listed.packages if (file := _index_file(package, dist)) is not None]


def _project_page(dist: str, page: str, accept: str):
    """The project page, read as pypi-simple's get_project_page reads it but bounded by the `index-page`
    limit (decoded: a gzip-encoded page inflates a chunk at a time); JSON parsed fail-closed."""
    import requests
    from pypi_simple import ProjectPage, UnsupportedContentTypeError

    with requests.get(page, stream=True, timeout=TIMEOUT, headers={"Accept": accept}) as response:
        if response.status_code == 404:
            raise NotOnIndex(dist, None, page)
        response.raise_for_status()
        limit, parts, size = limit_of("index-page"), [], 0
        for chunk in response.iter_content(CHUNK):
            size += len(chunk)
            if size > limit:
                raise InputTooLarge(f"the package index page {page}", "index-page", limit)
            parts.append(chunk)
        body, url, content_type = b"".join(parts), response.url, response.headers.get("content-type", "text/html")
    kind, _, params = content_type.partition(";")
    kind = kind.strip().lower()
    if kind == "application/vnd.pypi.simple.v1+json":
        try:
            data = json.loads(body)
        except RecursionError:  # nested deeper than the parser's stack: no index page is
            raise ValueError("JSON nested too deeply to be a project page") from None
        return ProjectPage.from_json_data(data, url)  # a ValueError (bad JSON, a 4,300-digit integer) names it
    if kind in ("application/vnd.pypi.simple.v1+html", "text/html"):
        charset = next((value.strip().strip('"') for key, _, value in (p.partition("=") for p in params.split(";"))
                        if key.strip().lower() == "charset"), None)
        return ProjectPage.from_html(project=dist, html=body, base_url=url, from_encoding=charset)
    raise UnsupportedContentTypeError(url, content_type)


def _not_a_project_page(page: str, error: Exception) -> NotAProjectPage:
    detail = str(error)
    problems = getattr(error, "errors", None)  # pydantic's ValidationError (pypi-simple's PEP 691 model): per field
    if callable(problems):
        detail = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems()[:3])
    return NotAProjectPage(page, detail)


def _index_file(package: DistributionPackage, dist: str) -> IndexFile | None:
    if package.package_type == "wheel":
        try:
            tags = parse_wheel_filename(package.filename)[3]
        except (InvalidWheelFilename, InvalidVersion):
            return None  # a name pip would not install either
        kind, platforms = "wheel", frozenset(tag.platform for tag in tags)
    elif package.package_type == "sdist" and package.filename.endswith(".tar.gz"):
        kind, platforms = "sdist", frozenset()
    else:
        return None  # eggs, .zip sdists, installers, names no parser reads: not archives patchkit reads
    if package.project is None or package.version is None:
        return None
    if canonicalize_name(package.project) != canonicalize_name(dist):
        return None
    try:
        version = Version(package.version)
    except InvalidVersion:
        return None  # ancient uploads with versions no tool can parse
    return IndexFile(
        filename=package.filename,
        url=package.url,
        sha256=package.digests.get("sha256"),
        size=package.size,
        yanked=package.is_yanked,
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
        latest = tuple(str(v) for v in sorted(_releases(files, None, False), reverse=True)[:5])
        raise NotOnIndex(dist, version, page, latest)
    chosen = min(matching, key=lambda file: (file.yanked, _portability(file), file.filename))
    if chosen.sha256 is None:
        raise UnverifiableArchive(chosen.url)
    return chosen


def _portability(file: IndexFile) -> int:
    if file.kind == "sdist":
        return 0
    if "any" in file.platforms:
        return 1
    if any(p.startswith("manylinux") and p.endswith(("_x86_64", "_aarch64")) for p in file.platforms):
        return 2
    return 3


class UnverifiableArchive(PatchkitError):
    """The index lists the archive without a sha256, so it cannot be verified (exit 2): its `url`."""

    def __init__(self, url: str):
        self.url = url
        super().__init__(f"the index gives no sha256 for {url}: refusing an archive that cannot be verified")


class DownloadFailed(PatchkitError):
    """A download that broke off (exit 2): its `url`, the bytes `received` and the `reason` (the HTTP status
    or the connection error); nothing is cached."""

    def __init__(self, url: str, received: int, reason: str):
        self.url, self.received, self.reason = url, received, reason
        super().__init__(f"download of {url} failed after {received} bytes: {reason}")


class HashMismatch(PatchkitError):
    """A download whose sha256 is not the one the index lists (exit 2): its `url`, the `expected` and the
    `actual` digests, the bytes `received` and the `size` the index lists."""

    def __init__(self, url: str, expected: str | None, actual: str, received: int, size: int | None):
        self.url, self.expected, self.actual, self.received, self.size = url, expected, actual, received, size
        super().__init__(f"download of {url} does not match the index: sha256 expected {expected}, "
                         f"got {actual} ({received} bytes received, {size} expected)")


class OversizedDownload(PatchkitError):
    """A download that sends more than announced (exit 2): `url`, the `expected` size and who `said_by` so
    (the index, its Content-Length, the archive limit), the bytes `received`, and the Content-Length
    `announced` when it exceeded the index's size."""

    def __init__(self, url: str, expected: int, received: int, said_by: str, announced: int | None = None):
        self.url, self.expected, self.received, self.said_by = url, expected, received, said_by
        self.announced = announced  # the Content-Length, when it alone was past `expected`: nothing read
        found = f"the server announces {announced:,} bytes" if announced is not None else f"{received:,} bytes or more"
        super().__init__(f"download of {url}: {found}, past the {expected:,} bytes {said_by}; "
                         "stopped there, nothing cached")


def download(file: IndexFile, out: BinaryIO, *, progress: bool = True) -> None:
    """Stream `file` into `out`, checking its sha256; any failure raises (the caller discards `out`).

    It stops at the size the index lists (else the Content-Length, else the `archive` limit): a server
    cannot make it write more than was announced."""
    import requests
    import urllib3

    digest = hashlib.sha256()
    received = 0
    limit = limit_of("archive")
    if file.size is not None and file.size > limit:
        raise InputTooLarge(f"{file.url} (the size the index lists)", "archive", limit, file.size)
    try:
        with requests.get(file.url, stream=True, timeout=TIMEOUT) as response:
            response.raise_for_status()
            header = response.headers.get("content-length", "")
            length = int(header) if header.isascii() and header.isdigit() else None
            if file.size is not None:
                expected, said_by = file.size, "the index lists"
                if length is not None and length > file.size:
                    raise OversizedDownload(file.url, file.size, 0, said_by, announced=length)
            elif length is not None:
                expected, said_by = length, "its Content-Length says"
                if length > limit:
                    raise InputTooLarge(f"{file.url} (its Content-Length)", "archive", limit, length)
            else:
                expected, said_by = limit, "the archive limit allows"
            with _progress(progress, file.filename, length or file.size) as advance:
                # The raw bytes, as pip does: a server's transfer Content-Encoding must not be undone
                # before hashing, or a gzip archive would hash as its decompressed contents.
                for chunk in response.raw.stream(CHUNK, decode_content=False):
                    received += len(chunk)
                    if received > expected:
                        raise OversizedDownload(file.url, expected, received, said_by)
                    out.write(chunk)
                    digest.update(chunk)
                    advance(len(chunk))
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        raise DownloadFailed(file.url, received, str(error)) from error
    actual = digest.hexdigest()
    if actual != file.sha256:
        raise HashMismatch(file.url, file.sha256, actual, received, file.size)


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
