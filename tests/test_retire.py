"""`patchkit retire`: which patches a release no longer needs, each proposal naming its evidence.

Measured on real material: vLLM 0.33.0's and 0.34.0's released sources (their sdists from the index,
cached; marked `network`: nothing here imports vLLM) for the [upstreamed] probes and the anchors, and the
test records of a real run on 0.33.0 (tests/data/bump/run/results: the behaviour tests of the rebased
patch set and `patch-necessity` runs, written by tests/release_record.py; tests/data/bump/README.md has
the commands). Where a record had to show what no real run shows (a patch whose tests pass without it,
a necessity run on 0.34.0), it is the real record with its outcomes or release rewritten, and says so.

0.34.0 is outside every patch's range as the patch set stood for 0.33.0 (`vllm < 0.34`): there retire
reads the same evidence and says what it would propose (`Verdict.in_range` False).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchkit.patching.patchset import load_patchset
from patchkit.upstream.retire import MisfiledRecord, assert_only, reads_a_version, verdict, verdicts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "tests" / "data" / "bump" / "run" / "results"
pytestmark = pytest.mark.network  # reads vLLM 0.33.0's and 0.34.0's released sources (the sdists, cached)


@pytest.fixture(scope="module")
def release_033():
    from patchkit.sources import open_source

    return open_source("0.33.0", progress=False)


@pytest.fixture(scope="module")
def release_034():
    from patchkit.sources import open_source

    return open_source("0.34.0", progress=False)


def as_for_033(patch):
    """The patch as it stood for 0.33.0, before any bump: its range ending before 0.34 and only the edits
    for 0.33.0, for every release (an edit a later rebase split off for 0.34+ is left out, the old edit's
    own `<0.34` dropped with the split), so 0.34.0 is outside it."""
    edits = tuple(replace(e, versions=None) for e in patch.edits if e.versions is None or Version("0.33.0") in e.versions)
    return replace(patch, ranges={**patch.ranges, "vllm": SpecifierSet(">=0.30.0,<0.34")}, edits=edits)


@pytest.fixture(scope="module")
def outside_034(patches, release_034, tmp_path_factory):
    """Every patch's verdict on the real 0.34.0, from the patch set as it stood for 0.33.0 (no records)."""
    series = [as_for_033(p) for p in patches.values()]
    return {v.patch_id: v for v in verdicts(series, "0.34.0", release_034, tmp_path_factory.mktemp("no-results"))}


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
    assert not reads_a_version(patches["persistent-topk-cc12"])  # a release probe: the release in an exact range
    [probe] = [e for e in topk.evidence if e.kind == "probe"]
    assert probe.where != "vllm/_version.py" and "0.33.0" in probe.text
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


def test_out_of_range_with_nothing_to_read_is_no_evidence(patches):
    found = verdict(patches["kda-fp32-taps"], "0.29.0", None, Path("/nonexistent"))
    assert found.verdict == "no evidence" and not found.in_range
    assert found.evidence[0].kind == "range" and "0.29.0 is outside its range" in found.evidence[0].text
    assert "no source of it was read" in found.evidence[-1].text
    assert found.to_dict()["in_range"] is False


def test_outside_its_range_a_fired_probe_on_0_34_0_proposes_retirement(outside_034):
    """glm53-always-think's probe is upstream's own function (`def _glm53_always_thinks(`), in 0.34.0's parser."""
    think = outside_034["glm53-always-think"]
    assert think.verdict == "retire" and not think.in_range
    assert [e.kind for e in think.evidence] == ["range", "probe"]
    assert think.evidence[1].where == "vllm/parser/glm47_moe.py"
    assert "[upstreamed] probe fires: 'def _glm53_always_thinks(' at line" in think.evidence[1].text


def test_outside_its_range_every_patch_gets_a_proposal_with_evidence(outside_034, patches):
    assert list(outside_034) == list(patches)
    for patch_id, found in outside_034.items():
        assert not found.in_range and found.verdict in ("retire", "keep", "check by hand", "no evidence"), patch_id
        assert found.evidence[0].kind == "range" and len(found.evidence) >= 2, (patch_id, found.evidence)
        assert found.verdict != "out of range"


def test_outside_its_range_an_anchor_0_34_0_removed_is_for_a_person(outside_034):
    """0.34.0 fused the KDA short-conv taps (q/k/v_conv1d) into one parameter: the asserts that guard them as
    fp32 cannot hold there as written, and retire says so with the planner's diagnostic."""
    kda = outside_034["kda-fp32-taps"]
    assert kda.verdict == "check by hand"
    [anchors] = [e for e in kda.evidence if e.kind == "anchors"]
    assert anchors.where == "vllm/models/glm5next/common/kda.py"
    assert "invariant no longer holds" in anchors.text and "patchkit rebase --to 0.34.0" in anchors.text


def test_outside_its_range_anchors_there_as_written_are_keep(outside_034):
    kept = [v for v in outside_034.values() if v.verdict == "keep"]
    assert kept, "some patches' code is unchanged on 0.34.0"
    for found in kept:
        [anchors] = [e for e in found.evidence if e.kind == "anchors"]
        assert "every anchor is on 0.34.0 as written" in anchors.text and "probe does not fire" in anchors.text
        assert anchors.where.startswith("vllm/")


def test_outside_its_range_a_necessity_record_decides_before_the_anchors(patches, release_034, tmp_path):
    """The real necessity record of pool-topk-init (0.33.0: 3 of 7 fail without it), its release rewritten
    to 0.34.0 (no such run exists: there is no 0.34.0 test environment yet)."""
    results = tmp_path / "results"
    (results / "necessity").mkdir(parents=True)
    record = json.loads((RESULTS / "necessity" / "vllm-0.33.0-pool-topk-init.json").read_text())
    record["vllm"] = "0.34.0"
    (results / "necessity" / "vllm-0.34.0-pool-topk-init.json").write_text(json.dumps(record))
    found = verdict(as_for_033(patches["pool-topk-init"]), "0.34.0", release_034, results)  # no plan: the record decides
    assert found.verdict == "keep" and not found.in_range
    assert [e.kind for e in found.evidence] == ["range", "necessity"]
    assert "of its behaviour tests fail on 0.34.0 without it" in found.evidence[1].text


VERSION_PROBE = """id = "stamp-probe"
title = "A patch whose probe reads a version string"
why = "For the test: its probe finds `__version_tuple__ = (0, 0` in vllm/version.py, in every release."
vllm = "{range}"

[origin]
author = "patchkit tests"
url = "https://example.invalid/"
license = "Apache-2.0"

[upstream]
state = "none"

[upstreamed]
file = "version.py"
contains = "__version_tuple__ = (0, 0"

[[edit]]
file = "version.py"
action = "assert"
anchor = \"\"\"def _prev_minor_version_was(version_str):
\"\"\"
"""


@pytest.mark.parametrize("spec, in_range", [("<0.34", False), (">=0.34", True)])
def test_a_probe_that_reads_a_version_string_decides_nothing(tmp_path, release_034, spec, in_range):
    """A text probe on a version assignment (here vllm/version.py's fallback, in every release) fires without
    the fix: its hit is shown, the verdict is for a person, and what the rest of the evidence says is named."""
    folder = tmp_path / "patches" / "stamp-probe"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(VERSION_PROBE.replace("{range}", spec))
    (tmp_path / "patches" / "series.toml").write_text('series = ["stamp-probe"]\n')
    patch = load_patchset(tmp_path / "patches").patch("stamp-probe")
    assert reads_a_version(patch)
    [found] = verdicts([patch], "0.34.0", release_034, None)
    assert found.verdict == "check by hand" and found.in_range is in_range
    [probe] = [e for e in found.evidence if e.kind == "probe"]
    assert probe.where == "vllm/version.py" and "a version string, not the fix's own code" in probe.text
    said = found.evidence[-1].text
    assert said == ("without the probe the evidence says: keep" if not in_range else
                    "without the probe the evidence says: unmeasured"), found.evidence


def test_a_misfiled_or_malformed_record_is_refused(release_033, patches, tmp_path):
    results = Path(shutil.copytree(RESULTS, tmp_path / "results"))
    target = results / "necessity" / "vllm-0.33.0-pool-topk-init.json"
    shutil.copy(results / "necessity" / "vllm-0.33.0-kda-fp32-taps.json", target)
    with pytest.raises(MisfiledRecord) as misfiled:
        verdict(patches["pool-topk-init"], "0.33.0", release_033, results)
    assert (misfiled.value.path, misfiled.value.excluded, misfiled.value.expected_excluded) == (
        target, ["kda-fp32-taps"], ["pool-topk-init"])
    out = patchkit("retire", "--release", "0.33.0", "--results", results)
    assert out.returncode == 2 and "filed as vllm 0.33.0 without ['pool-topk-init']" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
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
    assert {v["in_range"] for v in found.values()} == {True}


def test_the_command_on_a_release_past_the_ranges_says_what_it_would_propose(tmp_path):
    """`patchkit retire --release 0.34.0` as the bump job runs it, before any patch is rebased onto 0.34.0:
    each patch outside its range gets a proposal from its evidence, none an "out of range"."""
    out = patchkit("retire", "--release", "0.34.0", "--results", tmp_path / "none", "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["verdicts"]
    assert all(v["verdict"] != "out of range" for v in found)
    assert all(len(v["evidence"]) >= 2 and v["evidence"][0]["kind"] == "range" for v in found if not v["in_range"])


def test_the_commands_text_says_a_verdict_outside_the_range_is_a_proposal(tmp_path):
    folder = tmp_path / "patches" / "stamp-probe"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(VERSION_PROBE.replace("{range}", "<0.34"))
    (tmp_path / "patches" / "series.toml").write_text('series = ["stamp-probe"]\n')
    out = patchkit("retire", "--release", "0.34.0", "--patches", tmp_path / "patches", "--results", tmp_path / "none")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("stamp-probe: check by hand (proposed: 0.34.0 is outside its range)\n"), out.stdout
    assert "a version string, not the fix's own code" in " ".join(out.stdout.split())


@pytest.mark.parametrize("args, message", [
    (["--release", "latest"], "is not a version"),
    (["--release", "0.33.0", "--source", "0.32.0"], "--source is vLLM 0.32.0, not the release 0.33.0"),
])
def test_bad_input_is_exit_2(args, message):
    out = patchkit("retire", *args, "--results", RESULTS)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
