"""Turning what a person types (`0.33.0`, `vllm==0.33.0`, a directory, `git:URL@REF`, a .whl) into a source."""

from __future__ import annotations

import os
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchkit.errors import PatchkitError
from patchkit.sources.base import Source
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.directory import DirectorySource
from patchkit.sources.release import open_release
from patchkit.sources.sdist import SdistSource
from patchkit.sources.wheel import WheelSource

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PINNED = re.compile(r"^(?P<dist>[A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*(?P<version>\S+)$")
FORMS = (
    "a version (0.33.0, meaning vllm), vllm==0.33.0, flashinfer-python==0.7.2.post1, a directory, "
    "git:PATH_OR_URL@REF, a .whl or an sdist .tar.gz"
)


_SPEC_PROBLEMS = {
    "empty": "empty source: give {forms}",
    "git-form": "git source {spec!r}: write git:PATH_OR_URL@REF (REF a tag, branch or commit)",
    "url": "source {spec!r} is a URL: a git repository is git:URL@REF, a release is its version; download a "
           ".whl or .tar.gz and give its path",
    "ambiguous": "{spec!r} is both a directory and a version: write ./{spec} or vllm=={spec}",
    "not-a-version": "source {spec!r}: {detail!r} is not a version (PEP 440)",
    "range": "source {spec!r}: a source is one exact version (vllm==0.33.0), not a range",
    "file-kind": "source {spec!r} is a file but not a .whl or .tar.gz: give {forms}",
    "no-such-directory": "source {spec!r}: no such directory",
    "unknown": "unknown source {spec!r}: give {forms}",
}


class InvalidSourceSpec(PatchkitError):
    """A source as typed that names no source patchkit can open (exit 2): the `spec` as given, the `problem`
    ("empty", "git-form", "url", "ambiguous" (a directory named like a version), "not-a-version", "range",
    "file-kind", "no-such-directory", "unknown") and the `detail` the problem is about (the version text)."""

    def __init__(self, spec: str, problem: str, detail: str = ""):
        self.spec, self.problem, self.detail = spec, problem, detail
        super().__init__(_SPEC_PROBLEMS[problem].format(spec=spec, detail=detail, forms=FORMS))


def open_source(spec: str | os.PathLike[str], *, cache: ArchiveCache | None = None, progress: bool = True) -> Source:
    text = os.fspath(spec).strip()
    if not text:
        raise InvalidSourceSpec(text, "empty")
    if text.startswith("git:"):
        location, at, ref = text.removeprefix("git:").rpartition("@")
        if not at or not location or not ref:
            raise InvalidSourceSpec(text, "git-form")
        from patchkit.sources.git import GitSource  # gitpython: loaded only for git sources

        return GitSource(location, ref, cache=cache)
    if _URL.match(text):  # Path() would fold "https://" to "https:/" and report a path nobody typed
        raise InvalidSourceSpec(text, "url")
    path = Path(text).expanduser()
    if text.endswith(".whl"):
        return WheelSource(path)
    if text.endswith(".tar.gz"):
        return SdistSource(path)
    pinned = _PINNED.match(text)
    if pinned or _is_version(text):
        if path.is_dir() and not pinned:
            raise InvalidSourceSpec(text, "ambiguous")
        dist, version = (pinned["dist"], pinned["version"]) if pinned else ("vllm", text)
        if not _is_version(version):
            raise InvalidSourceSpec(text, "not-a-version", version)
        return open_release(dist, version, cache=cache or ArchiveCache(), progress=progress)
    if path.is_dir():
        return DirectorySource(path)
    if any(operator in text for operator in "<>~!="):
        raise InvalidSourceSpec(text, "range")
    if path.exists():
        raise InvalidSourceSpec(text, "file-kind")
    looks_like_path = "/" in text or text.startswith((".", "~"))
    raise InvalidSourceSpec(text, "no-such-directory" if looks_like_path else "unknown")


def _is_version(text: str) -> bool:
    try:
        Version(text)
        return True
    except InvalidVersion:
        return False
