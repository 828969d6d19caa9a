"""What the transaction tests share: a small real tree of the installed vLLM (the pinned release), the CLI run in-process, fault hooks.

The tree holds the real files of the installed vLLM that two one-file patches in two different
directories write (modelopt-mtp-namespace: model_executor/layers/quantization/modelopt.py; pool-topk-init:
models/glm5next/nvidia/sparse_indexer.py), with vLLM's real __init__.py and dist-info METADATA: a
multi-file, multi-directory transaction on real sources, small enough to sweep every step of.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import _installed_vllm as installed_vllm
from patchkit.cli.main import main
from patchkit.patching import fsops
from patchkit.patching.journal import JOURNAL_DIR, NEW_SUFFIX

REPO = Path(__file__).resolve().parents[1]
SERIES = ("modelopt-mtp-namespace", "pool-topk-init")
CRASH = 137


@pytest.fixture
def scratch():
    """A scratch directory on tmpfs where there is one: the sweeps fsync thousands of times, and what
    they prove (the order of steps, not the disk's speed) does not depend on the file system."""
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="patchkit-tx-", dir=shm if shm.is_dir() else None))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def small_series(dest: Path) -> Path:
    """A patch folder with just SERIES, copied from the repository's patches/."""
    dest.mkdir(parents=True)
    for patch_id in SERIES:
        shutil.copytree(REPO / "patches" / patch_id, dest / patch_id)
    (dest / "series.toml").write_text(f"series = {list(SERIES)!r}\n".replace("'", '"'))
    return dest


def real_tree(dest: Path) -> Path:
    """A site-packages-like copy of the real vLLM files the small series reads."""
    installed = installed_vllm()  # the interpreter's vLLM (the pinned release), or a failure naming why not
    files = ["__init__.py", "model_executor/layers/quantization/modelopt.py",
             "model_executor/layers/sparse_attn_indexer_kpool.py", "models/glm5next/nvidia/sparse_indexer.py"]
    for relative in files:
        if (installed / relative).is_file():
            (dest / "vllm" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(installed / relative, dest / "vllm" / relative)
    (info,) = installed.parent.glob(f"vllm-{version('vllm')}.dist-info")
    (dest / info.name).mkdir(parents=True)
    shutil.copy2(info / "METADATA", dest / info.name / "METADATA")
    return dest


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every regular file below root with its bytes (bytecode excluded)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts}


def leftovers(root: Path) -> list[str]:
    """Anything a transaction may leave behind: the journal, new copies, old-style temp files."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.name == JOURNAL_DIR or p.name.endswith((NEW_SUFFIX, ".patchkit-tmp")))


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def cli(*args) -> Result:
    """The real command line, in this process (click's runner captures the output)."""
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return Result(r.exit_code, r.stdout, r.stderr)


class Faults:
    """fsops.HOOK that counts the steps and, at step `at`, crashes the process or raises `error`."""

    def __init__(self, at: int = 0, error: int | None = None):
        self.at, self.error, self.count, self.steps = at, error, 0, []

    def __call__(self, op: str, where: str) -> None:
        self.count += 1
        self.steps.append(op)
        if self.count == self.at:
            if self.error is None:
                os._exit(CRASH)  # as abrupt as SIGKILL: no finally blocks, no clean-up
            raise OSError(self.error, f"{os.strerror(self.error)} (injected)")

    def __enter__(self) -> Faults:
        fsops.HOOK = self
        return self

    def __exit__(self, *exc) -> None:
        fsops.HOOK = None


ERRORS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "EACCES": errno.EACCES}


def count_steps(*args) -> tuple[int, Result]:
    with Faults() as faults:
        result = cli(*args)
    return faults.count, result


def crash_at(k: int, *args) -> int:
    """Run the CLI in a forked child that dies at step k; the child's exit code (CRASH if it died)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            with Faults(at=k):
                code = cli(*args).code
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
