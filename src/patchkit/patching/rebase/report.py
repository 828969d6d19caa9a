"""A rebase as a person reads it (`patchkit rebase` without --json) and as its JSON record: each patch's
state and proposals, each edit left to a person with its closest candidates, the rebased series on the
new release, the behaviour tests, and what was written, or why nothing was."""

from __future__ import annotations

from patchkit.patching import planner
from patchkit.patching.rebase.model import Rebase, RebaseState
from patchkit.patching.rebase.records import rebase_record


def payload(result: Rebase, plan: planner.Plan, *, write: bool) -> dict:
    """The JSON record (records.RebaseRecord: upstream/bump_records.py reads it for the bump pull request's body)."""
    return rebase_record(result, plan, write=write).to_dict()


def lines(result: Rebase, plan: planner.Plan, *, write: bool) -> list[str]:
    out = [f"rebase {result.old} -> {result.new}"]
    for r in result.results:
        out.append(f"patch {r.patch.id}: {r.state}" + (f" ({r.detail})" if r.detail else ""))
        if r.new_range:
            out.append(f"  range {r.new_range[0]} {r.new_range[1]} -> {r.new_range[2]}")
        for p in r.proposals:
            out.append(f"  edit {p.edit.index} ({p.edit.action}): {p.kind} -> {', '.join(p.new.candidates)}"
                       + (f" versions {p.new.versions}" if p.new.versions else "")
                       + f"; {p.evidence.why} (anchor {p.evidence.similarity:.0%} similar)")
        for n in r.people:
            out.append(f"  edit {n.edit.index} ({n.edit.action}) NEEDS A PERSON: {n.reason}")
            for c in n.candidates[:3]:
                out.append("    closest: " + c.replace("\n", "\n      "))
        if r.state == RebaseState.DOES_NOT_APPLY and r.failure:
            out.append("  " + r.failure.replace("\n", "\n  "))
    bad = [r for r in plan.results if not r.ok]
    out.append("rebased series on the new release: " + ("applies" if not bad else
               "; ".join(r.describe() for r in bad)))
    for r in result.results:
        if r.tests is not None:
            out.append(f"behaviour tests {r.patch.id}: {'passed' if r.tests.passed else 'FAILED'}"
                       + ("" if r.tests.passed else "\n" + r.tests.tail))
    if result.tests_note:
        out.append(result.tests_note)
    out.append(written(result, write=write))
    return out


def written(result: Rebase, *, write: bool) -> str:
    """The last line: what was written, or would be with --write, and why each other patch is not."""
    done = [r.patch.id for r in result.results if r.written]
    would = [r.patch.id for r in result.writable]
    why = [f"{r.patch.id} ({reason})" for r in result.results if (reason := result.why_not_written(r))]
    kept = ("; kept as they were: " + "; ".join(why)) if why else ""
    if done:
        return f"written: {', '.join(done)}{kept}"
    if would and not write:
        return f"nothing written (use --write): would write {', '.join(would)}{kept}"
    if why:
        return "nothing written: " + "; ".join(why)
    return "nothing written: nothing to write (every patch holds on the new release as written, or is upstreamed)"
