"""`patchkit verify`: the patch set against upstream vLLM versions, as a matrix patch x version.

Each version (a `targets.Target`) is opened as a source once; the full series and every image's own
series are planned against it in memory by the planner (nothing is written). Index releases open in
parallel, a few at a time (one per core and one waiting), and each is dropped once planned. Only the
files the patches name are read, through the sources' caches: a warm run decompresses nothing.

The pinned release is always a column: it is the baseline the exit code is measured against.
Exit 1 (`Matrix.exit_code`) means one of:
- a patch is broken, within its range, on the pinned release or a newer version;
- a patch that applies on the pinned release is out of range on a newer version and its edits no
  longer match there. Ranges stop at the newest release a patch was written against (`<0.34`), so
  without this rule a new release would only ever show "out of range" and never raise the alarm:
  every out-of-range cell is evaluated again with the ranges ignored ("would apply" / "would break").
Older versions are reported, never counted; an upstreamed patch is reported, never an error.

Each release is checked with the FlashInfer it pins, or what `sources.companion`'s policy checks instead
when that version was never published (or only what `--with` names). A column whose pin could not be had
carries the companion's finding, and so does each cell of a patch that edits FlashInfer there; it is a
fact about the release, not a regression, so it never sets the exit code.

The cells' states are `states.CellState`; `render` shows the matrix to people and machines.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patchkit import PINNED_VLLM
from patchkit.errors import PatchkitError
from patchkit.patching.patchset import Patch, PatchSet
from patchkit.patching.planner import EditState, PatchResult, Plan, State, plan
from patchkit.patching.series import FULL_SERIES
from patchkit.sources.base import Source
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.companion import Companion, explicit, open_companion, resolve_pin
from patchkit.sources.pins import pinned_flashinfer
from patchkit.verify.states import CellState
from patchkit.verify.targets import Target, open_target


class InvalidColumn(PatchkitError):
    """Columns that do not make a matrix (exit 2): `target` the column's label (None for the set of them),
    `problem` "pinned-count" (not exactly one is the pinned vLLM), "no-vllm" (its source holds no vLLM) or
    "not-pinned" (the baseline is another release), `pinned` the pinned version, `found` what there is
    instead (the columns' labels, or the source's description)."""

    def __init__(self, target: str | None, problem: str, pinned: str, found: str):
        self.target, self.problem, self.pinned, self.found = target, problem, pinned, found
        super().__init__({"pinned-count": f"exactly one column must be the pinned vLLM {pinned}; got {found}",
                          "no-vllm": f"{target}: {found} holds no vllm package",
                          "not-pinned": f"{target} is the baseline, the pinned vLLM {pinned}, but {found}"}[problem])


@dataclass
class Column:
    target: Target
    version: str  # as the source states it
    source: str  # the source's description: where the bytes came from
    pinned: bool
    newer: bool  # newer than the pinned release (a version that does not parse counts as newer)
    companion: Companion | None = None  # the FlashInfer checked with it, and why that one

    @property
    def label(self) -> str:
        return self.target.label


@dataclass
class Cell:
    state: CellState
    result: PatchResult  # the planner's verdict within the full series
    would: PatchResult | None = None  # out of range: the verdict with every range ignored
    companion: str | None = None  # the column's companion finding, on a patch that edits the companion

    @property
    def would_state(self) -> CellState | None:
        return CellState.from_plan(self.would.state) if self.would is not None else None

    def summary(self) -> str:
        """One line: the state and, when it matters, why."""
        if self.state == CellState.OUT_OF_RANGE:
            text = f"out of range: {self.result.detail}"
            if (would := self.would_state) is not None:
                text += f"; ignoring ranges it {would.would}"
        else:
            text = f"{self.state}: {self.result.detail}" if self.result.detail else str(self.state)
        return f"{text}; {self.companion}" if self.companion else text

    def diagnostics(self) -> str:
        """The planner's account of each broken edit, nearest matches included ("" if no edit is broken)."""
        for result in (self.result, self.would):
            if result is not None and any(e.state == EditState.BROKEN for e in result.edits):
                return result.describe()
        return ""


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
            good_on_pin = self.cell(patch.id, base.label).state.good
            for column in self.columns:
                if not (column.pinned or column.newer):
                    continue
                cell = self.cell(patch.id, column.label)
                if cell.state == CellState.BROKEN:
                    if column.pinned:
                        reason = "broken on the pinned release"
                    elif good_on_pin:
                        reason = f"applies on the pinned release, broken on {column.label}"
                    else:
                        reason = f"broken on {column.label}, within its range"
                    out.append(Finding(patch.id, column.label, reason))
                elif cell.state == CellState.OUT_OF_RANGE and good_on_pin and cell.would_state == CellState.BROKEN:
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
    def companion_findings(self) -> list[tuple[str, str]]:
        """(column label, finding) for each release whose companion pin was not what got checked."""
        return [(c.label, c.companion.finding) for c in self.columns if c.companion and c.companion.finding]

    @property
    def newest_for_all(self) -> Column | None:
        """The newest version on which every image builds."""
        for column in reversed(self.columns):
            if all(self.images[name][column.label].builds for name in self.images):
                return column
        return None


def compute(
    patchset: PatchSet,
    targets: list[Target],
    *,
    image_series: dict[str, tuple[str, ...]] | None = None,
    pinned: str = PINNED_VLLM,
    cache: ArchiveCache | None = None,
    extra: list[Source] | None = None,
    progress: bool = False,
    opener: Callable[[Target], Source] | None = None,
) -> Matrix:
    """Open each target in turn, plan every distinct series against it, and build the matrix.

    `extra` are further sources (a FlashInfer release) combined with every target; `opener` replaces
    how a target becomes a source (the benchmark's extract-everything route).
    """
    image_series = image_series or {FULL_SERIES: patchset.order}
    full = patchset.series()
    columns: list[Column] = []
    cells: dict[tuple[str, str], Cell] = {}
    images: dict[str, dict[str, ImageCell]] = {name: {} for name in image_series}
    companions = _Companions(cache, progress)

    def open_one(target: Target) -> tuple[Source, Companion | None]:
        source = opener(target) if opener else open_target(target, cache=cache, progress=progress)
        if extra:
            with_, companion = list(extra), explicit(source, extra)
        else:
            with_, companion = companions.for_release(source)
        if with_:
            from patchkit.sources import combine_sources

            source = combine_sources([source, *with_])
        return source, companion

    # Index releases open in parallel (each a pass over its sdists, inflate outside the GIL); git
    # checkouts and custom openers one at a time.
    parallel = opener is None and all(t.location is None for t in targets)
    for target, (source, companion) in _opened(targets, open_one, workers=(os.cpu_count() or 1) if parallel else 1):
        column = _column(target, source, pinned, companion)
        columns.append(column)
        plans = {patchset.order: plan(full, source)}
        relaxed = None
        if any(r.state == State.OUT_OF_RANGE for r in plans[patchset.order].results):
            relaxed = plan([_without_ranges(p) for p in full], source)
        for result in plans[patchset.order].results:
            would = relaxed.result(result.patch.id) if relaxed and result.state == State.OUT_OF_RANGE else None
            note = _companion_note(result.patch, companion)
            cells[(result.patch.id, column.label)] = Cell(CellState.from_plan(result.state), result, would, note)
        for name, ids in image_series.items():
            if ids not in plans:
                plans[ids] = plan(patchset.series(ids), source)
            images[name][column.label] = _image_cell(plans[ids], cells, column.label)
        # An sdist's pass holds ~50 MB of members: dropped once planned.
        del source, plans, relaxed
    order = sorted(range(len(columns)), key=lambda i: _column_key(columns[i], i))
    columns = [columns[i] for i in order]
    if sum(c.pinned for c in columns) != 1:
        raise InvalidColumn(None, "pinned-count", pinned, str([c.label for c in columns]))
    return Matrix(pinned, columns, full, cells, dict(image_series), images)


def _opened(targets: list[Target], open_one: Callable[[Target], tuple[Source, Companion | None]], workers: int):
    """(target, source) in the targets' order, at most `workers` opening at once and one more waiting, so
    memory holds a few releases, not all of them."""
    if workers <= 1:
        for target in targets:
            yield target, open_one(target)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="patchkit-open") as pool:
        pending = collections.deque(pool.submit(open_one, t) for t in targets[:workers])
        for i, target in enumerate(targets):
            if i + workers < len(targets):
                pending.append(pool.submit(open_one, targets[i + workers]))
            yield target, pending.popleft().result()  # popped: the reference goes once consumed


class _Companions:
    """Without --with, a release is checked together with the FlashInfer release it pins, or what
    `sources.companion`'s policy checks instead; releases that pin the same one (0.31 and 0.32) share it,
    resolved and opened once even when both open at the same time."""

    def __init__(self, cache: ArchiveCache | None, progress: bool):
        self._cache, self._progress = cache, progress
        self._resolved: dict[str, tuple[Companion, Source | None]] = {}
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def for_release(self, source: Source) -> tuple[list[Source], Companion | None]:
        pin = pinned_flashinfer(source)
        if not pin:
            return [], None
        with self._lock:
            lock = self._locks.setdefault(pin, threading.Lock())
        with lock:
            if pin not in self._resolved:
                companion = resolve_pin(pin, cache=self._cache)
                self._resolved[pin] = companion, open_companion(companion, cache=self._cache, progress=self._progress)
        companion, opened = self._resolved[pin]
        return ([opened] if opened is not None else []), companion


def _companion_note(patch: Patch, companion: Companion | None) -> str | None:
    """The column's companion finding, for a patch with an edit of the companion's package."""
    if companion is None or companion.finding is None:
        return None
    return companion.finding if any(e.package == companion.package for e in patch.edits) else None


def _column(target: Target, source: Source, pinned: str, companion: Companion | None = None) -> Column:
    version = source.versions().get("vllm")
    if version is None:
        raise InvalidColumn(target.label, "no-vllm", pinned, source.description)
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None  # a commit with no version tag behind it: treated as the newest
    if target.pinned and parsed != Version(pinned):
        raise InvalidColumn(target.label, "not-pinned", pinned, source.description)
    newer = parsed is None or parsed > Version(pinned)
    return Column(target, version, source.description, target.pinned, newer, companion)


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
        state = CellState.from_plan(result.state)
        if state == CellState.BROKEN:
            blockers.append(f"{result.patch.id} broken")
        elif state == CellState.OUT_OF_RANGE:
            would = cells[(result.patch.id, label)].would_state
            hint = f", {would.would_short or would}" if would else ""
            blockers.append(f"{result.patch.id} out of range{hint}")
    return ImageCell(blockers)

