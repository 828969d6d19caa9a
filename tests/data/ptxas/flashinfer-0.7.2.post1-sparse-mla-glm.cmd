# Provenance: real ptxas output (CUDA 13.0, nvcc V13.0.88) of patchkit's probe for FlashInfer 0.7.2.post1's
# sparse MLA SM120 kernels at GLM_NSA shapes (decode 32/64 heads, prefill MG 32 and swapAB 64), both targets,
# produced on 2026-12-02 by src/patchkit/verify/jit_census.py compile_tree (kept from its cache record; only
# the ptxas lines, nvcc's front-end warnings about the copied launchers' unused constants dropped). The probe is
# what probe_source() writes for jit_units.FLASHINFER_07; the command, in the sdist's top directory (sha256
# af60319898dc..., through patchkit's source cache):
nvcc -c patchkit_probe.cu -o probe.o -std=c++17 -O3 -DNDEBUG -use_fast_math --expt-relaxed-constexpr \
  -Xcompiler=-fPIC -static-global-template-stub=false -DFLASHINFER_ENABLE_F16 -DFLASHINFER_ENABLE_BF16 \
  -DFLASHINFER_ENABLE_FP8_E4M3 -DFLASHINFER_ENABLE_FP8_E5M2 -DFLASHINFER_ENABLE_FP8_E8M0 -DFLASHINFER_ENABLE_FP4_E2M1 \
  -I3rdparty/cccl/cub -I3rdparty/cccl/libcudacxx/include -I3rdparty/cccl/thrust \
  -isystem=include -isystem=csrc -isystem=3rdparty/cutlass/include -isystem=3rdparty/cutlass/tools/util/include \
  -isystem=3rdparty/spdlog/include \
  -gencode=arch=compute_121a,code=sm_121a -gencode=arch=compute_120f,code=sm_120f -Xptxas=-v --keep --keep-dir=keep
