"""Why a GLM-5.3-Flash boot died: the failure classes seen in the field, each with its fix.

Each cause is recognised by a line the failing boot prints. Where vLLM prints that line, its format
string is an anchor (`literal` + `files`, asserted against the released sources by
tests/test_markers.py); the others come from the driver, PyTorch or the launcher, and name the public
record (docs/field-records.md). The first cause found in a log is the verdict's cause; the receipt
carries it with the line that showed it.

A boot that never came up and printed no line of the table still gets a cause (`unexplained_end`): an
error line nothing here names, a log that just stops (killed from outside: an engine failing inside
vLLM logs a traceback or one of these lines), or, live, an engine still running when it was judged.

A log is read once, line by line (`CauseReader`), in memory bounded whatever its length; every pattern is
linear in a line's length (markers.py says how).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from patchkit import SUPPORTED_VLLM
from patchkit.bootlog.markers import ANSI, PHASES, log_lines, releases_since, shown
from patchkit.patching.fixed_by import fixed_by

# Where a fix names the patches that fix its cause: filled from their patch.toml `fixes` (patching/fixed_by.py).
FIXED_BY = "{fixed_by}"

# What gives a phase that ran out of unified memory its headroom (one wording for every memory kill).
_HEADROOM = ("give that phase headroom on every node: drop the page cache and close other processes, lower "
             "--gpu-memory-utilization or the pinned --kv-cache-memory-bytes, and check what grew in the phase "
             "(JIT compilers: a FLASHINFER_JIT_VERBOSE=1 debug build, docs/field-records.md); a watcher's "
             "MemAvailable floor must sit below what the phase needs")


@dataclass(frozen=True)
class Cause:
    name: str
    pattern: re.Pattern[str]
    sample: str  # a line that shows it, from a public log or record (tests/data/README.md names each)
    what: str  # the cause, in one sentence
    fix: str  # what the owner does about it; FIXED_BY in it: the patches declaring `fixes = [name]`
    literal: str = ""  # vLLM's format string, when vLLM prints the line
    files: tuple[str, ...] = ()  # candidate files holding `literal` across the supported releases
    record: str = ""  # where a line vLLM does not print is documented
    retry_after_s: float | None = None  # a transient: the smoke may retry once after this long
    # False: the line also appears in boots that survive it (allocation probes, allocator retries), so it
    # is the cause only of a boot that never came up.
    definitive: bool = True
    # The releases whose sources carry `literal` (tests/test_markers.py greps each); () with `record`.
    releases: tuple[str, ...] = SUPPORTED_VLLM
    topic: str = "memory"  # the finding a survived non-definitive line becomes (judge.py)

    @property
    def names_patches(self) -> bool:
        return FIXED_BY in self.fix

    def fix_text(self) -> str:
        """`fix` as the owner reads it: FIXED_BY replaced by the ids of the patches that fix this cause."""
        return self.fix.replace(FIXED_BY, fixed_by(self.name)) if self.names_patches else self.fix


def _c(name, pattern, sample, what, fix, literal="", files=(), record="", retry_after_s=None, definitive=True,
       releases=SUPPORTED_VLLM, topic="memory"):
    return Cause(name, re.compile(pattern), sample, what, fix, literal, tuple(files), record, retry_after_s, definitive,
                 tuple(releases), topic)


# Every release from 0.30.0 to 0.34.0 picks FlashKDA for KDA prefill on 12.x by default and imports its
# extension unguarded (models/glm5next/{nvidia,common}/kda.py: _resolve_kda_prefill_backend, `import
# vllm._flashkda_C`); the engine argument that takes the Triton kernel instead (engine/arg_utils.py).
_KDA_TRITON = ("serve with `--kda-prefill-backend triton` (vLLM's engine argument: KDA prefill on the Triton "
               "kernel instead of FlashKDA); then check the wheel's FlashKDA code with `patchkit census "
               "--platform aarch64 --versions 0.34.0` (sm_120f cubins in vllm/_flashkda_C.abi3.so)")
_KDA_FILES = ("vllm/models/glm5next/common/kda.py", "vllm/models/glm5next/nvidia/kda.py")  # 0.31.0 on / 0.30.0
# DeepGEMM's JIT is what the GLM sparse indexer's logits run on (models/glm5next/nvidia/sparse_indexer.py).
_NVCC13 = ("install the CUDA 13 toolkit (nvcc 13.0; DeepGEMM needs 12.9 or newer) where vLLM runs, on the host for "
           "the wheel path or in the image, and point CUDA_HOME at it (vLLM 0.34.0 looks at CUDA_HOME, CUDA_PATH, "
           "the nvcc on PATH, then /usr/local/cuda); `patchkit doctor host --vllm 0.34.0` checks it before a boot")


# Order matters: a specific root cause wins over the generic engine-death lines that follow it.
CAUSES: tuple[Cause, ...] = (
    _c("cluster-occupied", r"cluster has only 1 nodes",
       "serve failed: cluster has only 1 nodes",
       "the launcher found only one free node: the previous serve's nodes were not released yet (occupancy race)",
       "wait ~10 s and start again (the smoke retries once)",
       record="launcher occupancy race after a stop (docs/field-records.md)", retry_after_s=10.0),
    _c("watcher-kill", r"^(?>.*?\bKILL reason=)\S++ MemAvailable [\d.]++ GiB < \w++ floor",
       "2026-09-27T13:39:10.144Z KILL reason=spark1 MemAvailable 7.75 GiB < PROFILE floor 8 GiB",
       "a memory watcher beside the boot killed the containers: a node's MemAvailable fell below the "
       "watcher's floor for that boot phase (the vLLM log itself just stops)",
       _HEADROOM,
       record="the sfxnz GLM-5.3-Flash recipe's watcher kit/uma_watch.py (tests/data/boot-logs/public/"
       "sfxnz-nvidia-killed-boot.watch.log)"),
    _c("startup-free-memory", r"^(?>.*?Free memory on device ).* on startup is less than desired GPU memory utilization",
       "ValueError: Free memory on device cuda:0 (1.54/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
       "free unified memory at startup was below --gpu-memory-utilization x total (page cache, a previous "
       "engine, the driver reserve): the ~54-second boot death",
       "drop the page cache and stop other engines, or lower --gpu-memory-utilization (the recipes use 0.82: "
       "the KV pool is pinned by --kv-cache-memory-bytes, so GMU is only this startup check)",
       literal="is less than desired GPU memory utilization ", files=["vllm/v1/worker/utils.py"]),
    _c("kv-budget", r"To serve at least one request with the model's max seq len",
       "ValueError: To serve at least one request with the model's max seq len (16384), (0.92 GiB KV cache is needed, which is larger than the available KV cache memory (0.89 GiB).",
       "the KV cache left after weights, graphs and activations cannot hold one max-length request",
       "pin the pool with --kv-cache-memory-bytes, lower --max-model-len, or capture fewer CUDA-graph sizes",
       literal="To serve at least one request with the model's max seq len ",
       files=["vllm/v1/core/kv_cache_utils.py", "vllm/v1/core/kv_cache_planning.py"]),
    _c("nv-err-no-memory", r"NV_ERR_NO_MEMORY",
       "NVRM: ... Out of memory [NV_ERR_NO_MEMORY] ... _memdescAllocInternal",
       "the GB10 driver could not allocate unified memory (fastsafetensors staging of ~6.2 GB shards, or "
       "page cache filling memory during the load)",
       "load with --load-format safetensors and drop the page cache before the boot",
       record="driver (NVRM) message; nvidia checkpoint under fastsafetensors (docs/field-records.md)",
       definitive=False),  # a few NVRM allocation probes at boot are harmless (docs/field-records.md)
    _c("cuda-oom", r"CUDA out of memory|OutOfMemoryError",
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
       "PyTorch ran out of device memory",
       "lower --max-num-batched-tokens (1024 on the lab quant) or the pinned KV pool; keep --language-model-only",
       record="PyTorch's allocator message", definitive=False),  # the allocator retries after logging it
    _c("missing-weight-scale", r"^(?>.*?KeyError: ).*weight_scale",
       "KeyError: model.layers.45.mtp_block.mlp.experts.routed_experts.w2_weight_scale",
       "a quantized tensor's scale has no parameter to load into: a fused module without its packed-modules "
       "mapping, or a draft (MTP) layer resolved to no quantized method",
       f"use the image that carries the variant's patches ({FIXED_BY}) and check `patchkit preflight` on the "
       "checkpoint",
       record="Python KeyError from the weight loader (docs/field-records.md)"),
    # The same family seen from the other side: the parameter exists, no checkpoint tensor ever reached it.
    _c("weight-scale-never-loaded", r"^(?>.*?weight_scale for layer ')[^']*+' was never loaded",
       "RuntimeError: NVFP4 weight_scale for layer 'parallel_lm_head' was never loaded (still NaN)",
       "a layer was built NVFP4 but no checkpoint scale was loaded into it (vLLM's NaN sentinel, PR #52501): "
       "the quant config quantizes a layer the checkpoint stores unquantized or names differently. "
       "'parallel_lm_head' is the GLM MTP draft's own head, built under the checkpoint's NVFP4 config and "
       "replaced by the target's head only after loading (vLLM issue #57532)",
       "parallel_lm_head: serve the MTP draft on a vLLM that defers that head (0.31.0-0.33.0 build it with "
       "SharedHead(defer_lm_head=True); 0.30.0 builds it quantized; PR #55442 for main), or keep the "
       "draft's layer out of quantization (nvidia-nvfp4's --hf-overrides ignores all of layer 45). Another "
       f"layer: add it to the quant config's ignore list, or give it its packed mapping ({FIXED_BY}) "
       "or its quant-config key, and check `patchkit preflight` on the checkpoint",
       literal=" was never loaded ", files=["vllm/model_executor/layers/quantization/modelopt.py"]),
    # FlashKDA's extension cannot be imported: not built into this wheel (`No module named`), or its shared
    # object does not load (the loader's `<path>/_flashkda_C.abi3.so: <reason>`: a missing CUDA library, an
    # ABI mismatch). A traceback through the unguarded import shows its source line first.
    _c("flashkda-import",
       r"import vllm\._flashkda_C\b|No module named 'vllm\._flashkda_C'|_flashkda_C\.abi3\.so: ",
       "(EngineCore_DP0 pid=212) ERROR 12-04 10:00:00 [core.py:1584] ModuleNotFoundError: No module named 'vllm._flashkda_C'",
       "vLLM chose FlashKDA for KDA prefill (its default on compute capability 9.x, 10.x and 12.x) and its "
       "extension vllm._flashkda_C failed to import; the import has no fallback to the Triton kernel",
       _KDA_TRITON, literal="import vllm._flashkda_C", files=_KDA_FILES, releases=releases_since("0.30.0")),
    # FlashKDA imported but its ops failed: the workspace query at layer construction or the prefill launch
    # (the traceback's source line in kda.py), or a library that registered no ops (torch's _OpNamespace).
    _c("flashkda-launch",
       r"torch\.ops\._flashkda_C\.(?:fwd|get_workspace_size)\(|'_OpNamespace' '_flashkda_C' object has no attribute",
       "(EngineCore_DP0 pid=212) ERROR 12-04 10:00:00 [core.py:1584]     torch.ops._flashkda_C.fwd(",
       "a FlashKDA op raised (vLLM's default KDA prefill on 12.x): its kernel launch or workspace query failed, "
       "e.g. no code for this GPU in vllm/_flashkda_C.abi3.so, or (0.34.0) the row-strided q/k/v it is now given",
       _KDA_TRITON, literal="torch.ops._flashkda_C.fwd(", files=_KDA_FILES, releases=releases_since("0.30.0")),
    # Logged once when DeepGEMM is switched off for want of nvcc; the GLM sparse indexer still calls it, so on
    # this model the boot fails later (or a surviving boot runs without DeepGEMM).
    _c("deep-gemm-disabled", r"DeepGEMM kernels are disabled: ",
       "(EngineCore_DP0 pid=212) WARNING 12-04 10:00:00 [deep_gemm.py:160] DeepGEMM kernels are disabled: DeepGEMM "
       "JIT-compiles its kernels with nvcc, which is missing (CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda). Set "
       "CUDA_HOME to a CUDA toolkit to enable them.",
       "vLLM 0.34.0 disabled DeepGEMM because nvcc is missing or older than 12.9 (only a warning), while the GLM "
       "sparse indexer's logits kernels are DeepGEMM's and are JIT-compiled with nvcc",
       _NVCC13, literal="DeepGEMM kernels are disabled: ", files=["vllm/utils/deep_gemm.py"],
       releases=releases_since("0.34.0"), definitive=False, topic="deep gemm"),
    _c("worker-died", r"Worker proc \S++ died unexpectedly",
       "Worker proc VllmWorker-0 died unexpectedly (exit code: None)",
       "a worker process died without a Python traceback (on GB10 usually the CUDA context killed by an "
       "unified-memory allocation failure during warmup)",
       "read the kernel log (journalctl -k) for NVRM errors; lower --max-num-batched-tokens or the KV pin, "
       "keep --language-model-only",
       literal="Worker proc %s died unexpectedly (exit code: %s), ", files=["vllm/v1/executor/multiproc_executor.py"]),
    _c("engine-failed", r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start",
       "(EngineCore_DP0 pid=212) ERROR 08-28 14:14:30 [core.py:1584] EngineCore failed to start.",
       "the engine core failed to start (the lines above it hold the root cause)",
       "read the first exception above this line",
       literal="EngineCore failed to start.", files=["vllm/v1/engine/core.py"]),
)
CAUSE = {c.name: c for c in CAUSES}

# "KeyError: ..." after any log prefix (vLLM's logger.exception prefixes every traceback line).
_EXCEPTION = re.compile(r"(?:^|[\s\])])([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$")


@dataclass(frozen=True)
class Found:
    cause: str
    line: str  # the log line that showed it, ANSI colours stripped
    line_no: int  # 1-based
    definitive: bool
    what: str
    fix: str
    retry_after_s: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def find_causes(log: str | Iterable[tuple[str, bool]]) -> list[Found]:
    """Every cause the log shows, first occurrence of each, ordered by the table (specific first)."""
    return CauseReader().read(log).causes()


# An error line no cause names: a traceback, or a record logged at ERROR level (vLLM's and uvicorn's).
_ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|(?:^|[\s)\]])ERROR[\s:]")
PROCESS_STATES = ("recorded", "exited", "running")


class CauseReader:
    """What the causes need from a log, taken one line at a time: the first line of each cause, the first
    error line, the last non-empty line and the distinct exception lines (the first KEEP_EXCEPTIONS)."""

    KEEP_EXCEPTIONS = 100

    def __init__(self) -> None:
        self.first: dict[str, tuple[int, str]] = {}
        self.first_error: tuple[int, str] | None = None
        self.last: tuple[int, str] = (0, "")
        self.exceptions: dict[str, None] = {}
        self.more_exceptions = 0  # distinct exception lines past the kept ones (not deduplicated)

    def feed(self, n: int, line: str) -> None:
        """Line `n` (1-based), ANSI colours stripped."""
        hit = _EXCEPTION.search(line)
        if hit:
            text = f"{hit.group(1)}: {hit.group(2)}".strip()
            if text in self.exceptions:
                pass
            elif len(self.exceptions) < self.KEEP_EXCEPTIONS:
                self.exceptions[text] = None
            else:
                self.more_exceptions += 1
        line = line.strip()
        if not line:
            return
        self.last = (n, line)
        for cause in CAUSES:
            if cause.name not in self.first and cause.pattern.search(line):
                self.first[cause.name] = (n, line)
        if self.first_error is None and (hit or _ERROR_LINE.search(line)):
            self.first_error = (n, line)

    def read(self, log: str | Iterable[tuple[str, bool]]) -> CauseReader:
        for n, (raw, _cut) in enumerate(log_lines(log), 1):
            self.feed(n, ANSI.sub("", raw))
        return self

    def causes(self) -> list[Found]:
        return [Found(c.name, shown(self.first[c.name][1]), self.first[c.name][0], c.definitive, c.what,
                      c.fix_text(), c.retry_after_s) for c in CAUSES if c.name in self.first]

    def unexplained_end(self, phase: str, process: str = "recorded") -> Found:
        """The cause of a boot that never came up although no line of the table shows why.

        `phase`: how far the boot got (a key of markers.PHASES). `process`: what is known besides the log:
        "recorded" (a log on its own, `patchkit doctor`), "exited" or "running" (the live smoke sees the
        containers). An error line nothing here names is the cause; otherwise the log just stops, with the
        engine still running (not finished when judged) or gone without a word (killed from outside)."""
        if process not in PROCESS_STATES:
            raise ValueError(f"process must be one of {PROCESS_STATES}, got {process!r}")
        where = f"the log stops in the {phase} phase ({PHASES[phase]})"
        if self.first_error is not None:
            n, line = self.first_error
            return Found("unrecognised-error", shown(line), n, True,
                         f"the boot logged an error in the {phase} phase that no cause in the table names",
                         "read the traceback around this line (the first error is usually the root cause); once "
                         "understood, add it to the cause table (bootlog/causes.py) with its fix", None)
        n, last = self.last[0], shown(self.last[1])
        if process == "running":
            return Found("still-booting", last, n, True,
                         f"{where} while the engine process still runs: the boot had not finished when it was judged "
                         "(a slow phase, or a hang at this last line)",
                         "wait, or raise [expect] boot_timeout_s if the phase is only slow (a ~700-800 s weight load, "
                         "FlashInfer autotune up to an hour: docs/field-records.md); a hang keeps this last line", None)
        how = ("the container exited" if process == "exited"
               else "a log captured while the boot still ran is judged with --cut-short")
        return Found("ended-without-error", last, n, True,
                     f"killed from outside during {phase}: {where} with no error line (a memory watcher, the kernel "
                     f"OOM killer, a docker kill or stop: an engine failing inside vLLM logs why); {how}",
                     f"find what stopped it (the watcher's own log, journalctl -k for the OOM killer); if memory: {_HEADROOM}",
                     None)


def unexplained_end(log: str | Iterable[tuple[str, bool]], phase: str, process: str = "recorded") -> Found:
    """CauseReader.unexplained_end of a whole log."""
    return CauseReader().read(log).unexplained_end(phase, process)


def exceptions(log: str | Iterable[tuple[str, bool]]) -> list[str]:
    """The `SomeError: message` lines, deduplicated in order (the first is usually the root cause)."""
    return list(CauseReader().read(log).exceptions)
