"""`patchkit doctor serving URL`: the smoke's serving probes against a running server, judged as a client
reads the answers.

The server is a real HTTP server on 127.0.0.1 that answers each probe with a recorded chat completion
from tests/data/serving/responses.json (public ones where they exist: vLLM PR #54825's leaked message,
sglang PR #39227's GLM-5.3 rows; the rest hand-written and marked there), chosen by what the probe
sends, so the doctor's whole path runs: the request, the bounded read, the judgement, the exit status.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit.cli.main import main

RESPONSES = {r["id"]: r for r in json.loads(
    (Path(__file__).parent / "data" / "serving" / "responses.json").read_text())["responses"]}
# The streamed probe's answers: what vLLM 0.33.0's own streaming chat server writes (measured here).
RESPONSES.update({f"{p.stem}.sse": {"sse": p.read_bytes()}
                  for p in (Path(__file__).parent / "data" / "serving" / "streams").glob("*.sse")})
GOOD = {"enable-thinking-false": "sglang-39227-ordinary", "reasoning-effort-low": "sglang-39227-ordinary",
        "tool-call": "tool-call-good", "tool-call-streamed": "tool-call-good.sse"}


def _probe_of(body: dict) -> str:
    """Which serving probe a request is (smoke/serving.PROBES), from what it sends."""
    if body.get("tools"):
        return "tool-call-streamed" if body.get("stream") else "tool-call"
    return "enable-thinking-false" if "enable_thinking" in (body.get("chat_template_kwargs") or {}) else "reasoning-effort-low"


class RecordedServer:
    """Answers each probe with the recorded response `answers[probe]` names; records what was asked."""

    def __init__(self, answers: dict[str, str]):
        self.asked: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.asked.append(body)
                answer = RESPONSES[answers[_probe_of(body)]]
                data = answer["sse"] if "sse" in answer else json.dumps(answer["body"]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream" if "sse" in answer else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _doctor(*args: str):
    return CliRunner().invoke(main, ["doctor", *args])


def test_a_server_that_splits_right_passes():
    with RecordedServer(GOOD) as server:
        result = _doctor("serving", server.url, "--model", "glm53", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] and set(report["probes"]) == set(GOOD)
    assert {b["model"] for b in server.asked} == {"glm53"}
    assert {_probe_of(b) for b in server.asked} == set(GOOD)


@pytest.mark.parametrize(("probe", "answer", "names"), [
    ("enable-thinking-false", "vllm-54825-leaked", "glm53-always-think"),
    ("reasoning-effort-low", "sglang-37645-swallowed", "glm53-skipped-thinking"),
    ("tool-call", "tool-call-think-in-arguments", "glm47-tool-args-think-end"),
    ("tool-call-streamed", "tool-call-think-in-arguments.sse", "glm47-tool-args-think-end"),
])
def test_each_recorded_mis_split_fails_naming_its_patch(probe, answer, names):
    """A server without the patch answers as recorded: exit 1, the finding naming the patch that fixes it."""
    with RecordedServer({**GOOD, probe: answer}) as server:
        result = _doctor("serving", server.url, "--model", "glm53")
    assert result.exit_code == 1, result.output
    assert "MIS-SPLITS" in result.output and names in result.output.replace("\n", "")


def test_the_variant_gives_the_served_name():
    with RecordedServer(GOOD) as server:
        result = _doctor("serving", server.url, "--variant", "lab", "--json")
    assert result.exit_code == 0, result.output
    assert {b["model"] for b in server.asked} == {json.loads(result.output)["model"]} == {"glm53"}


def test_no_server_fails_each_probe_without_a_traceback():
    with RecordedServer(GOOD) as server:
        url = server.url
    result = _doctor("serving", url, "--model", "glm53", "--json")
    assert result.exit_code == 1, result.output
    assert all(not p["ok"] and p["error"].startswith("no answer") for p in json.loads(result.output)["probes"].values())


@pytest.mark.parametrize("args", [
    ["serving", "http://127.0.0.1:8000/v1", "--model", "glm53"],  # a path: the probes add /v1/...
    ["serving", "ftp://127.0.0.1:8000", "--model", "glm53"],
    ["serving", "http://127.0.0.1:8000"],  # no model name
    ["serving", "http://127.0.0.1:8000", "some.log", "--model", "glm53"],
    ["log", "some.log", "--model", "glm53"],  # --model is serving's
    # the spellings before the subcommands, still refused when they mix modes
    ["some.log", "--serving", "http://127.0.0.1:8000", "--model", "glm53"],
    ["some.log", "--model", "glm53"],
])
def test_bad_arguments_exit_2(args):
    result = _doctor(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
