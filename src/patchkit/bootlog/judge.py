"""One judgement of a boot log, shared by the live smoke and `patchkit doctor`.

Findings are `fail` (the boot is not good), `warn` (unconfirmed or off the reference) or `ok`. A dead
engine's finding names its cause from the fatal-cause table with the line that showed it; a boot that
never came up without such a line gets the cause `unexplained_end` gives it (killed from outside, an
unknown error, or still running), with the phase it reached.

A log is judged in one pass over its lines (`judge_log` takes its text or the (line, cut) pairs
patchkit.untrusted.lines streams from a file or stdin), in memory bounded whatever its length. A line
longer than the log-line limit is judged on its first limit's worth of bytes, and the verdict says which
lines were cut.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field

from patchkit.bootlog.causes import CAUSE, CauseReader, Found
from patchkit.bootlog.markers import ANSI, KEEP_FIRST, BootMarkers, log_lines, read_line
from patchkit.untrusted import limit_of
from patchkit.variants.definitions import Variant

# A mean acceptance length this close to 1 means the target rejects (almost) every drafted token.
_REJECTS_ALL = 1.05
# Below this an MTP draft gains less than one token in two drafts: GLM-5.3's MTP head, loaded, accepts 2.3-3.5
# on the public Spark boots (docs/field-records.md); one with its weights missing drafts noise.
_SILENT_DRAFT = 1.5
# vLLM 0.34.0 dropped the MTP loader's check that every draft layer's weights were in the checkpoint
# (models/glm5next/common/mtp.py; 0.30-0.33 raised "MTP speculative decoding layer N weights missing from
# checkpoint."): a draft that loaded nothing boots without a word and shows only in its drafts.
SILENT_MTP = ("a silent MTP draft load: vLLM 0.34.0's MTP loader no longer reports a draft layer whose weights were "
              "not loaded (models/glm5next/common/mtp.py dropped 'weights missing from checkpoint'), so the draft "
              "runs on uninitialised weights; check the checkpoint's MTP tensors with `patchkit preflight CHECKPOINT "
              "--variant V` and the draft's names (modelopt-mtp-namespace)")
# The MTP draft's modules: built with prefix "" (models/glm5next/common/mtp.py), so its quantprobe rows are
# `model.layers.N...`, the target's `language_model.model.layers.N...`.
_DRAFT_PREFIX = "model.layers."
# A weight load slower than this is the HF-cache safetensors path at its usual GB10 speed (700-780 s for
# ~90 GiB per rank in the public boots), where instanttensor reads the same checkpoint in tens of seconds
# (a public Spark record: 164 GB in 37.2 s against ~507 s; docs/field-records.md, shared field notes).
SLOW_LOAD_S = 120.0
FAST_LOADER = "instanttensor"


@dataclass(frozen=True)
class Finding:
    level: str  # fail | warn | ok
    what: str
    detail: str


@dataclass
class Verdict:
    markers: BootMarkers
    causes: list[Found]
    exceptions: list[str]
    findings: list[Finding]
    cut_lines: list[int] = field(default_factory=list)  # 1-based numbers of the lines cut (the first KEEP_FIRST)
    cut_count: int = 0  # every line cut at the log-line limit

    @property
    def ok(self) -> bool:
        return not any(f.level == "fail" for f in self.findings)

    @property
    def cause(self) -> Found | None:
        return self.causes[0] if self.causes else None

    def to_dict(self) -> dict:
        m = self.markers
        return {
            "ok": self.ok,
            "cause": self.cause.to_dict() if self.cause else None,
            "causes": [c.to_dict() for c in self.causes],
            "exceptions": self.exceptions,
            "phase": m.phase,
            "speculative": {"method": m.spec_method, "draft_architecture": m.draft_architecture,
                            "num_spec_tokens": m.spec_tokens, "acceptance_lengths": m.acceptance_lengths,
                            "acceptance": m.overall_acceptance(m.spec_tokens)},
            "markers": asdict(m),
            "findings": [asdict(f) for f in self.findings],
            "cut_lines": {"count": self.cut_count, "first": self.cut_lines, "limit_bytes": limit_of("log-line")},
        }


def judge_log(log: str | Iterable[tuple[str, bool]], variant: Variant | None, quantprobe: bool | None = None, *,
              booted: bool = True, process: str = "recorded", extras: Collection[str] | None = None) -> Verdict:
    """Parse and judge a boot log. `quantprobe`: does the image carry the quantprobe patch (None = unknown).
    `extras`: the extra wheels the image carries (None = unknown), for the advice on a slow weight load.

    `booted=False` judges a log cut short on purpose (a live smoke stopped before startup): no startup,
    KV or end-of-log verdict. Otherwise a log without 'Application startup complete' is a boot that did
    not come up. `process` is what is known of the engine besides its log: "recorded" (`patchkit doctor`:
    the log alone, so a log that just stops is taken as ended), "exited" or "running" (the live smoke
    asks the containers), which tells a killed boot from one still in progress."""
    markers, reader, cut_count = BootMarkers(), CauseReader(), 0
    cut: list[int] = []  # the first cut lines' numbers
    for n, (raw, was_cut) in enumerate(log_lines(log), 1):
        line = ANSI.sub("", raw)
        read_line(markers, line)
        reader.feed(n, line)
        if was_cut:
            cut_count += 1
            if len(cut) < KEEP_FIRST:
                cut.append(n)
    seen = reader.causes()
    # A boot that came up survived the lines that are fatal only to a boot that never did.
    causes = [c for c in seen if c.definitive] if markers.startup_complete else seen
    excs = list(reader.exceptions)
    if booted and markers.phase != "serving" and not causes:
        causes = [reader.unexplained_end(markers.phase, process)]
    findings = judge_boot(markers, causes, excs, variant, quantprobe, booted=booted) + _load_time(markers, extras)
    findings += [Finding("warn", CAUSE[c.cause].topic, f"{c.cause} seen (line {c.line_no}: {c.line}) but the boot "
                         f"survived it; {c.what}; fix: {c.fix}" if CAUSE[c.cause].topic != "memory" else
                         f"{c.cause} seen (line {c.line_no}: {c.line}) but the boot survived it")
                 for c in seen if c not in causes]
    if cut_count:
        limit = limit_of("log-line")
        findings.append(Finding("warn", "log lines", f"{cut_count} line(s) longer than the {limit:,} B log-line limit "
                                f"were judged on their first {limit:,} B (lines {', '.join(map(str, cut))}"
                                f"{', ...' if cut_count > len(cut) else ''}); PATCHKIT_LIMIT_LOG_LINE raises it"))
    return Verdict(markers, causes, excs, findings, cut, cut_count)


def _engine(causes: list[Found], excs: list[str]) -> list[Finding]:
    if not causes:
        return []
    first = causes[0]
    detail = f"{first.cause}: {first.what} (line {first.line_no}: {first.line}); fix: {first.fix}"
    if excs and first.cause in ("engine-failed", "worker-died"):
        detail += f"; first exception: {excs[0]}"
    return [Finding("fail", "engine", detail)]


def _quantprobe(markers: BootMarkers, variant: Variant, quantprobe: bool | None) -> list[Finding]:
    rows = variant.expect.quantprobe
    if not rows:
        return []
    if not markers.quantprobe:
        if quantprobe:
            return [Finding("fail", "quantprobe", "the image carries the quantprobe patch but printed no [quantprobe] "
                            "line: was PATCHKIT_QUANTPROBE=1 set in the container?")]
        why = ("the image does not carry the quantprobe patch" if quantprobe is False
               else "no [quantprobe] lines (an image without the quantprobe patch, or PATCHKIT_QUANTPROBE unset)")
        return [Finding("warn", "quantprobe", f"{why}: the {len(rows)} per-layer algorithms were not checked from the log")]
    seen = {row.prefix: row for row in markers.quantprobe}
    out = []
    for row in rows:
        got = seen.get(row.prefix)
        if got is None and row.prefix.startswith(_DRAFT_PREFIX) and markers.spec_method == "mtp":
            out.append(Finding("fail", "quantprobe", f"{row.prefix}: no quantprobe line for this MTP draft layer while "
                               f"the other layers printed theirs: the draft's layers were not built under the names "
                               f"its checkpoint loads into; {SILENT_MTP}"))
        elif got is None:
            out.append(Finding("warn", "quantprobe", f"{row.prefix}: no quantprobe line for this prefix"))
        elif (got.layer, got.algo) != (row.layer, row.algo):
            broken = " (broken load: the layer got no quantized method)" if got.algo == "None" else ""
            out.append(Finding("fail", "quantprobe", f"{row.prefix}: {got.layer} algo={got.algo}, expected {row.layer} algo={row.algo}{broken}"))
        else:
            out.append(Finding("ok", "quantprobe", f"{row.prefix}: algo={got.algo}"))
    return out


def _speculative(markers: BootMarkers, variant: Variant | None) -> list[Finding]:
    got = markers.spec_method
    shown = f" ({markers.draft_architecture})" if markers.draft_architecture else ""
    attached = f"{got}{shown} attached, {markers.spec_tokens or '?'} tokens"
    if variant is None:  # what attached and how well it drafts, nothing to compare with
        if got == "none":  # said by the banner, or nothing shown either way (a log without its start)
            return [Finding("ok", "speculative", "no speculator (speculative_config=None)")] if markers.spec_configured else []
        if got == "unknown":
            attached = "a speculator drafts (SpecDecoding metrics) but the log does not show which"
        return [Finding("ok", "speculative", attached)] + _acceptance(markers, markers.spec_tokens, None)
    spec = variant.serve.speculative
    want = spec.method if spec else "none"
    if got != want:
        if got == "none" and not markers.spec_configured:
            detail = f"expected {want}; the log shows no speculator (no SpeculativeConfig in the engine banner, no draft architecture)"
            return [Finding("fail" if markers.startup_complete else "warn", "speculative", detail)]
        return [Finding("fail", "speculative", f"{got}{shown} attached; the variant expects {want}")]
    if want == "none":
        return [Finding("ok", "speculative", "no speculator, as the variant expects")]
    out = [Finding("ok", "speculative", attached)]
    if spec and markers.spec_tokens is not None and markers.spec_tokens != spec.num_speculative_tokens:
        out.append(Finding("fail", "speculative", f"{markers.spec_tokens} speculative tokens; the variant serves {spec.num_speculative_tokens}"))
    k = markers.spec_tokens or (spec.num_speculative_tokens if spec else None)
    return out + _acceptance(markers, k, variant.expect.accept_length)


def _acceptance(markers: BootMarkers, k: int | None, band: tuple[float, float] | None) -> list[Finding]:
    """The mean acceptance length over every SpecDecoding interval (k: tokens per draft), against `band`. An
    MTP draft far below any loaded one fails as a silent draft load (vLLM 0.34.0 no longer refuses one)."""
    mean = markers.overall_acceptance(k)
    if mean is None:  # no interval yet
        return [Finding("warn", "acceptance", "no SpecDecoding metrics line yet (vLLM logs one per interval under traffic)")]
    mtp = markers.spec_method == "mtp"
    if mtp and mean < _SILENT_DRAFT:
        return [Finding("fail", "acceptance", f"mean acceptance length {mean:.2f} over {markers.intervals} intervals "
                        f"({markers.accepted_total} of {markers.drafted_total} drafted tokens accepted), below "
                        f"{_SILENT_DRAFT} for an MTP draft: {SILENT_MTP}")]
    if mean <= _REJECTS_ALL:
        return [Finding("fail", "acceptance", f"mean acceptance length {mean:.2f}: the target rejects the drafts (a broken drafter)")]
    if band and not band[0] <= mean <= band[1]:
        return [Finding("warn", "acceptance", f"mean acceptance length {mean:.2f} over {markers.intervals} intervals; the reference boot gave {band[0]}-{band[1]}")]
    return [Finding("ok", "acceptance", f"mean acceptance length {mean:.2f} over {markers.intervals} intervals")]


def judge_spec_counters(counts, method: str | None) -> list[Finding]:
    """The smoke's reading of vLLM's /metrics speculative counters (smoke/spec_metrics.py: a SpecCounts, None
    when the server exposes none, or why they could not be read) for a variant serving `method`."""
    if not method:
        return []
    if isinstance(counts, str) or counts is None:
        said = counts or "the server exposes no vllm:spec_decode counters"
        return [Finding("warn", "acceptance (metrics)", f"{said}: the draft's acceptance was not read from /metrics")]
    mean = counts.mean_acceptance_length
    tally = f"{counts.accepted} of {counts.draft_tokens} drafted tokens accepted over {counts.drafts} drafts (/metrics)"
    if mean is None:
        return [Finding("fail", "acceptance (metrics)", f"the {method} speculator made no draft although the smoke's "
                        f"requests were answered ({tally})" + (f": {SILENT_MTP}" if method == "mtp" else ""))]
    if method == "mtp" and mean < _SILENT_DRAFT:
        return [Finding("fail", "acceptance (metrics)", f"mean acceptance length {mean:.2f}, {tally}, below "
                        f"{_SILENT_DRAFT} for an MTP draft: {SILENT_MTP}")]
    if mean <= _REJECTS_ALL:
        return [Finding("fail", "acceptance (metrics)", f"mean acceptance length {mean:.2f}, {tally}: the target "
                        "rejects the drafts (a broken drafter)")]
    return [Finding("ok", "acceptance (metrics)", f"mean acceptance length {mean:.2f}, {tally}")]


def judge_boot(markers: BootMarkers, causes: list[Found], excs: list[str], variant: Variant | None,
               quantprobe: bool | None = None, *, booted: bool = True) -> list[Finding]:
    """What the boot proves; any `fail` fails the smoke. Without a variant only the generic checks run."""
    out = _engine(causes, excs)
    # An excerpt that starts after the boot: the engine's serving statistics show it came up.
    excerpt = not markers.startup_complete and markers.serving_lines > 0
    if excerpt:
        out.append(Finding("warn", "startup", f"not in this log, which starts after the boot: the engine was serving "
                           f"({markers.serving_lines} engine statistics lines)"))
    elif booted:
        out.append(Finding("ok", "startup", "Application startup complete") if markers.startup_complete
                   else Finding("fail", "startup", "no 'Application startup complete' in the log"))
    if markers.kv_cache_tokens is None:
        out.append(Finding("fail" if booted and not excerpt else "warn", "kv cache",
                           "no 'GPU KV cache size' line: the engine never sized its KV pool" if not excerpt
                           else "no 'GPU KV cache size' line: not in this excerpt"))
    elif variant and variant.expect.kv_cache_tokens is not None and markers.kv_cache_tokens != variant.expect.kv_cache_tokens:
        out.append(Finding("warn", "kv cache", f"{markers.kv_cache_tokens:,} tokens; the pinned pool gave {variant.expect.kv_cache_tokens:,} on the reference boot"))
    else:
        out.append(Finding("ok", "kv cache", f"{markers.kv_cache_tokens:,} tokens"))
    expected_gib = variant.expect.weights_gib_per_rank if variant else None
    if markers.weights_gib is None:
        out.append(Finding("warn", "weights", "no 'Model loading took' line"))
    elif expected_gib and abs(markers.weights_gib - expected_gib) > 0.05 * expected_gib:
        out.append(Finding("warn", "weights", f"{markers.weights_gib} GiB per rank; {expected_gib} GiB expected"))
    else:
        out.append(Finding("ok", "weights", f"{markers.weights_gib} GiB in {markers.weights_load_s} s"))
    if variant is not None:
        out += _quantprobe(markers, variant, quantprobe)
    return out + _speculative(markers, variant)


def _load_time(markers: BootMarkers, extras: Collection[str] | None) -> list[Finding]:
    """A slow weight load, with the loader that would fix it when the image has it (vLLM 0.30-0.33 take
    `--load-format instanttensor` once the package is installed: weight_utils.instanttensor_weights_iterator)."""
    took, loader = markers.weights_load_s, markers.load_format or "unknown"
    if took is None or took <= SLOW_LOAD_S or loader == FAST_LOADER:
        return []
    if extras is not None and FAST_LOADER in extras:
        fix = (f"this image carries {FAST_LOADER}: serve with --load-format {FAST_LOADER} "
               f"(patchkit serve-args VARIANT --load-format {FAST_LOADER})")
    elif extras is not None:
        fix = f"this image does not carry {FAST_LOADER}; the lab and 4p67 images pin it ([wheels] in image.toml)"
    else:
        fix = f"an image carrying {FAST_LOADER} loads it with --load-format {FAST_LOADER} (name --variant to know)"
    return [Finding("warn", "weight load", f"{took:.0f} s with load_format={loader} (over {SLOW_LOAD_S:.0f} s); {fix}")]

