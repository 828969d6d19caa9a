"""One gate run on the installed vLLM release: its sdist's tests on the stock and the patched copy.

The trees are hard-linked copies of the installed package (patching/copies.py), the stock one with no
patch, so the two differ only by the series. The sdist's tests/ and pyproject.toml are laid out in a
folder of their own, without the sdist's vllm/ (tests/ is a package: pytest puts its parent first on
sys.path, where a vllm/ would shadow the tree under test). Each tree runs in its own pytest process
with the tree first on PYTHONPATH, on CPU, the Hub offline.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from patchkit.bounded_process import run_to_files
from patchkit.errors import PatchkitError
from patchkit.patching.copies import installed_package, reuse_or_copy
from patchkit.patching.patchset import Patch, load_patchset
from patchkit.patching.planner import EditState
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.index import choose_archive
from patchkit.sources.release import fetch_archive

TEST_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONDONTWRITEBYTECODE": "1"}
PER_TEST_TIMEOUT_S = 300   # pytest-timeout: a test that hangs on CPU is one failure, not a stuck gate
RUN_TIMEOUT_S = 4 * 3600   # one tree's whole run


class GateRunFailed(PatchkitError):
    """pytest did not finish on a tree (killed, timed out, or wrote no outcomes): `tree`, `why`."""

    def __init__(self, tree: str, why: str):
        self.tree, self.why = tree, why
        super().__init__(f"vLLM's tests on the {tree} tree: {why}")


@dataclass(frozen=True)
class Workspace:
    """Where one release's gate keeps its trees and the sdist's tests (in patchkit's cache)."""

    root: Path
    release: str

    @property
    def tests_root(self) -> Path:
        return self.root / "sdist"

    def tree(self, name: str) -> Path:
        return self.root / "trees" / name


def prepare(root: Path, release: str, cache: ArchiveCache) -> Workspace:
    """The sdist's tests/ and pyproject.toml under `root`, from the verified release sdist (once)."""
    ws = Workspace(root, release)
    stamp = ws.tests_root / ".patchkit-sdist"
    # The sdist, downloaded once and checked against the index's sha256 (fetch_archive refuses any other).
    sdist = fetch_archive(cache, "vllm", release, lambda: choose_archive("vllm", release), progress=False)
    if not sdist.path.name.endswith(".tar.gz"):
        raise GateRunFailed("stock", f"the index gave {sdist.path.name} for vllm {release}, not its sdist")
    if stamp.is_file() and stamp.read_text() == sdist.sha256:
        return ws
    shutil.rmtree(ws.tests_root, ignore_errors=True)
    tmp = ws.tests_root.with_name("sdist.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist.path) as tar:
        top = f"vllm-{release}/"
        members = [m for m in tar.getmembers()
                   if m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml"]
        for m in members:
            m.name = m.name[len(top):]
        tar.extractall(tmp, members=members, filter="data")
    (tmp / ".patchkit-sdist").write_text(sdist.sha256)
    tmp.rename(ws.tests_root)
    return ws


def series_for(patches_dir: Path, excluded: set[str]) -> list[Patch]:
    return [p for p in load_patchset(patches_dir).series() if p.id not in excluded]


def build_tree(ws: Workspace, name: str, patches: list[Patch]) -> Path:
    """A copy of the installed vLLM with `patches` applied (reused while its stamp says the same)."""
    dest = ws.tree(name)
    reuse_or_copy(installed_package("vllm"), dest, patches)
    return dest


def edited_files(patches: list[Patch]) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """What `patches` write in the installed vLLM: every (package, path), and per patch id its own."""
    from patchkit.patching import planner
    from patchkit.sources.directory import DirectorySource

    source = DirectorySource(installed_package("vllm").parent)
    plan = planner.plan(patches, source)
    per_patch: dict[str, list[tuple[str, str]]] = {}
    for result in plan.results:
        for e in result.edits:
            if e.path and e.state in (EditState.PENDING, EditState.APPLIED, EditState.HOLDS):
                per_patch.setdefault(result.patch.id, []).append((e.edit.package, e.path))
    every = sorted({f for files in per_patch.values() for f in files})
    return every, per_patch


def run_tests(ws: Workspace, tree: Path, name: str, paths: list[str], *, only: list[str] | None = None,
              workers: int = 2) -> dict[str, str]:
    """pytest on `paths` with `tree` first on the path; each test id's outcome (plugin.py)."""
    out = ws.root / "outcomes" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    env = {**os.environ, **TEST_ENV, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
           "PATCHKIT_GATE_OUTCOMES": str(out)}
    if only is not None:
        listing = out.with_suffix(".only")
        listing.write_text("\n".join(only) + "\n")
        env["PATCHKIT_GATE_ONLY"] = str(listing)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "patchkit.gate.plugin",
            "--timeout", str(PER_TEST_TIMEOUT_S),
            "--continue-on-collection-errors",  # a file that cannot import on CPU is one error id, not the run
            "--durations", "15",  # the slowest, in the log: what a subset for a budget leaves out
            "-o", "asyncio_default_fixture_loop_scope=function",
            "--rootdir", str(ws.tests_root), *(["-n", str(workers)] if workers > 1 else []), *paths]
    log = ws.root / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:  # its xdist workers are killed with it at the timeout (its process group)
        finished = run_to_files(args, timeout=RUN_TIMEOUT_S, stdout=sink, cwd=ws.tests_root, env=env)
    if finished.timed_out:
        raise GateRunFailed(name, f"did not finish in {RUN_TIMEOUT_S} s (log: {log})")
    # pytest: 0 all passed, 1 some failed, 5 none collected; anything else is pytest itself failing.
    if finished.code not in (0, 1, 5) or not out.is_file():
        raise GateRunFailed(name, f"pytest exited {finished.code} without outcomes (log: {log})")
    outcomes: dict[str, str] = json.loads(out.read_text())
    return outcomes
