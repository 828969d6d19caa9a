"""`patchkit upstream`: each patch's tracked upstream PRs and issues with the state GitHub's REST API answers.

The answers are tests/data/github-api/ (hand-written by GitHub's documented schema from the stored public
threads; its README says so and why), read through --answers as the daily workflow's recorded answers
would be. A stand-in `gh` (a shell script; GitHub is unreachable here, so the real CLI could only fail)
checks the live path: only its standard output is read, bounded, and kept with --record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit.patching.patchset import load_patchset
from patchkit.upstream.upstream_state import (
    CloseReason,
    GhAnswers,
    GitHubCliFailed,
    GitHubCliMissing,
    NoRecordedAnswer,
    NotAnAnswersFolder,
    RecordedAnswers,
    TrackedItemMismatch,
    TrackedKindMismatch,
    UpstreamState,
    api_path,
    tracked_states,
)

REPO = Path(__file__).resolve().parents[1]
ANSWERS = REPO / "tests" / "data" / "github-api"
PR = "repos/vllm-project/vllm/pulls"


def patchkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "patchkit", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def copy_answers(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ANSWERS, tmp_path / "answers"))


def test_every_tracked_entry_has_a_recorded_answer_and_nothing_else_is_recorded():
    patches = load_patchset(REPO / "patches").series()
    wanted = {f"{api_path(t)}.json" for p in patches for t in p.tracked}
    recorded = {str(p.relative_to(ANSWERS)) for p in ANSWERS.rglob("*.json")}
    assert wanted == recorded
    assert {p.id for p in patches if p.tracked} == {"nope-mla-pad", "persistent-topk-cc12", "pool-topk-init",
                                                    "glm53-always-think", "glm53-skipped-thinking",
                                                    "glm47-tool-args-think-end"}
    nope = load_patchset(REPO / "patches").patch("nope-mla-pad")
    assert {t.number for t in nope.tracked if t.kind == "pr"} == {53969, 55277, 55778}


def test_states_as_the_answers_give_them():
    states = {(s.patch_id, s.tracked.number): s
              for s in tracked_states(load_patchset(REPO / "patches").series(), RecordedAnswers(ANSWERS))}
    merged, closed = {("persistent-topk-cc12", 54110)}, {("pool-topk-init", 55201)}
    assert {k: s.state for k, s in states.items()} == {
        k: UpstreamState.MERGED if k in merged else UpstreamState.CLOSED if k in closed else UpstreamState.OPEN
        for k in states}
    assert len(states) == 13 and all(s.reason is None for s in states.values())  # no answer gives a state_reason
    merged = states[("persistent-topk-cc12", 54110)]
    # the API names no release; the patch's own record (merged-in-0.30.0 for this very PR) does
    assert (merged.released_in, merged.released_from) == ("0.30.0", "patch.toml")
    assert states[("pool-topk-init", 55201)].released_in is None  # closed unmerged: shipped nowhere
    assert states[("nope-mla-pad", 53969)].url == "https://github.com/vllm-project/vllm/pull/53969"


def test_the_command_shows_them_and_json_carries_what_each_would_fix():
    shown = patchkit("upstream", "--answers", ANSWERS, env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    assert "vllm-project/vllm#53969 pr" in shown.stdout and "merged" in shown.stdout
    assert "no upstream change tracked: naming-shim, kda-fp32-taps" in " ".join(shown.stdout.split())
    out = patchkit("upstream", "--answers", ANSWERS, "--patch", "persistent-topk-cc12", "--json")
    assert out.returncode == 0, out.stderr
    [entry] = json.loads(out.stdout)["tracked"]
    assert entry["number"] == 54110 and entry["state"] == "merged" and entry["released_in"] == "0.30.0"
    assert "low-shared-memory" in entry["fixes"] and entry["source"].endswith("pulls/54110.json")


def test_a_milestone_naming_a_release_is_where_a_merge_shipped(tmp_path):
    answers = copy_answers(tmp_path)
    path = answers / PR / "55201.json"
    answer = json.loads(path.read_text()) | {"merged": True, "merged_at": "2026-09-20T10:00:00Z",
                                             "milestone": {"title": "v0.34.0", "number": 7}}
    path.write_text(json.dumps(answer))
    out = patchkit("upstream", "--answers", answers, "--patch", "pool-topk-init", "--json")
    [entry] = json.loads(out.stdout)["tracked"]
    assert (entry["state"], entry["released_in"], entry["released_from"], entry["closed_at"]) == (
        "merged", "0.34.0", "milestone", "2026-09-20T10:00:00Z")


ISSUE = "repos/vllm-project/vllm/issues/54744.json"  # glm53-always-think's tracked issue


@pytest.mark.parametrize("reason, member, words", [
    ("completed", CloseReason.COMPLETED, "closed (completed)"),
    ("not_planned", CloseReason.NOT_PLANNED, "closed (not planned)"),
    ("duplicate", CloseReason.DUPLICATE, "closed (duplicate)"),
    ("spam_filtered", "spam_filtered", "closed (spam filtered)"),  # a reason GitHub added since: kept as its text
    (None, None, "closed"),
])
def test_a_closed_issue_says_why_and_only_a_completed_one_shipped(tmp_path, reason, member, words):
    answers = copy_answers(tmp_path)
    answer = json.loads((answers / ISSUE).read_text()) | {
        "state": "closed", "state_reason": reason, "closed_at": "2026-09-20T10:00:00Z", "milestone": {"title": "v0.35.0"}}
    (answers / ISSUE).write_text(json.dumps(answer))
    patch = load_patchset(REPO / "patches").patch("glm53-always-think")
    [state] = [s for s in tracked_states([patch], RecordedAnswers(answers)) if s.tracked.number == 54744]
    assert (state.state, state.reason, state.words) == (UpstreamState.CLOSED, member, words)
    assert type(state.reason) is (CloseReason if isinstance(member, CloseReason) else type(member))
    assert state.released_in == ("0.35.0" if member == CloseReason.COMPLETED else None)
    out = patchkit("upstream", "--answers", answers, "--patch", "glm53-always-think", "--json")
    entry = next(e for e in json.loads(out.stdout)["tracked"] if e["number"] == 54744)
    assert (entry["state"], entry["reason"], entry["released_in"]) == ("closed", reason, state.released_in)
    shown = patchkit("upstream", "--answers", answers, "--patch", "glm53-always-think", env={"COLUMNS": "250"})
    assert shown.returncode == 0 and f" {words} " in shown.stdout, shown.stdout


@pytest.mark.parametrize("answer, expected", [
    ('{"number": 55201, "state": "merged"}', "$.state"),  # GitHub's state is open|closed; merged is a flag
    ('{"number": "55201"}', "$.number"),
    ("<html>rate limited</html>", "not valid JSON"),
    ("[1, 2]", "expected `object`"),
])
def test_an_answer_of_the_wrong_shape_is_exit_2_naming_where(tmp_path, answer, expected):
    answers = copy_answers(tmp_path)
    (answers / PR / "55201.json").write_text(answer)
    out = patchkit("upstream", "--answers", answers)
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr and "pulls/55201" in out.stderr and "Traceback" not in out.stderr


def test_an_answer_for_another_object_is_refused(tmp_path):
    answers = copy_answers(tmp_path)
    other = json.loads((answers / PR / "55277.json").read_text())
    (answers / PR / "55201.json").write_text(json.dumps(other))  # a redirect to, or a mix-up with, #55277
    out = patchkit("upstream", "--answers", answers)
    assert out.returncode == 2 and "#55277" in out.stderr and "not the pr asked for" in out.stderr
    with pytest.raises(TrackedItemMismatch) as err:
        tracked_states([load_patchset(REPO / "patches").patch("pool-topk-init")], RecordedAnswers(answers))
    assert (err.value.source, err.value.answered, err.value.kind) == (str(answers / PR / "55201.json"), 55277, "pr")
    assert err.value.answered_url == other["html_url"]
    assert err.value.expected_url == "https://github.com/vllm-project/vllm/pull/55201"
    assert err.value.patch_toml == REPO / "patches" / "pool-topk-init" / "patch.toml"


def test_an_issue_that_is_a_pull_request_names_the_fix(tmp_path):
    answers = copy_answers(tmp_path)
    issue = answers / "repos/vllm-project/vllm/issues/54744.json"
    answer = json.loads(issue.read_text()) | {"html_url": "https://github.com/vllm-project/vllm/pull/54744",
                                              "pull_request": {"url": "https://api.github.com/repos/x/y/pulls/54744"}}
    issue.write_text(json.dumps(answer))
    out = patchkit("upstream", "--answers", answers)
    assert out.returncode == 2 and 'set kind = "pr"' in out.stderr
    with pytest.raises(TrackedKindMismatch) as err:
        tracked_states([load_patchset(REPO / "patches").patch("glm53-always-think")], RecordedAnswers(answers))
    assert (err.value.repo, err.value.number, err.value.url) == ("vllm-project/vllm", 54744, answer["html_url"])
    assert err.value.patch_toml == REPO / "patches" / "glm53-always-think" / "patch.toml"


def test_an_oversized_answer_is_refused_unread(tmp_path):
    out = patchkit("upstream", "--answers", ANSWERS, env={"PATCHKIT_LIMIT_GITHUB_ANSWER": "100"})
    assert out.returncode == 2 and "PATCHKIT_LIMIT_GITHUB_ANSWER" in out.stderr


def test_a_missing_answer_says_how_to_record_it(tmp_path):
    answers = copy_answers(tmp_path)
    (answers / PR / "53969.json").unlink()
    out = patchkit("upstream", "--answers", answers)
    assert out.returncode == 2 and f"gh api {PR}/53969 >" in out.stderr
    with pytest.raises(NoRecordedAnswer) as err:
        RecordedAnswers(answers).read(f"{PR}/53969")
    assert (err.value.folder, err.value.api_path) == (answers, f"{PR}/53969")


def test_answers_that_are_not_a_folder_are_refused(tmp_path):
    answers = tmp_path / "answers.json"  # the one answer given where the folder of them is asked for
    answers.write_text((ANSWERS / PR / "55201.json").read_text())
    with pytest.raises(NotAnAnswersFolder) as err:
        RecordedAnswers(answers)
    assert err.value.folder == answers


def stand_in_gh(tmp_path: Path, body: str) -> Path:
    gh = tmp_path / "gh"
    gh.write_text("#!/bin/sh\n" + body)
    gh.chmod(0o755)
    return gh


def test_live_answers_come_from_gh_stdout_only_and_record_replays(tmp_path):
    # prints the recorded answer for the path it is given, and a note on stderr as gh does for a redirect
    gh = stand_in_gh(tmp_path, f'echo "note: followed a redirect" >&2\ncat "{ANSWERS}/$2.json"\n')
    kept = tmp_path / "kept"
    out = patchkit("upstream", "--gh", gh, "--record", kept, "--json")
    assert out.returncode == 0, out.stderr
    live = json.loads(out.stdout)["tracked"]
    assert {f"{p.relative_to(kept)}" for p in kept.rglob("*.json")} == {
        f"{p.relative_to(ANSWERS)}" for p in ANSWERS.rglob("*.json")}
    replayed = json.loads(patchkit("upstream", "--answers", kept, "--json").stdout)["tracked"]
    assert [(e["number"], e["state"]) for e in live] == [(e["number"], e["state"]) for e in replayed]


def test_gh_failing_is_exit_2_with_its_message(tmp_path):
    gh = stand_in_gh(tmp_path, 'echo "gh: Not Found (HTTP 404)" >&2\nexit 1\n')
    out = patchkit("upstream", "--gh", gh, "--patch", "pool-topk-init")
    assert out.returncode == 2 and "HTTP 404" in out.stderr and f"{PR}/55201" in out.stderr
    with pytest.raises(GitHubCliFailed) as err:
        GhAnswers(str(gh)).read(f"{PR}/55201")
    assert (err.value.gh, err.value.api_path, err.value.detail) == (str(gh), f"{PR}/55201", "gh: Not Found (HTTP 404)")
    silent = stand_in_gh(tmp_path, "exit 4\n")  # fails saying nothing: how it ended is the detail
    with pytest.raises(GitHubCliFailed) as err:
        GhAnswers(str(silent)).read(f"{PR}/55201")
    assert err.value.detail == "exit status 4"


def test_an_endless_gh_answer_is_cut_at_the_limit(tmp_path):
    gh = stand_in_gh(tmp_path, "exec yes\n")
    out = patchkit("upstream", "--gh", gh, "--patch", "pool-topk-init", env={"PATCHKIT_LIMIT_GITHUB_ANSWER": "65536"})
    assert out.returncode == 2 and "PATCHKIT_LIMIT_GITHUB_ANSWER" in out.stderr


def test_no_gh_at_all_says_what_to_do(tmp_path):
    out = patchkit("upstream", "--gh", tmp_path / "no-such-gh")
    assert out.returncode == 2 and "--answers DIR" in out.stderr
    with pytest.raises(GitHubCliMissing) as err:
        GhAnswers(str(tmp_path / "no-such-gh")).read(f"{PR}/55201")
    assert (err.value.gh, err.value.api_path) == (str(tmp_path / "no-such-gh"), f"{PR}/55201")
    assert err.value.reason == os.strerror(2)  # ENOENT, as the operating system words it


def test_write_still_regenerates_upstream_md(tmp_path):
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    out = patchkit("upstream", "--write", "--patches", tmp_path / "patches")
    assert out.returncode == 0, out.stderr
    from patchkit.upstream.upstream_md import render

    text = (tmp_path / "UPSTREAM.md").read_text()
    assert text == render(load_patchset(tmp_path / "patches")) and "tracked pr [vllm-project/vllm#53969]" in text
