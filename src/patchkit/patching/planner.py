"""The planner: (series, source) -> Plan. It reads through the Source and writes nothing the plan
depends on (the only write is syntax.py's cache of files known to compile: a hit saves a compile and
changes no answer).

check, apply, revert, status, diff, verify and image builds are all this one computation with
different ends. Every anchor is asserted with its exact count against the text as the series has
left it so far, counted only where it matches as written, from the start of a line (anchors.py); per-patch
state is read from the text itself, never from a side file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import StrEnum

from packaging.version import InvalidVersion, Version

from patchkit.errors import PatchFailed
from patchkit.patching import anchors
from patchkit.patching.diagnostics import NearestMatch, nearest_match
from patchkit.patching.modified import edited_text
from patchkit.patching.patchset import Action, Edit, Patch, Probe
from patchkit.patching.probes import ProbeHit, probe_hit
from patchkit.patching.syntax import syntax_error
from patchkit.sources.base import Source


class State(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    PARTIAL = "partially-applied"
    UPSTREAMED = "upstreamed"
    BROKEN = "broken"
    OUT_OF_RANGE = "out-of-range"
    MODIFIED = "modified"  # the patch's text is there, edited: neither applied nor pending
    NOT_APPLICABLE = "not-applicable"  # the package it patches is not in the source


ERROR_STATES = (State.BROKEN, State.PARTIAL, State.MODIFIED)


class EditState(StrEnum):
    """One edit's state in the text at hand."""

    APPLIED = "applied"    # its applied form is there, count times
    PENDING = "pending"    # its anchor is there, count times, and nothing of it is applied
    HOLDS = "holds"        # an assert whose anchor is there, count times
    BROKEN = "broken"      # none of the above: the detail says what was expected and found
    MODIFIED = "modified"  # its text is there, edited by hand


class Mode(StrEnum):
    """What a plan does to the patches it finds pending (apply) or applied (revert)."""

    APPLY = "apply"
    REVERT = "revert"


class PlanFailed(PatchFailed):
    """Patches that cannot be applied or reverted on a source (exit 1): `source` the source's description,
    `mode` what was asked (apply or revert), `failed` each failing patch's id and its State; the message
    holds each one's diagnostic (the edit, the file, what was expected and found)."""

    def __init__(self, source: str, mode: Mode, failed: list[PatchResult]):
        self.source, self.mode = source, mode
        self.failed = {r.patch.id: r.state for r in failed}
        done = {Mode.APPLY: "applied", Mode.REVERT: "reverted"}[mode]
        detail = "\n".join(r.describe() for r in failed)
        super().__init__(f"{source}: {len(failed)} patch(es) cannot be {done}:\n{detail}")


@dataclass
class EditResult:
    edit: Edit
    state: EditState
    path: str | None = None  # the candidate that exists
    found: int = 0
    lines: list[int] = field(default_factory=list)
    detail: str = ""
    nearest: NearestMatch | None = None

    def describe(self) -> str:
        where = f"{self.edit.package}/{self.path}" if self.path else self.edit.package
        return f"{self.edit.label} on {where}: {self.detail}"


@dataclass
class PatchResult:
    patch: Patch
    state: State
    detail: str = ""
    edits: list[EditResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state not in ERROR_STATES

    def describe(self) -> str:
        head = f"patch {self.patch.id}: {self.state}"
        if self.detail:
            head += f" ({self.detail})"
        bad = [e for e in self.edits if e.state in (EditState.BROKEN, EditState.MODIFIED)]
        return "\n".join([head] + ["  " + e.describe().replace("\n", "\n  ") for e in bad])


@dataclass(frozen=True)
class FileChange:
    package: str
    path: str
    old: bytes
    new: bytes

    def unified_diff(self) -> str:
        name = f"{self.package}/{self.path}"
        return "".join(
            difflib.unified_diff(
                self.old.decode().splitlines(keepends=True),
                self.new.decode().splitlines(keepends=True),
                fromfile=f"a/{name}",
                tofile=f"b/{name}",
            )
        )


@dataclass
class Plan:
    mode: Mode
    source: str
    versions: dict[str, str]
    results: list[PatchResult]
    changes: list[FileChange]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def result(self, patch_id: str) -> PatchResult:
        return next(r for r in self.results if r.patch.id == patch_id)

    def diff(self) -> str:
        return "".join(c.unified_diff() for c in self.changes)

    def raise_for_errors(self) -> None:
        failed = [r for r in self.results if not r.ok]
        if failed:
            raise PlanFailed(self.source, self.mode, failed)


class _Texts:
    """The working copy of every file the series reads, decoded once, read lazily from the source."""

    def __init__(self, source: Source):
        self.source = source
        self.original: dict[tuple[str, str], bytes | None] = {}
        self.current: dict[tuple[str, str], str] = {}
        self.touched_by: dict[tuple[str, str], str] = {}
        self.inserted: set[str] = set()  # every text the series inserts or replaces with
        self.own_versions: dict[str, str] = {}  # the source's own releases (a release probe reads these)
        self.diagnose = True  # a broken edit's nearest match is searched for (the costly part of a diagnostic)

    def prefetch(self, patches: list[Patch], packages: dict[str, str]) -> None:
        """Read every file the series may touch in one go: an sdist then costs one decompression."""
        wanted: dict[str, set[str]] = {}
        for patch in patches:
            items: list[Edit | Probe] = [*patch.edits, *([patch.upstreamed] if patch.upstreamed else [])]
            for item in items:
                if item.package in packages:
                    wanted.setdefault(item.package, set()).update(item.candidates)
        for package, paths in wanted.items():
            for path, data in self.source.read_many(package, sorted(paths)).items():
                self.original[(package, path)] = data

    def exists(self, package: str, path: str) -> bool:
        key = (package, path)
        if key not in self.original:
            self.original[key] = self.source.read(package, path)
        return self.original[key] is not None

    def get(self, package: str, path: str) -> str:
        key = (package, path)
        if key not in self.current:
            raw = self.original[key]
            assert raw is not None
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _EditError(f"file is not UTF-8 ({e}); refusing to patch it") from None
            if "\r\n" in text:
                raise _EditError("file has CRLF line endings; anchors are LF and patchkit will not guess")
            self.current[key] = text
        return self.current[key]

    def set(self, package: str, path: str, text: str, patch_id: str) -> None:
        self.current[(package, path)] = text
        self.touched_by[(package, path)] = patch_id

    def changes(self) -> list[FileChange]:
        out = []
        for (package, path), text in sorted(self.current.items()):
            old = self.original[(package, path)]
            new = text.encode("utf-8")
            if old is not None and new != old:
                out.append(FileChange(package, path, old, new))
        return out


class _EditError(Exception):
    """An edit cannot be evaluated (file missing, ambiguous, undecodable); becomes a broken edit."""


def plan(
    patches: list[Patch],
    source: Source,
    *,
    mode: Mode | str = Mode.APPLY,
    versions: dict[str, str] | None = None,
    diagnose: bool = True,
) -> Plan:
    """Evaluate a series against a source; in apply mode, pending patches are applied in memory.

    In revert mode the applied patches are undone, last first. `versions` overrides the versions the
    source reports (an image base that is a dev build states which release layout it matches).
    `diagnose=False` leaves out a broken edit's nearest match (for a caller that reads only the states).
    """
    mode = Mode(mode)  # a caller's typo is a ValueError naming it, before anything is read
    found_versions = dict(source.versions())
    texts = _Texts(source)
    texts.own_versions = dict(found_versions)
    texts.diagnose = diagnose
    found_versions.update(versions or {})
    texts.inserted = {e.text for p in patches for e in p.edits if e.action != Action.ASSERT}
    texts.prefetch(patches, found_versions)
    ordered = patches if mode == Mode.APPLY else list(reversed(patches))
    results = [_evaluate(p, texts, found_versions, mode) for p in ordered]
    if mode == Mode.REVERT:
        results.reverse()
    else:
        _check_readable(texts, results)
    _check_syntax(texts, results)
    whole = all(r.ok for r in results)
    return Plan(mode, source.description, found_versions, results, texts.changes() if whole else [])


def _evaluate(patch: Patch, texts: _Texts, versions: dict[str, str], mode: Mode) -> PatchResult:
    absent = [p for p in patch.packages if p not in versions]
    if len(absent) == len(patch.packages):
        return PatchResult(patch, State.NOT_APPLICABLE, f"{', '.join(absent)} not in the source")
    for package, spec in patch.ranges.items():
        if package in absent or package not in versions:
            continue
        version = versions[package]
        try:
            inside = spec.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return PatchResult(patch, State.OUT_OF_RANGE, f"{package} version {version!r} is not a release number")
        if not inside:
            return PatchResult(patch, State.OUT_OF_RANGE, f"{package} {version} not in {spec}")

    if patch.upstreamed and patch.upstreamed.package not in absent:
        try:
            if _probe_hits(patch.upstreamed, texts) is not None:
                return PatchResult(patch, State.UPSTREAMED, "upstream carries the fix: drop this patch")
        except _EditError as e:
            return PatchResult(patch, State.BROKEN, f"upstreamed probe on {patch.upstreamed.package}: {e}")

    edits = [e for e in patch.edits if e.package not in absent and _edit_in_range(e, versions)]
    if not edits:
        return PatchResult(patch, State.NOT_APPLICABLE, "no edit of this patch is for these releases")
    if mode == Mode.REVERT:
        edits = list(reversed(edits))
    staged: dict[tuple[str, str], str] = {}  # this patch's texts, committed only if the patch is whole
    results = [_evaluate_edit(e, texts, staged, mode) for e in edits]
    if mode == Mode.REVERT:
        results.reverse()
    detail = f"{', '.join(absent)} not in the source: its edits unchecked" if absent else ""
    state = _patch_state(results)
    if state == State.PARTIAL:
        applied = [str(r.edit.index) for r in results if r.state == EditState.APPLIED]
        pending = [str(r.edit.index) for r in results if r.state == EditState.PENDING]
        detail = f"edits {', '.join(applied)} applied, {', '.join(pending)} not: fix by hand or revert; never completed silently"
    if state == State.APPLIED and all(r.state == EditState.HOLDS for r in results) and not detail:
        detail = "assert-only: every invariant holds"
    wanted = State.NOT_APPLIED if mode == Mode.APPLY else State.APPLIED
    if state == wanted:
        for (package, path), text in staged.items():
            texts.set(package, path, text, patch.id)
    return PatchResult(patch, state, detail, results)


def _edit_in_range(edit: Edit, versions: dict[str, str]) -> bool:
    try:
        return edit.in_range(versions[edit.package])
    except InvalidVersion:
        return False  # the patch-level range check has already refused an unreadable version


def _patch_state(results: list[EditResult]) -> State:
    states = {r.state for r in results if r.state != EditState.HOLDS}
    if EditState.BROKEN in states:
        return State.BROKEN
    if EditState.MODIFIED in states:
        return State.MODIFIED
    if not states:  # assert-only: every invariant holds
        return State.APPLIED
    if states == {EditState.APPLIED}:
        return State.APPLIED
    if states == {EditState.PENDING}:
        return State.NOT_APPLIED
    return State.PARTIAL


def _evaluate_edit(edit: Edit, texts: _Texts, staged: dict, mode: Mode) -> EditResult:
    path = None
    try:
        path = _resolve(edit.package, edit.candidates, texts)
        key = (edit.package, path)
        text = staged[key] if key in staged else texts.get(*key)
    except _EditError as e:
        return EditResult(edit, EditState.BROKEN, path, detail=str(e))  # describe() names the file when it was found
    n_anchor = anchors.count(text, edit.anchor)
    if edit.action == Action.ASSERT:
        if n_anchor == edit.count:
            return EditResult(edit, EditState.HOLDS, path, n_anchor, anchors.lines(text, edit.anchor))
        return _broken(edit, path, text, n_anchor, "invariant no longer holds", texts.diagnose)

    n_applied = anchors.count(text, edit.applied_form)
    inserts = edit.action != Action.REPLACE
    if n_applied == edit.count and (not inserts or n_anchor == edit.count):
        state = EditState.APPLIED
    elif (found := edited_text(edit, path, text, n_anchor, n_applied, texts.inserted)) is not None:
        line, detail = found
        return EditResult(edit, EditState.MODIFIED, path, 0, [line] if line else [], detail)
    elif n_applied == 0 and n_anchor == edit.count:
        state = EditState.PENDING
    elif 0 < n_applied < edit.count and inserts:
        return EditResult(
            edit, EditState.BROKEN, path, n_applied, anchors.lines(text, edit.applied_form),
            f"applied at {n_applied} of {edit.count} anchors: partially applied",
        )
    else:
        return _broken(edit, path, text, n_anchor, "", texts.diagnose)

    if mode == Mode.APPLY and state == EditState.PENDING:
        staged[key] = anchors.replace(text, edit.anchor, edit.applied_form)
    elif mode == Mode.REVERT and state == EditState.APPLIED:
        staged[key] = anchors.replace(text, edit.applied_form, edit.anchor)
    return EditResult(edit, state, path, n_anchor, anchors.lines(text, edit.anchor))


def _broken(edit: Edit, path: str, text: str, found: int, why: str, diagnose: bool = True) -> EditResult:
    lines = anchors.lines(text, edit.anchor)
    detail = f"{why + ': ' if why else ''}anchor expected {edit.count}x, found {found}x"
    nearest = None
    if found:
        detail += f" at line{'s' if found > 1 else ''} {', '.join(map(str, lines))}"
    inside = anchors.inside_lines(text, edit.anchor)
    if inside:  # what a substring search would have taken: never a match
        detail += (f"; the anchor text occurs inside a line (not at its start) at line{'s' if len(inside) > 1 else ''} "
                   f"{', '.join(map(str, inside))}: not counted, an anchor matches only where a line begins, "
                   "as it was written")
    if not found and diagnose:
        nearest = nearest_match(text, edit.anchor)
        if nearest:
            detail += "; " + nearest.describe()
    return EditResult(edit, EditState.BROKEN, path, found, lines, detail, nearest)


def _resolve(package: str, candidates: tuple[str, ...], texts: _Texts) -> str:
    existing = [c for c in candidates if texts.exists(package, c)]
    if len(existing) == 1:
        return existing[0]
    tried = ", ".join(f"{package}/{c}" for c in candidates)
    if not existing:
        raise _EditError(f"target file missing; tried: {tried}")
    raise _EditError(f"ambiguous target: {len(existing)} candidates exist ({', '.join(existing)}); exactly one must")


def _probe_hits(probe: Probe, texts: _Texts) -> ProbeHit | None:
    def read(candidate: str) -> str | None:
        if not texts.exists(probe.package, candidate):
            return None
        try:
            return texts.get(probe.package, candidate)
        except _EditError as e:
            raise _EditError(f"{probe.package}/{candidate}: {e}") from None

    return probe_hit(probe, read, texts.own_versions.get(probe.package))


def _check_readable(texts: _Texts, results: list[PatchResult]) -> None:
    """Each patch's applied text must survive the patches after it, or its state could not be read back.

    A later edit that rewrites an earlier edit's text makes the series irreversible from the text alone,
    so that pairing is refused (merge the two patches, or anchor the later one elsewhere).
    """
    for result in results:
        if result.state not in (State.APPLIED, State.NOT_APPLIED):
            continue
        for e in result.edits:
            if e.state not in (EditState.APPLIED, EditState.PENDING, EditState.HOLDS) or e.path is None:
                continue  # (these states name the candidate they found)
            form = e.edit.applied_form
            final = texts.get(e.edit.package, e.path)
            if anchors.count(final, form) != e.edit.count:
                later = texts.touched_by.get((e.edit.package, e.path), "a later patch")
                e.state = EditState.BROKEN
                e.detail = (
                    f"patch {later} rewrites the text of this edit (expected it {e.edit.count}x in the final "
                    f"file, found {anchors.count(final, form)}x): its state could not be read back; merge the patches "
                    "or anchor elsewhere"
                )
                result.state = State.BROKEN


def _check_syntax(texts: _Texts, results: list[PatchResult]) -> None:
    """A patched .py file that no longer compiles fails the patch that last touched it."""
    by_id = {r.patch.id: r for r in results}
    for change in texts.changes():
        if not change.path.endswith(".py"):
            continue
        error = syntax_error(change.path, change.new)
        if error is not None:
            result = by_id[texts.touched_by[(change.package, change.path)]]
            result.state = State.BROKEN
            result.detail = f"{change.package}/{change.path} no longer parses after this patch: {error}"


