"""Hardware smoke harness: `patchkit smoke VARIANT --host HOST [--host WORKER]`.

Starts the variant's serve command in the image on each host (containers.py), with the environment the
image's patches ask of a smoke (their patch.toml `[smoke]`), polls `/health`, sends a chat completion,
a corruption probe and the serving probes (api.py, serving.py: the reasoning split and a tool call), lets vLLM log its SpecDecoding acceptance, judges the head's log
(patchkit.bootlog: the markers, the fatal causes and the verdict `patchkit doctor` gives too) and writes
a JSON receipt naming the cause of a failed boot with the line that showed it.

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
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from patchkit import __version__
from patchkit.bootlog.causes import find_causes
from patchkit.bootlog.judge import Finding, judge_log, judge_spec_counters
from patchkit.bootlog.markers import MARKER
from patchkit.checkpoint.serve import ServeCommand
from patchkit.errors import PatchkitError
from patchkit.localfiles import atomic_write
from patchkit.patching.patchset import InvalidPatchFile, Patch
from patchkit.smoke.api import CHAT_PROMPT, chat, corruption_probe, serving_probes, wait_healthy
from patchkit.smoke.containers import Runner, host_name
from patchkit.smoke.spec_metrics import fetch_counters
from patchkit.variants.definitions import Variant

# A fatal line is logged a moment before the process ends (vLLM tears its workers down first): the receipt
# waits this long for the nodes to exit so it records their exit codes and whole logs.
EXIT_WAIT_S = 30


@dataclass(frozen=True)
class Switches:
    """What the image's patches ask of a smoke (patch.toml `[smoke]`): the environment that switches their
    output on, and the boot-log markers (bootlog/markers.py names) the log must then show."""

    env: dict[str, str] = field(default_factory=dict)
    markers: frozenset[str] = frozenset()

    @property
    def quantprobe(self) -> bool:
        """The [quantprobe] lines are switched on, and so required."""
        return "quantprobe" in self.markers


def switches_of(patches: Iterable[Patch]) -> Switches:
    """The smoke switches of an image's series; a marker name the boot-log reader does not know is the
    patch's error (its lines could never be judged)."""
    env: dict[str, str] = {}
    markers: set[str] = set()
    for patch in patches:
        unknown = sorted(set(patch.smoke_markers) - set(MARKER))
        if unknown:
            raise InvalidPatchFile(patch.folder / "patch.toml", "[smoke], key 'markers'", "unknown-marker",
                                   f"{unknown} are not boot-log markers (known: {', '.join(MARKER)})")
        env.update(patch.smoke_env)
        markers.update(patch.smoke_markers)
    return Switches(env, frozenset(markers))


class ServeCommandIncomplete(PatchkitError):
    """The serve command of `variant` has `pending` parts it cannot derive without what was not given (the
    checkpoint's verified config: --checkpoint DIR), so no node is started (exit 2)."""

    def __init__(self, variant: str, pending: tuple[str, ...]):
        self.variant, self.pending = variant, pending
        super().__init__(f"the serve command for {variant} is incomplete: {'; '.join(pending)}")


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
    serving: dict | None = None  # per serving probe (smoke/serving.py): what a client reads, judged
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
        atomic_write(path, (self.to_json() + "\n").encode("utf-8"))
        for text, log_path in zip(self.logs, self.log_paths(path), strict=True):
            atomic_write(log_path, text.encode("utf-8"))

    def __rich__(self):
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"smoke {self.variant}: {'PASSED' if self.ok else 'FAILED'}")
        for col in ("level", "what", "detail"):
            table.add_column(col, overflow="fold")  # a detail holds the log line and its fix, never cut
        colour = {"fail": "red", "warn": "yellow", "ok": "green"}
        for f in self.findings:
            table.add_row(f"[{colour[f['level']]}]{f['level']}[/]", f["what"], escape(f["detail"]))
        return table


def _start(runners: Sequence[Runner], image: str, command: ServeCommand, env: dict[str, str], name: str, master: str) -> None:
    nnodes = len(runners)
    for rank, runner in sorted(enumerate(runners), key=lambda r: -r[0]):  # workers first, head last
        runner.start(image, command.for_node(rank, nnodes, master), env, f"{name}-{rank}")


def run_smoke(
    variant: Variant,
    command: ServeCommand,
    image: str,
    runners: Sequence[Runner],
    base_url: str,
    health_interval_s: float = 5.0,
    probe_runs: int = 3,
    keep: bool = False,
    master_addr: str | None = None,
    switches: Switches | None = None,
    metrics_wait_s: float = 15.0,
    sleep: Callable[[float], None] = time.sleep,
    boot_timeout_s: float | None = None,
    extras: Iterable[str] | None = None,
) -> Receipt:
    """Boot, exercise the endpoint, judge the head's log, stop, and return the receipt (ok or not).

    `switches`: what the image's patches ask of a smoke (switches_of its series): their environment is
    set and their markers are required (None: not known, so markers are judged only where printed). A boot that dies of a transient cause (the launcher's occupancy race) is retried once.
    `boot_timeout_s` bounds the wait for /health (default: the variant's `expect.boot_timeout_s`); `extras`:
    the extra wheels the image carries (the advice on a slow weight load names what it has). Every
    node's log is read into the receipt before its container is stopped and removed, whatever ended the
    run (an interrupt too: the cleanup itself is not interruptible by a second Ctrl-C)."""
    if not command.complete:
        raise ServeCommandIncomplete(variant.name, command.pending)
    if not runners:
        raise PatchkitError("no host to run on (a patchkit bug: please report it; the command line gives one)")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    head = runners[0]
    # The head's address for the other nodes' NCCL rendezvous: its hostname unless given.
    master = master_addr or host_name(head.host)
    env = {**command.env, **(switches.env if switches else {})}
    name = f"patchkit-smoke-{variant.name}"
    t0 = time.monotonic()
    attempts = 1
    reply = probe = serving = None
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
            serving = serving_probes(base_url, variant.serve.served_model_name)
            extra += _serving_findings(serving)
            if variant.serve.speculative and "SpecDecoding metrics" not in head.logs():
                sleep(metrics_wait_s)  # vLLM logs the acceptance once per logging interval, after traffic
            if variant.serve.speculative and "SpecDecoding metrics" not in head.logs():
                # Still no interval in the log: vLLM's counters say how the draft did (a silent MTP load on
                # 0.34.0 boots without a word and shows only here).
                extra += judge_spec_counters(fetch_counters(base_url), variant.serve.speculative.method)
        # What the log alone cannot say: did the boot end, or was it still running when judged?
        process = "running" if health.ok or all(r.running() for r in runners) else "exited"
        logs = [r.logs() for r in runners]
        containers = [_container(r) for r in runners]
        verdict = judge_log(logs[0], variant, switches.quantprobe if switches else None, process=process,
                            extras=None if extras is None else set(extras))
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
        serving=serving,
        ok=not any(f.level == "fail" for f in findings),
        attempts=attempts,
        containers=containers,
        logs=logs,
    )


def _serving_findings(serving: dict[str, dict]) -> list[Finding]:
    """One finding per serving probe: its failures (or the request's error), else its one `ok` line."""
    out = []
    for name, check in serving.items():
        if "findings" not in check:
            out.append(Finding("fail", f"serving {name}", check["error"]))
            continue
        failed = [f for f in check["findings"] if f["level"] != "ok"]
        out += [Finding(f["level"], f"serving {name}", f"{f['what']}: {f['detail']}") for f in failed] or [
            Finding("ok", f"serving {name}", check["findings"][-1]["detail"])]
    return out


def _await_exit(runners: Sequence[Runner], limit_s: float, sleep: Callable[[float], None]) -> None:
    """Wait, at most `limit_s`, for every node to exit (a boot that logged its fatal cause is ending)."""
    for _ in range(int(limit_s / 0.5)):  # counted, not timed: the tests' sleep is their own
        if not any(r.running() for r in runners):
            return
        sleep(0.5)


def _container(runner: Runner) -> dict:
    """What the receipt says of a node's container (a runner without an engine says only its host)."""
    return {"host": runner.host, "name": getattr(runner, "name", None), "gpus": getattr(runner, "gpus", None),
            "exit_code": runner.exit_code() if hasattr(runner, "exit_code") else None}


def _clean_up(runners: Sequence[Runner]) -> None:
    """Stop and remove every node's container, with SIGINT held off meanwhile (a second Ctrl-C would leave
    them behind); every runner is tried, the first failure raised after."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    failure: BaseException | None = None
    try:
        for runner in runners:
            try:
                runner.stop()
            except Exception as exc:  # the others are still stopped; raised below
                failure = failure or exc
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if failure is not None:
        raise failure

