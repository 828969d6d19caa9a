"""One judgement of a boot log, shared by the live smoke and `patchkit doctor`.

Findings are `fail` (the boot is not good), `warn` (unconfirmed or off the reference) or `ok`. A dead
engine's finding names its cause from the fatal-cause table with the line that showed it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from patchkit.variants.definitions import Variant
from patchkit.variants.smoke.causes import Found, exceptions, find_causes
from patchkit.variants.smoke.markers import BootMarkers, parse_boot_log

# A mean acceptance length this close to 1 means the target rejects (almost) every drafted token.
_REJECTS_ALL = 1.05


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
            "speculative": {"method": m.spec_method, "draft_architecture": m.draft_architecture,
                            "num_spec_tokens": m.spec_tokens, "acceptance_lengths": m.acceptance_lengths,
                            "acceptance": m.overall_acceptance(m.spec_tokens)},
            "markers": asdict(m),
            "findings": [asdict(f) for f in self.findings],
        }


def judge_log(text: str, variant: Variant | None, quantprobe: bool | None = None, *, booted: bool = True) -> Verdict:
    """Parse and judge a boot log. `quantprobe`: does the image carry the quantprobe patch (None = unknown).

    `booted=False` judges a log cut short on purpose (a live smoke stopped before startup)."""
    markers = parse_boot_log(text)
    seen = find_causes(text)
    # A boot that came up survived the lines that are fatal only to a boot that never did.
    causes = [c for c in seen if c.definitive] if markers.startup_complete else seen
    excs = exceptions(text)
    findings = judge_boot(markers, causes, excs, variant, quantprobe, booted=booted)
    findings += [Finding("warn", "memory", f"{c.cause} seen (line {c.line_no}: {c.line}) but the boot survived it")
                 for c in seen if c not in causes]
    return Verdict(markers, causes, excs, findings)


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
        if got is None:
            out.append(Finding("warn", "quantprobe", f"{row.prefix}: no quantprobe line for this prefix"))
        elif (got.layer, got.algo) != (row.layer, row.algo):
            broken = " (broken load: the layer got no quantized method)" if got.algo == "None" else ""
            out.append(Finding("fail", "quantprobe", f"{row.prefix}: {got.layer} algo={got.algo}, expected {row.layer} algo={row.algo}{broken}"))
        else:
            out.append(Finding("ok", "quantprobe", f"{row.prefix}: algo={got.algo}"))
    return out


def _speculative(markers: BootMarkers, variant: Variant) -> list[Finding]:
    spec = variant.serve.speculative
    want = spec.method if spec else "none"
    got = markers.spec_method
    shown = f" ({markers.draft_architecture})" if markers.draft_architecture else ""
    if got != want:
        if got == "none" and not markers.spec_configured:
            detail = f"expected {want}; the log shows no speculator (no SpeculativeConfig in the engine banner, no draft architecture)"
            return [Finding("fail" if markers.startup_complete else "warn", "speculative", detail)]
        return [Finding("fail", "speculative", f"{got}{shown} attached; the variant expects {want}")]
    if want == "none":
        return [Finding("ok", "speculative", "no speculator, as the variant expects")]
    out = [Finding("ok", "speculative", f"{got}{shown} attached, {markers.spec_tokens or '?'} tokens")]
    if spec and markers.spec_tokens is not None and markers.spec_tokens != spec.num_speculative_tokens:
        out.append(Finding("fail", "speculative", f"{markers.spec_tokens} speculative tokens; the variant serves {spec.num_speculative_tokens}"))
    acc, band = markers.acceptance_lengths, variant.expect.accept_length
    if not acc:
        out.append(Finding("warn", "acceptance", "no SpecDecoding metrics line yet (vLLM logs one per interval under traffic)"))
        return out
    mean = markers.overall_acceptance(markers.spec_tokens or (spec.num_speculative_tokens if spec else None))
    if mean <= _REJECTS_ALL:
        out.append(Finding("fail", "acceptance", f"mean acceptance length {mean:.2f}: the target rejects the drafts (a broken drafter)"))
    elif band and not band[0] <= mean <= band[1]:
        out.append(Finding("warn", "acceptance", f"mean acceptance length {mean:.2f} over {len(acc)} intervals; the reference boot gave {band[0]}-{band[1]}"))
    else:
        out.append(Finding("ok", "acceptance", f"mean acceptance length {mean:.2f} over {len(acc)} intervals"))
    return out


def judge_boot(markers: BootMarkers, causes: list[Found], excs: list[str], variant: Variant | None,
               quantprobe: bool | None = None, *, booted: bool = True) -> list[Finding]:
    """What the boot proves; any `fail` fails the smoke. Without a variant only the generic checks run."""
    out = _engine(causes, excs)
    if booted:
        out.append(Finding("ok", "startup", "Application startup complete") if markers.startup_complete
                   else Finding("fail", "startup", "no 'Application startup complete' in the log"))
    if markers.kv_cache_tokens is None:
        out.append(Finding("fail" if booted else "warn", "kv cache", "no 'GPU KV cache size' line: the engine never sized its KV pool"))
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
        out += _speculative(markers, variant)
    return out
