"""`patchkit wheel build` on vLLM 0.34.0's real aarch64 wheel, whose METADATA requires flashinfer-python==0.7.3,
a version the index never published (issue 32).

The patched wheel requires the companion policy's substitute (0.7.2.post1, sources.companion) in the pin's
place and records the substitution in its patchkit.json, listed in RECORD like every member. The policy is
asked of the recorded flashinfer-python page (tests/data/index/, served by a real HTTP index on 127.0.0.1);
the wheel is the real release file from the user cache (downloaded from the real index once, hence
`network`, as in test_companion.py). Whether pip resolves what was built is asked of the real index
(`network`): the patched wheel resolves for a Spark, the stock one fails on flashinfer-python==0.7.3; the
answers of one run are kept in tests/data/wheel-034/ (its README says how they were made).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit.cli.main import PatchkitGroup
from patchkit.cli.wheel import wheel_group
from patchkit.sources.pins import pinned_in_metadata
from patchkit.sources.verified_wheel import open_wheel
from patchkit.wheels.manifest import WheelManifest
from patchkit.wheels.requires import PinNotInMetadata, Substitution, substitute_requirement
from test_sources import FakeIndex
from wheel_files import assert_record_matches, cache_release_wheel, members

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "index" / "flashinfer-python.json"
DATA = REPO / "tests" / "data" / "wheel-034"
REAL_METADATA = REPO / "tests" / "data" / "wheel-metadata" / "vllm-0.34.0-aarch64.METADATA"
PAGE = "/simple/flashinfer-python/"
PIN_LINE = "Requires-Dist: flashinfer-python==0.7.3"
SUBSTITUTED_LINE = "Requires-Dist: flashinfer-python==0.7.2.post1"
REASON = ("flashinfer-python 0.7.3 unpublished (index has 0.7.2.post1, 0.7.4); 0.7.2.post1 is the newest final 0.7 "
          "release below the pin, the substitute patchkit's companion policy (patchkit.sources.companion) checks "
          "the release's flashinfer against")
# The machine pip resolves for: the Spark (aarch64, DGX OS 7 = Ubuntu 24.04, glibc 2.39), CPython 3.12. Every
# manylinux tag such a glibc installs is named: pip expands no `manylinux_2_X` tag to older ones, and vLLM
# 0.34.0's requirements need manylinux_2_17 (blake3) to manylinux_2_34 (tilelang 0.1.12) aarch64 wheels.
PLATFORMS = [f"manylinux_2_{minor}_aarch64" for minor in range(39, 16, -1)] + ["manylinux2014_aarch64"]


@pytest.fixture(scope="module")
def real_wheel() -> Path:
    """vLLM 0.34.0's real aarch64 wheel (239 MB), from the user cache (downloaded from the real index once)."""
    from patchkit.wheels.release import release_wheel

    with pytest.MonkeyPatch.context() as env:
        env.delenv("PATCHKIT_INDEX_URL", raising=False)
        return release_wheel("0.34.0", "aarch64", progress=False)


def build(real_wheel: Path, root: Path, index_url: str) -> tuple:
    """`patchkit wheel build --vllm 0.34.0 --platform aarch64 --series full --json`, the release wheel in a
    cache of its own (linked), the index at `index_url`: (the result, its JSON, the wheel built or None)."""
    cache_release_wheel(real_wheel, root / "cache")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PATCHKIT_INDEX_URL", index_url)
        env.setenv("PATCHKIT_CACHE_DIR", str(root / "cache"))
        cli = PatchkitGroup("patchkit", commands={"wheel": wheel_group})
        result = CliRunner().invoke(cli, ["wheel", "build", "--vllm", "0.34.0", "--platform", "aarch64", "--series",
                                          "full", "--output", str(root / "out"), "--json"],
                                    env={"COLUMNS": "10000"}, catch_exceptions=False)
    doc = json.loads(result.stdout) if result.exit_code == 0 else None
    return result, doc, Path(doc[0]["wheel"]) if doc else None


@pytest.fixture(scope="module")
def substituted(real_wheel, tmp_path_factory):
    """The patched wheel built with the policy asked of the recorded page: (result, JSON, wheel, requests)."""
    index = FakeIndex()
    index.recorded["flashinfer-python"] = RECORDED.read_bytes()
    try:
        result, doc, wheel = build(real_wheel, tmp_path_factory.mktemp("substituted"), index.url)
    finally:
        index.server.shutdown()
        index.server.server_close()
    assert result.exit_code == 0, result.output + result.stderr
    return result, doc, wheel, index.requests


def dist_info_file(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as archive:
        (found,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}") and n.count("/") == 1]
        return archive.read(found)


def changed_lines(before: bytes, after: bytes) -> list[tuple[str, str]]:
    old, new = before.decode().splitlines(), after.decode().splitlines()
    return [(a, b) for a, b in zip(old, new, strict=True) if a != b]


# --- the patched wheel: its METADATA, its record, its RECORD -------------------------------------------------


def test_the_patched_wheel_requires_the_substitute_where_the_release_pins_073(real_wheel, substituted):
    result, doc, wheel, requests = substituted
    assert requests == [PAGE]  # the policy asked once; the release wheel came from the cache
    release_metadata = dist_info_file(real_wheel, "METADATA")
    assert PIN_LINE in release_metadata.decode().splitlines()  # the real release, as published
    assert pinned_in_metadata(release_metadata) == "0.7.3"
    metadata = dist_info_file(wheel, "METADATA")
    version = doc[0]["version"]
    assert changed_lines(release_metadata, metadata) == [("Version: 0.34.0", f"Version: {version}"),
                                                         (PIN_LINE, SUBSTITUTED_LINE)]
    assert pinned_in_metadata(metadata) == "0.7.2.post1"
    assert "0.7.3" not in metadata.decode().split("\n\n", 1)[0]  # no header names the pin any more
    assert ("and the patched wheel requires flashinfer-python==0.7.2.post1 in the pin's place (recorded in its "
            "dist-info's patchkit.json)") in result.stderr
    assert "  requires flashinfer-python==0.7.2.post1 where the release requires flashinfer-python==0.7.3" \
        in result.stderr


def test_the_wheel_records_the_substitution_with_its_reason(substituted):
    _, doc, wheel, _ = substituted
    expected = {"dist": "flashinfer-python", "pin": "0.7.3", "substitute": "0.7.2.post1",
                "release_requirement": "flashinfer-python==0.7.3", "requirement": "flashinfer-python==0.7.2.post1",
                "reason": REASON}
    record = json.loads(dist_info_file(wheel, "patchkit.json"))
    assert record["substituted"] == [expected]
    assert doc[0]["substituted"] == [expected]  # the command's JSON carries it too
    assert doc[0]["companion"]["how"] == "substitute" and doc[0]["companion"]["checked"] == "0.7.2.post1"
    manifest = WheelManifest.from_bytes(dist_info_file(wheel, "patchkit.json"))  # what status and index read
    assert [s.requirement for s in manifest.substituted] == ["flashinfer-python==0.7.2.post1"]
    assert (f"  requires flashinfer-python==0.7.2.post1 where the release requires flashinfer-python==0.7.3: "
            f"{REASON}") in manifest.describe({})


def test_every_record_row_of_the_patched_wheel_matches_its_member(substituted):
    """RECORD checked from outside the writer (zipfile and hashlib), then by patchkit's own release checks."""
    _, doc, wheel, _ = substituted
    files = members(wheel)
    dist_info = f"vllm-{doc[0]['version']}.dist-info"
    rows = assert_record_matches(files, dist_info)
    assert {f"{dist_info}/METADATA", f"{dist_info}/patchkit.json"} <= {r[0] for r in rows}
    with open_wheel(wheel) as verified:
        assert verified.version == doc[0]["version"] and len(verified.members) == len(files)
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == doc[0]["sha256"]


def test_two_builds_with_the_same_answer_give_the_same_wheel(real_wheel, substituted, tmp_path):
    _, doc, _, _ = substituted
    index = FakeIndex()
    index.recorded["flashinfer-python"] = RECORDED.read_bytes()
    try:
        result, again, _ = build(real_wheel, tmp_path, index.url)
    finally:
        index.server.shutdown()
        index.server.server_close()
    assert result.exit_code == 0, result.output
    assert (Path(again[0]["wheel"]).name, again[0]["sha256"]) == (Path(doc[0]["wheel"]).name, doc[0]["sha256"])


# --- no substitute: the pin is kept, and the command says so -----------------------------------------------


def closed_port_url() -> str:
    """An index URL on a loopback port nothing listens on (bound by the kernel's choice, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


@pytest.mark.parametrize("index", ["unreachable", "no-such-project"])
def test_without_a_substitute_the_wheel_keeps_the_releases_pin(real_wheel, tmp_path, index):
    """The index cannot be asked (nothing listens), or it has no flashinfer-python at all (a 404): the policy
    gives no substitute, the wheel states the release's requirement as it is, and the command says so."""
    fake = FakeIndex() if index == "no-such-project" else None
    try:
        result, doc, wheel = build(real_wheel, tmp_path, fake.url if fake else closed_port_url())
    finally:
        if fake:
            fake.server.shutdown()
            fake.server.server_close()
    assert result.exit_code == 0, result.output + result.stderr
    assert changed_lines(dist_info_file(real_wheel, "METADATA"), dist_info_file(wheel, "METADATA")) == [
        ("Version: 0.34.0", f"Version: {doc[0]['version']}")]
    assert "substituted" not in json.loads(dist_info_file(wheel, "patchkit.json"))
    assert doc[0]["substituted"] == []
    kept = "the patched wheel keeps the release's requirement, which pip cannot install where it is unpublished"
    assert kept in result.stderr and "requires flashinfer-python==0.7.2.post1" not in result.stderr
    if fake:
        assert ("flashinfer-python 0.7.3 pinned, and the index lists no flashinfer-python at all: nothing of "
                "flashinfer checked; " + kept) in result.stderr
    else:
        assert "the index was not asked whether it is published" in result.stderr


# --- the rewrite itself, on the real METADATA -------------------------------------------------------------

SUBSTITUTION = Substitution("flashinfer-python", "0.7.3", "0.7.2.post1", "why")


def test_only_the_pinning_header_changes_and_its_extras_and_markers_stay():
    real = REAL_METADATA.read_bytes()
    assert PIN_LINE.encode() in real
    spelled = real.replace(PIN_LINE.encode(), b'Requires-Dist: FlashInfer_Python[cu13] == 0.7.3 ; '
                                              b'platform_machine == "aarch64"')
    spelled += b"\npip install flashinfer-python==0.7.3\n"  # the description: never read as headers
    new, done = substitute_requirement(spelled, SUBSTITUTION, "METADATA")
    assert changed_lines(spelled, new) == [
        ('Requires-Dist: FlashInfer_Python[cu13] == 0.7.3 ; platform_machine == "aarch64"',
         'Requires-Dist: FlashInfer_Python[cu13] == 0.7.2.post1 ; platform_machine == "aarch64"')]
    assert [(d.release_requirement, d.requirement) for d in done] == [
        ('FlashInfer_Python[cu13] == 0.7.3 ; platform_machine == "aarch64"',
         'FlashInfer_Python[cu13] == 0.7.2.post1 ; platform_machine == "aarch64"')]
    assert new.endswith(b"\npip install flashinfer-python==0.7.3\n")


def test_a_metadata_that_does_not_pin_the_version_is_refused():
    ranged = REAL_METADATA.read_bytes().replace(PIN_LINE.encode(), b"Requires-Dist: flashinfer-python>=0.7.3")
    # CRLF lines: the pin is read from them (pins.pinned_in_metadata, an email parser), but no header line
    # the rewrite reads is one it can restate as it stands
    crlf = REAL_METADATA.read_bytes().replace(b"\n", b"\r\n")
    assert pinned_in_metadata(crlf) == "0.7.3"
    for metadata in (ranged, crlf):
        with pytest.raises(PinNotInMetadata) as err:
            substitute_requirement(metadata, SUBSTITUTION, "METADATA")
        assert (err.value.where, err.value.dist, err.value.pin) == ("METADATA", "flashinfer-python", "0.7.3")


# --- pip's own answer: does the wheel resolve on the index? -----------------------------------------------


def python312() -> str:
    """CPython 3.12, the Python of the Spark's vLLM images: on PATH or pyenv's (a pyenv shim only where it runs);
    else this interpreter, its pip told `--python-version 3.12`."""
    candidates = [shutil.which("python3.12")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False).stdout.strip()
        candidates += [str(p) for p in sorted(Path(root).glob("versions/3.12*/bin/python3.12"), reverse=True)] if root \
            else []
    for candidate in filter(None, candidates):
        probe = [candidate, "-c", "import sys, pip; assert sys.version_info[:2] == (3, 12)"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return candidate
    return sys.executable


def resolve(wheel: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`pip install --dry-run --report` of `wheel` for the Spark: pip's resolution, nothing installed."""
    report = tmp_path / "report.json"
    command = [python312(), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--target",
               str(tmp_path / "target"), *(a for p in PLATFORMS for a in ("--platform", p)), "--python-version",
               "3.12", "--only-binary=:all:", "--disable-pip-version-check", "--report", str(report), str(wheel)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200, check=False)
    return proc, json.loads(report.read_text()) if report.exists() and proc.returncode == 0 else None


def test_pip_resolves_the_patched_wheel_with_the_substitute(substituted, tmp_path):
    _, doc, wheel, _ = substituted
    proc, report = resolve(wheel, tmp_path)
    assert proc.returncode == 0 and report is not None, proc.stderr[-4000:]
    installs = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert installs["vllm"] == doc[0]["version"] and installs["flashinfer-python"] == "0.7.2.post1"
    (vllm,) = [i for i in report["install"] if i["metadata"]["name"] == "vllm"]
    assert "flashinfer-python==0.7.2.post1" in vllm["metadata"]["requires_dist"]
    recorded = json.loads((DATA / "patched-resolution.json").read_text())  # one run's answer, kept
    assert recorded["vllm_requires_flashinfer"] == ["flashinfer-python==0.7.2.post1"]
    assert recorded["install"]["flashinfer-python"] == installs["flashinfer-python"]


def test_pip_cannot_resolve_the_stock_release_wheel(real_wheel, tmp_path):
    """The bug on stock: the release's own requirement, flashinfer-python==0.7.3, is on no index."""
    proc, _ = resolve(real_wheel, tmp_path)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert "ERROR: No matching distribution found for flashinfer-python==0.7.3" in errors, proc.stderr[-4000:]
    assert (DATA / "stock-resolution.txt").read_text().splitlines()[-1] == (
        "ERROR: No matching distribution found for flashinfer-python==0.7.3")
