"""vLLM's speculative-decoding counters as its Prometheus endpoint serves them (GET /metrics): how many
drafts the speculator made, how many tokens it drafted and how many the target accepted, summed over the
engines. The live smoke reads them when the log holds no `SpecDecoding metrics` interval yet (vLLM logs one
per logging interval), so a silent MTP draft load shows however short the traffic was.

The names are vLLM's (v1/spec_decode/metrics.py, SpecDecodingProm, the same in 0.33.0 and 0.34.0); the
Prometheus client exposes each counter as `<name>_total`. The answer is read bounded, its lines one by one.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import requests

from patchkit.untrusted import InputTooLarge, read_stream

DRAFTS, DRAFT_TOKENS, ACCEPTED = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                                  "vllm:spec_decode_num_accepted_tokens")
# One sample of one of the three counters: `NAME_total{labels} VALUE [timestamp]` (label values hold no
# newline; the run of non-braces is possessive, so a hostile line costs its length once).
_SAMPLE = re.compile(r"^(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens))_total(?:\{[^}]*+\})? (\S++)")


@dataclass(frozen=True)
class SpecCounts:
    drafts: int
    draft_tokens: int
    accepted: int

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's own formula (metrics.py): 1 + accepted tokens per draft; None before any draft."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_acceptance_length": self.mean_acceptance_length}


def parse_counters(text: str) -> SpecCounts | None:
    """The three counters summed over every engine's sample; None when the server exposes none of them (no
    speculator configured, or not vLLM)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        hit = _SAMPLE.match(line)
        if not hit:
            continue
        try:
            value = float(hit.group(2))
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            sums[hit.group(1)] = sums.get(hit.group(1), 0.0) + value
    if not sums:
        return None
    return SpecCounts(int(sums.get(DRAFTS, 0)), int(sums.get(DRAFT_TOKENS, 0)), int(sums.get(ACCEPTED, 0)))


def fetch_counters(base_url: str, timeout: float = 30.0) -> SpecCounts | str | None:
    """GET BASE/metrics: the counters, None when it exposes none, or why it could not be read (a string)."""
    url = f"{base_url}/metrics"
    try:
        with requests.get(url, timeout=timeout, stream=True) as response:
            response.raw.decode_content = True
            data = read_stream(response.raw, "api-answer", url)
    except requests.RequestException as exc:
        return f"{url}: no answer: {type(exc).__name__}"
    except InputTooLarge as exc:
        return str(exc)
    if response.status_code != 200:
        return f"{url}: HTTP {response.status_code}"
    return parse_counters(data.decode("utf-8", "replace"))
