"""The What-ran-where check: a release inside a patch's range without a passing behaviour test fails.

Records are written the way tests/release_record.py writes them; the patches are the repository's own.
"""

from __future__ import annotations

import json

import pytest

from patchkit.patching.patchset import load_patchset
from ran_where import (
    CHECKS,
    END,
    RELEASES,
    REPO,
    START,
    matrix,
    patch_tests,
    render,
    write_readme,
)

PATCHES = [p.id for p in load_patchset(REPO / "patches").series()]


def record(tmp_path, release, outcomes, excluded=(), sub=""):
    folder = tmp_path / sub if sub else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    name = f"vllm-{release}{'-' + excluded[0] if excluded else ''}.json"
    (folder / name).write_text(json.dumps({
        "vllm": release, "torch": "2.13.0", "transformers": "5.24.0", "excluded": list(excluded),
        "exitstatus": 0, "tests": outcomes, "skip_reasons": {},
    }))


def all_passing(overrides=None):
    tests = {f"{patch_tests(p)}test_a": "passed" for p in PATCHES}
    tests |= {f"{prefix}x": "passed" for prefix in CHECKS}
    return tests | (overrides or {})


def test_every_release_behaviour_tested_is_clean(tmp_path):
    for release in RELEASES:
        record(tmp_path, release, all_passing())
    rows, _, problems = matrix(tmp_path)
    assert problems == []
    assert {cell.state for row in rows.values() for cell in row.values()} == {"behaviour-tested"}


def test_a_claimed_release_without_a_run_fails(tmp_path):
    for release in RELEASES[1:]:
        record(tmp_path, release, all_passing())
    rows, _, problems = matrix(tmp_path)
    assert rows[PATCHES[0]]["0.30.0"].state == "anchors only"
    assert f"{PATCHES[0]} claims vllm<0.34,>=0.30.0 but has no passing behaviour test on 0.30.0: no test run recorded" in problems


def test_only_skipped_or_failed_tests_fail(tmp_path):
    patch = PATCHES[0]
    skipped = all_passing({f"{patch_tests(patch)}test_a": "skipped"})
    failed = all_passing({f"{patch_tests(patch)}test_b": "failed"})
    for release, tests in zip(RELEASES, (skipped, failed, all_passing(), all_passing()), strict=True):
        record(tmp_path, release, tests)
    rows, _, problems = matrix(tmp_path)
    assert rows[patch]["0.30.0"].text() == "anchors only"
    assert rows[patch]["0.31.0"].text() == "FAILED (1 passed, 1 failed)"
    assert len([p for p in problems if p.startswith(patch)]) == 2


def test_necessity_runs_mark_the_cell(tmp_path):
    patch = PATCHES[0]
    for release in RELEASES:
        record(tmp_path, release, all_passing())
    record(tmp_path, "0.30.0", {f"{patch_tests(patch)}test_a": "failed"}, excluded=(patch,), sub="necessity")
    rows, _, _ = matrix(tmp_path)
    assert rows[patch]["0.30.0"].text() == "behaviour-tested (1 passed; fails without it)"
    assert rows[patch]["0.31.0"].text() == "behaviour-tested (1 passed)"


def test_table_goes_between_the_markers(tmp_path):
    for release in RELEASES:
        record(tmp_path, release, all_passing())
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{START}\nold\n{END}\n\nafter\n")
    rows, runs, _ = matrix(tmp_path)
    write_readme(readme, render(rows, runs))
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{END}\n\nafter\n")
    assert f"| {PATCHES[0]} | behaviour-tested (1 passed) |" in text
    with pytest.raises(SystemExit):
        (tmp_path / "bare.md").write_text("no markers\n")
        write_readme(tmp_path / "bare.md", "table")


def test_releases_outside_the_run_are_not_checked(tmp_path):
    for release in ("0.30.0", "0.33.0"):
        record(tmp_path, release, all_passing())
    rows, _, problems = matrix(tmp_path, ("0.33.0", "0.30.0"))
    assert problems == []
    assert rows[PATCHES[0]]["0.31.0"].state == "not in this run"
    _, _, problems = matrix(tmp_path)
    assert any("0.31.0: no test run recorded" in p for p in problems)
