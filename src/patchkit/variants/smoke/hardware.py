"""Hardware smoke harness: `patchkit smoke VARIANT --host HOST [--host WORKER]`.

Starts the variant's serve command in the image on each host through the Docker API (the docker SDK;
`ssh://user@host` reaches a host's own daemon), polls `/health` (not `/v1/models`, which answers 200
while the engine is dead), reads the boot markers from the head's log, sends a chat completion with
`chat_template_kwargs: {"reasoning_effort": "low"}` and `max_tokens` >= 256, runs a corruption probe
(U+FFFD in the output of a Hangul/CJK prompt), and writes a JSON receipt.

NOT RUN ON HARDWARE HERE: these machines have no GPU and no Docker engine. The log parsing, the
decisions, the HTTP exchanges and the receipt are tested on CPU with recorded boot logs and a real
HTTP server on 127.0.0.1; `DockerRunner` itself has not started a container.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import requests

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.variants.definitions import ProbeRow, Variant
from patchkit.variants.serve import ServeCommand

MIN_MAX_TOKENS = 256  # seed 001: max_tokens 48 can end in content null, finish "length"
CHAT_PROMPT = "Reply with one short sentence: what is 17 times 3?"
# Hangul and CJK: a broken byte-level detokenizer or a corrupt expert shows up as U+FFFD here first.
PROBE_PROMPT = "다음 문장을 한국어와 중국어로 각각 한 번씩 번역하세요: 'The river is quiet tonight.' 请只输出两句译文。"
REPLACEMENT = "\ufffd"

# ---------------------------------------------------------------- boot log

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_QUANTPROBE = re.compile(r"\[quantprobe\] layer=(\S+) prefix=(\S+) algo=(\S+)")
_MODEL_LOADING = re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds")
_WEIGHTS_TOOK = re.compile(r"Loading weights took ([\d.]+) seconds")
_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_ACCEPTANCE = re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+)")
_MTP = re.compile(r"Detected MTP model|Loading drafter model")
_FATAL = re.compile(
    r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start|EngineDeadError"
    r"|CUDA out of memory|NV_ERR_NO_MEMORY|Traceback \(most recent call last\)"
)
# "KeyError: ..." after any log prefix (vLLM's logger.exception prefixes every traceback line).
_EXCEPTION = re.compile(r"(?:^|[\s\])])([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$")


@dataclass
class BootMarkers:
    quantprobe: list[ProbeRow] = field(default_factory=list)
    weights_gib: float | None = None
    weights_load_s: float | None = None
    kv_cache_tokens: int | None = None
    startup_complete: bool = False
    mtp_speculator: bool = False
    mean_acceptance_length: float | None = None
    fatal: list[str] = field(default_factory=list)  # the lines that say the engine died
    exceptions: list[str] = field(default_factory=list)  # "KeyError: ..." lines, for the receipt


def parse_boot_log(text: str) -> BootMarkers:
    """Every marker the smoke decides on, from a vLLM 0.33 serve log (ANSI colours stripped)."""
    m = BootMarkers()
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        if hit := _QUANTPROBE.search(line):
            m.quantprobe.append(ProbeRow(*hit.groups()))
        if hit := _MODEL_LOADING.search(line):
            m.weights_gib, m.weights_load_s = float(hit.group(1)), float(hit.group(2))
        elif (hit := _WEIGHTS_TOOK.search(line)) and m.weights_load_s is None:
            m.weights_load_s = float(hit.group(1))
        if hit := _KV_TOKENS.search(line):
            m.kv_cache_tokens = int(hit.group(1).replace(",", ""))
        if "Application startup complete" in line:
            m.startup_complete = True
        if _MTP.search(line):
            m.mtp_speculator = True
        if hit := _ACCEPTANCE.search(line):
            m.mtp_speculator = True
            m.mean_acceptance_length = float(hit.group(1))
        if _FATAL.search(line):
            m.fatal.append(line.strip())
        if hit := _EXCEPTION.search(line):
            m.exceptions.append(f"{hit.group(1)}: {hit.group(2)}".strip())
    return m


@dataclass(frozen=True)
class Finding:
    level: str  # fail | warn | ok
    what: str
    detail: str


def judge_boot(markers: BootMarkers, variant: Variant) -> list[Finding]:
    """Decide from the markers what the boot proves; any `fail` finding fails the smoke."""
    out: list[Finding] = []
    exp = variant.expect
    if markers.fatal:
        # The first exception is the root cause; the last one is usually the engine's own summary.
        ex = markers.exceptions
        cause = (ex[0] + (f" (then {ex[-1]})" if len(ex) > 1 else "")) if ex else markers.fatal[-1]
        out.append(Finding("fail", "engine", f"the engine died: {cause}"))
    out.append(
        Finding("ok", "startup", "Application startup complete")
        if markers.startup_complete
        else Finding("fail", "startup", "no 'Application startup complete' in the log")
    )
    seen = {row.prefix: row for row in markers.quantprobe}
    for row in exp.quantprobe:
        got = seen.get(row.prefix)
        if got is None:
            out.append(Finding("warn", "quantprobe", f"{row.prefix}: no quantprobe line (does the image print them?)"))
        elif (got.layer, got.algo) != (row.layer, row.algo):
            broken = " (broken load: the layer got no quantized method)" if got.algo == "None" else ""
            out.append(Finding("fail", "quantprobe", f"{row.prefix}: {got.layer} algo={got.algo}, expected {row.layer} algo={row.algo}{broken}"))
        else:
            out.append(Finding("ok", "quantprobe", f"{row.prefix}: algo={got.algo}"))
    if markers.kv_cache_tokens is None:
        out.append(Finding("fail", "kv cache", "no 'GPU KV cache size' line: the engine never sized its KV pool"))
    elif exp.kv_cache_tokens is not None and markers.kv_cache_tokens != exp.kv_cache_tokens:
        out.append(Finding("warn", "kv cache", f"{markers.kv_cache_tokens:,} tokens; the pinned pool gave {exp.kv_cache_tokens:,} on the reference boot"))
    else:
        out.append(Finding("ok", "kv cache", f"{markers.kv_cache_tokens:,} tokens"))
    if markers.weights_gib is None:
        out.append(Finding("warn", "weights", "no 'Model loading took' line"))
    elif exp.weights_gib_per_rank and abs(markers.weights_gib - exp.weights_gib_per_rank) > 0.05 * exp.weights_gib_per_rank:
        out.append(Finding("warn", "weights", f"{markers.weights_gib} GiB per rank; {exp.weights_gib_per_rank} GiB expected"))
    else:
        out.append(Finding("ok", "weights", f"{markers.weights_gib} GiB in {markers.weights_load_s} s"))
    if exp.mtp_speculator != markers.mtp_speculator:
        want = "expected the MTP speculator, none attached" if exp.mtp_speculator else "an MTP speculator attached to a variant without one"
        out.append(Finding("fail", "mtp", want))
    elif exp.mtp_speculator:
        out.append(Finding("ok", "mtp", "MTP speculator attached"))
    return out


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
    """One chat completion with low reasoning effort (other values select MAX effort, seed 002)."""
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


class DockerRunner:
    """A container through the Docker API of `host` (`ssh://user@spark1`, `unix:///...`, `tcp://...`).

    GPU access, host networking and IPC (NCCL across the two Sparks), 32 GB of shm as the recipes use,
    the Hugging Face cache mounted read-only. The container is kept after exit: its log is the evidence
    (seed 001 lost a failed boot's logs to --rm). Never run on hardware here."""

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
    markers: dict
    findings: list[dict]
    chat: dict | None
    probe: dict | None
    ok: bool
    hardware: bool = True
    patchkit: str = __version__

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    def __rich__(self):
        from rich.table import Table

        table = Table(title=f"smoke {self.variant}: {'PASSED' if self.ok else 'FAILED'}")
        for col in ("level", "what", "detail"):
            table.add_column(col)
        colour = {"fail": "red", "warn": "yellow", "ok": "green"}
        for f in self.findings:
            table.add_row(f"[{colour[f['level']]}]{f['level']}[/]", f["what"], f["detail"])
        return table


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
) -> Receipt:
    """Boot, judge the log, exercise the endpoint, stop, and return the receipt (ok or not)."""
    if not command.complete:
        raise PatchkitError(f"the serve command for {variant.name} is incomplete: {'; '.join(command.pending)}")
    if not runners:
        raise PatchkitError("no host to run on")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    head, nnodes = runners[0], len(runners)
    # The head's address for the other nodes' NCCL rendezvous: its hostname unless given.
    master = master_addr or head.host.split("://")[-1].split("@")[-1].split(":")[0]
    t0 = time.monotonic()
    for rank, runner in sorted(enumerate(runners), key=lambda r: -r[0]):  # workers first, head last
        runner.start(image, command.for_node(rank, nnodes, master), command.env, f"patchkit-smoke-{variant.name}-{rank}")
    try:
        health = wait_healthy(
            base_url,
            variant.expect.boot_timeout_s,
            health_interval_s,
            alive=lambda: all(r.running() for r in runners) and not parse_boot_log(head.logs()).fatal,
        )
        markers = parse_boot_log(head.logs())
        findings = judge_boot(markers, variant)
        if not health.ok:
            findings.append(Finding("fail", "health", f"/health never answered 200: {health.last}"))
        reply = probe = None
        if health.ok:
            reply = chat(base_url, variant.serve.served_model_name, CHAT_PROMPT)
            findings.append(Finding("ok" if reply["ok"] else "fail", "chat", reply.get("error") or f"{reply['finish_reason']} in {reply['seconds']:.1f} s"))
            probe = corruption_probe(base_url, variant.serve.served_model_name, probe_runs)
            findings.append(Finding("ok" if probe["ok"] else "fail", "corruption probe", f"U+FFFD per run {probe['replacement_chars']} {probe['errors'] or ''}".strip()))
    finally:
        if not keep:
            for runner in runners:
                runner.stop()
    return Receipt(
        variant=variant.name,
        image=image,
        image_digests={r.host: r.image_digest() for r in runners},
        hosts=[r.host for r in runners],
        argv=list(command.argv),
        started_at=started,
        timings={"boot_to_health_s": health.seconds, "health_attempts": health.attempts, "total_s": time.monotonic() - t0,
                 "weights_load_s": markers.weights_load_s, "chat_s": reply and reply["seconds"]},
        markers=asdict(markers),
        findings=[asdict(f) for f in findings],
        chat=reply,
        probe=probe,
        ok=not any(f.level == "fail" for f in findings),
    )
