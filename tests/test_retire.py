"""`patchkit retire`: which patches a release no longer needs, each proposal naming its evidence.

Measured on real material: vLLM 0.33.0's released sources (its sdist from the index, cached) for the
[upstreamed] probes, and the test records of a real run on 0.33.0 (tests/data/bump/run/results: the
behaviour tests of the rebased patch set and `patch-necessity` runs, written by tests/release_record.py;
tests/data/bump/README.md has the commands). Where a record had to show what no real run shows (a
patch whose tests pass without it), it is the real record with its outcomes rewritten, and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit.errors import PatchkitError
from patchkit.patching.patchset import load_patchset
from patchkit.verify.retire import assert_only, verdict, verdicts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "tests" / "data" / "bump" / "run" / "results"
pytestmark = pytest.mark.vllm  # reads vLLM 0.33.0's released sources


@pytest.fixture(scope="module")
def release_033():
    from patchkit.sources import open_source

    return open_source("0.33.0", progress=False)


@pytest.fixture(scope="module")
def patches():
    return {p.id: p for p in load_patchset(REPO / "patches").series()}


def patchkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "patchkit", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_a_fired_probe_proposes_retirement_naming_the_file_and_line(release_033, patches):
    found = {v.patch_id: v for v in verdicts(list(patches.values()), "0.33.0", release_033, None)}
    topk, think = found["persistent-topk-cc12"], found["glm53-always-think"]
    assert topk.verdict == think.verdict == "retire"
    [probe] = [e for e in topk.evidence if e.kind == "probe"]
    assert probe.where == "vllm/_version.py" and "'version_tuple = (0, 3'" in probe.text and "at line" in probe.text
    [probe] = [e for e in think.evidence if e.kind == "probe"]
    assert probe.where == "vllm/parser/glm47_moe.py" and "def _glm53_always_thinks(" in probe.text
    # nothing else fires on 0.33.0, and without records nothing else is measured
    assert {i for i, v in found.items() if v.verdict == "retire"} == {"persistent-topk-cc12", "glm53-always-think"}
    assert found["pool-topk-init"].verdict == "unmeasured"
    assert "nox -s patch-necessity -- 0.33.0 pool-topk-init" in found["pool-topk-init"].evidence[-1].text


def test_a_patch_whose_tests_fail_without_it_is_kept(release_033, patches):
    kept = verdict(patches["pool-topk-init"], "0.33.0", release_033, RESULTS)
    assert kept.verdict == "keep"
    [necessity] = kept.evidence
    assert "of its behaviour tests fail on 0.33.0 without it" in necessity.text
    assert necessity.where == str(RESULTS / "necessity" / "vllm-0.33.0-pool-topk-init.json")


def test_a_patch_whose_tests_pass_without_it_is_proposed_with_the_record(release_033, patches, tmp_path):
    results = Path(shutil.copytree(RESULTS, tmp_path / "results"))
    path = results / "necessity" / "vllm-0.33.0-pool-topk-init.json"
    record = json.loads(path.read_text())  # the real record, its outcomes rewritten: upstream fixed it
    record["tests"] = {node: "passed" for node in record["tests"]}
    path.write_text(json.dumps(record))
    proposed = verdict(patches["pool-topk-init"], "0.33.0", release_033, results)
    assert proposed.verdict == "retire"
    [necessity] = proposed.evidence
    assert necessity.where == str(path) and f"its {len(record['tests'])} behaviour test(s) pass on 0.33.0" in necessity.text


def test_an_assert_only_patch_is_kept_by_its_drift_test_not_by_the_exclusion_check(release_033, patches, tmp_path):
    kda = patches["kda-fp32-taps"]
    assert assert_only(kda) and not assert_only(patches["naming-shim"])
    # its necessity record fails, but only through the series check of PATCHKIT_TEST_EXCLUDE itself
    without = json.loads((RESULTS / "necessity" / "vllm-0.33.0-kda-fp32-taps.json").read_text())
    assert [n for n, o in without["tests"].items() if o == "failed"] == [
        "tests/patches/test_kda_fp32_taps.py::test_series_guards_the_taps"]
    kept = verdict(kda, "0.33.0", release_033, RESULTS)
    assert kept.verdict == "keep"
    [drift] = kept.evidence
    assert drift.kind == "drift" and "its drift test passes on 0.33.0 (1 passed)" in drift.text
    assert drift.where == str(RESULTS / "vllm-0.33.0.json")
    # the drift test failing there (an upstream downcast no longer caught) is for a person, not a retirement
    results = Path(shutil.copytree(RESULTS, tmp_path / "results"))
    run = json.loads((results / "vllm-0.33.0.json").read_text())
    run["tests"]["tests/patches/test_kda_fp32_taps.py::test_an_upstream_downcast_of_the_taps_fails_loudly"] = "failed"
    (results / "vllm-0.33.0.json").write_text(json.dumps(run))
    assert verdict(kda, "0.33.0", release_033, results).verdict == "check by hand"


def test_out_of_range_says_so_and_reads_nothing(patches):
    found = verdict(patches["kda-fp32-taps"], "0.29.0", None, Path("/nonexistent"))
    assert found.verdict == "out of range" and "outside" in found.evidence[0].text


def test_a_misfiled_or_malformed_record_is_refused(release_033, patches, tmp_path):
    results = Path(shutil.copytree(RESULTS, tmp_path / "results"))
    target = results / "necessity" / "vllm-0.33.0-pool-topk-init.json"
    shutil.copy(results / "necessity" / "vllm-0.33.0-kda-fp32-taps.json", target)
    with pytest.raises(PatchkitError, match=r"without \['kda-fp32-taps'\], filed as vllm 0\.33\.0 without \['pool-topk-init'\]"):
        verdict(patches["pool-topk-init"], "0.33.0", release_033, results)
    target.write_text('{"vllm": "0.33.0", "excluded": ["pool-topk-init"], "exitstatus": 1, "tests": {"a": 1}}')
    out = patchkit("retire", "--release", "0.33.0", "--results", results)
    assert out.returncode == 2 and "$.tests" in out.stderr and str(target) in out.stderr


def test_the_command_lists_every_patch_with_its_evidence():
    out = patchkit("retire", "--release", "0.33.0", "--results", RESULTS, "--json")
    assert out.returncode == 0, out.stderr
    found = {v["patch"]: v for v in json.loads(out.stdout)["verdicts"]}
    assert list(found) == list(load_patchset(REPO / "patches").order)
    assert found["persistent-topk-cc12"]["verdict"] == "retire"
    assert found["kda-fp32-taps"]["verdict"] == "keep"


@pytest.mark.parametrize("args, message", [
    (["--release", "latest"], "is not a version"),
    (["--release", "0.33.0", "--source", "0.32.0"], "--source is vLLM 0.32.0, not the release 0.33.0"),
])
def test_bad_input_is_exit_2(args, message):
    out = patchkit("retire", *args, "--results", RESULTS)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
