"""Drive a patchkit entry point on hostile input the way an attacker's input reaches it: a fresh
`python -m patchkit` under an address-space limit and a timeout. A hang, an out-of-memory, an exit 3
(internal error) or a traceback fails the test; a refusal must be exit 2 with a one-paragraph message.

Fuzz depth: hypothesis' profile `ci` (the default, a bounded run inside `nox -s tests`) or `daily`
(HYPOTHESIS_PROFILE=daily, the daily workflow's `nox -s fuzz`), registered in tests/conftest.py.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The memory bound the README's guarantees state for any one input: patchkit's own interpreter and
# imports take ~150 MB; 1.5 GiB of address space leaves room for the largest legitimate read of a kind
# (the 256 MiB member limit) and none for a 2 GiB or 8 GiB allocation.
ADDRESS_SPACE = 1536 << 20
TIMEOUT_S = 60


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _limit_memory() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_patchkit(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 timeout: float = TIMEOUT_S, address_space: bool = True, stdin: bytes | None = None) -> Outcome:
    """`patchkit ARGS` in a fresh interpreter, bounded in memory and time."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    full_env.pop("PATCHKIT_TRACEBACK", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "patchkit", *args], capture_output=True, env=full_env,
                              cwd=cwd or REPO, timeout=timeout, input=stdin,
                              preexec_fn=_limit_memory if address_space else None)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"patchkit {' '.join(args)} hung: no answer within {timeout} s") from None
    return Outcome(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


def assert_refused(outcome: Outcome, *needles: str) -> None:
    """Exit 2, a message and no traceback; each needle (a file name, a limit, a field) in the message."""
    text = outcome.output
    assert "Traceback" not in text, text[-4000:]
    assert "MemoryError" not in text, text[-4000:]
    assert outcome.code == 2, f"exit {outcome.code}, expected 2 (refused):\n{text[-4000:]}"
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text[-4000:]}"


def assert_no_crash(outcome: Outcome) -> None:
    """Any verdict but a crash: exit 0, 1 or 2, no traceback, no internal error."""
    text = outcome.output
    assert "Traceback" not in text and "internal error" not in text, text[-4000:]
    assert outcome.code in (0, 1, 2), f"exit {outcome.code}:\n{text[-4000:]}"
