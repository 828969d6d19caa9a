"""Which patch makes a difference: the differing ids rerun on trees with one patch left out at a time.

Only patches that write a file are tried (an out-of-range patch changes nothing). A difference that
goes back to the stock outcome without patch P is P's. One that no single omission settles is reported
as the series' together (two patches that need each other to show it).
"""

from __future__ import annotations

from patchkit.gate.compare import Difference
from patchkit.gate.run import Workspace, build_tree, run_tests
from patchkit.patching.patchset import Patch

TOGETHER = "(no single patch: the series together)"


def blame(ws: Workspace, series: list[Patch], writers: list[str], differences: list[Difference],
          paths: list[str]) -> dict[str, str]:
    """Each differing id -> the id of the patch whose omission gives back the stock outcome."""
    wanted = {d.test_id: d.stock for d in differences}
    found: dict[str, str] = {}
    for patch_id in writers:
        left = [i for i in wanted if i not in found]
        if not left:
            break
        tree = build_tree(ws, f"without-{patch_id}", [p for p in series if p.id != patch_id])
        outcomes = run_tests(ws, tree, f"without-{patch_id}", _files_of(left, paths), only=left)
        for test_id in left:
            if outcomes.get(test_id, "absent") == wanted[test_id]:
                found[test_id] = patch_id
    return {i: found.get(i, TOGETHER) for i in wanted}


def _files_of(test_ids: list[str], paths: list[str]) -> list[str]:
    """The test files holding `test_ids` (a collection error's id is its file already)."""
    files = sorted({i.split("::", 1)[0] for i in test_ids})
    return files or paths
