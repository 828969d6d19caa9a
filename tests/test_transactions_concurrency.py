"""Real processes against one target: many at once, and a randomized SIGKILL loop.

Concurrent apply / revert / status runs on one small real vLLM 0.33.0 tree must serialise on the target's
lock: every run exits 0, every status sees the whole series applied or none of it, and the tree ends
before or fully patched with nothing left behind. The kill loop SIGKILLs apply and revert at random
moments (half of them timed from the journal's appearance, so they land inside the write window); the
next command must settle the tree. PATCHKIT_KILL_TRIALS sets the trials (`nox -s killloop`: 1,000),
PATCHKIT_KILL_SEED replays a run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

import transactions
from patchkit.patching.journal import JOURNAL_DIR
from patchkit.patching.tree import open_target
from transactions import leftovers, real_tree, small_series, tree_bytes

scratch = transactions.scratch  # the fixture, by the name tests ask for


@pytest.fixture
def target(scratch):
    patches = small_series(scratch / "patches")
    root = real_tree(scratch / "site")
    before = tree_bytes(root)
    after_root = scratch / "after"
    shutil.copytree(root, after_root)
    assert run("apply", after_root, patches).returncode == 0
    return root, patches, {"before": before, "after": tree_bytes(after_root)}


def start(command, root, patches, *extra):
    return subprocess.Popen([sys.executable, "-m", "patchkit", command, "--target", str(root), "--patches",
                             str(patches), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(command, root, patches, *extra):
    proc = start(command, root, patches, *extra)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def whole(states, root) -> str:
    assert leftovers(root) == []
    now = tree_bytes(root)
    found = [name for name, content in states.items() if content == now]
    assert found, "the tree is neither before nor fully patched"
    return found[0]


def test_many_parallel_runs_on_one_target_serialise(target):
    root, patches, states = target
    commands = ["apply", "status", "revert", "status"] * 4
    procs = [start(c, root, patches, "--json", "--wait", "240") for c in commands]
    seen = []
    for command, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (command, err)
        assert "interrupted" not in err  # no run ever saw another's unfinished work
        report = json.loads(out)
        states_seen = {p["state"] for p in report["patches"]}
        if command == "status":
            assert states_seen in ({"applied"}, {"not-applied"}), states_seen  # never partial
        seen.append(states_seen)
    whole(states, root)


def test_a_run_that_cannot_get_the_lock_in_time_exits_2_naming_the_holder(target):
    root, patches, states = target
    with open_target(root):
        r = run("status", root, patches, "--wait", "0.3", "--json")
    assert r.returncode == 2 and f"pid {os.getpid()}" in r.stderr and "locked by another patchkit run" in r.stderr
    assert json.loads(r.stdout)["error"]["exit_code"] == 2
    whole(states, root)


def kill_trial(rng: random.Random, root, patches) -> None:
    command = "apply" if whole_state(root) == "before" else "revert"
    proc = start(command, root, patches)
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0, 1.2))  # anywhere in the run, start-up included
    else:
        deadline = time.monotonic() + 10
        while not (root / JOURNAL_DIR).exists() and proc.poll() is None and time.monotonic() < deadline:
            pass  # spin: the write window is a few milliseconds
        time.sleep(rng.uniform(0, 0.01))
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


STATES: dict = {}


def whole_state(root) -> str:
    return next((name for name, content in STATES.items() if content == tree_bytes(root)), "half")


def test_randomized_kill_loop(target):
    root, patches, states = target
    STATES.clear()
    STATES.update(states)
    trials = int(os.environ.get("PATCHKIT_KILL_TRIALS", "24"))
    seed = int(os.environ.get("PATCHKIT_KILL_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    journals = 0
    for trial in range(trials):
        kill_trial(rng, root, patches)
        journals += (root / JOURNAL_DIR).exists()
        nxt = run("status", root, patches)
        assert nxt.returncode == 0, f"seed {seed} trial {trial}: {nxt.stderr}"
        assert leftovers(root) == [], f"seed {seed} trial {trial}"
        assert whole_state(root) in states, f"seed {seed} trial {trial}: tree half-patched after recovery"
    print(f"kill loop: {trials} trials, seed {seed}, {journals} killed inside the write window")
