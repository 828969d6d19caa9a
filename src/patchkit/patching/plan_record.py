"""The JSON record of a plan (`patchkit check/apply/revert/status --json`) and of the planner's account of
each patch and its edits, declared once: a plan is written through these types, and the matrix's cells
carry the same PatchResultRecord (verify.matrix_record), which the bump pull request's body reads back. A
field renamed here is renamed for every writer and reader, and a record written before the rename (the
recorded runs in tests/data/bump) stops validating, naming the field.

States are the planner's own StrEnums (State, EditState, Mode), an edit's action patchset.Action: a value
neither knows is refused when a record is read back.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from patchkit.patching.patchset import Action
from patchkit.patching.planner import EditResult, EditState, FileChange, Mode, PatchResult, Plan, State
from patchkit.sources.companion import Companion, CompanionRecord


class NearestRecord(msgspec.Struct, kw_only=True):
    line: int  # 1-based first line of the region most like the anchor
    similarity: float  # rounded to 4 places
    diff: str  # anchor -> region


class EditResultRecord(msgspec.Struct, kw_only=True):
    index: int  # the edit's place in its patch, 1-based
    action: Action
    package: str
    path: str | None  # the candidate that exists (None: none does)
    candidates: list[str]
    state: EditState
    expected: int  # the edit's count
    found: int
    lines: list[int]
    detail: str
    nearest: NearestRecord | None  # where the anchor went, when it was not found


class PatchResultRecord(msgspec.Struct, kw_only=True):
    id: str
    state: State
    detail: str
    edits: list[EditResultRecord]


class ChangeRecord(msgspec.Struct, kw_only=True):
    package: str
    path: str
    old_sha256: str
    new_sha256: str


class PlanRecord(msgspec.Struct, kw_only=True):
    mode: Mode
    source: str
    versions: dict[str, str]
    ok: bool
    patches: list[PatchResultRecord]
    changes: list[ChangeRecord]

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


class CheckRecord(PlanRecord, kw_only=True):
    """`patchkit check --json`: the plan, and the companion checked beside the release (None: none)."""

    companion: CompanionRecord | None


class StatusRecord(PlanRecord, kw_only=True, omit_defaults=True):
    """`patchkit status --json`: the tree's state (no changes: status writes none), and the patched wheels
    installed there, each `{"record": path}` with its wheels.manifest.WheelManifest (absent: none)."""

    wheels: list[dict[str, Any]] | None = None


def _edit_record(e: EditResult) -> EditResultRecord:
    nearest = None if e.nearest is None else NearestRecord(line=e.nearest.line, similarity=round(e.nearest.similarity, 4),
                                                           diff=e.nearest.diff)
    return EditResultRecord(index=e.edit.index, action=e.edit.action, package=e.edit.package, path=e.path,
                            candidates=list(e.edit.candidates), state=e.state, expected=e.edit.count, found=e.found,
                            lines=list(e.lines), detail=e.detail, nearest=nearest)


def patch_result_record(result: PatchResult) -> PatchResultRecord:
    return PatchResultRecord(id=result.patch.id, state=result.state, detail=result.detail,
                             edits=[_edit_record(e) for e in result.edits])


def _change_record(c: FileChange) -> ChangeRecord:
    return ChangeRecord(package=c.package, path=c.path, old_sha256=hashlib.sha256(c.old).hexdigest(),
                        new_sha256=hashlib.sha256(c.new).hexdigest())


def plan_record(plan: Plan) -> PlanRecord:
    return PlanRecord(**_plan_fields(plan))


def check_record(plan: Plan, companion: Companion | None) -> CheckRecord:
    return CheckRecord(**_plan_fields(plan), companion=None if companion is None else companion.record())


def status_record(plan: Plan, wheels: list[dict[str, Any]]) -> StatusRecord:
    return StatusRecord(**_plan_fields(plan) | {"changes": []}, wheels=wheels or None)


def _plan_fields(plan: Plan) -> dict[str, Any]:
    return {"mode": plan.mode, "source": plan.source, "versions": dict(plan.versions), "ok": plan.ok,
            "patches": [patch_result_record(r) for r in plan.results],
            "changes": [_change_record(c) for c in plan.changes]}
