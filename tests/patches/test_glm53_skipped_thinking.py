"""glm53-skipped-thinking: an answer that skipped thinking and stopped on EOS comes back as content.

The probe runs vLLM's own non-streaming chat serving path, `OpenAIServingChat.chat_completion_full_generator`,
with the real GLM parser (tests/probes.py GLM_PROBE_HEAD: `--tool-call-parser glm47 --reasoning-parser
glm45 --enable-auto-tool-choice`, a real byte-level tokenizer with GLM's special tokens, the GLM-5.3-format
template of tests/data/glm53) on the engine's `RequestOutput` for each case: the completion's text, its
token ids from that tokenizer, and how it finished. The serving object is built the way vLLM's own
tests/entrypoints/openai/chat_completion/test_serving_chat.py builds one for the full generator
(`_build_minimal_metrics_serving_chat`): `__new__` plus the attributes the generator reads, since no
engine can run here. The answer with no `</think>` is hand-written (the sglang issue #37645 shape: the
issue gives counts, not text); the split and tool-call outputs are tests/data/glm53/outputs.json's.

Stock, on every release 0.30.0-0.33.0: the answer comes back as reasoning, content null. Patched: as
content, reasoning null, finish "stop". A `max_tokens` cut, a client's stop string, a real split, a tool
call and another parser's output are what stock gives.
"""

from __future__ import annotations

import json

import pytest

from probes import GLM_PROBE_HEAD, REPO, patches_under_test, probe_fixtures

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

PROBE = GLM_PROBE_HEAD + r'''
import asyncio
from unittest.mock import MagicMock
from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.outputs import CompletionOutput, RequestOutput

TEMPLATE, CASES, TOOLS = json.loads(__ARGS__)
hf = glm_tokenizer(TEMPLATE)


def serving(parser_cls):
    """vLLM's own test construction of the chat server for its full generator (no engine runs here)."""
    s = OpenAIServingChat.__new__(OpenAIServingChat)
    for name, value in {"response_role": "assistant", "parser_cls": parser_cls, "enable_auto_tools": True,
                        "_include_reasoning_tokens_details": False, "enable_prompt_tokens_details": False,
                        "enable_log_outputs": False, "enable_log_deltas": False, "enable_force_include_usage": False,
                        "request_logger": None, "system_fingerprint": None, "enable_per_request_metrics": False,
                        "model_config": None, "chat_template": None, "chat_template_content_format": "auto",
                        "default_chat_template_kwargs": {}, "online_renderer": MagicMock(reasoning_effort_map={})}.items():
        setattr(s, name, value)
    return s


async def complete(case):
    parser_cls = (ParserManager.get_parser(reasoning_parser_name=case["parser"]) if case.get("parser") else GLM_PARSER)
    messages = [{"role": "user", "content": "What is 17 times 23?"}]
    prompt_ids = hf.encode(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)
    stop = case["stop_reason"]
    stop_reason = hf.convert_tokens_to_ids(stop) if stop in GLM_SPECIAL else stop
    output = CompletionOutput(index=0, text=case["text"], token_ids=hf.encode(case["text"], add_special_tokens=False),
                              cumulative_logprob=None, logprobs=None, finish_reason=case["finish"],
                              stop_reason=stop_reason)
    engine_output = RequestOutput(request_id="r", prompt=None, prompt_token_ids=prompt_ids, prompt_logprobs=None,
                                  outputs=[output], finished=True)

    async def results():
        yield engine_output

    request = ChatCompletionRequest(model="glm-5.3", messages=messages, tools=TOOLS if case.get("tools") else None,
                                    include_reasoning=case.get("include_reasoning", True))
    response = await serving(parser_cls).chat_completion_full_generator(
        request, results(), "chatcmpl-r", "glm-5.3", conversation=messages, tokenizer=hf,
        request_metadata=RequestResponseMetadata(request_id="chatcmpl-r"), parser=parser_cls(hf, request.tools))
    choice = response.choices[0]
    return {"reasoning": getattr(choice.message, "reasoning", None), "content": choice.message.content,
            "tool_calls": [json.loads(c.function.arguments) for c in choice.message.tool_calls or []],
            "finish": choice.finish_reason}

print(json.dumps({name: asyncio.run(complete(case)) for name, case in CASES.items()}))
'''.replace("__ARGS__", repr(json.dumps([(DATA / "chat_template.jinja").read_text(), CASES, TOOLS])))

stock, patched = probe_fixtures(PROBE)

AS_REASONING = {"reasoning": ANSWER, "content": None, "tool_calls": [], "finish": "stop"}
AS_CONTENT = {"reasoning": None, "content": ANSWER, "tool_calls": [], "finish": "stop"}


@pytest.mark.parametrize("case", ["eos", "stop-token", "eos-with-tools"])
def test_stock_files_the_answer_as_reasoning(stock, case):
    """The bug on every release: HTTP 200, finish stop, the whole answer in reasoning, content null."""
    assert stock[case] == AS_REASONING


@pytest.mark.parametrize("case", ["eos", "stop-token", "eos-with-tools"])
def test_patched_files_the_answer_as_content(patched, case):
    """The fix: the model itself ended the output with no `</think>`: that text is the answer."""
    assert patched[case] == AS_CONTENT


def test_patched_answers_without_reasoning_requested(stock, patched):
    """`include_reasoning: false`: stock drops the answer with the reasoning (an empty message); patched
    returns it as content."""
    assert stock["eos-include-reasoning-false"]["content"] is None
    assert patched["eos-include-reasoning-false"] == AS_CONTENT


@pytest.mark.parametrize("case", ["max-tokens", "client-stop-string", "split", "empty-answer-after-thinking",
                                  "tool-call", "other-parser"])
def test_every_other_ending_is_unchanged(stock, patched, case):
    """Narrow: a max_tokens cut and a client's stop string are reasoning cut short, a `</think>` means the
    model did split, a tool call is an answer, and another parser is not GLM's: all as stock gives them."""
    assert patched[case] == stock[case]
    if case == "max-tokens":
        assert patched[case] == {**AS_REASONING, "finish": "length"}
    if case == "split":
        assert patched[case] == {"reasoning": SPLIT["reasoning"], "content": SPLIT["content"], "tool_calls": [],
                                 "finish": "stop"}
    if case == "tool-call":
        assert patched[case]["tool_calls"] == [t["arguments"] for t in TOOL_CALL["tool_calls"]]


def test_plan_per_release(vllm_release):
    """Every release in range: the patch applies to the release's own chat server."""
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.sources.directory import DirectorySource

    result = planner.plan([patches_under_test().patch(PATCH_ID)],
                          DirectorySource(installed_package("vllm").parent)).result(PATCH_ID)
    assert result.state == planner.State.NOT_APPLIED, (vllm_release, result.describe())
