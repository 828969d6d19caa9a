"""What a rebase found, patch by patch: the states, the proposals and their evidence, the edits left to a
person, and the run's exit status. Every other module of the rebase fills or reads these."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from patchkit.errors import PatchkitError
from patchkit.patching.patchset import Edit, Patch
from patchkit.patching.record import RecordedEdit

EXIT_WRITTEN = 0  # every patch that needed a change passed its checks (and was written, with --write)
EXIT_FAILED = 1  # a check failed: a rebased patch does not apply, its tests failed or could not run
EXIT_NEEDS_PERSON = 4  # the rest passed; some edit needs a person (3 is patchkit's internal-error exit)


class RebaseRefused(PatchkitError):
    """A rebase that cannot be read or written as proposed; nothing is written (exit 2). `patch` the
    patch id (None where the failure is not one patch's), `problem` "encoding" (a release file not UTF-8),
    "range-line" (no one version line to widen), "files-key" (no one-line file/files key to extend),
    "changed" (the patch folder changed since the rebase read it) or "read-back" (the rendered patch.toml
    is not the proposal: a bug), `detail` what was expected and found."""

    def __init__(self, patch: str | None, problem: str, detail: str):
        self.patch, self.problem, self.detail = patch, problem, detail
        super().__init__(f"patch {patch}: {detail}" if patch else detail)


class RebaseState(StrEnum):
    """One patch's state in a rebase. Only REBASED says the patch works on the new release: its anchors
    were placed and its behaviour tests passed there; an anchor that still matches says nothing of the
    edit's text on the new code."""

    UNCHANGED = "unchanged"          # in range, every edit holds as written: nothing to do
    REBASED = "rebased"              # placed (range widened, edits re-anchored), applies, tests passed there
    UNTESTED = "re-anchored, untested"        # placed and applies; its behaviour tests have not run
    TESTS_FAILED = "re-anchored, tests failed"  # placed and applies; its behaviour tests failed there
    DOES_NOT_APPLY = "re-anchored, does not apply"  # placed, but the rebased series does not apply there
    NEEDS_PERSON = "needs-person"    # some edit (or its range) is a person's call: kept as it was
    UPSTREAMED = "upstreamed"        # its [upstreamed] probe fires there: propose dropping it


class ProposalKind(StrEnum):
    """How a proposal found the edit's new form."""

    MOVED = "moved"              # the anchor as written, in another file
    RE_ANCHORED = "re-anchored"  # a new anchor (three-way merged) where the old one held
    SUCCESSOR = "successor"      # a new edit for the new releases beside one whose range ended before them


PLACED = (RebaseState.REBASED, RebaseState.UNTESTED, RebaseState.TESTS_FAILED, RebaseState.DOES_NOT_APPLY)


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


@dataclass
class Proposal:
    edit: Edit
    kind: ProposalKind
    new: RecordedEdit
    old_versions: str | None  # the old edit's range after the split (None: unchanged)
    evidence: Evidence


@dataclass
class NeedsPerson:
    edit: Edit
    reason: str
    candidates: list[str] = field(default_factory=list)  # closest sites, described


@dataclass
class TestRun:
    """One patch's behaviour tests on the new release: `returncode` pytest's (124: timed out)."""

    patch_id: str
    test: str
    returncode: int
    tail: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0


@dataclass
class PatchRebase:
    patch: Patch
    state: RebaseState
    proposals: list[Proposal] = field(default_factory=list)
    people: list[NeedsPerson] = field(default_factory=list)
    new_range: tuple[str, str, str] | None = None  # (package, old spec, new spec) when the patch's range grows
    detail: str = ""
    rendered: tuple[str, dict[str, str]] | None = None  # the checked patch.toml and text files (checks.py)
    failure: str = ""  # why its check failed (DOES_NOT_APPLY, TESTS_FAILED)
    tests: TestRun | None = None
    written: bool = False


@dataclass
class Rebase:
    old: str
    new: str
    versions: dict[str, str]
    results: list[PatchRebase]
    tests_required: bool = False  # the behaviour tests were asked for (no --no-tests): untested is not written
    tests_note: str = ""  # why they did not run, where they did not

    @property
    def writable(self) -> list[PatchRebase]:
        """The patches whose every check passed: placed, applying, and tested where tests were asked for."""
        return [r for r in self.results if r.state == RebaseState.REBASED
                or (r.state == RebaseState.UNTESTED and not self.tests_required)]

    @property
    def placed(self) -> list[PatchRebase]:
        return [r for r in self.results if r.state in PLACED]

    @property
    def exit_code(self) -> int:
        """0 every patch that needed a change passed its checks; 4 some edit needs a person and the rest
        passed; 1 a check failed (a rebased patch does not apply, its tests failed or did not run)."""
        failed = (RebaseState.DOES_NOT_APPLY, RebaseState.TESTS_FAILED)
        if any(r.state in failed for r in self.results) or (self.tests_required and any(
                r.state == RebaseState.UNTESTED for r in self.results)):
            return EXIT_FAILED
        if any(r.state == RebaseState.NEEDS_PERSON for r in self.results):
            return EXIT_NEEDS_PERSON
        return EXIT_WRITTEN

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_WRITTEN

    def why_not_written(self, r: PatchRebase) -> str:
        """Why a patch that needed a change is not written ("" when it is writable or needed none)."""
        if r in self.writable or r.state in (RebaseState.UNCHANGED, RebaseState.UPSTREAMED):
            return ""
        if r.state == RebaseState.NEEDS_PERSON:
            if not r.people:
                return r.detail or "it needs a person"
            edits = [str(n.edit.index) for n in r.people]
            return f"edit{'s' if len(edits) > 1 else ''} {', '.join(edits)} need{'' if len(edits) > 1 else 's'} a person"
        if r.state == RebaseState.DOES_NOT_APPLY:
            return "its rebased form does not apply on the new release"
        if r.state == RebaseState.TESTS_FAILED:
            return "its behaviour tests failed on the new release"
        return f"its behaviour tests did not run ({self.tests_note or 'not run'})"
