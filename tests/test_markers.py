"""Every log line the harness reads is an anchor: its format string must stand in the released sources.

The released vLLM sdists (0.30.0-0.33.0, from the package index through patchkit.sources, cached) are
read for each marker's and each fatal cause's literal, so an upstream rewording fails here. Each
marker's pattern must read its sample line, which is a real public log line where one exists.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import pytest

from patchkit import SUPPORTED_VLLM
from patchkit.bootlog.causes import CAUSES, find_causes
from patchkit.bootlog.markers import MARKER, MARKERS, parse_boot_log
from patchkit.sources import ArchiveCache
from patchkit.sources.release import open_release

REPO = Path(__file__).resolve().parents[1]
DAY0_BOOT = REPO / "tests/data/boot-logs/public/sfxnz-nvidia-dflash2-good-boot.log"  # a real day-0 base boot
VLLM_ANCHORS = [(m.name, m.literal, m.files) for m in MARKERS if m.releases] + [
    (c.name, c.literal, c.files) for c in CAUSES if c.literal
]
# Each anchor with every release whose sources must carry it (a cause new in 0.34.0 names 0.34.0 on).
RELEASE_ANCHORS = [(v, m.name, m.literal, m.files) for m in MARKERS for v in m.releases] + [
    (v, c.name, c.literal, c.files) for c in CAUSES if c.literal for v in c.releases
]


@functools.cache
def release_files(version: str) -> dict[str, str]:
    """The files every anchor names, read once per release from its real sdist."""
    source = open_release("vllm", version, cache=ArchiveCache(), progress=False)
    paths = sorted({f.removeprefix("vllm/") for _, _, files in VLLM_ANCHORS for f in files})
    return {f"vllm/{p}": (data or b"").decode() for p, data in source.read_many("vllm", paths).items()}


@pytest.mark.network
@pytest.mark.parametrize(("version", "name", "literal", "files"), RELEASE_ANCHORS,
                         ids=[f"{a[1]}-{a[0]}" for a in RELEASE_ANCHORS])
def test_every_anchor_stands_in_each_release(version, name, literal, files):
    texts = release_files(version)
    where = [f for f in files if literal in texts[f]]
    assert where, f"{name}: {literal!r} is in none of {files} in vLLM {version}"


def test_each_pattern_reads_its_sample_and_the_sample_carries_the_literal():
    for marker in MARKERS:
        assert marker.pattern.search(marker.sample), marker.name
        fixed = marker.literal.split("%")[0].split("{")[0].strip("f\"")
        assert fixed in marker.sample, (marker.name, fixed)
        assert marker.releases or marker.record, f"{marker.name}: no release carries it and no record says where it comes from"


def test_the_day0_wording_is_in_no_supported_release():
    # The base's `Model loading took X GiB and Y seconds` would be missed by a 0.33-only parser.
    assert MARKER["weights-day0"].releases == ()
    day0 = parse_boot_log("INFO [gpu_model_runner.py:2653] Model loading took 90.36 GiB and 740.581376 seconds")
    assert (day0.weights_gib, day0.weights_load_s, day0.weights_line) == (90.36, 740.581376, "weights-day0")
    current = parse_boot_log(MARKER["weights"].sample)
    assert (current.weights_gib, current.weights_load_s, current.weights_line) == (92.19, 700.214, "weights")


@pytest.mark.vllm
def test_startup_marker_is_uvicorns_own_line():
    spec = importlib.util.find_spec("uvicorn")
    assert spec is not None and spec.origin, "uvicorn (a vLLM dependency) is not installed"
    source = (Path(spec.origin).parent / "lifespan" / "on.py").read_text()
    assert MARKER["startup"].literal in source


def test_quantprobe_marker_matches_the_patch_that_prints_it():
    marker = MARKER["quantprobe"]
    texts = [(REPO / f).read_text() for f in marker.files]
    assert any(marker.literal.removeprefix("f") in text for text in texts), f"{marker.files} print no {marker.literal}"


def test_every_cause_is_named_from_its_own_line_first():
    for cause in CAUSES:
        assert cause.literal or cause.record, f"{cause.name}: neither a vLLM literal nor a record"
        found = find_causes(cause.sample)
        assert found and found[0].cause == cause.name, (cause.name, [f.cause for f in found])
        assert found[0].line == cause.sample and found[0].line_no == 1


def test_a_sample_whose_record_names_a_test_file_is_a_line_of_that_file():
    """Lines no release prints (the day-0 base's, a watcher's) record the public log they come from."""
    named = 0
    for item in (*MARKERS, *CAUSES):
        for path in re.findall(r"tests/data/\S+?\.log", item.record):
            lines = (REPO / path).read_text().splitlines()
            assert any(item.sample in line for line in lines), (item.name, path)
            named += 1
    assert named >= 2  # weights-day0 and watcher-kill at least


def test_every_marker_the_real_day0_boot_prints_is_anchored():
    """What the harness reads off a real boot of the pinned base: each marker either stands in the
    released sources (test above) or names the public record of the base's own wording."""
    lines = DAY0_BOOT.read_text().splitlines()
    fired = {m.name for m in MARKERS if any(m.pattern.search(line) for line in lines)}
    assert fired == {"weights-day0", "weights-load-time", "load-format", "kv-cache", "v2-runner", "architecture", "engine-config",
                     "speculative-config", "speculator-capture", "spec-metrics", "engine-stats", "startup"}
    for name in fired:
        marker = MARKER[name]
        assert marker.releases or marker.record, name
    assert MARKER["weights-day0"].record.startswith("the day-0 base's own boot: tests/data/boot-logs/public/")
    assert MARKER["weights-day0"].sample in lines


@pytest.mark.network
@pytest.mark.parametrize("version", SUPPORTED_VLLM)
def test_the_real_boots_drafter_is_a_vllm_name_in_each_release(version):
    """The DFlash2 drafter of the real day-0 boot is a registered draft architecture and `dflash` a
    speculative method in every supported release, so the method the harness names is vLLM's own."""
    boot = parse_boot_log(DAY0_BOOT.read_text())
    source = open_release("vllm", version, cache=ArchiveCache(), progress=False)
    texts = {p: (d or b"").decode() for p, d in source.read_many(
        "vllm", ["model_executor/models/registry.py", "config/speculative.py"]).items()}
    assert f'"{boot.draft_architecture}":' in texts["model_executor/models/registry.py"]
    assert f'"{boot.spec_method}"' in texts["config/speculative.py"]


def _real_logs() -> list[Path]:
    return sorted((REPO / "tests/data/boot-logs").rglob("*.log"))


@pytest.mark.parametrize("path", _real_logs(), ids=lambda p: p.name)
def test_a_log_streamed_from_its_file_reads_as_its_text(path):
    """`patchkit doctor` streams a file line by line (patchkit.untrusted.lines); the live smoke hands over
    text. Both routes read the same markers and causes off every real log."""
    from patchkit.untrusted import lines

    text = path.read_text(encoding="utf-8", errors="replace")
    with path.open("rb") as f:
        streamed = parse_boot_log(lines(f, str(path)))
    with path.open("rb") as f:
        streamed_causes = find_causes(lines(f, str(path)))
    assert streamed == parse_boot_log(text)
    assert streamed_causes == find_causes(text)


def test_a_long_serving_log_keeps_bounded_lists_and_exact_totals():
    """Millions of SpecDecoding lines (a days-long capture, or a hostile one) cost no more memory than a
    thousand: the kept lists are bounded, the counts and the acceptance over every interval exact."""
    from patchkit.bootlog.markers import KEEP_FIRST, KEEP_LAST

    sample, n = MARKER["spec-metrics"].sample, 3 * KEEP_LAST + 5
    log = ((line, False) for line in [MARKER["architecture"].sample] * 50 + [sample] * n)
    m = parse_boot_log(log)
    assert m.intervals == n and m.serving_lines == n
    assert len(m.acceptance_lengths) < 2 * KEEP_LAST and m.acceptance_lengths[-1] == 2.33
    assert (m.accepted_total, m.drafted_total) == (4 * n, 6 * n)
    assert m.overall_acceptance(2) == 1 + 2 * 4 / 6
    assert len(m.architectures) == KEEP_FIRST and len(m.spec_evidence) == KEEP_FIRST
