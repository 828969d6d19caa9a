"""`patchkit bump body`: the body of the bump pull request, generated from one run's records.

tests/data/bump/run/ is a real recorded run (tests/data/bump/README.md has the commands): the patch set
with its 0.31+ edits stripped, rebased from vLLM 0.30.0 onto 0.33.0 by `patchkit rebase`, its behaviour
tests and four `patch-necessity` runs on 0.33.0, `patchkit retire`, `verify`, the kernel census of
0.33.0's wheel, and `patchkit upstream` on tests/data/github-api. tests/data/bump/vllm-0.33.0.md is the
body the same code renders from it (the golden file): regenerate it with

    patchkit bump body --release 0.33.0 $(python tests/test_bump.py) --output tests/data/bump/vllm-0.33.0.md
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit.verify.bump import BODY_LIMIT, body, load_run

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "bump"
RUN = DATA / "run"
GOLDEN = DATA / "vllm-0.33.0.md"


def run_args(run: Path = RUN) -> list[str]:
    """The command line naming every record of the run (paths relative to the checkout, as recorded)."""
    rel = run.relative_to(REPO) if run.is_relative_to(REPO) else run
    return ["--rebase", f"{rel}/rebase.json", "--results", f"{rel}/results", "--retire", f"{rel}/retire.json",
            "--verify", f"{rel}/verify.json", "--kernels", f"{rel}/kernels.json", "--upstream", f"{rel}/upstream.json",
            "--upstream-diff", f"{rel}/upstream.diff"]


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


@pytest.mark.parametrize("change, message", [
    (lambda run: (run / "rebase.json").write_text('{"ok": "yes"}'), "$.ok"),
    (lambda run: (run / "rebase.json").write_text("not json"), "not valid JSON"),
    (lambda run: (run / "kernels.json").write_text('{"wheel": 1}'), "$.wheel"),
    (lambda run: (run / "results" / "vllm-0.33.0.json").write_text('{"vllm": "0.33.0"}'), "excluded"),
])
def test_a_record_of_the_wrong_shape_is_exit_2_naming_it(tmp_path, change, message):
    run = copy_run(tmp_path)
    change(run)
    out = patchkit("bump", "body", "--release", "0.33.0", *run_args(run))
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_records_of_another_release_are_refused(tmp_path):
    out = patchkit("bump", "body", "--release", "0.34.0", *run_args())
    assert out.returncode == 2 and "a rebase onto vllm 0.33.0, not 0.34.0" in out.stderr


if __name__ == "__main__":  # the record options, for regenerating the golden file (module docstring)
    print(" ".join(run_args()))
