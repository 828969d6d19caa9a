"""Which patch fixes which finding is the patch's own `fixes` (patch.toml), checked both ways against the
real series: every boot-log cause (bootlog/causes.py) and serving finding (smoke/serving.py) whose fix
names patches has patches declaring it, and prints their ids; every `fixes` entry names a finding that
exists and is printed with its patches. Renaming a cause or a finding without its patch.toml entries,
or dropping an entry, fails here; a renamed patch carries its `fixes` with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patchkit.bootlog.causes import CAUSE, CAUSES, FIXED_BY, find_causes
from patchkit.patching.fixed_by import PATCHES, fixed_by
from patchkit.patching.patchset import InvalidPatchFile, PatchSet, load_patchset
from patchkit.smoke import serving
from patchkit.smoke.serving import PATCHED_FINDINGS, judge_completion
from patchkit.tomlschema import InvalidDefinition

# A response that shows each serving finding a patch fixes: probe and body.
SHOWN_BY = {
    serving.THINK_TAGS_IN_CONTENT: ("enable-thinking-false", {"choices": [{"message": {
        "content": "17*23 = 391</think>391"}, "finish_reason": "stop"}]}),
    serving.REASONING_SWALLOWED_ANSWER: ("enable-thinking-false", {"choices": [{"message": {
        "content": None, "reasoning_content": "391"}, "finish_reason": "stop"}]}),
    serving.THINK_TAGS_IN_TOOL_ARGUMENTS: ("tool-call", {"choices": [{"message": {"content": None, "tool_calls": [
        {"function": {"name": "get_weather", "arguments": '{"city": "Paris</think>"}'}}]}, "finish_reason": "tool_calls"}]}),
}


def declared_by_cause() -> set[str]:
    return {c.name for c in CAUSES if c.names_patches}


def unknown_fixes(patchset: PatchSet) -> dict[str, list[str]]:
    """patch id -> the `fixes` entries that name no boot-log cause and no serving finding."""
    known = set(CAUSE) | set(PATCHED_FINDINGS)
    found = {p.id: [f for f in p.fixes if f not in known] for p in patchset.series()}
    return {i: names for i, names in found.items() if names}


def unfixed(patchset: PatchSet) -> list[str]:
    """The findings printed with their patches that no patch of `patchset` declares."""
    return [name for name in sorted(declared_by_cause() | set(PATCHED_FINDINGS)) if not patchset.fixing(name)]


def test_every_fixes_entry_names_a_finding_printed_with_its_patches():
    patchset = load_patchset(PATCHES)
    assert unknown_fixes(patchset) == {}
    declared = {f for p in patchset.series() for f in p.fixes}
    # A cause a patch fixes says so in its fix text; a serving one is among the findings that print patches.
    assert declared <= declared_by_cause() | set(PATCHED_FINDINGS)
    assert declared_by_cause() == {"missing-weight-scale", "weight-scale-never-loaded"}


def test_every_finding_that_names_patches_has_patches_declaring_it():
    assert unfixed(load_patchset(PATCHES)) == []


@pytest.mark.parametrize("cause", sorted(declared_by_cause()))
def test_a_cause_prints_the_patches_that_declare_it(cause):
    [found] = [f for f in find_causes(CAUSE[cause].sample) if f.cause == cause]
    ids = load_patchset(PATCHES).fixing(cause)
    assert ids and f"({', '.join(ids)})" in found.fix and FIXED_BY not in found.fix


def test_the_cause_texts_are_those_of_the_real_series():
    assert fixed_by("missing-weight-scale") == "modelopt-mtp-namespace, packed-modules-4p67"
    assert fixed_by("weight-scale-never-loaded") == "packed-modules-4p67"


def test_each_serving_finding_a_patch_fixes_prints_its_patches():
    assert set(SHOWN_BY) == set(PATCHED_FINDINGS), "show each patched serving finding in SHOWN_BY"
    patchset = load_patchset(PATCHES)
    for name, (probe, body) in SHOWN_BY.items():
        check = judge_completion(json.dumps(body).encode(), probe, name)
        details = [f.detail for f in check.findings if f.level == "fail"]
        ids = patchset.fixing(name)
        assert ids and any(f"; patch {', '.join(ids)})" in d for d in details), (name, details)
    assert {n: patchset.fixing(n) for n in PATCHED_FINDINGS} == {
        "think-tags-in-content": ("glm53-always-think",), "reasoning-swallowed-answer": ("glm53-skipped-thinking",),
        "think-tags-in-tool-arguments": ("glm47-tool-args-think-end",)}


def patches_copy(tmp_path: Path, patch: str, old: str, new: str) -> Path:
    folder = tmp_path / "patches"
    shutil.copytree(PATCHES, folder)
    path = folder / patch / "patch.toml"
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    return folder


def test_a_renamed_cause_or_a_dropped_entry_is_caught(tmp_path):
    """What the two checks above see when a `fixes` entry names a cause under its old name, or is gone."""
    renamed = load_patchset(patches_copy(tmp_path / "a", "modelopt-mtp-namespace", '"missing-weight-scale"',
                                         '"missing-scale"'))
    assert unknown_fixes(renamed) == {"modelopt-mtp-namespace": ["missing-scale"]}
    dropped = load_patchset(patches_copy(tmp_path / "b", "glm53-always-think", 'fixes = ["think-tags-in-content"]\n', ""))
    assert unfixed(dropped) == ["think-tags-in-content"]


def test_the_schema_refuses_a_bad_fixes_entry(tmp_path):
    twice = patches_copy(tmp_path / "a", "packed-modules-4p67", '"weight-scale-never-loaded"]', '"missing-weight-scale"]')
    with pytest.raises(InvalidPatchFile) as info:
        load_patchset(twice)
    err = info.value
    assert (Path(err.path).parent.name, err.at, err.problem) == ("packed-modules-4p67", "key 'fixes'", "duplicate-fix")
    assert "'missing-weight-scale'" in err.detail
    prose = patches_copy(tmp_path / "b", "glm53-skipped-thinking", '"reasoning-swallowed-answer"', '"the answer as reasoning"')
    with pytest.raises(InvalidDefinition) as bad:
        load_patchset(prose)
    assert bad.value.problem == "value" and "fixes" in str(bad.value)
