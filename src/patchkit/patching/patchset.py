"""The patch model: `patches/<id>/patch.toml` and `patches/series.toml`, validated once.

Everything downstream trusts these dataclasses. Types and keys are checked by the schema (schema.py,
through patchkit.tomlschema); the rules between fields live here. The format is in docs/DESIGN.md.
Errors name the file, the table and the key: InvalidPatchFile for a patch.toml, InvalidSeries and
UnknownPatch for a series.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath

import msgspec
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from patchkit import tomlschema
from patchkit.errors import PatchkitError
from patchkit.patching.schema import (
    EditTable,
    NeededWhenTable,
    PatchFile,
    SeriesFile,
    TrackedTable,
    UpstreamedProbeTable,
)
from patchkit.sources.base import DISTRIBUTIONS
from patchkit.sources.installed_version import VERSION_MODULES
from patchkit.tomlschema import InvalidDefinition
from patchkit.untrusted import read_file

SERIES_FILE = "series.toml"
DEFAULT_PACKAGE = "vllm"


class InvalidPatchFile(InvalidDefinition):
    """A patch.toml (or a text file beside it) that reads as its schema but breaks a rule between fields
    (exit 2). As for any definition: `path` the patch.toml, `at` the table and key ("[[edit]] #2",
    "[packages], key 'torch'"; None for the file as a whole), `detail` what was expected and found;
    `problem` one of "folder-name" (id is not its folder's name), "unknown-package", "no-edit",
    "edit-header" (an [[edit]] header patchkit cannot rewrite: not alone on its line),
    "no-range" (a package without a version range), "version-range" (not PEP 440), "assert-text" (an
    assert with a text), "changes-nothing", "anchor-in-text", "text-twice" (text and text_file),
    "text-file-outside", "text-file-missing", "encoding", "file-or-files", "absolute-path",
    "escaping-path", "duplicate-fix" (a finding named twice in `fixes`), "no-condition" ([needed_when] names none), "probe-kind" ([upstreamed] gives both or
    neither of contains and release, or a file with release), "version-probe" (a contains probe on the
    release stamp file); judged where the rule is used:
    "unknown-field" (a [needed_when] serve key no variant has), "unknown-kind" (a quantized kind no module
    has), "unknown-marker" (a [smoke] marker the boot-log reader does not know)."""


class UnknownPatch(PatchkitError):
    """Patch ids the patch set does not have (exit 2): `patches` the unknown ids, `known` the full series,
    `series` the series that named them (None when one patch was asked for by id)."""

    def __init__(self, patches: tuple[str, ...], known: tuple[str, ...], series: tuple[str, ...] | None = None):
        self.patches, self.known, self.series = tuple(patches), tuple(known), series
        if series is None:
            super().__init__(f"unknown patch {patches[0]!r}; the patch set has: {', '.join(known)}")
        else:
            super().__init__(f"series names unknown patches {list(patches)}; known: {', '.join(known)}")


class InvalidSeries(PatchkitError):
    """A series that breaks the patch set's rules (exit 2): `path` the series.toml it was read from (None
    for a series an image names), `problem` "duplicate" (ids listed twice), "no-folder" (ids without a
    patch folder), "unlisted" (patch folders the series leaves out) or "order" (not in the full series'
    application order), `patches` the ids concerned, `order` the full series (for "order")."""

    def __init__(self, path: Path | str | None, problem: str, patches: tuple[str, ...], order: tuple[str, ...] = ()):
        self.path = None if path is None else str(path)
        self.problem, self.patches, self.order = problem, tuple(patches), tuple(order)
        ids = list(self.patches)
        detail = {"duplicate": f"duplicate patch ids in the series: {ids}" if path else f"series lists {ids} more than once",
                  "no-folder": f"series names patches with no folder: {ids}",
                  "unlisted": f"patch folders missing from the series: {ids}",
                  "order": f"series {ids} is not in the application order of the full series: {list(self.order)}"}[problem]
        super().__init__(f"{path}: {detail}" if path else detail)


class Action(StrEnum):
    """What an edit does at each occurrence of its anchor (patch.toml's `action`)."""

    REPLACE = "replace"
    INSERT_BEFORE = "insert_before"
    INSERT_AFTER = "insert_after"
    ASSERT = "assert"  # changes nothing: the anchor must be there, count times


def applied_form(action: str, anchor: str, text: str) -> str:
    """What each anchor occurrence looks like once an edit of `action` is applied (an assert changes nothing).
    The one rule for the planner, the rebase's search and `patchkit record`, whatever form the edit is in."""
    if action == Action.INSERT_BEFORE:
        return text + anchor
    if action == Action.INSERT_AFTER:
        return anchor + text
    if action == Action.REPLACE:
        return text
    return anchor


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
        return applied_form(self.action, self.anchor, self.text)

    @property
    def label(self) -> str:
        return f"edit {self.index} ({self.action})"

    def in_range(self, version: str) -> bool:
        """Whether this edit is for `version` of its package: inside its own range, or it has none (the
        patch's range, checked on the patch, decides). A version that does not parse raises InvalidVersion."""
        return self.versions is None or self.versions.contains(Version(version), prereleases=True)

    def for_release(self, versions: Mapping[str, str]) -> bool:
        """Whether this edit is for the source whose packages are at `versions`: its package is there, and
        that version is in the edit's range."""
        return self.package in versions and self.in_range(versions[self.package])


@dataclass(frozen=True)
class Probe:
    """What in the unpatched target means upstream now carries the fix (probes.py matches it): `contains`
    found whole in one of `candidates`, or the source's own release inside `release`."""

    package: str
    candidates: tuple[str, ...]  # () for a release probe
    contains: str | None = None
    release: SpecifierSet | None = None


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
    needed_when: NeededWhenTable | None = None  # when a checkpoint served as a variant needs it (checkpoint.needs)
    image_env: dict[str, str] = field(default_factory=dict)  # [image] env: set in exactly the images carrying it
    smoke_env: dict[str, str] = field(default_factory=dict)  # [smoke] env: what the hardware smoke switches on
    smoke_markers: tuple[str, ...] = ()  # [smoke] markers: the boot-log lines its code then prints
    fixes: tuple[str, ...] = ()  # the findings (boot-log causes, serving findings) whose fix names this patch

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
            raise UnknownPatch((patch_id,), self.order) from None

    def series(self, ids: list[str] | tuple[str, ...] | None = None) -> list[Patch]:
        """The patches of a series, in the full series' order (an image names a subset)."""
        if ids is None:
            return [self.patches[i] for i in self.order]
        unknown = [i for i in ids if i not in self.patches]
        if unknown:
            raise UnknownPatch(tuple(unknown), self.order, tuple(ids))
        dupes = sorted({i for i in ids if list(ids).count(i) > 1})
        if dupes:
            raise InvalidSeries(None, "duplicate", tuple(dupes))
        positions = [self.order.index(i) for i in ids]
        if positions != sorted(positions):
            raise InvalidSeries(None, "order", tuple(ids), self.order)
        return [self.patches[i] for i in ids]

    def fixing(self, finding: str) -> tuple[str, ...]:
        """The ids of the patches whose `fixes` names `finding`, in application order."""
        return tuple(i for i in self.order if finding in self.patches[i].fixes)


def load_patchset(folder: Path | str) -> PatchSet:
    """Read and validate every patch folder and the series file."""
    folder = Path(folder)
    series_path = folder / SERIES_FILE
    order = tomlschema.load(series_path, SeriesFile).series
    dupes = sorted({i for i in order if order.count(i) > 1})
    if dupes:
        raise InvalidSeries(series_path, "duplicate", tuple(dupes))

    patches: dict[str, Patch] = {}
    for toml_path in sorted(folder.glob("*/patch.toml")):
        patch = load_patch(toml_path)
        patches[patch.id] = patch
    missing = [i for i in order if i not in patches]
    if missing:
        raise InvalidSeries(series_path, "no-folder", tuple(missing))
    unlisted = sorted(set(patches) - set(order))
    if unlisted:
        raise InvalidSeries(series_path, "unlisted", tuple(unlisted))
    return PatchSet(folder=folder, patches=patches, order=tuple(order))


def load_patch(toml_path: Path) -> Patch:
    doc = tomlschema.load(toml_path, PatchFile)
    if doc.id != toml_path.parent.name:
        raise InvalidPatchFile(toml_path, "key 'id'", "folder-name",
                               f"id {doc.id!r} differs from its folder name {toml_path.parent.name!r}")
    ranges = {DEFAULT_PACKAGE: _specifier(doc.vllm, toml_path, "key 'vllm'")}
    for package, spec in doc.packages.items():
        if package not in DISTRIBUTIONS:
            raise InvalidPatchFile(toml_path, "[packages]", "unknown-package",
                                   f"names unknown package {package!r}; known: {sorted(DISTRIBUTIONS)}")
        ranges[package] = _specifier(spec, toml_path, f"[packages], key {package!r}")
    if not doc.edit:
        raise InvalidPatchFile(toml_path, None, "no-edit", "a patch needs at least one [[edit]]")
    edits = tuple(_edit(raw, i, toml_path, ranges) for i, raw in enumerate(doc.edit, start=1))
    probe = None
    if doc.upstreamed is not None:
        raw = doc.upstreamed
        if raw.package not in ranges:
            raise InvalidPatchFile(toml_path, "[upstreamed]", "no-range",
                                   f"package {raw.package!r} has no version range in this patch")
        probe = _probe(raw, toml_path)
    twice = sorted({f for f in doc.fixes if doc.fixes.count(f) > 1})
    if twice:
        raise InvalidPatchFile(toml_path, "key 'fixes'", "duplicate-fix", f"names {twice} more than once")
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
        needed_when=_needed_when(doc.needed_when, toml_path),
        image_env=dict(doc.image.env) if doc.image else {},
        smoke_env=dict(doc.smoke.env) if doc.smoke else {},
        smoke_markers=tuple(doc.smoke.markers) if doc.smoke else (),
        fixes=tuple(doc.fixes),
    )


def _probe(raw: UpstreamedProbeTable, toml_path: Path) -> Probe:
    at = "[upstreamed]"
    if (raw.contains is None) == (raw.release is None):
        raise InvalidPatchFile(toml_path, at, "probe-kind", "give exactly one of contains (text in its file or "
                               "files) or release (a range of the source's own release)")
    if raw.release is not None:
        if raw.file is not None or raw.files is not None:
            raise InvalidPatchFile(toml_path, at, "probe-kind", "a release probe reads the source's own version, "
                                   "not a file: give no file or files")
        return Probe(raw.package, (), release=_specifier(raw.release, toml_path, f"{at}, key 'release'"))
    candidates = _candidates(raw, toml_path, at)
    stamp = VERSION_MODULES.get(raw.package)
    if stamp in candidates:
        raise InvalidPatchFile(toml_path, at, "version-probe", f"contains reads {raw.package}/{stamp}, the release "
                               "stamp: text of a version fires on every release that shares it; probe the fix's "
                               "own code, or give release = a range of the source's own release (exact)")
    return Probe(raw.package, candidates, contains=raw.contains)


def _needed_when(table: NeededWhenTable | None, toml_path: Path) -> NeededWhenTable | None:
    """A rule that names no condition would make every variant need the patch: refused."""
    if table is not None and not (table.config or table.config_set or table.serve or table.quantized or table.spelling):
        raise InvalidPatchFile(toml_path, "[needed_when]", "no-condition",
                               "names no condition (config, config_set, serve, quantized or spelling); a patch "
                               "every variant needs belongs in the root image's series instead")
    return table


def folder_digest(folder: Path) -> str:
    """sha256 over the sorted relative paths and bytes of a patch folder: its content identity."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(read_file(path, "definition")).digest())
    return "sha256:" + h.hexdigest()


def _edit(raw: EditTable, index: int, toml_path: Path, ranges: dict[str, SpecifierSet]) -> Edit:
    at = f"[[edit]] #{index}"
    if raw.package not in ranges:
        raise InvalidPatchFile(toml_path, at, "no-range", f"package {raw.package!r} has no version range in [packages]")
    text = _edit_text(raw, toml_path, at)
    if raw.action == "assert":
        if text:
            raise InvalidPatchFile(toml_path, at, "assert-text", "an assert edit changes nothing and takes no text")
    else:
        if not text:
            raise InvalidPatchFile(toml_path, at, "changes-nothing",
                                   f"{raw.action} needs a non-empty text (a change that changes nothing is an error)")
        if raw.action == "replace" and text == raw.anchor:
            raise InvalidPatchFile(toml_path, at, "changes-nothing",
                                   "replacement text equals the anchor (a change that changes nothing)")
        if raw.action != "replace" and raw.anchor in text:
            # The applied form would contain the anchor twice and the state could not be read back.
            raise InvalidPatchFile(toml_path, at, "anchor-in-text", "inserted text contains the anchor itself")
    # An edit may narrow the patch's range: one fix whose code moved between releases stays one patch.
    versions = _specifier(raw.versions, toml_path, f"{at}, key 'versions'") if raw.versions is not None else None
    return Edit(index, raw.package, _candidates(raw, toml_path, at), Action(raw.action), raw.anchor, raw.count, text,
                versions)


def _edit_text(raw: EditTable, toml_path: Path, at: str) -> str:
    if raw.text is not None and raw.text_file is not None:
        raise InvalidPatchFile(toml_path, at, "text-twice", "give text or text_file, not both")
    if raw.text_file is None:
        return raw.text or ""
    name, folder = raw.text_file, toml_path.parent
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise InvalidPatchFile(toml_path, at, "text-file-outside", f"text_file {name!r} leaves the patch folder")
    if not path.exists():
        raise InvalidPatchFile(toml_path, at, "text-file-missing", f"text_file {name!r} not found beside patch.toml")
    data = read_file(path, "definition", f"{toml_path}: {at}: text_file {name!r}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidPatchFile(toml_path, at, "encoding", f"text_file {name!r} is not UTF-8: {e}") from None


def _candidates(raw: EditTable | UpstreamedProbeTable, toml_path: Path, at: str) -> tuple[str, ...]:
    if (raw.file is None) == (raw.files is None):
        raise InvalidPatchFile(toml_path, at, "file-or-files", "give exactly one of file or files")
    paths = [raw.file] if raw.file is not None else raw.files or []
    for p in paths:
        check_relative_path(p, toml_path, at)
    return tuple(paths)


def check_relative_path(path: str, toml_path: Path, at: str) -> None:
    """A target path stays inside its package root: relative, POSIX, no '..'."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        raise InvalidPatchFile(toml_path, at, "absolute-path",
                               f"path {path!r} is absolute; targets are relative to the package root")
    if ".." in pure.parts or "\\" in path:
        raise InvalidPatchFile(toml_path, at, "escaping-path", f"path {path!r} escapes the package root")


def _specifier(spec: str, toml_path: Path, at: str) -> SpecifierSet:
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as e:
        raise InvalidPatchFile(toml_path, at, "version-range", f"invalid version range {spec!r}: {e}") from None
