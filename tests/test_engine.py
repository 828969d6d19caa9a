"""Every engine rule, on real files in real package trees. Anchors are whole lines, as patchkit matches them
(patching/anchors.py): each begins where a line begins."""

from __future__ import annotations

import pytest

from builders import snapshot, write_package, write_patchset
from patchkit.patching import planner
from patchkit.patching.patchset import load_patchset
from patchkit.patching.planner import State
from patchkit.patching.tree import write_plan
from patchkit.sources.directory import DirectorySource

MODEL = "def f(x):\n    y = x + 1\n    return y\n\n\ndef g():\n    return 2\n"


def setup(tmp_path, files, patches, order=None, version="0.33.0", **kw):
    root = write_package(tmp_path / "site", files, version=version)
    patchset = load_patchset(write_patchset(tmp_path / "patches", patches, order, **kw))
    return root, patchset


def apply(root, patchset, ids=None):
    source = DirectorySource(root)
    plan = planner.plan(patchset.series(ids), source)
    if plan.ok:
        write_plan(root, source, plan)
    return plan


def revert(root, patchset, ids=None):
    source = DirectorySource(root)
    plan = planner.plan(patchset.series(ids), source, mode="revert")
    if plan.ok:
        write_plan(root, source, plan)
    return plan


def edit(action, anchor, text="", **kw):
    d = {"file": "m.py", "action": action, "anchor": anchor, **kw}
    if text:
        d["text"] = text
    return d


@pytest.mark.parametrize(
    "action,anchor,text,expected",
    [
        ("replace", "    y = x + 1\n", "    y = x + 2\n", "    y = x + 2\n"),
        ("insert_before", "    return y\n", "    y *= 3\n", "    y *= 3\n    return y\n"),
        ("insert_after", "    y = x + 1\n", "    y -= 1\n", "    y = x + 1\n    y -= 1\n"),
    ],
)
def test_each_action_applies_reports_and_reverts(tmp_path, action, anchor, text, expected):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit(action, anchor, text)]})
    before = snapshot(root)
    plan = apply(root, ps)
    assert plan.ok and plan.result("p").state == State.NOT_APPLIED
    patched = (root / "vllm/m.py").read_text()
    assert expected in patched
    status = planner.plan(ps.series(), DirectorySource(root))
    assert status.result("p").state == State.APPLIED and status.changes == []
    assert revert(root, ps).result("p").state == State.APPLIED
    assert snapshot(root) == before


def test_assert_edit_checks_and_changes_nothing(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"inv": [edit("assert", "    return 2\n")]})
    plan = apply(root, ps)
    assert plan.result("inv").state == State.APPLIED and plan.changes == []
    (root / "vllm/m.py").write_text(MODEL.replace("return 2", "return 3"))
    plan = planner.plan(ps.series(), DirectorySource(root))
    assert plan.result("inv").state == State.BROKEN
    assert "invariant no longer holds" in plan.result("inv").edits[0].detail


def test_missing_anchor_names_nearest_match_with_line(tmp_path):
    drifted = MODEL.replace("    y = x + 1\n", "    y = x + 10\n")
    root, ps = setup(tmp_path, {"m.py": drifted}, {"p": [edit("replace", "    y = x + 1\n", "    y = x + 2\n")]})
    before = snapshot(root)
    plan = apply(root, ps)
    result = plan.result("p")
    assert result.state == State.BROKEN and not plan.ok and plan.changes == []
    e = result.edits[0]
    assert e.found == 0 and e.nearest is not None and e.nearest.line == 2
    assert e.nearest.similarity > 0.8
    assert "-    y = x + 1" in e.nearest.diff and "+    y = x + 10" in e.nearest.diff
    with pytest.raises(planner.PlanFailed) as failed:
        plan.raise_for_errors()
    message = str(failed.value)
    for fragment in ("patch p", "edit 1 (replace)", "vllm/m.py", "expected 1x, found 0x", "line 2"):
        assert fragment in message
    assert snapshot(root) == before


def test_anchor_found_twice_reports_both_lines(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    return", "    yield")]})
    plan = apply(root, ps)
    e = plan.result("p").edits[0]
    assert plan.result("p").state == State.BROKEN
    assert (e.found, e.lines) == (2, [3, 7])
    assert "expected 1x, found 2x at lines 3, 7" in e.detail


def test_count_two_applies_to_both(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    return", "    return  ", count=2)]})
    assert apply(root, ps).ok
    assert (root / "vllm/m.py").read_text().count("return  ") == 2


def test_partially_applied_patch_is_reported_never_completed(tmp_path):
    edits = [edit("replace", "    y = x + 1\n", "    y = x + 5\n"), edit("replace", "    return 2\n", "    return 4\n")]
    half = MODEL.replace("x + 1", "x + 5")
    root, ps = setup(tmp_path, {"m.py": half}, {"p": edits})
    before = snapshot(root)
    plan = apply(root, ps)
    assert plan.result("p").state == State.PARTIAL and not plan.ok
    assert "edits 1 applied, 2 not" in plan.result("p").detail
    assert snapshot(root) == before


def test_all_or_nothing_when_a_later_patch_breaks(tmp_path):
    patches = {"good": [edit("replace", "    y = x + 1\n", "    y = x + 5\n")], "bad": [edit("replace", "not there", "z")]}
    root, ps = setup(tmp_path, {"m.py": MODEL}, patches)
    before = snapshot(root)
    plan = apply(root, ps)
    assert plan.result("good").state == State.NOT_APPLIED and plan.result("bad").state == State.BROKEN
    assert plan.changes == [] and snapshot(root) == before


def test_later_patch_anchors_on_text_left_by_earlier(tmp_path):
    patches = {
        "first": [edit("replace", "    y = x + 1\n", "    y = x + LATER\n")],
        "second": [edit("insert_after", "    y = x + LATER\n", "    # seven\n")],
    }
    root, ps = setup(tmp_path, {"m.py": MODEL}, patches)
    assert apply(root, ps).ok
    assert "    y = x + LATER\n    # seven\n" in (root / "vllm/m.py").read_text()
    assert planner.plan(ps.series(), DirectorySource(root)).ok  # status of the applied tree reads back
    assert revert(root, ps).ok
    assert (root / "vllm/m.py").read_text() == MODEL


def test_later_patch_rewriting_an_earlier_ones_text_is_refused(tmp_path):
    patches = {"first": [edit("replace", "    y = x + 1\n", "    y = x + LATER\n")],
               "second": [edit("replace", "    y = x + LATER\n", "    y = x + 7\n")]}
    root, ps = setup(tmp_path, {"m.py": MODEL}, patches)
    before = snapshot(root)
    plan = apply(root, ps)
    assert plan.result("first").state == State.BROKEN and plan.changes == []
    assert "patch second rewrites the text of this edit" in plan.result("first").edits[0].detail
    assert snapshot(root) == before


def test_candidate_paths_exactly_one_must_exist(tmp_path):
    cand = {"files": ["nvidia/model.py", "common/model.py"], "action": "replace", "anchor": "    y = x + 1\n",
            "text": "    y = x + 2\n"}
    root, ps = setup(tmp_path, {"common/model.py": MODEL}, {"p": [cand]})
    assert apply(root, ps).ok and "x + 2" in (root / "vllm/common/model.py").read_text()

    root, ps = setup(tmp_path / "none", {"other.py": MODEL}, {"p": [cand]})
    detail = apply(root, ps).result("p").edits[0].detail
    assert "target file missing; tried: vllm/nvidia/model.py, vllm/common/model.py" in detail

    root, ps = setup(tmp_path / "both", {"nvidia/model.py": MODEL, "common/model.py": MODEL}, {"p": [cand]})
    plan = apply(root, ps)
    assert plan.result("p").state == State.BROKEN and "ambiguous target" in plan.result("p").edits[0].detail


def test_upstreamed_probe_reports_and_skips(tmp_path):
    probe = {"file": "m.py", "contains": "return 2"}
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    y = x + 1\n", "    y = x + 2\n")]}, p={"upstreamed": probe})
    plan = apply(root, ps)
    assert plan.result("p").state == State.UPSTREAMED and plan.ok and plan.changes == []


def test_out_of_range_and_not_applicable(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    y = x + 1\n", "    y = x + 2\n")]}, version="0.29.0",
                     p={"vllm": ">=0.30"})
    plan = apply(root, ps)
    assert plan.result("p").state == State.OUT_OF_RANGE and "0.29.0 not in >=0.30" in plan.result("p").detail
    fi = {"package": "flashinfer", "file": "m.py", "action": "replace", "anchor": "def g():\n", "text": "def h():\n"}
    root, ps = setup(tmp_path / "fi", {"m.py": MODEL}, {"q": [fi]}, q={"packages": {"flashinfer": ">=0.7"}})
    plan = apply(root, ps)
    assert plan.result("q").state == State.NOT_APPLICABLE and plan.ok


def test_assumed_version_overrides_a_dev_build(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    y = x + 1\n", "    y = x + 2\n")]},
                     version="0.1.dev20051+g487ecf187", p={"vllm": ">=0.30"})
    assert planner.plan(ps.series(), DirectorySource(root)).result("p").state == State.OUT_OF_RANGE
    plan = planner.plan(ps.series(), DirectorySource(root), versions={"vllm": "0.30.0"})
    assert plan.result("p").state == State.NOT_APPLIED


def test_result_that_does_not_parse_fails_the_patch(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    y = x + 1\n", "    y = (x + 1\n")]})
    before = snapshot(root)
    plan = apply(root, ps)
    assert plan.result("p").state == State.BROKEN and "no longer parses" in plan.result("p").detail
    assert snapshot(root) == before


@pytest.mark.parametrize(
    "content,needle",
    [(b"\xff\xfe bad bytes x + 1", "not UTF-8"), (MODEL.replace("\n", "\r\n").encode(), "CRLF")],
)
def test_undecodable_or_crlf_target_is_a_clear_error(tmp_path, content, needle):
    root, ps = setup(tmp_path, {"m.py": content}, {"p": [edit("replace", "    y = x + 1\n", "    y = x + 2\n")]})
    before = snapshot(root)
    plan = apply(root, ps)
    assert plan.result("p").state == State.BROKEN and needle in plan.result("p").edits[0].detail
    assert snapshot(root) == before


def test_apply_twice_changes_nothing_the_second_time(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("insert_after", "    y = x + 1\n", "    y -= 1\n")]})
    apply(root, ps)
    once = snapshot(root)
    plan = apply(root, ps)
    assert plan.ok and plan.changes == [] and snapshot(root) == once


def test_diff_is_a_unified_diff_against_the_source(tmp_path):
    root, ps = setup(tmp_path, {"m.py": MODEL}, {"p": [edit("replace", "    y = x + 1\n", "    y = x + 2\n")]})
    diff = planner.plan(ps.series(), DirectorySource(root)).diff()
    assert diff.startswith("--- a/vllm/m.py\n+++ b/vllm/m.py\n")
    assert "-    y = x + 1\n+    y = x + 2\n" in diff


def test_edit_level_versions_select_the_edit_for_each_release(tmp_path):
    edits = [
        {"files": ["old.py", "new.py"], "action": "replace", "anchor": "    y = x + 1\n", "text": "    y = x + 2\n",
         "versions": "<0.31"},
        {"files": ["old.py", "new.py"], "action": "replace", "anchor": "    return 2\n", "text": "    return 3\n",
         "versions": ">=0.31"},
    ]
    old_root, ps = setup(tmp_path / "a", {"old.py": MODEL}, {"p": edits}, version="0.30.0")
    assert apply(old_root, ps).ok and "x + 2" in (old_root / "vllm/old.py").read_text()
    assert "return 2" in (old_root / "vllm/old.py").read_text()
    new_root, ps = setup(tmp_path / "b", {"new.py": MODEL}, {"p": edits}, version="0.33.0")
    assert apply(new_root, ps).ok and "return 3" in (new_root / "vllm/new.py").read_text()
    assert "x + 1" in (new_root / "vllm/new.py").read_text()


def test_edited_inserted_lines_or_replacement_are_modified_not_pending_or_broken(tmp_path):
    """A user's change inside patched text (no marker comment to go by): read as modified, never applied
    again on top, never half-reverted; an upstream drift of a replaced anchor stays broken."""
    inserted = "    if x > 10:\n        x = 10\n    if x < -10:\n        x = -10\n"
    root, patchset = setup(tmp_path, {"m.py": MODEL}, {
        "clamp": [edit("insert_after", "def f(x):\n", inserted)],
        "two": [edit("replace", "    return 2\n", "    return 2  # two, always\n")],
    })
    assert apply(root, patchset).ok
    path = root / "vllm/m.py"
    patched = path.read_text()
    path.write_text(patched.replace("        x = 10\n", "        x = 10  # my limit\n"))
    for plan in (apply(root, patchset), revert(root, patchset)):
        result = plan.result("clamp")
        assert result.state == planner.State.MODIFIED and not plan.ok and not plan.changes
        assert "+        x = 10  # my limit" in result.edits[0].detail
    path.write_text(patched.replace("    return 2  # two, always\n", "    return 2  # two, mostly\n"))
    assert apply(root, patchset).result("two").state == planner.State.MODIFIED
    path.write_text(MODEL.replace("    return 2\n", "    return 3\n"))  # upstream changed the anchor
    assert apply(root, patchset, ["two"]).result("two").state == planner.State.BROKEN
