"""Every shell block of the README, run as a newcomer runs it: in a fresh copy of this checkout, in a
fresh virtual environment, in the README's order, after the README's own set-up block.

Each block is marked on the line before its fence:
  <!-- readme: run -->                 run here, must exit 0
  <!-- readme: skip: REASON -->        not runnable here (a DGX Spark, a registry login); REASON is printed
An unmarked block fails the test, so a new block cannot silently go untested.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<marker>[^\n]*)\n```sh\n(?P<body>.*?)^```$", re.M | re.S)
MARKER = re.compile(r"^<!-- readme: (?P<kind>run|skip)(?:: (?P<reason>.+?))? -->$")


def readme_blocks(text: str) -> list[tuple[int, str, str | None, str]]:
    """(line, kind, reason, body) for each ```sh block, kind None when unmarked."""
    blocks = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start("body"))
        marker = MARKER.match(m.group("marker").strip())
        kind, reason = (marker.group("kind"), marker.group("reason")) if marker else (None, None)
        blocks.append((line, kind, reason, m.group("body")))
    return blocks


BLOCKS = readme_blocks((REPO / "README.md").read_text())


def test_every_block_is_marked():
    unmarked = [line for line, kind, _, _ in BLOCKS if kind is None]
    assert not unmarked, f"README shell blocks without a '<!-- readme: run|skip: why -->' line: lines {unmarked}"
    assert all(reason for _, kind, reason, _ in BLOCKS if kind == "skip"), "a skipped block must say why"


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory) -> dict:
    """A copy of the checkout as a clean git repository, and a fresh venv first on PATH."""
    root = tmp_path_factory.mktemp("newcomer")
    clone = root / "patchkit"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / name)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=newcomer", "-c", "user.email=n@example.invalid",
                                                 "commit", "-q", "-m", "clone"]):
        subprocess.run(["git", *args], cwd=clone, check=True)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "NOX", "PATCHKIT_"))}
    env["PATH"] = f"{root / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(root / "venv")
    return {"cwd": clone, "env": env}


@pytest.mark.parametrize("line,kind,reason,body", BLOCKS, ids=[f"README.md:{b[0]}" for b in BLOCKS])
def test_block_runs_as_written(newcomer, line, kind, reason, body):
    if kind != "run":
        pytest.skip(f"README.md:{line}: {reason}")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=newcomer["cwd"], env=newcomer["env"],
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, (f"README.md:{line} exited {proc.returncode}\n$ {body}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
