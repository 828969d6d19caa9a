"""The companion policy (sources.companion): what is checked beside a vLLM release whose FlashInfer pin the
index never published. vLLM 0.34.0 pins flashinfer-python 0.7.3; the index has 0.7.2.post1 and 0.7.4.

The policy is tested on packaging versions and on the index's real flashinfer-python page (recorded in
tests/data/index/, served by a real HTTP index on 127.0.0.1); verify and check run over the real 0.34.0
and 0.33.0 sdists and FlashInfer 0.7.2.post1's (the user cache: downloaded once, hence `network`), the
FlashInfer the policy picks read for real. A release pinning what no policy can substitute is built here
(no published release does). 0.33.0 is the release whose pin is published, named as such, not as the
pinned release: verify adds the pinned one to every matrix, and these columns are the same while it is
either of the two.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.version import Version

from builders import write_patchset
from patchkit import PINNED_VLLM
from patchkit.cli.main import PatchkitGroup
from patchkit.cli.patching import check
from patchkit.cli.verify import verify_command
from patchkit.sources import open_source
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.companion import Companion, How, choose, resolve_pin
from patchkit.sources.pins import pinned_in_metadata
from patchkit.untrusted import InputTooLarge
from test_sources import FakeIndex, sdist_bytes, tar_gz
from wheel_files import cache_release_wheel

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "index" / "flashinfer-python.json"
PAGE = "/simple/flashinfer-python/"
ENVS_ANCHOR = '    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),\n'  # in 0.33.0 and 0.34.0
SPARSE_MLA = "    rope_v32 = kv_lora_rank == 512 and qk_rope_head_dim == 64 and query.size(-1) == 576\n"  # 0.7.2.post1
SUBSTITUTED = "flashinfer-python 0.7.3 unpublished (index has 0.7.2.post1, 0.7.4): checked 0.7.2.post1 instead"
PUBLISHED = "0.33.0"  # the release before 0.34.0: its flashinfer-python pin, 0.7.2.post1, is published
BOTH = f"{PUBLISHED},0.34.0"  # --versions: both columns whichever of the two is pinned


def versions(*texts: str) -> list[Version]:
    return [Version(t) for t in texts]


def recorded_versions() -> set[Version]:
    """The versions of the recorded page with a file not yanked, as `resolve_pin` reads them."""
    return {Version(v) for v in json.loads(RECORDED.read_text())["versions"]}


# --- the policy, on versions --------------------------------------------------------------------------


def test_a_published_pin_is_checked_itself():
    assert choose("0.7.2.post1", recorded_versions()) == Companion("0.7.2.post1", "0.7.2.post1", How.PINNED)
    assert choose("0.7.2.post1", recorded_versions()).finding is None


def test_vllm_0340s_unpublished_pin_is_checked_on_the_newest_release_of_its_minor_below_it():
    chosen = choose("0.7.3", recorded_versions())
    assert (chosen.how, chosen.checked, chosen.neighbours) == (How.SUBSTITUTE, "0.7.2.post1", ("0.7.2.post1", "0.7.4"))
    assert chosen.finding == SUBSTITUTED


def test_post_releases_count_by_their_order_and_none_newer_than_the_pin_stands_in():
    assert choose("0.7.2.post2", versions("0.7.2", "0.7.2.post1", "0.7.4")).checked == "0.7.2.post1"
    # 0.7.2.post1 sorts after 0.7.2: not newer than the pin means 0.7.1 for an unpublished 0.7.2
    assert choose("0.7.2", versions("0.7.1", "0.7.2.post1")).checked == "0.7.1"
    assert choose("0.7.3", versions("0.7.1", "0.7.3.post1")).checked == "0.7.1"


def test_pre_releases_never_stand_in_nor_count_as_neighbours():
    chosen = choose("0.7.3", versions("0.7.1", "0.7.2rc6", "0.7.3rc1", "0.7.4rc1", "0.7.4"))
    assert (chosen.checked, chosen.neighbours) == ("0.7.1", ("0.7.1", "0.7.4"))
    only_rcs = choose("0.8.0", versions("0.7.4", "0.8.0rc1", "0.8.0.dev3"))
    assert (only_rcs.how, only_rcs.checked, only_rcs.problem) == (How.UNAVAILABLE, None, "no-release-of-its-minor")


def test_without_a_release_of_the_pins_minor_nothing_is_checked_and_the_finding_says_so():
    chosen = choose("0.8.1", versions("0.7.4", "0.8.2", "0.9.0"))
    assert (chosen.how, chosen.checked, chosen.neighbours) == (How.UNAVAILABLE, None, ("0.7.4", "0.8.2"))
    assert chosen.finding == ("flashinfer-python 0.8.1 unpublished (index has 0.7.4, 0.8.2): no 0.8 release at or "
                              "below it to check instead, nothing of flashinfer checked")
    assert choose("0.8.1", ()).finding == ("flashinfer-python 0.8.1 unpublished (index has no release): no 0.8 "
                                           "release at or below it to check instead, nothing of flashinfer checked")


def test_a_pin_that_is_not_one_version_is_a_finding_shown_cut_never_an_error():
    assert choose("0.7.*", recorded_versions()).finding == (
        "flashinfer-python pin '0.7.*' is not one version: nothing of flashinfer checked")
    long = choose("x" * 5000, recorded_versions())
    assert long.problem == "not-a-version" and long.pin == "x" * 40 + "..."


def test_an_explicit_companion_is_named_only_where_it_is_not_the_pin():
    assert Companion("0.7.3", "0.7.4", How.EXPLICIT).finding == (
        "flashinfer-python 0.7.4 checked as given, not the 0.7.3 the release pins")
    assert Companion("0.7.2.post1", "0.7.2.post1", How.EXPLICIT).finding is None
    assert Companion(None, "0.7.2", How.EXPLICIT).finding is None


def test_the_result_as_data():
    assert choose("0.7.3", recorded_versions()).to_dict() == {
        "dist": "flashinfer-python", "pin": "0.7.3", "checked": "0.7.2.post1", "how": "substitute",
        "neighbours": ["0.7.2.post1", "0.7.4"], "problem": None, "finding": SUBSTITUTED}


def test_vllm_0340s_real_wheel_metadata_pins_073():
    assert pinned_in_metadata((REPO / "tests" / "data" / "wheel-metadata" / "vllm-0.34.0-aarch64.METADATA").read_bytes()) \
        == "0.7.3"


def test_the_wheel_pin_is_read_from_requires_dist_exactly():
    metadata = (b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\nRequires-Dist: torch==2.14.0\n"
                b"Requires-Dist: not a requirement ((\nRequires-Dist: flashinfer-python==0.7.3; platform_system == "
                b"\"Linux\"\nRequires-Dist: numba==0.65.0\n\nlong description\n")
    assert pinned_in_metadata(metadata) == "0.7.3"
    assert pinned_in_metadata(b"Name: vllm\nRequires-Dist: flashinfer-python>=0.7\n") is None
    assert pinned_in_metadata(b"Name: vllm\nRequires-Dist: flashinfer_python==0.7.*\n") is None
    assert pinned_in_metadata(b"Name: vllm\nRequires-Dist: FlashInfer-Python==0.7.2.post1\n") == "0.7.2.post1"


# --- the policy, on the index's answer -------------------------------------------------------------


@pytest.fixture
def recorded_index(monkeypatch, tmp_path) -> FakeIndex:
    """A real HTTP index answering the recorded flashinfer-python page; an empty cache of its own."""
    fake = FakeIndex()
    fake.recorded["flashinfer-python"] = RECORDED.read_bytes()
    monkeypatch.setenv("PATCHKIT_INDEX_URL", fake.url)
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "cache"))
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_the_recorded_page_resolves_as_the_policy_says(recorded_index):
    cache = ArchiveCache()
    assert resolve_pin("0.7.3", cache=cache) == choose("0.7.3", recorded_versions())
    assert resolve_pin("0.7.2.post1", cache=cache).how == How.PINNED  # listed, though not downloaded
    assert resolve_pin("0.7.*", cache=cache).problem == "not-a-version"
    assert recorded_index.requests == [PAGE, PAGE]  # the not-a-version pin asks nothing


def test_a_pin_in_the_cache_asks_no_index(recorded_index, tmp_path):
    cache = ArchiveCache()
    recorded_index.add("flashinfer-python", "flashinfer_python-0.7.3.tar.gz",
                       sdist_bytes("flashinfer-python", "0.7.3", {"__init__.py": b""}, package="flashinfer"))
    del recorded_index.recorded["flashinfer-python"]  # the fake's own page, listing the 0.7.3 added
    open_source("flashinfer-python==0.7.3", cache=cache, progress=False)
    before = list(recorded_index.requests)
    assert resolve_pin("0.7.3", cache=cache).how == How.PINNED
    assert recorded_index.requests == before


def test_a_yanked_pin_is_still_published_but_a_yanked_release_never_stands_in(recorded_index):
    del recorded_index.recorded["flashinfer-python"]
    for version, yanked in (("0.7.1", False), ("0.7.2", True), ("0.7.3", True)):
        recorded_index.add("flashinfer-python", f"flashinfer_python-{version}.tar.gz", b"x", yanked=yanked)
    assert resolve_pin("0.7.3").how == How.PINNED
    assert resolve_pin("0.7.4").checked == "0.7.1"


def test_an_index_without_the_project_is_a_finding(recorded_index):
    del recorded_index.recorded["flashinfer-python"]
    companion = resolve_pin("0.7.3")
    assert (companion.how, companion.problem) == (How.UNAVAILABLE, "not-on-index")
    assert companion.finding == ("flashinfer-python 0.7.3 pinned, and the index lists no flashinfer-python at all: "
                                 "nothing of flashinfer checked")


def test_the_index_answer_is_read_bounded(recorded_index, monkeypatch):
    monkeypatch.setenv("PATCHKIT_LIMIT_INDEX_PAGE", "4096")  # the recorded page is ~15 KB
    with pytest.raises(InputTooLarge) as info:
        resolve_pin("0.7.3")
    assert (info.value.kind, info.value.limit) == ("index-page", 4096)


@pytest.mark.network
def test_the_real_index_has_no_073_and_substitutes_072post1(monkeypatch):
    """If FlashInfer ever publishes 0.7.3, this fails: the pin is then checked itself, and the recorded page
    (tests/data/index/) is due for a new recording."""
    monkeypatch.delenv("PATCHKIT_INDEX_URL", raising=False)
    companion = resolve_pin("0.7.3")
    assert (companion.how, companion.checked) == (How.SUBSTITUTE, "0.7.2.post1")
    assert companion.neighbours[0] == "0.7.2.post1"


# --- verify and check over the real 0.34.0 ----------------------------------------------------------------


def run(command, name: str, *args: str):
    cli = PatchkitGroup("patchkit", commands={name: command})
    return CliRunner().invoke(cli, [name, *args], env={"COLUMNS": "10000"}, catch_exceptions=False)


def verify_json(*args: str) -> tuple[int, dict]:
    result = run(verify_command, "verify", *args, "--json")
    assert result.exit_code in (0, 1), result.output + result.stderr
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def no_images(tmp_path) -> Path:
    (tmp_path / "no-images").mkdir()
    return tmp_path / "no-images"


@pytest.fixture(scope="module")
def real_archives() -> dict[tuple[str, str], Path]:
    """The real sdists, from the user cache (downloaded from the real index once)."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv("PATCHKIT_INDEX_URL", raising=False)
        user = ArchiveCache()
        wanted = [("vllm", PUBLISHED), ("vllm", "0.34.0"), ("flashinfer-python", "0.7.2.post1")]
        for dist, version in wanted:
            open_source(f"{dist}=={version}", cache=user, progress=False)
        return {(d, v): user.lookup(d, v).path for d, v in wanted}


@pytest.fixture
def real_cache(real_archives, recorded_index, tmp_path) -> FakeIndex:
    """The recorded index and a cache holding the real archives (linked) and their records: nothing to
    download, so the only request is the project page of the pin the cache lacks."""
    mine = ArchiveCache(tmp_path / "cache")  # the recorded index's PATCHKIT_CACHE_DIR
    mine.downloads.mkdir(parents=True)
    for (dist, version), path in real_archives.items():
        try:
            os.link(path, mine.downloads / path.name)
        except OSError:  # another file system
            shutil.copy(path, mine.downloads)
        shutil.copy(path.parent / f"{dist}-{version}.json", mine.downloads)
    return recorded_index


def sparse_mla_patches(folder: Path) -> Path:
    """One patch on real lines: vLLM's envs.py (0.33.0 and 0.34.0) and FlashInfer 0.7.2.post1's sparse MLA."""
    return write_patchset(
        folder,
        {"envs-and-sparse-mla": [
            {"file": "envs.py", "action": "insert_after", "anchor": ENVS_ANCHOR,
             "text": '    "VLLM_PATCHKIT_TEST": lambda: os.getenv("VLLM_PATCHKIT_TEST", ""),\n'},
            {"package": "flashinfer", "file": "mla/_core.py", "action": "assert", "anchor": SPARSE_MLA},
        ]},
        **{"envs-and-sparse-mla": {"vllm": ">=0.33.0", "packages": {"flashinfer": ">=0.7"}}},
    )


@pytest.mark.network
def test_verify_checks_0340_with_the_substitute_and_names_it_in_the_column_and_the_cell(real_cache, tmp_path,
                                                                                          no_images):
    args = ("--patches", str(sparse_mla_patches(tmp_path / "p")), "--images", str(no_images), "--versions", BOTH)
    code, doc = verify_json(*args)
    assert code == 0 and [c["label"] for c in doc["columns"]] == [PUBLISHED, "0.34.0"]
    assert [c["pinned"] for c in doc["columns"]] == [c["label"] == PINNED_VLLM for c in doc["columns"]]
    published, new = doc["columns"]
    assert published["companion"]["how"] == "pinned" and published["companion"]["finding"] is None
    assert new["companion"] == choose("0.7.3", recorded_versions()).to_dict()
    assert "flashinfer 0.7.2.post1 sdist (index, sha256 af60319898dc)" in new["source"]
    cells = doc["patches"][0]["cells"]
    assert cells["0.34.0"]["state"] == "applies" and cells["0.34.0"]["detail"] == ""  # FlashInfer's edit checked
    assert [e["state"] for e in cells["0.34.0"]["edits"]] == ["pending", "holds"]
    assert (cells["0.34.0"]["companion"], cells[PUBLISHED]["companion"]) == (SUBSTITUTED, None)
    assert real_cache.requests == [PAGE]  # nothing downloaded: the substitute was in the cache

    text = run(verify_command, "verify", *args)
    assert text.exit_code == 0
    assert f"0.34.0: {SUBSTITUTED}" in text.stdout
    assert f"envs-and-sparse-mla @ 0.34.0: applies; {SUBSTITUTED}" in text.stdout
    markdown = run(verify_command, "verify", *args, "--markdown")
    assert f"- 0.34.0: {SUBSTITUTED}" in markdown.stdout

    from patchkit.upstream.bump import _matrix_section  # the bump body reads the record
    from patchkit.upstream.bump_records import BumpRun, read
    from patchkit.verify.matrix_record import MatrixRecord

    (tmp_path / "verify.json").write_text(json.dumps(doc))
    record = read(tmp_path / "verify.json", MatrixRecord, "the verify record")
    assert f"- companion: 0.34.0: {SUBSTITUTED}" in _matrix_section(BumpRun("0.34.0", None, verify=record))


@pytest.mark.network
def test_check_pairs_0340_with_the_same_substitute_and_an_explicit_source_overrides_it(real_cache, tmp_path):
    patches = str(sparse_mla_patches(tmp_path / "p"))
    result = run(check, "check", "--source", "0.34.0", "--patches", patches, "--json")
    assert result.exit_code == 0, result.output + result.stderr
    doc = json.loads(result.stdout)
    assert doc["companion"] == choose("0.7.3", recorded_versions()).to_dict()
    assert doc["versions"] == {"vllm": "0.34.0", "flashinfer": "0.7.2.post1"}
    assert doc["patches"][0]["detail"] == "" and SUBSTITUTED in result.stderr

    given = run(check, "check", "--source", "0.34.0", "--source", "flashinfer-python==0.7.2.post1", "--patches",
                patches, "--json")
    assert given.exit_code == 0 and json.loads(given.stdout)["companion"]["how"] == "explicit"
    assert real_cache.requests == [PAGE]  # the explicit source asked the policy nothing


# --- a pin nothing can stand in for -------------------------------------------------------------------------


def vllm_release(version: str, cuda_txt: bytes | None) -> bytes:
    """A vLLM sdist of the files the small patch reads, with requirements/cuda.txt when given."""
    top = f"vllm-{version}"
    members = {f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n".encode(),
               f"{top}/vllm/__init__.py": b"",
               f"{top}/vllm/envs.py": f"environment_variables = {{\n{ENVS_ANCHOR}}}\n".encode()}
    if cuda_txt is not None:
        members[f"{top}/requirements/cuda.txt"] = cuda_txt
    return tar_gz(members)


@pytest.mark.parametrize("pin, finding", [
    (b"flashinfer-python==0.9.1\n", "flashinfer-python 0.9.1 unpublished (index has 0.7.4): no 0.9 release at or "
                                    "below it to check instead, nothing of flashinfer checked"),
    (b"flashinfer-python==0.7.*  # a wildcard\n", "flashinfer-python pin '0.7.*' is not one version: nothing of "
                                                  "flashinfer checked"),
])
def test_a_release_whose_pin_nothing_stands_in_for_is_a_finding_and_the_other_columns_stay(
        recorded_index, tmp_path, no_images, pin, finding):
    recorded_index.add("vllm", f"vllm-{PUBLISHED}.tar.gz", vllm_release(PUBLISHED, None))
    recorded_index.add("vllm", "vllm-0.34.0.tar.gz", vllm_release("0.34.0", b"torch==2.14.0\n" + pin))
    code, doc = verify_json("--patches", str(sparse_mla_patches(tmp_path / "p")), "--images", str(no_images),
                            "--versions", BOTH)
    assert code == 0 and [c["label"] for c in doc["columns"]] == [PUBLISHED, "0.34.0"]
    assert doc["columns"][0]["companion"] is None  # pins none
    assert doc["columns"][1]["companion"]["checked"] is None and doc["columns"][1]["companion"]["finding"] == finding
    cell = doc["patches"][0]["cells"]["0.34.0"]
    assert (cell["state"], cell["detail"], cell["companion"]) == (
        "applies", "flashinfer not in the source: its edits unchecked", finding)
    assert doc["patches"][0]["cells"][PUBLISHED]["state"] == "applies"


def test_with_overrides_the_policy_for_every_release(recorded_index, tmp_path, no_images):
    recorded_index.add("vllm", f"vllm-{PUBLISHED}.tar.gz", vllm_release(PUBLISHED, None))
    recorded_index.add("vllm", "vllm-0.34.0.tar.gz", vllm_release("0.34.0", b"flashinfer-python==0.9.1\n"))
    flashinfer = tmp_path / "flashinfer_python-0.7.2.tar.gz"
    flashinfer.write_bytes(sdist_bytes("flashinfer-python", "0.7.2", {"__init__.py": b"", "mla/_core.py": SPARSE_MLA.encode()},
                                       package="flashinfer"))
    code, doc = verify_json("--patches", str(sparse_mla_patches(tmp_path / "p")), "--images", str(no_images),
                            "--versions", BOTH, "--with", str(flashinfer))
    assert code == 0
    assert [c["companion"]["how"] for c in doc["columns"]] == ["explicit", "explicit"]
    assert doc["columns"][1]["companion"]["finding"] == ("flashinfer-python 0.7.2 checked as given, not the 0.9.1 "
                                                         "the release pins")
    assert doc["patches"][0]["cells"]["0.34.0"]["detail"] == ""
    assert PAGE not in recorded_index.requests


@pytest.fixture(scope="module")
def real_wheel() -> Path:
    """vLLM 0.34.0's real aarch64 wheel (239 MB), from the user cache (downloaded from the real index once)."""
    from patchkit.wheels.release import release_wheel

    with pytest.MonkeyPatch.context() as env:
        env.delenv("PATCHKIT_INDEX_URL", raising=False)
        return release_wheel("0.34.0", "aarch64", progress=False)


@pytest.mark.network
def test_wheel_build_names_the_unpublished_pin_of_the_real_0340_wheel_before_it_builds(real_wheel, recorded_index,
                                                                                        tmp_path):
    from patchkit.cli.wheel import wheel_group

    cache_release_wheel(real_wheel, tmp_path / "cache")  # the recorded index's cache
    result = run(wheel_group, "wheel", "build", "--vllm", "0.34.0", "--platform", "aarch64", "--series", "full",
                 "--output", str(tmp_path / "out"))
    assert ("vLLM 0.34.0's wheel requires flashinfer-python==0.7.3, flashinfer-python 0.7.3 unpublished (index has "
            "0.7.2.post1, 0.7.4): pip cannot install the wheel's requirements from the index as they stand; "
            "0.7.2.post1 is the substitute") in result.stderr
    # the wheel itself is tests/test_wheel_companion.py's; here: the finding comes first, the index asked once
    assert result.exit_code == 0, result.output + result.stderr
    assert recorded_index.requests == [PAGE]
