"""vLLM 0.33.0's persistent top-k on an H200 (sm_90) with GB10's shared-memory budget, against torch.topk.

NOT RUN YET: written in a session that had no GPU (the device machine was not lent to it); nothing below
has produced a result. It needs, on the GPU host, a Python with a CUDA build of torch and CUDA 13's nvcc
(no network there: nothing is installed). Two steps:

    python tests/gpu/persistent_topk_h200.py prepare build/gpu   # here: 0.33.0's csrc from patchkit's cache
    python tests/gpu/persistent_topk_h200.py run build/gpu       # there, with `build/gpu` carried (6.6 MiB)

(`build` alone compiles and loads the extension without a GPU: done here with the tests environment's torch
2.14.1+cu130 and CUDA_HOME=/usr/local/cuda-13.0, ~9 min on 2 loaded cores; set CUDA_HOME there too.)

`prepare` lays out the release sdist's csrc/ through patchkit's own source reader (the sdist downloaded and
sha256-checked by patchkit's cache) and writes the one change: topk.cu's `max_smem_per_block =
device_prop->sharedMemPerBlockOptin;` capped at GB10's 101,376 B, so the host planning takes GB10's branch
(no FilteredTopK / sampled top-k, chunks sized to 101,376 B, the per-row fallback when the cooperative grid
would not be resident). The H200's 132 SMs are not capped to GB10's 48. `run` builds topk.cu and sampler.cu
(top_k_per_row_decode, the fallback) for sm_90 with vLLM's flags into a torch extension, then on GLM-5.3's
shapes (k = 2048 // 4 = 512 the kpool indexer asks for, and 2048; rows of 32,768 and 131,072: the short and
the cooperative radix path; 1, 8, 32 rows as decode, 1,024 as prefill) checks the selected indices against
torch.topk's (same set per row; random logits, so no ties) and prints both times (median of 20 CUDA-event
timed calls). Exit 1 on any mismatch.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

CAP = 101_376
LINE = "max_smem_per_block = device_prop->sharedMemPerBlockOptin;"
BINDING = """#include <torch/csrc/stable/library.h>
#include "ops.h"
STABLE_TORCH_LIBRARY(patchkit_topk, m) {
  m.def("persistent_topk(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace, int k, int max_seq_len) -> ()");
}
STABLE_TORCH_LIBRARY_IMPL(patchkit_topk, CUDA, m) { m.impl("persistent_topk", TORCH_BOX(&persistent_topk)); }
"""
FLAGS = ["-std=c++20", "-O2", "-DNDEBUG", "--expt-relaxed-constexpr", "-DENABLE_FP8", "-DUSE_CUDA",
         "-DTORCH_TARGET_VERSION=0x020B000000000000ULL", "-gencode=arch=compute_90,code=sm_90"]


def prepare(out: Path) -> None:
    from patchkit.census.jit_census import materialise
    from patchkit.sources.cache import ArchiveCache
    from patchkit.sources.release import open_release

    cache = ArchiveCache()
    open_release("vllm", "0.33.0", cache=cache, progress=False)
    csrc = materialise(cache.lookup("vllm", "0.33.0").path, ("csrc/",), out / "src") / "csrc"
    topk = (csrc / "topk.cu").read_text()
    assert topk.count(LINE) == 1, "0.33.0's topk.cu no longer reads the opt-in in one line"
    capped = f"max_smem_per_block = std::min(static_cast<int>(device_prop->sharedMemPerBlockOptin), {CAP});"
    (csrc / "topk_gb10_budget.cu").write_text(topk.replace(LINE, capped))
    (csrc / "patchkit_binding.cpp").write_text(BINDING)
    print(csrc)


def build(out: Path):
    """The extension built (and loaded) with torch's cpp_extension; needs nvcc and torch, not a GPU."""
    import torch
    from torch.utils.cpp_extension import load

    csrc = out / "src" / "vllm-0.33.0" / "csrc"
    site = Path(torch.__file__).parent.parent  # torch's CUDA wheel brings cublas_v2.h (torch_utils.h includes it)
    wheel_headers = [str(d) for d in site.glob("nvidia/cu[0-9]*/include")]
    load("patchkit_persistent_topk", [str(csrc / n) for n in ("topk_gb10_budget.cu", "sampler.cu", "patchkit_binding.cpp")],
         extra_include_paths=[str(csrc), *wheel_headers], extra_cuda_cflags=FLAGS, extra_cflags=["-std=c++20", "-DUSE_CUDA",
         "-DTORCH_TARGET_VERSION=0x020B000000000000ULL"], build_directory=str(out), is_python_module=False, verbose=True)
    return torch.ops.patchkit_topk.persistent_topk


def run(out: Path) -> int:
    import torch

    op = build(out)
    print(torch.cuda.get_device_name(), "opt-in", torch.cuda.get_device_properties(0).shared_memory_per_block_optin)
    failures = 0
    for k in (512, 2048):
        for length in (32_768, 131_072):
            for rows in (1, 8, 32, 1024):
                logits = torch.randn(rows, length, device="cuda")
                lengths = torch.full((rows,), length, dtype=torch.int32, device="cuda")
                output = torch.empty(rows, k, dtype=torch.int32, device="cuda")
                workspace = torch.zeros(8 << 20, dtype=torch.uint8, device="cuda")
                ours = _time(functools.partial(op, logits, lengths, output, workspace, k, length))
                theirs = _time(functools.partial(torch.topk, logits, k, dim=1))
                same = torch.equal(output.sort(dim=1).values.long(), torch.topk(logits, k, dim=1).indices.sort(dim=1).values)
                failures += not same
                print(f"k={k} length={length} rows={rows}: {'same indices' if same else 'DIFFERENT indices'}; "
                      f"persistent_topk {ours * 1e3:.1f} us, torch.topk {theirs * 1e3:.1f} us")
    return 1 if failures else 0


def _time(call) -> float:
    """Median milliseconds of 20 calls, after 3 warm-up calls."""
    import torch

    for _ in range(3):
        call()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "build", "run"):
        sys.exit(f"usage: {sys.argv[0]} prepare|build|run DIR")
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    elif sys.argv[1] == "build":
        print(build(Path(sys.argv[2])))
    else:
        sys.exit(run(Path(sys.argv[2])))
