"""The hardware smoke harness on CPU: recorded boot logs and a real HTTP server on 127.0.0.1.

The container side is a recorded-log runner: no Docker engine or GPU exists here. Everything else is
the harness's real code talking real HTTP.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from patchkit.bootlog.causes import find_causes
from patchkit.bootlog.judge import judge_log
from patchkit.checkpoint.serve import serve_command
from patchkit.errors import PatchkitError
from patchkit.images.definitions import series_named
from patchkit.patching.patchset import load_patchset
from patchkit.smoke.api import MIN_MAX_TOKENS, PROBE_PROMPT, chat, corruption_probe, wait_healthy
from patchkit.smoke.hardware import run_smoke, switches_of
from patchkit.variants.definitions import ProbeRow, find_variant

LOGS = Path(__file__).parent / "data" / "boot-logs"
IMAGES = Path(__file__).resolve().parents[1] / "images"
# What the lab image's patches ask of a smoke (quantprobe's patch.toml [smoke]), read from the real set.
LAB_SWITCHES = switches_of(series_named("glm53-flash-nvfp4-lab", IMAGES, load_patchset(IMAGES.parent / "patches")))


def log(name: str) -> str:
    return (LOGS / name).read_text()


def fails(findings) -> list[str]:
    return [f"{f.what}: {f.detail}" for f in findings if f.level == "fail"]


def judged(name: str, variant: str | None, quantprobe: bool | None = None):
    return judge_log(log(name), find_variant(variant, IMAGES) if variant else None, quantprobe)


# ------------------------------------------------------------ log parsing and decisions (hand-written logs)


def test_good_lab_boot_on_the_day0_base_with_the_v2_runner():
    v = judged("lab-good.log", "lab", quantprobe=True)
    m = v.markers
    assert ProbeRow("RoutedExperts", "model.layers.45.mlp.experts", "MXFP8") in m.quantprobe
    # the base's wording, in a coloured line
    assert (m.weights_gib, m.weights_load_s, m.weights_line) == (92.19, 700.214, "weights-day0")
    assert m.kv_cache_tokens == 1_164_369 and m.startup_complete and m.v2_runner
    # no V1 "Detected MTP model"/"Loading drafter model" lines: the speculator is read from what V2 prints
    assert (m.spec_method, m.draft_architecture, m.spec_tokens) == ("mtp", "Glm5NextMTPModel", 3)
    assert m.mean_acceptance_length == 3.12
    assert v.causes == [] and v.ok, fails(v.findings)
    assert [f.detail for f in v.findings if f.what == "acceptance"] == ["mean acceptance length 3.12 over 1 intervals"]


def test_algo_none_fails_even_though_the_server_came_up():
    v = judged("lab-algo-none.log", "lab", quantprobe=True)
    assert v.markers.startup_complete
    assert fails(v.findings) == [
        (
            "quantprobe: model.layers.45.mlp.experts: RoutedExperts algo=None, expected RoutedExperts algo=MXFP8 "
            "(broken load: the layer got no quantized method)"
        )
    ]


def test_engine_death_names_the_cause_and_the_line():
    v = judged("4p67-engine-dies.log", "4p67", quantprobe=True)
    assert not v.markers.startup_complete and v.markers.kv_cache_tokens is None
    assert v.cause.cause == "missing-weight-scale"
    assert "KeyError: 'language_model.model.layers.0.self_attn.in_proj_qkvbfg_a.weight_scale'" in v.cause.line
    problems = fails(v.findings)
    assert problems[0].startswith("engine: missing-weight-scale: a quantized tensor's scale has no parameter")
    assert f"(line {v.cause.line_no}: {v.cause.line})" in problems[0]
    assert any("in_proj_qkvbfg_a: LinearBase algo=None, expected LinearBase algo=MXFP8" in p for p in problems)
    assert "startup: no 'Application startup complete' in the log" in problems


def test_fastsafetensors_oom_is_named():
    v = judged("nvidia-fastsafetensors-oom.log", "nvidia-nvfp4")
    assert v.cause.cause == "nv-err-no-memory" and "NV_ERR_NO_MEMORY" in v.cause.line
    assert "--load-format safetensors" in v.cause.fix and not v.ok


def test_redhat_boot_without_quantprobe_says_the_layers_were_not_checked():
    v = judged("redhat-good.log", "redhat", quantprobe=False)
    assert fails(v.findings) == []
    assert [(f.level, f.detail) for f in v.findings if f.what == "quantprobe"] == [
        ("warn", "the image does not carry the quantprobe patch: the 3 per-layer algorithms were not checked from the log")
    ]
    assert v.markers.spec_method == "none"
    assert ("ok", "no speculator, as the variant expects") in [(f.level, f.detail) for f in v.findings if f.what == "speculative"]


def test_an_image_with_quantprobe_must_print_it():
    v = judged("redhat-good.log", "redhat", quantprobe=True)
    assert any(p.startswith("quantprobe: the image carries the quantprobe patch but printed no") for p in fails(v.findings))


def test_speculator_method_must_match_the_variant():
    text = log("lab-good.log")
    # The lab boot attaches MTP; the redhat variant has none.
    redhat = judge_log(text, find_variant("redhat", IMAGES), True)
    assert "speculative: mtp (Glm5NextMTPModel) attached; the variant expects none" in fails(redhat.findings)
    # A DFlash drafter is not MTP, although "a speculator attached".
    dflash = text.replace("method='mtp'", "method='dflash'").replace("Glm5NextMTPModel", "DFlashDraftModel")
    v = judge_log(dflash, find_variant("lab", IMAGES), True)
    assert "speculative: dflash (DFlashDraftModel) attached; the variant expects mtp" in fails(v.findings)
    # The banner says no speculation at all on a complete boot: MTP is missing.
    none = text.replace("speculative_config=SpeculativeConfig(method='mtp', model='local-inference-lab/GLM-5.3-Flash-NVFP4', num_spec_tokens=3)",
                        "speculative_config=None").replace("Resolved architecture: Glm5NextMTPModel", "Resolved architecture: X")
    v = judge_log(none.replace("Resolved architecture: X\n", ""), find_variant("lab", IMAGES), True)
    assert any(p.startswith("speculative: none attached; the variant expects mtp") for p in fails(v.findings))


@pytest.mark.parametrize(("banner", "method"), [
    ("SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)", "ngram"),
    ("SpeculativeConfig(method='eagle3', model='org/eagle-head', num_spec_tokens=3)", "eagle"),
    ("SpeculativeConfig(method='dflash2', model='incoai/GLM-5.3-Flash-DFlash2', num_spec_tokens=7)", "dflash"),
    ("SpeculativeConfig(method='deepseek_mtp', model='m', num_spec_tokens=1)", "mtp"),
])
def test_every_speculator_family_is_named_from_the_banner(banner, method):
    text = log("lab-good.log").replace(
        "SpeculativeConfig(method='mtp', model='local-inference-lab/GLM-5.3-Flash-NVFP4', num_spec_tokens=3)", banner)
    assert judge_log(text, None).markers.spec_method == method


def test_acceptance_outside_the_reference_band_and_a_broken_drafter():
    text = log("lab-good.log")
    low = judge_log(text.replace("Mean acceptance length: 3.12", "Mean acceptance length: 2.10").replace("Accepted: 1950", "Accepted: 1012"), find_variant("lab", IMAGES), True)
    assert low.ok and ("warn", "mean acceptance length 2.10 over 1 intervals; the reference boot gave 2.9-3.5") in [
        (f.level, f.detail) for f in low.findings if f.what == "acceptance"]
    broken = judge_log(text.replace("Mean acceptance length: 3.12", "Mean acceptance length: 1.00").replace("Accepted: 1950", "Accepted: 0"), find_variant("lab", IMAGES), True)
    # lab serves an MTP draft: a draft whose tokens are all rejected fails as a silent draft load (0.34.0 loads
    # one without a word), naming what to check (tests/test_silent_mtp.py has the other drafters)
    assert [f for f in fails(broken.findings) if f.startswith(
        "acceptance: mean acceptance length 1.00 over 1 intervals (0 of 2760 drafted tokens accepted), below 1.5 "
        "for an MTP draft: ")] and not broken.ok


# ------------------------------------------------------------ real public logs (tests/data/README.md)


def test_real_kv_budget_failure_is_named_with_its_line():
    v = judged("public/tenhkspark-stock-k5-boot-failure.log", None)
    assert [c.cause for c in v.causes] == ["kv-budget"]
    assert v.cause.line_no == 1 and "(0.92 GiB KV cache is needed" in v.cause.line
    assert "--kv-cache-memory-bytes" in v.cause.fix and not v.ok


def test_real_free_memory_death_through_ansi_colours():
    v = judged("public/vllm-33297-free-memory.log", None)
    assert v.cause.cause == "startup-free-memory"
    assert "\x1b" not in v.cause.line and v.cause.line.endswith("reduce GPU memory used by other processes.")
    assert "0.82" in v.cause.fix


def test_real_mtp_engine_log_gives_the_acceptance_per_interval():
    m = judged("public/tenhkspark-route-h-mtp2-engine.log", None).markers
    assert m.acceptance_lengths == [2.33, 2.67, 2.38, 3.0, 2.89, 2.58, 3.0, 2.95, 2.95, 2.96]
    assert m.mean_acceptance_length == 2.96 and m.spec_evidence  # a speculator is running
    # Weighted by drafts (1 + k * accepted / drafted, k=2 for this MTP K=2 server): 1025 of 1060 accepted.
    assert m.accepted_drafted[-1] == (481, 490)
    assert round(m.overall_acceptance(2), 3) == 2.934 and round(m.overall_acceptance(None), 3) == 2.771
    assert m.spec_method == "unknown"  # the excerpt starts after the banner: the method is not shown


DFLASH_BOOT = "public/sfxnz-nvidia-dflash2-good-boot.log"  # a real day-0 boot of the nvidia checkpoint
KILLED_BOOT = "public/sfxnz-nvidia-killed-boot.log"  # the same recipe's boot killed by its memory watcher


def lines_with(name: str, text: str) -> list[str]:
    return [line for line in log(name).splitlines() if text in line]


def test_real_day0_dflash_boot_is_read_from_its_own_lines():
    m = judged(DFLASH_BOOT, None).markers
    # The base's wording of the weight line; the values are the ones that line prints.
    [weights] = lines_with(DFLASH_BOOT, "Model loading took")
    gib, seconds = re.search(r"took (\S+) GiB and (\S+) seconds", weights).groups()
    assert (m.weights_gib, m.weights_load_s, m.weights_line) == (float(gib), float(seconds), "weights-day0") == (90.36, 783.17347, "weights-day0")
    [kv] = lines_with(DFLASH_BOOT, "GPU KV cache size")
    assert m.kv_cache_tokens == int(re.search(r"size: ([\d,]+) tokens", kv).group(1).replace(",", "")) == 372_877
    assert m.startup_complete and m.v2_runner and m.engine_version == "0.1.dev20051+g487ecf187" and m.phase == "serving"
    # The speculator: the banner's SpeculativeConfig, the draft config's architecture, the V2 graph capture.
    [banner] = lines_with(DFLASH_BOOT, "speculative_config=SpeculativeConfig(")
    method, tokens = re.search(r"SpeculativeConfig\(method='(\w+)', model='[^']*', num_spec_tokens=(\d+)\)", banner).groups()
    assert (m.spec_configured, m.spec_tokens) == (method, int(tokens)) == ("dflash", 7)
    assert m.architectures == ["Glm5NextForConditionalGeneration", "DFlash2DraftModel"] and m.speculator_captured == "DFlash2"
    assert (m.spec_method, m.draft_architecture) == ("dflash", "DFlash2DraftModel")
    # Without the banner the draft architecture alone still names the method.
    assert judge_log(log(DFLASH_BOOT).replace(banner, ""), None).markers.spec_method == "dflash"


def test_real_day0_dflash_acceptance_matches_the_logs_metrics_lines():
    m = judged(DFLASH_BOOT, None).markers
    printed = [dict(re.findall(r"(Mean acceptance length|Accepted|Drafted): ([\d.]+)", line))
               for line in lines_with(DFLASH_BOOT, "SpecDecoding metrics:")]
    assert len(printed) == len(m.acceptance_lengths) == 6
    assert m.acceptance_lengths == [float(p["Mean acceptance length"]) for p in printed]
    assert m.accepted_drafted == [(int(p["Accepted"]), int(p["Drafted"])) for p in printed]
    # Each interval's printed mean is vLLM's 1 + k * accepted / drafted with k = the banner's 7 tokens, so the
    # weighted mean over all intervals is the same formula over the sums.
    for length, (accepted, drafted) in zip(m.acceptance_lengths, m.accepted_drafted, strict=True):
        assert round(1 + m.spec_tokens * accepted / drafted, 2) == length
    accepted, drafted = (sum(col) for col in zip(*m.accepted_drafted, strict=True))
    assert m.overall_acceptance(m.spec_tokens) == 1 + 7 * accepted / drafted == 1 + 7 * 827 / 2912


def test_real_dflash_boot_passes_alone_and_fails_where_the_variant_expects_mtp():
    alone = judged(DFLASH_BOOT, None)
    assert alone.ok and alone.cause is None and fails(alone.findings) == []
    assert [(f.level, f.detail) for f in alone.findings if f.what in ("speculative", "acceptance")] == [
        ("ok", "dflash (DFlash2DraftModel) attached, 7 tokens"), ("ok", "mean acceptance length 2.99 over 6 intervals")]
    variant = find_variant("nvidia-nvfp4", IMAGES)
    assert variant.serve.speculative.method == "mtp" and variant.expect.mtp_speculator
    v = judge_log(log(DFLASH_BOOT), variant)
    # The one failure: a DFlash drafter where the variant serves its own MTP layer. Weights and KV are fine.
    assert fails(v.findings) == ["speculative: dflash (DFlash2DraftModel) attached; the variant expects mtp"]
    assert v.cause is None and v.markers.startup_complete


def test_real_killed_boot_is_named_killed_from_outside_in_its_phase():
    text = log(KILLED_BOOT)
    v = judged(KILLED_BOOT, None)
    m = v.markers
    assert (m.weights_gib, m.kv_cache_tokens, m.startup_complete, m.phase) == (90.36, None, False, "profiling")
    assert v.exceptions == [] and find_causes(text) == []  # no line of the table: the log just stops
    cause = v.cause
    assert cause.cause == "ended-without-error" and cause.definitive
    assert cause.what.startswith("killed from outside during profiling: the log stops in the profiling phase "
                                 "(weights loaded; no 'GPU KV cache size' line yet) with no error line")
    last = [line for line in text.splitlines() if line.strip()]
    assert (cause.line_no, cause.line) == (len(last), last[-1].strip())
    for hint in ("--gpu-memory-utilization", "--kv-cache-memory-bytes", "close other processes", "MemAvailable floor"):
        assert hint in cause.fix
    problems = fails(v.findings)
    assert problems[0].startswith("engine: ended-without-error: killed from outside during profiling")
    assert "startup: no 'Application startup complete' in the log" in problems and any(p.startswith("kv cache:") for p in problems)
    # The watcher's own record agrees: it killed in its PROFILE phase, right after the weight line.
    watch = log("public/sfxnz-nvidia-killed-boot.watch.log")
    assert re.search(r"< (\w+) floor", watch).group(1) == "PROFILE" and m.phase == "profiling"


def test_a_stopped_log_is_not_a_boot_in_progress_unless_told():
    text = log(KILLED_BOOT)
    # Cut short on purpose (captured mid-boot): no startup or end-of-log verdict at all.
    cut = judge_log(text, None, booted=False)
    assert cut.ok and cut.cause is None
    # The live smoke knows the process: still running is a boot not finished, not a kill.
    running = judge_log(text, None, process="running")
    assert running.cause.cause == "still-booting" and "still runs" in running.cause.what and not running.ok
    exited = judge_log(text, None, process="exited")
    assert exited.cause.cause == "ended-without-error" and exited.cause.what.endswith("the container exited")
    with pytest.raises(ValueError, match="process must be one of"):
        judge_log(text, None, process="unknown")


def test_the_watchers_kill_line_names_the_kill():
    v = judge_log(log(KILLED_BOOT) + log("public/sfxnz-nvidia-killed-boot.watch.log"), None)
    [kill] = lines_with("public/sfxnz-nvidia-killed-boot.watch.log", " KILL reason=")
    assert v.cause.cause == "watcher-kill" and v.cause.line == kill.strip()
    assert "MemAvailable floor" in v.cause.fix


def test_an_error_no_cause_names_is_not_called_a_kill():
    text = log(KILLED_BOOT) + "(EngineCore pid=316) ERROR 09-27 13:39:00 [core.py:1] Something new broke\n"
    v = judge_log(text, None)
    assert v.cause.cause == "unrecognised-error" and v.cause.line.endswith("Something new broke")
    assert v.cause.line_no == len(text.splitlines())


def test_real_parallel_lm_head_nan_is_named_with_its_line():
    v = judged("public/vllm-55442-parallel-lm-head-nan.log", None)
    [line] = log("public/vllm-55442-parallel-lm-head-nan.log").splitlines()
    assert [c.cause for c in v.causes] == ["weight-scale-never-loaded"] and v.cause.line == line
    assert "'parallel_lm_head'" in v.cause.line and "MTP draft's own head" in v.cause.what
    assert "defer_lm_head" in v.cause.fix and "ignore list" in v.cause.fix and not v.ok


# ------------------------------------------------------------ a real HTTP server


class Endpoint:
    """An OpenAI-style server on 127.0.0.1: /health fails `unhealthy` times, then 200."""

    def __init__(self, unhealthy: int = 0, content: str = "51.", reasoning: str = "17*3", finish: str = "stop"):
        self.unhealthy, self.content, self.reasoning, self.finish = unhealthy, content, reasoning, finish
        self.requests: list[dict] = []
        self.health_calls = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict | str, kind: str = "application/json") -> None:
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    endpoint.health_calls += 1
                    ok = endpoint.health_calls > endpoint.unhealthy
                    return self._send(200 if ok else 503, {} if ok else {"error": "starting"})
                self._send(404, {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                message = {"role": "assistant", "content": endpoint.content, "reasoning_content": endpoint.reasoning}
                if body.get("tools"):  # the serving probe's tool call, as vLLM's glm47 tool parser returns one
                    message = {**message, "content": None, "tool_calls": [{"id": "call_0", "type": "function",
                               "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}
                if body.get("stream"):  # the streamed probe: the same message as one server-sent chunk
                    chunk = {"choices": [{"index": 0, "delta": message, "finish_reason": endpoint.finish}]}
                    return self._send(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", "text/event-stream")
                self._send(200, {"choices": [{"message": message, "finish_reason": endpoint.finish}],
                                 "usage": {"completion_tokens": 12}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_health_waits_for_200():
    with Endpoint(unhealthy=3) as ep:
        health = wait_healthy(ep.url, deadline_s=10, interval_s=0.01)
    assert health.ok and health.attempts == 4 and ep.health_calls == 4


def test_health_gives_up_at_the_deadline_and_on_a_dead_container():
    with Endpoint(unhealthy=10**9) as ep:
        timed_out = wait_healthy(ep.url, deadline_s=0.3, interval_s=0.02)
        dead = wait_healthy(ep.url, deadline_s=10, interval_s=0.01, alive=lambda: False)
    assert not timed_out.ok and "HTTP 503; deadline" in timed_out.last
    assert not dead.ok and dead.attempts == 1 and "container exited" in dead.last
    closed = wait_healthy("http://127.0.0.1:9", deadline_s=0.2, interval_s=0.02)
    assert not closed.ok and "ConnectionError" in closed.last


def test_chat_request_shape():
    with Endpoint() as ep:
        reply = chat(ep.url, "glm53", "hi")
    assert reply["ok"] and reply["content"] == "51." and reply["finish_reason"] == "stop"
    sent = ep.requests[0]
    assert sent["chat_template_kwargs"] == {"reasoning_effort": "low"}
    assert sent["max_tokens"] >= 256 and sent["model"] == "glm53"
    with pytest.raises(PatchkitError, match=">= 256"):
        chat(ep.url, "glm53", "hi", max_tokens=48)


def test_empty_content_is_a_failed_chat():
    with Endpoint(content="", finish="length") as ep:
        reply = chat(ep.url, "glm53", "hi")
    assert not reply["ok"] and reply["error"] == "empty content (finish_reason length)"


def test_an_answer_of_the_wrong_shape_is_a_failed_chat_naming_where():
    """The chat is read against the serving probes' schema: content that is not a string is refused with
    its JSON path, never taken as an answer."""
    with Endpoint(content=51) as ep:  # the wrong shape on purpose
        reply = chat(ep.url, "glm53", "hi")
    assert reply["ok"] is False and reply["error"].startswith("not a chat completion: the chat answer: ")
    assert reply["error"].endswith("got `int` at $.choices[0].message.content"), reply["error"]


def test_corruption_probe_counts_replacement_characters():
    with Endpoint(content="강은 오늘 밤 조용하다。河流今晚很安静。") as ep:
        clean = corruption_probe(ep.url, "glm53", runs=2)
    assert clean == {"runs": 2, "replacement_chars": [0, 0], "errors": [], "ok": True}
    assert ep.requests[0]["messages"][0]["content"] == PROBE_PROMPT and ep.requests[0]["max_tokens"] >= MIN_MAX_TOKENS
    with Endpoint(content="강은 \ufffd\ufffd 조용하다", reasoning="\ufffd") as ep:
        broken = corruption_probe(ep.url, "glm53", runs=2)
    assert broken["replacement_chars"] == [3, 3] and not broken["ok"]


# ------------------------------------------------------------ the whole smoke


class RecordedRunner:
    """Stands in for a Docker container: replays a recorded boot log (no engine exists here)."""

    def __init__(self, host: str, log_name: str, alive: bool = True):
        self.host, self.text, self.alive = host, log(log_name), alive
        self.started: list[tuple] = []
        self.stopped = False

    def start(self, image, argv, env, name):
        self.started.append((image, argv, env, name))

    def running(self):
        return self.alive

    def logs(self):
        return self.text

    def image_digest(self):
        return "glm53-flash-nvfp4-lab@sha256:" + "ab" * 32

    def stop(self):
        self.stopped = True


def test_full_smoke_passes_and_writes_a_receipt(tmp_path):
    variant = find_variant("lab", IMAGES)
    head, worker = RecordedRunner("ssh://ops@spark1", "lab-good.log"), RecordedRunner("ssh://ops@spark2", "lab-good.log")
    with Endpoint(unhealthy=2) as ep:
        receipt = run_smoke(variant, serve_command(variant), "glm53-flash-nvfp4-lab:local", [head, worker], ep.url,
                            health_interval_s=0.01, probe_runs=2, switches=LAB_SWITCHES)
    assert receipt.ok, receipt.findings
    argv_head, argv_worker = head.started[0][1], worker.started[0][1]
    assert argv_head[-6:] == ("--nnodes", "2", "--node-rank", "0", "--master-addr", "spark1")
    assert argv_worker[-1] == "--headless"
    assert head.stopped and worker.stopped
    path = tmp_path / "receipt.json"
    receipt.write(path)
    data = json.loads(path.read_text())
    assert data["variant"] == "lab" and data["hardware"] is True
    assert data["verdict"]["markers"]["kv_cache_tokens"] == 1_164_369 and data["cause"] is None
    assert data["verdict"]["speculative"]["method"] == "mtp" and data["attempts"] == 1
    assert data["probe"]["ok"] and data["chat"]["ok"]
    assert set(data["image_digests"]) == {"ssh://ops@spark1", "ssh://ops@spark2"}
    assert data["timings"]["health_attempts"] == 3


def test_smoke_fails_on_a_dead_engine_without_chatting():
    variant = find_variant("4p67", IMAGES)
    head = RecordedRunner("ssh://ops@spark1", "4p67-engine-dies.log", alive=False)
    with Endpoint(unhealthy=10**9) as ep:
        receipt = run_smoke(variant, serve_command(variant), "img", [head], ep.url, health_interval_s=0.01)
    assert not receipt.ok and receipt.chat is None and ep.requests == []
    assert receipt.cause["cause"] == "missing-weight-scale" and "in_proj_qkvbfg_a.weight_scale" in receipt.cause["line"]
    assert any(f["what"] == "health" and "container exited" in f["detail"] for f in receipt.findings)


@pytest.mark.parametrize(("alive", "cause", "tail"), [(False, "ended-without-error", "the container exited"),
                                                      (True, "still-booting", "hang at this last line)")])
def test_smoke_tells_a_killed_boot_from_one_still_running(alive, cause, tail):
    """The live harness has what a recorded log lacks: whether the containers still run."""
    variant = find_variant("lab", IMAGES)
    variant = replace(variant, expect=replace(variant.expect, boot_timeout_s=1))
    head = RecordedRunner("ssh://ops@spark1", KILLED_BOOT, alive=alive)
    with Endpoint(unhealthy=10**9) as ep:
        receipt = run_smoke(variant, serve_command(variant), "img", [head], ep.url, health_interval_s=0.05)
    assert not receipt.ok and receipt.chat is None
    assert receipt.cause["cause"] == cause and receipt.cause["what"].endswith(tail)
    assert receipt.verdict["phase"] == "profiling"


def test_incomplete_command_is_refused():
    variant = find_variant("nvidia-nvfp4", IMAGES)
    with pytest.raises(PatchkitError, match="incomplete"):
        run_smoke(variant, serve_command(variant), "img", [RecordedRunner("h", "lab-good.log")], "http://127.0.0.1:9")


class RacingRunner(RecordedRunner):
    """The launcher's occupancy race: the first start finds one node; after a stop the boot is good."""

    def __init__(self, host: str):
        super().__init__(host, "lab-good.log")
        self.good = self.text

    def start(self, image, argv, env, name):
        super().start(image, argv, env, name)
        self.text = "serve failed: cluster has only 1 nodes\n" if len(self.started) == 1 else self.good
        self.alive = len(self.started) > 1


def test_the_occupancy_race_is_retried_once_after_its_delay():
    variant = find_variant("lab", IMAGES)
    head, slept = RacingRunner("ssh://ops@spark1"), []
    with Endpoint(unhealthy=1) as ep:
        receipt = run_smoke(variant, serve_command(variant), "img", [head], ep.url, health_interval_s=0.01,
                            probe_runs=1, sleep=slept.append, switches=LAB_SWITCHES)
    assert receipt.ok and receipt.attempts == 2 and slept[0] == 10.0
    assert [s[3] for s in head.started] == ["patchkit-smoke-lab-0", "patchkit-smoke-lab-retry-0"]
    assert head.started[0][2]["PATCHKIT_QUANTPROBE"] == "1"


def test_allocation_probe_lines_do_not_fail_a_boot_that_came_up():
    """NVRM allocation probes at boot are harmless when the engine comes up (docs/field-records.md); the
    same line is the cause of a boot that never did."""
    probe = "(Worker_TP0 pid=245) WARNING 08-28 14:03:00 [cumem.py:80] NVRM: Out of memory [NV_ERR_NO_MEMORY] _memdescAllocInternal\n"
    text = log("lab-good.log")
    up = judge_log(probe + text, find_variant("lab", IMAGES), True)
    assert up.ok and up.cause is None
    assert [(f.level, f.what) for f in up.findings if f.what == "memory"] == [("warn", "memory")]
    down = judge_log(probe + text.split("Application startup complete")[0], find_variant("lab", IMAGES), True)
    assert down.cause.cause == "nv-err-no-memory" and not down.ok


def test_an_endless_chat_answer_is_cut_at_its_limit_not_held(monkeypatch):
    """The served API is outside input too: an answer past PATCHKIT_LIMIT_API_ANSWER is a failed chat
    naming the limit, read no further (the server here sends 64 MiB of an endless body)."""
    monkeypatch.setenv("PATCHKIT_LIMIT_API_ANSWER", str(1 << 20))

    class Endless(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                for _ in range(1024):
                    self.wfile.write(b"[" * 65536)
            except OSError:  # the client stopped reading, as it must
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reply = chat(f"http://127.0.0.1:{server.server_port}", "m", "hi", timeout=30)
    finally:
        server.shutdown()
    assert reply["ok"] is False and "PATCHKIT_LIMIT_API_ANSWER" in reply["error"]


def test_what_a_smoke_is_given_but_cannot_run_is_refused_with_its_kind(tmp_path):
    """A serve command missing what only the checkpoint tells, a ~ cache path on a remote host and a
    variant the CPU smoke has no tiny layout for: each refused before any container or worker starts."""
    from patchkit.smoke.containers import RemoteHomeUnknown, _host_path
    from patchkit.smoke.cpu import build_checkpoints
    from patchkit.smoke.hardware import ServeCommandIncomplete
    from patchkit.smoke.synthetic_layout import LAYOUTS, NoSyntheticLayout

    variant = find_variant("nvidia-nvfp4", IMAGES)
    command = serve_command(variant)
    with pytest.raises(ServeCommandIncomplete) as pending:
        run_smoke(variant, command, "img", [], "http://127.0.0.1:1")
    assert pending.value.variant == "nvidia-nvfp4" and pending.value.pending == command.pending != ()
    with pytest.raises(RemoteHomeUnknown) as home:
        _host_path("ssh://ops@spark1", "~/.cache/huggingface")
    assert (home.value.path, home.value.host) == ("~/.cache/huggingface", "ssh://ops@spark1")
    assert _host_path("ssh://ops@spark1", "/home/ops/.cache/huggingface") == "/home/ops/.cache/huggingface"
    with pytest.raises(NoSyntheticLayout) as layout:
        build_checkpoints(["no-such-variant"], tmp_path, "/nonexistent/python")
    assert layout.value.variant == "no-such-variant" and layout.value.known == tuple(LAYOUTS)
