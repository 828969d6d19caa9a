"""Which upstream versions `patchkit verify` checks: the columns of its matrix, and how each is opened.

A target is a release on the package index (`--versions`: a list, or a PEP 440 range resolved against
the index) or a tag or ref of a git repository (`--git`, `--tags`, `--ref`). The pinned release is
always among them: it is the baseline the exit code is measured against (`matrix.Matrix.findings`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patchkit import PINNED_VLLM
from patchkit.errors import PatchkitError
from patchkit.sources.base import Source
from patchkit.sources.cache import ArchiveCache

_OPERATORS = "<>=!~"


@dataclass(frozen=True)
class Target:
    """One column to open: a release on the index, or a ref of a git repository."""

    label: str  # the column heading: "0.33.0", "v0.34.0rc1", "main"
    ref: str  # the version (index) or the tag/branch/commit (git)
    location: str | None = None  # the git repository; None for the index
    order: Version | None = None  # the version known before opening, for ordering; None: unknown
    pinned: bool = False  # the baseline: the pinned release, from the index or the repository's tag

    @property
    def spec(self) -> str:
        return f"git:{self.location}@{self.ref}" if self.location else f"vllm=={self.ref}"


@dataclass(frozen=True)
class VersionFilter:
    """`--versions`: an explicit list (`0.30.0,0.33.0`) or a PEP 440 range (`>=0.30`)."""

    exact: frozenset[Version] | None = None
    spec: SpecifierSet | None = None

    def admits(self, version: Version) -> bool:
        if self.exact is not None:
            return version in self.exact
        return self.spec is None or self.spec.contains(version, prereleases=True)


class InvalidVersions(PatchkitError):
    """A --versions value that is neither a list of versions nor a PEP 440 range (exit 2): `value` the
    text (or, for "not-a-version", the item), `problem` "empty", "mixed" (a range among versions, or a
    range that does not parse) or "not-a-version", `reason` packaging's complaint ("" where none)."""

    def __init__(self, value: str, problem: str, reason: str = ""):
        self.value, self.problem, self.reason = value, problem, reason
        super().__init__({
            "empty": "--versions is empty: give versions (0.30.0,0.33.0) or a PEP 440 range (>=0.30)",
            "mixed": f"--versions {value!r} is neither a list of versions nor a PEP 440 range ({reason}); "
                     "a range cannot be mixed with plain versions",
            "not-a-version": f"--versions: {value!r} is not a version (PEP 440)"}[problem])


class TagsUnavailable(PatchkitError):
    """A git repository whose tags cannot be listed (exit 2): `location`, `detail` git's answer."""

    def __init__(self, location: str, detail: str):
        self.location, self.detail = location, detail
        super().__init__(f"cannot list the tags of git repository {location}: {detail}")


class TargetUnavailable(PatchkitError):
    """A verify target that cannot be opened as a source: `target` its label, `cause` the error opening it
    gave (whose exit code this keeps)."""

    def __init__(self, target: str, cause: PatchkitError):
        self.target, self.cause = target, cause
        self.exit_code = cause.exit_code
        super().__init__(f"{target}: {cause}")


def parse_versions(text: str | None, pinned: str = PINNED_VLLM) -> VersionFilter:
    """None means the default: the pinned release and everything newer."""
    if text is None:
        return VersionFilter(spec=SpecifierSet(f">={pinned}"))
    text = text.strip()
    if not text:
        raise InvalidVersions(text, "empty")
    if any(op in text for op in _OPERATORS):
        try:
            return VersionFilter(spec=SpecifierSet(text))
        except InvalidSpecifier as e:
            raise InvalidVersions(text, "mixed", str(e)) from None
    versions = set()
    for item in text.split(","):
        try:
            versions.add(Version(item.strip()))
        except InvalidVersion:
            raise InvalidVersions(item.strip(), "not-a-version") from None
    return VersionFilter(exact=frozenset(versions))


def index_targets(wanted: VersionFilter, pinned: str = PINNED_VLLM) -> list[Target]:
    """Releases of vLLM on the package index; a range is resolved against the index (no pre-releases)."""
    if wanted.exact is not None:
        versions = set(wanted.exact)
    else:
        from patchkit.sources import discover_releases

        versions = set(discover_releases("vllm", wanted.spec))
    versions.add(Version(pinned))
    return [Target(str(v), str(v), order=v, pinned=v == Version(pinned)) for v in sorted(versions)]


def git_targets(
    location: str,
    tag_globs: Iterable[str],
    refs: Iterable[str],
    wanted: VersionFilter,
    pinned: str = PINNED_VLLM,
) -> list[Target]:
    """Tags of `location` matching any glob and admitted by `wanted`, then each ref as given.

    A tag whose name is not a version is kept when its name matches (the glob asked for it). The
    pinned release comes from the repository's own tag for it when there is one (any name that reads
    as the version: v0.33.0 or 0.33.0), else from the index.
    """
    tags = list_tags(location)
    globs = list(tag_globs)
    chosen: list[Target] = []
    unversioned: list[Target] = []
    baseline: Target | None = None
    for tag in sorted(tags):
        version = tag_version(tag)
        matches = any(fnmatch.fnmatchcase(tag, g) for g in globs)
        if version is not None and version == Version(pinned) and baseline is None:
            baseline = Target(tag, tag, location, version, pinned=True)
        if not matches:
            continue
        if version is None:
            unversioned.append(Target(tag, tag, location))
        elif wanted.admits(version):
            chosen.append(Target(tag, tag, location, version))
    if baseline is None:
        baseline = Target(pinned, pinned, order=Version(pinned), pinned=True)
    chosen = [t for t in chosen if t.label != baseline.label] + [baseline]
    chosen.sort(key=lambda t: (t.order, t.label))
    seen = {t.label for t in chosen + unversioned}
    extra = [Target(ref, ref, location) for ref in dict.fromkeys(refs) if ref not in seen]
    return chosen + unversioned + extra


def list_tags(location: str) -> list[str]:
    """Tag names of a local or remote repository, without cloning it (`git ls-remote`)."""
    import git

    try:
        # a str: GitPython's annotation also covers the as_process / extended-output forms, not used here
        out = cast(str, git.cmd.Git().ls_remote("--tags", "--refs", location))
    except git.GitCommandError as e:
        detail = (e.stderr or str(e)).strip()
        raise TagsUnavailable(location, detail) from None
    return [line.split("\trefs/tags/", 1)[1] for line in out.splitlines() if "\trefs/tags/" in line]


def tag_version(tag: str) -> Version | None:
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None


def open_target(target: Target, *, cache: ArchiveCache | None = None, progress: bool = False) -> Source:
    """The target as a source: a release through the sdist cache, a git ref from its repository (its label
    prefixes any error)."""
    from patchkit.sources import open_source

    try:
        if target.location is not None:
            from patchkit.sources.git import GitSource  # gitpython: only for git targets

            return GitSource(target.location, target.ref, cache=cache)
        return open_source(target.spec, cache=cache, progress=progress)
    except PatchkitError as e:
        raise TargetUnavailable(target.label, e) from e
