"""The run-time compiled half of the kernel census (src/patchkit/census/jit_census.py), with the real nvcc 13 on
the real release sources: vLLM 0.33.0's and 0.30.0's persistent top-k from their sdists' csrc (as vLLM's build
compiles topk.cu, against the tests environment's torch headers), FlashInfer 0.6.18.post1's and 0.7.2.post1's
sparse MLA SM120 kernels at the shapes nope-mla-pad hands them, for sm_121a and sm_120f. Each unit compiles
once into the user cache dir (vLLM's topk.cu: ~3 min of CPU for both targets, ~8 min wall on a loaded 2-core
machine; FlashInfer's probes ~15 s); a second run reads the cache.

The ptxas parser is checked on recorded real output (tests/data/ptxas/, the command beside it); the GB10
limit failure on a tiny kernel written here (hand-written, marked so) that asks for more shared memory than
GB10 has, compiled for real.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hostile import assert_refused, run_patchkit
from patchkit import PINNED_VLLM
from patchkit.census import jit_census, ptxas
from patchkit.census.jit_units import GB10_SMEM_OPTIN, Kernel, Unit

DATA = Path(__file__).parent / "data" / "ptxas"


def _by(rows, kernel: str, arch: str | None = None):
    return [r for r in rows if r.kernel == kernel and (arch is None or r.arch == arch)]


def test_ptxas_report_is_read_per_entry_on_recorded_vllm_output():
    entries = {e.kernel: e for e in ptxas.parse((DATA / "vllm-0.33.0-topk-sm120f.txt").read_text(), "recorded")}
    assert len(entries) == 5 and {e.arch for e in entries.values()} == {"sm_120f"}
    sampled = entries["_ZN4vllm12sampled_topk19sampled_topk_kernelILi2048EEEvPKfPKiPili"]
    # its own properties, not those of the device function ptxas reports right after it (300/312 B spills)
    assert (sampled.registers, sampled.spill_stores, sampled.spill_loads, sampled.stack, sampled.static_smem,
            sampled.barriers) == (64, 164, 176, 136, 11776, 1)
    persistent = entries["_ZN4vllm10persistent22persistent_topk_kernelILi512ELj4EEEvNS0_20PersistentTopKParamsE"]
    assert (persistent.registers, persistent.spill_stores, persistent.static_smem) == (52, 0, 0)
    assert persistent.warnings and ".minnctapersm will be ignored" in persistent.warnings[0]  # 2 x 1024 > 1536/SM
    assert entries["_ZN3cub18CUB_300001_SM_12006detail11EmptyKernelIvEEvv"].registers == 4


def test_ptxas_report_of_both_targets_on_recorded_flashinfer_output():
    entries = ptxas.parse((DATA / "flashinfer-0.7.2.post1-sparse-mla-glm.txt").read_text(), "recorded")
    assert sorted({e.arch for e in entries}) == ["sm_120f", "sm_121a"] and len(entries) == 8
    swapab = [e for e in entries if "swapab" in e.kernel]
    assert [(e.registers, e.spill_stores + e.spill_loads) for e in swapab] == [(168, 440), (168, 440)]


def test_an_entry_without_its_usage_line_is_refused():
    text = "ptxas info    : Compiling entry function '_Z1kv' for 'sm_121a'\nptxas info    : Compile time = 1 ms\n"
    with pytest.raises(ptxas.PtxasOutputError) as info:
        ptxas.parse(text, "cut short")
    assert (info.value.what, info.value.kernel, info.value.arch, info.value.problem) == (
        "cut short", "_Z1kv", "sm_121a", "no-usage")
    assert str(info.value) == ("cut short: ptxas named entry _Z1kv for sm_121a but printed no 'Used N registers' "
                               "line for it (expected nvcc -Xptxas -v output)")


# Hand-written (not from any release): a kernel with 32 KiB of static shared memory whose launcher asks for
# 80 KiB more, 114,688 B a block, past GB10's 101,376; and one that fits.
TOO_BIG = """#pragma once
constexpr int kPatchkitDynamic = 80 * 1024;
__global__ void patchkit_too_big(float* x) {
  extern __shared__ float dynamic_part[];
  __shared__ float static_part[8192];
  static_part[threadIdx.x] = x[threadIdx.x];
  dynamic_part[threadIdx.x] = static_part[(threadIdx.x + 1) % 256];
  __syncthreads();
  x[threadIdx.x] = dynamic_part[(threadIdx.x + 7) % 256];
}
__global__ void patchkit_fits(float* x) {
  extern __shared__ float dynamic_part[];
  dynamic_part[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = dynamic_part[(threadIdx.x + 3) % 256];
}
"""
HAND_WRITTEN = Unit(
    "hand-written", "none", ">=0", "a GB10 limit failure case", members=(), host=(), includes=(".",),
    system_includes=(), flags=("-std=c++17", "-O3"), headers=("too_big.cuh",),
    kernels=(Kernel("too_big", r"patchkit_too_big", "256", dynamic="kPatchkitDynamic", instance="patchkit_too_big"),
             Kernel("fits", r"patchkit_fits", "256", dynamic="64 * 1024", instance="patchkit_fits")))


@pytest.fixture(scope="module")
def hand_written(tmp_path_factory):
    top = tmp_path_factory.mktemp("hand-written")
    (top / "too_big.cuh").write_text(TOO_BIG)
    nvcc, _ = jit_census.find_nvcc()
    found = jit_census.compile_tree(HAND_WRITTEN, list(HAND_WRITTEN.kernels), top, nvcc, None, "hand-written")
    return found, jit_census.judge(HAND_WRITTEN, list(HAND_WRITTEN.kernels), "hand-written", found)


def test_a_kernel_asking_more_shared_memory_than_gb10_has_fails(hand_written):
    _found, rows = hand_written
    for arch in ("sm_121a", "sm_120f"):
        [big] = _by(rows, "too_big", arch)
        assert (big.static_smem, big.dynamic_smem, big.threads) == (32768, 81920, 256)
        assert not big.ok and big.verdict == "EXCEEDS GB10: 114,688 B shared memory per block > 101,376"
        [fits] = _by(rows, "fits", arch)
        assert fits.ok and fits.verdict == "fits" and fits.static_smem + fits.dynamic_smem <= GB10_SMEM_OPTIN
    assert not jit_census.census_dict(rows, {})["ok"]


def test_a_cache_record_without_the_users_mac_is_compiled_again(hand_written, tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path))
    found, _rows = hand_written
    jit_census._store("k" * 64, found)
    assert jit_census._cached("k" * 64)["ptxas"] == found["ptxas"]
    path = tmp_path / "jit-census" / f"{'k' * 64}.json"
    forged = json.loads(path.read_text())
    forged["ptxas"] = forged["ptxas"].replace("bytes smem", "bytes cmem[0]")  # would hide the static smem
    path.write_text(json.dumps(forged))
    assert jit_census._cached("k" * 64) is None


@pytest.mark.network
def test_pinned_release_persistent_topk_fits_gb10():
    """0.33.0's topk.cu: persistent_topk sized to the opt-in with no static shared memory (exactly 101,376 B
    a block on GB10), within a block's registers; the 128 KiB kernels are launched only where the opt-in is
    >= 128 KiB (FilteredTopK) or 144 KiB (sampled top-k), so never on GB10."""
    rows = jit_census.census("vllm", "0.33.0")
    assert all(r.ok for r in rows), [r.verdict for r in rows if not r.ok]
    for arch in ("sm_121a", "sm_120f"):
        persistent = _by(rows, "persistent_topk_kernel", arch)
        assert len(persistent) == 9  # TopK 512/1024/2048 x vector width 1/2/4
        assert {(r.static_smem, r.dynamic_smem, r.threads, r.spills) for r in persistent} == {(0, GB10_SMEM_OPTIN, 1024, 0)}
        assert all(r.registers <= 64 and r.warnings for r in persistent)  # ptxas drops __launch_bounds__'s 2/SM
        gated = _by(rows, "FilteredTopKUnifiedKernel", arch) + _by(rows, "sampled_topk_kernel", arch)
        assert len(gated) == 15 and all(r.verdict.startswith("not launched on GB10") for r in gated)
        assert all(r.static_smem + r.dynamic_smem > GB10_SMEM_OPTIN for r in gated)  # they would not fit
    assert {r.arch for r in rows} == {"sm_121a", "sm_120f"}


@pytest.mark.network
def test_the_release_where_persistent_topk_cc12_applies_already_fits_gb10():
    """0.30.0, the first release of the patch's range, whose guard the patch re-derives: its released kernel
    already sizes to the opt-in and falls back (vLLM PR #54110), so unpatched it fits GB10 too: the evidence for
    the patch's [upstreamed] on releases. What does not fit is the pinned base's nightly, whose source is not
    on the package index (docs/field-records.md)."""
    rows = jit_census.census("vllm", "0.30.0")
    assert rows and all(r.ok for r in rows), [r.verdict for r in rows if not r.ok]
    persistent = _by(rows, "persistent_topk_kernel")
    assert len(persistent) == 18 and {(r.static_smem, r.dynamic_smem) for r in persistent} == {(0, GB10_SMEM_OPTIN)}
    assert not _by(rows, "sampled_topk_kernel")  # 0.32+ only


@pytest.mark.network
@pytest.mark.parametrize("version, topk", [("0.6.18.post1", "2048"), ("0.7.2.post1", "run time")])
def test_flashinfer_sparse_mla_at_nope_mla_pads_shapes_fits_gb10(version, topk):
    rows = jit_census.census("flashinfer-python", version)
    assert rows and all(r.ok and r.verdict == "fits" for r in rows), [r.verdict for r in rows]
    assert len(rows) == 8 and {r.arch for r in rows} == {"sm_121a", "sm_120f"}
    decode = [r for r in rows if r.kernel.startswith("decode_dsv3_2")]
    assert len(decode) == 4 and all(topk in r.kernel for r in decode)
    # the launcher's own constant, 1 KiB under GB10's opt-in; 288 threads (1 IO + 8 math warps)
    assert {(r.dynamic_smem, r.threads, r.static_smem) for r in decode} == {(98608, 288, 0)}
    assert all(r.static_smem + r.dynamic_smem <= GB10_SMEM_OPTIN for r in rows)


@pytest.mark.network
def test_cli_table_and_json_of_the_pinned_release():
    """From the cache the tests above filled: exit 0, every kernel of both releases judged: the pinned vLLM's
    and the FlashInfer its companion policy names (its pin, or the published release checked in its place)."""
    out = run_patchkit("verify", "--kernels", "--compile", "--json", timeout=3600, address_space=False)
    assert out.code == 0, out.output[-3000:]
    result = json.loads(out.stdout)
    companion = result["companion"]
    assert companion["how"] in ("pinned", "substitute") and companion["checked"], companion
    assert result["ok"] and result["releases"] == {"vllm": PINNED_VLLM, "flashinfer-python": companion["checked"]}
    assert {k["version"] for k in result["kernels"] if k["unit"] == "flashinfer-sparse-mla"} == {companion["checked"]}
    assert result["limits"]["smem_per_block"] == GB10_SMEM_OPTIN
    assert {k["unit"] for k in result["kernels"]} == {"vllm-persistent-topk", "flashinfer-sparse-mla"}
    table = run_patchkit("verify", "--kernels", "--compile", timeout=3600, address_space=False)
    assert table.code == 0 and "persistent_topk_kernel<512, 4u>" in table.stdout and "101,376" in table.stdout


def test_without_nvcc_it_says_so_and_exits_2(tmp_path):
    python_dir = str(Path(shutil.which("python3") or "/usr/bin/python3").parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists())
    assert shutil.which("nvcc", path=path) is None
    out = run_patchkit("verify", "--kernels", "--compile", env={"PATH": path or python_dir})
    assert_refused(out, "nvcc not found on PATH", "nothing was checked")


def test_compile_goes_with_kernels():
    out = run_patchkit("verify", "--compile")
    assert out.code == 2 and "--compile goes with --kernels" in out.output
