"""A silent MTP draft load fails the judgement the smoke and `patchkit doctor` make.

vLLM 0.34.0 no longer raises when an MTP draft layer's weights are missing (models/glm5next/common/mtp.py
lost 0.33.0's "MTP speculative decoding layer N weights missing from checkpoint."), so such a boot comes up
and shows the broken draft only in its drafts or in the draft's missing quantprobe rows. The SpecDecoding
lines here are written by vLLM's own SpecDecodingLogging and logger (the installed release; 0.34.0's
metrics.py is the same file), fed the counts a draft that accepts next to nothing produces; the boot
around them is the lab's (tests/data/boot-logs/lab-good.log, hand-written, see its README).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from patchkit.bootlog.judge import SILENT_MTP, judge_log
from patchkit.sources import ArchiveCache
from patchkit.sources.release import open_release
from patchkit.variants.definitions import find_variant

REPO = Path(__file__).resolve().parents[1]
LAB = find_variant("lab", REPO / "images")
GOOD = (REPO / "tests/data/boot-logs/lab-good.log").read_text()

# vLLM's interval logger fed per-step draft outcomes: (drafts, accepted tokens per draft) with k = 3.
SPEC_LOG = """
from vllm.logger import _configure_vllm_root_logger
_configure_vllm_root_logger()
from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingStats
log = SpecDecodingLogging()
for interval in range({intervals}):
    stats = SpecDecodingStats.new(3)
    for i in range({drafts}):
        stats.observe_draft(3, {accepted}[i % len({accepted})])
    log.observe(stats)
    log.log()
"""


def _spec_lines(intervals: int, drafts: int, accepted: list[int]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SPEC_LOG.format(intervals=intervals, drafts=drafts, accepted=accepted)],
                          capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp",
                                                                             "VLLM_LOGGING_LEVEL": "INFO"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "SpecDecoding metrics: " in line]
    assert len(lines) == intervals, done.stdout + done.stderr
    return lines


def _boot(spec_lines: list[str], drop: str = "SpecDecoding metrics") -> str:
    kept = [line for line in GOOD.splitlines() if drop not in line and "SpecDecoding metrics" not in line]
    return "\n".join(kept + spec_lines) + "\n"


@pytest.mark.vllm
def test_mtp_0_34_metrics_file_is_the_one_that_writes_these_lines():
    ours = Path(__import__("vllm.v1.spec_decode.metrics", fromlist=["x"]).__file__).read_text()
    source = open_release("vllm", "0.34.0", cache=ArchiveCache(), progress=False)
    assert source.read_many("vllm", ["v1/spec_decode/metrics.py"])["v1/spec_decode/metrics.py"].decode() == ours


@pytest.mark.vllm
def test_a_draft_that_accepts_next_to_nothing_fails_naming_the_silent_load():
    silent = judge_log(_boot(_spec_lines(3, 50, [0, 0, 0, 0, 1])), LAB, booted=True)
    assert not silent.ok
    [acc] = [f for f in silent.findings if f.what == "acceptance"]
    assert acc.level == "fail" and SILENT_MTP in acc.detail and "mean acceptance length 1.20" in acc.detail
    assert "30 of 450 drafted tokens accepted" in acc.detail


@pytest.mark.vllm
def test_a_loaded_draft_passes_and_a_weak_one_only_warns():
    good = judge_log(_boot(_spec_lines(3, 50, [3, 2, 3, 2])), LAB, booted=True)  # 2.5 of 3: 3.5 a draft
    assert good.ok, [f for f in good.findings if f.level == "fail"]
    weak = judge_log(_boot(_spec_lines(2, 40, [1, 2])), LAB, booted=True)  # 2.5: under the lab's band, above a silent load
    assert weak.ok and [f.level for f in weak.findings if f.what == "acceptance"] == ["warn"]


def test_a_missing_quantprobe_row_of_the_mtp_layer_fails_naming_the_silent_load():
    mtp_row = next(r for r in LAB.expect.quantprobe if r.prefix.startswith("model.layers."))
    assert mtp_row.line() in GOOD
    verdict = judge_log(GOOD.replace(mtp_row.line() + "\n", ""), LAB, quantprobe=True)
    assert not verdict.ok
    [row] = [f for f in verdict.findings if f.what == "quantprobe" and f.level == "fail"]
    assert row.detail.startswith(f"{mtp_row.prefix}: no quantprobe line for this MTP draft layer") and SILENT_MTP in row.detail
    # A target layer's missing row stays a warning: the speculator is not at stake.
    target = next(r for r in LAB.expect.quantprobe if r.prefix.startswith("language_model."))
    other = judge_log(GOOD.replace(target.line() + "\n", ""), LAB, quantprobe=True)
    assert other.ok and any(f.level == "warn" and f.detail.startswith(target.prefix) for f in other.findings)


# ------------------------------------------------------------ the same, from vLLM's /metrics counters

PROM = """
import sys, types, prometheus_client
from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats
prom = SpecDecodingProm(types.SimpleNamespace(num_speculative_tokens=3), ["model_name", "engine"],
                        {{0: ["glm", "0"], 1: ["glm", "1"]}})
for engine in (0, 1):
    stats = SpecDecodingStats.new(3)
    for i in range({drafts}):
        stats.observe_draft(3, {accepted}[i % len({accepted})])
    prom.observe(stats, engine)
sys.stdout.write(prometheus_client.generate_latest().decode())
"""


def _exposition(drafts: int, accepted: list[int]) -> str:
    """What vLLM's SpecDecodingProm serves on /metrics after two engines' drafts (the real class and the
    real Prometheus client, in the vLLM environment)."""
    done = subprocess.run([sys.executable, "-c", PROM.format(drafts=drafts, accepted=accepted)], capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def metrics_server():
    """A local HTTP server answering GET /metrics with what the test sets."""
    import http.server
    import threading

    answer = {"body": b"", "status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the stdlib's name for a GET handler
            self.send_response(answer["status"] if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield answer, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.vllm
def test_the_metrics_counters_of_a_silent_draft_fail_the_smoke(metrics_server):
    from patchkit.bootlog.judge import judge_spec_counters
    from patchkit.smoke.spec_metrics import fetch_counters

    answer, url = metrics_server
    answer["body"] = _exposition(40, [0, 0, 0, 1]).encode()
    counts = fetch_counters(url)
    assert counts is not None and not isinstance(counts, str)
    assert (counts.drafts, counts.draft_tokens, counts.accepted) == (80, 240, 20)  # both engines summed
    [finding] = judge_spec_counters(counts, "mtp")
    assert finding.level == "fail" and SILENT_MTP in finding.detail and "mean acceptance length 1.25" in finding.detail
    answer["body"] = _exposition(40, [3, 2]).encode()
    [finding] = judge_spec_counters(fetch_counters(url), "mtp")
    assert finding.level == "ok" and "mean acceptance length 3.50" in finding.detail


def test_a_speculator_that_never_drafted_or_metrics_that_cannot_be_read(metrics_server):
    from patchkit.bootlog.judge import judge_spec_counters
    from patchkit.smoke.spec_metrics import SpecCounts, fetch_counters, parse_counters

    [none] = judge_spec_counters(SpecCounts(0, 0, 0), "mtp")
    assert none.level == "fail" and "made no draft" in none.detail and SILENT_MTP in none.detail
    answer, url = metrics_server
    answer["status"] = 500
    [unread] = judge_spec_counters(fetch_counters(url), "mtp")
    assert unread.level == "warn" and "HTTP 500" in unread.detail
    assert judge_spec_counters(None, None) == []
    assert parse_counters("vllm:spec_decode_num_drafts_total{a=\"" + "}" * 10_000 + " nan\n") is None
