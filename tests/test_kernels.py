"""The kernel census (src/patchkit/verify/kernels.py) read against what the real tools write: fat binaries
nvcc 13.0 compiles here for every SM variant (the flag bits and the loading rule, checked per variant),
and vLLM 0.33.0's real x86_64 wheel (the one tests/test_wheels.py downloads; its sm_12x set is the
aarch64 wheel's). A wheel that lost its sm_12x code fails the census; a malformed extension is exit 2.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from hostile import assert_refused, run_patchkit
from patchkit.verify.kernels import NEEDS, census, fatbin_entries
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
    out = run_patchkit("verify", "--kernels", "--wheel", str(_wheel_with(tmp_path, obj)), "--json")
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
    assert_refused(run_patchkit("verify", "--kernels", "--wheel", str(_wheel_with(tmp_path, obj))), "_C_stable_libtorch")
