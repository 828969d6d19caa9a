"""Plans rendered for people (rich tables); for machines (--json) they are written as plan_record.PlanRecord."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from patchkit.patching.planner import Plan, State

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


def plan_table(plan: Plan, *, labels: dict[State, str] | None = None) -> Table:
    """One row per patch; broken rows carry the full diagnostic."""
    labels = labels or {}
    versions = ", ".join(f"{k} {v}" for k, v in sorted(plan.versions.items()))
    table = Table(title=f"{plan.source}  [{versions}]", title_justify="left")
    table.add_column("patch", overflow="fold")  # a patch id is copied whole: folded at any width, never cut
    table.add_column("state", overflow="fold")
    table.add_column("detail", overflow="fold")
    for r in plan.results:
        label = labels.get(r.state, str(r.state))
        detail = r.detail
        broken = [e.describe() for e in r.edits if e.state in ("broken", "modified")]
        if broken:
            detail = "\n".join(([detail] if detail else []) + broken)
        table.add_row(r.patch.id, Text(label, style=STYLES[r.state]), detail)
    return table
