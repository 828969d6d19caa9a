"""The rebase of a series: per patch, its range grown to the new release, its [upstreamed] probe read there,
and each edit that does not hold as written on the new release given a new form (search.rebase_edit).

An edit that holds on the new release as written (its anchor there, count times, at a line's start) is
left alone: the patch is planned on the new release with its range grown first, so only what broke is
re-derived. Every patch with a change comes out UNTESTED: its checks (checks.py) decide the rest.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePosixPath

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchkit.patching import planner
from patchkit.patching.patchset import Edit, Patch
from patchkit.patching.probes import probe_hit
from patchkit.patching.rebase.model import PatchRebase, Proposal, ProposalKind, Rebase, RebaseState
from patchkit.patching.rebase.search import Reader, rebase_edit
from patchkit.sources.base import Source

HOLDS = (planner.EditState.PENDING, planner.EditState.HOLDS, planner.EditState.APPLIED)


def _split_versions(edit: Edit, version: str) -> tuple[str, str]:
    """(old edit's range, new edit's range): below the new release, and from it on."""
    v = Version(version)
    cut = f"{v.major}.{v.minor}" if v.micro == 0 and not v.pre and not v.post else str(v)
    old = f"{edit.versions},<{cut}" if edit.versions is not None else f"<{cut}"
    return old, f">={cut}"


def _successor_range(edit: Edit, version: str) -> str:
    """The range for the successor of an edit whose own range ended before the new release."""
    specs = list(edit.versions or [])
    if len(specs) == 1 and specs[0].operator == "<":
        return f">={specs[0].version}"
    if len(specs) == 1 and specs[0].operator == "<=":
        return f">{specs[0].version}"
    return f">={version}"


def _grown_range(spec: SpecifierSet, version: str) -> str | None:
    """The patch's range taking the new release in: its upper bound raised to the next minor; None if
    something else excludes it."""
    v = Version(version)
    out = []
    for s in spec:
        if s.contains(v, prereleases=True):
            out.append(str(s))
        elif s.operator in ("<", "<="):
            out.append(f"<{v.major}.{v.minor + 1}")
        else:
            return None
    return ",".join(sorted(out, key=lambda s: (not s.startswith(">"), s)))



def rebase(patches: list[Patch], old: Source, new: Source, *, honour_probe: bool = True) -> Rebase:
    """Every patch's broken, out-of-range or orphaned edits re-derived for the new source's release."""
    versions = new.versions()
    old_versions = old.versions()
    reader = Reader(old, new)
    for p in patches:
        for e in p.edits:
            for c in e.candidates:
                parts = PurePosixPath(c).parent.parts
                reader.known_dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for source, found in ((old, old_versions), (new, versions)):
        for package in found:
            paths = sorted({c for p in patches for e in p.edits if e.package == package for c in e.candidates})
            reader.prefetch(source, package, paths)
    results = [_rebase_patch(patch, reader, versions, old_versions, honour_probe) for patch in patches]
    return Rebase(old.description, new.description, versions, results)


def _rebase_patch(patch: Patch, reader: Reader, versions: dict, old_versions: dict, honour_probe: bool) -> PatchRebase:
    packages = [p for p in patch.packages if p in versions and p in old_versions]
    if not packages:
        return PatchRebase(patch, RebaseState.UNCHANGED, detail="none of its packages is in both sources")
    grown = None
    ranges = dict(patch.ranges)
    for package in packages:
        spec = patch.ranges[package]
        if not spec.contains(Version(versions[package]), prereleases=True):
            wider = _grown_range(spec, versions[package])
            if wider is None:
                return PatchRebase(patch, RebaseState.NEEDS_PERSON, detail=f"its {package} range {spec} excludes "
                                   f"{versions[package]} by more than an upper bound")
            grown = (package, str(spec), wider)
            ranges[package] = SpecifierSet(wider)
    if honour_probe and patch.upstreamed and patch.upstreamed.package in versions:
        probe = patch.upstreamed
        hit = probe_hit(probe, lambda path: reader.text(reader.new, probe.package, path), versions[probe.package])
        if hit is not None:
            return PatchRebase(patch, RebaseState.UPSTREAMED,
                               detail=f"{hit.describe()}; propose dropping it, nothing rebased")
    result = PatchRebase(patch, RebaseState.UNCHANGED, new_range=grown)
    # Which edits hold as written on the new release, the range grown first (its probe aside: read above).
    solo = planner.plan([dataclasses.replace(patch, ranges=ranges, upstreamed=None)], reader.new, diagnose=False)
    states = {e.edit.index: e for e in solo.results[0].edits}
    for edit in patch.edits:
        if edit.package not in packages:
            continue
        version = versions[edit.package]
        if edit.in_range(version):
            state = states.get(edit.index)
            if state is not None and state.state in HOLDS:
                continue
            old_range, new_range = _split_versions(edit, version)
            outcome = rebase_edit(edit, reader, version, split=old_range)
            if isinstance(outcome, Proposal) and outcome.new.versions is None and outcome.old_versions is not None:
                outcome.new = dataclasses.replace(outcome.new, versions=new_range)
        else:
            successors = [e for e in patch.edits if e.package == edit.package and e.versions is not None
                          and e.in_range(version)]
            if successors or not edit.in_range(old_versions[edit.package]):
                continue  # covered by an edit for the new releases, or not an edit of the old release
            outcome = rebase_edit(edit, reader, version, split=None)
            if isinstance(outcome, Proposal):
                outcome.kind = ProposalKind.SUCCESSOR
                outcome.old_versions = None
                outcome.new = dataclasses.replace(outcome.new, candidates=(outcome.evidence.new_path,),
                                                  versions=_successor_range(edit, version))
        if isinstance(outcome, Proposal):
            result.proposals.append(outcome)
        else:
            result.people.append(outcome)
    if result.people:
        result.state = RebaseState.NEEDS_PERSON
    elif result.proposals or grown:
        result.state = RebaseState.UNTESTED
        if not result.proposals:
            result.detail = "every edit holds there as written; its range grown"
    return result
