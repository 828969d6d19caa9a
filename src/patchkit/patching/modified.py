"""The `modified` state: a patch's text present in a file, but not byte-exact (edited by hand).

Read from the text alone, like every other state, and never guessed through: an edited insert would
otherwise read as pending (and be inserted a second time), an edited replacement as broken or, worse,
as not applied (and be left behind by a revert).
"""

from __future__ import annotations

import difflib
import re

from patchkit.patching import anchors
from patchkit.patching.diagnostics import nearest_match
from patchkit.patching.patchset import Edit

# An inserted text whose lines are this similar to the lines where it would go is the patch's text,
# edited (on vLLM 0.30.0-0.33.0 the stock neighbours of every insert in the series score at most 0.5).
INSERT_SIMILARITY = 0.75


def edited_text(edit: Edit, path: str, text: str, n_anchor: int, n_applied: int,
                inserted: set[str]) -> tuple[int, str] | None:
    """The edit's text is present but not byte-exact: a user edited patched code (never guessed through).

    An insert whose anchor is intact but whose text, right beside it, is nearly the patch's text; or a
    replacement whose anchor is gone and whose nearest region is closer to the patch's text than to the
    anchor (an upstream drift is closer to the anchor: that stays "broken"). The text's marker comment
    ("patchkit <id>", never in upstream code) found there settles it either way. A neighbour that is another
    edit's text, whole, is that edit's business, not a modification of this one.
    """
    if n_applied:
        return None
    # "# patchkit <patch id>" starts the comment every patch leaves in its text: its marker
    markers = {m.group(0) for m in re.finditer(r"patchkit [\w.-]*\w", edit.text)}
    if edit.action in ("insert_after", "insert_before") and n_anchor == edit.count:
        width = max(1, edit.text.count("\n"))
        for start in anchors.find_all(text, edit.anchor):
            region = _lines_after(text, start + len(edit.anchor), width) if edit.action == "insert_after" \
                else _lines_before(text, start, width)
            if any(other != edit.text and other in region for other in inserted):
                continue
            # by whole lines: cheap on the long texts some patches insert, and a stock line equal to one
            # of the patch's own is rare where a character-level likeness is not
            lines = difflib.SequenceMatcher(None, edit.text.splitlines(), region.splitlines(), autojunk=False)
            similarity = lines.quick_ratio()  # an upper bound, from the lines in common: settles most at once
            similarity = lines.ratio() if similarity >= INSERT_SIMILARITY else similarity
            marked = any(m in region for m in markers)
            if similarity >= INSERT_SIMILARITY or marked:
                return _modified_result(edit, path, text, edit.text, region)
        return None
    if edit.action == "replace" and n_anchor == 0:
        near = nearest_match(text, edit.text)
        if near is None:
            return None
        to_anchor = difflib.SequenceMatcher(None, edit.anchor, near.region, autojunk=False).ratio()
        marked = any(m in text for m in markers)
        if marked or near.similarity > max(to_anchor, 0.5):
            return _modified_result(edit, path, text, edit.text, near.region)
    return None


def _lines_after(text: str, pos: int, n: int) -> str:
    end = pos
    for _ in range(n):
        end = text.find("\n", end) + 1
        if end == 0:
            return text[pos:]
    return text[pos:end]


def _lines_before(text: str, pos: int, n: int) -> str:
    start = pos
    for _ in range(n):
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return text[start:pos]


def _modified_result(edit: Edit, path: str, text: str, expected: str, region: str) -> tuple[int, str]:
    start = text.find(region)
    line = text.count("\n", 0, start) + 1 if start >= 0 else 0
    diff = "".join(difflib.unified_diff(
        expected.splitlines(keepends=True), region.splitlines(keepends=True),
        fromfile="patch text (expected)", tofile=f"{edit.package}/{path} line {line} (found)",
    )).rstrip("\n")
    detail = (f"the patch's text is present at line {line} but not byte-exact (edited by hand?); "
              f"patchkit will neither apply nor revert it: restore it or the original by hand\n{diff}")
    return line, detail
