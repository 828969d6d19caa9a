"""glm53-skipped-thinking: an answer that skipped thinking and stopped on EOS comes back as content.

The probe runs vLLM's own chat serving paths, `OpenAIServingChat.chat_completion_full_generator` and
`chat_completion_stream_generator`, with the real GLM parser (tests/probes.py GLM_PROBE_HEAD:
`--tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice`, a real byte-level tokenizer
with GLM's special tokens, the GLM-5.3-format template of tests/data/glm53) on the engine's `RequestOutput`s
for each case: the completion whole, or one token per output for the stream (read back as a client
assembles the server-sent chunks), with how it finished. The serving object is built the way vLLM's own
tests/entrypoints/openai/chat_completion/test_serving_chat.py builds one for its generators
(`_build_minimal_metrics_serving_chat`): `__new__` plus the attributes the generators read, since no
engine can run here. The answer with no `</think>` is hand-written (the sglang issue #37645 shape: the
issue gives counts, not text); the split and tool-call outputs are tests/data/glm53/outputs.json's.

Stock, on every release 0.30.0-0.34.0, streaming and not: the answer comes back as reasoning, content null.
Patched: as content, finish "stop" (non-streaming with reasoning null; streamed, in the finish chunk after
the reasoning deltas already sent). A `max_tokens` cut, a client's stop string, a real split, a tool call
and another parser's output are what stock gives.
"""

from __future__ import annotations

import json

import pytest

from probes import GLM_SERVER_PROBE_HEAD, REPO, patches_under_test, probe_fixtures

pytestmark = pytest.mark.vllm

PATCH_ID = "glm53-skipped-thinking"
DATA = REPO / "tests" / "data" / "glm53"
RECORDED = json.loads((DATA / "outputs.json").read_text())
ANSWER = next(n for n in RECORDED["neighbours"] if n["id"] == "handwritten-skipped-thinking")["text"]
SPLIT, _, TOOL_CALL = RECORDED["outputs"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

# Each case: the completion, how the engine says it finished, and the request's switches.
CASES = {
    "eos": {"text": ANSWER, "finish": "stop", "stop_reason": None},
    "stop-token": {"text": ANSWER, "finish": "stop", "stop_reason": "<|user|>"},  # a stop token id
    "eos-include-reasoning-false": {"text": ANSWER, "finish": "stop", "stop_reason": None, "include_reasoning": False},
    "eos-with-tools": {"text": ANSWER, "finish": "stop", "stop_reason": None, "tools": True},
    "max-tokens": {"text": ANSWER, "finish": "length", "stop_reason": None},
    "client-stop-string": {"text": ANSWER, "finish": "stop", "stop_reason": "\n\n"},
    "split": {"text": SPLIT["text"], "finish": "stop", "stop_reason": None},
    "empty-answer-after-thinking": {"text": "Nothing to add.</think>", "finish": "stop", "stop_reason": None},
    "tool-call": {"text": TOOL_CALL["text"], "finish": "stop", "stop_reason": None, "tools": True},
    "other-parser": {"text": ANSWER, "finish": "stop", "stop_reason": None, "parser": "deepseek_r1"},
}

PROBE = GLM_SERVER_PROBE_HEAD + r'''
import asyncio

TEMPLATE, CASES, TOOLS = json.loads(__ARGS__)
hf = glm_tokenizer(TEMPLATE)


async def complete(case, streamed):
    """What a client reads of the chat server's answer: the response, or the stream's chunks assembled."""
    parser_cls = (ParserManager.get_parser(reasoning_parser_name=case["parser"]) if case.get("parser") else GLM_PARSER)
    messages = [{"role": "user", "content": "What is 17 times 23?"}]
    prompt_ids = hf.encode(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)

    async def results():
        for output in engine_outputs(hf, case["text"], prompt_ids, streamed, case["finish"], case["stop_reason"]):
            yield output

    request = ChatCompletionRequest(model="glm-5.3", messages=messages, tools=TOOLS if case.get("tools") else None,
                                    include_reasoning=case.get("include_reasoning", True), stream=streamed)
    args = (request, results(), "chatcmpl-r", "glm-5.3")
    kwargs = {"conversation": messages, "tokenizer": hf,
              "request_metadata": RequestResponseMetadata(request_id="chatcmpl-r")}
    if not streamed:
        response = await chat_server(parser_cls).chat_completion_full_generator(*args, **kwargs,
                                                                             parser=parser_cls(hf, request.tools))
        choice = response.choices[0]
        return {"reasoning": getattr(choice.message, "reasoning", None), "content": choice.message.content,
                "tool_calls": [json.loads(c.function.arguments) for c in choice.message.tool_calls or []],
                "finish": choice.finish_reason}
    reasoning, content, calls, finish = "", "", {}, None
    async for line in chat_server(parser_cls).chat_completion_stream_generator(*args, **kwargs):
        payload = line.removeprefix("data: ").strip()
        if payload == "[DONE]":
            break
        for choice in json.loads(payload)["choices"]:
            delta = choice["delta"]
            reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                calls[call["index"]] = calls.get(call["index"], "") + ((call.get("function") or {}).get("arguments") or "")
            finish = choice.get("finish_reason") or finish
    return {"reasoning": reasoning or None, "content": content or None,
            "tool_calls": [json.loads(a) for a in calls.values()], "finish": finish}

print(json.dumps({name: {way: asyncio.run(complete(case, way == "stream")) for way in ("full", "stream")}
                  for name, case in CASES.items()}))
'''.replace("__ARGS__", repr(json.dumps([(DATA / "chat_template.jinja").read_text(), CASES, TOOLS])))

stock, patched = probe_fixtures(PROBE)

AS_REASONING = {"reasoning": ANSWER, "content": None, "tool_calls": [], "finish": "stop"}
AS_CONTENT = {"reasoning": None, "content": ANSWER, "tool_calls": [], "finish": "stop"}
# Streamed, the reasoning deltas have gone out before the finish: the answer is added as content.
STREAMED_AS_CONTENT = {**AS_CONTENT, "reasoning": ANSWER}
SKIPPED = ["eos", "stop-token", "eos-with-tools"]


@pytest.mark.parametrize("way", ["full", "stream"])
@pytest.mark.parametrize("case", SKIPPED)
def test_stock_files_the_answer_as_reasoning(stock, case, way):
    """The bug on every release, streaming and not: HTTP 200, finish stop, the whole answer in reasoning,
    content null."""
    assert stock[case][way] == AS_REASONING


@pytest.mark.parametrize("case", SKIPPED)
def test_patched_files_the_answer_as_content(patched, case):
    """The fix: the model itself ended the output with no `</think>`: that text is the answer. Streamed,
    it arrives as content in the finish chunk, after the reasoning deltas it was first sent as."""
    assert patched[case]["full"] == AS_CONTENT
    assert patched[case]["stream"] == STREAMED_AS_CONTENT


def test_patched_answers_without_reasoning_requested(stock, patched):
    """`include_reasoning: false`: stock drops the answer with the reasoning (an empty message); patched
    returns it as content, streaming and not."""
    for way in ("full", "stream"):
        assert stock["eos-include-reasoning-false"][way]["content"] is None, way
        assert patched["eos-include-reasoning-false"][way]["content"] == ANSWER, way
    assert patched["eos-include-reasoning-false"]["full"] == AS_CONTENT


@pytest.mark.parametrize("way", ["full", "stream"])
@pytest.mark.parametrize("case", ["max-tokens", "client-stop-string", "split", "empty-answer-after-thinking",
                                  "tool-call", "other-parser"])
def test_every_other_ending_is_unchanged(stock, patched, case, way):
    """Narrow: a max_tokens cut and a client's stop string are reasoning cut short, a `</think>` means the
    model did split, a tool call is an answer, and another parser is not GLM's: all as stock gives them."""
    assert patched[case][way] == stock[case][way]
    if case == "max-tokens":
        assert patched[case][way] == {**AS_REASONING, "finish": "length"}
    if case == "split":
        assert patched[case][way] == {"reasoning": SPLIT["reasoning"], "content": SPLIT["content"],
                                      "tool_calls": [], "finish": "stop"}
    if case == "tool-call":
        assert patched[case][way]["tool_calls"] == [t["arguments"] for t in TOOL_CALL["tool_calls"]]


def test_plan_per_release(vllm_release):
    """Every release in range: the patch applies to the release's own chat server."""
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.sources.directory import DirectorySource

    result = planner.plan([patches_under_test().patch(PATCH_ID)],
                          DirectorySource(installed_package("vllm").parent)).result(PATCH_ID)
    assert result.state == planner.State.NOT_APPLIED, (vllm_release, result.describe())
