"""The run-time compiled half of the kernel census (src/patchkit/census/jit_census.py), with the real nvcc 13 on
the real release sources: vLLM 0.34.0's, 0.33.0's and 0.30.0's persistent top-k from their sdists' csrc (as vLLM's build
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
from patchkit.census import jit_census, ptxas, reach
from patchkit.census.jit_units import GB10_SMEM_OPTIN, VLLM_TOPK, Kernel, Route, Unit
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.release import open_release

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


def test_recorded_kernel_names_are_shown_demangled_by_binutils_and_as_printed_without_it(monkeypatch):
    """c++filt (binutils, which nvcc's host compiler brings) names each recorded kernel as a person searches
    for it; a name that is not mangled, or a machine without c++filt, keeps the name as ptxas printed it."""
    names = [e.kernel for e in ptxas.parse((DATA / "vllm-0.33.0-topk-sm120f.txt").read_text(), "recorded")]
    assert shutil.which("c++filt"), "binutils' c++filt: the README's setup installs it with nvcc's host compiler"
    shown = jit_census.demangle(names + ["-v", "plain"])
    assert shown["_ZN4vllm10persistent22persistent_topk_kernelILi512ELj4EEEvNS0_20PersistentTopKParamsE"] == \
        "vllm::persistent::persistent_topk_kernel<512, 4u>"
    assert (shown["-v"], shown["plain"]) == ("-v", "plain")  # passed as they are, never as an option
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jit_census.demangle(names) == {n: n for n in names}


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


# Hand-written (not from any release): a launcher that refuses, with no fallback, below 128 KiB of opt-in, and a
# caller (Python) that keeps off it only where it upcasts first.
REFUSES = """__global__ void patchkit_refused(float* x) { x[threadIdx.x] *= 2.0f; }
inline void patchkit_launch(float* x, int max_smem_per_block) {
  if (max_smem_per_block < 128 * 1024) throw "refused";
  patchkit_refused<<<1, 256>>>(x);
}
"""
CALLER = "def select(logits):\n    logits = logits.float()\n    return topk(logits)\n"
REFUSING = Unit(
    "hand-written-refusal", "none", ">=0", "a refusal GLM's path must be shown off", members=(), host=("refuses.cu",),
    includes=(), system_includes=(), flags=("-std=c++17", "-O3"), headers=(),
    kernels=(Kernel("refused", r"patchkit_refused", "256", dynamic="0",
                    gates=(r"if \(max_smem_per_block < (\d+) \* 1024\) throw",), launch_sites=r"patchkit_refused<<<",
                    unreached=(Route("caller.py", r"logits = logits\.float\(\)\s*return topk\(logits\)",
                                     "the caller upcasts before its top-k", each=r"topk\("),)),))


def test_a_refusing_launcher_passes_only_where_every_step_off_it_is_read(tmp_path):
    (tmp_path / "refuses.cu").write_text(REFUSES)
    nvcc, _ = jit_census.find_nvcc()
    found = jit_census.compile_tree(REFUSING, list(REFUSING.kernels), tmp_path, nvcc, None, "hand-written")

    def judged(caller: str | None):
        return jit_census.judge(REFUSING, list(REFUSING.kernels), "hand-written", found,
                                {"refuses.cu": REFUSES, "caller.py": caller})

    off = judged(CALLER)
    assert len(off) == 2 and all(r.ok for r in off)
    assert {r.verdict for r in off} == {"refused on GB10 (host needs >= 131,072 B opt-in, refuses.cu:3); off GLM-5.3's "
                                        "path on cc 12.1 (1 steps in the evidence)"}
    assert off[0].evidence == ["refuses.cu:3: the host refuses it below 131,072 B of opt-in shared memory a block",
                               "caller.py:2-3: the caller upcasts before its top-k"]
    second_call = judged(CALLER + "def raw(logits):\n    return topk(logits)\n")
    assert {r.verdict for r in second_call} == {
        "REFUSED ON GB10 AND NOT SHOWN OFF GLM-5.3'S PATH: refused on GB10 (host needs >= 131,072 B opt-in, "
        "refuses.cu:3); caller.py: 1 matches for its 2 call sites of 'logits = logits\\\\.float\\\\(\\\\)\\\\s*return "
        "topk\\\\(logits\\\\)' (expected: the caller upcasts before its top-k)"}
    assert not any(r.ok for r in second_call) and not jit_census.census_dict(second_call, {})["ok"]
    missing = judged(None)
    assert not any(r.ok for r in missing) and all("caller.py is not in the sdist" in r.verdict for r in missing)


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


BF16 = "persistent_topk_kernel (bf16 logits)"


@pytest.mark.network
def test_034s_templated_launchers_get_their_budgets_and_its_bf16_refusal_is_read_off_glms_path():
    """0.34.0 templates topk.cu's launchers on the logits' type: every kernel has a float and a bf16 instantiation,
    and the bf16 persistent top-k is refused (STD_TORCH_CHECK, no fallback) below 128 KiB of opt-in, which GB10
    lacks. It passes only because the release's own Python keeps GLM-5.3 off it, each step cited by file:lines."""
    rows = jit_census.census("vllm", "0.34.0")
    assert rows and all(r.ok for r in rows), [r.verdict for r in rows if not r.ok]
    for arch in ("sm_121a", "sm_120f"):
        fp32 = _by(rows, "persistent_topk_kernel", arch)
        assert len(fp32) == 9 and all(r.name.endswith(", float>") for r in fp32)
        assert {(r.static_smem, r.dynamic_smem, r.threads, r.spills) for r in fp32} == {(0, GB10_SMEM_OPTIN, 1024, 0)}
        bf16 = _by(rows, BF16, arch)
        assert len(bf16) == 9 and all(r.name.endswith(", __nv_bfloat16>") for r in bf16)
        assert {r.verdict for r in bf16} == {"refused on GB10 (host needs >= 131,072 B opt-in, csrc/topk.cu:41-43); "
                                             "off GLM-5.3's path on cc 12.1 (5 steps in the evidence)"}
        assert [e.split(": ", 1)[0] for e in bf16[0].evidence] == [
            "csrc/topk.cu:41-43", "vllm/models/glm5next/sparse_indexer.py:15-16",
            "vllm/models/glm5next/nvidia/sparse_indexer.py:22-24", "vllm/models/glm5next/nvidia/sparse_indexer.py:668-699",
            "vllm/model_executor/layers/sparse_attn_indexer.py:372-381", "vllm/model_executor/layers/indexer_topk.py:237-259"]
        gated = _by(rows, "FilteredTopKUnifiedKernel", arch) + _by(rows, "sampled_topk_kernel", arch)
        assert len(gated) == 30 and {r.verdict for r in gated} == {
            "not launched on GB10 (host needs >= 131,072 B opt-in)", "not launched on GB10 (host needs >= 147,456 B opt-in)"}
    assert {r.kernel for r in rows} == {"persistent_topk_kernel", BF16, "FilteredTopKUnifiedKernel", "sampled_topk_kernel"}
    assert all(not r.evidence for r in rows if r.kernel != BF16)


@pytest.mark.network
def test_a_release_whose_glm_indexer_kept_bf16_logits_would_reach_the_refusal():
    """0.34.0's own files, the GLM indexer's upcast taken out of its decode top-k call: the step is not found,
    so the census cannot say GLM-5.3 is off the bf16 path, and says which step is missing."""
    [kernel] = [k for k in VLLM_TOPK.kernels if k.name == BF16]
    source = open_release("vllm", "0.34.0", cache=ArchiveCache(), progress=False)
    sources = reach.read_sources(source, {r.file for r in kernel.unreached})
    assert not reach.follow(kernel.unreached, sources).problem
    indexer = "vllm/models/glm5next/nvidia/sparse_indexer.py"
    text = sources[indexer]
    assert text is not None and text.count("logits = as_fp32_logits(") == 2
    kept = {**sources, indexer: text.replace("logits = as_fp32_logits(", "logits = (")}
    found = reach.follow(kernel.unreached, kept)
    assert len(found.evidence) == 4 and found.problem.startswith(
        f"{indexer}: 0 matches for its 1 call sites of ") and "(expected: its decode top-k is handed" in found.problem
    gone = reach.follow(kernel.unreached, {**sources, "vllm/model_executor/layers/sparse_attn_indexer.py": None})
    assert gone.problem == ("vllm/model_executor/layers/sparse_attn_indexer.py is not in the sdist (expected: "
                            "as_fp32_logits returns float32 logits)")


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
    out = run_patchkit("census", "--compile", "--json", timeout=3600, address_space=False)
    assert out.code == 0, out.output[-3000:]
    result = json.loads(out.stdout)
    companion = result["companion"]
    assert companion["how"] in ("pinned", "substitute") and companion["checked"], companion
    assert result["ok"] and result["releases"] == {"vllm": PINNED_VLLM, "flashinfer-python": companion["checked"]}
    assert {k["version"] for k in result["kernels"] if k["unit"] == "flashinfer-sparse-mla"} == {companion["checked"]}
    assert result["limits"]["smem_per_block"] == GB10_SMEM_OPTIN
    assert {k["unit"] for k in result["kernels"]} == {"vllm-persistent-topk", "flashinfer-sparse-mla"}
    table = run_patchkit("census", "--compile", timeout=3600, address_space=False)
    # "<512, 4u>" on 0.33.0, "<512, 4u, float>" where the launchers are templated on the logits' type (0.34.0)
    assert table.code == 0 and "persistent_topk_kernel<512, 4u" in table.stdout and "101,376" in table.stdout


@pytest.mark.network
def test_cli_of_034_prints_the_bf16_refusal_with_its_evidence_once():
    """From the cache the 0.34.0 test filled: exit 0 (the refusal is off GLM-5.3's path), the evidence in the
    JSON rows and printed once under the table, not once per entry."""
    out = run_patchkit("census", "--compile", "--release", "0.34.0", "--json", timeout=3600,
                       address_space=False)
    assert out.code == 0, out.output[-3000:]
    bf16 = [k for k in json.loads(out.stdout)["kernels"] if k["kernel"] == BF16]
    assert len(bf16) == 18 and all(k["ok"] and len(k["evidence"]) == 6 for k in bf16)
    table = run_patchkit("census", "--compile", "--release", "0.34.0", timeout=3600, address_space=False)
    assert table.code == 0 and table.stdout.count("csrc/topk.cu:41-43: the host refuses it below 131,072 B") == 1
    assert "vllm/models/glm5next/nvidia/sparse_indexer.py:668-699: its decode top-k is handed" in table.stdout


def test_without_nvcc_it_says_so_and_exits_2(tmp_path):
    python_dir = str(Path(shutil.which("python3") or "/usr/bin/python3").parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists())
    assert shutil.which("nvcc", path=path) is None
    out = run_patchkit("census", "--compile", env={"PATH": path or python_dir})
    assert_refused(out, "nvcc not found on PATH", "nothing was checked")


@pytest.mark.parametrize("args, said", [
    (["verify", "--compile"], "the kernel census is its own command: patchkit census"),  # where it lived before
    (["verify", "--kernels", "--versions", "0.34.0"], "the kernel census is its own command: patchkit census"),
    (["census", "--compile", "--wheel", "x.whl"], "--compile compiles the release's sources: it takes no --wheel"),
    (["census", "--release", ">=0.33"], "'>=0.33' is not a version (expected one release"),
])
def test_census_usage_mistakes_are_exit_2_with_the_way_on(args, said):
    out = run_patchkit(*args)
    assert out.code == 2 and said in out.output and "Traceback" not in out.output, out.output


@pytest.mark.parametrize("args, option", [(["census", "--release", "latest"], "--release"),
                                          (["retire", "--release", "latest"], "--release"),
                                          (["bump", "releases", "--newer-than", "latest"], "--newer-than")])
def test_every_one_release_option_refuses_a_non_version_naming_itself(args, option):
    """cli.options.one_release is the one check of a release given on the command line."""
    out = run_patchkit(*args)
    assert out.code == 2 and f"Invalid value for {option}: 'latest' is not a version" in out.output, out.output
