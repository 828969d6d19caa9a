"""The hardware smoke harness on CPU: recorded boot logs and a real HTTP server on 127.0.0.1.

The container side is a recorded-log runner: no Docker engine or GPU exists here. Everything else is
the harness's real code talking real HTTP.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from patchkit.errors import PatchkitError
from patchkit.variants.definitions import ProbeRow, find_variant
from patchkit.variants.serve import serve_command
from patchkit.variants.smoke.hardware import (
    MIN_MAX_TOKENS,
    PROBE_PROMPT,
    chat,
    corruption_probe,
    judge_boot,
    parse_boot_log,
    run_smoke,
    wait_healthy,
)

LOGS = Path(__file__).parent / "data" / "boot-logs"
IMAGES = Path(__file__).resolve().parents[1] / "images"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def fails(findings) -> list[str]:
    return [f"{f.what}: {f.detail}" for f in findings if f.level == "fail"]


# ------------------------------------------------------------ log parsing and decisions


def test_good_lab_boot_markers():
    m = parse_boot_log(log("lab-good.log"))
    assert ProbeRow("RoutedExperts", "model.layers.45.mlp.experts", "MXFP8") in m.quantprobe
    assert (m.weights_gib, m.weights_load_s) == (92.19, 700.214)  # the coloured line parses too
    assert m.kv_cache_tokens == 1_164_369
    assert m.startup_complete and m.mtp_speculator and m.mean_acceptance_length == 3.12
    assert m.fatal == [] and m.exceptions == []
    assert fails(judge_boot(m, find_variant("lab", IMAGES))) == []


def test_algo_none_fails_even_though_the_server_came_up():
    m = parse_boot_log(log("lab-algo-none.log"))
    assert m.startup_complete
    assert fails(judge_boot(m, find_variant("lab", IMAGES))) == [
        (
            "quantprobe: model.layers.45.mlp.experts: RoutedExperts algo=None, expected RoutedExperts algo=MXFP8 "
            "(broken load: the layer got no quantized method)"
        )
    ]


def test_engine_death_names_the_cause():
    m = parse_boot_log(log("4p67-engine-dies.log"))
    assert not m.startup_complete and m.kv_cache_tokens is None
    problems = fails(judge_boot(m, find_variant("4p67", IMAGES)))
    assert problems[0] == (
        "engine: the engine died: KeyError: 'language_model.model.layers.0.self_attn.in_proj_qkvbfg_a.weight_scale' "
        "(then RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore_DP0': 1})"
    )
    assert any("in_proj_qkvbfg_a: LinearBase algo=None, expected LinearBase algo=MXFP8" in p for p in problems)
    assert "startup: no 'Application startup complete' in the log" in problems
    assert any(p.startswith("kv cache:") for p in problems)


def test_oom_boot_fails():
    m = parse_boot_log(log("nvidia-fastsafetensors-oom.log"))
    assert any("NV_ERR_NO_MEMORY" in line for line in m.fatal)
    assert fails(judge_boot(m, find_variant("nvidia-nvfp4", IMAGES)))


def test_redhat_boot_passes_with_unconfirmed_probe_rows():
    m = parse_boot_log(log("redhat-good.log"))
    findings = judge_boot(m, find_variant("redhat", IMAGES))
    assert fails(findings) == []
    assert [f.level for f in findings if f.what == "quantprobe"] == ["warn"] * 3
    assert not m.mtp_speculator


def test_speculator_must_match_the_variant():
    m = parse_boot_log(log("lab-good.log"))
    # The lab boot attaches an MTP speculator; the redhat variant has none.
    assert "mtp: an MTP speculator attached to a variant without one" in fails(judge_boot(m, find_variant("redhat", IMAGES)))
    m.mtp_speculator = False
    assert "mtp: expected the MTP speculator, none attached" in fails(judge_boot(m, find_variant("lab", IMAGES)))


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

            def _send(self, code: int, body: dict | str) -> None:
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
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
                            health_interval_s=0.01, probe_runs=2)
    assert receipt.ok, receipt.findings
    argv_head, argv_worker = head.started[0][1], worker.started[0][1]
    assert argv_head[-6:] == ("--nnodes", "2", "--node-rank", "0", "--master-addr", "spark1")
    assert argv_worker[-1] == "--headless"
    assert head.stopped and worker.stopped
    path = tmp_path / "receipt.json"
    receipt.write(path)
    data = json.loads(path.read_text())
    assert data["variant"] == "lab" and data["hardware"] is True
    assert data["markers"]["kv_cache_tokens"] == 1_164_369
    assert data["probe"]["ok"] and data["chat"]["ok"]
    assert set(data["image_digests"]) == {"ssh://ops@spark1", "ssh://ops@spark2"}
    assert data["timings"]["health_attempts"] == 3


def test_smoke_fails_on_a_dead_engine_without_chatting():
    variant = find_variant("4p67", IMAGES)
    head = RecordedRunner("ssh://ops@spark1", "4p67-engine-dies.log", alive=False)
    with Endpoint(unhealthy=10**9) as ep:
        receipt = run_smoke(variant, serve_command(variant), "img", [head], ep.url, health_interval_s=0.01)
    assert not receipt.ok and receipt.chat is None and ep.requests == []
    assert any(f["what"] == "health" and "container exited" in f["detail"] for f in receipt.findings)


def test_incomplete_command_is_refused():
    variant = find_variant("nvidia-nvfp4", IMAGES)
    with pytest.raises(PatchkitError, match="incomplete"):
        run_smoke(variant, serve_command(variant), "img", [RecordedRunner("h", "lab-good.log")], "http://127.0.0.1:9")
