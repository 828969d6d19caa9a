"""Hardware smoke harness: `patchkit smoke VARIANT --host HOST [--host WORKER]`.

Starts the variant's serve command in the image on each host through the Docker API (the docker SDK;
`ssh://user@host` reaches a host's own daemon), polls `/health` (not `/v1/models`, which answers 200
while the engine is dead), reads the boot markers from the head's log, sends a chat completion with
`chat_template_kwargs: {"reasoning_effort": "low"}` and `max_tokens` >= 256, runs a corruption probe
(U+FFFD in the output of a Hangul/CJK prompt), lets vLLM log its SpecDecoding acceptance, judges the
head's log (smoke/judge.py: markers from smoke/markers.py, fatal causes from smoke/causes.py) and
writes a JSON receipt naming the cause of a failed boot with the line that showed it.

Unlike `patchkit doctor`, which has only a recorded log, the smoke knows whether the containers are
still running when /health gives up: a log that stops without an error line is then either a boot
still in progress at the deadline (`still-booting`) or one killed from outside (`ended-without-error`,
with the phase it reached), never confused.

NOT RUN ON HARDWARE HERE: these machines have no GPU and no Docker engine. The log parsing, the
decisions, the HTTP exchanges and the receipt are tested on CPU with recorded boot logs and a real
HTTP server on 127.0.0.1; `DockerRunner` itself has not started a container.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import requests

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.variants.definitions import Variant
from patchkit.variants.serve import ServeCommand
from patchkit.variants.smoke.causes import find_causes
from patchkit.variants.smoke.judge import Finding, judge_log

QUANTPROBE_PATCH = "quantprobe"  # the opt-in patch printing [quantprobe] lines when PATCHKIT_QUANTPROBE=1

MIN_MAX_TOKENS = 256  # field records "Measured recipes": max_tokens 48 can end in content null, finish "length"
CHAT_PROMPT = "Reply with one short sentence: what is 17 times 3?"
# Hangul and CJK: a broken byte-level detokenizer or a corrupt expert shows up as U+FFFD here first.
PROBE_PROMPT = "다음 문장을 한국어와 중국어로 각각 한 번씩 번역하세요: 'The river is quiet tonight.' 请只输出两句译文。"
REPLACEMENT = "\ufffd"

# ---------------------------------------------------------------- HTTP


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
            response = requests.get(f"{base_url}/health", timeout=max(1.0, interval_s))
            if response.status_code == 200:
                return Health(True, clock() - start, attempts, "200")
            last = f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            last = type(exc).__name__
        if not alive():
            return Health(False, clock() - start, attempts, f"{last}; the container exited")
        sleep(interval_s)
    return Health(False, clock() - start, attempts, f"{last}; deadline {deadline_s:.0f} s passed")


def chat(base_url: str, model: str, prompt: str, max_tokens: int = MIN_MAX_TOKENS, timeout: float = 600) -> dict:
    """One chat completion with low reasoning effort (other values select MAX effort, field records "The 4p67 recipe")."""
    if max_tokens < MIN_MAX_TOKENS:
        raise PatchkitError(f"max_tokens must be >= {MIN_MAX_TOKENS}: reasoning can use up a shorter budget")
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"reasoning_effort": "low"},
    }
    start = time.monotonic()
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=timeout)
    seconds = time.monotonic() - start
    if response.status_code != 200:
        return {"ok": False, "error": f"HTTP {response.status_code}: {response.text[:500]}", "seconds": seconds}
    try:
        choice = response.json()["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return {"ok": False, "error": f"not a chat completion: {response.text[:500]}", "seconds": seconds}
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    return {
        "ok": bool(content),
        "error": "" if content else f"empty content (finish_reason {choice.get('finish_reason')})",
        "content": content,
        "reasoning": reasoning,
        "finish_reason": choice.get("finish_reason"),
        "usage": response.json().get("usage"),
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


# ---------------------------------------------------------------- containers


class Runner(Protocol):
    """One container on one host."""

    host: str

    def start(self, image: str, argv: tuple[str, ...], env: dict[str, str], name: str) -> None: ...
    def running(self) -> bool: ...
    def logs(self) -> str: ...
    def image_digest(self) -> str | None: ...
    def stop(self) -> None: ...


def host_name(host: str) -> str:
    """The machine a Docker host URL names: `ssh://user@spark-1:22` -> `spark-1`."""
    return host.split("://")[-1].split("@")[-1].split(":")[0]


class DockerRunner:
    """A container through the Docker API of `host` (`ssh://user@spark1`, `unix:///...`, `tcp://...`).

    GPU access, host networking and IPC (NCCL across the two Sparks), 32 GB of shm as the recipes use,
    the Hugging Face cache mounted read-only. The container is kept after exit: its log is the evidence
    (field records "Measured recipes" lost a failed boot's logs to --rm). Never run on hardware here."""

    def __init__(self, host: str, hf_cache: str, shm_size: str = "32g") -> None:
        import docker

        self.host = host
        self.hf_cache = hf_cache
        self.shm_size = shm_size
        self.client = docker.DockerClient(base_url=host, use_ssh_client=host.startswith("ssh://"))
        self.container = None
        self.image = ""

    def start(self, image: str, argv: tuple[str, ...], env: dict[str, str], name: str) -> None:
        import docker

        self.image = image
        self.container = self.client.containers.run(
            image,
            entrypoint=[argv[0]],
            command=list(argv[1:]),
            environment=env,
            name=name,
            detach=True,
            network_mode="host",
            ipc_mode="host",
            shm_size=self.shm_size,
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])],
            volumes={self.hf_cache: {"bind": "/root/.cache/huggingface", "mode": "ro"}},
        )

    def running(self) -> bool:
        self.container.reload()
        return self.container.status in ("created", "running")

    def logs(self) -> str:
        return self.container.logs().decode("utf-8", "replace")

    def image_digest(self) -> str | None:
        attrs = self.client.images.get(self.image).attrs
        return (attrs.get("RepoDigests") or [None])[0] or attrs.get("Id")

    def stop(self) -> None:
        if self.container is not None:
            self.container.stop(timeout=30)


# ---------------------------------------------------------------- the smoke


@dataclass
class Receipt:
    variant: str
    image: str
    image_digests: dict[str, str | None]
    hosts: list[str]
    argv: list[str]
    started_at: str
    timings: dict
    cause: dict | None  # the fatal cause with the line that showed it (None: the engine did not die)
    verdict: dict  # the judgement of the head's log (markers, causes, speculative decoding)
    findings: list[dict]
    chat: dict | None
    probe: dict | None
    ok: bool
    attempts: int = 1
    hardware: bool = True
    patchkit: str = __version__

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    def __rich__(self):
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"smoke {self.variant}: {'PASSED' if self.ok else 'FAILED'}")
        for col in ("level", "what", "detail"):
            table.add_column(col)
        colour = {"fail": "red", "warn": "yellow", "ok": "green"}
        for f in self.findings:
            table.add_row(f"[{colour[f['level']]}]{f['level']}[/]", f["what"], escape(f["detail"]))
        return table


def _start(runners: list[Runner], image: str, command: ServeCommand, env: dict[str, str], name: str, master: str) -> None:
    nnodes = len(runners)
    for rank, runner in sorted(enumerate(runners), key=lambda r: -r[0]):  # workers first, head last
        runner.start(image, command.for_node(rank, nnodes, master), env, f"{name}-{rank}")


def run_smoke(
    variant: Variant,
    command: ServeCommand,
    image: str,
    runners: list[Runner],
    base_url: str,
    health_interval_s: float = 5.0,
    probe_runs: int = 3,
    keep: bool = False,
    master_addr: str | None = None,
    quantprobe: bool | None = None,
    metrics_wait_s: float = 15.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Receipt:
    """Boot, exercise the endpoint, judge the head's log, stop, and return the receipt (ok or not).

    `quantprobe`: the image carries the quantprobe patch (then PATCHKIT_QUANTPROBE=1 is set and its lines
    are required). A boot that dies of a transient cause (the launcher's occupancy race) is retried once."""
    if not command.complete:
        raise PatchkitError(f"the serve command for {variant.name} is incomplete: {'; '.join(command.pending)}")
    if not runners:
        raise PatchkitError("no host to run on")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    head = runners[0]
    # The head's address for the other nodes' NCCL rendezvous: its hostname unless given.
    master = master_addr or host_name(head.host)
    env = {**command.env, **({"PATCHKIT_QUANTPROBE": "1"} if quantprobe else {})}
    name = f"patchkit-smoke-{variant.name}"
    t0 = time.monotonic()
    attempts = 1
    reply = probe = None
    try:
        _start(runners, image, command, env, name, master)
        while True:
            health = wait_healthy(
                base_url, variant.expect.boot_timeout_s, health_interval_s,
                alive=lambda: all(r.running() for r in runners) and not any(c.definitive for c in find_causes(head.logs())),
            )
            causes = [] if health.ok else find_causes(head.logs())
            retry = causes[0].retry_after_s if causes else None
            if retry is None or attempts > 1:
                break
            for runner in runners:  # the transient cause: stop, wait for the nodes to be released, once more
                runner.stop()
            sleep(retry)
            attempts += 1
            _start(runners, image, command, env, f"{name}-retry", master)
        extra: list[Finding] = []
        if not health.ok:
            extra.append(Finding("fail", "health", f"/health never answered 200: {health.last}"))
        else:
            reply = chat(base_url, variant.serve.served_model_name, CHAT_PROMPT)
            extra.append(Finding("ok" if reply["ok"] else "fail", "chat", reply.get("error") or f"{reply['finish_reason']} in {reply['seconds']:.1f} s"))
            probe = corruption_probe(base_url, variant.serve.served_model_name, probe_runs)
            extra.append(Finding("ok" if probe["ok"] else "fail", "corruption probe", f"U+FFFD per run {probe['replacement_chars']} {probe['errors'] or ''}".strip()))
            if variant.serve.speculative and "SpecDecoding metrics" not in head.logs():
                sleep(metrics_wait_s)  # vLLM logs the acceptance once per logging interval, after traffic
        # What the log alone cannot say: did the boot end, or was it still running when judged?
        process = "running" if health.ok or all(r.running() for r in runners) else "exited"
        verdict = judge_log(head.logs(), variant, quantprobe, process=process)
    finally:
        if not keep:
            for runner in runners:
                runner.stop()
    findings = verdict.findings + extra
    return Receipt(
        variant=variant.name,
        image=image,
        image_digests={r.host: r.image_digest() for r in runners},
        hosts=[r.host for r in runners],
        argv=list(command.argv),
        started_at=started,
        timings={"boot_to_health_s": health.seconds, "health_attempts": health.attempts, "total_s": time.monotonic() - t0,
                 "weights_load_s": verdict.markers.weights_load_s, "chat_s": reply and reply["seconds"]},
        cause=verdict.cause.to_dict() if verdict.cause else None,
        verdict=verdict.to_dict(),
        findings=[asdict(f) for f in findings],
        chat=reply,
        probe=probe,
        ok=not any(f.level == "fail" for f in findings),
        attempts=attempts,
    )

