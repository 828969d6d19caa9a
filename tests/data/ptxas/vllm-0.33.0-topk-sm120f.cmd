# Provenance: real ptxas output (CUDA 13.0, nvcc V13.0.88), trimmed to the ptxas lines of five entries and their
# warnings (nvcc's own front-end warnings dropped), produced on 2026-12-02 from vLLM 0.33.0's sdist
# (sha256 f4c33c2503d5..., read through patchkit's source cache, csrc/ extracted), in vllm-0.33.0/:
nvcc -c csrc/topk.cu -o topk120f.o -std=c++20 -O2 -DNDEBUG -Xcompiler -fPIC -Icsrc \
  -I$TORCH/include -I$TORCH/include/torch/csrc/api/include -I$SITE/nvidia/cu13/include \
  -DTORCH_TARGET_VERSION=0x020B000000000000ULL -DUSE_CUDA -DENABLE_FP8 --expt-relaxed-constexpr \
  -gencode=arch=compute_120f,code=sm_120f -Xptxas -v
# TORCH: the tests environment's torch 2.14.1+cu130 (site-packages/torch), SITE: its site-packages
