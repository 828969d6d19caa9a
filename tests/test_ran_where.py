"""What ran where: README's table is the committed records' rendering; a run merges into them cell by cell,
and a release of the run inside a patch's range without a passing behaviour test fails.

Run records are written the way tests/release_record.py writes them (the last test has the plugin write
one from a real pytest run); the patches are the repository's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import pytest
from packaging.version import Version

from patchkit import SUPPORTED_VLLM
from patchkit.patching.patchset import load_patchset
from ran_where import (
    CHECKS,
    END,
    REPO,
    START,
    RecordError,
    Records,
    RunRecord,
    load_records,
    load_results,
    main,
    merge,
    patch_tests,
    problems,
    readme_table,
    releases,
    render,
    write_readme,
    write_records,
)

PATCHES = [p.id for p in load_patchset(REPO / "patches").series()]
RANGES = {p.id: p.ranges["vllm"] for p in load_patchset(REPO / "patches").series()}
OLD, NEW = "1" * 40, "2" * 40


def record(folder, release, outcomes, *, excluded=(), commit=NEW, finished="2026-12-04T12:00:00Z", **narrowed):
    folder = folder / "necessity" if excluded else folder
    folder.mkdir(parents=True, exist_ok=True)
    name = f"vllm-{release}{'-' + excluded[0] if excluded else ''}.json"
    (folder / name).write_text(json.dumps({
        "vllm": release, "torch": "2.13.0", "transformers": "5.24.0", "excluded": list(excluded),
        "exitstatus": 0, "commit": commit, "finished": finished, "tests": outcomes, "skip_reasons": {},
        "selection": [], "deselected": [], "stopped_early": False, **narrowed,
    }))


def all_passing(overrides=None):
    tests = {f"{patch_tests(p)}test_a": "passed" for p in PATCHES}
    tests |= {f"{prefix}x": "passed" for prefix, _ in CHECKS.values()}
    return tests | (overrides or {})


def merged(results, records=None):
    return merge(records or Records({}, {}), load_results(results))


def test_readme_table_is_the_committed_records():
    """CI fails when README's table differs from docs/ran-where/ (regenerate: `nox -s what-ran-where`, or
    `python tests/ran_where.py --readme README.md` for the records alone)."""
    assert readme_table(REPO / "README.md") == render(load_records())


def test_every_patch_of_the_series_has_a_row_and_every_recorded_release_a_column(tmp_path):
    record(tmp_path, "0.34.0", all_passing())
    table = render(merged(tmp_path))
    for patch in PATCHES:
        assert f"\n| {patch} | " in table
    assert releases(Records({}, {})) == [r for r in SUPPORTED_VLLM if any(Version(r) in s for s in RANGES.values())]
    assert "| vLLM 0.34.0 |" in table
    assert f"- 0.34.0: {len(PATCHES) + len(CHECKS)} cells from the run on 2222222" in table
    for patch in PATCHES:
        expected = ["out of range" if Version(r) not in RANGES[patch] else "behaviour-tested (1 passed) on 2222222"
                    if r == "0.34.0" else "no run recorded" for r in releases(merged(tmp_path))]
        assert f"| {patch} | " + " | ".join(expected) + " |" in table


def test_a_run_that_did_not_run_a_cell_leaves_the_recorded_one(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    record(first, "0.31.0", all_passing(), commit=OLD, finished="2026-12-01T00:00:00Z")
    kept = merged(first)
    record(second, "0.31.0", {f"{patch_tests(PATCHES[0])}test_a": "passed", f"{patch_tests(PATCHES[0])}test_b": "passed"})
    record(second, "0.30.0", all_passing())
    now = merge(kept, load_results(second))
    assert now.runs["0.31.0"][PATCHES[0]].commit == NEW and now.runs["0.31.0"][PATCHES[0]].passed == 2
    assert now.runs["0.31.0"][PATCHES[1]] == kept.runs["0.31.0"][PATCHES[1]]
    assert now.runs["0.31.0"][PATCHES[1]].commit == OLD
    assert set(now.runs) == {"0.30.0", "0.31.0"}


@pytest.mark.parametrize("narrowed", [
    {"deselected": [f"{patch_tests(PATCHES[0])}test_b"]},                      # -k / -m
    {"selection": [f"{patch_tests(PATCHES[0])}test_a"]},                       # one node id
    {"stopped_early": True},                                                   # -x, --maxfail, Ctrl-C
], ids=["deselected", "node-id", "stopped-early"])
def test_a_narrowed_run_adds_only_failures(tmp_path, narrowed):
    first, second = tmp_path / "first", tmp_path / "second"
    record(first, "0.30.0", all_passing({f"{patch_tests(PATCHES[0])}test_b": "passed"}), commit=OLD,
           finished="2026-12-01T00:00:00Z")
    kept = merged(first)
    record(second, "0.30.0", {f"{patch_tests(PATCHES[0])}test_a": "passed", f"{patch_tests(PATCHES[1])}test_a": "failed"},
           **narrowed)
    now = merge(kept, load_results(second))
    assert now.runs["0.30.0"][PATCHES[0]] == kept.runs["0.30.0"][PATCHES[0]]  # a narrowed pass: the record stands
    assert now.runs["0.30.0"][PATCHES[1]].outcome == "FAILED"                 # a fresh failure replaces the pass
    assert now.runs["0.30.0"][PATCHES[1]].commit == NEW


def test_whole_files_and_folders_given_are_complete(tmp_path):
    record(tmp_path / "first", "0.30.0", all_passing(), commit=OLD, finished="2026-12-01T00:00:00Z")
    record(tmp_path / "second", "0.30.0", all_passing(), selection=["tests/patches", "tests/test_smoke_cpu.py",
                                                                    "tests/test_serve.py::test_vllm_parser_accepts_every_variant_command"])
    now = merge(merged(tmp_path / "first"), load_results(tmp_path / "second"))
    assert {cell.commit for cell in now.runs["0.30.0"].values()} == {NEW}


def test_the_newer_result_wins_and_an_older_one_never_does(tmp_path):
    record(tmp_path / "new", "0.30.0", all_passing({f"{patch_tests(PATCHES[0])}test_b": "failed"}))
    record(tmp_path / "old", "0.30.0", all_passing(), commit=OLD, finished="2026-12-01T00:00:00Z")
    now = merge(merged(tmp_path / "new"), load_results(tmp_path / "old"))
    assert now.runs["0.30.0"][PATCHES[0]].outcome == "FAILED" and now.runs["0.30.0"][PATCHES[0]].commit == NEW


def test_records_round_trip_and_render_each_cell_with_its_commit(tmp_path):
    record(tmp_path / "results", "0.30.0", all_passing(), commit=NEW + "+dirty")
    record(tmp_path / "results", "0.30.0", {f"{patch_tests(PATCHES[0])}test_a": "failed"}, excluded=(PATCHES[0],),
           commit=OLD)
    write_records(merged(tmp_path / "results"), tmp_path / "records")
    assert sorted(p.relative_to(tmp_path / "records").as_posix() for p in (tmp_path / "records").rglob("*.json")) == [
        "necessity/vllm-0.30.0.json", "vllm-0.30.0.json"]
    back = load_records(tmp_path / "records")
    assert back == merged(tmp_path / "results")
    table = render(back)
    assert f"| {PATCHES[0]} | behaviour-tested (1 passed; fails without it on 1111111) on 2222222+dirty |" in table
    assert f"| {PATCHES[1]} | behaviour-tested (1 passed) on 2222222+dirty |" in table
    assert "- 0.30.0: necessity (each patch left out) recorded for 1 patches, on 1111111" in table


def test_a_claimed_release_without_a_run_fails(tmp_path):
    record(tmp_path, "0.31.0", all_passing())
    found = problems(load_results(tmp_path), ["0.30.0", "0.31.0"])
    assert f"{PATCHES[0]} claims vllm{RANGES[PATCHES[0]]} but has no passing behaviour test on 0.30.0: no test run recorded" in found
    assert not [p for p in found if "0.31.0" in p]


def test_only_skipped_or_failed_tests_fail(tmp_path):
    patch = PATCHES[0]
    record(tmp_path / "a", "0.30.0", all_passing({f"{patch_tests(patch)}test_a": "skipped"}))
    record(tmp_path / "b", "0.30.0", all_passing({f"{patch_tests(patch)}test_b": "failed"}))
    skipped, failed = (problems(load_results(tmp_path / d), ["0.30.0"]) for d in "ab")
    assert skipped == [f"{patch} claims vllm{RANGES[patch]} but has no passing behaviour test on 0.30.0: anchors only (0 passed, 1 skipped)"]
    assert failed == [f"{patch} claims vllm{RANGES[patch]} but has no passing behaviour test on 0.30.0: FAILED (1 passed, 1 failed)"]
    assert merged(tmp_path / "a").runs["0.30.0"][patch].outcome == "anchors only"


def test_releases_outside_the_run_are_not_checked(tmp_path):
    record(tmp_path, "0.33.0", all_passing())
    assert problems(load_results(tmp_path), ["0.33.0"]) == []
    assert any("0.30.0: no test run recorded" in p for p in problems(load_results(tmp_path), ["0.33.0", "0.30.0"]))


def test_a_record_without_a_commit_is_refused_unless_named(tmp_path):
    record(tmp_path, "0.30.0", all_passing(), commit=None, finished=None)
    with pytest.raises(RecordError, match="records no commit"):
        load_results(tmp_path)
    cells = merge(Records({}, {}), load_results(tmp_path, legacy_commit=OLD)).runs["0.30.0"]
    assert {c.commit for c in cells.values()} == {OLD} and all(c.finished.endswith("Z") for c in cells.values())


def test_the_command_merges_writes_and_fails_closed(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{START}\nold\n{END}\n\nafter\n")
    record(tmp_path / "results", "0.30.0", all_passing({f"{patch_tests(PATCHES[0])}test_a": "failed"}))
    args = ["--results", str(tmp_path / "results"), "--records", str(tmp_path / "records"), "--readme", str(readme)]
    assert main([*args, "--releases", "0.30.0"]) == 1  # the failed cell is recorded, and fails the run
    assert "old" not in readme.read_text() and readme.read_text().endswith(f"{END}\n\nafter\n")
    assert readme_table(readme) == render(load_records(tmp_path / "records"))
    assert f"error: {PATCHES[0]} claims" in capsys.readouterr().err
    (tmp_path / "records" / "vllm-0.30.0.json").write_text('{"release": "0.30.0", "cells": {"x": {"outcome": "great"}}}')
    assert main(args) == 2
    assert "error: " in capsys.readouterr().err
    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(RecordError, match="no <!-- what-ran-where:start -->"):
        write_readme(tmp_path / "bare.md", "table")


def test_the_plugin_records_commit_and_narrowing(tmp_path):
    """tests/release_record.py in a real pytest run under pytest-xdist: the checkout's commit, what -k
    deselected (sent from the worker), and a record ran_where reads."""
    (tmp_path / "test_x.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    target = tmp_path / "results" / "vllm-0.30.0.json"
    env = {**os.environ, "PATCHKIT_RESULTS": str(target), "PYTHONPATH": os.pathsep.join(
        [str(REPO / "tests"), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "release_record", "-p", "no:cacheprovider",
                           "-n", "1", "-k", "test_a", "test_x.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = json.loads(target.read_text())
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert written["commit"] in (head, head + "+dirty")
    assert written["tests"] == {"test_x.py::test_a": "passed"}
    assert written["deselected"] == ["test_x.py::test_b"] and written["selection"] == ["test_x.py"]
    assert not written["stopped_early"]
    assert msgspec.json.decode(target.read_bytes(), type=RunRecord).commit == written["commit"]


def test_the_pinned_run_tests_every_patch_an_image_carries_on_a_release_it_claims():
    """`nox -s tests` runs the whole suite on the pin and, through beyond_the_pin, each patch the pin is outside
    of on the newest supported release it claims: every patch of every image's series is behaviour-tested by
    CI's run, none only skipped as out of range (nope-mla-pad, <0.34, stays in every image on the pin 0.34.0)."""
    from patchkit import PINNED_VLLM
    from patchkit.images.definitions import every_series
    from patchkit.patching.test_files import behaviour_test_file, beyond_the_pin

    patchset = load_patchset(REPO / "patches")
    beyond = beyond_the_pin(REPO / "patches", PINNED_VLLM, SUPPORTED_VLLM)
    scheduled = {f: release for release, files in beyond.items() for f in files}
    carried = {p for series in every_series(REPO / "images", patchset).values() for p in series}
    for patch in patchset.series(sorted(carried, key=patchset.order.index)):
        claims = patch.ranges["vllm"]
        if Version(PINNED_VLLM) in claims:
            assert behaviour_test_file(patch.id) not in scheduled, patch.id  # the pinned suite runs it already
            continue
        release = scheduled.get(behaviour_test_file(patch.id))
        assert release is not None, f"{patch.id} ({claims}) is in an image but no run of CI tests it"
        assert release == max((r for r in SUPPORTED_VLLM if Version(r) in claims), key=Version), patch.id


def test_beyond_the_pin_takes_the_newest_claimed_release_and_leaves_out_what_claims_none(tmp_path):
    """HAND-WRITTEN patch folders (only the `vllm` key is read): inside the pin, out of it, and claiming
    no supported release."""
    from patchkit.patching.test_files import beyond_the_pin

    for patch_id, claims in [("kept", ">=0.30.0,<0.35"), ("retired", ">=0.30.0,<0.33"),
                             ("also-retired", "<0.33"), ("future", ">=0.99")]:
        (tmp_path / patch_id).mkdir()
        (tmp_path / patch_id / "patch.toml").write_text(f'vllm = "{claims}"\n')
    releases = ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
    assert beyond_the_pin(tmp_path, "0.34.0", releases) == {
        "0.32.0": ["tests/patches/test_also_retired.py", "tests/patches/test_retired.py"]}
    assert beyond_the_pin(tmp_path, "0.32.0", releases) == {}  # every patch claiming a release holds 0.32.0
