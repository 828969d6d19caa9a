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

NOT RUN ON HARDWARE HERE: these machines have no GPU. The log parsing and the decisions are tested on
recorded boot logs; `DockerRunner` starts, polls, reads, stops and removes real containers on podman's
API service and on dockerd (tests/test_smoke_hardware.py), of a stand-in image that replays a recorded
boot log and answers as vLLM's OpenAI server does, without a GPU request (`gpus="none"`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import requests

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.untrusted import InputTooLarge, limit_of, read_stream
from patchkit.variants.definitions import Variant
from patchkit.checkpoint.serve import ServeCommand
from patchkit.bootlog.causes import find_causes
from patchkit.bootlog.judge import Finding, judge_log

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
    try:
        with requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=timeout, stream=True) as response:
            response.raw.decode_content = True  # a compressed answer is bounded as decoded, not as sent
            data = read_stream(response.raw, "api-answer", f"{base_url}/v1/chat/completions")
    except requests.RequestException as exc:  # the engine died or stalled after /health answered
        return {"ok": False, "error": f"no answer: {type(exc).__name__}", "seconds": time.monotonic() - start}
    except InputTooLarge as exc:
        return {"ok": False, "error": str(exc), "seconds": time.monotonic() - start}
    seconds = time.monotonic() - start
    text = data.decode("utf-8", "replace")
    if response.status_code != 200:
        return {"ok": False, "error": f"HTTP {response.status_code}: {text[:500]}", "seconds": seconds}
    try:
        answer = json.loads(text)
        choice = answer["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        return {"ok": False, "error": f"not a chat completion: {text[:500]}", "seconds": seconds}
    content = message.get("content") or "" if isinstance(message, dict) else None
    reasoning = (message.get("reasoning_content") or message.get("reasoning") or "") if isinstance(message, dict) else None
    if not isinstance(choice, dict) or not isinstance(content, str) or not isinstance(reasoning, str):
        return {"ok": False, "error": f"not a chat completion: {text[:500]}", "seconds": seconds}
    return {
        "ok": bool(content),
        "error": "" if content else f"empty content (finish_reason {choice.get('finish_reason')})",
        "content": content,
        "reasoning": reasoning,
        "finish_reason": choice.get("finish_reason"),
        "usage": answer.get("usage") if isinstance(answer, dict) else None,
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
    """One container on one host. `stop` stops it and removes it (its log was read first)."""

    host: str

    def start(self, image: str, argv: tuple[str, ...], env: dict[str, str], name: str) -> None: ...
    def running(self) -> bool: ...
    def logs(self) -> str: ...
    def image_digest(self) -> str | None: ...
    def stop(self) -> None: ...


def host_name(host: str) -> str:
    """The machine a Docker host URL names: `ssh://user@spark-1:22` -> `spark-1`; a local socket
    (`unix:///run/docker.sock`, `npipe://`) is this machine, 127.0.0.1."""
    if host.startswith(("unix://", "npipe://")) or "://" not in host and host.startswith("/"):
        return "127.0.0.1"
    return host.split("://")[-1].split("@")[-1].split(":")[0].split("/")[0]


SMOKE_LABEL = "io.patchkit.smoke"  # on every container the smoke creates: only those it ever removes
GPU_CHOICES = ("auto", "all", "none")
STOP_TIMEOUT_S = 30  # vLLM shuts down on SIGTERM; a wedged engine gets SIGKILL after this
# A fatal line is logged a moment before the process ends (vLLM tears its workers down first): the receipt
# waits this long for the nodes to exit so it records their exit codes and whole logs.
EXIT_WAIT_S = 30


class EngineError(PatchkitError):
    """The Docker API of a host refused or failed a step of the smoke (exit 2)."""

    def __init__(self, host: str, step: str, detail: str):
        self.host, self.step, self.detail = host, step, detail
        super().__init__(f"{host}: {step}: {detail}")


@contextmanager
def _engine(host: str, step: str):
    """The docker SDK's and requests' failures as one EngineError naming the host and the step."""
    import docker

    try:
        yield
    except docker.errors.DockerException as exc:
        explanation = getattr(exc, "explanation", None) or str(exc)
        raise EngineError(host, step, str(explanation)[:2000]) from None
    except requests.RequestException as exc:
        raise EngineError(host, step, f"the engine did not answer: {type(exc).__name__}: {exc}"[:2000]) from None


class DockerRunner:
    """A container through the Docker API of `host` (`ssh://user@spark1`, `unix:///...`, `tcp://...`).

    GPU access, host networking and IPC (NCCL across the two Sparks; host IPC is the host's /dev/shm, so
    no shm size is set: podman refuses one beside it, dockerd ignores it), the Hugging Face cache mounted
    read-only. `gpus`: `all` requests every GPU (`--gpus all`), `none`
    none, `auto` (the default) all when the engine reports the nvidia runtime and none otherwise (an engine
    without it refuses the request outright). The container carries SMOKE_LABEL; the smoke reads its log
    before `stop` removes it (field records "Measured recipes" lost a failed boot's logs to --rm, so the
    receipt keeps them instead). Exercised on podman and dockerd with a stand-in image
    (tests/test_smoke_hardware.py); never with a GPU."""

    def __init__(self, host: str, hf_cache: str, gpus: str = "auto") -> None:
        if gpus not in GPU_CHOICES:
            raise PatchkitError(f"--gpus takes one of {', '.join(GPU_CHOICES)}, not {gpus!r}")
        self.host = host
        self.hf_cache = _host_path(host, hf_cache)
        self.client = _client(host)
        self.gpus = _detect_gpus(self.client, host) if gpus == "auto" else gpus
        self.container = None
        self.name = ""
        self.image = ""

    def start(self, image: str, argv: tuple[str, ...], env: dict[str, str], name: str) -> None:
        import docker

        self.image, self.name = image, name
        self._remove_stale(name)
        kwargs = dict(
            entrypoint=[argv[0]], command=list(argv[1:]), environment=env, name=name, detach=True,
            labels={SMOKE_LABEL: name}, network_mode="host", ipc_mode="host",
            volumes={self.hf_cache: {"bind": "/root/.cache/huggingface", "mode": "ro"}},
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if self.gpus == "all" else None,
        )
        with _engine(self.host, f"create the container {name} from {image}"):
            try:
                self.container = self.client.containers.create(image, **kwargs)
            except docker.errors.ImageNotFound:
                self.client.images.pull(image)
                self.container = self.client.containers.create(image, **kwargs)
        with _engine(self.host, f"start the container {name}"):
            self.container.start()
        if self.gpus == "all":
            self._check_gpus()

    def _check_gpus(self) -> None:
        """An engine that accepts the GPU request but drops it (podman 4.3's Docker API keeps no
        DeviceRequests) would boot vLLM without a GPU and call it a model failure: refused, naming it."""
        with _engine(self.host, f"inspect the container {self.name}"):
            self.container.reload()
        if not (self.container.attrs.get("HostConfig") or {}).get("DeviceRequests"):
            raise EngineError(self.host, f"start the container {self.name}",
                              "the engine accepted the GPU request (--gpus all) but the container has none: this "
                              "engine's Docker API does not pass GPUs (podman: use its CDI devices, or dockerd with "
                              "nvidia-container-toolkit)")

    def _remove_stale(self, name: str) -> None:
        """A container of this name left by an earlier smoke (killed before its cleanup) is removed; one
        that is not the smoke's is never touched: refused, naming it."""
        import docker

        with _engine(self.host, f"look for an earlier container named {name}"):
            try:
                old = self.client.containers.get(name)
            except docker.errors.NotFound:
                return
            if old.labels.get(SMOKE_LABEL) != name:
                raise EngineError(self.host, f"create the container {name}",
                                  f"a container of that name exists and is not a patchkit smoke's (id {old.short_id}); "
                                  "remove or rename it")
            old.remove(force=True)

    def running(self) -> bool:
        with _engine(self.host, f"inspect the container {self.name}"):
            self.container.reload()
        return self.container.status in ("created", "running")

    def exit_code(self) -> int | None:
        """The container's exit status; None while it runs."""
        if self.running():
            return None
        return ((self.container.attrs or {}).get("State") or {}).get("ExitCode")

    def logs(self) -> str:
        """The container's whole log, bounded by the boot-log limit (read in chunks, never whole past it)."""
        with _engine(self.host, f"read the log of {self.name}"):
            stream = self.container.logs(stream=True, follow=False)
            return _bounded_log(stream, f"{self.host}: the log of {self.name}").decode("utf-8", "replace")

    def image_digest(self) -> str | None:
        """The image's digest under the repository it was asked by (`repo@sha256:...`), else its id."""
        with _engine(self.host, f"inspect the image {self.image}"):
            attrs = self.client.images.get(self.image).attrs
        same = [d for d in attrs.get("RepoDigests") or [] if d.split("@")[0] == _repository(self.image)]
        return same[0] if same else attrs.get("Id")

    def stop(self) -> None:
        """Stop and remove every container this runner created under its name (one created just as an
        interrupt arrived included: found by its label)."""
        if not self.name:
            return
        with _engine(self.host, f"stop and remove the container {self.name}"):
            for container in self.client.containers.list(all=True, filters={"label": f"{SMOKE_LABEL}={self.name}"}):
                if container.status == "running":
                    container.stop(timeout=STOP_TIMEOUT_S)
                container.remove(force=True)
        self.container = None


def _repository(reference: str) -> str:
    """`registry:5000/org/name:tag@sha256:...` -> `registry:5000/org/name` (a port is not a tag)."""
    head, _, last = reference.split("@")[0].rpartition("/")
    return f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]


def _host_path(host: str, path: str) -> str:
    """A bind-mount source the engine can take: the API wants an absolute path on the engine's machine, so
    `~` is expanded for a local socket and refused for a remote host, whose home is not known here."""
    if not path.startswith("~"):
        return path
    if host.startswith("unix://"):
        return os.path.expanduser(path)
    raise PatchkitError(f"--hf-cache {path}: the home directory on {host} is not known here; give the absolute path "
                        "of the Hugging Face cache on that host (e.g. /home/USER/.cache/huggingface)")


def _client(host: str):
    """A docker SDK client of `host`; ssh:// goes through the system's ssh client, which the SDK's
    transport module imports paramiko for (the `docker[ssh]` extra): refused up front without it."""
    import importlib.util

    import docker

    ssh = host.startswith("ssh://")
    if ssh and importlib.util.find_spec("paramiko") is None:
        raise EngineError(host, "connect", "an ssh:// host needs paramiko, which the docker SDK's ssh transport imports "
                          "(pip install 'docker[ssh]'); or forward the host's socket and give unix://")
    with _engine(host, "connect to the Docker API"):
        client = docker.DockerClient(base_url=host, use_ssh_client=ssh, timeout=120)
        client.ping()
    return client


def _detect_gpus(client, host: str) -> str:
    """`all` when the engine reports the nvidia runtime (nvidia-container-toolkit, as on DGX OS), else `none`."""
    with _engine(host, "read the engine's info"):
        info = client.info()
    runtimes = set(info.get("Runtimes") or {}) | {info.get("DefaultRuntime") or ""}
    return "all" if "nvidia" in runtimes else "none"


def _bounded_log(stream, what: str) -> bytes:
    limit = limit_of("boot-log")
    chunks, size = [], 0
    for chunk in stream:
        size += len(chunk)
        if size > limit:
            close = getattr(stream, "close", None)
            if close:
                close()
            raise InputTooLarge(what, "boot-log", limit)
        chunks.append(chunk)
    return b"".join(chunks)


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
    containers: list[dict] = field(default_factory=list)  # per node: host, name, gpus, exit code (None: running)
    hardware: bool = True
    patchkit: str = __version__
    logs: list[str] = field(default_factory=list, repr=False)  # per node, read before the containers went

    def to_json(self) -> str:
        data = asdict(self)
        del data["logs"]  # written beside the receipt (write), not inside it
        return json.dumps(data, indent=2, ensure_ascii=False)

    def log_paths(self, path: Path) -> list[Path]:
        """Where `write(path)` keeps each node's log: `receipt.node0.log` beside `receipt.json`."""
        return [path.with_name(f"{path.stem}.node{rank}.log") for rank in range(len(self.logs))]

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        for text, log_path in zip(self.logs, self.log_paths(path), strict=True):
            log_path.write_text(text, encoding="utf-8")

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
    boot_timeout_s: float | None = None,
) -> Receipt:
    """Boot, exercise the endpoint, judge the head's log, stop, and return the receipt (ok or not).

    `quantprobe`: the image carries the quantprobe patch (then PATCHKIT_QUANTPROBE=1 is set and its lines
    are required). A boot that dies of a transient cause (the launcher's occupancy race) is retried once.
    `boot_timeout_s` bounds the wait for /health (default: the variant's `expect.boot_timeout_s`). Every
    node's log is read into the receipt before its container is stopped and removed, whatever ended the
    run (an interrupt too: the cleanup itself is not interruptible by a second Ctrl-C)."""
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
    deadline = variant.expect.boot_timeout_s if boot_timeout_s is None else boot_timeout_s
    logs: list[str] = []
    try:
        _start(runners, image, command, env, name, master)
        while True:
            health = wait_healthy(
                base_url, deadline, health_interval_s,
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
        if not health.ok and any(c.definitive for c in causes):
            _await_exit(runners, EXIT_WAIT_S, sleep)
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
        logs = [r.logs() for r in runners]
        containers = [_container(r) for r in runners]
        verdict = judge_log(logs[0], variant, quantprobe, process=process)
    finally:
        if not keep:
            _clean_up(runners)
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
        containers=containers,
        logs=logs,
    )


def _await_exit(runners: list[Runner], limit_s: float, sleep: Callable[[float], None]) -> None:
    """Wait, at most `limit_s`, for every node to exit (a boot that logged its fatal cause is ending)."""
    for _ in range(int(limit_s / 0.5)):  # counted, not timed: the tests' sleep is their own
        if not any(r.running() for r in runners):
            return
        sleep(0.5)


def _container(runner: Runner) -> dict:
    """What the receipt says of a node's container (a runner without an engine says only its host)."""
    return {"host": runner.host, "name": getattr(runner, "name", None), "gpus": getattr(runner, "gpus", None),
            "exit_code": runner.exit_code() if hasattr(runner, "exit_code") else None}


def _clean_up(runners: list[Runner]) -> None:
    """Stop and remove every node's container, with SIGINT held off meanwhile (a second Ctrl-C would leave
    them behind); every runner is tried, the first failure raised after."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    failure: BaseException | None = None
    try:
        for runner in runners:
            try:
                runner.stop()
            except Exception as exc:  # noqa: BLE001 - the others are still stopped; raised below
                failure = failure or exc
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if failure is not None:
        raise failure

