"""The rebase measured on real history (tests/test_rebase.py and `nox -s bench -- --only rebase`): the patch
set with a later release's hand-written edits stripped, rebased from the earlier release onto the later
one, compared with what a person wrote."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from patchkit.patching import planner
from patchkit.patching.patchset import Edit, Patch, PatchSet, load_patchset
from patchkit.patching.rebase.checks import check
from patchkit.patching.rebase.model import RebaseState
from patchkit.patching.rebase.propose import rebase
from patchkit.patching.rebase.records import person_record
from patchkit.patching.rebase.writing import set_files, trailing_blank
from patchkit.patching.record import split_edits
from patchkit.sources.base import Source
from patchkit.untrusted import read_file


def without_later_edits(patches_dir: Path, dest: Path, old: Source) -> PatchSet:
    """The patch set as it stood before the later releases' edits were written: every edit whose range
    excludes the old release dropped, every candidate path the old release lacks dropped (the benchmark's
    starting point: rebase must derive the rest from the old release and the new one)."""
    patchset = load_patchset(patches_dir)
    shutil.copytree(patches_dir, dest)
    versions = old.versions()
    for patch in patchset.series():
        toml_path = patch.folder / "patch.toml"
        head, chunks = split_edits(read_file(toml_path, "definition").decode("utf-8"), str(toml_path), len(patch.edits))
        out = []
        for edit, chunk in zip(patch.edits, chunks, strict=True):
            if edit.package in versions and not edit.for_release(versions):
                continue
            if edit.package in versions and len(edit.candidates) > 1:
                exist = [c for c in edit.candidates if old.read(edit.package, c) is not None]
                if len(exist) == 1:
                    body, tail = trailing_blank(chunk)
                    chunk = set_files(body, tuple(exist)) + tail
            out.append(chunk)
        (dest / patch.id / "patch.toml").write_text(head + "".join(out), encoding="utf-8")
    return load_patchset(dest)


def measure(patches_dir: Path, old: Source, new: Source, work: Path) -> dict:
    """Per patch: the hand-written later-release edits, how many rebase recovered from the earlier ones
    (identical, or different text with the same effect on the new release), and which need a person."""
    hand = load_patchset(patches_dir)
    stripped = without_later_edits(patches_dir, work / "stripped", old)
    result = rebase(stripped.series(), old, new, honour_probe=False)
    check(result, work / "stripped", new, work / "rebased")
    rebased = load_patchset(work / "rebased")
    versions, old_versions = new.versions(), old.versions()
    out = {}
    for r in result.results:
        patch_id = r.patch.id
        hand_patch, strip_patch, new_patch = hand.patch(patch_id), stripped.patch(patch_id), rebased.patch(patch_id)
        later = _later_edits(hand_patch, strip_patch, versions, old_versions, new)
        if not later:
            continue
        forms = {_form(e, new) for e in new_patch.edits if e.for_release(versions)}
        identical = [e.index for e in later if _form(e, new) in forms]
        same_effect = _effect(hand_patch, new) == _effect(new_patch, new)
        out[patch_id] = {
            "later_edits": len(later), "identical": len(identical),
            # different text counts only where the whole patch does the same on the new release
            "recovered": len(later) if same_effect and r.state != RebaseState.NEEDS_PERSON else len(identical),
            "same_effect_on_new_release": same_effect,
            "needs_person": [person_record(n).to_dict() for n in r.people],
            "proposals": len(r.proposals), "state": str(r.state),
        }
    return {"from": result.old, "to": result.new, "patches": out, "rebased_dir": str(work / "rebased"),
            "rebased": [r.patch.id for r in result.results if r.state == RebaseState.UNTESTED]}


def _later_edits(hand: Patch, stripped: Patch, versions: dict, old_versions: dict, new: Source) -> list[Edit]:
    """The hand-written edits for the new release that the stripped patch lacks: dropped, or resolving
    on the new release to a path the stripped edit does not name."""
    kept = {(e.action, e.anchor, e.text, e.count): e for e in stripped.edits}
    out = []
    for e in hand.edits:
        if e.package not in old_versions or not e.for_release(versions):
            continue
        twin = kept.get((e.action, e.anchor, e.text, e.count))
        path = next((c for c in e.candidates if new.read(e.package, c) is not None), None)
        if twin is None or (path is not None and path not in twin.candidates):
            out.append(e)
    return out


def _form(edit: Edit, new: Source) -> tuple:
    path = next((c for c in edit.candidates if new.read(edit.package, c) is not None), None)
    return edit.package, path, edit.action, edit.anchor, edit.text, edit.count


def _effect(patch: Patch, new: Source) -> tuple:
    """What the patch does on the new release, its [upstreamed] probe aside (the measure is of the edits)."""
    plan = planner.plan([dataclasses.replace(patch, upstreamed=None)], new)
    return str(plan.results[0].state), tuple((c.package, c.path, c.new) for c in plan.changes)
