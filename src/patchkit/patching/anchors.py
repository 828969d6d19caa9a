"""Where an anchor matches: only as it was written, from the start of a line.

Anchors are whole lines (`patchkit record` writes them so; the hand-written patches are so): an anchor's
text begins where a line begins, with that line's indentation or, unindented, with its first character.
Found inside a line (after more indentation, or after code), it is the tail of another line: `    foo(`
inside `        foo(` is a call one block deeper, and an insert there lands in a different block than
the one it was written for. A plain substring count takes it all the same, so every count, search and
replacement of an anchor (and of an edit's applied form, which begins where its anchor does) goes
through here: a match begins at the start of the text or right after a newline, on every release. An
anchor that itself begins with a newline starts at the end of a line, and may follow anything on it.

Matches never overlap, left to right, as `str.count` and `str.replace` take them.
"""

from __future__ import annotations


def starts_a_line(needle: str) -> bool:
    """Whether `needle` must be found at the start of a line (every anchor not beginning with a newline)."""
    return not needle.startswith("\n")


def _at_line_start(text: str, pos: int) -> bool:
    return pos == 0 or text[pos - 1] == "\n"


def find_all(text: str, needle: str) -> list[int]:
    """The offsets of `needle` where it matches as written (at a line's start), non-overlapping."""
    found, start = [], 0
    anchored = starts_a_line(needle)
    while (pos := text.find(needle, start)) != -1:
        if not anchored or _at_line_start(text, pos):
            found.append(pos)
            start = pos + max(len(needle), 1)
        else:
            start = pos + 1
    return found


def count(text: str, needle: str) -> int:
    """How many times `needle` matches as written."""
    return len(find_all(text, needle))


def first(text: str, needle: str) -> int:
    """The offset of the first match as written, or -1."""
    found = find_all(text, needle)
    return found[0] if found else -1


def replace(text: str, old: str, new: str) -> str:
    """`text` with each match of `old` as written replaced by `new` (a match inside a line is left alone)."""
    out, at = [], 0
    for pos in find_all(text, old):
        out += [text[at:pos], new]
        at = pos + len(old)
    return "".join(out) + text[at:]


def _line_numbers(text: str, offsets: list[int]) -> list[int]:
    lines, line, at = [], 1, 0
    for pos in offsets:
        line += text.count("\n", at, pos)
        at = pos
        lines.append(line)
    return lines


def lines(text: str, needle: str) -> list[int]:
    """1-based line numbers where each match as written begins."""
    return _line_numbers(text, find_all(text, needle))


def inside_lines(text: str, needle: str) -> list[int]:
    """1-based line numbers where `needle` occurs inside a line, not at its start: the looser matches a
    substring search would count and the planner does not (for diagnostics)."""
    if not starts_a_line(needle):
        return []
    offsets, start = [], 0
    while (pos := text.find(needle, start)) != -1:
        if not _at_line_start(text, pos):
            offsets.append(pos)
        start = pos + 1
    return _line_numbers(text, offsets)
