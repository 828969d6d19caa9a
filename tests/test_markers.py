"""Every log line the harness reads is an anchor: its format string must stand in the released sources.

The released vLLM sdists (0.30.0-0.33.0, from the package index through patchkit.sources, cached) are
read for each marker's and each fatal cause's literal, so an upstream rewording fails here. Each
marker's pattern must read its sample line, which is a real public log line where one exists.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

from patchkit.sources import SdistCache
from patchkit.sources.release import open_release
from patchkit.variants.smoke.causes import CAUSES, find_causes
from patchkit.variants.smoke.markers import MARKER, MARKERS, RELEASES, parse_boot_log

REPO = Path(__file__).resolve().parents[1]
VLLM_ANCHORS = [(m.name, m.literal, m.files) for m in MARKERS if m.releases] + [
    (c.name, c.literal, c.files) for c in CAUSES if c.literal
]


@functools.cache
def release_files(version: str) -> dict[str, str]:
    """The files every anchor names, read once per release from its real sdist."""
    source = open_release("vllm", version, cache=SdistCache(), progress=False)
    paths = sorted({f.removeprefix("vllm/") for _, _, files in VLLM_ANCHORS for f in files})
    return {f"vllm/{p}": (data or b"").decode() for p, data in source.read_many("vllm", paths).items()}


@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(("name", "literal", "files"), VLLM_ANCHORS, ids=[a[0] for a in VLLM_ANCHORS])
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
