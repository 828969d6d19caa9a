"""Where an anchor went: the nearest region when nothing was found (where it was: anchors.lines).

A maintainer rebasing a patch onto a new vLLM wants the line and a short diff, not "pattern not matched".
difflib does the similarity; the windowing over lines is ours because an anchor is a run of whole or
partial lines and the nearest region must be reported as lines of the target.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class NearestMatch:
    line: int  # 1-based first line of the region
    similarity: float  # 0..1
    region: str
    diff: str  # unified diff, anchor -> region

    def describe(self) -> str:
        return f"nearest match at line {self.line} ({self.similarity:.0%} similar):\n{self.diff}"


def nearest_match(text: str, anchor: str, *, max_diff_lines: int = 12) -> NearestMatch | None:
    """The window of the anchor's line count in text that is most similar to the anchor."""
    target_lines = text.splitlines(keepends=True)
    width = max(1, anchor.count("\n") + (0 if anchor.endswith("\n") else 1))
    if not target_lines:
        return None
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(anchor)
    best: tuple[float, int] = (-1.0, 0)
    for start in range(0, max(1, len(target_lines) - width + 1)):
        region = "".join(target_lines[start : start + width])
        matcher.set_seq1(region)
        # The cheap upper bounds prune nearly every window before the exact ratio is computed.
        if matcher.real_quick_ratio() <= best[0] or matcher.quick_ratio() <= best[0]:
            continue
        ratio = matcher.ratio()
        if ratio > best[0]:
            best = (ratio, start)
    ratio, start = best
    region = "".join(target_lines[start : start + width])
    diff = difflib.unified_diff(
        anchor.splitlines(keepends=True),
        region.splitlines(keepends=True),
        fromfile="anchor (expected)",
        tofile=f"target line {start + 1} (found)",
        lineterm="\n",
    )
    diff_lines = [line if line.endswith("\n") else line + "\n" for line in diff]
    if len(diff_lines) > max_diff_lines:
        diff_lines = diff_lines[:max_diff_lines] + ["...\n"]
    return NearestMatch(line=start + 1, similarity=ratio, region=region, diff="".join(diff_lines).rstrip("\n"))
