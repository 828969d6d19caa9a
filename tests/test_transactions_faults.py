"""The fault sweep, as SQLite tests its pager: every step of apply, revert and recovery, crashed or failed.

Each filesystem step of the write path goes through patchkit.patching.fsops, so the count is exact. For
every k: the command dies at step k (os._exit in a forked child, as abrupt as SIGKILL), or step k raises
EIO, ENOSPC or EACCES. After the next command the real vLLM files are byte-identical to before or to
fully patched, no new copy and no journal is left, and every failed command exited 1 or 2 with a message
(a one-off I/O error is even settled by the failing command itself).
Recovery is swept the same way from every crashed state apply can leave.
"""

from __future__ import annotations

import shutil

import pytest

import transactions
from transactions import (
    CRASH,
    ERRORS,
    Faults,
    cli,
    count_steps,
    crash_at,
    leftovers,
    real_tree,
    small_series,
    tree_bytes,
)

scratch = transactions.scratch  # the fixture, by the name tests ask for


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The pristine tree, the same tree fully patched, and the series; each test works on copies."""
    base = tmp_path_factory.mktemp("world")
    patches = small_series(base / "patches")
    before = real_tree(base / "before")
    after = base / "after"
    shutil.copytree(before, after)
    assert cli("apply", "--target", after, "--patches", patches).code == 0
    states = {"before": tree_bytes(before), "after": tree_bytes(after)}
    assert states["before"] != states["after"]
    changed = [k for k in states["before"] if states["before"][k] != states["after"][k]]
    assert len(changed) == 2 and len({k.rsplit("/", 1)[0] for k in changed}) == 2  # two files, two directories
    return base, patches, states


def fresh(world, scratch, state: str):
    base, patches, _ = world
    root = scratch / "site"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base / state, root)
    return root, patches


def settled(world, root, allowed=("before", "after")) -> str:
    """Which whole state the tree is in; fails on anything in between or any leftover."""
    _, _, states = world
    assert leftovers(root) == []
    now = tree_bytes(root)
    matches = [name for name in allowed if states[name] == now]
    assert matches, f"tree is neither {' nor '.join(allowed)}: {sorted(k for k in now if now[k] != states['before'].get(k))}"
    return matches[0]


def steps(world, scratch, command: str, start: str) -> int:
    root, patches = fresh(world, scratch, start)
    n, result = count_steps(command, "--target", root, "--patches", patches)
    assert result.code == 0, result.stderr
    return n


COMMANDS = [("apply", "before", "after"), ("revert", "after", "before")]


@pytest.mark.parametrize("command,start,done", COMMANDS)
def test_crash_at_every_step_then_the_next_command_settles_the_tree(world, scratch, command, start, done):
    n = steps(world, scratch, command, start)
    assert n >= 25  # journal, two new copies, commit, two renames, clean-up: each with its fsyncs
    outcomes = set()
    for k in range(1, n + 1):
        root, patches = fresh(world, scratch, start)
        assert crash_at(k, command, "--target", root, "--patches", patches) == CRASH
        after = cli("status", "--target", root, "--patches", patches)
        assert after.code == 0, (k, after.stderr)
        outcomes.add(settled(world, root, (start, done)))
    assert outcomes == {start, done}  # crashes before the commit undo, after it finish
    root, patches = fresh(world, scratch, start)
    assert crash_at(n + 1, command, "--target", root, "--patches", patches) == 0  # the sweep covered every step


@pytest.mark.parametrize("error", sorted(ERRORS))
@pytest.mark.parametrize("command,start,done", COMMANDS)
def test_io_error_at_every_step_fails_with_exit_2_and_the_next_command_settles(world, scratch, command, start,
                                                                                done, error):
    n = steps(world, scratch, command, start)
    for k in range(1, n + 1):
        root, patches = fresh(world, scratch, start)
        with Faults(at=k, error=ERRORS[error]):
            failed = cli(command, "--target", root, "--patches", patches)
        assert failed.code == 2, (k, failed.stdout, failed.stderr)
        assert "(injected)" in failed.stderr and str(root) in failed.stderr and "Traceback" not in failed.stderr
        # a one-off fault is settled by the failing command itself, which says which way it went
        outcome = settled(world, root, (start, done))
        assert ("No file was changed" if outcome == start else "every file is new") in failed.stderr, failed.stderr
        nxt = cli("status", "--target", root, "--patches", patches)
        assert nxt.code == 0, (k, nxt.stderr)
        settled(world, root, (start, done))


def crashed_states(world, scratch):
    """Every distinct on-disk state a crashed apply leaves (journal and all), once each."""
    root, patches = fresh(world, scratch, "before")
    n, _ = count_steps("apply", "--target", root, "--patches", patches)
    seen = set()
    for k in range(1, n + 1):
        root, patches = fresh(world, scratch, "before")
        assert crash_at(k, "apply", "--target", root, "--patches", patches) == CRASH
        state = tuple(tree_bytes(root).items())
        if state not in seen:
            seen.add(state)
            keep = scratch / f"crashed-{k}"
            shutil.copytree(root, keep, symlinks=True)
            yield k, keep


def test_crash_or_io_error_at_every_step_of_recovery_is_finished_by_the_next_command(world, scratch):
    """A crash at step j of recovery, and separately EIO at step j (recovery's error path does not depend
    on which error it met): the next command finishes the recovery and then does its own job."""
    _, patches, _ = world
    work = scratch / "work"

    def reset(crashed):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(crashed, work, symlinks=True)

    swept = 0
    for k, crashed in crashed_states(world, scratch):
        reset(crashed)
        r, result = count_steps("status", "--target", work, "--patches", patches)
        assert result.code == 0, (k, result.stderr)
        settled(world, work)
        for j in range(1, r + 1):
            reset(crashed)
            assert crash_at(j, "status", "--target", work, "--patches", patches) == CRASH
            nxt = cli("apply", "--target", work, "--patches", patches)
            assert nxt.code == 0, (k, j, nxt.stderr)
            assert settled(world, work) == "after"
            reset(crashed)
            with Faults(at=j, error=ERRORS["EIO"]):
                failed = cli("status", "--target", work, "--patches", patches)
            assert failed.code == 2 and "(injected)" in failed.stderr, (k, j, failed.stderr)
            assert cli("status", "--target", work, "--patches", patches).code == 0
            settled(world, work)
            swept += 1
    assert swept > 50
