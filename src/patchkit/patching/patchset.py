"""The patch model: `patches/<id>/patch.toml` and `patches/series.toml`, validated once.

Everything downstream trusts these dataclasses; every rule about what a patch file may say lives here.
The format is documented in docs/DESIGN.md. Errors name the file and the field.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from patchkit.errors import PatchkitError
from patchkit.sources.base import DISTRIBUTIONS

ACTIONS = ("replace", "insert_before", "insert_after", "assert")
UPSTREAM_STATES = re.compile(r"^(none|open|merged-in-\d+(\.\d+)*([a-z0-9.+-]*)?)$")
PATCH_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
SERIES_FILE = "series.toml"
DEFAULT_PACKAGE = "vllm"


@dataclass(frozen=True)
class Edit:
    """One anchored change to one file of one package."""

    index: int  # 1-based position in its patch, for messages
    package: str
    candidates: tuple[str, ...]  # paths relative to the package root; exactly one must exist
    action: str
    anchor: str
    count: int
    text: str  # empty only for assert
    versions: SpecifierSet | None = None  # releases of its package this edit is for (None: the patch's range)

    @property
    def applied_form(self) -> str:
        """What each anchor occurrence looks like once this edit is applied."""
        if self.action == "insert_before":
            return self.text + self.anchor
        if self.action == "insert_after":
            return self.anchor + self.text
        if self.action == "replace":
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
    upstream: dict[str, str]
    edits: tuple[Edit, ...]
    upstreamed: Probe | None = None
    digest: str = field(default="", compare=False)  # sha256 over the folder's files, for image annotations

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
    series_doc = _read_toml(series_path)
    order = series_doc.get("series")
    if not isinstance(order, list) or not all(isinstance(i, str) for i in order) or not order:
        raise PatchkitError(f"{series_path}: 'series' must be a non-empty list of patch ids")
    dupes = sorted({i for i in order if order.count(i) > 1})
    if dupes:
        raise PatchkitError(f"{series_path}: duplicate patch ids in the series: {dupes}")

    patches: dict[str, Patch] = {}
    for toml_path in sorted(folder.glob("*/patch.toml")):
        patch = load_patch(toml_path)
        if patch.id in patches:  # unreachable through folder names, kept for ids that lie
            raise PatchkitError(f"{toml_path}: duplicate patch id {patch.id!r}")
        patches[patch.id] = patch
    missing = [i for i in order if i not in patches]
    if missing:
        raise PatchkitError(f"{series_path}: series names patches with no folder: {missing}")
    unlisted = sorted(set(patches) - set(order))
    if unlisted:
        raise PatchkitError(f"{series_path}: patch folders missing from the series: {unlisted}")
    return PatchSet(folder=folder, patches=patches, order=tuple(order))


def load_patch(toml_path: Path) -> Patch:
    doc = _read_toml(toml_path)
    where = str(toml_path)
    pid = _string(doc, "id", where)
    if not PATCH_ID.match(pid):
        raise PatchkitError(f"{where}: id {pid!r} must be lowercase letters, digits and dashes")
    if pid != toml_path.parent.name:
        raise PatchkitError(f"{where}: id {pid!r} differs from its folder name {toml_path.parent.name!r}")
    known = {"id", "title", "why", "vllm", "packages", "origin", "upstream", "upstreamed", "edit"}
    _no_unknown_keys(doc, known, where)

    ranges = {DEFAULT_PACKAGE: _specifier(_string(doc, "vllm", where), f"{where}: vllm")}
    for package, spec in _table(doc, "packages", where, required=False).items():
        if package not in DISTRIBUTIONS:
            raise PatchkitError(f"{where}: [packages] names unknown package {package!r}; known: {sorted(DISTRIBUTIONS)}")
        ranges[package] = _specifier(spec, f"{where}: packages.{package}")

    origin = _table(doc, "origin", where)
    for key in ("author", "url", "license"):
        _string(origin, key, f"{where}: [origin]")
    upstream = _table(doc, "upstream", where)
    state = _string(upstream, "state", f"{where}: [upstream]")
    if not UPSTREAM_STATES.match(state):
        raise PatchkitError(f"{where}: [upstream] state {state!r} must be none, open or merged-in-X.Y.Z")
    upstream.setdefault("url", "")

    raw_edits = doc.get("edit")
    if not isinstance(raw_edits, list) or not raw_edits:
        raise PatchkitError(f"{where}: a patch needs at least one [[edit]]")
    edits = tuple(_edit(raw, i, toml_path, ranges) for i, raw in enumerate(raw_edits, start=1))

    probe = None
    if "upstreamed" in doc:
        raw = _table(doc, "upstreamed", where)
        pw = f"{where}: [upstreamed]"
        _no_unknown_keys(raw, {"package", "file", "files", "contains"}, pw)
        probe = Probe(
            package=raw.get("package", DEFAULT_PACKAGE),
            candidates=_candidates(raw, pw),
            contains=_string(raw, "contains", pw),
        )
    return Patch(
        id=pid,
        title=_string(doc, "title", where),
        why=_string(doc, "why", where),
        folder=toml_path.parent,
        ranges=ranges,
        origin={k: str(v) for k, v in origin.items()},
        upstream={k: str(v) for k, v in upstream.items()},
        edits=edits,
        upstreamed=probe,
        digest=folder_digest(toml_path.parent),
    )


def folder_digest(folder: Path) -> str:
    """sha256 over the sorted relative paths and bytes of a patch folder: its content identity."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def _edit(raw: object, index: int, toml_path: Path, ranges: dict[str, SpecifierSet]) -> Edit:
    where = f"{toml_path}: edit {index}"
    if not isinstance(raw, dict):
        raise PatchkitError(f"{where}: must be a table")
    _no_unknown_keys(
        raw, {"package", "file", "files", "action", "anchor", "count", "text", "text_file", "versions"}, where
    )
    package = raw.get("package", DEFAULT_PACKAGE)
    if package not in ranges:
        raise PatchkitError(f"{where}: package {package!r} has no version range in [packages]")
    action = _string(raw, "action", where)
    if action not in ACTIONS:
        raise PatchkitError(f"{where}: unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    anchor = _string(raw, "anchor", where)
    count = raw.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise PatchkitError(f"{where}: count must be a positive integer, got {count!r}")
    text = _edit_text(raw, where, toml_path.parent)
    if action == "assert":
        if text:
            raise PatchkitError(f"{where}: an assert edit changes nothing and takes no text")
    else:
        if not text:
            raise PatchkitError(f"{where}: {action} needs a non-empty text (a change that changes nothing is an error)")
        if action == "replace" and text == anchor:
            raise PatchkitError(f"{where}: replacement text equals the anchor (a change that changes nothing)")
        if action != "replace" and anchor in text:
            # The applied form would contain the anchor twice and the state could not be read back.
            raise PatchkitError(f"{where}: inserted text contains the anchor itself")
    # An edit may narrow the patch's range: one fix whose code moved between releases stays one patch.
    versions = _specifier(raw["versions"], f"{where}: versions") if "versions" in raw else None
    return Edit(index, package, _candidates(raw, where), action, anchor, count, text, versions)


def _edit_text(raw: dict, where: str, folder: Path) -> str:
    if "text" in raw and "text_file" in raw:
        raise PatchkitError(f"{where}: give text or text_file, not both")
    if "text_file" not in raw:
        text = raw.get("text", "")
        if not isinstance(text, str):
            raise PatchkitError(f"{where}: text must be a string")
        return text
    name = _string(raw, "text_file", where)
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise PatchkitError(f"{where}: text_file {name!r} leaves the patch folder")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PatchkitError(f"{where}: text_file {name!r} not found beside patch.toml") from None
    except UnicodeDecodeError as e:
        raise PatchkitError(f"{where}: text_file {name!r} is not UTF-8: {e}") from None


def _candidates(raw: dict, where: str) -> tuple[str, ...]:
    if ("file" in raw) == ("files" in raw):
        raise PatchkitError(f"{where}: give exactly one of file or files")
    paths = [raw["file"]] if "file" in raw else raw["files"]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise PatchkitError(f"{where}: files must be a non-empty list of paths")
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


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise PatchkitError(f"{path}: not found") from None
    except tomllib.TOMLDecodeError as e:
        raise PatchkitError(f"{path}: malformed TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise PatchkitError(f"{path}: not UTF-8: {e}") from None


def _string(doc: dict, key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PatchkitError(f"{where}: {key!r} must be a non-empty string")
    return value


def _table(doc: dict, key: str, where: str, required: bool = True) -> dict:
    value = doc.get(key, None if required else {})
    if not isinstance(value, dict):
        raise PatchkitError(f"{where}: [{key}] must be a table")
    return dict(value)


def _specifier(spec: object, where: str) -> SpecifierSet:
    if not isinstance(spec, str):
        raise PatchkitError(f"{where}: version range must be a string")
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as e:
        raise PatchkitError(f"{where}: invalid version range {spec!r}: {e}") from None


def _no_unknown_keys(doc: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise PatchkitError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
