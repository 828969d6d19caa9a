"""Where an edit goes on the new release: its file (the edit's candidates, else a moved-file search), then
its anchor (exactly, else a three-way line merge of the edit's context). The why of each step is the
package's docstring (rebase/__init__.py); this module answers one edit at a time, with its evidence.
"""

from __future__ import annotations

import difflib
from pathlib import PurePosixPath

from patchkit.patching import anchors
from patchkit.patching.diagnostics import nearest_match
from patchkit.patching.patchset import Edit
from patchkit.patching.rebase.model import Evidence, NeedsPerson, Proposal, ProposalKind, RebaseRefused
from patchkit.patching.record import RecordedEdit
from patchkit.sources.base import Source

MIN_SIMILARITY = 0.6  # below this the aligned region is not the anchor's code any more
MIN_SHARED_LINES = 0.3  # a moved file shares at least this share of the old file's distinct lines
MIN_SHARED_LINES_RENAMED = 0.5  # a file renamed as well as moved must keep half of them
CONTEXT_LINES = 2


def _affinity(path: str, known_dirs: set[str]) -> int:
    """How many of the path's directories the patch set already targets elsewhere."""
    parts = PurePosixPath(path).parent.parts
    return sum(1 for i in range(1, len(parts) + 1) if "/".join(parts[:i]) in known_dirs)


def _shared_lines(a: str, b: str) -> float:
    sa = {line.strip() for line in a.splitlines() if line.strip()}
    sb = {line.strip() for line in b.splitlines() if line.strip()}
    return len(sa & sb) / max(1, len(sa))


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RebaseRefused(None, "encoding", f"{where} is not UTF-8 ({e})") from None


class Reader:
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


def _one(reader: Reader, which: Source, package: str, candidates: tuple[str, ...]) -> tuple[str | None, list[str]]:
    existing = [c for c in candidates if reader.text(which, package, c) is not None]
    return (existing[0] if len(existing) == 1 else None), existing


def _moved(reader: Reader, edit: Edit, old_text: str) -> tuple[list[tuple[float, str]], str]:
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


def rebase_edit(edit: Edit, reader: Reader, version: str, *, split: str | None) -> Proposal | NeedsPerson:
    """One edit's new form on the new release (`split`: the old edit's range once split, when it is)."""
    old_path, old_found = _one(reader, reader.old, edit.package, edit.candidates)
    if old_path is None:
        what = "none" if not old_found else f"{len(old_found)} ({', '.join(old_found)})"
        return NeedsPerson(edit, f"its file on the old release: {what} of {', '.join(edit.candidates)} exists")
    old_text = reader.text(reader.old, edit.package, old_path) or ""
    if anchors.count(old_text, edit.anchor) != edit.count:
        return NeedsPerson(edit, f"the anchor is found {anchors.count(old_text, edit.anchor)}x on the old release, expected "
                                 f"{edit.count}x: nothing to rebase from")
    new_path, new_found = _one(reader, reader.new, edit.package, edit.candidates)
    file_similarity, moved, tie = None, False, ""
    if new_path is None and new_found:
        return NeedsPerson(edit, f"ambiguous: {', '.join(new_found)} all exist on the new release")
    if new_path is None:
        ranked, searched = _moved(reader, edit, old_text)
        exact = [(s, p) for s, p in ranked if anchors.count(reader.text(reader.new, edit.package, p) or "", edit.anchor) == edit.count]
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

    found = anchors.count(new_text, edit.anchor)
    if found == edit.count:
        lines = anchors.lines(new_text, edit.anchor)
        first = lines[0] - 1
        ev = Evidence(old_path, new_path, 1.0, edit.anchor, _context(new_text, first, first + edit.anchor.count("\n")),
                      lines, moved_why + f"the anchor is there unchanged, {found}x", file_similarity)
        if moved:  # the file moved, the anchor did not: one more candidate, as the hand-written patches do
            new = RecordedEdit.placed(edit, (*edit.candidates, new_path), edit.anchor, edit.text)
            return Proposal(edit, ProposalKind.MOVED, new, None, ev)
        new = RecordedEdit.placed(edit, (new_path,), edit.anchor, edit.text)
        return Proposal(edit, ProposalKind.MOVED if moved else ProposalKind.RE_ANCHORED, new, split, ev)

    # The three-way step: align the old file to the new one and read off what replaced the anchor's lines.
    old_lines, new_lines = old_text.splitlines(keepends=True), new_text.splitlines(keepends=True)
    opcodes = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
    regions: list[str | None] = []  # what replaced each occurrence (None: not one whole region)
    spans: list[tuple[int, int, int, int]] = []
    for pos in anchors.find_all(old_text, edit.anchor):
        first, last, prefix, suffix = _line_span(old_text, pos, len(edit.anchor))
        b0, b1, before, after = _map(opcodes, first, last)
        region = "".join(new_lines[b0:b1])
        if not (region.startswith(prefix) and region.endswith(suffix)) or len(region) <= len(prefix) + len(suffix):
            regions.append(None)
        else:
            regions.append(region[len(prefix): len(region) - len(suffix)])
        spans.append((b0, b1, before, after))
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
    why = (moved_why + f"old lines {anchors.lines(old_text, edit.anchor)} align with new lines {b0 + 1}-{b1} "
           f"(line diff of the two files; {before} unchanged line(s) before, {after} after)")
    ev = Evidence(old_path, new_path, similarity, _context(old_text, *_line_span(old_text, anchors.first(old_text, edit.anchor),
                  len(edit.anchor))[:2]), _context(new_text, b0, b1), [b0 + 1], why, file_similarity)
    if similarity < MIN_SIMILARITY:
        return NeedsPerson(edit, f"the aligned region is {similarity:.0%} similar to the anchor "
                                 f"(< {MIN_SIMILARITY:.0%}): not the same code", [f"{new_path} line {b0 + 1} "
                                 f"(aligned, {similarity:.0%} similar):\n{anchor}", *closest])
    if anchors.count(new_text, anchor) != edit.count:
        return NeedsPerson(edit, f"the new anchor occurs {anchors.count(new_text, anchor)}x on the new release, expected "
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
    new = RecordedEdit.placed(edit, (new_path,), anchor, text)
    if anchors.count(new_text, new.applied_form):
        return NeedsPerson(edit, "the new release already has the edit's applied form: upstreamed?",
                           [f"{new_path} line {b0 + 1}"])
    return Proposal(edit, ProposalKind.RE_ANCHORED, new, split, ev)
