"""The serving-correctness judgement (smoke/serving.py) on recorded chat completion responses
(tests/data/serving/responses.json: public ones where they exist, the rest hand-written and marked), and
on hostile bodies, which are refused with the JSON path of what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchkit.jsondata import MalformedJson
from patchkit.smoke.serving import PROBE_MAX_TOKENS, PROBES, judge_completion

RESPONSES = json.loads((Path(__file__).parent / "data" / "serving" / "responses.json").read_text())["responses"]


@pytest.mark.parametrize("recorded", RESPONSES, ids=[r["id"] for r in RESPONSES])
def test_recorded_response(recorded):
    check = judge_completion(json.dumps(recorded["body"]).encode(), recorded["probe"], recorded["id"])
    assert check.ok is recorded["ok"], check.findings
    assert check.think_tags_in_content == recorded["think_tags_in_content"]
    assert check.reasoning_swallowed_answer is recorded["reasoning_swallowed_answer"]
    assert check.replacement_chars == 0
    levels = {f.what: f.level for f in check.findings}
    if "warn" in recorded:
        assert levels[recorded["warn"]] == "warn"
    assert check.to_dict()["ok"] is recorded["ok"]


def test_tool_call_arguments_are_checked_as_json():
    by_id = {r["id"]: r for r in RESPONSES}
    good = judge_completion(json.dumps(by_id["tool-call-good"]["body"]).encode(), "tool-call", "good")
    assert [(c.name, c.arguments_json, c.think_tags) for c in good.tool_calls] == [("get_weather", True, 0)]
    leaked = judge_completion(json.dumps(by_id["tool-call-think-in-arguments"]["body"]).encode(), "tool-call", "leaked")
    assert [(c.arguments_json, c.think_tags) for c in leaked.tool_calls] == [(True, 1)]
    body = json.loads(json.dumps(by_id["tool-call-good"]["body"]))
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "city=Paris"
    broken = judge_completion(json.dumps(body).encode(), "tool-call", "broken")
    assert not broken.ok and [c.arguments_json for c in broken.tool_calls] == [False]


def test_replacement_characters_fail_the_probe():
    body = {"choices": [{"message": {"content": "391 \ufffd", "reasoning_content": "17*23 \ufffd\ufffd"}, "finish_reason": "stop"}]}
    check = judge_completion(json.dumps(body).encode(), "reasoning-effort-low", "fffd")
    assert check.replacement_chars == 3 and not check.ok


def test_newer_vllm_reasoning_field_is_read():
    """vLLM names the field `reasoning` in newer releases: an answer there is still seen as swallowed."""
    body = {"choices": [{"message": {"content": None, "reasoning": "391"}, "finish_reason": "stop"}]}
    assert judge_completion(json.dumps(body).encode(), "enable-thinking-false", "r").reasoning_swallowed_answer


def test_probe_requests():
    """The requests that show each mis-split: the GLM-4.5-era switch, low effort with a budget that
    leaves room for an answer, one tool call."""
    assert PROBES["enable-thinking-false"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert PROBES["reasoning-effort-low"]["chat_template_kwargs"] == {"reasoning_effort": "low"}
    assert all(p["max_tokens"] >= PROBE_MAX_TOKENS for p in PROBES.values())
    assert [t["function"]["name"] for t in PROBES["tool-call"]["tools"]] == ["get_weather"]


@pytest.mark.parametrize(("body", "at"), [
    (b"not json", "$"),
    (b"[]", "$"),
    (b'{"choices": []}', "$.choices"),
    (b'{"choices": [{"finish_reason": "stop"}]}', "$.choices[0]"),
    (b'{"choices": [{"message": {"content": 4}}]}', "$.choices[0].message.content"),
    (b'{"choices": [{"message": {"tool_calls": [{"function": {"arguments": {"city": "Paris"}}}]}}]}',
     "$.choices[0].message.tool_calls[0].function.arguments"),
    (b'{"choices": [{"message": {"content": "' + b"[" * 10 + b'"}}], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "$"),
])
def test_hostile_body_is_refused_with_its_path(body, at):
    with pytest.raises(MalformedJson) as err:
        judge_completion(body, "tool-call", "response.json")
    assert err.value.what == "response.json"
    assert err.value.at == at, err.value
    assert err.value.exit_code == 2


# ------------------------------------------------------------ streamed answers

STREAMS = Path(__file__).parent / "data" / "serving" / "streams"


def test_a_streamed_think_end_in_the_arguments_fails():
    """vLLM 0.33.0's own stream of a `</think>` inside an argument (recorded, tests/data/serving/README.md):
    the assembled arguments keep it, the probe fails naming the patch."""
    check = judge_completion((STREAMS / "tool-call-think-in-arguments.sse").read_bytes(), "tool-call-streamed", "sse")
    assert [(c.name, c.arguments_json, c.think_tags) for c in check.tool_calls] == [("get_weather", True, 1)]
    assert not check.ok and "glm47-tool-args-think-end" in " ".join(f.detail for f in check.findings)
    assert check.reasoning_chars and check.finish_reason == "tool_calls"


def test_a_streamed_good_tool_call_passes():
    check = judge_completion((STREAMS / "tool-call-good.sse").read_bytes(), "tool-call-streamed", "sse")
    assert check.ok, check.findings
    assert [(c.name, c.arguments_json, c.think_tags) for c in check.tool_calls] == [("get_weather", True, 0)]


def test_the_streamed_probe_is_the_tool_call_streamed():
    assert PROBES["tool-call-streamed"] == {**PROBES["tool-call"], "stream": True}


def _sse(*chunks: object) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def test_a_stream_of_reasoning_only_swallowed_the_answer():
    """The sglang issue #37645 shape, streamed: every delta reasoning, finish stop."""
    body = _sse({"choices": [{"delta": {"reasoning": "17 times 23"}}]},
                {"choices": [{"delta": {"reasoning": " is 391."}, "finish_reason": "stop"}]}, {"choices": []}, b"[DONE]")
    check = judge_completion(body, "tool-call-streamed", "sse")
    assert check.reasoning_swallowed_answer and not check.ok


@pytest.mark.parametrize(("body", "at"), [
    (b"", "$"),  # no chunk at all
    (b"data: [DONE]\n\n", "$"),
    (b"data: not json\n\n", "$"),
    (b'data: {"choices": [{"delta": {"content": 4}}]}\n\n', "$.choices[0].delta.content"),
    (b'data: {"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}\n\n', "$.choices[0].delta.tool_calls[0].index"),
])
def test_hostile_stream_is_refused_with_its_path(body, at):
    with pytest.raises(MalformedJson) as err:
        judge_completion(body, "tool-call-streamed", "stream")
    assert err.value.at == at, err.value
    assert err.value.exit_code == 2
