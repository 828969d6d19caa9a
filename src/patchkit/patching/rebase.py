"""`patchkit rebase`: propose the new form of every edit a new release broke, with its evidence.

How a new site is found, and why this way:
1. The file: the edit's own candidates first; when none exists on the new release, a moved-file search
   over the new release's files of the same name, ranked by how many of the old file's lines they
   share (a file moved between layouts keeps most of its lines; a namesake elsewhere does not). Two
   candidates as good as each other are a person's call.
2. The anchor, exactly: found `count` times in the new file -> only the file moved.
3. Else a three-way merge: the old file (where the edit held), the new file, and the edit itself. A
   line diff of old -> new file maps the anchor's lines to the lines that replaced them (what a merge
   tool does with a hunk's context); the mapped region is the new anchor only if it is at least
   MIN_SIMILARITY similar to the old one and occurs exactly `count` times. A replace edit's text is
   merged the same way (base: old anchor; ours: the edit's text; theirs: the new anchor); changes that
   overlap are a conflict, left to a person. The nearest-match diagnostics (diagnostics.py) alone would
   pick the most similar window anywhere in the file, which on a file with repeated shapes is another
   site; the alignment keeps the site and uses the similarity only as a bar.
Never looser: counts are kept, a region that does not occur exactly `count` times is refused, an assert
whose text changed is a person's call (an invariant's code changing is what the assert exists to flag).

The proposal is written as the hand-written patches are: a file that only moved gets its new path as one
more candidate (exactly one must exist, as before); a changed anchor is an edit-level version split (the
old edit keeps the releases below the new one, the new edit takes it and later).
"""

from __future__ import annotations

import difflib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchkit.errors import PatchkitError
from patchkit.patching import planner
from patchkit.patching.diagnostics import nearest_match, occurrence_lines
from patchkit.patching.patchset import Edit, Patch, PatchSet, load_patchset
from patchkit.patching.record import (
    LONG_TEXT_LINES,
    RecordedEdit,
    edit_block,
    split_edits,
    text_file_name,
    toml_string,
    trial_patch,
    write_patch_folder,
)
from patchkit.sources.base import Source
from patchkit.untrusted import read_file

MIN_SIMILARITY = 0.6  # below this the aligned region is not the anchor's code any more
MIN_SHARED_LINES = 0.3  # a moved file shares at least this share of the old file's distinct lines
MIN_SHARED_LINES_RENAMED = 0.5  # a file renamed as well as moved must keep half of them
CONTEXT_LINES = 2


class RebaseRefused(PatchkitError):
    """A rebase that cannot be read or written as proposed; nothing is written (exit 2). `patch` the
    patch id (None where the failure is not one patch's), `problem` "encoding" (a release file not UTF-8),
    "range-line" (no one version line to widen), "files-key" (no one-line file/files key to extend),
    "does-not-apply" (the rebased series on the new release) or "read-back" (the rendered patch.toml is
    not the proposal: a bug), `detail` what was expected and found."""

    def __init__(self, patch: str | None, problem: str, detail: str):
        self.patch, self.problem, self.detail = patch, problem, detail
        super().__init__(f"patch {patch}: {detail}" if patch else detail)


@dataclass
class Evidence:
    old_path: str
    new_path: str
    similarity: float  # old anchor vs new anchor (1.0: unchanged)
    old_context: str
    new_context: str
    new_lines: list[int]
    why: str
    file_similarity: float | None = None  # shared-line share, when the file moved

    def to_dict(self) -> dict:
        return {"old_path": self.old_path, "new_path": self.new_path, "similarity": round(self.similarity, 3),
                "file_similarity": None if self.file_similarity is None else round(self.file_similarity, 3),
                "new_lines": self.new_lines, "why": self.why, "old_context": self.old_context,
                "new_context": self.new_context}


@dataclass
class Proposal:
    edit: Edit
    kind: str  # moved | re-anchored
    new: RecordedEdit
    old_versions: str | None  # the old edit's range after the split (None: unchanged)
    evidence: Evidence


@dataclass
class NeedsPerson:
    edit: Edit
    reason: str
    candidates: list[str] = field(default_factory=list)  # closest sites, described

    def to_dict(self) -> dict:
        return {"edit": self.edit.index, "action": self.edit.action, "reason": self.reason,
                "candidates": self.candidates}


@dataclass
class PatchRebase:
    patch: Patch
    state: str  # unchanged | rebased | needs-person | upstreamed
    proposals: list[Proposal] = field(default_factory=list)
    people: list[NeedsPerson] = field(default_factory=list)
    new_range: tuple[str, str, str] | None = None  # (package, old spec, new spec) when the patch's range grows
    detail: str = ""

    def to_dict(self) -> dict:
        return {
            "patch": self.patch.id, "state": self.state, "detail": self.detail,
            "range": None if self.new_range is None else
            {"package": self.new_range[0], "from": self.new_range[1], "to": self.new_range[2]},
            "proposals": [{"edit": p.edit.index, "action": p.edit.action, "kind": p.kind,
                           "file": list(p.new.candidates), "versions": p.new.versions,
                           "old_versions": p.old_versions, "anchor": p.new.anchor,
                           "evidence": p.evidence.to_dict()} for p in self.proposals],
            "needs_person": [n.to_dict() for n in self.people],
        }


@dataclass
class Rebase:
    old: str
    new: str
    versions: dict[str, str]
    results: list[PatchRebase]

    @property
    def ok(self) -> bool:
        return all(r.state != "needs-person" for r in self.results)


# --------------------------------------------------------------------------------------------- finding

def _affinity(path: str, known_dirs: set[str]) -> int:
    """How many of the path's directories the patch set already targets elsewhere."""
    parts = PurePosixPath(path).parent.parts
    return sum(1 for i in range(1, len(parts) + 1) if "/".join(parts[:i]) in known_dirs)


def _shared_lines(a: str, b: str) -> float:
    sa = {line.strip() for line in a.splitlines() if line.strip()}
    sb = {line.strip() for line in b.splitlines() if line.strip()}
    return len(sa & sb) / max(1, len(sa))


def _in(spec: SpecifierSet | None, version: str) -> bool:
    return spec is None or spec.contains(Version(version), prereleases=True)


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RebaseRefused(None, "encoding", f"{where} is not UTF-8 ({e})") from None


class _Reader:
    """The two releases' files, read once each."""

    def __init__(self, old: Source, new: Source):
        self.old, self.new = old, new
        self._cache: dict[tuple[int, str, str], str | None] = {}
        self._listing: dict[str, list[str] | None] = {}
        self.known_dirs: set[str] = set()  # every directory (and parent) the patch set's candidates name

    def prefetch(self, which: Source, package: str, paths: list[str]) -> None:
        for path, data in which.read_many(package, paths).items():
            self._cache[(id(which), package, path)] = None if data is None else _decode(data, f"{package}/{path}")

    def text(self, which: Source, package: str, path: str) -> str | None:
        key = (id(which), package, path)
        if key not in self._cache:
            self.prefetch(which, package, [path])
        return self._cache[key]

    def listing(self, package: str) -> list[str] | None:
        if package not in self._listing:
            self._listing[package] = self.new.package_files(package)
        return self._listing[package]


def _one(reader: _Reader, which: Source, package: str, candidates: tuple[str, ...]) -> tuple[str | None, list[str]]:
    existing = [c for c in candidates if reader.text(which, package, c) is not None]
    return (existing[0] if len(existing) == 1 else None), existing


def _moved(reader: _Reader, edit: Edit, old_text: str) -> tuple[list[tuple[float, str]], str]:
    """New-release files of the old file's name, best first, by the share of the old file's lines they keep."""
    names = {PurePosixPath(c).name for c in edit.candidates}
    listing = reader.listing(edit.package)
    if listing is None:
        return [], "the new source cannot list its files (no moved-file search)"
    paths = sorted(p for p in listing if PurePosixPath(p).name in names)
    bar, searched = MIN_SHARED_LINES, f"{len(paths)} file(s) named {', '.join(sorted(names))}"
    if not paths:  # renamed as well as moved: every file of the same kind, held to a higher bar
        suffixes = {PurePosixPath(c).suffix for c in edit.candidates}
        paths = sorted(p for p in listing if PurePosixPath(p).suffix in suffixes)
        bar, searched = MIN_SHARED_LINES_RENAMED, f"no file of its name; {len(paths)} file(s) of its kind"
    reader.prefetch(reader.new, edit.package, paths)
    ranked = sorted(((_shared_lines(old_text, reader.text(reader.new, edit.package, p) or ""), p) for p in paths),
                    reverse=True)
    return [r for r in ranked if r[0] >= bar], searched


def _context(text: str, start: int, end: int) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[max(0, start - CONTEXT_LINES): end + CONTEXT_LINES])


def _line_span(text: str, pos: int, length: int) -> tuple[int, int, str, str]:
    """The whole lines [first, last) holding text[pos:pos+length], and the partial-line prefix/suffix."""
    line_start = text.rfind("\n", 0, pos) + 1
    end = pos + length
    if (end > 0 and text[end - 1] == "\n") or end == len(text):
        line_end = end
    else:
        nl = text.find("\n", end)
        line_end = len(text) if nl == -1 else nl + 1
    first = text.count("\n", 0, line_start)
    last = text.count("\n", 0, line_end) + (0 if line_end and text[line_end - 1] == "\n" else 1)
    return first, last, text[line_start:pos], text[end:line_end]


def _map(opcodes, a0: int, a1: int) -> tuple[int, int, int, int]:
    """Old lines [a0, a1) -> new lines [b0, b1), and how many unchanged lines bound them (before, after)."""
    b0 = b1 = None
    before = after = 0
    for tag, i1, i2, j1, j2 in opcodes:
        if (b0 is None and i1 <= a0 < i2) or (b0 is None and a0 == i2 == i1):
            b0 = j1 + (a0 - i1) if tag == "equal" else j1
        if b1 is None and i1 < a1 <= i2:
            b1 = j1 + (a1 - i1) if tag == "equal" else j2
        if tag == "equal" and i2 <= a0:
            before = min(a0 - i1, i2 - i1) if i2 == a0 else 0
        if tag == "equal" and i1 >= a1 and after == 0:
            after = i2 - i1 if i1 == a1 else 0
    if b0 is None:
        b0 = opcodes[-1][4] if opcodes else 0
    if b1 is None:
        b1 = b0
    return b0, max(b0, b1), before, after


def merge3(base: str, ours: str, theirs: str) -> str | None:
    """Both sides' changes to base applied, or None when they overlap (a person's call)."""
    b, o, t = (s.splitlines(keepends=True) for s in (base, ours, theirs))
    changes: list[tuple[int, int, tuple[str, ...], str]] = []  # (base lines i1:i2, their replacement, side)
    for side, other in ((o, "ours"), (t, "theirs")):
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, b, side, autojunk=False).get_opcodes():
            if tag != "equal":
                changes.append((i1, i2, tuple(side[j1:j2]), other))
    changes.sort()
    merged: list[tuple[int, int, tuple[str, ...], str]] = []
    for c in changes:
        # overlapping changes conflict; so do adjacent ones where either is an insertion (order unknown)
        if merged and (c[0] < merged[-1][1] or (c[0] == merged[-1][1] and (c[0] == c[1] or merged[-1][0] == merged[-1][1]))):
            prev = merged[-1]
            if (prev[0], prev[1], prev[2]) == (c[0], c[1], c[2]):
                continue  # the same change on both sides
            return None
        merged.append(c)
    out = list(b)
    for i1, i2, lines, _ in reversed(merged):
        out[i1:i2] = list(lines)
    return "".join(out)


def rebase_edit(edit: Edit, reader: _Reader, version: str, *, split: str | None) -> Proposal | NeedsPerson:
    """One edit's new form on the new release (`split`: the old edit's range once split, when it is)."""
    old_path, old_found = _one(reader, reader.old, edit.package, edit.candidates)
    if old_path is None:
        what = "none" if not old_found else f"{len(old_found)} ({', '.join(old_found)})"
        return NeedsPerson(edit, f"its file on the old release: {what} of {', '.join(edit.candidates)} exists")
    old_text = reader.text(reader.old, edit.package, old_path) or ""
    if old_text.count(edit.anchor) != edit.count:
        return NeedsPerson(edit, f"the anchor is found {old_text.count(edit.anchor)}x on the old release, expected "
                                 f"{edit.count}x: nothing to rebase from")
    new_path, new_found = _one(reader, reader.new, edit.package, edit.candidates)
    file_similarity, moved, tie = None, False, ""
    if new_path is None and new_found:
        return NeedsPerson(edit, f"ambiguous: {', '.join(new_found)} all exist on the new release")
    if new_path is None:
        ranked, searched = _moved(reader, edit, old_text)
        exact = [(s, p) for s, p in ranked if (reader.text(reader.new, edit.package, p) or "").count(edit.anchor) == edit.count]
        pool = exact or ranked
        if not pool:
            return NeedsPerson(edit, f"{old_path} is gone on the new release and no file of its name keeps "
                                     f"enough of its lines ({searched})",
                               [f"{p} ({s:.0%} of the lines)" for s, p in ranked[:3]])
        tie = ""
        if len(pool) > 1 and pool[0][0] - pool[1][0] < 0.1:
            # As close by content (a vendor's copy beside another's): the patch set's own directories decide.
            close = [c for c in pool if pool[0][0] - c[0] < 0.1]
            scored = sorted(((_affinity(p, reader.known_dirs), s, p) for s, p in close), reverse=True)
            if scored[0][0] > scored[1][0]:
                pool = [(scored[0][1], scored[0][2])]
                tie = (f"; {', '.join(p for _, _, p in scored[1:])} as close by content, "
                       f"{scored[0][2]} chosen: its directories are the patch set's other targets'")
        if len(pool) > 1 and pool[0][0] - pool[1][0] < 0.1:
            return NeedsPerson(edit, f"{old_path} is gone; two files of its name are as close: a person's call",
                               [f"{p} ({s:.0%} of the lines)" for s, p in pool[:3]])
        file_similarity, new_path = pool[0]
        moved = True
    new_text = reader.text(reader.new, edit.package, new_path) or ""
    moved_why = f"{old_path} moved to {new_path} ({file_similarity:.0%} of its lines kept{tie}); " if moved else ""

    found = new_text.count(edit.anchor)
    if found == edit.count:
        lines = occurrence_lines(new_text, edit.anchor)
        first = lines[0] - 1
        ev = Evidence(old_path, new_path, 1.0, edit.anchor, _context(new_text, first, first + edit.anchor.count("\n")),
                      lines, moved_why + f"the anchor is there unchanged, {found}x", file_similarity)
        if moved:  # the file moved, the anchor did not: one more candidate, as the hand-written patches do
            new = RecordedEdit(edit.package, (*edit.candidates, new_path), edit.action, edit.anchor, edit.text,
                               edit.count)
            return Proposal(edit, "moved", new, None, ev)
        new = RecordedEdit(edit.package, (new_path,), edit.action, edit.anchor, edit.text, edit.count)
        return Proposal(edit, "moved" if moved else "re-anchored", new, split, ev)

    # The three-way step: align the old file to the new one and read off what replaced the anchor's lines.
    old_lines, new_lines = old_text.splitlines(keepends=True), new_text.splitlines(keepends=True)
    opcodes = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
    regions: list[str | None] = []  # what replaced each occurrence (None: not one whole region)
    spans: list[tuple[int, int, int, int]] = []
    start = 0
    while (pos := old_text.find(edit.anchor, start)) != -1:
        first, last, prefix, suffix = _line_span(old_text, pos, len(edit.anchor))
        b0, b1, before, after = _map(opcodes, first, last)
        region = "".join(new_lines[b0:b1])
        if not (region.startswith(prefix) and region.endswith(suffix)) or len(region) <= len(prefix) + len(suffix):
            regions.append(None)
        else:
            regions.append(region[len(prefix): len(region) - len(suffix)])
        spans.append((b0, b1, before, after))
        start = pos + len(edit.anchor)
    near = nearest_match(new_text, edit.anchor)
    closest = [f"{new_path} line {near.line} ({near.similarity:.0%} similar):\n{near.region}"] if near else []
    if found > edit.count:
        return NeedsPerson(edit, f"the anchor is found {found}x on the new release, expected {edit.count}x: "
                                 "a count is never loosened", closest)
    anchor = regions[0] if len(set(regions)) == 1 else None
    if anchor is None:
        return NeedsPerson(edit, "the lines that replaced the anchor do not form one anchor "
                                 "(deleted, split, or different at each occurrence)", closest)
    similarity = difflib.SequenceMatcher(None, edit.anchor, anchor, autojunk=False).ratio()
    b0, b1, before, after = spans[0]
    why = (moved_why + f"old lines {occurrence_lines(old_text, edit.anchor)} align with new lines {b0 + 1}-{b1} "
           f"(line diff of the two files; {before} unchanged line(s) before, {after} after)")
    ev = Evidence(old_path, new_path, similarity, _context(old_text, *_line_span(old_text, old_text.find(edit.anchor),
                  len(edit.anchor))[:2]), _context(new_text, b0, b1), [b0 + 1], why, file_similarity)
    if similarity < MIN_SIMILARITY:
        return NeedsPerson(edit, f"the aligned region is {similarity:.0%} similar to the anchor "
                                 f"(< {MIN_SIMILARITY:.0%}): not the same code", [f"{new_path} line {b0 + 1} "
                                 f"(aligned, {similarity:.0%} similar):\n{anchor}", *closest])
    if new_text.count(anchor) != edit.count:
        return NeedsPerson(edit, f"the new anchor occurs {new_text.count(anchor)}x on the new release, expected "
                                 f"{edit.count}x", [f"{new_path} line {b0 + 1}:\n{anchor}"])
    if edit.action == "assert":
        return NeedsPerson(edit, f"an assert's code changed ({similarity:.0%} similar): whether the invariant still "
                                 "holds is a person's call", [f"{new_path} line {b0 + 1}:\n{anchor}"])
    text = edit.text
    if edit.action == "replace":
        merged = merge3(edit.anchor, edit.text, anchor)
        if merged is None:
            return NeedsPerson(edit, "the replacement text and upstream's change touch the same lines (merge "
                                     "conflict)", [f"{new_path} line {b0 + 1}:\n{anchor}"])
        text = merged
        if text == anchor or not text:
            return NeedsPerson(edit, "merged, the replacement changes nothing: upstream may carry it",
                               [f"{new_path} line {b0 + 1}:\n{anchor}"])
        ev.why += "; replacement merged three-way (base: old anchor, ours: the edit's text, theirs: the new anchor)"
    elif anchor in text:
        return NeedsPerson(edit, "the inserted text contains the new anchor", [f"{new_path} line {b0 + 1}:\n{anchor}"])
    applied = {"insert_after": anchor + text, "insert_before": text + anchor}.get(edit.action, text)
    if new_text.count(applied):
        return NeedsPerson(edit, "the new release already has the edit's applied form: upstreamed?",
                           [f"{new_path} line {b0 + 1}"])
    new = RecordedEdit(edit.package, (new_path,), edit.action, anchor, text, edit.count)
    return Proposal(edit, "re-anchored", new, split, ev)


def _split_versions(edit: Edit, version: str) -> tuple[str, str]:
    """(old edit's range, new edit's range): below the new release, and from it on."""
    v = Version(version)
    cut = f"{v.major}.{v.minor}" if v.micro == 0 and not v.pre and not v.post else str(v)
    old = f"{edit.versions},<{cut}" if edit.versions is not None else f"<{cut}"
    return old, f">={cut}"


def _successor_range(edit: Edit, version: str) -> str:
    """The range for the successor of an edit whose own range ended before the new release."""
    specs = list(edit.versions or [])
    if len(specs) == 1 and specs[0].operator == "<":
        return f">={specs[0].version}"
    if len(specs) == 1 and specs[0].operator == "<=":
        return f">{specs[0].version}"
    return f">={version}"


def _grown_range(spec: SpecifierSet, version: str) -> str | None:
    """The patch's range taking the new release in: its upper bound raised to the next minor; None if
    something else excludes it."""
    v = Version(version)
    out = []
    for s in spec:
        if s.contains(v, prereleases=True):
            out.append(str(s))
        elif s.operator in ("<", "<="):
            out.append(f"<{v.major}.{v.minor + 1}")
        else:
            return None
    return ",".join(sorted(out, key=lambda s: (not s.startswith(">"), s)))


def rebase(patches: list[Patch], old: Source, new: Source, *, honour_probe: bool = True) -> Rebase:
    """Every patch's broken, out-of-range or orphaned edits re-derived for the new source's release."""
    versions = new.versions()
    old_versions = old.versions()
    reader = _Reader(old, new)
    for p in patches:
        for e in p.edits:
            for c in e.candidates:
                parts = PurePosixPath(c).parent.parts
                reader.known_dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for source, found in ((old, old_versions), (new, versions)):
        for package in found:
            paths = sorted({c for p in patches for e in p.edits if e.package == package for c in e.candidates})
            reader.prefetch(source, package, paths)
    results = []
    for patch in patches:
        results.append(_rebase_patch(patch, reader, versions, old_versions, honour_probe))
    return Rebase(old.description, new.description, versions, results)


def _rebase_patch(patch: Patch, reader: _Reader, versions: dict, old_versions: dict, honour_probe: bool) -> PatchRebase:
    packages = [p for p in patch.packages if p in versions and p in old_versions]
    if not packages:
        return PatchRebase(patch, "unchanged", detail="none of its packages is in both sources")
    grown = None
    for package in packages:
        spec = patch.ranges[package]
        if not spec.contains(Version(versions[package]), prereleases=True):
            wider = _grown_range(spec, versions[package])
            if wider is None:
                return PatchRebase(patch, "needs-person", detail=f"its {package} range {spec} excludes "
                                   f"{versions[package]} by more than an upper bound")
            grown = (package, str(spec), wider)
    if honour_probe and patch.upstreamed and patch.upstreamed.package in versions:
        probe = patch.upstreamed
        for c in probe.candidates:
            text = reader.text(reader.new, probe.package, c)
            if text is not None and probe.contains in text:
                return PatchRebase(patch, "upstreamed", detail=f"its [upstreamed] probe fires: {probe.package}/{c} "
                                   f"contains {probe.contains.strip()!r}; propose dropping it, nothing rebased")
    result = PatchRebase(patch, "unchanged", new_range=grown)
    solo = planner.plan([patch], reader.new)  # which in-range edits hold as written
    states = {e.edit.index: e for e in solo.results[0].edits} if solo.results[0].edits else {}
    for edit in patch.edits:
        if edit.package not in packages:
            continue
        version = versions[edit.package]
        if _in(edit.versions, version):
            state = states.get(edit.index)
            if state is not None and state.state in (planner.EditState.PENDING, planner.EditState.HOLDS, planner.EditState.APPLIED):
                continue
            old_range, new_range = _split_versions(edit, version)
            outcome = rebase_edit(edit, reader, version, split=old_range)
            if isinstance(outcome, Proposal) and outcome.new.versions is None and outcome.old_versions is not None:
                outcome.new = RecordedEdit(**{**outcome.new.__dict__, "versions": new_range})
        else:
            successors = [e for e in patch.edits if e.package == edit.package and e.versions is not None
                          and _in(e.versions, version)]
            if successors or not _in(edit.versions, old_versions[edit.package]):
                continue  # covered by an edit for the new releases, or not an edit of the old release
            outcome = rebase_edit(edit, reader, version, split=None)
            if isinstance(outcome, Proposal):
                outcome.kind = "successor"
                outcome.old_versions = None
                outcome.new = RecordedEdit(**{**outcome.new.__dict__, "candidates": (outcome.evidence.new_path,),
                                              "versions": _successor_range(edit, version)})
        if isinstance(outcome, Proposal):
            result.proposals.append(outcome)
        else:
            result.people.append(outcome)
    result.state = "needs-person" if result.people else "rebased" if result.proposals or grown else "unchanged"
    return result


# ---------------------------------------------------------------------------------------------- writing

def render(result: PatchRebase) -> tuple[str, dict[str, str]]:
    """The rebased patch.toml and the text files beside it (only what changed is new)."""
    patch = result.patch
    toml_path = patch.folder / "patch.toml"
    head, chunks = split_edits(read_file(toml_path, "definition").decode("utf-8"), str(toml_path), len(patch.edits))
    files: dict[str, str] = {}
    taken: set[str] = set()
    if result.new_range:
        package, old_spec, new_spec = result.new_range
        lines = head.splitlines(keepends=True)
        at = [i for i, line in enumerate(lines)
              if line.startswith(f"{package} =") and _spec_line(line) == SpecifierSet(old_spec)]
        if len(at) != 1:
            raise RebaseRefused(patch.id, "range-line", f"{toml_path}: cannot find the one line "
                                f"'{package} = \"{old_spec}\"' to widen to the new release")
        lines[at[0]] = f"{package} = {toml_string(new_spec)}\n"
        head = "".join(lines)
    by_index = {p.edit.index: p for p in result.proposals}
    out = []
    for edit, chunk in zip(patch.edits, chunks, strict=True):
        proposal = by_index.get(edit.index)
        if proposal is None:
            out.append(chunk)
            continue
        body, tail = _trailing_blank(chunk)
        new = proposal.new
        if proposal.kind == "moved" and proposal.old_versions is None:
            out.append(_set_files(body, new.candidates) + tail)  # the old edit, one candidate more
            continue
        if proposal.old_versions is not None:
            body = _set_versions(body, proposal.old_versions)
        if new.action != "assert" and new.text == edit.text and _text_file_of(body):
            new = RecordedEdit(**{**new.__dict__, "text_file": _text_file_of(body)})  # the same text, one file
        elif new.action != "assert" and new.text.count("\n") > LONG_TEXT_LINES:
            name = text_file_name(patch, new.candidates[0], taken)
            files[name] = new.text
            new = RecordedEdit(**{**new.__dict__, "text_file": name})
        ev = proposal.evidence
        comment = (f"rebased by patchkit onto {new.package} {new.versions}: {ev.why} "
                   f"(anchor {ev.similarity:.0%} similar)")
        out.append(body + "\n" + edit_block(new, comment=_wrap(comment)) + tail)
    return head + "".join(out), files


def _spec_line(line: str) -> SpecifierSet | None:
    import tomllib

    try:
        value = next(iter(tomllib.loads(line).values()))
        return SpecifierSet(value) if isinstance(value, str) else None
    except (tomllib.TOMLDecodeError, ValueError):
        return None


def _wrap(text: str, width: int = 100) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _trailing_blank(chunk: str) -> tuple[str, str]:
    body = chunk.rstrip("\n")
    return body + "\n", chunk[len(body) + 1:]


def _key_line(body: str, key: str) -> int | None:
    lines = body.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{key} =") or line.startswith(f"{key}="):
            return i
    return None


def _set_versions(body: str, versions: str) -> str:
    lines = body.splitlines(keepends=True)
    i = _key_line(body, "versions")
    if i is not None:
        lines[i] = f"versions = {toml_string(versions)}\n"
    else:
        h = next(n for n, line in enumerate(lines) if line.rstrip("\n") == "[[edit]]")
        lines.insert(h + 1, f"versions = {toml_string(versions)}\n")
    return "".join(lines)


def _set_files(body: str, candidates: tuple[str, ...]) -> str:
    lines = body.splitlines(keepends=True)
    i = _key_line(body, "file")
    if i is None:
        i = _key_line(body, "files")
    if i is None or lines[i].rstrip().endswith("[") :
        raise RebaseRefused(None, "files-key", "cannot find a one-line file/files key to extend")
    lines[i] = "files = [" + ", ".join(toml_string(c) for c in candidates) + "]\n"
    return "".join(lines)


def _text_file_of(body: str) -> str | None:
    i = _key_line(body, "text_file")
    if i is None:
        return None
    import tomllib

    return tomllib.loads(body.splitlines()[i])["text_file"]


def check_rebased(patch_set: PatchSet, new: Source, ids: list[str] | None = None) -> planner.Plan:
    """The rebased series (or the patches asked for, in series order) planned on the new release."""
    return planner.plan(patch_set.series([i for i in patch_set.order if ids is None or i in ids]), new)


def write(rebase_result: Rebase, patches_dir: Path, new: Source) -> PatchSet:
    """Each rebased patch.toml checked (loads, and the whole rebased series applies on the new release) in
    a scratch copy, then written atomically; nothing is written when any check fails."""
    import shutil
    import tempfile

    rendered = {r.patch.id: render(r) for r in rebase_result.results if r.state == "rebased"}
    with tempfile.TemporaryDirectory(prefix="patchkit-rebase-") as tmp:
        trial = Path(tmp) / "patches"
        shutil.copytree(patches_dir, trial)
        for patch_id, (toml_text, files) in rendered.items():
            with trial_patch(patches_dir / patch_id, toml_text, files) as loaded:
                _same_intent(rebase_result, patch_id, loaded)
            for name, text in files.items():
                (trial / patch_id / name).write_text(text, encoding="utf-8")
            (trial / patch_id / "patch.toml").write_text(toml_text, encoding="utf-8")
        plan = check_rebased(load_patchset(trial), new, [r.patch.id for r in rebase_result.results])
        if not plan.ok:
            failed = "\n".join(r.describe() for r in plan.results if not r.ok)
            raise RebaseRefused(None, "does-not-apply", f"the rebased series does not apply on {plan.source}; "
                                f"nothing written:\n{failed}")
    for patch_id, (toml_text, files) in rendered.items():
        write_patch_folder(patches_dir / patch_id, toml_text, files)
    return load_patchset(patches_dir)


def rebased_copy(rebase_result: Rebase, patches_dir: Path, dest: Path) -> Path:
    """The rebased patch set in `dest` (a copy of patches_dir with the proposals written), for checks and tests."""
    import shutil

    shutil.copytree(patches_dir, dest)
    for r in rebase_result.results:
        if r.state != "rebased":
            continue
        toml_text, files = render(r)
        for name, text in files.items():
            (dest / r.patch.id / name).write_text(text, encoding="utf-8")
        (dest / r.patch.id / "patch.toml").write_text(toml_text, encoding="utf-8")
        _same_intent(rebase_result, r.patch.id, load_patchset(dest).patch(r.patch.id))
    return dest


def _same_intent(rebase_result: Rebase, patch_id: str, loaded: Patch) -> None:
    """The written patch reads back as the proposals say: every proposed edit present, counts unchanged."""
    result = next(r for r in rebase_result.results if r.patch.id == patch_id)
    for p in result.proposals:
        hits = [e for e in loaded.edits if e.anchor == p.new.anchor and e.text == p.new.text and e.count == p.new.count
                and set(p.new.candidates) <= set(e.candidates) and e.action == p.new.action]
        if not hits:
            raise RebaseRefused(patch_id, "read-back", f"the rendered patch.toml does not read back as the proposal "
                                f"for edit {p.edit.index}; nothing written (a patchkit bug: please report it)")


# ---------------------------------------------------------------------------------------------- behaviour tests

def test_environment(cache: Path, version: str) -> Path | None:
    """The interpreter of the release's nox test environment (`nox -s release-X` builds it), if built."""
    for name in ("tests", f"release-{version.replace('.', '-')}"):
        python = cache / "nox" / name / "bin" / "python"
        if python.exists() and list((cache / "nox" / name).glob(f"lib/python*/site-packages/vllm-{version}.dist-info")):
            return python
    return None


@dataclass
class TestRun:
    patch_id: str
    test: str
    returncode: int
    tail: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def run_behaviour_tests(patch_ids: list[str], patches_dir: Path, python: Path, tests_dir: Path,
                        timeout: float = 1800) -> list[TestRun]:
    """Each patch's tests/patches/test_<id>.py in the release's environment, on the rebased patch set
    (PATCHKIT_TEST_PATCHES points the tests' patched copy at it)."""
    runs = []
    for patch_id in patch_ids:
        test = tests_dir / "patches" / f"test_{patch_id.replace('-', '_')}.py"
        if not test.exists():
            runs.append(TestRun(patch_id, str(test), 2, "no behaviour test file"))
            continue
        env = {**os.environ, "PATCHKIT_TEST_PATCHES": str(patches_dir), "PATCHKIT_REQUIRE_VLLM": "1"}
        env.pop("PATCHKIT_RESULTS", None)
        try:
            proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(test)],
                                  capture_output=True, text=True, env=env, timeout=timeout, cwd=tests_dir.parent)
            runs.append(TestRun(patch_id, str(test), proc.returncode, (proc.stdout + proc.stderr)[-2000:]))
        except subprocess.TimeoutExpired:
            runs.append(TestRun(patch_id, str(test), 124, f"timed out after {timeout} s"))
    return runs


# ---------------------------------------------------------------------------------------------- measuring

def without_later_edits(patches_dir: Path, dest: Path, old: Source) -> PatchSet:
    """The patch set as it stood before the later releases' edits were written: every edit whose range
    excludes the old release dropped, every candidate path the old release lacks dropped (the benchmark's
    starting point: rebase must derive the rest from the old release and the new one)."""
    import shutil

    patchset = load_patchset(patches_dir)
    shutil.copytree(patches_dir, dest)
    versions = old.versions()
    for patch in patchset.series():
        toml_path = patch.folder / "patch.toml"
        head, chunks = split_edits(read_file(toml_path, "definition").decode("utf-8"), str(toml_path), len(patch.edits))
        out = []
        for edit, chunk in zip(patch.edits, chunks, strict=True):
            if edit.package in versions and not _in(edit.versions, versions[edit.package]):
                continue
            if edit.package in versions and len(edit.candidates) > 1:
                exist = [c for c in edit.candidates if old.read(edit.package, c) is not None]
                if len(exist) == 1:
                    body, tail = _trailing_blank(chunk)
                    chunk = _set_files(body, tuple(exist)) + tail
            out.append(chunk)
        (dest / patch.id / "patch.toml").write_text(head + "".join(out), encoding="utf-8")
    return load_patchset(dest)


def measure(patches_dir: Path, old: Source, new: Source, work: Path) -> dict:
    """Per patch: the hand-written later-release edits, how many rebase recovered from the earlier ones
    (identical, or different text with the same effect on the new release), and which need a person."""
    hand = load_patchset(patches_dir)
    stripped = without_later_edits(patches_dir, work / "stripped", old)
    result = rebase(stripped.series(), old, new, honour_probe=False)
    rebased = load_patchset(rebased_copy(result, work / "stripped", work / "rebased"))
    versions, old_versions = new.versions(), old.versions()
    out = {}
    for r in result.results:
        patch_id = r.patch.id
        hand_patch, strip_patch, new_patch = hand.patch(patch_id), stripped.patch(patch_id), rebased.patch(patch_id)
        later = _later_edits(hand_patch, strip_patch, versions, old_versions, new)
        if not later:
            continue
        forms = {_form(e, new) for e in new_patch.edits if e.package in versions and _in(e.versions, versions[e.package])}
        identical = [e.index for e in later if _form(e, new) in forms]
        same_effect = _effect(hand_patch, new) == _effect(new_patch, new)
        out[patch_id] = {
            "later_edits": len(later), "identical": len(identical),
            # different text counts only where the whole patch does the same on the new release
            "recovered": len(later) if same_effect and r.state != "needs-person" else len(identical),
            "same_effect_on_new_release": same_effect,
            "needs_person": [n.to_dict() for n in r.people],
            "proposals": len(r.proposals), "state": r.state,
        }
    return {"from": result.old, "to": result.new, "patches": out, "rebased_dir": str(work / "rebased"),
            "rebased": [r.patch.id for r in result.results if r.state == "rebased"]}


def _later_edits(hand: Patch, stripped: Patch, versions: dict, old_versions: dict, new: Source) -> list[Edit]:
    """The hand-written edits for the new release that the stripped patch lacks: dropped, or resolving
    on the new release to a path the stripped edit does not name."""
    kept = {(e.action, e.anchor, e.text, e.count): e for e in stripped.edits}
    out = []
    for e in hand.edits:
        if e.package not in versions or e.package not in old_versions or not _in(e.versions, versions[e.package]):
            continue
        twin = kept.get((e.action, e.anchor, e.text, e.count))
        path = next((c for c in e.candidates if new.read(e.package, c) is not None), None)
        if twin is None or (path is not None and path not in twin.candidates):
            out.append(e)
    return out


def _form(edit: Edit, new: Source) -> tuple:
    path = next((c for c in edit.candidates if new.read(edit.package, c) is not None), None)
    return edit.package, path, edit.action, edit.anchor, edit.text, edit.count


def _effect(patch: Patch, new: Source) -> tuple:
    """What the patch does on the new release, its [upstreamed] probe aside (the measure is of the edits)."""
    import dataclasses

    plan = planner.plan([dataclasses.replace(patch, upstreamed=None)], new)
    return str(plan.results[0].state), tuple((c.package, c.path, c.new) for c in plan.changes)
