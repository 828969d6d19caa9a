"""The patch model: `patches/<id>/patch.toml` and `patches/series.toml`, validated once.

Everything downstream trusts these dataclasses. Types and keys are checked by the schema (schema.py,
through patchkit.tomlschema); the rules between fields live here. The format is in docs/DESIGN.md.
Errors name the file, the table and the key.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath

import msgspec
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from patchkit import tomlschema
from patchkit.errors import PatchkitError
from patchkit.untrusted import read_file
from patchkit.patching.schema import (
    EditTable,
    PatchFile,
    SeriesFile,
    TrackedTable,
    UpstreamedProbeTable,
)
from patchkit.sources.base import DISTRIBUTIONS

SERIES_FILE = "series.toml"
DEFAULT_PACKAGE = "vllm"


class Action(StrEnum):
    """What an edit does at each occurrence of its anchor (patch.toml's `action`)."""

    REPLACE = "replace"
    INSERT_BEFORE = "insert_before"
    INSERT_AFTER = "insert_after"
    ASSERT = "assert"  # changes nothing: the anchor must be there, count times


@dataclass(frozen=True)
class Edit:
    """One anchored change to one file of one package."""

    index: int  # 1-based position in its patch, for messages
    package: str
    candidates: tuple[str, ...]  # paths relative to the package root; exactly one must exist
    action: Action
    anchor: str
    count: int
    text: str  # empty only for assert
    versions: SpecifierSet | None = None  # releases of its package this edit is for (None: the patch's range)

    @property
    def applied_form(self) -> str:
        """What each anchor occurrence looks like once this edit is applied."""
        if self.action == Action.INSERT_BEFORE:
            return self.text + self.anchor
        if self.action == Action.INSERT_AFTER:
            return self.anchor + self.text
        if self.action == Action.REPLACE:
            return self.text
        return self.anchor

    @property
    def label(self) -> str:
        return f"edit {self.index} ({self.action})"


@dataclass(frozen=True)
class Probe:
    """Text whose presence in the unpatched target means upstream now carries the fix."""

    package: str
    candidates: tuple[str, ...]
    contains: str


@dataclass(frozen=True)
class Patch:
    id: str
    title: str
    why: str
    folder: Path
    ranges: dict[str, SpecifierSet]  # package -> releases it applies to; always has "vllm"
    origin: dict[str, str]
    upstream: dict[str, str]  # state, url
    edits: tuple[Edit, ...]
    upstreamed: Probe | None = None
    digest: str = field(default="", compare=False)  # sha256 over the folder's files, for image annotations
    evidence: str = ""   # how it was derived (sources, measurements)
    test: str = ""       # which tests prove it
    drop_when: str = ""  # when upstream makes it unnecessary
    tracked: tuple[TrackedTable, ...] = ()  # upstream PRs/issues that would retire it ([[upstream.tracked]])

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.package for e in self.edits))


@dataclass(frozen=True)
class PatchSet:
    """All patches in `patches/` and the full series in application order."""

    folder: Path
    patches: dict[str, Patch]
    order: tuple[str, ...]

    def patch(self, patch_id: str) -> Patch:
        try:
            return self.patches[patch_id]
        except KeyError:
            known = ", ".join(self.order)
            raise PatchkitError(f"unknown patch {patch_id!r}; the patch set has: {known}") from None

    def series(self, ids: list[str] | tuple[str, ...] | None = None) -> list[Patch]:
        """The patches of a series, in the full series' order (an image names a subset)."""
        if ids is None:
            return [self.patches[i] for i in self.order]
        unknown = [i for i in ids if i not in self.patches]
        if unknown:
            raise PatchkitError(f"series names unknown patches {unknown}; known: {', '.join(self.order)}")
        dupes = sorted({i for i in ids if list(ids).count(i) > 1})
        if dupes:
            raise PatchkitError(f"series lists {dupes} more than once")
        positions = [self.order.index(i) for i in ids]
        if positions != sorted(positions):
            raise PatchkitError(
                f"series {list(ids)} is not in the application order of {self.folder / SERIES_FILE}: "
                f"{list(self.order)}"
            )
        return [self.patches[i] for i in ids]


def load_patchset(folder: Path | str) -> PatchSet:
    """Read and validate every patch folder and the series file."""
    folder = Path(folder)
    series_path = folder / SERIES_FILE
    order = tomlschema.load(series_path, SeriesFile).series
    dupes = sorted({i for i in order if order.count(i) > 1})
    if dupes:
        raise PatchkitError(f"{series_path}: duplicate patch ids in the series: {dupes}")

    patches: dict[str, Patch] = {}
    for toml_path in sorted(folder.glob("*/patch.toml")):
        patch = load_patch(toml_path)
        patches[patch.id] = patch
    missing = [i for i in order if i not in patches]
    if missing:
        raise PatchkitError(f"{series_path}: series names patches with no folder: {missing}")
    unlisted = sorted(set(patches) - set(order))
    if unlisted:
        raise PatchkitError(f"{series_path}: patch folders missing from the series: {unlisted}")
    return PatchSet(folder=folder, patches=patches, order=tuple(order))


def load_patch(toml_path: Path) -> Patch:
    doc = tomlschema.load(toml_path, PatchFile)
    where = str(toml_path)
    if doc.id != toml_path.parent.name:
        raise PatchkitError(f"{where}: id {doc.id!r} differs from its folder name {toml_path.parent.name!r}")
    ranges = {DEFAULT_PACKAGE: _specifier(doc.vllm, f"{where}: key 'vllm'")}
    for package, spec in doc.packages.items():
        if package not in DISTRIBUTIONS:
            raise PatchkitError(f"{where}: [packages] names unknown package {package!r}; known: {sorted(DISTRIBUTIONS)}")
        ranges[package] = _specifier(spec, f"{where}: [packages], key {package!r}")
    if not doc.edit:
        raise PatchkitError(f"{where}: a patch needs at least one [[edit]]")
    edits = tuple(_edit(raw, i, toml_path, ranges) for i, raw in enumerate(doc.edit, start=1))
    probe = None
    if doc.upstreamed is not None:
        raw = doc.upstreamed
        pw = f"{where}: [upstreamed]"
        if raw.package not in ranges:
            raise PatchkitError(f"{pw}: package {raw.package!r} has no version range in this patch")
        probe = Probe(package=raw.package, candidates=_candidates(raw, pw), contains=raw.contains)
    return Patch(
        id=doc.id,
        title=doc.title,
        why=doc.why,
        folder=toml_path.parent,
        ranges=ranges,
        origin=msgspec.structs.asdict(doc.origin),
        upstream={"state": doc.upstream.state, "url": doc.upstream.url},
        edits=edits,
        upstreamed=probe,
        digest=folder_digest(toml_path.parent),
        evidence=doc.evidence or "",
        test=doc.test or "",
        drop_when=doc.drop_when or "",
        tracked=tuple(doc.upstream.tracked),
    )


def folder_digest(folder: Path) -> str:
    """sha256 over the sorted relative paths and bytes of a patch folder: its content identity."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(read_file(path, "definition")).digest())
    return "sha256:" + h.hexdigest()


def _edit(raw: EditTable, index: int, toml_path: Path, ranges: dict[str, SpecifierSet]) -> Edit:
    where = f"{toml_path}: [[edit]] #{index}"
    if raw.package not in ranges:
        raise PatchkitError(f"{where}: package {raw.package!r} has no version range in [packages]")
    text = _edit_text(raw, where, toml_path.parent)
    if raw.action == "assert":
        if text:
            raise PatchkitError(f"{where}: an assert edit changes nothing and takes no text")
    else:
        if not text:
            raise PatchkitError(f"{where}: {raw.action} needs a non-empty text (a change that changes nothing is an error)")
        if raw.action == "replace" and text == raw.anchor:
            raise PatchkitError(f"{where}: replacement text equals the anchor (a change that changes nothing)")
        if raw.action != "replace" and raw.anchor in text:
            # The applied form would contain the anchor twice and the state could not be read back.
            raise PatchkitError(f"{where}: inserted text contains the anchor itself")
    # An edit may narrow the patch's range: one fix whose code moved between releases stays one patch.
    versions = _specifier(raw.versions, f"{where}: key 'versions'") if raw.versions is not None else None
    return Edit(index, raw.package, _candidates(raw, where), Action(raw.action), raw.anchor, raw.count, text, versions)


def _edit_text(raw: EditTable, where: str, folder: Path) -> str:
    if raw.text is not None and raw.text_file is not None:
        raise PatchkitError(f"{where}: give text or text_file, not both")
    if raw.text_file is None:
        return raw.text or ""
    name = raw.text_file
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise PatchkitError(f"{where}: text_file {name!r} leaves the patch folder")
    if not path.exists():
        raise PatchkitError(f"{where}: text_file {name!r} not found beside patch.toml")
    data = read_file(path, "definition", f"{where}: text_file {name!r}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PatchkitError(f"{where}: text_file {name!r} is not UTF-8: {e}") from None


def _candidates(raw: EditTable | UpstreamedProbeTable, where: str) -> tuple[str, ...]:
    if (raw.file is None) == (raw.files is None):
        raise PatchkitError(f"{where}: give exactly one of file or files")
    paths = [raw.file] if raw.file is not None else raw.files
    for p in paths:
        check_relative_path(p, where)
    return tuple(paths)


def check_relative_path(path: str, where: str) -> None:
    """A target path stays inside its package root: relative, POSIX, no '..'."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        raise PatchkitError(f"{where}: path {path!r} is absolute; targets are relative to the package root")
    if ".." in pure.parts or "\\" in path:
        raise PatchkitError(f"{where}: path {path!r} escapes the package root")


def _specifier(spec: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as e:
        raise PatchkitError(f"{where}: invalid version range {spec!r}: {e}") from None
