"""A vLLM release's CPU test environment derived from the release's own requirements (patchkit.sources.
release_requirements), on the real files of every supported release and of 0.34.0 (tests/data/release-
requirements/, verbatim from each sdist), the real 0.34.0 wheel METADATA, and the real sdist from the index;
and the noxfile's rule for which `release-<v>` sessions exist, asked of nox itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from patchkit.sources.release_requirements import (
    ENTRY,
    LEFT_OUT,
    MAX_BYTES,
    MAX_DEPTH,
    ReleaseRequirements,
    UnreadableRequirements,
    from_files,
    from_metadata,
    from_source,
    main,
)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "release-requirements"
METADATA = REPO / "tests" / "data" / "wheel-metadata" / "vllm-0.34.0-aarch64.METADATA"
RECORDED = sorted(p.name.removeprefix("vllm-") for p in DATA.glob("vllm-*"))
# What each release declares for its CUDA wheel (README "The environments"; each file's own torch lines).
DECLARED_TORCH = {"0.30.0": ("2.13.0", "0.28.0"), "0.31.0": ("2.13.0", "0.28.0"), "0.32.0": ("2.13.0", "0.28.0"),
                  "0.33.0": ("2.14.0", "0.29.0"), "0.34.0": ("2.14.0", "0.29.0")}


def _reader(release: str):
    root = DATA / f"vllm-{release}"

    def read(path: str) -> bytes | None:
        where = root / path
        return where.read_bytes() if where.is_file() else None

    return read


def _recorded(release: str, **kwargs) -> ReleaseRequirements:
    return from_files(_reader(release), release, f"recorded vllm {release} sdist files", **kwargs)


def _names(requirements) -> list[str]:
    return [canonicalize_name(r.name) for r in requirements]


def _plain_lines(text: str) -> list[str]:
    """A requirements file's requirement lines read the simplest way (no includes, no options)."""
    out = []
    for line in text.splitlines():
        line = line.split(" #")[0].split("\t#")[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


def test_every_supported_release_and_0_34_0_is_recorded():
    from patchkit import SUPPORTED_VLLM

    assert set(SUPPORTED_VLLM) | {"0.34.0"} <= set(RECORDED)


@pytest.mark.parametrize("release", RECORDED)
def test_torch_stack_is_the_one_the_release_declares(release):
    derived = _recorded(release)
    assert (derived.pin("torch"), derived.pin("torchvision")) == DECLARED_TORCH[release]
    assert derived.replaced == ()


@pytest.mark.parametrize("release", RECORDED)
def test_every_common_requirement_is_kept_as_declared_and_nothing_cuda_only(release):
    derived = _recorded(release)
    kept = [str(r) for r in derived.kept]
    common = [str(Requirement(line)) for line in _plain_lines((DATA / f"vllm-{release}/requirements/common.txt").read_text())]
    cuda = [str(Requirement(line)) for line in _plain_lines((DATA / f"vllm-{release}/requirements/cuda.txt").read_text())]
    # common.txt first (cuda.txt includes it on its first line), then cuda.txt's own, less what is left out
    expected = [r for r in [*common, *cuda] if canonicalize_name(Requirement(r).name) not in LEFT_OUT]
    assert kept == expected
    assert not set(_names(derived.kept)) & set(LEFT_OUT)
    # transformers exactly as the release bounds it: the reason an environment per release exists
    transformers = next(r for r in derived.kept if r.name == "transformers")
    assert transformers == next(Requirement(r) for r in common if Requirement(r).name == "transformers")


def test_0_34_0_unpublished_flashinfer_pin_is_left_out_not_asked():
    derived = _recorded("0.34.0")
    left = dict(derived.left_out)
    assert "flashinfer-python==0.7.3" in left
    assert "flashinfer" not in derived.render().split("# left out")[-1].split("\n", 1)[1]
    for name in ("tilelang", "nvidia-cutlass-dsl", "quack-kernels", "humming-kernels", "torchaudio", "torchcodec"):
        assert any(canonicalize_name(Requirement(text).name) == name for text in left), name


def test_index_option_of_0_30_0_is_left_out():
    left = [text for text, _ in _recorded("0.30.0").left_out]
    assert "--extra-index-url https://flashinfer.ai/whl/" in left


def test_the_wheel_metadata_gives_the_same_environment_as_the_sdist():
    wheel = from_metadata(METADATA.read_bytes(), "0.34.0", "vllm-0.34.0 aarch64 wheel METADATA")
    sdist = _recorded("0.34.0")
    # the wheel's metadata is written from the same files; its optional extras (`[zen]`) are not installed
    assert sorted(map(str, wheel.kept)) == sorted(map(str, sdist.kept))
    assert "zentorch" not in _names(wheel.kept)


def test_replace_installs_the_given_pin_and_says_so():
    derived = _recorded("0.33.0", replace={"torch": "2.14.1", "torchvision": "0.29.1"})
    assert (derived.pin("torch"), derived.pin("torchvision")) == ("2.14.1", "0.29.1")
    assert ("torch==2.14.0", "torch==2.14.1") in derived.replaced
    assert "# torch==2.14.0 replaced by torch==2.14.1" in derived.render()
    with pytest.raises(UnreadableRequirements) as error:
        _recorded("0.33.0", replace={"no-such-dist": "1"})
    assert "no-such-dist" in error.value.why


@pytest.mark.parametrize("release", RECORDED)
def test_rendered_file_is_every_kept_requirement_once_per_line(release):
    derived = _recorded(release)
    lines = [line for line in derived.render().splitlines() if not line.startswith("#")]
    assert [Requirement(line) for line in lines] == list(derived.kept)


# Hand-written hostile inputs (nothing public is malformed this way): each is refused, naming where.
HOSTILE = {
    "outside": {ENTRY: b"-r ../setup.py\ntorch==1\ntorchvision==1\n"},
    "absolute": {ENTRY: b"-r /etc/passwd\n"},
    "loop": {ENTRY: b"-r cuda.txt\n"},
    "missing-include": {ENTRY: b"-r common.txt\n"},
    "editable": {ENTRY: b"-e .\ntorch==1\ntorchvision==1\n"},
    "constraint": {ENTRY: b"-c other.txt\ntorch==1\ntorchvision==1\n"},
    "url": {ENTRY: b"triton @ https://example.invalid/triton.whl\ntorch==1\ntorchvision==1\n"},
    "not-a-requirement": {ENTRY: b"torch===\ntorchvision==1\n"},
    "no-torch": {ENTRY: b"numpy\ntorchvision==0.29.0\n"},
    "torch-range": {ENTRY: b"torch>=2\ntorchvision==0.29.0\n"},
    "huge": {ENTRY: b"# x\n" * (MAX_BYTES // 4 + 1)},
    "absent": {},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_requirements_are_refused(case):
    files = HOSTILE[case]
    with pytest.raises(UnreadableRequirements) as error:
        from_files(files.get, "9.9.9", f"hand-written {case}")
    assert error.value.where and error.value.why
    assert error.value.exit_code == 2


def test_includes_nest_at_most_max_depth():
    chain = {f"requirements/{i}.txt": f"-r {i + 1}.txt\n".encode() for i in range(MAX_DEPTH + 2)}
    chain[ENTRY] = b"-r 0.txt\n"
    with pytest.raises(UnreadableRequirements) as error:
        from_files(chain.get, "9.9.9", "hand-written chain")
    assert "deep" in error.value.why


def test_continuations_and_comments_read_as_pip_reads_them():
    files = {ENTRY: b"torch==2.14.0 \\\n  ; python_version >= '3'  # a comment\ntorchvision==0.29.0\t# after a tab\n"
                    b"  # a whole-line comment\nnumpy # another\n"}
    derived = from_files(files.get, "9.9.9", "hand-written")
    assert [str(r) for r in derived.kept] == ['torch==2.14.0; python_version >= "3"', "torchvision==0.29.0", "numpy"]


@pytest.mark.network
def test_the_real_sdist_gives_the_recorded_environment(tmp_path):
    from patchkit.sources.spec import open_source

    real = from_source(open_source("vllm==0.34.0", progress=False), "0.34.0")
    assert real.kept == _recorded("0.34.0").kept
    assert real.left_out == _recorded("0.34.0").left_out
    out = tmp_path / "env" / "requirements.txt"
    assert main(["0.34.0", "--output", str(out)]) == 0
    assert out.read_text() == real.render()


@pytest.mark.network
def test_command_refuses_a_release_the_index_lacks_and_bad_replacements(tmp_path, capsys):
    assert main(["0.0.1", "--output", str(tmp_path / "x.txt")]) == 2
    assert main(["0.34.0", "--replace", "torch"]) == 2
    assert main(["0.34.0", "--bogus"]) == 2
    assert not (tmp_path / "x.txt").exists()
    assert "Traceback" not in capsys.readouterr().err


def _nox_list(cache: Path, *args: str) -> list[str]:
    nox = shutil.which("nox")
    assert nox, "nox is not on PATH: these tests run under nox (README's `pip install nox`)"
    env = {k: v for k, v in os.environ.items() if k != "NOXSESSION"}
    env["PATCHKIT_CACHE_DIR"] = str(cache)
    proc = subprocess.run([nox, "-f", str(REPO / "noxfile.py"), "--list", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [line.split()[1] for line in proc.stdout.splitlines() if line[:2] in ("* ", "- ")]


def test_release_sessions_exist_for_supported_cached_and_asked_releases(tmp_path):
    from patchkit import PINNED_VLLM, SUPPORTED_VLLM

    listed = _nox_list(tmp_path)
    assert {f"release-{r}" for r in SUPPORTED_VLLM if r != PINNED_VLLM} <= set(listed)
    assert f"release-{PINNED_VLLM}" not in listed  # the pinned release's environment is `tests`'s
    assert "release-0.99.0" not in listed and "release" in listed
    # a release named on the command line gets its sessions, with nothing added to the checkout
    asked = _nox_list(tmp_path, "-s", "release-0.99.0")
    assert {"release-0.99.0", "vllm-tests-0.99.0"} <= set(asked)
    # a release whose sdist patchkit's cache holds is listed for everyone (`nox --list`, the bump job)
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "vllm-0.98.0.json").write_text("{}")
    (tmp_path / "downloads" / "vllm-not-a-version.json").write_text("{}")
    cached = _nox_list(tmp_path)
    assert "release-0.98.0" in cached and not any("not-a-version" in s for s in cached)
    assert sys.executable  # the sessions above ran on nox's interpreter, not this one


CONFIG_ON_CPU = """
from vllm.config import DeviceConfig, VllmConfig
try:
    VllmConfig(device_config=DeviceConfig(device="cpu"))
    print("built")
except RuntimeError as error:
    print(f"refused: {error}")
"""


def _config_on_cpu(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run([sys.executable, "-c", CONFIG_ON_CPU], capture_output=True, text=True, timeout=900,
                          env={**base, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.vllm
def test_the_release_environment_builds_a_vllm_config_on_this_cpu(vllm_release):
    """noxfile.py `_triton_env`: from 0.34.0 on, vLLM's x86 CPU platform refuses a config without Triton and
    triton-cpu is on no index; with CUDA_VISIBLE_DEVICES="" vLLM keeps the index's Triton and builds it.
    Before 0.34.0 it builds without (a warning). Either way the release sessions' tests can build configs."""
    import platform

    from packaging.version import Version

    if vllm_release >= Version("0.34.0") and platform.machine() == "x86_64":
        assert _config_on_cpu() == "refused: vLLM on x86 CPUs requires Triton (triton-cpu)."
        assert _config_on_cpu(CUDA_VISIBLE_DEVICES="") == "built"
    else:
        assert _config_on_cpu() == "built"
