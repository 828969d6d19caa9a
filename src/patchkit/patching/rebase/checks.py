"""The checks a rebased patch passes before it is written, and what they make of its state.

1. Read back: each placed patch rendered (writing.render) into a scratch copy of the patch set loads, and
   every proposal reads back from it as proposed (else a patchkit bug: exit 2, nothing written).
2. Applies: the rebased series (the requested patches, in series order; a patch left to a person keeps
   its old range, so it is out of range there) is planned on the new release. A placed patch that is
   not whole there is DOES_NOT_APPLY and is put back as it was in the copy; the rest is planned again,
   until every placed patch left applies (a later patch may anchor on an earlier one's text).
3. Behaviour tests: each placed patch's tests/patches/test_<id>.py in the new release's test environment,
   on the copy. Passed: REBASED; failed: TESTS_FAILED; not run (asked not to, no environment, no vLLM in
   the new source): UNTESTED, and `Rebase.tests_note` says why.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from patchkit.bounded_process import run_captured
from patchkit.patching import planner
from patchkit.patching.patchset import Patch, load_patchset
from patchkit.patching.rebase.model import PatchRebase, Rebase, RebaseRefused, RebaseState, TestRun
from patchkit.patching.rebase.writing import put, render
from patchkit.patching.test_files import behaviour_test_file
from patchkit.sources.base import Source


def check(rebase_result: Rebase, patches_dir: Path, new: Source, dest: Path) -> planner.Plan:
    """Checks 1 and 2: `dest` becomes the rebased patch set (a copy of patches_dir with every placed patch
    that applies written in), each placed patch's rendered text is kept on it for the write, and the plan
    of the rebased series on the new release is returned."""
    shutil.copytree(patches_dir, dest)
    placed = [r for r in rebase_result.results if r.state == RebaseState.UNTESTED]
    for r in placed:
        r.rendered = render(r)
        put(dest / r.patch.id, r.rendered)
    loaded = load_patchset(dest)
    for r in placed:
        same_intent(r, loaded.patch(r.patch.id))
    ids = {r.patch.id for r in rebase_result.results}
    while True:
        patch_set = load_patchset(dest)
        plan = planner.plan(patch_set.series([i for i in patch_set.order if i in ids]), new)
        failed = [r for r in placed if r.state == RebaseState.UNTESTED and not plan.result(r.patch.id).ok]
        if not failed:
            return plan
        for r in failed:
            r.state = RebaseState.DOES_NOT_APPLY
            r.failure = plan.result(r.patch.id).describe()
            shutil.rmtree(dest / r.patch.id)
            shutil.copytree(patches_dir / r.patch.id, dest / r.patch.id)


def same_intent(result: PatchRebase, loaded: Patch) -> None:
    """The rendered patch reads back as the proposals say: each proposed edit is one of the loaded edits."""
    for p in result.proposals:
        if not any(p.new.reads_back_as(e) for e in loaded.edits):
            raise RebaseRefused(result.patch.id, "read-back", f"the rendered patch.toml does not read back as the "
                                f"proposal for edit {p.edit.index}; nothing written (a patchkit bug: please report it)")


def test_environment(cache: Path, version: str) -> Path | None:
    """The interpreter of the release's nox test environment (`nox -s release-X` builds it), if built."""
    for name in ("tests", f"release-{version.replace('.', '-')}"):
        python = cache / "nox" / name / "bin" / "python"
        if python.exists() and list((cache / "nox" / name).glob(f"lib/python*/site-packages/vllm-{version}.dist-info")):
            return python
    return None


def run_behaviour_tests(patch_ids: list[str], patches_dir: Path, python: Path, tests_dir: Path,
                        timeout: float = 1800) -> list[TestRun]:
    """Each patch's tests/patches/test_<id>.py in the release's environment, on the rebased patch set
    (PATCHKIT_TEST_PATCHES points the tests' patched copy at it)."""
    runs = []
    for patch_id in patch_ids:
        test = tests_dir.parent / behaviour_test_file(patch_id)
        if not test.exists():
            runs.append(TestRun(patch_id, str(test), 2, "no behaviour test file"))
            continue
        env = {**os.environ, "PATCHKIT_TEST_PATCHES": str(patches_dir), "PATCHKIT_REQUIRE_VLLM": "1"}
        env.pop("PATCHKIT_RESULTS", None)
        # pytest's own processes are killed with it at the timeout (its process group)
        finished = run_captured([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(test)],
                                timeout=timeout, env=env, cwd=tests_dir.parent)
        if finished.timed_out:
            runs.append(TestRun(patch_id, str(test), 124, f"timed out after {timeout} s"))
            continue
        runs.append(TestRun(patch_id, str(test), finished.code, finished.output[-2000:]))
    return runs


def run_tests(rebase_result: Rebase, rebased_dir: Path, version: str | None, *, run: bool, cache: Path,
         tests_dir: Path) -> list[TestRun]:
    """Check 3 on the placed patches that apply (`rebased_dir`: check()'s copy; `version` the new source's
    vLLM, None without one; `run` False for --no-tests). Sets each one's state and the run's note."""
    placed = [r for r in rebase_result.results if r.state == RebaseState.UNTESTED]
    rebase_result.tests_required = run
    if not run:
        rebase_result.tests_note = "behaviour tests not run (--no-tests)"
        return []
    if not placed:
        return []
    if version is None:
        rebase_result.tests_note = "behaviour tests not run: the new source has no vLLM (run them in a vLLM environment)"
        return []
    python = test_environment(cache, version)
    if python is None:
        rebase_result.tests_note = (f"no test environment for vLLM {version} under {cache / 'nox'}: build it with "
                                    f"`nox -s release-{version} --install-only`, or pass --no-tests")
        return []
    runs = run_behaviour_tests([r.patch.id for r in placed], rebased_dir, python, tests_dir)
    by_id = {t.patch_id: t for t in runs}
    for r in placed:
        r.tests = by_id[r.patch.id]
        r.state = RebaseState.REBASED if r.tests.passed else RebaseState.TESTS_FAILED
        if not r.tests.passed:
            r.failure = r.tests.tail
    return runs
