"""Serving correctness: what a client sees in one chat completion, judged on the response alone.

An engine that boots and answers 200 can still hand clients a bad split of GLM-5.3's output. The
serving probes (`PROBES`: a request with `enable_thinking: false`, one with `reasoning_effort: low` and
`max_tokens` 256, one tool call for the `glm47` tool parser, sent once whole and once streamed) are
the requests that show each known mis-split; `judge_completion` reads the response body of each and records, per probe, what the
receipt keeps: `<think>`/`</think>` in `content` (vllm issue #54744), reasoning that swallowed the
answer (content empty on a `stop` finish, sglang issue #37645), tool arguments that are not a JSON
object or carry `</think>` (vllm-ascend #16592), and the U+FFFD count. A reply cut at `max_tokens`
with no content is a spent budget, not a mis-split: a warning.

Pure: no I/O. The body is outside input, decoded against a msgspec schema of the fields judged (a wrong
shape is `MalformedJson`, exit 2, with the JSON path; a streamed one chunk by chunk, assembled as a
client assembles it); the caller reads it bounded. smoke/api.py's plain chat reads its answer through the
same schema (`first_choice`) and sends the same request shape (`request_body`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Annotated

import msgspec

from patchkit.bootlog.judge import Finding
from patchkit.jsondata import MalformedJson, decode
from patchkit.patching.fixed_by import fixed_by

THINK_TAGS = ("<think>", "</think>")
REPLACEMENT = "\ufffd"
PROBE_MAX_TOKENS = 256  # field records "Measured recipes": max_tokens 48 can end in content null, finish "length"
# The mis-splits a patch fixes, by the name its patch.toml gives them (`fixes`): the finding prints the
# patches that declare it (patching/fixed_by.py).
THINK_TAGS_IN_CONTENT = "think-tags-in-content"
REASONING_SWALLOWED_ANSWER = "reasoning-swallowed-answer"
THINK_TAGS_IN_TOOL_ARGUMENTS = "think-tags-in-tool-arguments"
PATCHED_FINDINGS = (THINK_TAGS_IN_CONTENT, REASONING_SWALLOWED_ANSWER, THINK_TAGS_IN_TOOL_ARGUMENTS)
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def request_body(prompt: str, max_tokens: int = PROBE_MAX_TOKENS, **extra) -> dict:
    """A chat completion request without "model" (the caller adds the served name)."""
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0, **extra}


# Request bodies without "model" (the smoke adds the served name). enable_thinking is a GLM-4.5-era
# switch GLM-5.3's template ignores: the model still reasons, and the split must still hold.
PROBES = {
    "enable-thinking-false": request_body("What is 17 times 23? Answer with the number.",
                                          chat_template_kwargs={"enable_thinking": False}),
    "reasoning-effort-low": request_body("What is 17 times 23? Answer with the number.",
                                         chat_template_kwargs={"reasoning_effort": "low"}),
    "tool-call": request_body("What is the weather in Paris right now? Use the tool.", 512,
                              tools=[TOOL], tool_choice="auto", chat_template_kwargs={"reasoning_effort": "low"}),
}
# The tool call streamed: the streaming parser gives arguments of its own (a `</think>` kept inside them,
# THINK_TAGS_IN_TOOL_ARGUMENTS below), judged on the chunks assembled as a client assembles them.
PROBES["tool-call-streamed"] = {**PROBES["tool-call"], "stream": True}


class _Function(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class _ToolCall(msgspec.Struct):
    function: _Function


class Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # what newer vLLM names the same field
    tool_calls: list[_ToolCall] = []

    @property
    def reasoning_text(self) -> str:
        return self.reasoning_content or self.reasoning or ""


class Choice(msgspec.Struct):
    message: Message
    finish_reason: str | None = None


class _Completion(msgspec.Struct):
    choices: Annotated[list[Choice], msgspec.Meta(min_length=1)]


class _DeltaFunction(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _DeltaToolCall(msgspec.Struct):
    index: int = 0
    function: _DeltaFunction | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_DeltaToolCall] = []


class _ChunkChoice(msgspec.Struct):
    delta: _Delta
    index: int = 0
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_ChunkChoice] = []  # the usage chunk has none


def _assembled(body: bytes, what: str) -> _Completion:
    """A streamed answer (server-sent events: `data: <chunk>` lines, then `data: [DONE]`) as the one
    completion a client assembles from the first choice's deltas. Each chunk is decoded against the
    schema (a wrong shape is `MalformedJson` naming the event line); a stream with no chunk is one too."""
    content, reasoning, finish = "", "", None
    calls: dict[int, _Function] = {}
    chunks = 0
    for n, line in enumerate(body.splitlines(), 1):
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, `event:`/`id:` fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunks += 1
        for choice in decode(payload, _Chunk, f"{what}, event line {n}").choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            content += delta.content or ""
            reasoning += delta.reasoning_content or delta.reasoning or ""
            for call in delta.tool_calls:
                slot = calls.setdefault(call.index, _Function())
                if call.function is not None:
                    slot.name += call.function.name or ""
                    slot.arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    if not chunks:
        raise MalformedJson(what, "a stream with no `data:` chunk before `data: [DONE]`")
    message = Message(content=content or None, reasoning=reasoning or None,
                       tool_calls=[_ToolCall(function=f) for _, f in sorted(calls.items())])
    return _Completion(choices=[Choice(message=message, finish_reason=finish)])


@dataclass(frozen=True)
class ToolCallCheck:
    name: str
    arguments_json: bool  # the arguments parse as a JSON object
    think_tags: int  # <think>/</think> inside the arguments


@dataclass
class ServingCheck:
    """One probe's response as a client reads it, and the findings on it."""

    probe: str
    finish_reason: str | None
    content_chars: int
    reasoning_chars: int
    think_tags_in_content: int
    reasoning_swallowed_answer: bool
    tool_calls: list[ToolCallCheck]
    replacement_chars: int
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.level == "fail" for f in self.findings)

    def to_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def _tool_call(call: _ToolCall) -> ToolCallCheck:
    try:
        parsed = json.loads(call.function.arguments)
    except (ValueError, RecursionError):
        parsed = None
    tags = sum(call.function.arguments.count(t) for t in THINK_TAGS)
    return ToolCallCheck(call.function.name, isinstance(parsed, dict), tags)


def first_choice(body: bytes, what: str, *, streamed: bool = False) -> Choice:
    """The first choice of a chat completion response `body` (bytes named `what`; `streamed`: server-sent
    chunks, assembled), decoded against the schema: a wrong shape is MalformedJson with its JSON path."""
    return (_assembled(body, what) if streamed else decode(body, _Completion, what)).choices[0]


def judge_completion(body: bytes, probe: str, what: str) -> ServingCheck:
    """The first choice of a chat completion response `body` (bytes named `what`), judged for `probe`."""
    if probe not in PROBES:
        raise ValueError(f"unknown serving probe {probe!r}")  # a caller's bug, never outside input
    choice = first_choice(body, what, streamed=bool(PROBES[probe].get("stream")))
    message = choice.message
    content = message.content or ""
    reasoning = message.reasoning_text
    calls = [_tool_call(c) for c in message.tool_calls]
    args = "".join(c.function.arguments for c in message.tool_calls)
    check = ServingCheck(
        probe=probe,
        finish_reason=choice.finish_reason,
        content_chars=len(content),
        reasoning_chars=len(reasoning),
        think_tags_in_content=sum(content.count(t) for t in THINK_TAGS),
        reasoning_swallowed_answer=not content.strip() and bool(reasoning.strip()) and not calls
        and choice.finish_reason == "stop",
        tool_calls=calls,
        replacement_chars=(content + reasoning + args).count(REPLACEMENT),
    )
    check.findings = _findings(check)
    return check


def _findings(c: ServingCheck) -> list[Finding]:
    out = []
    if c.think_tags_in_content:
        out.append(Finding("fail", "reasoning split", f"{c.think_tags_in_content} <think>/</think> tag(s) in content: "
                           f"the reasoning leaked into the answer (vllm issue #54744; patch {fixed_by(THINK_TAGS_IN_CONTENT)})"))
    if c.reasoning_swallowed_answer:
        out.append(Finding("fail", "reasoning split", f"content empty on a 'stop' finish with {c.reasoning_chars} "
                           "characters of reasoning: the answer was returned as reasoning (sglang issue #37645; patch "
                           f"{fixed_by(REASONING_SWALLOWED_ANSWER)})"))
    elif not c.content_chars and not c.tool_calls and c.finish_reason == "length":
        out.append(Finding("warn", "token budget", "no content: max_tokens ran out while the model reasoned "
                           f"(finish 'length'); the probes send {PROBE_MAX_TOKENS}"))
    if c.probe.startswith("tool-call"):
        if not c.tool_calls:
            out.append(Finding("fail", "tool call", f"no tool call in the answer (finish {c.finish_reason!r})"))
        for call in c.tool_calls:
            if not call.arguments_json:
                out.append(Finding("fail", "tool call", f"{call.name}: arguments are not a JSON object"))
            if call.think_tags:
                out.append(Finding("fail", "tool call", f"{call.name}: {call.think_tags} <think>/</think> tag(s) inside "
                                   f"the arguments (vllm-ascend #16592; patch {fixed_by(THINK_TAGS_IN_TOOL_ARGUMENTS)})"))
    if c.replacement_chars:
        out.append(Finding("fail", "corruption", f"{c.replacement_chars} U+FFFD in the reply"))
    if not any(f.level == "fail" for f in out):
        out.append(Finding("ok", "serving", f"{c.probe}: content {c.content_chars} chars, reasoning {c.reasoning_chars}, "
                           f"{len(c.tool_calls)} tool call(s), finish {c.finish_reason!r}"))
    return out
