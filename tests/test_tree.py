"""All or nothing on disk: failures after N of M writes, and a process killed between replacements."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import pytest
from builders import snapshot, write_package, write_patchset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchkit.patching import planner, tree
from patchkit.patching.patchset import load_patchset
from patchkit.sources.directory import DirectorySource

FILES = {f"mod{i}.py": f"VALUE_{i} = {i}\n\n\ndef f{i}():\n    return VALUE_{i}\n" for i in range(4)}


def four_file_series(tmp_path):
    root = write_package(tmp_path / "site", FILES)
    edits = [{"file": f"mod{i}.py", "action": "replace", "anchor": f"VALUE_{i} = {i}\n", "text": f"VALUE_{i} = {i + 100}\n"}
             for i in range(4)]
    patchset = load_patchset(write_patchset(tmp_path / "patches", {"four": edits}))
    return root, patchset


def planned_writes(root, patchset):
    source = DirectorySource(root)
    plan = planner.plan(patchset.series(), source)
    assert plan.ok and len(plan.changes) == 4
    return [(source.package_root(c.package) / c.path, c) for c in plan.changes]


@contextmanager
def disk_full(monkeypatch, fails):
    """File replacements raise ENOSPC when fails(n) is true for the n-th call; the block must raise it."""
    real_replace, calls = tree.replace_file, {"n": 0}

    def replace(path, data):
        calls["n"] += 1
        if fails(calls["n"]):
            raise OSError(28, "No space left on device (injected)")
        real_replace(path, data)

    monkeypatch.setattr(tree, "replace_file", replace)
    with pytest.raises(OSError, match="injected"):
        yield
    monkeypatch.setattr(tree, "replace_file", real_replace)


@pytest.mark.parametrize("fail_after", range(4))  # N of M = 4 writes done before the fault
def test_error_after_n_of_m_writes_leaves_tree_identical(tmp_path, monkeypatch, fail_after):
    root, patchset = four_file_series(tmp_path)
    before = snapshot(root)
    writes = planned_writes(root, patchset)
    # one fault after N writes; the rollback's own writes then succeed
    with disk_full(monkeypatch, lambda n: n == fail_after + 1):
        tree.write_changes(root, writes)
    assert snapshot(root) == before
    assert not (root / tree.JOURNAL_DIR).exists()


def test_rollback_that_fails_too_leaves_a_journal_the_next_run_repairs(tmp_path, monkeypatch):
    root, patchset = four_file_series(tmp_path)
    before = snapshot(root)
    writes = planned_writes(root, patchset)
    with disk_full(monkeypatch, lambda n: n >= 3):  # the disk stays full: the rollback fails as well
        tree.write_changes(root, writes)
    assert (root / tree.JOURNAL_DIR).exists()
    assert len(tree.recover(root).rolled_back) == 2
    assert snapshot(root) == before


KILLER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from patchkit.patching import planner, tree
    from patchkit.patching.patchset import load_patchset
    from patchkit.sources.directory import DirectorySource

    root, patches, kill_after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    real, calls = os.replace, {"n": 0}

    def dying_replace(src, dst):
        real(src, dst)
        if str(dst).endswith(".py"):
            calls["n"] += 1
            if calls["n"] == kill_after:
                os._exit(137)  # as abrupt as SIGKILL: no cleanup, no finally blocks

    os.replace = dying_replace
    source = DirectorySource(root)
    plan = planner.plan(load_patchset(patches).series(), source)
    tree.write_plan(root, source, plan)
    """
)


@pytest.mark.parametrize("kill_after", [1, 2, 3])
def test_process_killed_between_replacements_is_repaired_by_next_run(tmp_path, kill_after):
    root, patchset = four_file_series(tmp_path)
    before = snapshot(root)
    proc = subprocess.run([sys.executable, "-c", KILLER, str(root), str(patchset.folder), str(kill_after)],
                          capture_output=True, text=True)
    assert proc.returncode == 137, proc.stderr
    half = snapshot(root)
    changed = [k for k in before if k in half and half[k] != before[k]]
    assert len(changed) == kill_after  # really half-patched on disk
    assert (root / tree.JOURNAL_DIR / "journal.json").exists()

    # The next CLI run on that target recovers first, then does its own job.
    cli = subprocess.run([sys.executable, "-m", "patchkit", "status", "--target", str(root),
                          "--patches", str(patchset.folder), "--json"], capture_output=True, text=True)
    assert "rolled back" in cli.stderr and cli.returncode == 0, cli.stderr
    assert {k: v for k, v in snapshot(root).items() if not k.startswith(tree.JOURNAL_DIR)} == before
    assert not (root / tree.JOURNAL_DIR).exists()


def test_recovery_refuses_a_file_changed_by_someone_else(tmp_path):
    root, patchset = four_file_series(tmp_path)
    writes = planned_writes(root, patchset)
    tree._write_journal(root / tree.JOURNAL_DIR, writes)
    writes[0][0].write_text("edited by hand\n")
    with pytest.raises(Exception, match="neither its pre-run nor its patched content"):
        tree.recover(root)
    assert (root / tree.JOURNAL_DIR).exists()  # kept for a person to look at


def test_mode_is_kept_and_stale_bytecode_dropped(tmp_path):
    root, patchset = four_file_series(tmp_path)
    target = root / "vllm/mod0.py"
    os.chmod(target, 0o751)
    cache = root / "vllm/__pycache__"
    cache.mkdir()
    (cache / "mod0.cpython-311.pyc").write_bytes(b"stale")
    (cache / "mod1x.cpython-311.pyc").write_bytes(b"other module")
    tree.write_changes(root, planned_writes(root, patchset))
    assert target.stat().st_mode & 0o777 == 0o751
    assert not (cache / "mod0.cpython-311.pyc").exists() and (cache / "mod1x.cpython-311.pyc").exists()


def test_file_changed_after_planning_is_not_overwritten(tmp_path):
    root, patchset = four_file_series(tmp_path)
    writes = planned_writes(root, patchset)
    writes[2][0].write_text("someone else\n")
    before = snapshot(root)
    with pytest.raises(Exception, match="changed since it was read"):
        tree.write_changes(root, writes)
    assert snapshot(root) == before


# -- properties: on generated texts, anchors and edit lists --------------------------------------

LINE = st.builds(lambda head, tail: head + tail + "\n", st.sampled_from("abcdefgh"),
                 st.text(alphabet="abcdefgh =+()", max_size=12))  # whitespace-only anchors are refused


@st.composite
def texts_and_edits(draw):
    lines = draw(st.lists(LINE, min_size=2, max_size=30, unique=True))
    n = draw(st.integers(1, min(5, len(lines))))
    picks = draw(st.lists(st.sampled_from(range(len(lines))), min_size=n, max_size=n, unique=True))
    edits = []
    for i, idx in enumerate(sorted(picks)):
        action = draw(st.sampled_from(["replace", "insert_before", "insert_after"]))
        # Upper-case markers share no character with the lower-case lines: no text can hold an anchor.
        marker = f"PATCHED {i} {action.upper()}\n"
        edits.append({"file": "gen.txt", "action": action, "anchor": lines[idx], "text": marker})
    return "".join(lines), edits


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=texts_and_edits())
def test_property_revert_after_apply_is_identity_and_apply_is_idempotent(tmp_path_factory, case):
    text, edits = case
    tmp = tmp_path_factory.mktemp("prop")
    # Anchors must be exact-count 1: skip texts where a chosen line also occurs inside another line.
    if any(text.count(e["anchor"]) != 1 for e in edits):
        return
    root = write_package(tmp / "site", {"gen.txt": text})
    patchset = load_patchset(write_patchset(tmp / "patches", {"gen": edits}))
    before = snapshot(root)

    def run(mode):
        source = DirectorySource(root)
        plan = planner.plan(patchset.series(), source, mode=mode)
        assert plan.ok, [r.describe() for r in plan.results]
        tree.write_plan(root, source, plan)
        return plan

    assert run("apply").changes
    once = snapshot(root)
    assert run("apply").changes == [] and snapshot(root) == once
    run("revert")
    assert snapshot(root) == before
