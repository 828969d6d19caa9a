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


def open_source(spec: str | os.PathLike[str], *, cache: ArchiveCache | None = None, progress: bool = True) -> Source:
    text = os.fspath(spec).strip()
    if not text:
        raise PatchkitError(f"empty source: give {FORMS}")
    if text.startswith("git:"):
        location, at, ref = text.removeprefix("git:").rpartition("@")
        if not at or not location or not ref:
            raise PatchkitError(f"git source {spec!r}: write git:PATH_OR_URL@REF (REF a tag, branch or commit)")
        from patchkit.sources.git import GitSource  # gitpython: loaded only for git sources

        return GitSource(location, ref, cache=cache)
    if _URL.match(text):  # Path() would fold "https://" to "https:/" and report a path nobody typed
        raise PatchkitError(f"source {text!r} is a URL: a git repository is git:URL@REF, a release is its "
                            f"version; download a .whl or .tar.gz and give its path")
    path = Path(text).expanduser()
    if text.endswith(".whl"):
        return WheelSource(path)
    if text.endswith(".tar.gz"):
        return SdistSource(path)
    pinned = _PINNED.match(text)
    if pinned or _is_version(text):
        if path.is_dir() and not pinned:
            raise PatchkitError(f"{text!r} is both a directory and a version: write ./{text} or vllm=={text}")
        dist, version = (pinned["dist"], pinned["version"]) if pinned else ("vllm", text)
        if not _is_version(version):
            raise PatchkitError(f"source {spec!r}: {version!r} is not a version (PEP 440)")
        return open_release(dist, version, cache=cache or ArchiveCache(), progress=progress)
    if path.is_dir():
        return DirectorySource(path)
    if any(operator in text for operator in "<>~!="):
        raise PatchkitError(f"source {spec!r}: a source is one exact version (vllm==0.33.0), not a range")
    if path.exists():
        raise PatchkitError(f"source {spec!r} is a file but not a .whl or .tar.gz: give {FORMS}")
    looks_like_path = "/" in text or text.startswith((".", "~"))
    raise PatchkitError(
        f"source {spec!r}: no such directory" if looks_like_path else f"unknown source {spec!r}: give {FORMS}"
    )


def _is_version(text: str) -> bool:
    try:
        Version(text)
        return True
    except InvalidVersion:
        return False
