"""`patchkit verify`: the patch set against upstream vLLM versions, as a matrix patch x version.

Each version is opened as a source once; the full series and every image's own series are planned
against it in memory by the engine (nothing is written). Index releases open in parallel, a few at a
time (one per core and one waiting), and each is dropped once planned. Only the files the patches name are read, through
the sources' caches: a warm run decompresses nothing.

The pinned release is always a column: it is the baseline the exit code is measured against.
Exit 1 (`Matrix.exit_code`) means one of:
- a patch is broken, within its range, on the pinned release or a newer version;
- a patch that applies on the pinned release is out of range on a newer version and its edits no
  longer match there. Ranges stop at the newest release a patch was written against (`<0.34`), so
  without this rule a new release would only ever show "out of range" and never raise the alarm:
  every out-of-range cell is evaluated again with the ranges ignored ("would apply" / "would break").
Older versions are reported, never counted; an upstreamed patch is reported, never an error.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patchkit import PINNED_VLLM
from patchkit.errors import PatchkitError
from patchkit.patching.patchset import Patch, PatchSet
from patchkit.patching.planner import PatchResult, Plan, State, plan
from patchkit.sources.base import Source
from patchkit.sources.cache import SdistCache

FULL = "full"  # the series name standing for the whole patch set when there are no images

# Cell states, as the matrix shows them ("applies" is the engine's not-applied: pending, and clean).
APPLIES, APPLIED, UPSTREAMED, BROKEN = "applies", "applied", "upstreamed", "broken"
OUT_OF_RANGE, NOT_APPLICABLE = "out-of-range", "not-applicable"
CELL_STATES = (APPLIES, APPLIED, UPSTREAMED, BROKEN, OUT_OF_RANGE, NOT_APPLICABLE)
_FROM_ENGINE = {
    State.NOT_APPLIED: APPLIES,
    State.APPLIED: APPLIED,
    State.UPSTREAMED: UPSTREAMED,
    State.BROKEN: BROKEN,
    State.PARTIAL: BROKEN,  # a pristine upstream tree holding half a patch: the detail says so
    State.OUT_OF_RANGE: OUT_OF_RANGE,
    State.NOT_APPLICABLE: NOT_APPLICABLE,
}
_GOOD = (APPLIES, APPLIED)
_OPERATORS = "<>=!~"


# --- which versions -------------------------------------------------------------------------------


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


def parse_versions(text: str | None, pinned: str = PINNED_VLLM) -> VersionFilter:
    """None means the default: the pinned release and everything newer."""
    if text is None:
        return VersionFilter(spec=SpecifierSet(f">={pinned}"))
    text = text.strip()
    if not text:
        raise PatchkitError("--versions is empty: give versions (0.30.0,0.33.0) or a PEP 440 range (>=0.30)")
    if any(op in text for op in _OPERATORS):
        try:
            return VersionFilter(spec=SpecifierSet(text))
        except InvalidSpecifier as e:
            raise PatchkitError(
                f"--versions {text!r} is neither a list of versions nor a PEP 440 range ({e}); "
                "a range cannot be mixed with plain versions"
            ) from None
    versions = set()
    for item in text.split(","):
        try:
            versions.add(Version(item.strip()))
        except InvalidVersion:
            raise PatchkitError(f"--versions: {item.strip()!r} is not a version (PEP 440)") from None
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
        out = git.cmd.Git().ls_remote("--tags", "--refs", location)
    except git.GitCommandError as e:
        detail = (e.stderr or str(e)).strip()
        raise PatchkitError(f"cannot list the tags of git repository {location}: {detail}") from None
    return [line.split("\trefs/tags/", 1)[1] for line in out.splitlines() if "\trefs/tags/" in line]


def tag_version(tag: str) -> Version | None:
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None


# --- the matrix -----------------------------------------------------------------------------------


@dataclass
class Column:
    target: Target
    version: str  # as the source states it
    source: str  # the source's description: where the bytes came from
    pinned: bool
    newer: bool  # newer than the pinned release (a version that does not parse counts as newer)

    @property
    def label(self) -> str:
        return self.target.label


@dataclass
class Cell:
    state: str
    result: PatchResult  # the engine's verdict within the full series
    would: PatchResult | None = None  # out of range: the verdict with every range ignored

    @property
    def would_state(self) -> str | None:
        return _FROM_ENGINE[self.would.state] if self.would is not None else None

    def summary(self) -> str:
        """One line: the state and, when it matters, why."""
        if self.state == OUT_OF_RANGE:
            text = f"out of range: {self.result.detail}"
            if self.would is not None:
                text += f"; ignoring ranges it {_WOULD[self.would_state]}"
            return text
        return f"{self.state}: {self.result.detail}" if self.result.detail else self.state

    def diagnostics(self) -> str:
        """The engine's account of each broken edit, nearest matches included ("" if no edit is broken)."""
        for result in (self.result, self.would):
            if result is not None and any(e.state == "broken" for e in result.edits):
                return result.describe()
        return ""


_WOULD = {
    APPLIES: "would apply",
    APPLIED: "is already applied",
    UPSTREAMED: "is upstreamed (drop it)",
    BROKEN: "would break",
    OUT_OF_RANGE: "has no release number to check",
    NOT_APPLICABLE: "is not applicable",
}


@dataclass
class ImageCell:
    """Would the image's series build on this version? Blockers say which patch stops it and why."""

    blockers: list[str] = field(default_factory=list)

    @property
    def builds(self) -> bool:
        return not self.blockers


@dataclass
class Finding:
    """A reason for exit code 1."""

    patch: str
    column: str
    reason: str


@dataclass
class Matrix:
    pinned: str
    columns: list[Column]
    patches: list[Patch]
    cells: dict[tuple[str, str], Cell]  # (patch id, column label)
    image_series: dict[str, tuple[str, ...]]
    images: dict[str, dict[str, ImageCell]]  # image -> column label -> verdict

    def cell(self, patch_id: str, label: str) -> Cell:
        return self.cells[(patch_id, label)]

    @property
    def baseline(self) -> Column:
        return next(c for c in self.columns if c.pinned)

    @property
    def findings(self) -> list[Finding]:
        out = []
        base = self.baseline
        for patch in self.patches:
            good_on_pin = self.cell(patch.id, base.label).state in _GOOD
            for column in self.columns:
                if not (column.pinned or column.newer):
                    continue
                cell = self.cell(patch.id, column.label)
                if cell.state == BROKEN:
                    if column.pinned:
                        reason = "broken on the pinned release"
                    elif good_on_pin:
                        reason = f"applies on the pinned release, broken on {column.label}"
                    else:
                        reason = f"broken on {column.label}, within its range"
                    out.append(Finding(patch.id, column.label, reason))
                elif cell.state == OUT_OF_RANGE and good_on_pin and cell.would_state == BROKEN:
                    out.append(
                        Finding(
                            patch.id,
                            column.label,
                            f"applies on the pinned release; out of range on {column.label} and its edits "
                            "no longer match there",
                        )
                    )
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    @property
    def newest_for_all(self) -> Column | None:
        """The newest version on which every image builds."""
        for column in reversed(self.columns):
            if all(self.images[name][column.label].builds for name in self.images):
                return column
        return None


def load_image_series(images_dir: Path | None, patchset: PatchSet) -> dict[str, tuple[str, ...]]:
    """Each image's series; the full series alone ("full") when there are no image definitions."""
    if images_dir is None or not any(Path(images_dir).glob("*/image.toml")):
        return {FULL: patchset.order}
    from patchkit.images.definitions import load_images

    return {name: image.series for name, image in sorted(load_images(images_dir, patchset).items())}


def open_target(target: Target, *, cache: SdistCache | None = None, progress: bool = False) -> Source:
    from patchkit.sources import open_source

    try:
        if target.location is not None:
            from patchkit.sources.git import GitSource  # gitpython: only for git targets

            return GitSource(target.location, target.ref, cache=cache)
        return open_source(target.spec, cache=cache, progress=progress)
    except PatchkitError as e:
        raise PatchkitError(f"{target.label}: {e}") from e


def compute(
    patchset: PatchSet,
    targets: list[Target],
    *,
    image_series: dict[str, tuple[str, ...]] | None = None,
    pinned: str = PINNED_VLLM,
    cache: SdistCache | None = None,
    extra: list[Source] | None = None,
    progress: bool = False,
    opener: Callable[[Target], Source] | None = None,
) -> Matrix:
    """Open each target in turn, plan every distinct series against it, and build the matrix.

    `extra` are further sources (a FlashInfer release) combined with every target; `opener` replaces
    how a target becomes a source (the benchmark's extract-everything route).
    """
    image_series = image_series or {FULL: patchset.order}
    full = patchset.series()
    columns: list[Column] = []
    cells: dict[tuple[str, str], Cell] = {}
    images: dict[str, dict[str, ImageCell]] = {name: {} for name in image_series}
    companions = _Companions(cache, progress)

    def open_one(target: Target) -> Source:
        source = opener(target) if opener else open_target(target, cache=cache, progress=progress)
        with_ = list(extra or []) or companions.pinned_by(source)
        if with_:
            from patchkit.sources import combine_sources

            source = combine_sources([source, *with_])
        return source

    # Index releases open in parallel (each a pass over its sdists, inflate outside the GIL); git
    # checkouts and custom openers one at a time.
    parallel = opener is None and all(t.location is None for t in targets)
    for target, source in _opened(targets, open_one, workers=(os.cpu_count() or 1) if parallel else 1):
        column = _column(target, source, pinned)
        columns.append(column)
        plans = {patchset.order: plan(full, source)}
        relaxed = None
        if any(r.state == State.OUT_OF_RANGE for r in plans[patchset.order].results):
            relaxed = plan([_without_ranges(p) for p in full], source)
        for result in plans[patchset.order].results:
            would = relaxed.result(result.patch.id) if relaxed and result.state == State.OUT_OF_RANGE else None
            cells[(result.patch.id, column.label)] = Cell(_FROM_ENGINE[result.state], result, would)
        for name, ids in image_series.items():
            if ids not in plans:
                plans[ids] = plan(patchset.series(ids), source)
            images[name][column.label] = _image_cell(plans[ids], cells, column.label)
        # An sdist's pass holds ~50 MB of members: dropped once planned.
        del source, plans, relaxed
    order = sorted(range(len(columns)), key=lambda i: _column_key(columns[i], i))
    columns = [columns[i] for i in order]
    if sum(c.pinned for c in columns) != 1:
        raise PatchkitError(f"exactly one column must be the pinned vLLM {pinned}; got {[c.label for c in columns]}")
    return Matrix(pinned, columns, full, cells, dict(image_series), images)


def _opened(targets: list[Target], open_one: Callable[[Target], Source], workers: int):
    """(target, source) in the targets' order, at most `workers` opening at once and one more waiting, so
    memory holds a few releases, not all of them."""
    if workers <= 1:
        for target in targets:
            yield target, open_one(target)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="patchkit-open") as pool:
        pending = [pool.submit(open_one, t) for t in targets[:workers]]
        for i, target in enumerate(targets):
            if i + workers < len(targets):
                pending.append(pool.submit(open_one, targets[i + workers]))
            future = pending[i]
            pending[i] = None  # drop the reference once consumed
            yield target, future.result()


class _Companions:
    """Without --with, a release is checked together with the FlashInfer release it pins; releases that
    pin the same one (0.31 and 0.32) share it, opened once even when both open at the same time."""

    def __init__(self, cache: SdistCache | None, progress: bool):
        self._cache, self._progress = cache, progress
        self._opened: dict[str, Source] = {}
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def pinned_by(self, source: Source) -> list[Source]:
        from patchkit.sources import open_source
        from patchkit.sources.pins import pinned_flashinfer

        version = pinned_flashinfer(source)
        if not version:
            return []
        with self._lock:
            lock = self._locks.setdefault(version, threading.Lock())
        with lock:
            if version not in self._opened:
                self._opened[version] = open_source(f"flashinfer-python=={version}", cache=self._cache,
                                                    progress=self._progress)
        return [self._opened[version]]


def _column(target: Target, source: Source, pinned: str) -> Column:
    version = source.versions().get("vllm")
    if version is None:
        raise PatchkitError(f"{target.label}: {source.description} holds no vllm package")
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None  # a commit with no version tag behind it: treated as the newest
    if target.pinned and parsed != Version(pinned):
        raise PatchkitError(f"{target.label} is the baseline, the pinned vLLM {pinned}, but {source.description}")
    newer = parsed is None or parsed > Version(pinned)
    return Column(target, version, source.description, target.pinned, newer)


def _column_key(column: Column, index: int) -> tuple:
    try:
        return (0, Version(column.version), index)
    except InvalidVersion:
        return (1, Version("0"), index)


def _without_ranges(patch: Patch) -> Patch:
    return dataclasses.replace(patch, ranges={package: SpecifierSet() for package in patch.ranges})


def _image_cell(image_plan: Plan, cells: dict[tuple[str, str], Cell], label: str) -> ImageCell:
    """An image builds when each patch of its series applies, is applied, upstreamed, or not applicable.

    Out of range blocks it: the build would skip the patch, and an image without a patch it needs is
    not the image its definition describes.
    """
    blockers = []
    for result in image_plan.results:
        state = _FROM_ENGINE[result.state]
        if state == BROKEN:
            blockers.append(f"{result.patch.id} broken")
        elif state == OUT_OF_RANGE:
            would = cells[(result.patch.id, label)].would_state
            hint = f", {_WOULD_SHORT.get(would, would)}" if would else ""
            blockers.append(f"{result.patch.id} out of range{hint}")
    return ImageCell(blockers)


# --- renderers ------------------------------------------------------------------------------------


def to_dict(matrix: Matrix) -> dict:
    from patchkit.patching.report import result_to_dict

    def cell_dict(cell: Cell) -> dict:
        out = {
            "state": cell.state,
            "detail": cell.result.detail,
            "edits": result_to_dict(cell.result)["edits"],
            "would": None,
        }
        if cell.would is not None:
            would = result_to_dict(cell.would)
            out["would"] = {"state": cell.would_state, "detail": would["detail"], "edits": would["edits"]}
        return out

    newest = matrix.newest_for_all
    return {
        "pinned": matrix.pinned,
        "exit_code": matrix.exit_code,
        "columns": [
            {"label": c.label, "version": c.version, "source": c.source, "pinned": c.pinned, "newer": c.newer}
            for c in matrix.columns
        ],
        "patches": [
            {
                "id": p.id,
                "title": p.title,
                "ranges": {k: str(v) for k, v in p.ranges.items()},
                "cells": {c.label: cell_dict(matrix.cell(p.id, c.label)) for c in matrix.columns},
            }
            for p in matrix.patches
        ],
        "images": [
            {
                "name": name,
                "series": list(matrix.image_series[name]),
                "builds": {
                    c.label: {"builds": v.builds, "blockers": v.blockers}
                    for c in matrix.columns
                    for v in [matrix.images[name][c.label]]
                },
            }
            for name in matrix.images
        ],
        "newest_all_images_build": newest.label if newest else None,
        "findings": [dataclasses.asdict(f) for f in matrix.findings],
    }


_SHORT = {
    APPLIES: "applies",
    APPLIED: "applied",
    UPSTREAMED: "upstreamed",
    BROKEN: "BROKEN",
    OUT_OF_RANGE: "out of range",
    NOT_APPLICABLE: "n/a",
}
_WOULD_SHORT = {APPLIES: "would apply", BROKEN: "would BREAK", UPSTREAMED: "upstreamed", APPLIED: "applied"}
_MARK = {APPLIES: "✅", APPLIED: "✅", UPSTREAMED: "🔵", BROKEN: "❌", OUT_OF_RANGE: "⚪", NOT_APPLICABLE: "➖"}
_STYLE = {
    APPLIES: "green",
    APPLIED: "green",
    UPSTREAMED: "cyan",
    BROKEN: "bold red",
    OUT_OF_RANGE: "dim",
    NOT_APPLICABLE: "dim",
}


def _short(cell: Cell) -> str:
    if _holds(cell):
        return "holds"
    text = _SHORT[cell.state]
    if cell.would_state in _WOULD_SHORT:
        text += f" ({_WOULD_SHORT[cell.would_state]})"
    return text


def _holds(cell: Cell) -> bool:
    """An assert-only patch reads as applied when its invariants hold: say "holds", not "applied"."""
    return cell.state == APPLIED and all(e.action == "assert" for e in cell.result.patch.edits)


def _heading(column: Column) -> str:
    head = column.label
    if column.version != column.label.removeprefix("v"):
        head += f" [{column.version}]"
    return head + (" (pinned)" if column.pinned else "")


def _noteworthy(matrix: Matrix) -> list[tuple[Patch, Column, Cell]]:
    """Cells whose reason a reader needs: all but a plain "applies" or "holds" (an "applies" with a
    caveat, such as a package's edits left unchecked, is listed)."""
    return [
        (p, c, cell)
        for p in matrix.patches
        for c in matrix.columns
        if not _holds(cell := matrix.cell(p.id, c.label)) and (cell.state != APPLIES or cell.result.detail)
    ]


def _newest_line(matrix: Matrix) -> str:
    newest = matrix.newest_for_all
    what = "every image builds" if FULL not in matrix.images else "the full series builds"
    return f"newest version {what} on: {_heading(newest) if newest else 'none'}"


def render(matrix: Matrix) -> list:
    """Rich renderables: the matrix, the details of every cell that is not a plain "applies", images."""
    from rich.table import Table
    from rich.text import Text

    out: list = []
    table = Table(title=f"patch x vLLM version (pinned {matrix.pinned})", title_justify="left")
    table.add_column("patch", no_wrap=True)
    for column in matrix.columns:
        table.add_column(_heading(column), overflow="fold")
    for patch in matrix.patches:
        cells = [matrix.cell(patch.id, c.label) for c in matrix.columns]
        table.add_row(patch.id, *(Text(_short(cell), style=_STYLE[cell.state]) for cell in cells))
    out.append(table)
    details = _noteworthy(matrix)
    if details:
        out.append(Text("details", style="bold"))
        for patch, column, cell in details:
            out.append(Text(f"{patch.id} @ {column.label}: {cell.summary()}", style=_STYLE[cell.state]))
            if diagnostics := cell.diagnostics():
                out.append(Text("  " + diagnostics.replace("\n", "\n  ")))
    images = Table(title="images: would they build?", title_justify="left")
    images.add_column("image", no_wrap=True)
    for column in matrix.columns:
        images.add_column(_heading(column), overflow="fold")
    for name in matrix.images:
        row = []
        for column in matrix.columns:
            verdict = matrix.images[name][column.label]
            text = "builds" if verdict.builds else "; ".join(verdict.blockers)
            row.append(Text(text, style="green" if verdict.builds else "red"))
        images.add_row(name, *row)
    out.append(images)
    out.append(Text(_newest_line(matrix), style="bold"))
    out.extend(_findings_text(matrix))
    return out


def _findings_text(matrix: Matrix) -> list:
    from rich.text import Text

    findings = matrix.findings
    if not findings:
        return [Text("no regression against the pinned release", style="green")]
    return [Text("regressions (exit 1):", style="bold red")] + [
        Text(f"  {f.patch} @ {f.column}: {f.reason}", style="red") for f in findings
    ]


def to_markdown(matrix: Matrix) -> str:
    """GitHub-flavoured Markdown, for a job summary or an issue body."""
    heads = [_heading(c) for c in matrix.columns]
    lines = [f"## patchkit verify: {len(matrix.patches)} patches x {len(matrix.columns)} vLLM versions", ""]
    lines += [f"Pinned release: vLLM {matrix.pinned}.", ""]
    findings = matrix.findings
    if findings:
        lines += ["**Regressions (exit 1):**", ""]
        lines += [f"- `{f.patch}` @ {_md(f.column)}: {_md(f.reason)}" for f in findings]
    else:
        lines.append("No regression against the pinned release.")
    lines += ["", "| patch | " + " | ".join(_md(h) for h in heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for patch in matrix.patches:
        cells = [matrix.cell(patch.id, c.label) for c in matrix.columns]
        row = [f"{_MARK[cell.state]} {_short(cell)}" for cell in cells]
        lines.append(f"| `{patch.id}` | " + " | ".join(_md(r) for r in row) + " |")
    lines += ["", "### Images", "", "| image | " + " | ".join(_md(h) for h in heads) + " |"]
    lines.append("|---" * (len(heads) + 1) + "|")
    for name in matrix.images:
        row = []
        for column in matrix.columns:
            verdict = matrix.images[name][column.label]
            row.append("✅ builds" if verdict.builds else "❌ " + "; ".join(verdict.blockers))
        lines.append(f"| `{name}` | " + " | ".join(_md(r) for r in row) + " |")
    lines += ["", f"**{_md(_newest_line(matrix))}**", ""]
    details = _noteworthy(matrix)
    if details:
        lines += ["### Details", ""]
        for patch, column, cell in details:
            lines.append(f"- `{patch.id}` @ {_md(column.label)}: {_md(cell.summary())}")
            if diagnostics := cell.diagnostics():
                fence = "`" * max(3, _longest_run(diagnostics, "`") + 1)
                lines += ["", "  <details><summary>diagnostic</summary>", "", f"  {fence}text"]
                lines += ["  " + line for line in diagnostics.splitlines()]
                lines += [f"  {fence}", "", "  </details>", ""]
    lines += ["", "Sources: " + "; ".join(f"{_md(c.label)}: {_md(c.source)}" for c in matrix.columns), ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    """Table-safe inline text: pipes escaped, newlines folded."""
    return text.replace("|", "\\|").replace("\n", " ")


def _longest_run(text: str, char: str) -> int:
    best = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        best = max(best, run)
    return best
