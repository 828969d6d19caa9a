"""glm47-tool-args-think-end: a stray `</think>` inside a tool call's arguments is dropped when streaming.

The probe builds the parser as vLLM's chat server does (tests/probes.py GLM_PROBE_HEAD: `--tool-call-parser
glm47 --reasoning-parser glm45 --enable-auto-tool-choice`, a real byte-level tokenizer with GLM's special
tokens, the GLM-5.3-format template of tests/data/glm53) and runs each completion both ways the server
does: `parse` (non-streaming) and `parse_delta` one token per delta (streaming). The completions with a
`</think>` in an argument are hand-written (tests/data/glm53/outputs.json says so): no public GLM-5.3
stream with the token there is recorded.

Stock, on every release 0.30.0-0.34.0: the streamed arguments keep the `</think>` that the parsed ones
drop. Patched: both ways give the same arguments, which parse as JSON; the ordinary outputs split as
recorded.
"""

from __future__ import annotations

import json

import pytest

from probes import GLM_PROBE_HEAD, REPO, patches_under_test, probe_fixtures

pytestmark = pytest.mark.vllm

PATCH_ID = "glm47-tool-args-think-end"
DATA = REPO / "tests" / "data" / "glm53"
RECORDED = json.loads((DATA / "outputs.json").read_text())
IN_ARGUMENTS = [n for n in RECORDED["neighbours"] if "think-in-arguments" in n["id"]]
ORDINARY = RECORDED["outputs"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

PROBE = GLM_PROBE_HEAD + r'''
TEMPLATE, OUTPUTS, TOOLS = json.loads(__ARGS__)
hf = glm_tokenizer(TEMPLATE)
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
prompt_ids = hf.encode(hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)
request = ChatCompletionRequest(model="glm-5.3", messages=messages, tools=TOOLS)
# A request without tools: the engine skips tool parsing, and its tool terminals are then passed on as text.
plain = ChatCompletionRequest(model="glm-5.3", messages=messages)
print(json.dumps({o["id"]: {"parse": glm_parse(GLM_PARSER(hf, request.tools), hf, o["text"], request),
                            "stream": glm_stream(GLM_PARSER(hf, request.tools), hf, o["text"], request, prompt_ids),
                            **{f"stream-without-tools-{n}": glm_stream(GLM_PARSER(hf, None), hf, o["text"], plain,
                                                                       prompt_ids, chunk=n) for n in (1, 3, 1000)}}
                  for o in OUTPUTS}))
'''.replace("__ARGS__", repr(json.dumps([(DATA / "chat_template.jinja").read_text(), IN_ARGUMENTS + ORDINARY, TOOLS])))

stock, patched = probe_fixtures(PROBE)


def _arguments(result: dict) -> list[dict]:
    return [json.loads(c["arguments"]) for c in result["tool_calls"]]


@pytest.mark.parametrize("output", IN_ARGUMENTS, ids=[o["id"] for o in IN_ARGUMENTS])
def test_stock_streams_the_think_end_into_the_arguments(stock, output):
    """The bug on every release: streaming keeps `</think>` in the value, the non-streaming parse drops it."""
    case = stock[output["id"]]
    assert _arguments(case["parse"]) == [output["arguments"]]
    streamed = _arguments(case["stream"])
    assert streamed != [output["arguments"]]
    assert "</think>" in streamed[0]["city"]


@pytest.mark.parametrize("output", IN_ARGUMENTS, ids=[o["id"] for o in IN_ARGUMENTS])
def test_patched_streams_the_arguments_the_parse_gives(patched, output):
    """The fix: streamed and parsed arguments are the same JSON, without `</think>`; the reasoning before
    the call is split as before."""
    case = patched[output["id"]]
    assert _arguments(case["stream"]) == _arguments(case["parse"]) == [output["arguments"]]
    assert case["stream"]["reasoning"] == case["parse"]["reasoning"] == output["reasoning"]
    assert [c["name"] for c in case["stream"]["tool_calls"]] == ["get_weather"]


@pytest.mark.parametrize("output", ORDINARY, ids=[o["id"] for o in ORDINARY])
def test_ordinary_outputs_split_as_recorded(stock, patched, output):
    """Narrow: outputs without a stray `</think>` split exactly as on stock, both ways."""
    for way in ("parse", "stream"):
        assert patched[output["id"]][way]["reasoning"] == stock[output["id"]][way]["reasoning"] == output["reasoning"]
        assert patched[output["id"]][way]["content"] == output["content"], way
        assert _arguments(patched[output["id"]][way]) == [t["arguments"] for t in output.get("tool_calls", [])], way


def test_plan_per_release(vllm_release):
    """Every release in range: the patch applies to the release's own glm47_moe.py."""
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.sources.directory import DirectorySource

    result = planner.plan([patches_under_test().patch(PATCH_ID)],
                          DirectorySource(installed_package("vllm").parent)).result(PATCH_ID)
    assert result.state == planner.State.NOT_APPLIED, (vllm_release, result.describe())


@pytest.mark.parametrize("output", [o for o in ORDINARY if not o.get("tool_calls")],
                         ids=[o["id"] for o in ORDINARY if not o.get("tool_calls")])
def test_reasoning_end_is_no_content_without_tools(stock, patched, output):
    """Narrow, where vLLM's own tests caught the patch's first form (issue 30): a streamed request without
    tools keeps the reasoning's `</think>` out of the content, as on stock (a (TOOL_ARGS, THINK_END)
    transition made `</think>` a tool terminal, which the engine passes on as text when it skips tools, in a
    delta of several tokens: 1, 3 and the whole completion at once)."""
    for tree in (stock, patched):
        for n in (1, 3, 1000):
            case = tree[output["id"]][f"stream-without-tools-{n}"]
            assert (case["reasoning"], case["content"]) == (output["reasoning"], output["content"]), n
