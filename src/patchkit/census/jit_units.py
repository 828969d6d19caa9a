"""What the run-time compiled half of the kernel census compiles, per release layout, and where each kernel's
shared-memory request is stated in that release's own source.

Two things the GLM-5.3 path on GB10 compiles from source rather than loading from a wheel's SASS:

- vLLM's persistent top-k (the sparse indexer's select_k; GLM-5.3: 2048 // kpool 4 = 512), compiled here from
  the release sdist's own `csrc/topk.cu` (0.30/0.31: `csrc/libtorch_stable/topk.cu`) exactly as vLLM's build
  compiles that translation unit into `_C_stable_libtorch` (CMakeLists.txt: C++20, -DUSE_CUDA,
  TORCH_TARGET_VERSION 2.11, torch's COMMON_NVCC_FLAGS less the half-operator switches CUDA >= 12 drops,
  -DENABLE_FP8, RelWithDebInfo's -O2 -DNDEBUG; host -g left out, it does not touch device code), against
  torch's C++ headers. Its kernel's dynamic shared memory is sized at launch to the device
  (`sharedMemPerBlockOptin`), so the budget is the host code's rule, checked in the source by `sized_to_optin`;
  the kernels it launches only on devices with more opt-in shared memory carry that `gates`. From 0.34 the
  launchers are templated on the logits' type (float, bf16) and the bf16 persistent top-k is refused, not
  replaced, below 128 KiB: a gate with `unreached`, the steps that keep GLM-5.3 off it (reach.py).
- FlashInfer's FLASHINFER_MLA_SPARSE_SM120 module (JIT-compiled by flashinfer-python on 12.x, with FlashInfer's
  own JIT flags: C++17, -O3, -use_fast_math, its FLASHINFER_ENABLE_* switches, its vendored CCCL first, then
  its include/, CUTLASS and spdlog). Its dispatch translation units instantiate every model family and head
  count (40 decode kernels in 0.6.x), so the probe compiles only the instantiations GLM-5.3 reaches as
  nope-mla-pad hands it the 512+64 = 576-wide padded heads (ModelType GLM_NSA): 64 heads (TP 1) and 32 (TP 2),
  page block 64; top-k 2048 on 0.6.x (its kernels take at most 2048 at compile time: the patch fits vLLM's
  2176-wide table to it), the runtime top-k instantiation on 0.7.x (2176 as vLLM passes it). The kernel
  template arguments are those each release's launcher passes; the dynamic shared memory is the launcher's own
  constant (its `using`/`constexpr` lines up to `auto kernel =`, copied from the source and evaluated by nvcc).
  Not compiled: the split-K merge kernel (a few hundred bytes of shared memory), TP 4's 16 heads (the SG
  prefill), the dsv4/dsv41 families GLM never takes.
"""

from __future__ import annotations

from dataclasses import dataclass

GB10_SMEM_OPTIN = 101_376   # bytes of shared memory a block may opt in to on GB10 (vLLM PR #54110's GB10 runs)
GB10_REGS_PER_SM = 65_536   # 32-bit registers per SM, compute capability 12.x
GB10_REGS_PER_THREAD = 255
REGISTER_UNIT = 256         # registers are allocated per warp in units of 256 (CUDA occupancy calculator, 12.x)
ARCHS = ("sm_121a", "sm_120f")  # GB10's own arch-specific target (FlashInfer's JIT picks it) and vLLM's family one
GENCODE = {"sm_121a": "-gencode=arch=compute_121a,code=sm_121a", "sm_120f": "-gencode=arch=compute_120f,code=sm_120f"}


@dataclass(frozen=True)
class Kernel:
    """A kernel (family) the unit compiles, found among ptxas' entries by `match` (a regex on the mangled name)."""

    name: str
    match: str
    threads: str              # C++ expression: threads per block at launch
    dynamic: str = ""         # C++ expression: the dynamic shared memory its launcher requests, in bytes
    launcher: tuple[str, str, str, str] | None = None  # (file, function, its constant, template arguments)
    instance: str = ""        # an instantiation the probe compiles (FlashInfer), taken by address
    sized_to_optin: tuple[str, ...] = ()  # host-source patterns: the request is capped at the device's opt-in
    gates: tuple[str, ...] = ()           # host-source patterns capturing the KiB of opt-in each launch needs
    launch_sites: str = ""                # host-source pattern: one match per launch, as many as `gates`
    versions: str = ""                    # PEP 440 range of the releases that have it (default: all)
    # For a gate that refuses the call (the host raises) where the others fall back to another kernel: the steps
    # of the release's Python code that keep GLM-5.3 on GB10 from calling it; every one must be found (reach.py).
    unreached: tuple[Route, ...] = ()


@dataclass(frozen=True)
class Route:
    """A step of GLM-5.3's path on GB10 read in the release's own source: `pattern` (a regex, re.S) matches `file`
    (relative to the sdist's top) once, or, with `each`, once per match of `each` (every call site accounted)."""

    file: str
    pattern: str
    says: str        # what the match shows, as the finding states it
    each: str = ""


@dataclass(frozen=True)
class Unit:
    name: str
    dist: str                  # the distribution whose sdist holds the sources
    versions: str              # PEP 440 range of the releases of this layout
    why: str
    members: tuple[str, ...]   # directories (or file-name prefixes) of the sdist the compile reads
    host: tuple[str, ...]      # the release's own translation unit, first that exists ("" for none)
    includes: tuple[str, ...]  # -I, relative to the sdist's top
    system_includes: tuple[str, ...]
    flags: tuple[str, ...]
    headers: tuple[str, ...]   # what the probe includes
    kernels: tuple[Kernel, ...]
    namespace: str = ""        # the probe's launcher copies and instances live in it
    needs_torch: bool = False
    ignore: tuple[str, ...] = ()  # entries compiled but never launched (cub's EmptyKernel)


def _filtered(in_type: str, versions: str) -> Kernel:
    """FilteredTopK, launched where the opt-in is >= 128 KiB, else the host falls back to persistent top-k."""
    launch = rf"FilteredTopKRaggedTransform<{in_type}, int32_t, TopK>\("
    return Kernel(
        "FilteredTopKUnifiedKernel", r"FilteredTopKUnifiedKernel", "vllm::filtered_topk::FILTERED_TOPK_BLOCK_THREADS",
        dynamic="vllm::filtered_topk::FILTERED_TOPK_SMEM_DYNAMIC", versions=versions,
        gates=(r"num_rows > 32 && max_smem_per_block >= (\d+) \* 1024\) \{\s*cudaError_t status =\s*vllm::" + launch,
               r"if \(max_smem_per_block < (\d+) \* 1024\) \{[^}]*top_k_per_row_decode\([^}]*return;\s*\}\s*"
               r"cudaError_t status =\s*vllm::" + launch),
        launch_sites=launch)


def _sampled(instance: str, versions: str) -> Kernel:
    return Kernel(
        "sampled_topk_kernel", r"sampled_topk_kernel", "vllm::sampled_topk::kThreads",
        dynamic="vllm::filtered_topk::FILTERED_TOPK_SMEM_DYNAMIC", versions=versions,
        gates=(rf"max_smem_per_block >= (\d+) \* 1024\) \{{\s*auto kernel = vllm::sampled_topk::{instance};",),
        launch_sites=r"kernel<<<num_rows, vllm::sampled_topk::kThreads,")


_GLM_INDEXER = "vllm/models/glm5next/nvidia/sparse_indexer.py"
# 0.34.0 templates the launchers on the logits' type: its bf16 persistent top-k is refused below 128 KiB of opt-in
# (csrc/topk.cu: STD_TORCH_CHECK, no fallback), so it must be off GLM-5.3's path on GB10, and these say why.
_BF16_UNREACHED = (
    Route("vllm/models/glm5next/sparse_indexer.py", r"else:\s*from \.nvidia\.sparse_indexer import",
          "GLM-5.3's indexer off ROCm is nvidia/sparse_indexer.py"),
    Route(_GLM_INDEXER, r"from vllm\.model_executor\.layers\.sparse_attn_indexer import \([^)]*\bas_fp32_logits\b",
          "it takes as_fp32_logits from the shared sparse_attn_indexer"),
    Route(_GLM_INDEXER, r"logits = as_fp32_logits\((?:(?!\n\s*logits = ).)*?\n\s*get_indexer_topk\(\w+\)\(\s*logits,",
          "its decode top-k is handed the as_fp32_logits result", each=r"get_indexer_topk\(\w+\)\(|persistent_topk\("),
    Route("vllm/model_executor/layers/sparse_attn_indexer.py",
          r"def as_fp32_logits\((?:(?!\ndef ).)*?if logits\.dtype == torch\.float32:\s*return logits\s*out = torch\.empty_strided\("
          r"\s*logits\.shape, logits\.stride\(\), dtype=torch\.float32",
          "as_fp32_logits returns float32 logits"),
    Route("vllm/model_executor/layers/indexer_topk.py",
          r"def takes_bf16_logits\((?:(?!\n    def ).)*?return \(\s*self\._backend in \(\"auto\", \"persistent\"\)\s*and self\._is_cuda"
          r"\s*and current_platform\.is_device_capability_family\(100\)",
          "the shared top-k selector keeps bf16 logits for persistent top-k only on the 10.x family"),
)
_PERSISTENT = Kernel(
    "persistent_topk_kernel", r"persistent_topk_kernel", "vllm::persistent::kThreadsPerBlock",
    dynamic="vllm::persistent::kSmemMedium",
    sized_to_optin=(r"max_smem_per_block = device_prop->sharedMemPerBlockOptin;",
                    r"effective_max_smem =\s*std::min\(max_smem_per_block, static_cast<int>\(P::kSmemMedium\)\);",
                    r"effective_max_smem = std::min\(max_smem_per_block, kSmemCapMedium\);",
                    r"effective_max_smem = max_smem_per_block;",
                    r"static_cast<size_t>\(effective_max_smem\) - P::kFixedSmemLarge;",
                    r"if \(chunk_size > max_chunk_elements\) chunk_size = max_chunk_elements;",
                    r"if \(smem_size < P::kSmemMedium\) smem_size = P::kSmemMedium;"))
_TOPK_KERNELS = (
    # first: an entry is the first kernel whose `match` it meets, and the float one's matches the bf16 entries too
    Kernel("persistent_topk_kernel (bf16 logits)", r"persistent_topk_kernelILi\d+ELj\d+E13__nv_bfloat16E",
           "vllm::persistent::kThreadsPerBlock", dynamic="vllm::persistent::kSmemMedium", versions=">=0.34",
           gates=(r"STD_TORCH_CHECK\(\s*sizeof\(InT\) == sizeof\(float\) \|\| max_smem_per_block >= (\d+) \* 1024,"
                  r"\s*\"bfloat16 persistent_topk requires",),
           launch_sites=r"launch_persistent_topk<TopK, __nv_bfloat16>\(", unreached=_BF16_UNREACHED),
    _PERSISTENT,
    _filtered("float", "<0.34"), _filtered("InT", ">=0.34"),
    _sampled("sampled_topk_kernel<TopK>", ">=0.32,<0.34"), _sampled("sampled_topk_kernel<TopK, InT>", ">=0.34"),
)

VLLM_TOPK = Unit(
    "vllm-persistent-topk", "vllm", ">=0.30",
    "the sparse indexer's top-k (persistent_topk; GLM-5.3 select_k 512), compiled from the release's csrc",
    members=("csrc/",), host=("csrc/topk.cu", "csrc/libtorch_stable/topk.cu"),
    includes=("csrc",), system_includes=(),
    flags=("-std=c++20", "-O2", "-DNDEBUG", "-Xcompiler=-fPIC", "--expt-relaxed-constexpr", "-DENABLE_FP8",
           "-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020B000000000000ULL"),
    headers=(), kernels=_TOPK_KERNELS, needs_torch=True, ignore=(r"EmptyKernel",))

_FI_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "-use_fast_math", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC",
             "-static-global-template-stub=false", "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16",
             "-DFLASHINFER_ENABLE_FP8_E4M3", "-DFLASHINFER_ENABLE_FP8_E5M2", "-DFLASHINFER_ENABLE_FP8_E8M0",
             "-DFLASHINFER_ENABLE_FP4_E2M1")
_FI_MEMBERS = ("include/", "csrc/sparse_mla_sm120", "3rdparty/cutlass/include/", "3rdparty/cutlass/tools/util/include/",
               "3rdparty/cccl/cub/", "3rdparty/cccl/libcudacxx/include/", "3rdparty/cccl/thrust/", "3rdparty/spdlog/include/")
_FI_INCLUDES = ("3rdparty/cccl/cub", "3rdparty/cccl/libcudacxx/include", "3rdparty/cccl/thrust")
_FI_SYSTEM = ("include", "csrc", "3rdparty/cutlass/include", "3rdparty/cutlass/tools/util/include", "3rdparty/spdlog/include")
_FI_WHY = "FlashInfer's sparse MLA SM120 module, GLM_NSA (576 = 512 + 64 padded) instantiations, as nope-mla-pad feeds it"
_SM120 = "flashinfer/attention/sparse_mla_sm120/"


def _flashinfer_06(heads: int) -> tuple[Kernel, ...]:
    decode, prefill = "csrc/sparse_mla_sm120_decode_dsv3_2.cu", "csrc/sparse_mla_sm120_prefill.cu"
    return (
        Kernel(f"decode_dsv3_2<GLM_NSA, {heads}, 2048>", rf"sparse_mla_decode_dsv3_2_kernel\w*Li{heads}ELi2048ELi64E",
               "", launcher=(decode, "launch_decode_dsv3_2_impl", "DYN_SMEM_BYTES", f"<ModelType::GLM_NSA, {heads}, 2048>"),
               instance=f"sparse_mla_decode_dsv3_2_kernel<ModelType::GLM_NSA, {heads}, 2048, 64>"),
        Kernel(f"prefill_mg<GLM_NSA, FP8, {heads}, 2048>", rf"sparse_mla_prefill_mg_kernel\w*Li{heads}ELi2048ELi64E",
               "", launcher=(prefill, "launch_prefill_mg", "smem_bytes", f"<ModelType::GLM_NSA, ComputeMode::FP8, {heads}, 2048, 64>"),
               instance=f"sparse_mla_prefill_mg_kernel<ModelType::GLM_NSA, ComputeMode::FP8, {heads}, 2048, 64>"),
    )


def _flashinfer_07(heads: int) -> tuple[Kernel, ...]:
    decode, prefill = "csrc/sparse_mla_sm120/dsv32_decode_dispatch.cu", f"include/{_SM120}execution/prefill_launch.cuh"
    first = Kernel(f"decode_dsv3_2<GLM_NSA, {heads}> (top-k at run time)", rf"sparse_mla_decode_dsv3_2_kernel\w*Li{heads}EEEv",
                   "", launcher=(decode, "launch_decode_dsv3_2_impl", "DYN_SMEM_BYTES", f"<ModelType::GLM_NSA, {heads}>"),
                   instance=f"sparse_mla_decode_dsv3_2_kernel<ModelType::GLM_NSA, {heads}>")
    if heads % 64 == 0:  # FlashInfer's automatic prefill order takes swapAB first where it is instantiated (64, 128 heads)
        return first, Kernel(f"prefill_swapab<GLM_NSA, {heads}>", rf"sparse_mla_prefill_swapab_kernel\w*Li{heads}EEv", "",
                             launcher=(prefill, "launch_prefill_swapab", "smem_bytes", f"<ModelType::GLM_NSA, {heads}>"),
                             instance=f"sparse_mla_prefill_swapab_kernel<ModelType::GLM_NSA, {heads}>")
    return first, Kernel(f"prefill_mg<GLM_NSA, FP8, {heads}>", rf"sparse_mla_prefill_mg_kernel\w*Li{heads}ELi64ELi2E", "",
                         launcher=(prefill, "launch_prefill_mg", "smem_bytes", f"<ModelType::GLM_NSA, QkComputeMode::FP8, {heads}, 64>"),
                         instance=f"sparse_mla_prefill_mg_kernel<ModelType::GLM_NSA, QkComputeMode::FP8, {heads}, 64, MG_N_HG_DEFAULT>")


GLM_HEADS = (64, 32)  # GLM-5.3-Flash's 64 attention heads at TP 1 and TP 2 (one and two Sparks)

FLASHINFER_06 = Unit(
    "flashinfer-sparse-mla", "flashinfer-python", "<0.7", _FI_WHY, _FI_MEMBERS, (), _FI_INCLUDES, _FI_SYSTEM, _FI_FLAGS,
    headers=tuple(_SM120 + h for h in ("decode_dsv3_2_kernel.cuh", "decode_dsv4_kernel.cuh", "model/kv_cache_traits.cuh",
                                       "common/smem_layout.cuh", "prefill_kernel.cuh")),
    kernels=tuple(k for h in GLM_HEADS for k in _flashinfer_06(h)), namespace="flashinfer::sparse_mla_sm120")

FLASHINFER_07 = Unit(
    "flashinfer-sparse-mla", "flashinfer-python", ">=0.7", _FI_WHY, _FI_MEMBERS, (), _FI_INCLUDES, _FI_SYSTEM, _FI_FLAGS,
    headers=tuple(_SM120 + h for h in ("kernels/dsv32_fp8/decode.cuh", "model/kv_cache_traits.cuh",
                                       "kernels/fp8_prefill/smem_layout.cuh", "kernels/fp8_prefill/prefill_mg.cuh",
                                       "kernels/fp8_prefill/prefill_swapab.cuh")),
    kernels=tuple(k for h in GLM_HEADS for k in _flashinfer_07(h)), namespace="flashinfer::sparse_mla_sm120")

UNITS = (VLLM_TOPK, FLASHINFER_06, FLASHINFER_07)
