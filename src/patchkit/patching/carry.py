"""Which patches an artifact carries: one rule for images, wheels and the command line.

Given a plan's per-patch results (planner.State):
- carried: NOT_APPLIED (the build applies it) and APPLIED (the source holds it already, every anchor
  asserted). The artifact names these: its series labels, its patchkit.json, the series hash.
- left out, each recorded with its state and why (an image's `dev.patchkit.skipped`, a wheel's
  patchkit.json `skipped`): UPSTREAMED (the release has the fix), NOT_APPLICABLE (the artifact holds
  none of the packages the patch changes: a FlashInfer patch and a vLLM wheel), OUT_OF_RANGE (the
  release is outside the range the patch declares).
- errors: BROKEN, PARTIAL, MODIFIED: the planner's diagnostic (PatchFailed, exit 1), nothing built.
And an artifact that would change nothing is refused (exit 2): it would be the release under a new name.

Why not applicable and out of range are left out, by both artifacts, and are not errors (both refused
an out-of-range patch; images refused a not-applicable one too, wheels left it out). Not applicable: the
artifact holds no code of the patch's packages, so there is nothing the fix could change. Out of range:
a patch's range is the patch's own statement of the releases it is for, checked on each of them by
`patchkit verify` and the release tests; outside it the planner reads none of the patch's anchors, so
there is nothing checked to carry, and nothing wrong with the release either. Refusing would let one
patch that ends at a release (fixed there without a probe, or not yet ported) stop every image and wheel
of that release though every other patch applies; a release that still needs the fix is a range to
widen, and `patchkit verify` shows it (a cell out of range whose anchors would hold). What the artifact
carries is never in doubt: its series and hash name the carried patches only.
"""

from __future__ import annotations

from dataclasses import dataclass

from patchkit.errors import PatchkitError
from patchkit.patching.patchset import Patch
from patchkit.patching.planner import ERROR_STATES, PatchResult, Plan, State


class ChangesNothing(PatchkitError):
    """An artifact whose plan changes no file: it would be the release under a new name (exit 2).
    `artifact` names it ("image NAME", "series NAME"), `where` the source it is built from, `states`
    each patch's State there."""

    def __init__(self, artifact: str, where: str, states: dict[str, State]):
        self.artifact, self.where, self.states = artifact, where, states
        listed = ", ".join(f"{patch}: {state}" for patch, state in states.items())
        super().__init__(f"{artifact} changes nothing in {where} ({listed}): nothing to build")


CARRIED = frozenset({State.NOT_APPLIED, State.APPLIED})
LEFT_OUT = frozenset({State.UPSTREAMED, State.NOT_APPLICABLE, State.OUT_OF_RANGE})
# Every state has its one place: a state added to the planner must be given one here first.
assert CARRIED | LEFT_OUT | frozenset(ERROR_STATES) == frozenset(State), "a planner state without a carry rule"


@dataclass(frozen=True)
class Carry:
    """What an artifact built from one plan carries and leaves out, in series order."""

    carried: list[PatchResult]
    left_out: list[PatchResult]

    @property
    def patches(self) -> list[Patch]:
        return [r.patch for r in self.carried]


def carry(plan: Plan, artifact: str, where: str) -> Carry:
    """What `artifact` ("image NAME", "series NAME") built from `plan` on `where` carries. PatchFailed when
    a patch is broken, partial or modified (PlanFailed); ChangesNothing when the artifact would change nothing."""
    plan.raise_for_errors()
    if not plan.changes:
        raise ChangesNothing(artifact, where, {r.patch.id: r.state for r in plan.results})
    return Carry([r for r in plan.results if r.state in CARRIED], [r for r in plan.results if r.state in LEFT_OUT])


def out_of_every_range(plan: Plan) -> bool:
    """No patch of the series is for the source's release: each is out of its range or changes a package
    the source lacks, at least one out of range. A tree like that is not "already applied", though it
    holds no pending patch either (the command line refuses it, exit 1)."""
    states = {r.state for r in plan.results}
    return State.OUT_OF_RANGE in states and states <= {State.OUT_OF_RANGE, State.NOT_APPLICABLE}
