"""A timed-out tool goes with everything it started (patchkit.bounded_process): real processes, a child
that starts a grandchild which sleeps, timed out, and the grandchild looked up in /proc afterwards. A
plain `subprocess.run(..., timeout=)` kills only the child, which left pytest-xdist's workers and vLLM's
engine processes running; each caller that runs a tool under a timeout is checked here through its own
entry point, with its own error kind and words for the timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from patchkit.bounded_process import run_bounded, run_to_files, written_text

# Starts a grandchild that sleeps, writes its pid (and the child's own) to PIDS, then sleeps itself.
PARENT_OF_A_SLEEPER = """
import os, subprocess, sys, time
sleeper = subprocess.Popen(["sleep", "300"])
with open(os.environ["PIDS"], "w") as f:
    f.write(f"{os.getpid()} {sleeper.pid}")
print("started", flush=True)
time.sleep(300)
"""


def _pids(path: Path) -> list[int]:
    assert path.is_file(), "the child never started its grandchild before the timeout"
    return [int(p) for p in path.read_text().split()]


def _alive(pid: int) -> bool:
    """Running (a zombie is not: killed, waiting for a parent that may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def assert_gone(pids: list[int], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:  # leave nothing behind whatever the verdict
        os.kill(p, signal.SIGKILL)
    assert not left, f"still running after the timeout: {left}"


@pytest.fixture
def pids(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(path))
    return path


def test_run_to_files_kills_the_whole_group_at_the_timeout(pids):
    with tempfile.TemporaryFile() as out:
        finished = run_to_files([sys.executable, "-c", PARENT_OF_A_SLEEPER], timeout=3, stdout=out)
        assert finished.timed_out and finished.code == -signal.SIGKILL
        assert written_text(out) == "started\n"
    assert_gone(_pids(pids))


def test_run_to_files_keeps_stderr_apart_and_the_exit_status(tmp_path):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        finished = run_to_files([sys.executable, "-c", "import sys; print('out'); sys.exit('err')"], timeout=30,
                                stdout=out, stderr=err, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
        assert (finished.code, finished.timed_out, written_text(out), written_text(err)) == (1, False, "out\n", "err\n")


def test_run_bounded_kills_the_whole_group_at_the_timeout(pids):
    finished = run_bounded([sys.executable, "-c", PARENT_OF_A_SLEEPER], timeout=3, kind="tool-output", what="a test")
    assert finished.timed_out and finished.output == b"started\n"
    assert_gone(_pids(pids))


def test_a_plain_subprocess_run_leaves_the_grandchild(pids):
    """The failure the callers had: what this file guards against is real here."""
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", PARENT_OF_A_SLEEPER], timeout=3, capture_output=True)
    _, grandchild = _pids(pids)
    assert _alive(grandchild)
    os.kill(grandchild, signal.SIGKILL)


SLEEPING_TEST = f"""
import os, subprocess, sys
def test_sleeps():
    exec({PARENT_OF_A_SLEEPER!r})
"""


def test_gate_run_kills_pytest_and_its_xdist_workers_at_the_timeout(tmp_path, pids, monkeypatch):
    from patchkit.gate import run as gate_run

    ws = gate_run.Workspace(tmp_path / "ws", "0.34.0")
    ws.tests_root.mkdir(parents=True)
    (ws.tests_root / "test_sleeps.py").write_text(SLEEPING_TEST)
    monkeypatch.setattr(gate_run, "RUN_TIMEOUT_S", 15)
    with pytest.raises(gate_run.GateRunFailed) as failed:
        gate_run.run_tests(ws, tmp_path, "stock", ["test_sleeps.py"], workers=2)
    log = ws.root / "logs" / "stock.log"
    assert str(failed.value) == f"vLLM's tests on the stock tree: did not finish in 15 s (log: {log})"
    assert_gone(_pids(pids))  # the xdist worker that ran the test, and the test's own grandchild


def test_rebase_behaviour_tests_are_killed_whole_at_the_timeout(tmp_path, pids):
    from patchkit.patching.rebase.checks import run_behaviour_tests

    tests = tmp_path / "tests"
    (tests / "patches").mkdir(parents=True)
    (tests / "patches" / "test_some_patch.py").write_text(SLEEPING_TEST)
    [run] = run_behaviour_tests(["some-patch"], tmp_path / "patches", Path(sys.executable), tests, timeout=10)
    assert (run.returncode, run.tail) == (124, "timed out after 10 s")
    assert_gone(_pids(pids))


def test_the_quantprobe_worker_is_killed_whole_at_the_timeout(tmp_path, pids):
    """The worker's interpreter is whatever the caller names: here a stand-in that starts a sleeper."""
    from patchkit.smoke.quantprobe import WorkerFailed, run_worker

    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{PARENT_OF_A_SLEEPER}")
    python.chmod(0o755)
    with pytest.raises(WorkerFailed) as failed:
        run_worker(str(python), ["probe", "jobs.json"], [tmp_path], 3)
    assert (failed.value.worker, failed.value.code, failed.value.timeout) == ("probe", None, 3)
    assert str(failed.value).startswith(f"smoke worker probe ({python}) did not finish within 3 s")
    assert_gone(_pids(pids))


def test_a_quantprobe_worker_that_fails_is_reported_with_its_exit_and_its_stderrs_end(tmp_path):
    """The worker's interpreter is a hand-written stand-in that fails as a worker does: exit 3 after a long
    stderr whose end says why."""
    from patchkit.smoke.quantprobe import ERRORS_SHOWN, WorkerFailed, run_worker

    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('x' * 5000 + 'ValueError: the end')\nsys.exit(3)\n")
    python.chmod(0o755)
    with pytest.raises(WorkerFailed) as failed:
        run_worker(str(python), ["pack", "dir", "lab"], [tmp_path], 30)
    assert (failed.value.worker, failed.value.code) == ("pack", 3)
    assert failed.value.errors.endswith("ValueError: the end") and len(failed.value.errors) == ERRORS_SHOWN
    assert str(failed.value).startswith(f"smoke worker pack ({python}) failed (exit 3):\n")


def test_a_command_inside_an_image_root_is_killed_whole_at_the_timeout(tmp_path):
    """run_inside's chroot, with a static busybox for the image's root (root only, as the proof runs)."""
    from patchkit.smoke.image_rootfs import RootfsError, run_inside

    busybox = Path("/bin/busybox")
    if os.geteuid() != 0 or not busybox.is_file():
        pytest.skip("needs root and a static /bin/busybox (the proof's own runner is root only)")
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "busybox").write_bytes(busybox.read_bytes())
    (root / "bin" / "busybox").chmod(0o755)
    said = run_inside(root, ["/bin/busybox", "sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (said.returncode, said.stdout, said.stderr) == (3, "out\n", "err\n")
    sleeper = "/bin/busybox sleep 300 & echo $$ $! > /pids; /bin/busybox sleep 300"
    with pytest.raises(RootfsError) as failed:
        run_inside(root, ["/bin/busybox", "sh", "-c", sleeper], timeout=3)
    assert str(failed.value).endswith("ran past 3 s")
    assert_gone(_pids(root / "pids"))
