"""glm53-always-think: a client's `enable_thinking: false` no longer leaks GLM-5.3's scratchpad into content.

One probe per tree builds the parser exactly as vLLM's chat server does (`ParserManager.get_parser` with
`--tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice`, constructed with the
request's tools and chat_template_kwargs) and runs it on recorded GLM-5.3 completions
(tests/data/glm53/outputs.json: two quoted from public issues/PRs, one hand-written tool call) both ways
the server does: `parse` (non-streaming) and `parse_delta` one token per delta with the rendered prompt's
token ids (streaming). The tokenizer is a real `tokenizers` byte-level tokenizer with GLM's special
tokens as added tokens; its chat template is a GLM-5.3-format template (hand-written, marked, in
tests/data/glm53/chat_template.jinja), rendered by transformers. A GLM-4.5-style template that has the
switch is the control: there `enable_thinking: false` keeps switching extraction off.

On 0.30.0 and 0.31.0 stock mis-splits and patched splits. From 0.32.0 the release carries vLLM's own
fix (the patch is upstreamed there), which the same outputs check; the patch itself is then checked on
the day-0 base's parser (0.30.0's glm47_moe.py, read from its sdist through patchkit's cache, put into a
hard-linked copy of the release and patched as an image build does): it mis-splits without the patch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from packaging.version import Version

from conftest import VllmTree
from probes import GLM_PROBE_HEAD, REPO, patches_under_test, probe_fixtures

pytestmark = pytest.mark.vllm

PATCH_ID = "glm53-always-think"
DATA = REPO / "tests" / "data" / "glm53"
RECORDED = json.loads((DATA / "outputs.json").read_text())
OUTPUTS, NEIGHBOURS = RECORDED["outputs"], RECORDED["neighbours"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# A GLM-4.5-style template (hand-written control): the switch exists, so the kwarg must keep working.
GLM45_TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
                  "<think></think>{% endif %}{% endif %}{# <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call> #}")
KWARGS = {"ordinary": None, "enable_thinking=false": {"enable_thinking": False}, "thinking=false": {"thinking": False}}

PROBE = GLM_PROBE_HEAD + r'''
TEMPLATES, OUTPUTS, NEIGHBOURS, TOOLS, KWARGS = json.loads(__ARGS__)
tokenizer = glm_tokenizer
Parser = GLM_PARSER
Reasoning = ParserManager.get_reasoning_parser("glm45")
out = {}
for tname, template in TEMPLATES.items():
    hf = tokenizer(template)
    for kname, kwargs in KWARGS.items():
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        prompt = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, **(kwargs or {}))
        prompt_ids = hf.encode(prompt, add_special_tokens=False)
        request = ChatCompletionRequest(model="glm-5.3", messages=messages, tools=TOOLS, chat_template_kwargs=kwargs)
        case = out.setdefault(tname, {}).setdefault(kname, {"prompt_tail": prompt[-40:]})
        case["reasoning_end_at_prompt"] = Reasoning(hf, chat_template_kwargs=kwargs).is_reasoning_end(prompt_ids)
        for o in OUTPUTS + NEIGHBOURS:
            case[o["id"]] = {"parse": glm_parse(Parser(hf, request.tools, chat_template_kwargs=kwargs), hf, o["text"], request),
                             "stream": glm_stream(Parser(hf, request.tools, chat_template_kwargs=kwargs), hf, o["text"],
                                                  request, prompt_ids)}
print(json.dumps(out))
'''.replace("__ARGS__", repr(json.dumps([
    {"glm53": (DATA / "chat_template.jinja").read_text(), "glm45": GLM45_TEMPLATE}, OUTPUTS, NEIGHBOURS, TOOLS, KWARGS])))

stock, patched = probe_fixtures(PROBE)


def _patch():
    return patches_under_test().patch(PATCH_ID)


def _release_has_fix() -> bool:
    """The installed release's own parser carries vLLM PR #56994 (what the [upstreamed] probe reads)."""
    from patchkit.patching.copies import installed_package

    return "def _glm53_always_thinks(" in (installed_package("vllm") / "parser" / "glm47_moe.py").read_text()


@pytest.fixture(scope="module")
def day0(tmp_path_factory, patched):
    """The probe on the day-0 base's parser with the patch applied (unless PATCHKIT_TEST_EXCLUDE names it):
    on a release without the fix that is the patched tree; on one with it, a hard-linked copy of the
    release whose parser/glm47_moe.py is 0.30.0's (the base's code), patched with the layout declared
    as the images declare it (0.30.0)."""
    if not _release_has_fix():
        return patched
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.patching.tree import write_plan
    from patchkit.sources import open_source
    from patchkit.sources.directory import DirectorySource

    site = tmp_path_factory.mktemp("day0-site")
    shutil.copytree(installed_package("vllm"), site / "vllm", copy_function=os.link,
                    ignore=shutil.ignore_patterns("__pycache__"))
    parser = site / "vllm" / "parser" / "glm47_moe.py"
    parser.unlink()  # a hard link: unlink, never write through to the install
    parser.write_bytes(open_source("vllm==0.30.0").read("vllm", "parser/glm47_moe.py"))
    excluded = PATCH_ID in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",")
    source = DirectorySource(site)
    plan = planner.plan([] if excluded else [_patch()], source, versions={"vllm": "0.30.0"})
    plan.raise_for_errors()
    write_plan(site, source, plan)
    return VllmTree(root=site, python=sys.executable).run(PROBE)


def _split(result: dict) -> dict:
    """What a client reads: reasoning, content, and each tool call with its arguments parsed as JSON."""
    calls = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in result["tool_calls"]]
    return {"reasoning": result["reasoning"], "content": result["content"], "tool_calls": calls}


def _expected(output: dict) -> dict:
    return {"reasoning": output["reasoning"], "content": output["content"], "tool_calls": output.get("tool_calls", [])}


def test_template_is_glm53_shaped(patched):
    """The fixture template renders as GLM-5.3's does: the prompt opens <think> whatever the kwargs."""
    for kwargs in KWARGS:
        assert patched["glm53"][kwargs]["prompt_tail"].endswith("<|assistant|><think>"), kwargs
    assert "enable_thinking" not in (DATA / "chat_template.jinja").read_text()


@pytest.mark.parametrize("output", OUTPUTS, ids=[o["id"] for o in OUTPUTS])
def test_ordinary_request_splits_on_every_release(stock, patched, output):
    """The baseline the fix restores: with no kwarg, reasoning and content split as recorded."""
    for tree in (stock, patched):
        for way in ("parse", "stream"):
            assert _split(tree["glm53"]["ordinary"][output["id"]][way]) == _expected(output), way


@pytest.mark.parametrize("kwarg", ["enable_thinking=false", "thinking=false"])
@pytest.mark.parametrize("output", OUTPUTS, ids=[o["id"] for o in OUTPUTS])
def test_disable_kwarg_still_splits_glm53_output(stock, patched, output, kwarg):
    """Patched (or a release with vLLM's fix): the same split as an ordinary request, streaming and not.
    Stock without the fix: reasoning null, the scratchpad in content (vllm issue #54744)."""
    for way in ("parse", "stream"):
        assert _split(patched["glm53"][kwarg][output["id"]][way]) == _expected(output), way
        got = _split(stock["glm53"][kwarg][output["id"]][way])
        if not _release_has_fix():
            assert got["reasoning"] is None, (way, got)
            assert got["content"].startswith(output["reasoning"]), (way, got)
        else:
            assert got == _expected(output), way


@pytest.mark.network
@pytest.mark.parametrize("kwarg", ["enable_thinking=false", "thinking=false"])
def test_day0_base_parser_splits_with_the_patch(day0, kwarg):
    """What every image's base runs: its parser, patched, splits each recorded output right."""
    for output in OUTPUTS:
        for way in ("parse", "stream"):
            assert _split(day0["glm53"][kwarg][output["id"]][way]) == _expected(output), (output["id"], way)
    assert day0["glm53"][kwarg]["reasoning_end_at_prompt"] is False


@pytest.mark.parametrize("kwarg", ["enable_thinking=false", "thinking=false"])
def test_reasoning_not_ended_at_the_prompt(stock, patched, kwarg):
    """The prompt ends in an open <think>: reasoning has not ended (stock in range says it has, so a
    structured-output constraint would apply to the scratchpad)."""
    assert patched["glm53"][kwarg]["reasoning_end_at_prompt"] is False
    assert patched["glm53"]["ordinary"]["reasoning_end_at_prompt"] is False
    assert stock["glm53"][kwarg]["reasoning_end_at_prompt"] is not _release_has_fix()


def test_glm45_style_template_keeps_its_switch(stock, patched):
    """Narrow: a template that has the switch still gets extraction off with enable_thinking=false."""
    output = OUTPUTS[0]
    for tree in (stock, patched):
        case = tree["glm45"]["enable_thinking=false"]
        assert case["prompt_tail"].endswith("<|assistant|><think></think>")
        assert case["reasoning_end_at_prompt"] is True
        assert case[output["id"]]["parse"]["reasoning"] is None
        assert _split(tree["glm45"]["ordinary"][output["id"]]["parse"]) == _expected(output)


def test_skipped_thinking_is_reasoning_to_the_parser(stock, patched):
    """Settled, not changed here: on every release the parser alone files an answer without `</think>`
    as reasoning (it cannot see the finish reason). glm53-skipped-thinking re-files it in the chat
    server, where the finish reason is known (tests/patches/test_glm53_skipped_thinking.py); a
    `</think>` inside tool-call arguments is glm47-tool-args-think-end's (its own test module)."""
    skipped = NEIGHBOURS[0]
    for tree, kwargs in ((stock, ["ordinary"]), (patched, ["ordinary", "enable_thinking=false"])):
        for kwarg in kwargs:
            for way in ("parse", "stream"):
                got = _split(tree["glm53"][kwarg][skipped["id"]][way])
                assert got == {"reasoning": skipped["text"], "content": None, "tool_calls": []}, (kwarg, way)


def test_plan_per_release(vllm_release):
    """0.30.0 and 0.31.0: the patch applies to the release's own file. 0.32.0 on: the unpatched file
    holds upstream's `_glm53_always_thinks` and the probe marks the patch upstreamed."""
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.sources.directory import DirectorySource

    installed = installed_package("vllm")
    result = planner.plan([_patch()], DirectorySource(installed.parent)).result(PATCH_ID)
    if vllm_release < Version("0.32.0"):
        assert result.state == planner.State.NOT_APPLIED, result.describe()
        assert not _release_has_fix()
    else:
        assert result.state == planner.State.UPSTREAMED, result.describe()
        assert _release_has_fix(), vllm_release
