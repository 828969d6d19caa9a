"""A host tool run bounded in time and in output: what it prints is read up to a kind's limit (untrusted),
and at its timeout the tool is killed with its whole process group (it runs in a session of its own, so
what it started, nvcc's cicc and ptxas or ssh's children, goes with it). `run_to_files` is the same run
for a tool whose output goes to files (a log of any length, pytest's; a worker's answer and its stderr):
pytest-xdist's workers and vLLM's engine processes go with the tool at its timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from patchkit.untrusted import read_stream

ERRORS_KEPT = 4096  # of a separate stderr, the first bytes: enough for a tool's own error line


@dataclass(frozen=True)
class Finished:
    """How a tool ended: `code` its exit status (negative: killed by that signal), `timed_out` whether the
    timeout killed it, `output` what it printed (stderr too unless kept apart), `errors` the head of a
    stderr kept apart."""

    code: int
    timed_out: bool
    output: bytes
    errors: bytes = b""


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s process group (gone already: nothing to do)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def run_bounded(argv: Sequence[str], *, timeout: float, kind: str, what: str, cwd: Path | str | None = None,
                stderr_apart: bool = False) -> Finished:
    """Run `argv` (stdin closed), reading at most `kind`'s limit of what it prints (InputTooLarge past it,
    the tool killed); its process group killed at `timeout` seconds. `what` names the output in errors.
    Starting it may raise OSError (FileNotFoundError: no such tool), the caller's to word."""
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a chatty stderr cannot stall the read
        proc = subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=errors if stderr_apart else subprocess.STDOUT, start_new_session=True)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            kill_group(proc)

        stdout = proc.stdout
        assert stdout is not None  # stdout=PIPE
        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            data = read_stream(stdout, kind, what)
        except BaseException:
            kill_group(proc)
            raise
        finally:
            timer.cancel()
            stdout.close()
            proc.wait()
        errors.seek(0)
        return Finished(proc.returncode, expired.is_set(), data, errors.read(ERRORS_KEPT))


def run_to_files(argv: Sequence[str], *, timeout: float, stdout: IO[bytes], stderr: IO[bytes] | None = None,
                 cwd: Path | str | None = None, env: Mapping[str, str] | None = None) -> Finished:
    """Run `argv` (stdin closed), what it prints written to the file `stdout` (stderr too unless `stderr`
    is given); its process group killed at `timeout` seconds, or when this wait is interrupted (Ctrl-C).
    `output` is empty: it is in the files. Starting it may raise OSError, the caller's to word."""
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT if stderr is None else stderr, start_new_session=True)
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.returncode is None:  # timed out, or this wait interrupted
            kill_group(proc)
            proc.wait()
    return Finished(proc.returncode, timed_out, b"")


def written_text(file: IO[bytes]) -> str:
    """What a run wrote to `file` (run_to_files), read back whole as text, undecodable bytes replaced."""
    file.seek(0)
    return file.read().decode("utf-8", "replace")


@dataclass(frozen=True)
class Captured:
    """How a tool run by `run_captured` ended, what it printed as text (`errors`: its stderr, when kept apart)."""

    code: int
    timed_out: bool
    output: str
    errors: str = ""


def run_captured(argv: Sequence[str], *, timeout: float, cwd: Path | str | None = None,
                 env: Mapping[str, str] | None = None, stderr_apart: bool = False) -> Captured:
    """`run_to_files` into temporary files, read back whole: for patchkit's own tools (pytest, its smoke
    worker, the in-image Python), whose every line a failure report may need, where run_bounded keeps a
    limit's worth. Its process group is killed at `timeout` as run_to_files' is."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        finished = run_to_files(argv, timeout=timeout, stdout=out, stderr=err if stderr_apart else None, cwd=cwd,
                                env=env)
        return Captured(finished.code, finished.timed_out, written_text(out), written_text(err) if stderr_apart else "")
