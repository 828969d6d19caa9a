"""`patchkit doctor host [ssh://HOST]...`: what a DGX Spark needs before the first serve, each check named
with its fix.

Every check reads what a real tool prints (`uname -m`, `nvidia-smi --query-gpu=...`, `nvcc --version`,
`free -b`, `id`, `docker version`, `printenv`, `test -r`) through one small interface, `Commands.run(argv)`
(commands.py): `LocalCommands` runs them here, `SshCommands` as `ssh HOST -- CMD`, and the tests feed
recorded outputs of the real tools through the same interface. A tool that is absent is a finding (with its fix), not an
error; a host that cannot be reached at all is bad input (exit 2).

What the checks hold a host to, and why:
- aarch64: GB10 is an Arm machine; the images are linux/arm64 and the wheel path installs vLLM's
  manylinux aarch64 wheel.
- a GPU of compute capability 12.1 (GB10, `sm_121a`), and a driver new enough for CUDA 13 (580.65.06, the
  minimum CUDA 13.0's release notes give for Linux), which the base and the wheels' torch are built for.
- nvcc of CUDA 13 on the wheel path (FlashInfer and DeepGEMM compile their kernels at run time); with
  `--image`, in the image instead.
- for vLLM 0.34.0 on (or an unknown release): the nvcc DeepGEMM's JIT will run, resolved as vLLM resolves it
  (CUDA_HOME, CUDA_PATH, the nvcc on PATH, /usr/local/cuda, DG_JIT_NVCC_COMPILER), at 12.9 or newer: 0.34.0
  disables DeepGEMM with only a warning otherwise, and the GLM sparse indexer needs it.
- TORCH_CUDA_ARCH_LIST=12.1a and FLASHINFER_CUDA_ARCH_LIST=12.1f, as the recipes set them (on the host for
  the wheel path, in the image's environment with --image).
- the docker group (or root) and the engine's version: the GPU request needs API 1.40 (Docker 19.03).
- memory available against the variant's per-rank need (weights per rank + KV pool + activation
  reserve, as preflight computes it; GB10's memory is unified, so `free -b` is the GPU's too).
- the checkpoint's files at the same path on every host (each node loads its own copy).
- the KV-cache dtype: `nvfp4` KV is refused on 12.x (the NVFP4 DS-MLA KV-cache kernels of the vLLM
  0.30-0.33 wheels are built for sm_100f/110f only).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass

from patchkit.checkpoint.identity import CONFIG, INDEX
from patchkit.checkpoint.memory import ACTIVATION_RESERVE_GIB, GIB
from patchkit.errors import PatchkitError
from patchkit.images.definitions import ARCH_ENV
from patchkit.spark.commands import IMAGE_TIMEOUT_S, NOT_FOUND, TIMEOUT_S, Commands, Output
from patchkit.variants.definitions import Variant

SPARK_ARCH = "aarch64"
SPARK_COMPUTE_CAP = "12.1"
CUDA_MAJOR = 13
CUDA13_MIN_DRIVER = (580, 65, 6)  # CUDA 13.0 release notes: the minimum Linux driver
MIN_DOCKER_API = (1, 40)  # DeviceRequests (--gpus) arrived with API 1.40 (Docker 19.03)
# The arch variables vLLM's and FlashInfer's run-time compiles read, as every image sets them.
ARCH_VARIABLES = {name: ARCH_ENV[name] for name in ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST")}
NVFP4_KV_CAPS = ("10.0", "10.3", "11.0")  # sm_100f / sm_110f: where the 0.30-0.33 wheels' NVFP4 KV kernels run
GPU_QUERY = ("nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader")


class NotAVllmVersion(PatchkitError):
    """`--vllm`'s `value` is not a PEP 440 version (e.g. 0.34.0): which DeepGEMM check applies depends on it."""

    def __init__(self, value: str):
        self.value = value
        super().__init__(f"--vllm {value!r} is not a version (e.g. 0.34.0)")


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # ok | warn | fail
    found: str
    fix: str  # what to do about it ("" when ok)
    command: str  # what was run ("" for a check on what the others found)


def _cmd(argv: tuple[str, ...]) -> str:
    return shlex.join(argv)


def _absent(out: Output) -> bool:
    return out.code == NOT_FOUND


def _timed_out(out: Output, argv: tuple[str, ...], name: str, timeout: float) -> Check | None:
    if out.code is None:
        return Check(name, "fail", f"`{_cmd(argv)}` did not answer within {timeout:.0f} s", "find out why it hangs "
                     "(a wedged driver or engine) before the first serve", _cmd(argv))
    return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "(no output)")[:300]


def check_architecture(commands: Commands) -> Check:
    argv = ("uname", "-m")
    out = commands.run(argv)
    if (t := _timed_out(out, argv, "architecture", TIMEOUT_S)) or out.code != 0:
        return t or Check("architecture", "fail", f"`uname -m` failed: {_first_line(out.text)}", "", _cmd(argv))
    arch = out.text.strip()
    if arch == SPARK_ARCH:
        return Check("architecture", "ok", arch, "", _cmd(argv))
    return Check("architecture", "fail", f"{arch}, not {SPARK_ARCH}",
                 "a DGX Spark (GB10) is aarch64: the images are linux/arm64 and the wheel path installs the "
                 "manylinux aarch64 wheel; run on the Spark itself", _cmd(argv))


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str
    driver: str
    memory: str


def parse_gpus(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader`: one line
    per GPU, fields separated by ", " (a GB10's memory.total is `[N/A]`: its memory is the system's)."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise ValueError(f"not 4 comma-separated fields: {line.strip()[:200]!r}")
        gpus.append(Gpu(*fields))
    return gpus


def _version(text: str) -> tuple[int, ...] | None:
    match = re.fullmatch(r"(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def check_gpu(commands: Commands) -> tuple[list[Check], list[Gpu]]:
    out = commands.run(GPU_QUERY)
    command = _cmd(GPU_QUERY)
    if _absent(out):
        return [Check("gpu", "fail", "nvidia-smi not found: no NVIDIA driver on this host",
                      "install the NVIDIA driver (DGX OS ships it with nvidia-smi); a host without a GPU cannot serve",
                      command)], []
    if (t := _timed_out(out, GPU_QUERY, "gpu", TIMEOUT_S)):
        return [t], []
    if out.code != 0:
        return [Check("gpu", "fail", f"nvidia-smi failed (exit {out.code}): {_first_line(out.text)}",
                      "load the NVIDIA driver (reboot after a driver update; `nvidia-smi` must answer)", command)], []
    try:
        gpus = parse_gpus(out.text)
    except ValueError as exc:
        return [Check("gpu", "fail", f"nvidia-smi printed what its CSV format is not: {exc}",
                      "run the command by hand; a driver this old or new may not know compute_cap", command)], []
    if not gpus:
        return [Check("gpu", "fail", "nvidia-smi lists no GPU", "check the driver sees the GB10 (`nvidia-smi -L`)",
                      command)], []
    checks = []
    for i, gpu in enumerate(gpus):
        what = f"GPU {i}: {gpu.name}, compute capability {gpu.compute_cap}, memory {gpu.memory}"
        if gpu.compute_cap == SPARK_COMPUTE_CAP:
            checks.append(Check("gpu", "ok", what, "", command))
        else:
            checks.append(Check("gpu", "fail", f"{what}; a Spark's GB10 is {SPARK_COMPUTE_CAP}",
                                "the images and the patches are for GB10 (sm_121a); other GPUs need other recipes",
                                command))
    drivers = sorted({g.driver for g in gpus})
    version = _version(drivers[0])
    found = f"driver {', '.join(drivers)}"
    if version is None:
        checks.append(Check("driver", "fail", f"{found}: not a version", "see `nvidia-smi`", command))
    elif version < CUDA13_MIN_DRIVER:
        need = ".".join(map(str, CUDA13_MIN_DRIVER))
        checks.append(Check("driver", "fail", f"{found}, older than {need}, the minimum for CUDA 13",
                            f"update the driver to {need} or newer (DGX OS: apt upgrade, then reboot)", command))
    else:
        checks.append(Check("driver", "ok", found, "", command))
    return checks, gpus


def check_cuda(commands: Commands) -> Check:
    """The CUDA version the driver supports, from `nvidia-smi`'s banner (`CUDA Version: 13.0`)."""
    argv = ("nvidia-smi",)
    out = commands.run(argv)
    if _absent(out) or (out.code is not None and out.code != 0):
        return Check("cuda (driver)", "fail", "nvidia-smi did not run: the driver's CUDA version is unknown",
                     "install and load the NVIDIA driver", _cmd(argv))
    if (t := _timed_out(out, argv, "cuda (driver)", TIMEOUT_S)):
        return t
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out.text)
    if not match:
        return Check("cuda (driver)", "fail", "no 'CUDA Version' in nvidia-smi's banner", "see `nvidia-smi`", _cmd(argv))
    found = f"CUDA {match.group(1)}.{match.group(2)} (the driver's)"
    if int(match.group(1)) < CUDA_MAJOR:
        return Check("cuda (driver)", "fail", f"{found}; the base and the wheels' torch are CUDA {CUDA_MAJOR}",
                     "update the NVIDIA driver to one of CUDA 13 (580.65.06 or newer)", _cmd(argv))
    return Check("cuda (driver)", "ok", found, "", _cmd(argv))


def _in_image(image: str, entrypoint: str, *args: str) -> tuple[str, ...]:
    return ("docker", "run", "--rm", "--entrypoint", entrypoint, image, *args)


def check_nvcc(commands: Commands, image: str | None) -> Check:
    """nvcc of CUDA 13: FlashInfer and DeepGEMM compile kernels at run time (wheel path: on the host; with
    an image: in the image)."""
    argv = _in_image(image, "nvcc", "--version") if image else ("nvcc", "--version")
    where = f"in {image}" if image else "on PATH"
    out = commands.run(argv, IMAGE_TIMEOUT_S if image else TIMEOUT_S)
    if (t := _timed_out(out, argv, "nvcc", IMAGE_TIMEOUT_S if image else TIMEOUT_S)):
        return t
    match = re.search(r"release (\d+)\.(\d+), V([\d.]+)", out.text) if out.code == 0 else None
    fix = ("use an image that carries the CUDA 13 toolkit (the pinned base does)" if image else
           "install the CUDA 13 toolkit (cuda-toolkit-13-0) and put its bin/ on PATH: FlashInfer and DeepGEMM "
           "compile kernels at run time")
    if not match:
        said = "not found" if _absent(out) or "executable file not found" in out.text else _first_line(out.text)
        return Check("nvcc", "fail", f"nvcc {where}: {said}", fix, _cmd(argv))
    found = f"nvcc {where}: CUDA {match.group(1)}.{match.group(2)} (V{match.group(3)})"
    if int(match.group(1)) != CUDA_MAJOR:
        return Check("nvcc", "fail", f"{found}; the run-time compiles need CUDA {CUDA_MAJOR}", fix, _cmd(argv))
    return Check("nvcc", "ok", found, "", _cmd(argv))


# DeepGEMM's nvcc as vLLM 0.34.0 finds it (utils/deep_gemm.py `_deep_gemm_nvcc_path`, `_nvcc_version`):
# CUDA_HOME or CUDA_PATH, else the directory above the nvcc on PATH, else /usr/local/cuda; that home must
# exist; then DG_JIT_NVCC_COMPILER (or DJ_JIT_NVCC_COMPILER) or HOME/bin/nvcc, found executable. Below 12.9
# or absent, 0.34.0 disables DeepGEMM with only a warning, while the GLM sparse indexer runs on it.
DEEP_GEMM_NVCC = (
    'h="${CUDA_HOME:-$CUDA_PATH}"; '
    'if [ -z "$h" ]; then if n=$(command -v nvcc); then h=$(dirname "$(dirname "$n")"); else h=/usr/local/cuda; fi; fi; '
    '[ -e "$h" ] || { echo "CUDA home $h does not exist"; exit 3; }; '
    'if [ "${DG_JIT_NVCC_COMPILER+set}" = set ]; then n=$DG_JIT_NVCC_COMPILER; else n=${DJ_JIT_NVCC_COMPILER-}; fi; '
    '[ -n "$n" ] || n="$h/bin/nvcc"; '
    'p=$(command -v "$n") || { echo "$n is not an executable"; exit 4; }; '
    'echo "nvcc=$p"; "$p" --version'
)
DEEP_GEMM_MIN_NVCC = (12, 9)  # "DeepGEMM's JIT needs nvcc 12.9 or newer" (0.34.0 utils/deep_gemm.py)
DEEP_GEMM_SILENT_FROM = "0.34.0"  # the first release that disables DeepGEMM with a warning instead of aborting


def check_deep_gemm_nvcc(commands: Commands, image: str | None, vllm: str | None) -> Check | None:
    """The nvcc DeepGEMM's JIT will run, found the way vLLM 0.34.0 finds it, at 12.9 or newer. None for a
    vLLM before 0.34.0 (its DeepGEMM aborts the boot loudly; the nvcc check covers it)."""
    from packaging.version import InvalidVersion, Version

    try:
        if vllm is not None and Version(vllm) < Version(DEEP_GEMM_SILENT_FROM):
            return None
    except InvalidVersion:
        raise NotAVllmVersion(str(vllm)) from None
    argv = _in_image(image, "sh", "-c", DEEP_GEMM_NVCC) if image else ("sh", "-c", DEEP_GEMM_NVCC)
    timeout = IMAGE_TIMEOUT_S if image else TIMEOUT_S
    name = "nvcc (DeepGEMM)"
    if (t := _timed_out(out := commands.run(argv, timeout), argv, name, timeout)):
        return t
    where = f"in {image}" if image else "on this host"
    served = f"vLLM {vllm}" if vllm else "a vLLM of 0.34.0 or later (give --vllm to say which)"
    fix = ("install the CUDA 13 toolkit (cuda-toolkit-13-0) and set CUDA_HOME to it where vLLM runs, or unset a "
           "CUDA_HOME/CUDA_PATH/DG_JIT_NVCC_COMPILER that points elsewhere" if not image else
           "use an image that carries the CUDA 13 toolkit (the pinned base does), with CUDA_HOME pointing at it")
    why = (f"{served} disables DeepGEMM with only a warning (`DeepGEMM kernels are disabled`), and GLM-5.3's sparse "
           "indexer needs it")
    path = re.search(r"^nvcc=(\S.*)$", out.text, re.MULTILINE)
    match = re.search(r"release (\d+)\.(\d+)", out.text)
    if out.code != 0 or not path or not match:
        said = _first_line(out.text) if out.code in (3, 4) else ("no shell (`sh`) to resolve it with" if _absent(out)
                                                                   else _first_line(out.text))
        return Check(name, "fail", f"DeepGEMM's nvcc {where}: {said}; {why}", fix, _cmd(argv))
    version = (int(match.group(1)), int(match.group(2)))
    found = f"DeepGEMM's nvcc {where}: {path.group(1)}, CUDA {version[0]}.{version[1]}"
    if version < DEEP_GEMM_MIN_NVCC:
        return Check(name, "fail", f"{found}, older than 12.9; {why}", fix, _cmd(argv))
    return Check(name, "ok", found, "", _cmd(argv))


def check_arch_variables(commands: Commands, image: str | None) -> list[Check]:
    checks = []
    for name, want in ARCH_VARIABLES.items():
        argv = _in_image(image, "printenv", name) if image else ("printenv", name)
        out = commands.run(argv, IMAGE_TIMEOUT_S if image else TIMEOUT_S)
        where = f"in {image}" if image else "in the host's environment"
        value = out.text.strip() if out.code == 0 else None
        if value == want:
            checks.append(Check(name, "ok", f"{name}={value} {where}", "", _cmd(argv)))
            continue
        found = f"{name} is unset {where}" if value is None else f"{name}={value} {where}, not {want}"
        fix = (f"build the image with ENV {name}={want}" if image else
               f"export {name}={want} where vLLM runs (the recipes' value for GB10)")
        checks.append(Check(name, "fail", found, fix, _cmd(argv)))
    return checks


def check_docker(commands: Commands) -> list[Check]:
    checks = []
    uid = commands.run(("id", "-u"))
    groups = commands.run(("id", "-nG"))
    if uid.code == 0 and uid.text.strip() == "0":
        checks.append(Check("docker group", "ok", "root: the engine's socket needs no group", "", "id -u"))
    elif groups.code == 0 and "docker" in groups.text.split():
        checks.append(Check("docker group", "ok", "in the docker group", "", "id -nG"))
    else:
        checks.append(Check("docker group", "fail", f"not in the docker group (groups: {groups.text.strip() or '?'})",
                            "sudo usermod -aG docker $USER, then log in again", "id -nG"))
    argv = ("docker", "version", "--format", "{{.Server.Version}} {{.Server.APIVersion}}")
    out = commands.run(argv)
    if (t := _timed_out(out, argv, "engine", TIMEOUT_S)):
        return [*checks, t]
    if _absent(out):
        return [*checks, Check("engine", "fail", "the docker CLI is not installed",
                               "install Docker (DGX OS ships it with nvidia-container-toolkit)", _cmd(argv))]
    fields = out.text.split()
    api = _version(fields[1]) if out.code == 0 and len(fields) == 2 else None
    if api is None:
        return [*checks, Check("engine", "fail", f"the engine did not answer: {_first_line(out.text)}",
                               "start it (sudo systemctl start docker) and check DOCKER_HOST", _cmd(argv))]
    found = f"server {fields[0]}, API {fields[1]}"
    if api < MIN_DOCKER_API:
        return [*checks, Check("engine", "fail", f"{found}: the GPU request needs API 1.40",
                               "upgrade Docker to 19.03 or newer", _cmd(argv))]
    return [*checks, Check("engine", "ok", found, "", _cmd(argv))]


def per_rank_need_gib(variant: Variant) -> float | None:
    """Weights per rank (the variant's recorded figure) + KV pool + preflight's activation reserve."""
    weights = variant.expect.weights_gib_per_rank
    if weights is None:
        return None
    return weights + variant.serve.kv_cache_memory_bytes / GIB + ACTIVATION_RESERVE_GIB


def parse_available(text: str) -> int:
    """The `available` column of `free -b`'s Mem: line (procps: total used free shared buff/cache available)."""
    lines = text.splitlines()
    header = next((line.split() for line in lines if "available" in line.split()), None)
    mem = next((line.split() for line in lines if line.startswith("Mem:")), None)
    if header is None or mem is None or len(mem) != len(header) + 1:
        raise ValueError("no Mem: line under a header with 'available'")
    value = mem[1 + header.index("available")]
    if not value.isdigit():
        raise ValueError(f"available is {value!r}, not a number of bytes")
    return int(value)


def check_memory(commands: Commands, variant: Variant | None) -> Check:
    argv = ("free", "-b")
    out = commands.run(argv)
    if (t := _timed_out(out, argv, "memory", TIMEOUT_S)):
        return t
    try:
        available = parse_available(out.text) if out.code == 0 else None
    except ValueError as exc:
        return Check("memory", "fail", f"`free -b` printed what procps does not: {exc}", "", _cmd(argv))
    if available is None:
        return Check("memory", "fail", f"`free -b` failed: {_first_line(out.text)}", "", _cmd(argv))
    found = f"{available / GIB:.1f} GiB available"
    need = per_rank_need_gib(variant) if variant else None
    if variant is None:
        return Check("memory", "warn", f"{found}; no --variant, so no per-rank need to hold it to",
                     "give --variant", _cmd(argv))
    if need is None:
        return Check("memory", "warn", f"{found}; variant {variant.name} records no weights per rank",
                     f"run `patchkit preflight CHECKPOINT --variant {variant.name}` for the per-rank need", _cmd(argv))
    found += f", {need:.1f} GiB needed per rank by {variant.name}"
    if available < need * GIB:
        return Check("memory", "fail", found, "stop what holds memory (other containers, a desktop session, the page "
                     "cache: `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`), or lower --kv-cache-memory-bytes",
                     _cmd(argv))
    return Check("memory", "ok", found, "", _cmd(argv))


CHECKPOINT_FILES = (CONFIG, INDEX)


def check_checkpoint(commands: Commands, path: str) -> Check:
    missing = []
    for name in CHECKPOINT_FILES:
        argv = ("test", "-r", f"{path.rstrip('/')}/{name}")
        out = commands.run(argv)
        if out.code != 0:
            missing.append(name)
    command = " && ".join(f"test -r {shlex.quote(path.rstrip('/') + '/' + n)}" for n in CHECKPOINT_FILES)
    if missing:
        return Check("checkpoint", "fail", f"{path}: {', '.join(missing)} missing or unreadable",
                     "copy the checkpoint to the same path on every node (each loads its own copy), e.g. "
                     "`hf download REPO --local-dir PATH` or rsync from the head", command)
    return Check("checkpoint", "ok", f"{path}: {', '.join(CHECKPOINT_FILES)} present", "", command)


def check_kv_dtype(dtype: str, gpus: list[Gpu]) -> Check:
    """NVFP4 KV on 12.x is refused: the NVFP4 DS-MLA KV-cache kernels in the 0.30-0.33 wheels are
    sm_100f/110f only. Judged against the host's GPUs, or GB10's 12.1 when nvidia-smi said nothing."""
    caps = sorted({g.compute_cap for g in gpus}) or [SPARK_COMPUTE_CAP]
    against = ", ".join(caps) + ("" if gpus else " (GB10's; no GPU was read)")
    if dtype.lower().startswith("nvfp4") and any(cap not in NVFP4_KV_CAPS for cap in caps):
        return Check("kv cache dtype", "fail", f"--kv-cache-dtype {dtype} on compute capability {against}",
                     "the NVFP4 DS-MLA KV-cache kernels in vLLM 0.30-0.33 wheels are built for sm_100f/110f only: "
                     "use fp8_ds_mla (the variants' pinned value)", "")
    return Check("kv cache dtype", "ok", f"{dtype} on compute capability {against}", "", "")


@dataclass
class HostReport:
    host: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not any(c.level == "fail" for c in self.checks)

    def to_dict(self) -> dict:
        return {"host": self.host, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def check_host(commands: Commands, variant: Variant | None = None, image: str | None = None,
               checkpoint: str | None = None, kv_cache_dtype: str | None = None, vllm: str | None = None) -> HostReport:
    """Every check on one host, in the order a first serve meets them. `vllm`: the release to be served
    (None: unknown, held to 0.34.0's rules)."""
    checks = [check_architecture(commands)]
    gpu_checks, gpus = check_gpu(commands)
    checks += gpu_checks
    checks.append(check_cuda(commands))
    checks.append(check_nvcc(commands, image))
    if deep_gemm := check_deep_gemm_nvcc(commands, image, vllm):
        checks.append(deep_gemm)
    checks += check_arch_variables(commands, image)
    checks += check_docker(commands)
    checks.append(check_memory(commands, variant))
    if checkpoint:
        checks.append(check_checkpoint(commands, checkpoint))
    dtype = kv_cache_dtype or (variant.serve.kv_cache_dtype if variant else None)
    if dtype:
        checks.append(check_kv_dtype(dtype, gpus))
    return HostReport(commands.where, checks)
