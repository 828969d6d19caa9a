"""The boot-log lines the smoke harness reads, each one an anchor like a patch anchor.

Every marker names the literal format string vLLM logs it with and the released sources (0.30.0-0.33.0
sdists) that carry that literal: `tests/test_markers.py` greps each release's real files for it, so an
upstream rewording fails a test here, not a Spark boot. Markers that only the day-0 base build prints
(it predates 0.30.0 and its files cannot be fetched) or that come from outside vLLM (uvicorn, the
quantprobe patch) name the public record instead.

`parse_boot_log` reads every format the base and the supported releases print, one line at a time and
in bounded memory (a boot log is outside input: up to the boot-log limit, each line cut at the log-line
limit). Every pattern is linear in the length of a line: a pattern whose match could start at many places
and run on to the end of the line from each (`A.*B`, `A[^)]*[)]`) is anchored to its first literal
(`^(?>.*?A)`: one start, found once), and a run followed by a literal it cannot contain is possessive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from packaging.version import Version

from patchkit import SUPPORTED_VLLM
from patchkit.untrusted import limit_of
from patchkit.variants.definitions import ProbeRow


@dataclass(frozen=True)
class Marker:
    name: str
    pattern: re.Pattern[str]  # how the harness reads the line (after ANSI colours are stripped)
    literal: str  # the format string as it stands in the source that logs it
    files: tuple[str, ...]  # where that source lives (vllm/... for vLLM, else the package or patch)
    releases: tuple[str, ...]  # the supported releases whose sources carry `literal`
    sample: str  # one line as printed, from a real public log where one exists (tests parse it)
    record: str = ""  # where a marker no release carries is documented


def _m(name, pattern, literal, files, sample, releases=SUPPORTED_VLLM, record=""):
    return Marker(name, re.compile(pattern), literal, tuple(files), tuple(releases), sample, record)


def releases_before(release: str) -> tuple[str, ...]:
    """The supported releases older than `release`: a line `release` stopped printing."""
    return tuple(v for v in SUPPORTED_VLLM if Version(v) < Version(release))


def releases_since(release: str) -> tuple[str, ...]:
    """The supported releases from `release` on, and `release` itself while it is not yet among them (a
    release whose lines are read before the series claims it)."""
    return tuple(sorted({v for v in SUPPORTED_VLLM if Version(v) >= Version(release)} | {release}, key=Version))


# vLLM 0.34.0 removed the V1 GPU model runner (v1/worker/gpu_model_runner.py, VLLM_USE_V2_MODEL_RUNNER): the
# V2 runner's banner and the V1 runner's drafter lines are printed by 0.30.0-0.33.0 only.
_V1_RUNNER_GONE = "0.34.0"


MARKERS: tuple[Marker, ...] = (
    _m("weights", r"Model loading took ([\d.]++) GiB memory and ([\d.]++) seconds",
       "Model loading took %s GiB memory and %.6f seconds",
       ["vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/model_runner.py"],
       "(Worker_TP0 pid=245) INFO 08-28 14:14:27 [gpu_model_runner.py:5089] Model loading took 92.19 GiB memory and 700.214000 seconds"),
    # The day-0 base (0.1.dev20051+g487ecf187) still prints the older wording; no supported release does.
    # Its source cannot be fetched: the literal is read off its public lines (two decimals, V2 runner's
    # model_runner.py); an older vLLM printed the same words with %.4f (gpustack/gpustack#3098).
    _m("weights-day0", r"Model loading took ([\d.]++) GiB and ([\d.]++) seconds",
       "Model loading took %s GiB and %.6f seconds",
       ["vllm/v1/worker/gpu/model_runner.py", "vllm/v1/worker/gpu_model_runner.py"],
       "(Worker_TP0 pid=248) INFO 09-27 18:27:31 [model_runner.py:375] Model loading took 90.36 GiB and 783.173470 seconds",
       releases=(), record="the day-0 base's own boot: tests/data/boot-logs/public/sfxnz-nvidia-dflash2-good-boot.log "
       "(sfxnz/GLM-5.3-Flash-NVFP4-vLLM-2x-DGX-Spark); gpustack/gpustack#3098 shows the same words from an older vLLM"),
    _m("weights-load-time", r"Loading weights took ([\d.]++) seconds", "Loading weights took %.2f seconds",
       ["vllm/model_executor/model_loader/default_loader.py"],
       "(Worker_TP0 pid=245) INFO 08-28 14:14:15 [default_loader.py:507] Loading weights took 688.41 seconds"),
    # The engine banner's load config: which loader read the weights (auto, safetensors, instanttensor, ...).
    _m("load-format", r"\bload_format=(?:LoadFormat\.)?+(\w++)", "load_format={self.load_config.load_format}, ",
       ["vllm/config/vllm.py"],
       "(EngineCore pid=176) INFO 09-27 18:14:14 [core.py:122] Initializing a V1 LLM engine (v0.1.dev20051+g487ecf187) with config: model='m', download_dir=None, load_format=auto, tensor_parallel_size=2"),
    _m("kv-cache", r"GPU KV cache size: ([\d,]++) tokens", "%s KV cache size: %s tokens, ",
       ["vllm/v1/core/kv_cache_utils.py"],
       "(EngineCore pid=1892) INFO 09-01 04:35:41 [kv_cache_utils.py:2570] GPU KV cache size: 1,942,028 tokens, Maximum concurrency for 1,000,000 tokens per request: 1.94x"),
    _m("v2-runner", r"Using V2 Model Runner", "Using V2 Model Runner", ["vllm/v1/worker/gpu_worker.py"],
       "gpu_worker.py:500  Using V2 Model Runner", releases=releases_before(_V1_RUNNER_GONE)),
    _m("architecture", r"Resolved architecture: (\w+)", "Resolved architecture: %s", ["vllm/config/model.py"],
       "(APIServer pid=1) INFO [model.py:679] Resolved architecture: Glm5NextMTPModel"),
    # The engine banner carries SpeculativeConfig.__repr__: f"SpeculativeConfig({method=}, {model=}, {num_spec_tokens=})".
    _m("engine-config", r"^(?>.*?Initializing a V1 LLM engine \(v)([^)]*+)\) with config: ", "Initializing a V1 LLM engine (v%s) with config: %s",
       ["vllm/v1/engine/core.py"],
       "(EngineCore_DP0 pid=212) INFO 08-28 14:02:31 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with config: model='m', speculative_config=SpeculativeConfig(method='mtp', model='m', num_spec_tokens=3), tokenizer='m'"),
    _m("speculative-config", r"SpeculativeConfig\(method='(\w++)', model=(?:'([^']*+)'|None), num_spec_tokens=(\d++)\)",
       'f"SpeculativeConfig({method=}, {model=}, {num_spec_tokens=})"', ["vllm/config/speculative.py"],
       "speculative_config=SpeculativeConfig(method='mtp', model='/data/cache/model_scope/ZhipuAI/GLM-5-FP8', num_spec_tokens=3)"),
    _m("speculative-none", r"speculative_config=None", "speculative_config={self.speculative_config!r}, ",
       ["vllm/config/vllm.py"], "tensor_parallel_size=2, speculative_config=None, tokenizer='m'"),
    # V1 model runner only: the V2 runner (the default since 0.29) prints neither line.
    _m("mtp-v1", r"Detected MTP model", "Detected MTP model. ", ["vllm/v1/spec_decode/llm_base_proposer.py"],
       "(Worker_TP0 pid=245) INFO 08-28 14:14:26 [llm_base_proposer.py:1505] Detected MTP model. Sharing target model embedding weights with the draft model.",
       releases=releases_before(_V1_RUNNER_GONE)),
    _m("drafter-v1", r"Loading drafter model", "Loading drafter model...", ["vllm/v1/worker/gpu_model_runner.py"],
       "(EngineCore pid=7476) INFO 07-25 13:42:16 [gpu_model_runner.py:5233] Loading drafter model...",
       releases=releases_before(_V1_RUNNER_GONE)),
    # V2 runner: printed when the drafter's CUDA graphs are captured (capture_model; an eager boot skips
    # it). The DFlash speculator names itself ("DFlash2"); the MTP and autoregressive ones print fixed words.
    _m("speculator-capture", r"^(?>.*?Capturing model for )(.*?) ?speculator\.\.\.", "Capturing model for %s speculator...",
       ["vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"],
       "(Worker_TP0 pid=248) INFO 09-27 18:28:16 [speculator.py:137] Capturing model for DFlash2 speculator..."),
    _m("spec-metrics", r"^(?>.*?SpecDecoding metrics: Mean acceptance length: )([\d.]++).*?Accepted: (\d++) tokens, Drafted: (\d++) tokens",
       "SpecDecoding metrics: ",
       ["vllm/v1/spec_decode/metrics.py"],
       "(APIServer pid=1) INFO 09-18 09:28:16 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.33, Accepted throughput: 0.13 tokens/s, Drafted throughput: 0.20 tokens/s, Accepted: 4 tokens, Drafted: 6 tokens, Per-position acceptance rate: 0.667, 0.667, Avg Draft acceptance rate: 66.7%"),
    # Printed every logging interval while the engine serves: proof of a running engine in a log excerpt
    # that starts after the boot.
    _m("engine-stats", r"Engine \d++: Avg prompt throughput: ([\d.]++) tokens/s", "Avg prompt throughput: %.1f tokens/s",
       ["vllm/v1/metrics/loggers.py"],
       "(APIServer pid=1) INFO 09-18 09:28:06 [loggers.py:310] Engine 000: Avg prompt throughput: 2354.8 tokens/s, Avg generation throughput: 0.1 tokens/s, Running: 2 reqs, Waiting: 18 reqs, GPU KV cache usage: 1.1%, Prefix cache hit rate: 0.0%"),
    _m("startup", r"Application startup complete", "Application startup complete.", ["uvicorn/lifespan/on.py"],
       "(APIServer pid=1) INFO:     Application startup complete.", releases=(), record="uvicorn, vLLM's ASGI server"),
    # Printed only by images that carry the opt-in `quantprobe` patch (PATCHKIT_QUANTPROBE=1).
    _m("quantprobe", r"\[quantprobe\] layer=(\S++) prefix=(\S++) algo=(\S++)", 'f"[quantprobe] layer={kind} prefix={prefix} algo={algo}"',
       ["patches/quantprobe/report.py.txt"],
       "[quantprobe] layer=RoutedExperts prefix=model.layers.45.mlp.experts algo=MXFP8", releases=(),
       record="the quantprobe patch; public lab READMEs quote this exact line"),
)
MARKER = {m.name: m for m in MARKERS}

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes, stripped before any line is read
# Draft architectures by the method that loads them (vllm/model_executor/models/registry.py names).
_DRAFT_ARCH = (("dflash", re.compile(r"DFlash", re.IGNORECASE)), ("eagle", re.compile(r"Eagle", re.IGNORECASE)), ("mtp", re.compile(r"MTP")))
# A boot's phases in order, each known from the marker that closes the one before; a log's phase is the
# last it reached (what a boot that stops without an error line was doing when it stopped).
PHASES = {
    "startup": "no engine config printed yet",
    "weight loading": "the engine started; no 'Model loading took' line yet",
    "profiling": "weights loaded; no 'GPU KV cache size' line yet",
    "warmup": "KV cache sized; no 'Application startup complete' yet",
    "serving": "'Application startup complete' printed, or the engine's serving statistics",
}


# How many of each repeated observation a verdict keeps: a boot prints a few of each; a hostile or
# days-long log could print millions (the counts and sums stay exact).
KEEP_FIRST = 16  # architectures, spec evidence lines
KEEP_LAST = 1000  # acceptance intervals (the latest kept)
KEEP_PROBES = 10_000  # [quantprobe] rows: one per quantized layer of a boot (a few hundred)


SHOWN = 8192  # characters of a line a verdict carries: vLLM's longest (the engine config dump) is a few KiB


def shown(line: str) -> str:
    """The line as a verdict shows it: a hostile 2 MB line (with the log-line limit raised) cut, and said."""
    return line if len(line) <= SHOWN else f"{line[:SHOWN]}... [{len(line) - SHOWN:,} more characters]"


def _keep_last(values: list, value) -> None:
    values.append(value)
    if len(values) >= 2 * KEEP_LAST:
        del values[:-KEEP_LAST]


@dataclass
class BootMarkers:
    quantprobe: list[ProbeRow] = field(default_factory=list)
    weights_gib: float | None = None
    weights_load_s: float | None = None
    weights_line: str = ""  # which wording it was printed in: "weights" or "weights-day0"
    load_format: str | None = None  # the engine banner's load_format: the loader that read the weights
    kv_cache_tokens: int | None = None
    startup_complete: bool = False
    v2_runner: bool = False
    engine_version: str | None = None  # the engine banner's "(v...)": which vLLM printed the log
    architectures: list[str] = field(default_factory=list)  # every "Resolved architecture", target first
    spec_configured: str | None = None  # SpeculativeConfig(method=...) from the engine banner
    spec_tokens: int | None = None
    spec_evidence: list[str] = field(default_factory=list)  # the lines that show a drafter attached
    speculator_captured: str | None = None  # V2 runner: the speculator whose graphs were captured ("" if unnamed)
    acceptance_lengths: list[float] = field(default_factory=list)  # each SpecDecoding metrics line (the last KEEP_LAST)
    accepted_drafted: list[tuple[int, int]] = field(default_factory=list)  # its Accepted / Drafted tokens (likewise)
    intervals: int = 0  # SpecDecoding metrics lines, all of them
    acceptance_sum: float = 0.0  # the sum of every interval's mean acceptance length
    accepted_total: int = 0
    drafted_total: int = 0
    serving_lines: int = 0  # engine stats and SpecDecoding metrics: printed only by an engine that serves
    lines: int = 0

    @property
    def mean_acceptance_length(self) -> float | None:
        """The last interval's mean acceptance length (vLLM logs one per logging interval)."""
        return self.acceptance_lengths[-1] if self.acceptance_lengths else None

    def overall_acceptance(self, num_spec_tokens: int | None) -> float | None:
        """The mean acceptance length over all intervals, weighted by drafts: 1 + k * accepted / drafted
        (vLLM's per-interval formula, metrics.py, with drafts = drafted tokens / k); the plain mean of the
        intervals' lengths when k is unknown."""
        if not self.intervals:
            return None
        if num_spec_tokens and self.drafted_total:
            return 1 + num_spec_tokens * self.accepted_total / self.drafted_total
        return self.acceptance_sum / self.intervals

    @property
    def draft_architecture(self) -> str | None:
        return self.architectures[1] if len(self.architectures) > 1 else None

    @property
    def phase(self) -> str:
        """The last boot phase the log reached (a key of PHASES)."""
        if self.startup_complete or self.serving_lines:
            return "serving"
        if self.kv_cache_tokens is not None:
            return "warmup"
        if self.weights_gib is not None:
            return "profiling"
        if self.engine_version or self.v2_runner or self.weights_load_s is not None:
            return "weight loading"
        return "startup"

    @property
    def spec_method(self) -> str:
        """Which speculator attached: mtp | dflash | eagle | ngram | none (from what vLLM printed)."""
        if self.spec_configured:
            return self.spec_configured
        for named in (self.draft_architecture or "", self.speculator_captured or ""):
            for method, pattern in _DRAFT_ARCH:
                if pattern.search(named):
                    return method
        if any("Detected MTP model" in line for line in self.spec_evidence):
            return "mtp"
        return "unknown" if self.spec_evidence else "none"


def _spec_method(name: str) -> str:
    # vLLM normalises the per-model MTP methods (deepseek_mtp, glm4_moe_mtp, ...) to "mtp"; the banner
    # may still carry them on older builds.
    for family in ("dflash", "eagle"):  # dflash2, eagle3 ...
        if name.startswith(family):
            return family
    return "mtp" if name.endswith("mtp") else name


def log_lines(log: str | Iterable[tuple[str, bool]]) -> Iterator[tuple[str, bool]]:
    """Each line of a log and whether it was cut: `log` is its text, or (line, cut) pairs as
    patchkit.untrusted.lines streams them from a file. Text is cut at the same log-line limit."""
    if not isinstance(log, str):
        yield from log
        return
    cap = limit_of("log-line")
    for raw in log.splitlines():
        if len(raw) > cap // 4 and len(data := raw.encode("utf-8", "replace")) > cap:
            yield data[:cap].decode("utf-8", "replace"), True
        else:
            yield raw, False


def read_line(m: BootMarkers, line: str) -> None:
    """Take one log line (ANSI colours stripped) into `m`."""
    m.lines += 1
    if (hit := MARKER["quantprobe"].pattern.search(line)) and len(m.quantprobe) < KEEP_PROBES:
        m.quantprobe.append(ProbeRow(*hit.groups()))
    for name in ("weights", "weights-day0"):
        if hit := MARKER[name].pattern.search(line):
            m.weights_gib, m.weights_load_s, m.weights_line = _number(hit.group(1)), _number(hit.group(2)), name
    if (hit := MARKER["weights-load-time"].pattern.search(line)) and m.weights_load_s is None:
        m.weights_load_s = _number(hit.group(1))
    if m.load_format is None and (hit := MARKER["load-format"].pattern.search(line)):
        m.load_format = hit.group(1).lower()
    if hit := MARKER["kv-cache"].pattern.search(line):
        m.kv_cache_tokens = _integer(hit.group(1).replace(",", ""))
    if MARKER["startup"].pattern.search(line):
        m.startup_complete = True
    if MARKER["v2-runner"].pattern.search(line):
        m.v2_runner = True
    if (hit := MARKER["architecture"].pattern.search(line)) and len(m.architectures) < KEEP_FIRST:
        m.architectures.append(hit.group(1))
        if len(m.architectures) > 1:
            _evidence(m, line)
    if hit := MARKER["engine-config"].pattern.search(line):
        m.engine_version = hit.group(1)
    if MARKER["speculative-none"].pattern.search(line):
        m.spec_configured = "none"
    if hit := MARKER["speculative-config"].pattern.search(line):
        m.spec_configured, m.spec_tokens = _spec_method(hit.group(1)), _integer(hit.group(3))
    if MARKER["mtp-v1"].pattern.search(line) or MARKER["drafter-v1"].pattern.search(line):
        _evidence(m, line)
    if hit := MARKER["speculator-capture"].pattern.search(line):
        m.speculator_captured = hit.group(1)
        _evidence(m, line)
    if MARKER["engine-stats"].pattern.search(line):
        m.serving_lines += 1
    if hit := MARKER["spec-metrics"].pattern.search(line):
        m.serving_lines += 1
        length, accepted, drafted = _number(hit.group(1)), _integer(hit.group(2)), _integer(hit.group(3))
        if length is not None and accepted is not None and drafted is not None:
            m.intervals += 1
            m.acceptance_sum += length
            m.accepted_total += accepted
            m.drafted_total += drafted
            _keep_last(m.acceptance_lengths, length)
            _keep_last(m.accepted_drafted, (accepted, drafted))
            _evidence(m, line)


def _evidence(m: BootMarkers, line: str) -> None:
    if len(m.spec_evidence) < KEEP_FIRST:
        m.spec_evidence.append(shown(line.strip()))


def _number(text: str) -> float | None:
    """A logged decimal; None for what only looks like one ("1.2.3", "...", 5,000 digits)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _integer(text: str) -> int | None:
    """A logged count; None past 30 digits (no real count has them, and int() of 5,000 digits refuses)."""
    return int(text) if text and len(text) <= 30 else None


def parse_boot_log(log: str | Iterable[tuple[str, bool]]) -> BootMarkers:
    """Every marker the smoke decides on, in every format the base and the supported releases print."""
    m = BootMarkers()
    for raw, _cut in log_lines(log):
        read_line(m, ANSI.sub("", raw))
    return m
