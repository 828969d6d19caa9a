"""`patchkit verify` against real vLLM releases: the index's sdists from 0.29.0 up to the pinned release
(marked `network`; read through the user cache, so each is downloaded once), a git repository built here
from those real files (one commit and tag per release, the nvidia/ -> common/ move included), edited copies
of it for drift and upstreamed fixes (tagged as the releases after the pinned one), and a real HTTP index on
127.0.0.1 for network failures and corrupt downloads. Nothing here names the pinned release: it is read
from patchkit, so the tests hold as they are when the pin moves.

The patch set is small and written here, against real lines of the real releases; one test runs the
real patches/ and images/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import git
import pytest
from click.testing import CliRunner
from packaging.version import Version

from builders import ARCH_ENV_ONLY, image_toml, write_patchset
from patchkit import PINNED_VLLM, SUPPORTED_VLLM
from patchkit.cli.main import PatchkitGroup
from patchkit.cli.verify import verify_command
from patchkit.sources import open_source
from patchkit.sources.cache import ArchiveCache
from patchkit.verify.states import CellState
from patchkit.verify.targets import InvalidVersions, parse_versions
from test_sources import FakeIndex, free_port, sdist_bytes

REPO = Path(__file__).resolve().parents[1]
# The real releases the fixtures read: every supported one up to the pinned one, the baseline verify adds.
RELEASES = tuple(r for r in SUPPORTED_VLLM if Version(r) <= Version(PINNED_VLLM))


def after_the_pin(minors: int) -> str:
    """The release `minors` minor versions after the pinned one: a newer release the tests make up."""
    major, minor = Version(PINNED_VLLM).release[:2]
    return f"{major}.{minor + minors}.0"


NEWER, NEWEST = after_the_pin(1), after_the_pin(2)  # 0.34.0 and 0.35.0 while 0.33.0 is pinned
NEWER_CAP = NEWER.rsplit(".", 1)[0]  # a range that ends before NEWER: "<0.34"

GLM_FILES = ["models/glm5next/nvidia/model.py", "models/glm5next/common/model.py"]  # moved in 0.31.0
GLM_ANCHOR = (
    "class Glm5NextMLP(nn.Module):\n    def __init__(\n        self,\n        hidden_size: int,\n"
    "        intermediate_size: int,\n"
)
GLM_DRIFTED = GLM_ANCHOR.replace("intermediate_size: int,", "intermediate_size: int | None,")
MODELOPT = "model_executor/layers/quantization/modelopt.py"
MODELOPT_ANCHOR = "        return tuple(dict.fromkeys(candidates))\n"
ENVS_ANCHOR = '    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),\n'
ENVS_FIX = '    "VLLM_PATCHKIT_TEST": lambda: os.getenv("VLLM_PATCHKIT_TEST", ""),\n'
READ = ["__init__.py", "envs.py", MODELOPT, *GLM_FILES]
SMALL_SET = ("glm-mlp-marker", "modelopt-candidates", "envs-flag")


def small_patchset(folder: Path, *, modelopt_range: str = ">=0.30.0") -> Path:
    """Three patches on real lines: a GLM model file that moved, a quantization file, envs.py (with a probe)."""
    return write_patchset(
        folder,
        {
            "glm-mlp-marker": [
                {"files": GLM_FILES, "action": "insert_after", "anchor": GLM_ANCHOR,
                 "text": "        # patchkit test: glm-mlp-marker\n"},
            ],
            "modelopt-candidates": [
                {"file": MODELOPT, "action": "insert_before", "anchor": MODELOPT_ANCHOR,
                 "text": "        # patchkit test: modelopt-candidates\n"},
            ],
            "envs-flag": [
                {"file": "envs.py", "action": "insert_after", "anchor": ENVS_ANCHOR, "text": ENVS_FIX},
            ],
        },
        **{
            "glm-mlp-marker": {"vllm": ">=0.30.0"},
            "modelopt-candidates": {"vllm": modelopt_range},
            "envs-flag": {"vllm": ">=0.30.0", "upstreamed": {"file": "envs.py", "contains": '"VLLM_PATCHKIT_TEST"'}},
        },
    )


def verify(*args: str, env: dict[str, str] | None = None):
    """`patchkit verify ARGS` through the same group (and error handling) as the installed command."""
    cli = PatchkitGroup("patchkit", commands={"verify": verify_command})
    return CliRunner().invoke(cli, ["verify", *args], env=env, catch_exceptions=False)


def verify_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    result = verify(*args, "--json", env=env)
    assert result.exit_code in (0, 1), result.output + result.stderr
    return result.exit_code, json.loads(result.stdout)


def states(doc: dict) -> dict[str, dict[str, str]]:
    """patch id -> column label -> cell state."""
    return {p["id"]: {label: cell["state"] for label, cell in p["cells"].items()} for p in doc["patches"]}


@pytest.fixture(autouse=True)
def wide_errors(monkeypatch):
    """Error messages on one line each: rich folds stderr at 80 columns, even inside a path."""
    from patchkit.cli import common as cli

    monkeypatch.setattr(cli.err_console, "width", 10_000)


@pytest.fixture
def patches(tmp_path) -> Path:
    return small_patchset(tmp_path / "patches")


@pytest.fixture
def no_images(tmp_path) -> Path:
    (tmp_path / "no-images").mkdir()
    return tmp_path / "no-images"


@pytest.fixture
def index_env(monkeypatch):
    """The real index, through the user cache."""
    monkeypatch.delenv("PATCHKIT_INDEX_URL", raising=False)


# --- input ------------------------------------------------------------------------------------------


def test_versions_are_a_list_or_a_pep440_range():
    listed = parse_versions("0.30.0, 0.33")
    assert listed.admits(Version("0.33.0")) and listed.admits(Version("0.30")) and not listed.admits(Version("0.31.0"))
    ranged = parse_versions(">=0.30,<0.34")
    assert ranged.admits(Version("0.34.0rc1")) is False and ranged.admits(Version("0.33.1rc1"))
    assert parse_versions(None).admits(Version(PINNED_VLLM)) and not parse_versions(None).admits(Version("0.32.9"))
    for bad, value, problem in [("nonsense", "nonsense", "not-a-version"), ("0.30.0,>=0.31", "0.30.0,>=0.31", "mixed"),
                                (" ", "", "empty")]:
        with pytest.raises(InvalidVersions) as info:
            parse_versions(bad)
        assert (info.value.value, info.value.problem) == (value, problem)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--versions", "nonsense"], "'nonsense' is not a version"),
        (["--versions", ">=0.30,0.31"], "neither a list of versions nor a PEP 440 range"),
        (["--json", "--markdown"], "exclusive"),
        (["--tags", "v*"], "need --git"),
    ],
)
def test_bad_input_exits_2_before_anything_is_fetched(patches, no_images, args, message):
    result = verify("--patches", str(patches), "--images", str(no_images), *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_missing_git_repository_exits_2(patches, no_images, tmp_path):
    result = verify("--patches", str(patches), "--images", str(no_images), "--git", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert "cannot list the tags of git repository" in result.stderr


# --- the real releases on the index -----------------------------------------------------------------


@pytest.mark.network
def test_the_releases_up_to_the_pinned_one_from_the_index(index_env, patches, no_images):
    code, doc = verify_json("--patches", str(patches), "--images", str(no_images), "--versions",
                            f">={RELEASES[0]},<{NEWER_CAP}")
    assert code == 0
    assert [c["label"] for c in doc["columns"]] == list(RELEASES)
    assert [c["label"] for c in doc["columns"] if c["pinned"]] == [PINNED_VLLM]
    assert all(c["source"].startswith(f"vllm {c['label']} sdist (index, sha256 ") for c in doc["columns"])
    assert states(doc) == {pid: dict.fromkeys(RELEASES, "applies") for pid in SMALL_SET}
    glm = next(p for p in doc["patches"] if p["id"] == "glm-mlp-marker")["cells"]
    assert glm["0.30.0"]["edits"][0]["path"] == "models/glm5next/nvidia/model.py"  # before the move
    assert {glm[v]["edits"][0]["path"] for v in RELEASES[1:]} == {"models/glm5next/common/model.py"}
    assert doc["images"] == [{"name": "full", "series": ["glm-mlp-marker", "modelopt-candidates", "envs-flag"],
                              "builds": {v: {"builds": True, "blockers": []} for v in RELEASES}}]
    assert doc["newest_all_images_build"] == PINNED_VLLM and doc["findings"] == []


@pytest.mark.network
def test_a_release_without_glm5next_reports_the_glm_patch_out_of_range_with_the_reason(index_env, patches, no_images):
    code, doc = verify_json("--patches", str(patches), "--images", str(no_images), "--versions", "0.29.0")
    assert code == 0  # an older release is reported, never counted
    assert [c["label"] for c in doc["columns"]] == ["0.29.0", PINNED_VLLM]
    cell = next(p for p in doc["patches"] if p["id"] == "glm-mlp-marker")["cells"]["0.29.0"]
    assert cell["state"] == "out-of-range"
    assert cell["detail"] == "vllm 0.29.0 not in >=0.30.0"
    assert cell["would"]["state"] == "broken"  # and the range is right: the model is not there at all
    assert cell["would"]["edits"][0]["detail"] == (
        "target file missing; tried: vllm/models/glm5next/nvidia/model.py, vllm/models/glm5next/common/model.py"
    )
    blockers = doc["images"][0]["builds"]["0.29.0"]["blockers"]
    assert "glm-mlp-marker out of range, would BREAK" in blockers


@pytest.mark.network
def test_a_clean_cache_gives_the_same_matrix_and_a_warm_run_never_opens_the_archives(
    index_env, patches, no_images, tmp_path
):
    """Cold: the archives (linked from the user cache, not downloaded again) and an empty member cache."""
    user = ArchiveCache()
    for version in RELEASES:
        open_source(f"vllm=={version}", cache=user, progress=False)  # make sure they are downloaded
    clean = ArchiveCache(tmp_path / "clean")
    clean.downloads.mkdir(parents=True)
    for version in RELEASES:
        archive = user.lookup("vllm", version)
        try:
            os.link(archive.path, clean.downloads / archive.path.name)
        except OSError:  # another file system
            shutil.copy(archive.path, clean.downloads)
        shutil.copy(user.downloads / f"vllm-{version}.json", clean.downloads)
    env = {"PATCHKIT_CACHE_DIR": str(clean.root)}
    args = ("--patches", str(patches), "--images", str(no_images), "--versions", ",".join(RELEASES))
    code, cold = verify_json(*args, env=env)
    assert code == 0 and states(cold) == {p: dict.fromkeys(RELEASES, "applies") for p in states(cold)}
    keys = sorted(p.name for p in (clean.root / "files" / "archives").iterdir())
    # one member cache per vLLM release, beside those of the FlashInfer releases they pin
    assert [k.rsplit("-", 1)[0] for k in keys if k.startswith("vllm-")] == [f"vllm-{v}" for v in RELEASES]
    assert {k.rsplit("-", 1)[0] for k in keys if not k.startswith("vllm-")} <= {
        f"flashinfer-python-{v}" for v in ("0.6.18.post1", "0.7.0.post1", "0.7.2.post1")}
    # Each archive replaced by zeros of the same size (a new file: the user cache keeps its own): the
    # cache record still matches, and any decompression would now fail as a corrupt archive.
    for version in RELEASES:
        archive = clean.lookup("vllm", version).path
        size = archive.stat().st_size
        archive.unlink()
        with archive.open("wb") as f:
            f.truncate(size)
    code, warm = verify_json(*args, env=env)
    assert code == 0 and warm["patches"] == cold["patches"]


@pytest.mark.network
def test_each_release_is_checked_with_the_flashinfer_it_pins(index_env):
    """vLLM 0.30.0 pins FlashInfer 0.6.18.post1 and 0.33.0 pins 0.7.2.post1: the NoPE pad applies on both,
    each with the FlashInfer edits of its own release (the <0.7 decode allowlist and top-k fit, the >=0.7
    asserts) checked against that FlashInfer's real files, none left unchecked."""
    code, doc = verify_json("--patches", str(REPO / "patches"), "--versions", "0.30.0,0.33.0")
    pad = next(p for p in doc["patches"] if p["id"] == "nope-mla-pad")["cells"]
    assert pad["0.30.0"]["state"] == "applies" and "unchecked" not in pad["0.30.0"]["detail"]
    assert pad["0.33.0"]["state"] == "applies" and "unchecked" not in pad["0.33.0"]["detail"]
    assert code == 0  # older than the pinned release: reported, not a regression


def test_the_real_patch_set_and_images_give_a_full_matrix_of_valid_states(index_env):
    code, doc = verify_json("--patches", str(REPO / "patches"), "--images", str(REPO / "images"),
                            "--versions", ",".join(RELEASES))
    from patchkit.patching.patchset import load_patchset

    assert [p["id"] for p in doc["patches"]] == list(load_patchset(REPO / "patches").order)
    assert [c["label"] for c in doc["columns"]] == list(RELEASES)
    for patch in doc["patches"]:
        assert set(patch["cells"]) == set(RELEASES)
        assert all(cell["state"] in {state.value for state in CellState} for cell in patch["cells"].values()), patch
    assert {i["name"] for i in doc["images"]} == {p.parent.name for p in (REPO / "images").glob("*/image.toml")}
    assert all(set(i["builds"]) == set(RELEASES) for i in doc["images"])
    assert code == (1 if doc["findings"] else 0)


# --- a git repository built from the real releases ----------------------------------------------------


ME = git.Actor("patchkit tests", "tests@patchkit.invalid")


@pytest.fixture(scope="module")
def real_files() -> dict[str, dict[str, bytes]]:
    """version -> package-relative path -> bytes, for the files the small patch set reads."""
    saved = {k: os.environ.pop(k) for k in ("PATCHKIT_INDEX_URL",) if k in os.environ}
    try:
        out = {}
        for version in RELEASES:
            source = open_source(f"vllm=={version}", progress=False)
            out[version] = {p: data for p, data in source.read_many("vllm", READ).items() if data is not None}
        return out
    finally:
        os.environ.update(saved)


def commit_tree(repo: git.Repo, files: dict[str, bytes], message: str) -> git.Commit:
    """Make the work tree hold exactly `files` under vllm/ (deletions are how files move), then commit."""
    root = Path(repo.working_tree_dir)
    tracked = {Path(root, e.path) for e in repo.index.entries.values()} if repo.head.is_valid() else set()
    wanted = {root / "vllm" / p for p in files}
    gone = [str(p.relative_to(root)) for p in tracked - wanted]
    if gone:
        repo.index.remove(gone, working_tree=True)
    for path, data in files.items():
        (root / "vllm" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "vllm" / path).write_bytes(data)
    repo.index.add([f"vllm/{p}" for p in files])
    return repo.index.commit(message, author=ME, committer=ME)


@pytest.fixture(scope="module")
def release_repo(real_files, tmp_path_factory) -> Path:
    """One commit and tag per release (no _version.py, as in vLLM's own repository), then one on main."""
    path = tmp_path_factory.mktemp("git") / "vllm"
    repo = git.Repo.init(path, initial_branch="main")
    for version in RELEASES:
        commit_tree(repo, real_files[version], f"vLLM {version}")
        repo.create_tag(f"v{version}")
    commit_tree(repo, real_files[PINNED_VLLM] | {"README.md": b"after the release\n"}, "main moves on")
    return path


@pytest.fixture
def repo_copy(release_repo, tmp_path) -> git.Repo:
    shutil.copytree(release_repo, tmp_path / "vllm")
    return git.Repo(tmp_path / "vllm")


def edited(files: dict[str, bytes], path: str, old: str, new: str) -> dict[str, bytes]:
    text = files[path].decode()
    assert text.count(old) == 1
    return files | {path: text.replace(old, new).encode()}


@pytest.mark.network
def test_a_git_repository_of_the_real_releases_matches_the_index(release_repo, patches, no_images):
    head = git.Repo(release_repo).head.commit.hexsha
    code, doc = verify_json("--patches", str(patches), "--images", str(no_images), "--git", str(release_repo),
                            "--tags", "v*", "--ref", "main", "--versions", ">=0.30")
    assert code == 0
    labels = [f"v{v}" for v in RELEASES] + ["main"]
    assert [c["label"] for c in doc["columns"]] == labels
    assert [c["version"] for c in doc["columns"]] == [*RELEASES, f"{PINNED_VLLM}+1.g{head[:7]}"]
    assert [c["pinned"] for c in doc["columns"]] == [v == PINNED_VLLM for v in RELEASES] + [False]
    assert doc["columns"][-1]["newer"] is True
    assert doc["columns"][-1]["source"].startswith(f"vllm {PINNED_VLLM}+1.g{head[:7]} git {release_repo}@main")
    assert states(doc) == {p: dict.fromkeys(labels, "applies") for p in SMALL_SET}
    glm = next(p for p in doc["patches"] if p["id"] == "glm-mlp-marker")["cells"]
    assert [glm[label]["edits"][0]["path"] for label in labels] == [GLM_FILES[0]] + [GLM_FILES[1]] * len(RELEASES)
    assert doc["newest_all_images_build"] == "main"


@pytest.mark.network
def test_drifted_anchor_is_broken_with_the_nearest_match_and_a_fix_upstream_is_upstreamed(
    repo_copy, real_files, patches, no_images
):
    files = edited(real_files[PINNED_VLLM], GLM_FILES[1], GLM_ANCHOR, GLM_DRIFTED)
    files = edited(files, "envs.py", ENVS_ANCHOR, ENVS_ANCHOR + ENVS_FIX)  # upstream took the fix
    commit_tree(repo_copy, files, NEWER)
    repo_copy.create_tag(f"v{NEWER}")
    pinned, newer = f"v{PINNED_VLLM}", f"v{NEWER}"
    text = files[GLM_FILES[1]].decode()
    drift_line = text[: text.index("class Glm5NextMLP(")].count("\n") + 1  # where the drifted anchor starts

    args = ("--patches", str(patches), "--images", str(no_images), "--git", repo_copy.working_tree_dir)
    code, doc = verify_json(*args)  # default: the pinned release and newer tags
    assert code == 1
    assert [c["label"] for c in doc["columns"]] == [pinned, newer]
    assert states(doc) == {
        "glm-mlp-marker": {pinned: "applies", newer: "broken"},
        "modelopt-candidates": {pinned: "applies", newer: "applies"},
        "envs-flag": {pinned: "applies", newer: "upstreamed"},
    }
    edit = next(p for p in doc["patches"] if p["id"] == "glm-mlp-marker")["cells"][newer]["edits"][0]
    assert edit["state"] == "broken" and edit["path"] == GLM_FILES[1] and edit["found"] == 0
    assert edit["nearest"]["line"] == drift_line
    assert "+        intermediate_size: int | None," in edit["nearest"]["diff"]
    assert doc["findings"] == [
        {"patch": "glm-mlp-marker", "column": newer, "reason": f"applies on the pinned release, broken on {newer}"}
    ]
    assert doc["images"][0]["builds"][newer] == {"builds": False, "blockers": ["glm-mlp-marker broken"]}
    assert doc["newest_all_images_build"] == pinned

    table = verify(*args, env={"COLUMNS": "250"})
    assert table.exit_code == 1
    assert f"nearest match at line {drift_line}" in table.stdout
    assert "upstream carries the fix: drop this patch" in table.stdout
    assert f"glm-mlp-marker @ {newer}: applies on the pinned release, broken on {newer}" in table.stdout
    markdown = verify(*args, "--markdown")
    assert markdown.exit_code == 1
    assert "| `glm-mlp-marker` | ✅ applies | ❌ BROKEN |" in markdown.stdout
    assert "| `envs-flag` | ✅ applies | 🔵 upstreamed |" in markdown.stdout
    assert f"nearest match at line {drift_line}" in markdown.stdout
    assert f"**newest version the full series builds on: {pinned} (pinned)**" in markdown.stdout


@pytest.mark.network
def test_a_newer_release_out_of_range_is_a_regression_only_if_its_edits_no_longer_match(
    repo_copy, real_files, tmp_path, no_images
):
    patches = small_patchset(tmp_path / "capped", modelopt_range=f">=0.30.0,<{NEWER_CAP}")
    commit_tree(repo_copy, real_files[PINNED_VLLM] | {"NEWS": f"{NEWER}\n".encode()}, NEWER)
    repo_copy.create_tag(f"v{NEWER}")
    drifted = edited(real_files[PINNED_VLLM], MODELOPT, MODELOPT_ANCHOR, "        return tuple(candidates)\n")
    commit_tree(repo_copy, drifted, NEWEST)
    repo_copy.create_tag(f"v{NEWEST}")
    pinned, newer, newest = f"v{PINNED_VLLM}", f"v{NEWER}", f"v{NEWEST}"

    code, doc = verify_json("--patches", str(patches), "--images", str(no_images), "--git", repo_copy.working_tree_dir)
    cells = next(p for p in doc["patches"] if p["id"] == "modelopt-candidates")["cells"]
    assert [cells[t]["state"] for t in (pinned, newer, newest)] == ["applies", "out-of-range", "out-of-range"]
    assert cells[newer]["detail"] == f"vllm {NEWER} not in <{NEWER_CAP},>=0.30.0"
    assert cells[newer]["would"]["state"] == "applies"
    assert cells[newest]["would"]["state"] == "broken"
    assert cells[newest]["would"]["edits"][0]["nearest"]["diff"]
    assert code == 1
    assert doc["findings"] == [
        {
            "patch": "modelopt-candidates",
            "column": newest,
            "reason": f"applies on the pinned release; out of range on {newest} and its edits no longer match there",
        }
    ]
    assert doc["images"][0]["builds"][newer]["blockers"] == ["modelopt-candidates out of range, would apply"]


@pytest.mark.network
def test_each_image_series_is_verified_on_its_own(repo_copy, real_files, patches, tmp_path):
    images = tmp_path / "images"
    for name, series in {"with-glm": '["glm-mlp-marker", "envs-flag"]', "no-glm": '["modelopt-candidates"]'}.items():
        (images / name).mkdir(parents=True)
        (images / name / "image.toml").write_text(image_toml(name, series, env=ARCH_ENV_ONLY))
    files = edited(real_files[PINNED_VLLM], GLM_FILES[1], GLM_ANCHOR, GLM_DRIFTED)
    commit_tree(repo_copy, files, NEWER)
    repo_copy.create_tag(f"v{NEWER}")
    pinned, newer = f"v{PINNED_VLLM}", f"v{NEWER}"

    code, doc = verify_json("--patches", str(patches), "--images", str(images), "--git", repo_copy.working_tree_dir)
    assert code == 1
    builds = {i["name"]: i["builds"] for i in doc["images"]}
    assert builds["no-glm"][newer] == {"builds": True, "blockers": []}
    assert builds["with-glm"][newer] == {"builds": False, "blockers": ["glm-mlp-marker broken"]}
    assert builds["with-glm"][pinned]["builds"] and doc["newest_all_images_build"] == pinned
    assert f"newest version every image builds on: {pinned} (pinned)" in verify(
        "--patches", str(patches), "--images", str(images), "--git", repo_copy.working_tree_dir
    ).stdout


# --- failures of the index: clear errors, nothing half-written in the cache -----------------------------


SMALL = {"__init__.py": b"", "envs.py": f"environment_variables = {{\n{ENVS_ANCHOR}}}\n".encode()}


@pytest.fixture
def local_index(monkeypatch, tmp_path) -> FakeIndex:
    fake = FakeIndex()
    monkeypatch.setenv("PATCHKIT_INDEX_URL", fake.url)
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "cache"))
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def envs_only(tmp_path: Path) -> Path:
    return write_patchset(
        tmp_path / "p",
        {"envs-flag": [{"file": "envs.py", "action": "insert_after", "anchor": ENVS_ANCHOR, "text": ENVS_FIX}]},
    )


def cache_files(tmp_path: Path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize(
    "fault, message",
    [
        ("truncate", rf"{NEWER}: download of http://127.0.0.1:\d+/files/vllm-{NEWER}.tar.gz failed after \d+ bytes"),
        ("http500", rf"{NEWER}: download of .*vllm-{NEWER}.tar.gz failed after 0 bytes: 500 Server Error"),
        ("wrong-sha256", rf"{NEWER}: download of .*vllm-{NEWER}.tar.gz does not match the index: sha256 expected"),
        ("corrupt", rf"{NEWER}: archive .*vllm-{NEWER}.tar.gz is corrupt or truncated .*removed it from the cache"),
    ],
)
def test_a_failed_or_corrupt_download_is_a_clear_error_and_leaves_no_partial_entry(
    local_index, tmp_path, no_images, fault, message
):
    good = sdist_bytes("vllm", PINNED_VLLM, SMALL)
    local_index.add("vllm", f"vllm-{PINNED_VLLM}.tar.gz", good)
    bad = sdist_bytes("vllm", NEWER, SMALL)
    if fault == "corrupt":
        bad = bad[: len(bad) // 2]  # what the index lists, hash and all: a broken upload
    local_index.add("vllm", f"vllm-{NEWER}.tar.gz", bad, listed_sha256="0" * 64 if fault == "wrong-sha256" else None)
    if fault in ("truncate", "http500"):
        local_index.faults[f"vllm-{NEWER}.tar.gz"] = fault

    result = verify("--patches", str(envs_only(tmp_path)), "--images", str(no_images))  # default: pinned and newer
    assert result.exit_code == 2
    assert re.search(message, result.stderr), result.stderr
    left = cache_files(tmp_path)
    assert not [f for f in left if NEWER in f or f.endswith(".part")], left
    assert f"downloads/vllm-{PINNED_VLLM}.tar.gz" in left  # the release that worked stays cached, whole

    local_index.faults.clear()
    local_index.projects["vllm"] = [e for e in local_index.projects["vllm"] if NEWER not in e["filename"]]
    local_index.add("vllm", f"vllm-{NEWER}.tar.gz", sdist_bytes("vllm", NEWER, SMALL))
    code, doc = verify_json("--patches", str(envs_only(tmp_path)), "--images", str(no_images))
    assert code == 0 and states(doc) == {"envs-flag": {PINNED_VLLM: "applies", NEWER: "applies"}}


def test_an_unreachable_index_is_a_clear_error(monkeypatch, tmp_path, no_images):
    monkeypatch.setenv("PATCHKIT_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "cache"))
    result = verify("--patches", str(envs_only(tmp_path)), "--images", str(no_images))
    assert result.exit_code == 2
    assert "cannot reach the package index at http://127.0.0.1:" in result.stderr
    assert cache_files(tmp_path) == []


def test_with_a_flashinfer_source_its_edits_are_checked_on_every_version(local_index, tmp_path, no_images):
    """Without a FlashInfer the engine leaves its edits unchecked, and says so; --with checks them."""
    local_index.add("vllm", f"vllm-{PINNED_VLLM}.tar.gz", sdist_bytes("vllm", PINNED_VLLM, SMALL))
    patches = write_patchset(
        tmp_path / "p",
        {
            "envs-and-jit": [
                {"file": "envs.py", "action": "insert_after", "anchor": ENVS_ANCHOR, "text": ENVS_FIX},
                {"package": "flashinfer", "file": "jit/core.py", "action": "assert", "anchor": "TOPK = (128, 2048)\n"},
            ]
        },
        **{"envs-and-jit": {"packages": {"flashinfer": ">=0.7.0"}}},
    )
    flashinfer = tmp_path / "flashinfer_python-0.7.2.tar.gz"
    flashinfer.write_bytes(
        sdist_bytes("flashinfer-python", "0.7.2", {"__init__.py": b"", "jit/core.py": b"TOPK = (128, 2176)\n"},
                    package="flashinfer")
    )
    args = ("--patches", str(patches), "--images", str(no_images), "--versions", PINNED_VLLM)
    code, doc = verify_json(*args)
    cell = doc["patches"][0]["cells"][PINNED_VLLM]
    assert code == 0 and cell["state"] == "applies"
    assert cell["detail"] == "flashinfer not in the source: its edits unchecked"

    code, doc = verify_json(*args, "--with", str(flashinfer))
    cell = doc["patches"][0]["cells"][PINNED_VLLM]
    assert code == 1 and cell["state"] == "broken"
    assert cell["edits"][1]["detail"].startswith("invariant no longer holds: anchor expected 1x, found 0x")
    assert "flashinfer 0.7.2 sdist" in doc["columns"][0]["source"]

    result = verify(*args, "--with", f"vllm=={PINNED_VLLM}", "--json")  # a usage error, naming the source
    assert result.exit_code == 2 and "--with takes sources of other packages" in result.stderr
    assert f"--with vllm=={PINNED_VLLM} holds vLLM" in result.stderr
    assert json.loads(result.stdout)["error"]["kind"] == "usage"


def test_the_kernel_census_reads_one_release():
    from patchkit.cli.main import main

    result = CliRunner().invoke(main, ["census", "--release", "0.33.0,0.34.0", "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["kind"] == "usage"
    assert "'0.33.0,0.34.0' is not a version (expected one release" in result.stderr


def test_every_planner_state_has_a_cell_state():
    """No engine verdict crashes the matrix: partial and modified upstream trees read as broken."""
    from patchkit.patching.planner import State

    assert {state: CellState.from_plan(state) for state in State} == {
        State.NOT_APPLIED: CellState.APPLIES, State.APPLIED: CellState.APPLIED,
        State.UPSTREAMED: CellState.UPSTREAMED, State.BROKEN: CellState.BROKEN,
        State.PARTIAL: CellState.BROKEN, State.MODIFIED: CellState.BROKEN,
        State.OUT_OF_RANGE: CellState.OUT_OF_RANGE, State.NOT_APPLICABLE: CellState.NOT_APPLICABLE,
    }
