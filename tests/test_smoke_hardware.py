"""`patchkit smoke VARIANT --host ... --image ...` through the real DockerRunner on real engines.

Each test runs patchkit itself (tests/hostile.py: a fresh interpreter, bounded in memory and time) against
podman's API service and against dockerd (tests/engines.py), booting the vLLM stand-in image
(tests/standin_server/README.md) that the engine builds FROM scratch out of Debian's static busybox: it
replays a recorded boot log line by line and answers /health, /v1/models and /v1/chat/completions as
vLLM's OpenAI server does. Create, start, logs, the /health poll, chat, the corruption probe, stop,
removal and the receipt are the harness's real code against the engine's real API.

Not exercised here: a GPU. These engines have no nvidia runtime, so every run asks for none
(`--gpus none`, and `auto` detects none); `--gpus all` is shown refused by the engine, as it is on any
engine without nvidia-container-toolkit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines import DockerdService, PodmanService, _running, sdk_client
from hostile import REPO, assert_refused, run_patchkit
from patchkit.smoke.containers import SMOKE_LABEL, STOP_TIMEOUT_S
from sshd import SshServer

STANDIN = Path(__file__).parent / "standin_server"
LOGS = Path(__file__).parent / "data" / "boot-logs"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static
VARIANT = "lab"  # a complete serve command without a checkpoint; its image carries quantprobe
PORT = 30000  # the lab variant's serve.port: the stand-in binds it on the host network, as vLLM would

# What each stand-in image replays, and how its boot ends.
IMAGES = {
    "good": ("lab-good.log", "serve"),  # hand-written (tests/data/boot-logs/README.md): the lab variant's good boot
    "dflash": ("public/sfxnz-nvidia-dflash2-good-boot.log", "serve"),  # a real GB10 boot, DFlash2 drafter
    "kv-budget": ("public/tenhkspark-stock-k5-boot-failure.log", "exit"),  # a real GB10 boot dying at KV sizing
    "killed": ("public/sfxnz-nvidia-killed-boot.log", "hang"),  # a real boot's log up to profiling, then nothing
}


class StandinPodman(PodmanService):
    """podman's service with the two settings this machine needs to start a container at all: runc (crun 1.8
    refuses the hybrid cgroup v1/v2 layout here: "cgroups in hybrid mode not supported") and default
    ulimits within this sandbox's own (podman's default nofile/nproc are refused: "setrlimit ... Operation
    not permitted"); and a tmp_dir of its own. None is a patchkit setting; a Spark's engine runs containers
    as it is."""

    kind = "podman"

    def __enter__(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "containers.conf"
        # tmp_dir: podman's default, /run/libpod, is shared by every service on the machine (another one's
        # reset removes it under this one: "creating runtime status file: open /run/libpod/alive").
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
                        f'[engine]\nruntime = "runc"\ntmp_dir = "{self.root}/tmp"\n')
        self.env["CONTAINERS_CONF"] = str(conf)
        return super().__enter__()


@pytest.fixture(scope="module", params=("podman", "docker"))
def service(request, tmp_path_factory):
    if request.param == "podman" and shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install podman)")
    made = (StandinPodman if request.param == "podman" else DockerdService)(tmp_path_factory.mktemp(request.param))
    yield from _running(made)


@pytest.fixture(scope="module")
def engine(service):
    """(URL, SDK client, {image key: tag}, "podman" | "docker") with every stand-in image built by this engine."""
    if not BUSYBOX.is_file():
        pytest.fail(f"{BUSYBOX} is missing: apt-get install busybox-static (the stand-in image is built from it)")
    client = sdk_client(service.url)
    context = Path(service.root) / "standin-context"
    shutil.copytree(STANDIN, context)
    shutil.copy2(BUSYBOX, context / "busybox")
    logs = context / "logs"
    for log, _ in IMAGES.values():
        (logs / log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(LOGS / log, logs / log)
    tags = {}
    for key, (log, end) in IMAGES.items():
        tags[key] = f"localhost/patchkit-standin:{key}"
        # nocache: podman 4.3's build cache takes an ENV made of build args for the same layer whatever their values
        client.images.build(path=str(context), tag=tags[key], buildargs={"LOG": log, "END": end}, rm=True, nocache=True)
    corrupt = "localhost/patchkit-standin:corrupt"
    client.images.build(path=str(context), tag=corrupt, rm=True, nocache=True,
                        buildargs={"LOG": "lab-good.log", "END": "serve", "REPLY": "강은 \ufffd\ufffd 조용하다"})
    tags["corrupt"] = corrupt
    leak = "localhost/patchkit-standin:leak"  # GLM-5.3's scratchpad in content, as an unpatched parser splits it
    client.images.build(path=str(context), tag=leak, rm=True, nocache=True,
                        buildargs={"LOG": "lab-good.log", "END": "serve", "SPLIT": "leak"})
    tags["leak"] = leak
    return service.url, client, tags, service.kind


def ours(client) -> list:
    """Every container a smoke made on this engine (by the label the runner puts on them)."""
    return client.containers.list(all=True, filters={"label": SMOKE_LABEL})


def smoke(url: str, image: str, tmp_path: Path, *extra: str, variant: str = VARIANT, env: dict | None = None):
    receipt = tmp_path / "receipt.json"
    hf = tmp_path / "hf"
    hf.mkdir(exist_ok=True)
    outcome = run_patchkit("smoke", variant, "--host", url, "--image", image, "--hf-cache", str(hf),
                           "--receipt", str(receipt), "--health-interval", "0.2", *extra, timeout=180, env=env)
    return outcome, (json.loads(receipt.read_text()) if receipt.exists() else None), receipt


def test_a_good_boot_passes_through_the_real_runner(engine, tmp_path):
    url, client, tags, _ = engine
    outcome, data, _ = smoke(url, tags["good"], tmp_path, "--gpus", "auto")
    assert outcome.code == 0, outcome.output[-3000:]
    assert data["ok"] and data["cause"] is None and data["attempts"] == 1
    assert data["chat"]["content"] == "17 times 3 is 51." and data["chat"]["finish_reason"] == "stop"
    assert data["probe"] == {"runs": 3, "replacement_chars": [0, 0, 0], "errors": [], "ok": True}
    assert data["verdict"]["markers"]["kv_cache_tokens"] == 1_164_369
    # The serving probes as a client reads them: a clean split, and a tool call whose arguments parse.
    assert {name: check["ok"] for name, check in data["serving"].items()} == {
        "enable-thinking-false": True, "reasoning-effort-low": True, "tool-call": True, "tool-call-streamed": True}
    assert data["serving"]["enable-thinking-false"]["think_tags_in_content"] == 0
    for way in ("tool-call", "tool-call-streamed"):  # whole, and assembled from the stand-in's server-sent chunks
        assert data["serving"][way]["tool_calls"] == [{"name": "get_weather", "arguments_json": True, "think_tags": 0}]
    [node] = data["containers"]
    # No nvidia runtime on this engine: auto asks for no GPU. Still running when judged (then removed).
    assert node == {"host": url, "name": f"patchkit-smoke-{VARIANT}-0", "gpus": "none", "exit_code": None}
    # The image as the engine names it: its digest under the repository asked for (podman gives a built image
    # one), else its id (dockerd gives a digest only to a pushed or pulled image).
    image = client.images.get(tags["good"])
    named = [d for d in image.attrs.get("RepoDigests") or [] if d.startswith("localhost/patchkit-standin@")]
    assert data["image_digests"][url] == (named[0] if named else image.id)
    # The head's log, read before removal: what the container was given, the replayed boot, the traffic.
    log = (tmp_path / "receipt.node0.log").read_text()
    argv = log.splitlines()[0]
    assert argv.startswith("standin: argv: vllm serve ") and f"--port {PORT}" in argv and "--served-model-name glm53" in argv
    assert "standin: env: PATCHKIT_QUANTPROBE=1" in log  # the image carries the quantprobe patch
    recorded = (LOGS / "lab-good.log").read_text()
    assert recorded in log.replace('INFO:     127.0.0.1:0 - "GET /health HTTP/1.1" 200 OK\n', "")
    # The chat, three corruption-probe runs and four serving probes; the last one's line may still be in the
    # engine's log pipe when the log is read right after its answer (dockerd lost that race once in 20 runs).
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 200 OK') in (7, 8)
    assert ours(client) == []  # stopped and removed


def test_two_nodes_head_and_headless_worker(engine, tmp_path):
    """`--host URL --host URL`: the worker (rank 1, --headless) started first, the head last, both judged by
    the head's log and both removed. One engine plays both Sparks here (host networking: one API port)."""
    url, client, tags, _ = engine
    hf = tmp_path / "hf"
    hf.mkdir()
    receipt = tmp_path / "receipt.json"
    outcome = run_patchkit("smoke", VARIANT, "--host", url, "--host", url, "--image", tags["good"], "--gpus", "none",
                           "--hf-cache", str(hf), "--receipt", str(receipt), "--health-interval", "0.2", timeout=180)
    assert outcome.code == 0, outcome.output[-3000:]
    data = json.loads(receipt.read_text())
    assert [c["name"] for c in data["containers"]] == [f"patchkit-smoke-{VARIANT}-0", f"patchkit-smoke-{VARIANT}-1"]
    head, worker = ((tmp_path / f"receipt.node{rank}.log").read_text() for rank in (0, 1))
    head_argv, worker_argv = head.splitlines()[0], worker.splitlines()[0]
    assert head_argv.endswith("--nnodes 2 --node-rank 0 --master-addr 127.0.0.1")
    assert worker_argv.endswith("--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --headless")
    assert "POST /v1/chat/completions" in head and "POST /v1/chat/completions" not in worker
    assert ours(client) == []


def test_a_real_public_boot_is_judged_live(engine, tmp_path):
    """The sfxnz DFlash2 boot (real, GB10) through the runner: up, chatting, and failing the lab variant on
    its speculator alone, as `patchkit doctor` judges the same log."""
    url, client, tags, _ = engine
    outcome, data, _ = smoke(url, tags["dflash"], tmp_path, "--gpus", "none")
    assert outcome.code == 1, outcome.output[-3000:]
    failed = [f"{f['what']}: {f['detail']}" for f in data["findings"] if f["level"] == "fail"]
    assert "speculative: dflash (DFlash2DraftModel) attached; the variant expects mtp" in failed
    assert data["chat"]["ok"] and data["probe"]["ok"] and data["cause"] is None
    assert data["verdict"]["speculative"]["method"] == "dflash"
    assert ours(client) == []


def test_a_corrupt_reply_fails_the_probe(engine, tmp_path):
    url, client, tags, _ = engine
    outcome, data, _ = smoke(url, tags["corrupt"], tmp_path, "--gpus", "none")
    assert outcome.code == 1 and data["chat"]["ok"]
    assert data["probe"]["replacement_chars"] == [2, 2, 2] and not data["probe"]["ok"]
    assert ours(client) == []


def test_a_leaked_reasoning_split_fails_the_serving_probes(engine, tmp_path):
    """The answer sglang PR #39227 recorded from GLM-5.3 behind a parser without always-think: the scratchpad
    and `</think>` in content; and the tool call streamed with the `</think>` stock vLLM's streaming glm47
    parser keeps in the arguments. The boot and the chat are fine; the receipt fails on what a client sees."""
    url, client, tags, _ = engine
    outcome, data, _ = smoke(url, tags["leak"], tmp_path, "--gpus", "none")
    assert outcome.code == 1 and data["chat"]["ok"] and data["probe"]["ok"]
    failed = {f["what"]: f["detail"] for f in data["findings"] if f["level"] == "fail"}
    assert set(failed) == {"serving enable-thinking-false", "serving reasoning-effort-low", "serving tool-call-streamed"}
    assert "1 <think>/</think> tag(s) in content" in failed["serving enable-thinking-false"]
    assert "patch glm47-tool-args-think-end" in failed["serving tool-call-streamed"]
    assert data["serving"]["tool-call"]["ok"]
    assert ours(client) == []


def test_a_boot_that_dies_names_its_cause_and_the_exit(engine, tmp_path):
    url, client, tags, _ = engine
    start = time.monotonic()
    outcome, data, _ = smoke(url, tags["kv-budget"], tmp_path, "--gpus", "none")
    assert outcome.code == 1, outcome.output[-3000:]
    assert data["cause"]["cause"] == "kv-budget" and "(0.92 GiB KV cache is needed" in data["cause"]["line"]
    assert data["chat"] is None and data["probe"] is None
    assert any(f["what"] == "health" and "container exited" in f["detail"] for f in data["findings"])
    assert data["containers"][0]["exit_code"] == 1
    assert time.monotonic() - start < 60  # a dead container ends the wait at once, not the 30-minute deadline
    assert ours(client) == []


def test_without_receipt_the_evidence_is_kept_anyway(engine, tmp_path):
    """The containers are removed, so the receipt and the node logs go to a new folder, named on stderr."""
    url, client, tags, _ = engine
    hf = tmp_path / "hf"
    hf.mkdir()
    outcome = run_patchkit("smoke", VARIANT, "--host", url, "--image", tags["kv-budget"], "--gpus", "none",
                           "--hf-cache", str(hf), "--health-interval", "0.2", timeout=180)
    assert outcome.code == 1, outcome.output[-3000:]
    [line] = [text for text in outcome.stderr.splitlines() if text.startswith("receipt: ")]
    receipt = Path(line.split()[1].rstrip(";"))
    try:
        assert json.loads(receipt.read_text())["cause"]["cause"] == "kv-budget"
        assert (LOGS / IMAGES["kv-budget"][0]).read_text() in (receipt.parent / "receipt.node0.log").read_text()
    finally:
        shutil.rmtree(receipt.parent)
    assert ours(client) == []


def test_a_log_past_its_limit_is_refused_and_cleaned_up(engine, tmp_path):
    url, client, tags, _ = engine
    outcome, data, _ = smoke(url, tags["good"], tmp_path, "--gpus", "none", env={"PATCHKIT_LIMIT_BOOT_LOG": "2000"})
    assert_refused(outcome, f"the log of patchkit-smoke-{VARIANT}-0", "2,000 B", "PATCHKIT_LIMIT_BOOT_LOG")
    assert data is None and ours(client) == []


def test_a_boot_that_never_becomes_healthy_is_bounded(engine, tmp_path):
    url, client, tags, _ = engine
    start = time.monotonic()
    outcome, data, _ = smoke(url, tags["killed"], tmp_path, "--gpus", "none", "--boot-timeout", "4")
    elapsed = time.monotonic() - start
    assert outcome.code == 1, outcome.output[-3000:]
    assert data["cause"]["cause"] == "still-booting" and data["verdict"]["phase"] == "profiling"
    assert any(f["what"] == "health" and "deadline 4 s passed" in f["detail"] for f in data["findings"])
    assert 4 <= data["timings"]["boot_to_health_s"] < 6 and elapsed < 60
    assert data["containers"][0]["exit_code"] is None  # still running when judged; then stopped and removed
    assert ours(client) == []


def test_ctrl_c_leaves_no_container(engine, tmp_path):
    url, client, tags, _ = engine
    hf = tmp_path / "hf"
    hf.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "patchkit", "smoke", VARIANT, "--host", url, "--image",
                             tags["killed"], "--gpus", "none", "--hf-cache", str(hf), "--health-interval", "0.2"],
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not [c for c in ours(client) if c.status == "running"]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0].decode()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        # The smoke's cleanup may wait its whole STOP_TIMEOUT_S before the engine SIGKILLs a container that
        # does not stop on SIGTERM; 60 s left 30 for the rest, which CI's loaded two cores overran (stop 40).
        output = proc.communicate(timeout=STOP_TIMEOUT_S + 120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in output and proc.returncode == 1 and "Aborted" in output, output[-3000:]
    assert ours(client) == []


def test_a_container_of_the_same_name_not_ours_is_left_alone(engine, tmp_path):
    url, client, tags, _ = engine
    name = f"patchkit-smoke-{VARIANT}-0"
    other = client.containers.create(tags["good"], name=name)
    try:
        outcome, data, _ = smoke(url, tags["good"], tmp_path, "--gpus", "none")
        assert_refused(outcome, url, name, "is not a patchkit smoke's", other.short_id)
        assert client.containers.get(name).id == other.id and data is None
    finally:
        other.remove(force=True)


def test_an_earlier_smokes_container_is_replaced(engine, tmp_path):
    """A smoke killed before its cleanup leaves its container: the next one removes it (by its label)."""
    url, client, tags, _ = engine
    name = f"patchkit-smoke-{VARIANT}-0"
    client.containers.create(tags["killed"], name=name, labels={SMOKE_LABEL: name})
    outcome, data, _ = smoke(url, tags["good"], tmp_path, "--gpus", "none")
    assert outcome.code == 0 and data["ok"], outcome.output[-3000:]
    assert ours(client) == []


def test_a_gpu_request_the_engine_cannot_satisfy_is_refused(engine, tmp_path):
    """No nvidia runtime here: dockerd refuses the device request at start; podman 4.3 takes it and keeps
    none, which the runner finds in the container and refuses rather than boot vLLM without a GPU."""
    url, client, tags, kind = engine
    outcome, data, _ = smoke(url, tags["good"], tmp_path, "--gpus", "all")
    said = ('could not select device driver "" with capabilities: [[gpu]]' if kind == "docker"
            else "accepted the GPU request (--gpus all) but the container has none")
    assert_refused(outcome, url, f"start the container patchkit-smoke-{VARIANT}-0", said)
    assert data is None and ours(client) == []


def test_the_loader_asked_for_is_served_and_a_missing_one_refused(engine, tmp_path):
    """--load-format instanttensor: the lab image pins instanttensor ([wheels]), so vLLM is started with the
    flag; the nvidia image does not, so the smoke is refused before any container is made."""
    url, client, tags, _ = engine
    outcome, data, _ = smoke(url, tags["good"], tmp_path, "--gpus", "none", "--load-format", "instanttensor")
    assert outcome.code == 0, outcome.output[-3000:]
    assert "--load-format instanttensor" in (tmp_path / "receipt.node0.log").read_text().splitlines()[0]
    (tmp_path / "nvidia").mkdir()
    refused, data, _ = smoke(url, tags["good"], tmp_path / "nvidia", "--gpus", "none", "--load-format",
                             "instanttensor", variant="nvidia-nvfp4")
    assert_refused(refused, "glm53-flash-nvidia-nvfp4", "instanttensor")
    assert data is None and ours(client) == []


def test_the_same_smoke_over_ssh(engine, tmp_path):
    """ssh://root@127.0.0.1:PORT through a real sshd: the docker SDK runs the system's ssh client and, on the
    far side, `docker system dial-stdio` to the engine (DOCKER_HOST from the key's environment)."""
    url, client, tags, _ = engine
    with SshServer(tmp_path / "sshd", env={"DOCKER_HOST": url}) as sshd:
        outcome, data, _ = smoke(sshd.url, tags["good"], tmp_path, "--gpus", "none", env=sshd.client_env)
    assert outcome.code == 0, outcome.output[-3000:]
    assert data["hosts"] == [sshd.url] and data["ok"] and data["chat"]["content"] == "17 times 3 is 51."
    assert data["containers"][0]["host"] == sshd.url
    assert ours(client) == []


def test_unreachable_and_unusable_hosts_are_refused(tmp_path):
    missing = f"unix://{tmp_path}/no.sock"
    assert_refused(run_patchkit("smoke", VARIANT, "--host", missing, "--image", "x", "--gpus", "none"),
                   missing, "connect to the Docker API")
    assert_refused(run_patchkit("smoke", VARIANT, "--host", "ssh://ops@spark1", "--image", "x"),
                   "--hf-cache ~/.cache/huggingface", "ssh://ops@spark1", "absolute path")
