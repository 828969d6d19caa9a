"""`patchkit doctor host`: a Spark's prerequisites, each check with its fix.

The checks read recorded outputs of the real tools (tests/data/host/, provenance in tests/data/README.md)
through the same `Commands` interface the local and ssh runners implement: this machine's own outputs
where the tool exists here (uname, nvcc of CUDA 13.0, free, id, docker version against dockerd and
podman), a Spark's real `nvidia-smi` banner and `free` from a public record, GB10's CSV query written by hand from
the documented format (no GPU here). End to end,
`patchkit doctor host` runs the real tools of this machine, where nvidia-smi is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines import DockerdService, _running
from hostile import assert_no_crash, assert_refused, run_patchkit
from patchkit.spark.checks import (
    DEEP_GEMM_NVCC,
    GPU_QUERY,
    check_gpu,
    check_host,
    check_kv_dtype,
    check_memory,
    parse_available,
    parse_gpus,
)
from patchkit.spark.commands import NOT_FOUND, Output, _bounded
from patchkit.variants.definitions import find_variant
from sshd import SshServer

DATA = Path(__file__).parent / "data" / "host"
IMAGES = Path(__file__).resolve().parents[1] / "images"
DOCKER_VERSION = ("docker", "version", "--format", "{{.Server.Version}} {{.Server.APIVersion}}")
STANDIN = "localhost/patchkit-standin:good"


def recorded(folder: str, name: str) -> Output:
    """A recorded output: NAME (verbatim) and NAME's exit status beside it when not 0."""
    base = DATA / folder
    text = next(p for p in base.iterdir() if p.stem == name and p.suffix != ".exit").read_text()
    exit_file = base / f"{name}.exit"
    return Output(int(exit_file.read_text()) if exit_file.exists() else 0, text)


@dataclass
class RecordedCommands:
    """The Commands interface over recorded outputs; a command with none recorded is absent (127)."""

    answers: dict[tuple[str, ...], Output]
    where: str = "recorded"

    def run(self, argv, timeout=30.0):
        return self.answers.get(tuple(argv), Output(NOT_FOUND, f"{argv[0]}: command not found"))


def this_machine(changes: dict | None = None) -> RecordedCommands:
    """This machine as recorded: x86_64, no nvidia-smi, nvcc 13.0, root, no daemon on the default socket."""
    m = "this-machine"
    answers = {("uname", "-m"): recorded(m, "uname-m"), ("nvcc", "--version"): recorded(m, "nvcc-version"),
               ("free", "-b"): recorded(m, "free-b"), ("id", "-nG"): recorded(m, "id-nG"),
               ("id", "-u"): recorded(m, "id-u"), DOCKER_VERSION: recorded(m, "docker-version-no-daemon"),
               ("sh", "-c", DEEP_GEMM_NVCC): recorded(m, "deep-gemm-nvcc"),
               ("printenv", "TORCH_CUDA_ARCH_LIST"): Output(1, ""), ("printenv", "FLASHINFER_CUDA_ARCH_LIST"): Output(1, "")}
    return RecordedCommands({**answers, **(changes or {})})


def free_with_available(gib: float) -> Output:
    """This machine's real `free -b`, its available column set to `gib`."""
    text = recorded("this-machine", "free-b").text
    lines = text.splitlines(keepends=True)
    mem = lines[1].split()
    mem[-1] = str(int(gib * (1 << 30)))
    lines[1] = " ".join(mem) + "\n"
    return Output(0, "".join(lines))


def a_spark(changes: dict | None = None) -> RecordedCommands:
    """GB10's nvidia-smi (hand-written), aarch64, and this machine's real nvcc, id and dockerd answers."""
    g = "gb10"
    return this_machine({
        ("uname", "-m"): recorded(g, "uname-m"), GPU_QUERY: recorded(g, "nvidia-smi-query"),
        ("nvidia-smi",): recorded(g, "nvidia-smi"), DOCKER_VERSION: recorded("this-machine", "docker-version-dockerd"),
        ("free", "-b"): free_with_available(118.0),
        ("printenv", "TORCH_CUDA_ARCH_LIST"): Output(0, "12.1a\n"),
        ("printenv", "FLASHINFER_CUDA_ARCH_LIST"): Output(0, "12.1f\n"),
        **(changes or {})})


def by_name(report) -> dict[str, object]:
    return {c.name: c for c in report.checks}


def failed(report) -> list[str]:
    return [c.name for c in report.checks if c.level == "fail"]


LAB = find_variant("lab", IMAGES)


def test_a_ready_spark_passes_every_check():
    present = {("test", "-r", f"/models/lab/{name}"): Output(0, "") for name in ("config.json", "model.safetensors.index.json")}
    report = check_host(a_spark(present), LAB, checkpoint="/models/lab")
    assert report.ok, [(c.name, c.found) for c in report.checks if c.level != "ok"]
    checks = by_name(report)
    assert checks["gpu"].found == "GPU 0: NVIDIA GB10, compute capability 12.1, memory [N/A]"
    assert checks["driver"].found == "driver 580.95.05" and checks["cuda (driver)"].found == "CUDA 13.0 (the driver's)"
    assert checks["nvcc"].found == "nvcc on PATH: CUDA 13.0 (V13.0.88)"
    assert checks["engine"].found.startswith("server 20.10.24") and "API 1.41" in checks["engine"].found
    # lab: 92.19 GiB weights per rank + 10 GiB KV + 6 GiB reserve
    assert checks["memory"].found == "118.0 GiB available, 108.2 GiB needed per rank by lab"
    assert checks["kv cache dtype"].found == "fp8_ds_mla on compute capability 12.1"


def test_this_machine_as_recorded_is_not_a_spark():
    report = check_host(this_machine(), LAB)
    checks = by_name(report)
    assert failed(report) == ["architecture", "gpu", "cuda (driver)", "TORCH_CUDA_ARCH_LIST",
                              "FLASHINFER_CUDA_ARCH_LIST", "engine", "memory"]
    assert checks["architecture"].found == "x86_64, not aarch64"
    assert checks["gpu"].found == "nvidia-smi not found: no NVIDIA driver on this host"
    assert "install the NVIDIA driver" in checks["gpu"].fix
    assert checks["nvcc"].level == "ok" and "CUDA 13.0" in checks["nvcc"].found
    assert "Cannot connect to the Docker daemon" in checks["engine"].found and "systemctl start docker" in checks["engine"].fix
    assert checks["TORCH_CUDA_ARCH_LIST"].fix == "export TORCH_CUDA_ARCH_LIST=12.1a where vLLM runs (the recipes' value for GB10)"
    assert checks["docker group"].level == "ok"  # root
    # With no GPU read, the KV dtype is judged against GB10's capability, and says so.
    assert checks["kv cache dtype"].found == "fp8_ds_mla on compute capability 12.1 (GB10's; no GPU was read)"


def test_nvfp4_kv_is_refused_on_12x_and_allowed_on_sm100():
    [gb10], [b200] = parse_gpus("NVIDIA GB10, 12.1, 580.95.05, [N/A]\n"), parse_gpus("NVIDIA B200, 10.0, 580.95.05, 183359 MiB\n")
    refused = check_kv_dtype("nvfp4", [gb10])
    assert refused.level == "fail" and "sm_100f/110f only" in refused.fix and "fp8_ds_mla" in refused.fix
    assert check_kv_dtype("nvfp4", [b200]).level == "ok"
    assert check_kv_dtype("nvfp4", []).level == "fail"  # no GPU read: judged as GB10
    report = check_host(a_spark(), LAB, kv_cache_dtype="nvfp4")
    assert failed(report) == ["kv cache dtype"]


def test_driver_gpu_and_cuda_faults_are_named():
    old = check_host(a_spark({GPU_QUERY: Output(0, "NVIDIA GB10, 12.1, 575.57.08, [N/A]\n")}), LAB)
    assert failed(old) == ["driver"] and "older than 580.65.6" in by_name(old)["driver"].found
    other = check_host(a_spark({GPU_QUERY: Output(0, "NVIDIA H100 80GB HBM3, 9.0, 580.95.05, 81559 MiB\n")}), LAB)
    assert failed(other) == ["gpu"] and "a Spark's GB10 is 12.1" in by_name(other)["gpu"].found
    no_driver = a_spark({GPU_QUERY: recorded("gb10", "nvidia-smi-no-driver"),
                           ("nvidia-smi",): recorded("gb10", "nvidia-smi-no-driver")})
    report = check_host(no_driver, LAB)
    assert failed(report) == ["gpu", "cuda (driver)"]
    assert by_name(report)["gpu"].found.startswith("nvidia-smi failed (exit 9): NVIDIA-SMI has failed because")
    cuda12 = recorded("gb10", "nvidia-smi").text.replace("CUDA Version: 13.0", "CUDA Version: 12.9")
    assert failed(check_host(a_spark({("nvidia-smi",): Output(0, cuda12)}), LAB)) == ["cuda (driver)"]


def test_nvcc_engine_group_memory_and_checkpoint_faults_are_named():
    cuda12 = recorded("this-machine", "nvcc-version").text.replace("release 13.0, V13.0.88", "release 12.8, V12.8.93")
    report = check_host(a_spark({("nvcc", "--version"): Output(0, cuda12)}), LAB)
    assert failed(report) == ["nvcc"] and "the run-time compiles need CUDA 13" in by_name(report)["nvcc"].found
    absent = a_spark()
    del absent.answers[("nvcc", "--version")]
    assert by_name(check_host(absent, LAB))["nvcc"].found == "nvcc on PATH: not found"
    user = a_spark({("id", "-u"): Output(0, "1000\n"), ("id", "-nG"): Output(0, "ops adm sudo\n")})
    assert failed(check_host(user, LAB)) == ["docker group"]
    assert "usermod -aG docker" in by_name(check_host(user, LAB))["docker group"].fix
    old_engine = a_spark({DOCKER_VERSION: Output(0, "18.09.1 1.39\n")})
    assert "needs API 1.40" in by_name(check_host(old_engine, LAB))["engine"].found
    tight = check_host(a_spark({("free", "-b"): free_with_available(100.0)}), LAB)
    assert failed(tight) == ["memory"] and by_name(tight)["memory"].found == "100.0 GiB available, 108.2 GiB needed per rank by lab"
    missing = check_host(a_spark({("test", "-r", "/models/lab/config.json"): Output(0, "")}), LAB, checkpoint="/models/lab")
    assert failed(missing) == ["checkpoint"]
    assert by_name(missing)["checkpoint"].found == "/models/lab: model.safetensors.index.json missing or unreadable"


def test_the_image_is_checked_instead_of_the_host_with_image():
    """With --image, nvcc and the arch variables are the image's (docker run on the host); the stand-in image
    the smoke tests boot carries neither, as dockerd answered here."""
    run = ("docker", "run", "--rm", "--entrypoint")
    commands = a_spark({
        (*run, "nvcc", STANDIN, "--version"): recorded("this-machine", "docker-run-nvcc-standin"),
        (*run, "sh", STANDIN, "-c", DEEP_GEMM_NVCC): recorded("this-machine", "docker-run-deep-gemm-nvcc-standin"),
        (*run, "printenv", STANDIN, "TORCH_CUDA_ARCH_LIST"): Output(0, "12.1a\n"),
        (*run, "printenv", STANDIN, "FLASHINFER_CUDA_ARCH_LIST"): Output(1, ""),
    })
    report = check_host(commands, LAB, image=STANDIN)
    checks = by_name(report)
    assert failed(report) == ["nvcc", "nvcc (DeepGEMM)", "FLASHINFER_CUDA_ARCH_LIST"]
    assert checks["nvcc"].found == f"nvcc in {STANDIN}: not found" and "image that carries the CUDA 13 toolkit" in checks["nvcc"].fix
    assert checks["FLASHINFER_CUDA_ARCH_LIST"].fix == "build the image with ENV FLASHINFER_CUDA_ARCH_LIST=12.1f"
    assert checks["TORCH_CUDA_ARCH_LIST"].found == f"TORCH_CUDA_ARCH_LIST=12.1a in {STANDIN}"


def test_podmans_answer_to_docker_version_passes():
    report = check_host(a_spark({DOCKER_VERSION: recorded("this-machine", "docker-version-podman")}), LAB)
    assert by_name(report)["engine"].level == "ok" and by_name(report)["engine"].found.startswith("server 4.3.1")


@given(st.text(max_size=400))
def test_any_nvidia_smi_output_is_a_finding_never_a_crash(text):
    checks, gpus = check_gpu(RecordedCommands({GPU_QUERY: Output(0, text)}))
    assert checks and all(c.level in ("ok", "fail") for c in checks)
    assert all(g.compute_cap for g in gpus)


@given(st.text(max_size=400))
def test_any_free_output_is_a_finding_never_a_crash(text):
    check = check_memory(RecordedCommands({("free", "-b"): Output(0, text)}), LAB)
    assert check.level in ("ok", "warn", "fail")


def test_parsers_read_this_machines_real_outputs():
    assert parse_available(recorded("this-machine", "free-b").text) == int(
        recorded("this-machine", "free-b").text.splitlines()[1].split()[6])
    assert parse_available(recorded("gb10", "free-kib").text) == 120_425_308  # a Spark's `free`, in KiB
    with pytest.raises(ValueError, match="not 4 comma-separated fields"):
        parse_gpus("NVIDIA GB10, 12.1\n")


def test_a_tool_that_hangs_or_floods_is_bounded(tmp_path):
    start = time.monotonic()
    hung = _bounded(["sleep", "30"], 0.5, "sleep")
    assert hung.code is None and time.monotonic() - start < 10
    flood = tmp_path / "uname"
    flood.write_text("#!/bin/sh\nexec yes aarch64\n")
    flood.chmod(flood.stat().st_mode | stat.S_IXUSR)
    outcome = run_patchkit("doctor", "host", env={"PATH": f"{tmp_path}:{os.environ['PATH']}",
                                                   "PATCHKIT_LIMIT_TOOL_OUTPUT": "65536"})
    assert_refused(outcome, "the output of `uname -m`", "65,536 B", "PATCHKIT_LIMIT_TOOL_OUTPUT")


# ------------------------------------------------------------ end to end, this machine's real tools


def test_doctor_host_on_this_machine(tmp_path):
    outcome = run_patchkit("doctor", "host", "--variant", "lab", "--json", timeout=120)
    assert_no_crash(outcome)
    assert outcome.code == 1, outcome.output[-3000:]
    data = json.loads(outcome.stdout)
    [host] = data["hosts"]
    checks = {c["name"]: c for c in host["checks"]}
    assert host["host"] == "local" and not data["ok"]
    assert checks["architecture"]["found"] == f"{os.uname().machine}, not aarch64"
    assert checks["gpu"]["found"] == "nvidia-smi not found: no NVIDIA driver on this host"
    assert checks["nvcc"]["level"] == "ok" and "CUDA 13." in checks["nvcc"]["found"]
    table = run_patchkit("doctor", "host", timeout=120)
    assert table.code == 1 and "doctor host local: NOT READY" in table.stdout and "nvidia-smi not found" in table.stdout


def test_a_host_that_is_no_ssh_url_is_refused_naming_it():
    from patchkit.spark.commands import InvalidHost, SshCommands

    for url, port in (("spark1", None), ("ssh://", None), ("ssh://me@spark1:x22", "x22")):
        with pytest.raises(InvalidHost) as refused:
            SshCommands(url)
        assert (refused.value.url, refused.value.port) == (url, port)
    assert (SshCommands("ssh://me@spark1:2222").dest, SshCommands("ssh://me@spark1:2222").port) == ("me@spark1", "2222")


def test_doctor_host_refuses_bad_input(tmp_path):
    assert_refused(run_patchkit("doctor", "host", "spark1"), "'spark1'", "ssh://[USER@]HOST[:PORT]")
    assert_refused(run_patchkit("doctor", "host", "ssh://spark1:x22"), "the port 'x22' is not a number")
    assert_refused(run_patchkit("doctor", "host", "some.log"), "'some.log'", "ssh://[USER@]HOST[:PORT]")
    assert_refused(run_patchkit("doctor"), "log", "host", "serving")  # the subcommands, named
    assert_refused(run_patchkit("doctor", "log", "x.log", "--image", "img"), "No such option '--image'")
    assert_refused(run_patchkit("doctor", "host", "--variant", "no-such-variant"), "no-such-variant")
    # An ssh host that refuses the connection: nothing can be checked there (ssh exits 255).
    refused = run_patchkit("doctor", "host", "ssh://127.0.0.1:1", timeout=60)
    assert_refused(refused, "ssh://127.0.0.1:1: cannot run commands there over ssh", "Connection refused")


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    yield from _running(DockerdService(tmp_path_factory.mktemp("dockerd")))


def test_doctor_host_over_ssh(dockerd, tmp_path):
    """A real sshd on 127.0.0.1 whose sessions see DOCKER_HOST at a real dockerd: every check runs through
    `ssh HOST -- CMD`, and the engine answers."""
    with SshServer(tmp_path / "sshd", env={"DOCKER_HOST": dockerd.url}) as sshd:
        outcome = run_patchkit("doctor", "host", sshd.url, "local", "--json", env=sshd.client_env, timeout=120)
    assert_no_crash(outcome)
    data = json.loads(outcome.stdout)
    remote, local = data["hosts"]
    assert (remote["host"], local["host"]) == (sshd.url, "local")
    checks = {c["name"]: c for c in remote["checks"]}
    assert checks["engine"]["level"] == "ok" and checks["engine"]["found"].startswith("server 20.10.24")
    assert checks["gpu"]["found"] == "nvidia-smi not found: no NVIDIA driver on this host"
    assert checks["nvcc"]["level"] == "ok" and checks["architecture"]["found"].endswith("not aarch64")
    assert [c["name"] for c in local["checks"]] == list(checks)  # every host gets every check


# ------------------------------------------------------------ DeepGEMM's nvcc, as vLLM 0.34.0 finds it


def _vllm_deep_gemm_probe():
    """vLLM 0.34.0's own `_deep_gemm_nvcc_path` and `_nvcc_version`, executed from the released sdist's
    utils/deep_gemm.py (the two functions and the constant they read, cut out by their syntax tree)."""
    import ast
    import re as re_module
    import shutil as shutil_module
    import subprocess as subprocess_module

    from patchkit.sources import ArchiveCache
    from patchkit.sources.release import open_release

    source = open_release("vllm", "0.34.0", cache=ArchiveCache(), progress=False)
    text = (source.read_many("vllm", ["utils/deep_gemm.py"])["utils/deep_gemm.py"] or b"").decode()
    tree = ast.parse(text)
    wanted = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in ("_deep_gemm_nvcc_path", "_nvcc_version"))
              or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_DEFAULT_CUDA_HOME")]
    assert len(wanted) == 3
    namespace = {"os": os, "shutil": shutil_module, "re": re_module, "subprocess": subprocess_module}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "vllm-0.34.0/vllm/utils/deep_gemm.py", "exec"), namespace)
    return namespace["_deep_gemm_nvcc_path"], namespace["_nvcc_version"]


def _old_toolkit(tmp_path: Path, release: str) -> Path:
    """A CUDA home whose bin/nvcc answers as this machine's real nvcc 13.0 does, its release line changed
    (hand-written stand-in: no older toolkit is installed here)."""
    home = tmp_path / f"cuda-{release}"
    (home / "bin").mkdir(parents=True)
    said = recorded("this-machine", "nvcc-version").text.replace("release 13.0, V13.0.88", f"release {release}, V{release}.93")
    (home / "bin" / "said.txt").write_text(said)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ncat {home / 'bin' / 'said.txt'}\n")
    nvcc.chmod(0o755)
    return home


@pytest.mark.network
def test_deep_gemms_nvcc_is_found_as_vllm_0_34_finds_it(tmp_path, monkeypatch):
    """The check resolves the nvcc vLLM 0.34.0's real code resolves, on this machine's real tools, in every
    way the environment can steer it; it fails exactly where 0.34.0 would disable DeepGEMM."""
    from patchkit.spark.checks import check_deep_gemm_nvcc
    from patchkit.spark.commands import LocalCommands

    nvcc_path, nvcc_version = _vllm_deep_gemm_probe()
    old = _old_toolkit(tmp_path, "12.8")
    for var in ("CUDA_HOME", "CUDA_PATH", "DG_JIT_NVCC_COMPILER", "DJ_JIT_NVCC_COMPILER"):
        monkeypatch.delenv(var, raising=False)
    cases = {
        "this machine": {},
        "CUDA_HOME at an old toolkit": {"CUDA_HOME": str(old)},
        "CUDA_PATH at an old toolkit": {"CUDA_PATH": str(old)},
        "CUDA_HOME that does not exist": {"CUDA_HOME": str(tmp_path / "absent")},
        "DG_JIT_NVCC_COMPILER overriding an old home": {"CUDA_HOME": str(old), "DG_JIT_NVCC_COMPILER": shutil.which("nvcc")},
        "DJ_JIT_NVCC_COMPILER at the old nvcc": {"DJ_JIT_NVCC_COMPILER": str(old / "bin" / "nvcc")},
        "DG_JIT_NVCC_COMPILER not executable": {"DG_JIT_NVCC_COMPILER": str(old / "bin" / "said.txt")},
    }
    seen = {}
    for case, env in cases.items():
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            path = nvcc_path()
            enabled = path is not None and (nvcc_version(path) or (99, 0)) >= (12, 9)
            check = check_deep_gemm_nvcc(LocalCommands(), None, "0.34.0")
        assert check is not None
        assert (check.level == "ok") is enabled, (case, check.found)
        if path is not None:
            assert os.path.realpath(path) in {os.path.realpath(p) for p in re.findall(r": (/\S+),", check.found)} or \
                check.level == "fail", (case, path, check.found)
        seen[case] = check
    assert seen["this machine"].level == "ok" and "CUDA 13.0" in seen["this machine"].found
    assert "older than 12.9" in seen["CUDA_HOME at an old toolkit"].found
    assert "does not exist" in seen["CUDA_HOME that does not exist"].found
    assert "DeepGEMM kernels are disabled" in seen["CUDA_PATH at an old toolkit"].found
    assert "CUDA_HOME" in seen["CUDA_PATH at an old toolkit"].fix


def test_deep_gemms_nvcc_is_checked_for_0_34_and_unknown_releases_only(monkeypatch):
    from patchkit.spark.checks import DEEP_GEMM_NVCC

    script = ("sh", "-c", DEEP_GEMM_NVCC)
    said = "nvcc=/usr/local/cuda/bin/nvcc\n" + recorded("this-machine", "nvcc-version").text
    ready = a_spark({script: Output(0, said)})
    assert "nvcc (DeepGEMM)" not in by_name(check_host(ready, LAB, vllm="0.33.0"))
    for vllm in ("0.34.0", None):
        report = check_host(ready, LAB, vllm=vllm)
        assert report.ok and by_name(report)["nvcc (DeepGEMM)"].found == \
            "DeepGEMM's nvcc on this host: /usr/local/cuda/bin/nvcc, CUDA 13.0"
    old = a_spark({script: Output(0, said.replace("release 13.0", "release 12.8"))})
    assert failed(check_host(old, LAB, vllm="0.34.0")) == ["nvcc (DeepGEMM)"]
    run = ("docker", "run", "--rm", "--entrypoint")
    in_image = a_spark({(*run, "sh", STANDIN, "-c", DEEP_GEMM_NVCC): Output(3, "CUDA home /usr/local/cuda does not exist\n")})
    check = by_name(check_host(in_image, LAB, image=STANDIN, vllm="0.34.0"))["nvcc (DeepGEMM)"]
    assert check.level == "fail" and check.found.startswith(f"DeepGEMM's nvcc in {STANDIN}: CUDA home /usr/local/cuda does not exist")
    assert "image that carries the CUDA 13 toolkit" in check.fix
    assert_refused(run_patchkit("doctor", "host", "--vllm", "zero.34"), "--vllm 'zero.34' is not a version")
    assert_refused(run_patchkit("doctor", "log", "x.log", "--vllm", "0.34.0"), "No such option '--vllm'")
