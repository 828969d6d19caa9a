"""The JSON record of a rebase (`patchkit rebase --json`), declared once: the rebase writes it through these
types (report.payload, model's `record()` methods) and the bump pull request's body reads it back through
the same ones (upstream/bump_records.py). A field renamed here is renamed for both, and a record written
before the rename stops validating, naming the field (tests/test_bump_records.py).

The states are the producers' enums (RebaseState, the planner's State, ProposalKind): a value neither
knows is refused. The fields that carry a default are those a record from before they existed lacks (the
recorded run in tests/data/bump/run); the writer always writes every field.
"""

from __future__ import annotations

import msgspec

from patchkit.patching import planner
from patchkit.patching.patchset import Action
from patchkit.patching.planner import State
from patchkit.patching.rebase.model import NeedsPerson, PatchRebase, Proposal, ProposalKind, Rebase, RebaseState


class _Record(msgspec.Struct, kw_only=True):
    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


class EvidenceRecord(_Record, kw_only=True):
    old_path: str
    new_path: str
    similarity: float  # rounded to 3 places
    file_similarity: float | None
    new_lines: list[int]
    why: str
    old_context: str
    new_context: str


class ProposalRecord(_Record, kw_only=True):
    edit: int  # the edit's index in its patch
    action: Action
    kind: ProposalKind
    file: list[str]
    versions: str | None
    old_versions: str | None
    anchor: str
    evidence: EvidenceRecord


class PersonRecord(_Record, kw_only=True):
    edit: int
    action: Action
    reason: str
    candidates: list[str]


class RangeRecord(_Record, kw_only=True):
    package: str
    from_: str = msgspec.field(name="from")
    to: str


class PatchRecord(_Record, kw_only=True):
    patch: str
    state: RebaseState
    detail: str
    range: RangeRecord | None
    proposals: list[ProposalRecord]
    needs_person: list[PersonRecord]
    failure: str | None = None  # why its rebased form failed a check ("" none; None: a record from before)
    written: bool | None = None  # None: a record from before rebase wrote per patch


class TestRecord(_Record, kw_only=True):
    patch: str
    passed: bool
    tail: str


class RebaseRecord(_Record, kw_only=True):
    ok: bool
    exit_code: int | None = None  # 0 written, 4 some edit needs a person, 1 a check failed (None: an older record)
    from_: str = msgspec.field(name="from")
    to: str
    versions: dict[str, str]
    patches: list[PatchRecord]
    check: dict[str, State]  # patch id -> the planner's state of the rebased series on the new release
    tests: list[TestRecord]
    tests_note: str
    written: bool
    written_patches: list[str] = []
    not_written: dict[str, str] = {}  # patch id -> why it was not written
    write_asked: bool | None = None


def person_record(n: NeedsPerson) -> PersonRecord:
    return PersonRecord(edit=n.edit.index, action=n.edit.action, reason=n.reason, candidates=n.candidates)


def _proposal_record(p: Proposal) -> ProposalRecord:
    ev = p.evidence
    evidence = EvidenceRecord(
        old_path=ev.old_path, new_path=ev.new_path, similarity=round(ev.similarity, 3),
        file_similarity=None if ev.file_similarity is None else round(ev.file_similarity, 3),
        new_lines=ev.new_lines, why=ev.why, old_context=ev.old_context, new_context=ev.new_context)
    return ProposalRecord(edit=p.edit.index, action=p.edit.action, kind=p.kind, file=list(p.new.candidates),
                          versions=p.new.versions, old_versions=p.old_versions, anchor=p.new.anchor, evidence=evidence)


def patch_record(r: PatchRebase) -> PatchRecord:
    return PatchRecord(
        patch=r.patch.id, state=r.state, detail=r.detail,
        range=None if r.new_range is None else RangeRecord(package=r.new_range[0], from_=r.new_range[1], to=r.new_range[2]),
        proposals=[_proposal_record(p) for p in r.proposals], needs_person=[person_record(n) for n in r.people],
        failure=r.failure, written=r.written)


def rebase_record(result: Rebase, plan: planner.Plan, *, write: bool) -> RebaseRecord:
    """The record of a rebase and of its rebased series planned on the new release (`plan`)."""
    return RebaseRecord(
        ok=result.ok, exit_code=result.exit_code, from_=result.old, to=result.new, versions=result.versions,
        patches=[patch_record(r) for r in result.results], check={r.patch.id: r.state for r in plan.results},
        tests=[TestRecord(patch=r.tests.patch_id, passed=r.tests.passed, tail=r.tests.tail)
               for r in result.results if r.tests is not None],
        tests_note=result.tests_note, written=any(r.written for r in result.results),
        written_patches=[r.patch.id for r in result.results if r.written],
        not_written={r.patch.id: why for r in result.results if (why := result.why_not_written(r))},
        write_asked=write)
