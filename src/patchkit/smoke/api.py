"""The served API as the hardware smoke exercises it: /health polled (not /v1/models, which answers 200
while the engine is dead), one chat completion with low reasoning effort and `max_tokens` >= 256, and a
corruption probe (U+FFFD in the replies to a Hangul/CJK prompt), and the serving probes (serving.py: the
reasoning split and tool calls as a client reads them). Every answer is read bounded."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson
from patchkit.smoke.serving import PROBE_MAX_TOKENS, PROBES, REPLACEMENT, first_choice, judge_completion, request_body
from patchkit.untrusted import InputTooLarge, read_stream

MIN_MAX_TOKENS = PROBE_MAX_TOKENS  # the least budget a chat may ask for (serving.py says why)
CHAT_PROMPT = "Reply with one short sentence: what is 17 times 3?"
# Hangul and CJK: a broken byte-level detokenizer or a corrupt expert shows up as U+FFFD here first.
PROBE_PROMPT = "다음 문장을 한국어와 중국어로 각각 한 번씩 번역하세요: 'The river is quiet tonight.' 请只输出两句译文。"


@dataclass
class Health:
    ok: bool
    seconds: float
    attempts: int
    last: str


def wait_healthy(
    base_url: str,
    deadline_s: float,
    interval_s: float = 5.0,
    alive: Callable[[], bool] = lambda: True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Health:
    """Poll GET /health until 200, the deadline, or `alive()` saying the engine is gone."""
    start = clock()
    attempts, last = 0, "not polled"
    while clock() - start < deadline_s:
        attempts += 1
        try:
            with requests.get(f"{base_url}/health", timeout=max(1.0, interval_s), stream=True) as response:
                pass  # the status is the answer: its body is never read
            if response.status_code == 200:
                return Health(True, clock() - start, attempts, "200")
            last = f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            last = type(exc).__name__
        if not alive():
            return Health(False, clock() - start, attempts, f"{last}; the container exited")
        sleep(interval_s)
    return Health(False, clock() - start, attempts, f"{last}; deadline {deadline_s:.0f} s passed")


@dataclass(frozen=True)
class Failed:
    error: str
    seconds: float


def _post_chat(base_url: str, body: dict, timeout: float) -> tuple[int, bytes, float] | Failed:
    """POST one chat completion; its answer read bounded (the api-answer limit, as decoded)."""
    start = time.monotonic()
    url = f"{base_url}/v1/chat/completions"
    try:
        with requests.post(url, json=body, timeout=timeout, stream=True) as response:
            response.raw.decode_content = True  # a compressed answer is bounded as decoded, not as sent
            data = read_stream(response.raw, "api-answer", url)
    except requests.RequestException as exc:  # the engine died or stalled after /health answered
        return Failed(f"no answer: {type(exc).__name__}", time.monotonic() - start)
    except InputTooLarge as exc:
        return Failed(str(exc), time.monotonic() - start)
    return response.status_code, data, time.monotonic() - start


def _answered(base_url: str, body: dict, timeout: float) -> tuple[bytes, float] | dict:
    """A 200 answer's bytes and seconds; else the failed probe's dict (no answer, or the HTTP status with
    the first 500 characters the server said)."""
    posted = _post_chat(base_url, body, timeout)
    if isinstance(posted, Failed):
        return {"ok": False, "error": posted.error, "seconds": posted.seconds}
    status, data, seconds = posted
    if status != 200:
        return {"ok": False, "error": f"HTTP {status}: {data.decode('utf-8', 'replace')[:500]}", "seconds": seconds}
    return data, seconds


def serving_probes(base_url: str, model: str, timeout: float = 600) -> dict[str, dict]:
    """Each of smoke/serving.py's PROBES sent once, its answer judged as a client reads it (reasoning split,
    tool-call arguments, U+FFFD): probe name -> the check's dict (`ok`, counts, findings) or the error."""
    out = {}
    for name, request in PROBES.items():
        answered = _answered(base_url, {"model": model, **request}, timeout)
        if isinstance(answered, dict):
            out[name] = answered
            continue
        data, seconds = answered
        try:
            check = judge_completion(data, name, f"the {name} probe's answer")
        except PatchkitError as exc:  # not a chat completion: the probe failed, the run goes on
            out[name] = {"ok": False, "error": str(exc), "seconds": seconds}
            continue
        out[name] = {**check.to_dict(), "seconds": seconds}
    return out


def chat(base_url: str, model: str, prompt: str, max_tokens: int = MIN_MAX_TOKENS, timeout: float = 600) -> dict:
    """One chat completion with low reasoning effort (other values select MAX effort, field records "The 4p67 recipe")."""
    if max_tokens < MIN_MAX_TOKENS:
        raise PatchkitError(f"max_tokens must be >= {MIN_MAX_TOKENS}: reasoning can use up a shorter budget (a "
                            "patchkit bug: please report it; every probe asks for more)")
    body = {"model": model, **request_body(prompt, max_tokens, chat_template_kwargs={"reasoning_effort": "low"})}
    answered = _answered(base_url, body, timeout)
    if isinstance(answered, dict):
        return answered
    data, seconds = answered
    try:
        choice = first_choice(data, "the chat answer")  # the serving probes' schema
    except MalformedJson as exc:
        return {"ok": False, "error": f"not a chat completion: {exc}", "seconds": seconds}
    content = choice.message.content or ""
    return {
        "ok": bool(content),
        "error": "" if content else f"empty content (finish_reason {choice.finish_reason})",
        "content": content,
        "reasoning": choice.message.reasoning_text,
        "finish_reason": choice.finish_reason,
        "seconds": seconds,
    }


def corruption_probe(base_url: str, model: str, runs: int = 3) -> dict:
    """Count U+FFFD in replies to a Hangul/CJK prompt; any replacement character fails the probe."""
    counts, errors = [], []
    for _ in range(runs):
        reply = chat(base_url, model, PROBE_PROMPT, max_tokens=512)
        if not reply["ok"] and "content" not in reply:
            errors.append(reply["error"])
            continue
        counts.append((reply["content"] + reply["reasoning"]).count(REPLACEMENT))
    return {"runs": runs, "replacement_chars": counts, "errors": errors, "ok": not errors and len(counts) == runs and not any(counts)}
