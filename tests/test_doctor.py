"""`patchkit doctor log`: the real command on real public logs (and the hand-written lab boots), exit codes and JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

LOGS = Path(__file__).parent / "data" / "boot-logs"


def doctor(*args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "patchkit", "doctor", "log", *map(str, args)], check=False,
                          capture_output=True, text=True, input=stdin, timeout=120)


@pytest.mark.parametrize(
    ("log", "cause", "line_no", "fix"),
    [
        ("public/tenhkspark-stock-k5-boot-failure.log", "kv-budget", 1, "--kv-cache-memory-bytes"),
        ("public/vllm-33297-free-memory.log", "startup-free-memory", 1, "--gpu-memory-utilization"),
        ("4p67-engine-dies.log", "missing-weight-scale", 15, "packed-modules-4p67"),
        ("nvidia-fastsafetensors-oom.log", "nv-err-no-memory", None, "--load-format safetensors"),
        ("public/vllm-55442-parallel-lm-head-nan.log", "weight-scale-never-loaded", 1, "defer_lm_head"),
        ("public/sfxnz-nvidia-killed-boot.log", "ended-without-error", 10, "--gpu-memory-utilization"),
    ],
)
def test_doctor_names_the_cause_of_each_failure_log(log, cause, line_no, fix):
    run = doctor(LOGS / log, "--json")
    assert run.returncode == 1, run.stderr
    data = json.loads(run.stdout)
    assert data["ok"] is False and data["cause"]["cause"] == cause
    assert fix in data["cause"]["fix"]
    text = (LOGS / log).read_text().splitlines()
    got = data["cause"]["line_no"]
    assert line_no in (None, got)
    assert data["cause"]["line"] == re.sub(r"\x1b\[[0-9;]*m", "", text[got - 1]).strip()
    human = doctor(LOGS / log)
    assert human.returncode == 1 and f"cause: {cause}" in human.stdout and f"line {got}:" in human.stdout


def test_doctor_passes_a_good_boot_against_its_variant_and_reads_stdin():
    good = doctor("-", "--variant", "lab", "--json", stdin=(LOGS / "lab-good.log").read_text())
    assert good.returncode == 0, good.stdout + good.stderr
    data = json.loads(good.stdout)
    assert data["variant"] == "lab" and data["cause"] is None
    assert data["speculative"] == {"method": "mtp", "draft_architecture": "Glm5NextMTPModel", "num_spec_tokens": 3,
                                   "acceptance_lengths": [3.12], "acceptance": 1 + 3 * 1950 / 2760}
    # Against the variant without a speculator the same log fails, naming what attached.
    redhat = json.loads(doctor(LOGS / "lab-good.log", "--variant", "redhat", "--json").stdout)
    assert "mtp (Glm5NextMTPModel) attached; the variant expects none" in [f["detail"] for f in redhat["findings"]]


def test_doctor_reports_the_acceptance_of_a_real_mtp_log_cut_short():
    run = doctor(LOGS / "public/tenhkspark-route-h-mtp2-engine.log", "--cut-short", "--json")
    data = json.loads(run.stdout)
    assert run.returncode == 0 and data["cause"] is None
    assert data["speculative"]["acceptance_lengths"][-1] == 2.96


def test_a_real_serving_excerpt_is_not_a_killed_boot():
    """The excerpt starts after the boot (request and engine statistics lines only): the engine served, so
    the log alone is no failure and names no cause."""
    run = doctor(LOGS / "public/tenhkspark-route-h-mtp2-engine.log", "--json")
    data = json.loads(run.stdout)
    assert run.returncode == 0 and data["cause"] is None, run.stdout
    assert data["markers"]["serving_lines"] == sum(
        "Avg prompt throughput" in line or "SpecDecoding metrics" in line
        for line in (LOGS / "public/tenhkspark-route-h-mtp2-engine.log").read_text().splitlines())
    startup = [f for f in data["findings"] if f["what"] == "startup"]
    assert [f["level"] for f in startup] == ["warn"] and "starts after the boot" in startup[0]["detail"]


def test_doctor_on_the_real_day0_dflash_boot():
    text = (LOGS / "public/sfxnz-nvidia-dflash2-good-boot.log").read_text()
    alone = doctor(LOGS / "public/sfxnz-nvidia-dflash2-good-boot.log", "--json")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    data = json.loads(alone.stdout)
    lengths = [float(x) for x in re.findall(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+)", text)]
    sums = [sum(int(x) for x in re.findall(rf"{what}: (\d+) tokens", text)) for what in ("Accepted", "Drafted")]
    assert data["speculative"] == {"method": "dflash", "draft_architecture": "DFlash2DraftModel", "num_spec_tokens": 7,
                                   "acceptance_lengths": lengths, "acceptance": 1 + 7 * sums[0] / sums[1]}
    assert (data["markers"]["weights_gib"], data["markers"]["weights_line"], data["markers"]["kv_cache_tokens"]) == (
        90.36, "weights-day0", 372_877)
    assert data["markers"]["v2_runner"] and data["phase"] == "serving" and data["cause"] is None
    # Against nvidia-nvfp4, whose variant serves its own MTP layer: the DFlash drafter is the failure.
    against = doctor(LOGS / "public/sfxnz-nvidia-dflash2-good-boot.log", "--variant", "nvidia-nvfp4", "--json")
    assert against.returncode == 1
    assert [(f["what"], f["detail"]) for f in json.loads(against.stdout)["findings"] if f["level"] == "fail"] == [
        ("speculative", "dflash (DFlash2DraftModel) attached; the variant expects mtp")]


def test_doctor_judges_a_stopped_log_as_not_booted_unless_cut_short():
    killed = LOGS / "public/sfxnz-nvidia-killed-boot.log"
    data = json.loads(doctor(killed, "--json").stdout)
    assert data["phase"] == "profiling" and data["cause"]["what"].startswith("killed from outside during profiling")
    human = doctor(killed)
    assert human.returncode == 1
    assert "cause: ended-without-error: killed from outside during profiling" in " ".join(human.stdout.split())
    cut = doctor(killed, "--cut-short", "--json")
    assert cut.returncode == 0 and json.loads(cut.stdout)["cause"] is None


def test_doctor_bad_input_exits_2():
    run = doctor(LOGS / "no-such.log")
    assert run.returncode == 2 and "cannot read the log" in run.stderr and "Traceback" not in run.stderr
    unknown = doctor(LOGS / "lab-good.log", "--variant", "no-such-variant")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr


def test_doctor_asks_for_quantprobe_lines_only_when_told_the_switch_was_on():
    unknown = json.loads(doctor(LOGS / "redhat-good.log", "--variant", "redhat", "--json").stdout)
    assert unknown["ok"] and [f["level"] for f in unknown["findings"] if f["what"] == "quantprobe"] == ["warn"]
    told = doctor(LOGS / "redhat-good.log", "--variant", "redhat", "--quantprobe", "--json")
    assert told.returncode == 1
    assert any("printed no [quantprobe] line" in f["detail"] for f in json.loads(told.stdout)["findings"])


def test_a_log_that_is_a_directory_exits_2(tmp_path):
    run = doctor(tmp_path)
    assert run.returncode == 2 and "is a directory, not a regular file" in run.stderr and "Traceback" not in run.stderr


def test_a_log_on_a_closed_stdin_exits_2():
    run = subprocess.run([sys.executable, "-m", "patchkit", "doctor", "log", "-"], check=False, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0))
    assert run.returncode == 2 and "standard input is closed" in run.stderr and "Traceback" not in run.stderr


def _load_advice(*args) -> list[str]:
    run = doctor(LOGS / "public/sfxnz-nvidia-dflash2-good-boot.log", *args, "--json")
    assert run.returncode in (0, 1), run.stdout + run.stderr
    data = json.loads(run.stdout)
    assert (data["markers"]["load_format"], data["markers"]["weights_load_s"]) == ("auto", 783.17347)
    return [f["detail"] for f in data["findings"] if f["what"] == "weight load" and f["level"] == "warn"]


def test_a_slow_weight_load_names_instanttensor_by_what_the_variants_image_carries():
    """The real day-0 boot's 783 s load (load_format=auto, from its engine banner): the lab image pins
    instanttensor, so the fix is the flag; the nvidia image does not, so the fix is an image that does."""
    [lab] = _load_advice("--variant", "lab")
    assert "783 s with load_format=auto" in lab and "serve with --load-format instanttensor" in lab
    [nvidia] = _load_advice("--variant", "nvidia-nvfp4")
    assert "does not carry instanttensor" in nvidia
    [unknown] = _load_advice()
    assert "name --variant" in unknown


def test_a_fast_load_or_an_instanttensor_load_gets_no_advice():
    from patchkit.bootlog.judge import judge_log

    text = (LOGS / "public/sfxnz-nvidia-dflash2-good-boot.log").read_text()
    assert not [f for f in judge_log(text.replace("load_format=auto", "load_format=instanttensor"), None).findings
                if f.what == "weight load"]
    fast = text.replace("Model loading took 90.36 GiB and 783.173470 seconds", "Model loading took 90.36 GiB and 41.2 seconds")
    assert not [f for f in judge_log(fast, None, extras=set()).findings if f.what == "weight load"]
