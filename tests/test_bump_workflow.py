"""The daily workflow's `bump` job, replayed here on the real vLLM 0.34.0, step by step as
.github/workflows/verify-upstream.yml writes it.

The job's steps are read from the workflow (YAML) and each `run:` script is run in order, as GitHub runs
it (`bash --noprofile --norc -eo pipefail`, the job's and the step's `env:` with their `${{ }}`
expressions substituted), in a fresh copy of this checkout; each step must end with a status the
workflow accepts (0: no step of the job continues on error). What the replay substitutes, and how:

- `actions/checkout`: the checkout's files (tracked and untracked, not ignored), copied and committed
  into a fresh git repository, as a checkout of that commit would hold them, with the patch set and the
  pin (RELEASE_DAY_PIN) the job met on 0.34.0's release day: it bumps from the pinned release, and once
  the pin is 0.34.0 there is nothing newer to bump to;
- `actions/setup-python` and the install step (`pip install nox uv --editable .`): not run; `python` and
  `patchkit` on PATH are this interpreter with the copy's `src` first on its path (what an editable
  install gives), `nox` the one these tests run beside;
- `nox -s SESSION` (the release's behaviour tests, patch-necessity, vLLM's own tests): not run, marked
  in the step's log (a vLLM test environment and its tests are hours); `nox --list` runs for real, so the
  step's test of whether the noxfile has the release's session is the workflow's own;
- the package index: a real HTTP index on 127.0.0.1 answering the index's real pages as recorded
  (tests/data/index/); the archives (vLLM 0.33.0's and 0.34.0's sdists, FlashInfer 0.7.2.post1's, 0.34.0's
  aarch64 wheel) from the user cache, where patchkit downloaded them from the real index (hence `network`),
  linked into the replay's own `~/.cache/patchkit`;
- GitHub (HAND-WRITTEN, marked): `gh api` answers with tests/data/github-api/ (hand-written answers, that
  folder's README), `gh pr view` says there is no pull request yet, `gh pr create` and `gh pr edit` are
  recorded, not sent; `git push` to github.com goes to a local bare repository (git's `url.insteadOf`),
  `GITHUB_REPOSITORY` and the token are hand-written.

The body the job writes (`bump/body.md`) is the golden file tests/data/bump/vllm-0.34.0.md, and the
records it was rendered from are tests/data/bump/run-0.34.0/. The replay's own home folder is written
`~` in both (it is a fresh temporary folder each run). Regenerate both, byte for byte, with

    PYTHONPATH=src $PY tests/test_bump_workflow.py --write

($PY: the `tests` nox environment's python, as for the suite), then review the diff.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rebase_folders import SERIES
from record_fields import declared_but_absent

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "verify-upstream.yml"
DATA = REPO / "tests" / "data"
GOLDEN = DATA / "bump" / "vllm-0.34.0.md"
RECORDS = DATA / "bump" / "run-0.34.0"
# `--write-tested`: the same replay with the release's behaviour tests run for real (not in the suite: ~12 min)
GOLDEN_TESTED = DATA / "bump" / "vllm-0.34.0-tested.md"
RECORDS_TESTED = DATA / "bump" / "run-0.34.0-tested"
RELEASE = "0.34.0"
RELEASE_DAY_PIN = "0.33.0"  # the pinned release when 0.34.0 came out: what the job bumped from
# hand-written stand-ins for what only GitHub gives a workflow run
GITHUB_REPOSITORY = "patchkit-replay/patchkit"
GITHUB_TOKEN = "hand-written-token"
EXPRESSIONS = {"matrix.release": RELEASE, "github.token": GITHUB_TOKEN}
# what the replay's records keep: the files the job's steps write under bump/ (body.md is the golden file)
RECORDED = ("rebase.json", "upstream.diff", "retire.json", "verify.json", "kernels.json", "upstream.json")
STEP_TIMEOUT_S = 600

pytestmark = pytest.mark.network  # the real archives, downloaded once into the user cache


@dataclass
class StepRun:
    name: str
    how: str  # "run" (its script, as written) | "substituted: ..." (what stood in for it)
    returncode: int = 0
    output: str = ""


@dataclass
class Replay:
    home: Path
    checkout: Path
    steps: list[StepRun] = field(default_factory=list)
    index_requests: list[str] = field(default_factory=list)
    gh_calls: list[list[str]] = field(default_factory=list)
    nox_sessions: list[str] = field(default_factory=list)  # the `nox -s ...` runs the replay stood in for
    origin: Path | None = None

    def text(self, path: Path) -> str:
        """A file the job wrote, its home folder written `~` (a fresh temporary folder each run)."""
        return path.read_text().replace(str(self.home), "~")

    @property
    def body(self) -> str:
        return self.text(self.checkout / "bump" / "body.md")


def bump_job() -> dict:
    import yaml

    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["bump"]


def substitute(text: str) -> str:
    """The `${{ }}` expressions a bump step uses; any other is a new dependency of the job on GitHub, and
    this replay must learn to stand in for it (so it fails, naming it)."""
    def one(match: re.Match) -> str:
        expression = match.group(1).strip()
        if expression not in EXPRESSIONS:
            raise AssertionError(f"the bump job uses ${{{{ {expression} }}}}: the replay has no stand-in for it")
        return EXPRESSIONS[expression]

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def accepted(step: dict) -> set[int] | None:
    """The exit statuses of a step the job goes on after: 0, or any where it continues on error."""
    return None if step.get("continue-on-error") in (True, "true") else {0}


def real_archives() -> dict[str, list[Path]]:
    """The archives the job reads, from the user cache (downloaded from the real index once): cache folder
    (relative to the cache root) -> the archive and its record."""
    from patchkit.cache_root import default_cache_root
    from patchkit.sources import open_source
    from patchkit.sources.cache import ArchiveCache
    from patchkit.wheels.release import release_wheel

    env = {k: os.environ.pop(k) for k in ("PATCHKIT_INDEX_URL",) if k in os.environ}
    try:
        user = ArchiveCache()
        found: dict[str, list[Path]] = {"downloads": []}
        for dist, version in (("vllm", RELEASE_DAY_PIN), ("vllm", RELEASE), ("flashinfer-python", "0.7.2.post1")):
            open_source(f"{dist}=={version}", cache=user, progress=False)
            cached = user.lookup(dist, version)
            assert cached is not None, (dist, version)
            found["downloads"] += [cached.path, cached.path.parent / f"{dist}-{version}.json"]
        wheel = release_wheel(RELEASE, "aarch64", progress=False)
        found["wheels/aarch64/downloads"] = [wheel, wheel.parent / f"vllm-{RELEASE}.json"]
        assert all(p.is_relative_to(default_cache_root()) for ps in found.values() for p in ps)
        return found
    finally:
        os.environ.update(env)


def _link(source: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if source.suffix == ".json":  # a record: rewritten by the cache when it re-verifies, never shared
        shutil.copy(source, folder)
        return
    try:
        os.link(source, folder / source.name)
    except OSError:  # another file system
        shutil.copy(source, folder)


def _copy_checkout(into: Path) -> None:
    """actions/checkout's stand-in: the checkout's files (tracked and untracked, not ignored) as one commit,
    with the patch set the job met on 0.34.0's release day (SERIES, and the UPSTREAM.md made from it) in
    place of today's patches/, which already carries the 0.34.0 port (nothing would be left to rebase)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() and not source.is_symlink():  # a file deleted in the working tree is not there
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    shutil.rmtree(into / "patches")
    shutil.copytree(SERIES, into / "patches")
    _pin_as_on_release_day(into)
    subprocess.run([sys.executable, "-m", "patchkit", "upstream", "--write", "--patches", "patches"], cwd=into,
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(into / "src")})
    git = {"GIT_AUTHOR_NAME": "replay", "GIT_AUTHOR_EMAIL": "replay@invalid", "GIT_COMMITTER_NAME": "replay",
           "GIT_COMMITTER_EMAIL": "replay@invalid", "GIT_AUTHOR_DATE": "2026-12-03T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-12-03T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the checkout"]):
        subprocess.run(["git", *args], cwd=into, check=True, env={**os.environ, **git}, capture_output=True)


def _pin_as_on_release_day(into: Path) -> None:
    """The copy's patchkit pinned to RELEASE_DAY_PIN, whatever this checkout pins: set after the package's own
    constants (its supported releases, which hold both), so every module reading the pin reads that one."""
    init = into / "src" / "patchkit" / "__init__.py"
    init.write_text(init.read_text() + f"\n# the bump replay: pinned as on vLLM {RELEASE}'s release day\n"
                    f'PINNED_VLLM = "{RELEASE_DAY_PIN}"\n'
                    'PINNED_SOURCES = (f"vllm=={PINNED_VLLM}", *PINNED_SOURCES[1:])\n')
    said = subprocess.run([sys.executable, "-c", "import patchkit as p; print(p.PINNED_VLLM, *p.SUPPORTED_VLLM)"],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(into / "src")})
    pinned, *supported = said.stdout.split()
    assert pinned == RELEASE_DAY_PIN and {RELEASE_DAY_PIN, RELEASE} <= set(supported), said.stdout


GH = r'''#!{python}
"""gh, HAND-WRITTEN for the replay: `gh api PATH` answers with tests/data/github-api/PATH.json (hand-written
answers); `gh pr view` finds no pull request; `gh pr create|edit` are recorded in {log}, not sent."""
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\n")
if args[:1] == ["api"] and len(args) == 2:
    answer = Path({answers!r}) / (args[1] + ".json")
    if not answer.is_file():
        sys.exit(f"gh: HTTP 404: Not Found (no hand-written answer {{answer}})")
    sys.stdout.write(answer.read_text())
elif args[:2] == ["pr", "view"]:
    sys.exit("no pull requests found for branch " + repr(args[2]))
elif args[:2] in (["pr", "create"], ["pr", "edit"]):
    print("https://github.com/{repository}/pull/1")
else:
    sys.exit("gh (replay): not a command the bump job runs: " + " ".join(args))
'''

NOX = r'''#!/bin/sh
# nox for the replay: `nox --list` is the real one; a session run is not (hours of a vLLM environment),
# but for the sessions named in REAL (`--write-tested`: the release's behaviour tests)
case "$1" in
  --list|-l) exec {nox} "$@" ;;
esac
case " {real} " in
  *" $2 "*) printf '%s\n' "$* (run)" >> {log}; exec {nox} "$@" ;;
esac
printf '%s\n' "$*" >> {log}
echo "replay: \`nox $*\` substituted: not run (a vLLM test environment and its tests: hours; the workflow runs it)" >&2
exit 97
'''


def _shims(bin_dir: Path, checkout: Path, gh_log: Path, nox_log: Path, real: tuple[str, ...] = ()) -> None:
    nox = shutil.which("nox")
    assert nox, "nox is not on PATH: the bump job installs it (pip install nox); the replay runs beside one"
    bin_dir.mkdir()
    scripts = {
        "python": f'#!/bin/sh\nexec {sys.executable} "$@"\n',
        "patchkit": f'#!/bin/sh\nPYTHONPATH={checkout / "src"} exec {sys.executable} -m patchkit "$@"\n',
        "gh": GH.format(python=sys.executable, log=str(gh_log), answers=str(DATA / "github-api"),
                        repository=GITHUB_REPOSITORY),
        "nox": NOX.format(nox=nox, log=nox_log, real=" ".join(real)),
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


def _environment(tmp: Path, home: Path, bin_dir: Path, index_url: str, origin: Path) -> dict[str, str]:
    from patchkit.sources.cache import key_path

    gitconfig = tmp / "gitconfig"  # the push to github.com goes to a local bare repository
    remote = f"https://x-access-token:{GITHUB_TOKEN}@github.com/{GITHUB_REPOSITORY}.git"
    gitconfig.write_text(f'[url "{origin.as_uri()}"]\n\tinsteadOf = {remote}\n')
    dropped = ("PATCHKIT_", "XDG_", "GITHUB_", "GH_", "VIRTUAL_ENV", "PYTHONPATH", "NOX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    return env | {
        "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PATCHKIT_STATE_DIR": str(key_path().parent),  # the user's cache key: the linked archives' records hold
        "PATCHKIT_INDEX_URL": index_url, "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
        "GITHUB_REPOSITORY": GITHUB_REPOSITORY, "GITHUB_ACTIONS": "true", "CI": "true",
        "GIT_CONFIG_GLOBAL": str(gitconfig), "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_DATE": "2026-12-03T00:00:00Z", "GIT_COMMITTER_DATE": "2026-12-03T00:00:00Z",
    }


def _substituted(step: dict) -> str | None:
    """How a step the replay does not run as written stands in, or None for a step run as written."""
    uses = step.get("uses", "")
    if uses.startswith("actions/checkout@"):
        return "substituted: the checkout's files committed into a fresh git repository"
    if uses.startswith("actions/setup-python@"):
        return f"substituted: `python` is {sys.executable}"
    if uses:
        raise AssertionError(f"the bump job uses {uses}: the replay has no stand-in for it")
    if re.search(r"\bpip install\b", step["run"]):
        return "substituted: `patchkit` runs the copy's src (an editable install), nox is the one beside the tests"
    return None


def replay(tmp: Path, tested: bool = False) -> Replay:
    """The job's steps in order. `tested`: the release's behaviour tests run for real (`nox -s release-V`, in
    the release's test environment of the user cache, linked with uv's cache into the replay's home), so
    the body reads their record; necessity and vLLM's own tests still stand in."""
    from test_sources import FakeIndex

    home, checkout, origin = tmp / "home", tmp / "checkout", tmp / "origin.git"
    checkout.mkdir(parents=True)
    _copy_checkout(checkout)
    for folder, paths in real_archives().items():
        for path in paths:
            _link(path, home / ".cache" / "patchkit" / folder)
    if tested:
        from patchkit.cache_root import default_cache_root

        (home / ".cache" / "patchkit" / "nox").symlink_to(default_cache_root() / "nox", target_is_directory=True)
        (home / ".cache" / "uv").symlink_to(Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv")),
                                           target_is_directory=True)
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True, capture_output=True)
    index = FakeIndex()
    for page in (DATA / "index").glob("*.json"):
        index.recorded[page.stem] = page.read_bytes()
    gh_log, nox_log = tmp / "gh.log", tmp / "nox.log"
    gh_log.touch()
    nox_log.touch()
    _shims(tmp / "bin", checkout, gh_log, nox_log, real=(f"release-{RELEASE}",) if tested else ())
    env = _environment(tmp, home, tmp / "bin", index.url, origin)
    job = bump_job()
    job_env = {k: substitute(str(v)) for k, v in job.get("env", {}).items()}
    result = Replay(home, checkout, origin=origin)
    try:
        for number, step in enumerate(job["steps"], 1):
            name = step.get("name") or step.get("uses") or f"step {number}"
            how = _substituted(step)
            if how is not None:
                result.steps.append(StepRun(name, how))
                continue
            script = tmp / f"step-{number}.sh"
            script.write_text(substitute(step["run"]))
            step_env = env | job_env | {k: substitute(str(v)) for k, v in step.get("env", {}).items()}
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=checkout,
                                  env=step_env, capture_output=True, text=True,
                                  timeout=STEP_TIMEOUT_S * (6 if tested else 1))
            result.steps.append(StepRun(name, "run", proc.returncode, proc.stdout + proc.stderr))
            allowed = accepted(step)
            if allowed is not None and proc.returncode not in allowed:
                break  # the job stops here, as GitHub stops it
    finally:
        index.server.shutdown()
        index.server.server_close()
    result.index_requests = list(index.requests)
    result.gh_calls = [json.loads(line) for line in gh_log.read_text().splitlines()]
    result.nox_sessions = nox_log.read_text().splitlines()
    return result


def patch_set_digest(patches: Path) -> str:
    """One line per file of the patch set the job started from: the golden body is of that patch set."""
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(patches.parent)}"
             for p in sorted(patches.rglob("*")) if p.is_file()]
    return "\n".join(lines) + "\n"


def write_golden(run: Replay, records: Path = RECORDS, golden: Path = GOLDEN) -> None:
    records.mkdir(parents=True, exist_ok=True)
    for name in RECORDED:
        (records / name).write_text(run.text(run.checkout / "bump" / name))
    (records / "patches.sha256").write_text(patch_set_digest(SERIES))
    results = run.home / ".cache" / "patchkit" / "results"
    for record in sorted(results.rglob("*.json")) if results.is_dir() else []:  # the tests' own, when they ran
        (records / "results" / record.relative_to(results)).parent.mkdir(parents=True, exist_ok=True)
        (records / "results" / record.relative_to(results)).write_text(run.text(record))
    golden.write_text(run.body)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Replay:
    return replay(tmp_path_factory.mktemp("bump-replay"))


def test_every_step_of_the_bump_job_runs_in_order_with_a_status_the_workflow_accepts(replayed):
    job = bump_job()
    assert [s.name for s in replayed.steps] == [s.get("name") or s.get("uses") for s in job["steps"]], (
        "the job stopped early: " + "\n".join(f"{s.name}: exit {s.returncode}\n{s.output[-3000:]}" for s in replayed.steps))
    for step, ran in zip(job["steps"], replayed.steps, strict=True):
        allowed = accepted(step)
        assert allowed is None or ran.returncode in allowed, f"{ran.name}: exit {ran.returncode}\n{ran.output[-3000:]}"
    run = [s.name for s in replayed.steps if s.how == "run"]
    assert len(run) == len([s for s in job["steps"] if "run" in s]) - 1, run  # only the install step stands in


def test_the_test_step_asks_the_noxfile_and_names_the_releases_sessions(replayed):
    """Where the noxfile lists `release-0.34.0` (it lists a release whose sdist is in the cache, and the
    job's rebase put it there), the step runs the release's tests, necessity and vLLM's own tests, in that
    order, the last with `--fresh` (a new release's stock outcomes are measured, never remembered; stood
    in for here, and said in its log); where it does not, the step says so and runs none."""
    [step] = [s for s in replayed.steps if "behaviour tests" in s.name]
    if replayed.nox_sessions:
        assert replayed.nox_sessions == [f"-s release-{RELEASE}", f"-s patch-necessity -- {RELEASE}",
                                         f"-s vllm-tests-{RELEASE} -- --fresh"], replayed.nox_sessions
        assert "substituted: not run" in step.output
    else:
        assert f"no nox session release-{RELEASE}" in step.output, step.output


def test_the_steps_wrote_every_record_and_the_body(replayed):
    bump = replayed.checkout / "bump"
    for name in (*RECORDED, "body.md"):
        assert (bump / name).is_file(), (name, [s.output[-2000:] for s in replayed.steps])
    summary = (replayed.home.parent / "summary.md").read_text()  # $GITHUB_STEP_SUMMARY: the last step's copy
    assert summary.endswith((bump / "body.md").read_text())


def test_the_body_is_the_golden_file(replayed):
    digest = patch_set_digest(SERIES)
    assert replayed.body == GOLDEN.read_text(), (
        "the bump job's body on 0.34.0 changed"
        + ("" if (RECORDS / "patches.sha256").read_text() == digest else " (the patch set changed since it was recorded)")
        + ": regenerate it (`PYTHONPATH=src $PY tests/test_bump_workflow.py --write`) and review the diff")


@pytest.mark.parametrize("step", ["rebase", "retire", "verify", "kernels", "upstream"])
def test_every_record_the_job_wrote_is_the_type_the_body_reads(replayed, step):
    """The producers' real records of this run decode into the types bump reads them through (the
    producers' own), and every field those declare is there: a field a producer renames, even one the
    reader defaults for an older record, fails here."""
    from patchkit.jsondata import decode
    from patchkit.upstream.bump_records import SCHEMAS

    data = (replayed.checkout / "bump" / f"{step}.json").read_bytes()
    decode(data, SCHEMAS[step], step)
    assert declared_but_absent(SCHEMAS[step], json.loads(data)) == []


def test_the_index_was_asked_only_what_is_recorded(replayed):
    """The archives came from the cache; the index was asked for the FlashInfer page 0.34.0's unpublished
    pin needs, answered as recorded (an unrecorded page would be a 404 and a failed step)."""
    assert replayed.index_requests, "the unpublished flashinfer-python 0.7.3 pin was never looked up"
    recorded = {f"/simple/{p.stem}/" for p in (DATA / "index").glob("*.json")}
    assert set(replayed.index_requests) <= recorded, replayed.index_requests


def test_the_pull_request_is_opened_with_the_body_and_the_rebased_patches_pushed(replayed):
    """GitHub's part, HAND-WRITTEN: the calls the step made, and the branch it pushed to the stand-in remote."""
    pr = [c for c in replayed.gh_calls if c[:1] == ["pr"]]
    assert [c[:2] for c in pr] == [["pr", "view"], ["pr", "create"]], pr
    create = pr[1]
    assert create[create.index("--body-file") + 1] == "bump/body.md" and "--base" in create and "main" in create
    assert all(c[:1] == ["api"] for c in replayed.gh_calls if c[:1] != ["pr"])
    branch = f"bump/vllm-{RELEASE}"
    pushed = subprocess.run(["git", "--git-dir", str(replayed.origin), "diff", "--name-only", "main", branch],
                            capture_output=True, text=True)
    rebase = json.loads((replayed.checkout / "bump" / "rebase.json").read_text())
    written = rebase["written_patches"]
    if pushed.returncode != 0:  # main was never pushed: the branch's own commit against its parent
        pushed = subprocess.run(["git", "--git-dir", str(replayed.origin), "show", "--name-only", "--format=",
                                 branch], capture_output=True, text=True, check=True)
    changed = {line.split("/")[1] for line in pushed.stdout.splitlines() if line.startswith("patches/")}
    assert written and changed == set(written), (changed, written)


if __name__ == "__main__":  # regenerate the golden body and its records (the module's docstring)
    if sys.argv[1:] not in (["--write"], ["--write-tested"]):
        sys.exit("usage: PYTHONPATH=src python tests/test_bump_workflow.py --write|--write-tested")
    tested = sys.argv[1:] == ["--write-tested"]
    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory(prefix="patchkit-bump-replay-") as folder:
        found = replay(Path(folder), tested=tested)
        for step in found.steps:
            print(f"{step.name}: {step.how}, exit {step.returncode}", file=sys.stderr)
        job = bump_job()
        if len(found.steps) != len(job["steps"]):
            sys.exit("the job stopped early: " + found.steps[-1].output[-3000:])
        write_golden(found, *((RECORDS_TESTED, GOLDEN_TESTED) if tested else (RECORDS, GOLDEN)))
    print(f"wrote {GOLDEN_TESTED if tested else GOLDEN} and its records", file=sys.stderr)
