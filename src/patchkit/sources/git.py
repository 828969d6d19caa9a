"""A git ref as a source: blobs read from the commit's tree with gitpython, no checkout, no worktree.

A remote URL is cloned bare into the cache once, and fetched again when the ref is a branch (or
anything but a commit or tag already in the clone).

The version comes from `<pkg>/_version.py` when committed, else from the ref when it is a version tag,
else from `git describe` against the nearest version tag, written `TAG+N.gSHA` (N commits after TAG;
a PEP 440 local label, so it orders right after the tag), else the short commit sha.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
import tempfile
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from patchkit.errors import PatchkitError
from patchkit.sources.base import (
    PACKAGES,
    NoPackages,
    NoSuchSource,
    NotARegularMember,
    SourceDefaults,
    check_package,
    find_package_root,
    relative_path,
)
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.metadata import version_py

_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:")  # git@github.com:owner/repo.git
_DESCRIBE = re.compile(r"^(?P<tag>.+)-(?P<distance>\d+)-g(?P<sha>[0-9a-f]+)$")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


def is_remote(location: str) -> bool:
    return "://" in location or bool(_SCP_LIKE.match(location))


class UnknownRef(PatchkitError):
    """A ref that names no commit in the repository (exit 2): the repository `location` and the `ref`."""

    def __init__(self, location: str, ref: str):
        self.location, self.ref = location, ref
        super().__init__(f"ref {ref!r} is not a commit in git repository {location}")


class GitFetchFailed(PatchkitError):
    """Cloning or fetching a remote repository failed (exit 2): its `url` and git's `detail`."""

    def __init__(self, url: str, detail: str):
        self.url, self.detail = url, detail
        super().__init__(f"cannot fetch git repository {url}: {detail}")


class IncompleteGitSource(PatchkitError):
    """A git source given without its repository `location` or its `ref` (an empty one; as --git and --ref
    give them apart; a typed git:PATH_OR_URL@REF is sources.spec's InvalidSourceSpec) (exit 2)."""

    def __init__(self, location: str, ref: str):
        self.location, self.ref = location, ref
        super().__init__(f"git source {location}@{ref} needs both a repository and a ref: git:PATH_OR_URL@REF")


class GitSource(SourceDefaults):
    def __init__(self, location: str, ref: str, *, cache: ArchiveCache | None = None):
        if not location or not ref:
            raise IncompleteGitSource(location, ref)
        self.location, self.ref = location, ref
        self._repo = (
            _remote_clone(location, ref, cache or ArchiveCache()) if is_remote(location) else _local_repo(location)
        )
        try:
            self.commit = self._repo.commit(ref)
            self._tree = self.commit.tree
        except (git.BadName, git.BadObject, git.GitError, ValueError) as error:
            raise UnknownRef(location, ref) from error
        self._roots = {p: root for p in PACKAGES if (root := find_package_root(p, self._is_file)) is not None}
        if not self._roots:
            raise NoPackages(f"{location}@{ref} at its top level", [f"{p}/__init__.py" for p in PACKAGES])
        self._versions = {package: self._detect_version(root) for package, root in self._roots.items()}
        packages = ", ".join(f"{package} {version}" for package, version in self._versions.items())
        self.description = f"{packages} git {location}@{ref} (commit {self.commit.hexsha[:12]})"

    def versions(self) -> dict[str, str]:
        return dict(self._versions)

    def read(self, package: str, path: str) -> bytes | None:
        check_package(package)
        relative = relative_path(path)
        root = self._roots.get(package)
        if root is None:
            return None
        entry = self._entry(f"{root}/{relative}")
        if entry is None:
            return None
        if entry.type != "blob" or stat.S_ISLNK(entry.mode):
            what = "a symlink" if entry.type == "blob" else "a directory" if entry.type == "tree" else "a submodule"
            raise NotARegularMember(f"{package}/{relative}", what, f"{self.location}@{self.ref}")
        return entry.data_stream.read()

    def distribution_file(self, path: str) -> bytes | None:
        """A regular file of the tree outside the packages (e.g. requirements/cuda.txt); None when absent."""
        entry = self._entry(relative_path(path))
        if entry is None or entry.type != "blob" or stat.S_ISLNK(entry.mode):
            return None
        return entry.data_stream.read()

    def _entry(self, path: str) -> git.Object | None:
        try:
            return self._tree / path
        except KeyError:
            return None

    def _is_file(self, path: str) -> bool:
        entry = self._entry(path)
        return entry is not None and entry.type == "blob" and not stat.S_ISLNK(entry.mode)

    def _detect_version(self, root: str) -> str:
        entry = self._entry(f"{root}/_version.py")
        if entry is not None and self._is_file(f"{root}/_version.py") and (
            version := version_py(entry.data_stream.read())
        ):
            return version
        tag = self.ref.removeprefix("refs/tags/")
        if tag in {t.name for t in self._repo.tags} and (version := _tag_version(tag)):
            return version
        try:
            described = self._repo.git.describe(
                "--tags", "--long", "--match", "v[0-9]*", "--match", "[0-9]*", self.commit.hexsha
            )
        except git.GitCommandError:  # no version tag among the ancestors
            described = ""
        if (match := _DESCRIBE.match(described)) and (version := _tag_version(match["tag"])):
            distance = int(match["distance"])
            return version if distance == 0 else f"{version}+{distance}.g{match['sha']}"
        return self.commit.hexsha[:12]


def _tag_version(tag: str) -> str | None:
    try:
        return str(Version(tag.removeprefix("v")))
    except InvalidVersion:
        return None


def _local_repo(location: str) -> git.Repo:
    path = Path(location).expanduser()
    try:
        return git.Repo(path)
    except git.NoSuchPathError as error:
        raise NoSuchSource("git repository", path, "does not exist") from error
    except git.InvalidGitRepositoryError as error:
        raise NoSuchSource("directory", path, "is not a git repository") from error


def _remote_clone(url: str, ref: str, cache: ArchiveCache) -> git.Repo:
    """The cache's bare clone of `url`, created or fetched as needed; a failed clone leaves nothing."""
    name = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    target = cache.git / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:16]}.git"
    try:
        if not target.is_dir():
            cache.git.mkdir(parents=True, exist_ok=True)
            temporary = Path(tempfile.mkdtemp(dir=cache.git, prefix=f".{target.name}."))
            try:
                git.Repo.clone_from(url, temporary, bare=True)
                try:
                    temporary.rename(target)
                except OSError:
                    if not target.is_dir():  # else another run cloned it meanwhile: use theirs
                        raise
            finally:
                shutil.rmtree(temporary, ignore_errors=True)
            return git.Repo(target)
        repo = git.Repo(target)
        # Branches move, so they are fetched again; a commit or tag already here is final.
        if not (_FULL_SHA.match(ref) and _has_commit(repo, ref)) and ref.removeprefix("refs/tags/") not in repo.tags:
            repo.git.fetch("--prune", "--tags", "--force", url, "+refs/heads/*:refs/heads/*")
        return repo
    except git.GitError as error:
        detail = getattr(error, "stderr", "") or error
        raise GitFetchFailed(url, str(detail).strip()) from error


def _has_commit(repo: git.Repo, sha: str) -> bool:
    try:
        return repo.commit(sha).tree is not None  # the tree lookup is what proves the commit exists
    except (git.BadName, git.BadObject, ValueError):
        return False
