"""The kernel census (src/patchkit/census/kernels.py) read against what the real tools write: fat binaries
nvcc 13.0 compiles here for every SM variant (the flag bits and the loading rule, checked per variant),
and vLLM 0.33.0's real x86_64 wheel (the user cache's, downloaded once; its sm_12x set is the aarch64
wheel's). A wheel that lost its sm_12x code fails the census; a malformed extension is exit 2.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hostile import assert_refused, run_patchkit
from patchkit.census.kernels import NEEDS, census, fatbin_entries
from patchkit.wheels.release import release_wheel

KERNEL = "__global__ void glm_probe_kernel(float *x) { x[threadIdx.x] *= 2.0f; }\n"
# (nvcc -gencode, the target the census must read back, whether it loads on sm_121 by CUDA's rules)
VARIANTS = (
    ("arch=compute_120,code=sm_120", "sm_120", True),
    ("arch=compute_120a,code=sm_120a", "sm_120a", False),  # arch-specific: exactly 12.0
    ("arch=compute_120f,code=sm_120f", "sm_120f", True),   # family: 12.0 and later minors
    ("arch=compute_121a,code=sm_121a", "sm_121a", True),
    ("arch=compute_100f,code=sm_100f", "sm_100f", False),  # another major
    ("arch=compute_90a,code=sm_90a", "sm_90a", False),
    ("arch=compute_80,code=compute_80", "compute_80", True),  # PTX: the driver compiles it for any newer SM
    ("arch=compute_120a,code=compute_120a", "compute_120a", False),
)


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    assert nvcc, "CUDA 13's nvcc is on PATH on this project's machines (see the README's What ran where)"
    return nvcc


def _compile(tmp: Path, gencodes: list[str], name: str = "k.o", compress: bool = True) -> Path:
    src = tmp / "k.cu"
    src.write_text(KERNEL)
    out = tmp / name
    args = [_nvcc(), "-c", str(src), "-o", str(out), *(f"-gencode={g}" for g in gencodes)]
    if compress:
        args.insert(1, "-Xfatbin=-compress-all")
    subprocess.run(args, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def every_variant(tmp_path_factory) -> Path:
    """One object for all but sm_120f (nvcc refuses sm_120 and sm_120f code in one compile) and one for it."""
    tmp = tmp_path_factory.mktemp("nvcc")
    return (_compile(tmp, [g for g, t, _ in VARIANTS if t != "sm_120f"], "many.o"),
            _compile(tmp, [g for g, t, _ in VARIANTS if t == "sm_120f"], "family.o"))


def _entries(objects):
    return [e for obj in objects for e in fatbin_entries(obj.read_bytes(), obj.name)]


def test_each_variant_nvcc_writes_is_read_back_with_its_flag_and_kernel(every_variant):
    entries = _entries(every_variant)
    assert sorted(e.target for e in entries) == sorted(t for _, t, _ in VARIANTS)
    assert all(e.kernels == ("_Z16glm_probe_kernelPf",) for e in entries)  # decompressed (zstd) and named


@pytest.mark.parametrize("gencode, target, loads", VARIANTS, ids=[t for _, t, _ in VARIANTS])
def test_what_loads_on_gb10_follows_cudas_compatibility_rules(every_variant, gencode, target, loads):
    entry = next(e for e in _entries(every_variant) if e.target == target)
    assert entry.loads_on(121) is loads


def test_uncompressed_entries_are_read_too(tmp_path):
    obj = _compile(tmp_path, ["arch=compute_120f,code=sm_120f"], compress=False)
    assert [(e.target, e.kernels) for e in fatbin_entries(obj.read_bytes(), "k.o")] == [("sm_120f", ("_Z16glm_probe_kernelPf",))]


@pytest.fixture(scope="module")
def release() -> Path:
    return release_wheel("0.33.0", "x86_64", progress=False)


@pytest.mark.network
def test_the_pinned_release_carries_gb10_code_for_every_kernel_the_model_needs(release):
    result = census(release)
    rows = {row.need.name: row for row in result.rows}
    assert result.ok and all(rows[n.name].loadable for n in NEEDS if n.required)
    # the measured facts behind the README and the doctor: plain sm_120 and sm_120f only, no sm_12xa anywhere
    c = result.binaries["vllm/_C_stable_libtorch.abi3.so"]
    assert {"sm_120", "sm_120f"} <= set(c) and not [t for t in c if t.startswith("sm_12") and t.endswith("a")]
    for name in ("vllm/_flashmla_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/_qutlass_C.abi3.so",
                 "vllm/_deepselect_C.abi3.so"):
        assert not [t for t in result.binaries[name] if "12" in t], name
    assert result.binaries["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"] == ["compute_80", "sm_80"]
    # the NVFP4 DS-MLA KV-cache writer is sm_100f only: an nvfp4 KV cache cannot run on GB10
    assert set(rows["nvfp4-ds-mla-cache"].targets) == {"sm_100f"} and not rows["nvfp4-ds-mla-cache"].loadable


def _wheel_with(tmp: Path, obj: Path) -> Path:
    wheel = tmp / "vllm-0.99.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(obj, "vllm/_C_stable_libtorch.abi3.so")
    return wheel


def test_a_release_that_dropped_sm12x_code_fails_the_census(tmp_path):
    """The kernel is there, for sm_100f and sm_90a only: exit 1, the kernel named MISSING."""
    src = tmp_path / "k.cu"
    obj = _compile(tmp_path, ["arch=compute_100f,code=sm_100f", "arch=compute_90a,code=sm_90a"])
    src.write_text("")
    needs = tuple(n for n in NEEDS if n.name == "kda")
    probe_need = type(needs[0])("probe", "glm_probe_kernel", "the probe kernel")
    result = census(_wheel_with(tmp_path, obj), (probe_need,))
    assert not result.ok and set(result.rows[0].targets) == {"sm_100f", "sm_90a"}
    out = run_patchkit("census", "--wheel", str(_wheel_with(tmp_path, obj)), "--json")
    assert out.code == 1 and '"ok": false' in out.stdout  # every required kernel is missing from this wheel


@pytest.mark.parametrize("damage", ["entry-past-container", "container-past-section", "bad-zstd", "not-elf"])
def test_a_malformed_extension_is_refused_with_exit_2(tmp_path, damage):
    obj = _compile(tmp_path, ["arch=compute_120,code=sm_120"])
    data = bytearray(obj.read_bytes())
    at = data.find((0xBA55ED50).to_bytes(4, "little"))
    if damage == "entry-past-container":
        data[at + 16 + 8:at + 16 + 16] = (1 << 40).to_bytes(8, "little")
    elif damage == "container-past-section":
        data[at + 8:at + 16] = (1 << 40).to_bytes(8, "little")
    elif damage == "bad-zstd":
        head = int.from_bytes(data[at + 16 + 4:at + 16 + 8], "little")
        data[at + 16 + head:at + 16 + head + 8] = b"\x28\xb5\x2f\xfd" + b"\xff" * 4
    else:
        data[:4] = b"\0ELF"
    obj.write_bytes(bytes(data))
    assert_refused(run_patchkit("census", "--wheel", str(_wheel_with(tmp_path, obj))), "_C_stable_libtorch")


USAGE_KERNEL = """
__global__ void glm_usage_kernel(float *x, int n) {
  __shared__ float tile[2048];
  float local[64];
  for (int i = 0; i < 64; ++i) local[i] = x[(threadIdx.x * i) % n];
  tile[threadIdx.x] = local[x[0] > 0 ? threadIdx.x % 64 : 0];
  __syncthreads();
  x[threadIdx.x] = tile[(threadIdx.x + 1) % 2048];
}
"""


def test_the_usage_read_off_a_cubin_is_what_ptxas_reports(tmp_path):
    """Registers, stack and static shared memory read from the fat binary's cubin (.nv.info records, the
    .nv.shared section) agree with what ptxas itself printed compiling it (CUDA 13.0's, on PATH here)."""
    from patchkit.census.ptxas import parse

    src = tmp_path / "u.cu"
    src.write_text(USAGE_KERNEL)
    obj = tmp_path / "u.o"
    done = subprocess.run([_nvcc(), "-c", str(src), "-o", str(obj), "-Xptxas", "-v", "-Xfatbin=-compress-all",
                           "-gencode=arch=compute_120f,code=sm_120f"], check=True, capture_output=True, text=True)
    [reported] = parse(done.stdout + done.stderr, "ptxas")
    [entry] = fatbin_entries(obj.read_bytes(), "u.o")
    [(kernel, used)] = entry.usage.items()
    assert kernel == reported.kernel == "_Z16glm_usage_kernelPfi"
    assert (used.registers, used.stack, used.static_smem) == (reported.registers, reported.stack, reported.static_smem)
    assert used.static_smem == 2048 * 4 and used.stack > 0


@pytest.fixture(scope="module")
def release_0_34_aarch64() -> Path:
    return release_wheel("0.34.0", "aarch64", progress=False)


@pytest.mark.network
def test_flashkda_in_the_0_34_aarch64_wheel_carries_sm_120f_code_gb10_runs(release_0_34_aarch64):
    """vLLM 0.34.0's default KDA prefill on 12.x: its aarch64 wheel's _flashkda_C carries sm_90a, sm_100f and
    sm_120f cubins; the family code loads on GB10 (sm_121), and every kernel of it fits GB10's registers
    and shared memory as its cubin records them."""
    result = census(release_0_34_aarch64)
    rows = {row.need.name: row for row in result.rows}
    assert result.binaries["vllm/_flashkda_C.abi3.so"] == ["sm_100f", "sm_120f", "sm_90a"]
    flashkda = rows["flashkda"]
    assert set(flashkda.targets) == {"sm_90a", "sm_100f", "sm_120f"} and set(flashkda.loadable) == {"sm_120f"}
    summary = flashkda.usage_summary()
    assert summary is not None and summary["kernels"] == flashkda.loadable["sm_120f"]
    assert 0 < summary["max_registers"] <= 255 and summary["max_static_smem_bytes"] <= 101_376
    assert summary["over_gb10_limits"] == [] and flashkda.ok
    out = run_patchkit("census", "--wheel", str(release_0_34_aarch64), "--json", timeout=900)
    assert out.code == 0, out.output[-2000:]
    assert '"need": "flashkda"' in out.stdout and '"usage_on_sm121"' in out.stdout


def test_a_loadable_kernel_over_gb10s_limits_fails_its_row():
    """No compile can make one (ptxas caps registers at 255 and static shared memory at 48 KiB), so the
    guard is shown on usage values as a cubin would carry them: over either limit, the row is not ok."""
    from patchkit.census.kernels import GB10_MAX_REGISTERS, GB10_MAX_SMEM, Row, Usage

    need = next(n for n in NEEDS if n.name == "flashkda")
    fits = Row(need, {"sm_120f": 1}, {"sm_120f": 1}, {"sm_120f k": Usage(GB10_MAX_REGISTERS, 0, GB10_MAX_SMEM)})
    assert fits.ok and fits.over_limits == []
    for used in (Usage(GB10_MAX_REGISTERS + 1, 0, 0), Usage(64, 0, GB10_MAX_SMEM + 1)):
        row = Row(need, {"sm_120f": 1}, {"sm_120f": 1}, {"sm_120f k": used})
        assert not row.ok and row.over_limits == ["sm_120f k"] and row.usage_summary()["over_gb10_limits"] == ["sm_120f k"]


CUOBJDUMP = "nvidia-cuda-cuobjdump==13.2.51"  # the oldest CUDA 13 cuobjdump on the package index (no 13.0 there)


@pytest.fixture(scope="module")
def cuobjdump(tmp_path_factory) -> Path:
    """NVIDIA's cuobjdump from its package-index wheel (this machine's CUDA 13.0 toolkit carries none)."""
    where = tmp_path_factory.mktemp("cuobjdump")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(where), CUOBJDUMP],
                   check=True, capture_output=True, timeout=300)
    [wheel] = where.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extract("nvidia/cu13/bin/cuobjdump", where)
    tool = where / "nvidia/cu13/bin/cuobjdump"
    tool.chmod(0o755)
    return tool


@pytest.mark.network
def test_flashkdas_usage_read_off_its_cubins_is_what_cuobjdump_reports(release_0_34_aarch64, cuobjdump, tmp_path):
    """Every sm_120f kernel of the 0.34.0 aarch64 wheel's _flashkda_C: registers, stack and shared memory as
    NVIDIA's `cuobjdump --dump-resource-usage` prints them (its SHARED counts the 1 KiB reserve the census
    leaves out, as ptxas does)."""
    import re

    so = tmp_path / "_flashkda_C.abi3.so"
    with zipfile.ZipFile(release_0_34_aarch64) as wheel:
        so.write_bytes(wheel.read("vllm/_flashkda_C.abi3.so"))
    [entry] = [e for e in fatbin_entries(so.read_bytes(), so.name) if e.target == "sm_120f"]
    done = subprocess.run([str(cuobjdump), "--dump-resource-usage", "--gpu-architecture", "sm_120f", str(so)],
                          check=True, capture_output=True, text=True, timeout=300)
    reported = re.findall(r"Function (\S+):\n\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:\d+", done.stdout)
    assert len(reported) == len(entry.usage) == 132
    for kernel, registers, stack, shared in reported:
        used = entry.usage[kernel]
        assert (used.registers, used.stack, used.static_smem + 1024) == (int(registers), int(stack), int(shared)), kernel
