"""`patchkit bump body`: the body of the bump pull request, generated from one run's records.

tests/data/bump/run/ is a real recorded run (tests/data/bump/README.md has the commands): the patch set
with its 0.31+ edits stripped, rebased from vLLM 0.30.0 onto 0.33.0 by `patchkit rebase`, its behaviour
tests and four `patch-necessity` runs on 0.33.0, `patchkit retire`, `verify`, the kernel census of
0.33.0's wheel, and `patchkit upstream` on tests/data/github-api. tests/data/bump/vllm-0.33.0.md is the
body the same code renders from it (the golden file).

tests/data/bump/run-0.34.0/ holds the records of the bump job replayed on the real vLLM 0.34.0 by
tests/test_bump_workflow.py (which regenerates them and its body, tests/data/bump/vllm-0.34.0.md); here
the same body must come from those records alone, as `patchkit bump body` reads them.

tests/data/bump/run-0.34.0-held/ is an earlier replay of the job's steps on 0.34.0 (the same README), on
the patch set before its 0.34.0 edits: rebase exit 4 with four patches held for a person (their edits
and candidates), six re-anchored and written untested; no test environment, so no test record; retire
reading the probes and anchors of the held patches outside their range; verify failing (exit 2, its
error record: the FlashInfer 0.7.3 pin given explicitly is not on the index); the aarch64 census; the
upstream state from the HAND-WRITTEN GitHub answers. tests/data/bump/vllm-0.34.0-held.md is its body.
Regenerate these two golden files with

    patchkit bump body --release 0.33.0 $(python tests/test_bump.py 0.33.0) --output tests/data/bump/vllm-0.33.0.md
    patchkit bump body --release 0.34.0 $(python tests/test_bump.py held) --output tests/data/bump/vllm-0.34.0-held.md
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit.upstream.bump import BODY_LIMIT, body, load_run

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "bump"
RUN = DATA / "run"
GOLDEN = DATA / "vllm-0.33.0.md"
RUN_034 = DATA / "run-0.34.0"
GOLDEN_034 = DATA / "vllm-0.34.0.md"
RUN_HELD = DATA / "run-0.34.0-held"
GOLDEN_HELD = DATA / "vllm-0.34.0-held.md"
RUN_TESTED = DATA / "run-0.34.0-tested"
GOLDEN_TESTED = DATA / "vllm-0.34.0-tested.md"


def run_args(run: Path = RUN, verify: str = "verify.json") -> list[str]:
    """The command line naming every record of the run (paths relative to the checkout, as recorded)."""
    rel = run.relative_to(REPO) if run.is_relative_to(REPO) else run
    return ["--rebase", f"{rel}/rebase.json", "--results", f"{rel}/results", "--retire", f"{rel}/retire.json",
            "--verify", f"{rel}/{verify}", "--kernels", f"{rel}/kernels.json", "--upstream", f"{rel}/upstream.json",
            "--upstream-diff", f"{rel}/upstream.diff"]


def run_args_held() -> list[str]:
    """The earlier 0.34.0 run as its golden body reads it: the verify that failed."""
    return run_args(RUN_HELD, "verify-failed.json")


def run_args_job(run: Path = RUN_034) -> list[str]:
    """The replayed job's records named as its body step names them: the test records under the job's
    `~/.cache/patchkit/results` (the replay writes its home `~`; there were none)."""
    args = run_args(run)
    return [*args[:2], "--results", "~/.cache/patchkit/results", *args[4:]] if args[2] == "--results" else args


def patchkit(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "patchkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ}, timeout=120)


def test_regenerating_the_body_gives_the_golden_file(tmp_path):
    out = patchkit("bump", "body", "--release", "0.33.0", *run_args(), "--output", tmp_path / "body.md")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "body.md").read_text() == GOLDEN.read_text(), (
        "the bump body changed: regenerate tests/data/bump/vllm-0.33.0.md (this module's docstring) and review the diff")


def test_the_golden_body_says_what_the_run_found():
    text = GOLDEN.read_text()
    rebase = json.loads((RUN / "rebase.json").read_text())
    rebased = [p["patch"] for p in rebase["patches"] if p["state"] == "rebased"]
    assert f"{len(rebased)} patch(es) rebased" in text and "rebase vllm 0.30.0" in text
    for patch in rebase["patches"]:
        assert f"- `{patch['patch']}`: **{patch['state']}**" in text
    # the retirement the probes measured, with where they fired
    assert "proposed for retirement: `persistent-topk-cc12`, `glm53-always-think`" in text
    assert "(`vllm/_version.py`)" in text and "(`vllm/parser/glm47_moe.py`)" in text
    # the test table: the behaviour tests with the rebased series, and the necessity runs
    assert "| `pool-topk-init` | 7 passed | fails without it" in text
    assert "| `kda-fp32-taps` | 4 passed | fails without it (1 failed) | keep |" in text
    assert "every kernel the GLM-5.3 NVFP4 path needs loads on sm_121" in text
    assert "[vllm-project/vllm#53969](https://github.com/vllm-project/vllm/pull/53969)" in text
    assert "```diff" in text and "Nothing here merges without a person's review." in text


def copy_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(RUN, tmp_path / "run"))


def test_text_from_the_records_cannot_break_the_markdown(tmp_path):
    run = copy_run(tmp_path)
    rebase = json.loads((run / "rebase.json").read_text())
    hostile = "a | b\n| forged | row |\n```\n# heading"
    rebase["patches"][0]["needs_person"] = [{"edit": 1, "action": "replace", "reason": hostile,
                                             "candidates": ["````\nclosed the fence?\n````"]}]
    rebase["patches"][0]["detail"] = "x | y"
    (run / "rebase.json").write_text(json.dumps(rebase))
    text = body(load_run("0.33.0", run / "rebase.json"))
    assert "a \\| b \\| forged \\| row \\|" in text  # folded onto one line, pipes escaped
    assert "\n| forged |" not in text and "\n# heading" not in text
    assert "    `````text" in text  # the candidate fenced by one more backtick than it holds


def test_a_body_over_githubs_limit_is_cut(tmp_path):
    run = copy_run(tmp_path)
    (run / "upstream.diff").write_text("".join(f"+{'x' * 500}\n" for _ in range(390)))
    text = body(load_run("0.33.0", run / "rebase.json", upstream_diff=run / "upstream.diff"))
    assert len(text) < 65_536 and text.endswith("the records are in the run's log\n")
    assert len(text) > BODY_LIMIT


def test_only_the_rebase_is_required_and_what_did_not_run_is_said(tmp_path):
    text = body(load_run("0.33.0", RUN / "rebase.json"))
    assert "behaviour tests on 0.33.0: **not run** (behaviour tests not run (--no-tests))" in text
    assert "kernel census: not run" in text and "No diff recorded." in text


@pytest.mark.parametrize("name, content, said", [
    ("rebase.json", '{"ok": "yes"}', "does not validate: expected `bool`, got `str` at `$.ok`"),
    ("rebase.json", "not json", "does not validate: not valid JSON"),
    ("kernels.json", '{"wheel": 1}', "does not validate: expected `str`, got `int` at `$.wheel`"),
    ("verify.json", '{"exit_code": 1}', "does not validate: object missing required field `pinned`"),
    ("results/vllm-0.33.0.json", '{"vllm": "0.33.0"}', "does not validate: object missing required field `excluded`"),
    ("results/necessity/vllm-0.33.0-pool-topk-init.json", "[]", "does not validate: expected `object`, got `array`"),
])
def test_a_record_of_the_wrong_shape_is_a_line_naming_its_file_and_field(tmp_path, name, content, said):
    run = copy_run(tmp_path)
    (run / name).write_text(content)
    out = patchkit("bump", "body", "--release", "0.33.0", *run_args(run), "--output", tmp_path / "body.md")
    assert out.returncode == 0, out.stdout + out.stderr
    text = (tmp_path / "body.md").read_text()
    assert f"`{run / name}`: {said}" in text, text[:3000]
    assert "record(s) missing or not usable" in text and text.endswith("\n")


def test_records_of_another_release_are_a_line_and_not_used(tmp_path):
    out = patchkit("bump", "body", "--release", "0.34.0", *run_args(), "--output", tmp_path / "body.md")
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "body.md").read_text()
    assert "a rebase onto vllm 0.33.0, not 0.34.0: not used" in text
    assert "retirement measured on vllm 0.33.0, not 0.34.0: not used" in text
    assert "## The rebased patch.toml files\n\nNo rebase: the rebase record" in text
    assert "`persistent-topk-cc12`: **retire**" not in text  # nothing of 0.33.0's retirement is shown as 0.34.0's


def test_a_run_where_no_step_wrote_its_record_still_has_a_body(tmp_path, monkeypatch):
    """The bump job's body step, exactly as the workflow writes it, after steps that wrote nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bump").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "patchkit", "bump", "body", "--release", "0.34.0", "--rebase", "bump/rebase.json",
         "--results", str(tmp_path / "no-results"), "--retire", "bump/retire.json", "--verify", "bump/verify.json",
         "--kernels", "bump/kernels.json", "--upstream", "bump/upstream.json", "--upstream-diff",
         "bump/upstream.diff", "--output", "bump/body.md"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "bump" / "body.md").read_text()
    for what, path in (("the rebase record", "rebase"), ("the retire record", "retire"),
                       ("the verify record", "verify"), ("the kernel census", "kernels"),
                       ("the upstream state", "upstream")):
        assert f"{what} `bump/{path}.json`: missing: its step wrote nothing" in text, what
    assert "the UPSTREAM.md diff `bump/upstream.diff`: missing" in text
    assert f"no test record `{tmp_path / 'no-results' / 'vllm-0.34.0.json'}`" in text
    assert "**6 record(s) missing or not usable**" in text


@pytest.mark.parametrize("name", ["rebase.json", "retire.json", "verify.json", "kernels.json", "upstream.json"])
def test_a_failed_commands_error_record_is_a_line_with_its_message(tmp_path, name):
    """What every command writes with --json when it fails (`{"ok": false, "error": ...}`), as the workflow
    keeps it (`... --json > bump/verify.json || echo`); the message is outside text: folded and escaped."""
    run = copy_run(tmp_path)
    error = {"ok": False, "error": {"exit_code": 2, "kind": "error",
                                    "message": "flashinfer-python 0.7.3 is not on the package index | x\n# heading"}}
    (run / name).write_text(json.dumps(error))
    text = body(load_run("0.33.0", run / "rebase.json", results=run / "results", retire=run / "retire.json",
                         verify=run / "verify.json", kernels=run / "kernels.json", upstream=run / "upstream.json"))
    assert (f"`{run / name}`: the command failed (exit 2, error): flashinfer-python 0.7.3 is not on the package "
            "index \\| x # heading") in text
    assert "\n# heading" not in text


def test_a_record_over_its_limit_or_not_a_file_is_a_line(tmp_path, monkeypatch):
    run = copy_run(tmp_path)
    (run / "kernels.json").unlink()
    (run / "kernels.json").mkdir()
    monkeypatch.setenv("PATCHKIT_LIMIT_RUN_RECORD", "30000")  # verify.json is 25 KB, rebase.json 40 KB
    found = load_run("0.33.0", run / "rebase.json", kernels=run / "kernels.json", verify=run / "verify.json")
    said = dict(found.problems)
    assert found.rebase is None and "over the 30,000 B limit for a run-record" in said["rebase"], said
    assert said["kernels"].startswith(f"the kernel census `{run / 'kernels.json'}`: not read: "), said
    assert found.verify is not None
    text = body(found)
    assert "No rebase: the rebase record" in text and "No census: the kernel census" in text


def test_the_replayed_jobs_records_render_its_golden_body(tmp_path):
    """tests/test_bump_workflow.py checks the job's body; here the same bytes come from its records alone."""
    out = patchkit("bump", "body", "--release", "0.34.0", *run_args_job(), "--output", tmp_path / "body.md")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "body.md").read_text() == GOLDEN_034.read_text(), (
        "the records and the body of the replayed job disagree: regenerate both (tests/test_bump_workflow.py)")


def test_the_replayed_jobs_body_says_what_its_records_hold():
    text = GOLDEN_034.read_text()
    rebase = json.loads((RUN_034 / "rebase.json").read_text())
    assert f"(**rebase exit {rebase['exit_code']}**)" in text or rebase["exit_code"] == 0
    for patch in rebase["patches"]:
        assert f"- `{patch['patch']}`: **" in text
        for person in patch["needs_person"]:
            assert f"edit {person['edit']} ({person['action']}) **needs a person**: {person['reason']}" in text
    for patch in rebase["written_patches"]:
        assert f"`{patch}`" in text.split("; written: ", 1)[1].split("\n", 1)[0]
    assert "rebased**" not in text.split("## The rebased patch.toml files", 1)[1].split("\n## ", 1)[0], (
        "no test ran on 0.34.0 in the replay: nothing may read rebased")
    retire = json.loads((RUN_034 / "retire.json").read_text())
    for v in retire["verdicts"]:
        assert f"- `{v['patch']}`: **{v['verdict']}**" in text and v["evidence"], v
    verify = json.loads((RUN_034 / "verify.json").read_text())
    finding = next(c["companion"]["finding"] for c in verify["columns"] if c["label"] == "0.34.0")
    assert finding.startswith("flashinfer-python 0.7.3 unpublished") and f"- companion: 0.34.0: {finding}" in text
    assert "## Kernel census of `vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl`" in text
    assert "## Tracked upstream changes" in text and "behaviour tests on 0.34.0: **not run**" in text


def test_the_tested_replays_records_render_its_golden_body(tmp_path):
    """The replay whose `nox -s release-0.34.0` ran for real (tests/test_bump_workflow.py --write-tested): its
    body, from its records alone, the test record read where the job's home held it."""
    out = patchkit("bump", "body", "--release", "0.34.0", *run_args(RUN_TESTED), "--output", tmp_path / "body.md")
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "body.md").read_text().replace(f"{RUN_TESTED.relative_to(REPO)}/results", "~/.cache/patchkit/results")
    assert text == GOLDEN_TESTED.read_text(), (
        "the bump body changed: regenerate tests/data/bump/vllm-0.34.0-tested.md (its README) and review the diff")


def test_a_patch_is_rebased_only_where_its_tests_passed_on_the_release():
    """On the real run: a patch whose anchors all still match on 0.34.0 is "rebased" only where its behaviour
    tests passed there; nope-mla-pad's anchors match, its tests fail (0.34.0 serves the NoPE head natively, and
    the pad would change what it serves): "re-anchored, tests failed", never rebased."""
    text = GOLDEN_TESTED.read_text()
    results = json.loads((RUN_TESTED / "results" / "vllm-0.34.0.json").read_text())["tests"]
    rebase = json.loads((RUN_TESTED / "rebase.json").read_text())
    for patch in rebase["written_patches"]:
        module = f"tests/patches/test_{patch.replace('-', '_')}.py::"
        outcomes = {t if isinstance(t, str) else t["outcome"] for n, t in results.items() if n.startswith(module)}
        state = "rebased" if outcomes == {"passed"} else "re-anchored, tests failed"
        assert f"- `{patch}`: **{state}**" in text, (patch, outcomes)
    assert "- `nope-mla-pad`: **re-anchored, tests failed**" in text


def test_regenerating_the_held_0_34_0_body_gives_its_golden_file(tmp_path):
    out = patchkit("bump", "body", "--release", "0.34.0", *run_args_held(), "--output", tmp_path / "body.md")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "body.md").read_text() == GOLDEN_HELD.read_text(), (
        "the bump body changed: regenerate tests/data/bump/vllm-0.34.0-held.md (this module's docstring) and review the diff")


def test_the_held_0_34_0_body_says_what_the_real_run_found():
    """verify failed, the rebase left edits to a person, no behaviour test ran: each is a line of the body,
    beside what did run (what rebase wrote, retirement read on 0.34.0, the census, the tracked state)."""
    text = GOLDEN_HELD.read_text()
    rebase = json.loads((RUN_HELD / "rebase.json").read_text())
    assert rebase["ok"] is False
    people = [(p["patch"], n) for p in rebase["patches"] for n in p["needs_person"]]
    assert people, "the real 0.34.0 rebase leaves edits to a person"
    assert f"(**rebase exit {rebase['exit_code']}**)" in text and rebase["exit_code"] == 4
    listed = text.split("- edits that need a person: ", 1)[1].split("\n", 1)[0]
    for patch, person in people:
        assert f"edit {person['edit']} ({person['action']}) **needs a person**: {person['reason']}" in text
        assert f"`{patch}` edit" in listed
        for candidate in person["candidates"][:2]:  # each with its closest candidates, fenced
            assert "\n".join("    " + line for line in candidate.splitlines()[:1]) in text
    section = text.split("## The rebased patch.toml files", 1)[1].split("\n## ", 1)[0]
    heads = {line.split("`", 2)[1]: line for line in section.splitlines() if line.startswith("- `")}
    states = {p["patch"]: p["state"] for p in rebase["patches"]}
    for patch in rebase["written_patches"]:
        assert heads[patch].startswith(f"- `{patch}`: **{states[patch]}**") and heads[patch].endswith("; written")
        assert states[patch] == "re-anchored, untested"  # --no-tests: never "rebased"
    for patch, why in rebase["not_written"].items():
        assert "kept (proposed: `" in heads[patch] and heads[patch].endswith(f"; **not written**: {why}")
    # verify's error record, not an exit: the FlashInfer pin 0.7.3 was never published
    assert ("No matrix: the verify record `tests/data/bump/run-0.34.0-held/verify-failed.json`: the command failed "
            "(exit 2, error): flashinfer-python 0.7.3 is not on the package index") in text
    assert "- the matrix: **no record**" in text and "**1 record(s) missing or not usable**: verify" in text
    assert ("behaviour tests on 0.34.0: **not run** (no test record "
            "`tests/data/bump/run-0.34.0-held/results/vllm-0.34.0.json`") in text
    # retirement read on 0.34.0 also for the patches whose range still ends before it: the probe and the anchors
    retire = {v["patch"]: v for v in json.loads((RUN_HELD / "retire.json").read_text())["verdicts"]}
    outside = [v for v in retire.values() if not v["in_range"]]
    assert outside and "out of range" not in {v["verdict"] for v in retire.values()}
    for v in outside:
        assert f"- `{v['patch']}`: **{v['verdict']}** (proposed: 0.34.0 is outside its range)" in text
        assert len(v["evidence"]) >= 2 and v["evidence"][0]["kind"] == "range"
    assert retire["glm53-always-think"]["verdict"] == "retire"
    assert "[upstreamed] probe fires: 'def _glm53_always_thinks(' at line 149 (`vllm/parser/glm47_moe.py`)" in text
    assert retire["kda-fp32-taps"]["verdict"] == "check by hand"  # 0.34.0 fused the taps it guards
    assert "## Kernel census of `vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl`" in text
    assert "[vllm-project/vllm#54110](https://github.com/vllm-project/vllm/pull/54110)" in text


@pytest.mark.parametrize("run", [RUN_034, RUN_HELD], ids=["replayed", "held"])
def test_the_0_34_0_matrix_carries_the_flashinfer_pin_finding(run):
    """The matrix verify wrote as the workflow runs it: 0.34.0's column checked with the substitute
    FlashInfer, the finding a line of the summary and of the matrix."""
    text = body(load_run("0.34.0", run / "rebase.json", verify=run / "verify.json"))
    finding = "flashinfer-python 0.7.3 unpublished (index has 0.7.2.post1, 0.7.4): checked 0.7.2.post1 instead"
    assert f"- companion: 0.34.0: {finding}" in text and f"; 0.34.0: {finding}" in text
    code = json.loads((run / "verify.json").read_text())["exit_code"]
    assert f"Pinned: vLLM 0.33.0; verify exit {code}." in text and "| patch | 0.33.0 | 0.34.0 |" in text


def test_the_body_is_the_same_bytes_from_the_same_records(tmp_path):
    first = body(load_run("0.34.0", RUN_HELD / "rebase.json", results=RUN_HELD / "results",
                          retire=RUN_HELD / "retire.json", verify=RUN_HELD / "verify-failed.json",
                          kernels=RUN_HELD / "kernels.json", upstream=RUN_HELD / "upstream.json",
                          upstream_diff=RUN_HELD / "upstream.diff"))
    copied = Path(shutil.copytree(RUN_HELD, tmp_path / "elsewhere"))
    again = body(load_run("0.34.0", copied / "rebase.json", results=copied / "results",
                          retire=copied / "retire.json", verify=copied / "verify-failed.json",
                          kernels=copied / "kernels.json", upstream=copied / "upstream.json",
                          upstream_diff=copied / "upstream.diff"))
    assert again == first.replace(str(RUN_HELD), str(copied))  # only the paths it names differ


if __name__ == "__main__":  # the record options, for regenerating a golden file (module docstring)
    print(" ".join(run_args_held() if sys.argv[1:] == ["held"] else run_args()))
