"""Plans rendered for people (rich tables) and for machines (plain dicts for --json)."""

from __future__ import annotations

import hashlib

from rich.table import Table
from rich.text import Text

from patchkit.patching.planner import PatchResult, Plan, State

STYLES = {
    State.APPLIED: "green",
    State.NOT_APPLIED: "yellow",
    State.UPSTREAMED: "cyan",
    State.OUT_OF_RANGE: "dim",
    State.NOT_APPLICABLE: "dim",
    State.BROKEN: "bold red",
    State.PARTIAL: "bold red",
    State.MODIFIED: "bold red",
}


def plan_to_dict(plan: Plan) -> dict:
    return {
        "mode": plan.mode,
        "source": plan.source,
        "versions": plan.versions,
        "ok": plan.ok,
        "patches": [result_to_dict(r) for r in plan.results],
        "changes": [
            {
                "package": c.package,
                "path": c.path,
                "old_sha256": hashlib.sha256(c.old).hexdigest(),
                "new_sha256": hashlib.sha256(c.new).hexdigest(),
            }
            for c in plan.changes
        ],
    }


def result_to_dict(result: PatchResult) -> dict:
    return {
        "id": result.patch.id,
        "state": str(result.state),
        "detail": result.detail,
        "edits": [
            {
                "index": e.edit.index,
                "action": e.edit.action,
                "package": e.edit.package,
                "path": e.path,
                "candidates": list(e.edit.candidates),
                "state": e.state,
                "expected": e.edit.count,
                "found": e.found,
                "lines": e.lines,
                "detail": e.detail,
                "nearest": None
                if e.nearest is None
                else {"line": e.nearest.line, "similarity": round(e.nearest.similarity, 4), "diff": e.nearest.diff},
            }
            for e in result.edits
        ],
    }


def plan_table(plan: Plan, *, labels: dict[State, str] | None = None) -> Table:
    """One row per patch; broken rows carry the full diagnostic."""
    labels = labels or {}
    versions = ", ".join(f"{k} {v}" for k, v in sorted(plan.versions.items()))
    table = Table(title=f"{plan.source}  [{versions}]", title_justify="left")
    table.add_column("patch")
    table.add_column("state")
    table.add_column("detail", overflow="fold")
    for r in plan.results:
        label = labels.get(r.state, str(r.state))
        detail = r.detail
        broken = [e.describe() for e in r.edits if e.state in ("broken", "modified")]
        if broken:
            detail = "\n".join(([detail] if detail else []) + broken)
        table.add_row(r.patch.id, Text(label, style=STYLES[r.state]), detail)
    return table
