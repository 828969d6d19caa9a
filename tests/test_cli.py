"""The command line as a user drives it: exit codes, --json, messages, and the real vLLM round trip."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from builders import image_toml, snapshot, write_package, write_patchset
from test_engine import MODEL

REPO_PATCHES = __import__("pathlib").Path(__file__).resolve().parents[1] / "patches"


def cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "patchkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=None if env is None else {**os.environ, **env})


@pytest.fixture
def tree(tmp_path):
    root = write_package(tmp_path / "site", {"m.py": MODEL})
    patches = write_patchset(tmp_path / "patches", {
        "p": [{"file": "m.py", "action": "replace", "anchor": "    y = x + 1\n", "text": "    y = x + 2\n"}],
        "q": [{"file": "m.py", "action": "insert_after", "anchor": "    return 2\n", "text": "    # patchkit q: why\n"}],
    })
    return root, patches


def test_apply_status_revert_with_exit_codes_and_json(tree):
    root, patches = tree
    before = snapshot(root)
    r = cli("apply", "--target", root, "--patches", patches, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [p["state"] for p in out["patches"]] == ["not-applied", "not-applied"]
    assert {c["path"] for c in out["changes"]} == {"m.py"}

    r = cli("apply", "--target", root, "--patches", patches)
    assert r.returncode == 0 and "already applied" in r.stdout

    r = cli("status", "--target", root, "--patches", patches, "--json")
    assert [p["state"] for p in json.loads(r.stdout)["patches"]] == ["applied", "applied"]

    r = cli("revert", "--target", root, "--patches", patches)
    assert r.returncode == 0 and snapshot(root) == before


def test_broken_patch_exits_1_and_names_everything(tree):
    root, patches = tree
    (root / "vllm/m.py").write_text(MODEL.replace("x + 1", "x - 1"))
    before = snapshot(root)
    r = cli("apply", "--target", root, "--patches", patches, "--json")
    assert r.returncode == 1
    bad = json.loads(r.stdout)["patches"][0]
    assert bad["state"] == "broken" and bad["edits"][0]["nearest"]["line"] == 2
    assert snapshot(root) == before
    r = cli("check", "--source", root, "--patches", patches)
    assert r.returncode == 1 and "broken" in r.stdout and "line 2" in r.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["check", "--source", "/nonexistent/dir"], "no such directory"),
        (["check", "--source", "{root}", "--series", "nope"], "unknown series 'nope'"),
        (["apply", "--target", "{root}", "--assume-version", "vllm"], "PACKAGE=VERSION"),
    ],
)
def test_bad_input_exits_2_with_a_message(tree, args, needle):
    root, patches = tree
    r = cli(*[a.format(root=root) for a in args], "--patches", patches)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_malformed_patch_file_exits_2(tree):
    root, patches = tree
    (patches / "p" / "patch.toml").write_text("id = \n")
    before = snapshot(root)
    r = cli("apply", "--target", root, "--patches", patches)
    assert r.returncode == 2 and "malformed TOML" in r.stderr and snapshot(root) == before


def test_symlink_escaping_the_package_is_refused(tree, tmp_path):
    root, patches = tree
    outside = tmp_path / "outside.py"
    outside.write_text(MODEL)
    (root / "vllm/m.py").unlink()
    (root / "vllm/m.py").symlink_to(outside)
    r = cli("apply", "--target", root, "--patches", patches)
    assert r.returncode == 2 and "outside the package root" in r.stderr
    assert outside.read_text() == MODEL


def test_diff_prints_a_unified_diff(tree):
    root, patches = tree
    r = cli("diff", "--source", root, "--patches", patches)
    assert r.returncode == 0 and r.stdout.startswith("--- a/vllm/m.py")


@pytest.mark.network
def test_round_trip_on_the_real_vllm_0_33_0_sdist(tmp_path):
    """apply, status, revert of the real patch set on the real released sources, byte for byte."""
    from patchkit.sources import ArchiveCache
    from patchkit.sources.index import choose_archive  # noqa: F401  (the index is what open_source uses)
    from patchkit.sources.spec import open_source

    source = open_source("0.33.0", cache=ArchiveCache(), progress=False)
    archive = ArchiveCache().lookup("vllm", "0.33.0")
    assert archive is not None, source.description
    with tarfile.open(archive.path) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "vllm-0.33.0"
    before = snapshot(root / "vllm")

    r = cli("apply", "--target", root, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    changed = {c["path"] for c in json.loads(r.stdout)["changes"]}
    assert changed, "the series changed nothing on 0.33.0"
    assert snapshot(root / "vllm") != before

    r = cli("status", "--target", root, "--json")
    states = {p["id"]: p["state"] for p in json.loads(r.stdout)["patches"]}
    assert r.returncode == 0 and set(states.values()) <= {"applied", "not-applicable", "upstreamed"}, states

    r = cli("revert", "--target", root)
    assert r.returncode == 0, r.stderr
    assert snapshot(root / "vllm") == before


def test_mirrors_prints_one_source_mirror_line_per_distinct_base(tmp_path):
    """`patchkit mirrors PREFIX [IMAGE]`, what publish.yml copies the bases with and builds on."""
    for name, digest in (("a", "0" * 64), ("b", "0" * 64), ("c", "1" * 64)):  # a and b share their base
        (tmp_path / name).mkdir()
        (tmp_path / name / "image.toml").write_text(image_toml(name, digest=digest))
    env = {"PATCHKIT_IMAGES": str(tmp_path), "PATCHKIT_PATCHES": str(REPO_PATCHES)}
    line = "example.org/base@sha256:{0} ghcr.io/owner/base@sha256:{0}"  # the tag dropped, the digest kept
    r = cli("mirrors", "ghcr.io/owner", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [line.format("0" * 64), line.format("1" * 64)]
    r = cli("mirrors", "ghcr.io/owner", "c", env=env)
    assert r.returncode == 0 and r.stdout.splitlines() == [line.format("1" * 64)], r.stderr
    r = cli("mirrors", "ghcr.io/owner", "no-such-image", env=env)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert "unknown image 'no-such-image'; the images are: a, b, c" in r.stderr


def test_mirrors_of_the_real_images():
    r = cli("mirrors", "ghcr.io/owner", "glm53-flash-nvfp4-4p67")
    source, mirror = r.stdout.split()
    assert r.returncode == 0 and source.startswith("vllm/vllm-openai@sha256:"), r.stdout + r.stderr
    assert mirror == "ghcr.io/owner/vllm-openai@" + source.split("@")[1]
    assert source in cli("mirrors", "ghcr.io/owner").stdout


def test_serve_args_is_incomplete_without_a_verified_checkpoint():
    r = cli("serve-args", "nvidia-nvfp4")
    assert r.returncode == 1 and "vllm serve nvidia/GLM-5.3-Flash-NVFP4" in r.stdout
    assert "--quantization modelopt_fp4" in r.stdout and "pass --checkpoint" in r.stderr


def test_unknown_variant_and_smoke_mode_are_usage_errors():
    r = cli("serve-args", "no-such-variant")
    assert r.returncode == 2 and "unknown variant 'no-such-variant'" in r.stderr
    r = cli("smoke", "lab")
    assert r.returncode == 2 and "either --cpu or at least one --host" in r.stderr
    r = cli("smoke", "lab", "--cpu", "--load-format", "instanttensor", "--json")  # click's usage error, typed
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["kind"] == "usage"
    assert "--load-format goes with --host" in r.stderr and "Usage: " in r.stderr


# -- failures: every one an exit code and a message (and, with --json, one JSON object) --------------


def test_edited_patch_text_is_modified_and_neither_apply_nor_revert_touch_it(tree):
    root, patches = tree
    assert cli("apply", "--target", root, "--patches", patches).returncode == 0
    target = root / "vllm/m.py"
    target.write_text(target.read_text().replace("    # patchkit q: why\n", "    # patchkit q: why, and a note of mine\n"))
    before = snapshot(root)
    r = cli("status", "--target", root, "--patches", patches, "--json")
    q = {p["id"]: p for p in json.loads(r.stdout)["patches"]}["q"]
    assert r.returncode == 1 and q["state"] == "modified"
    assert "+    # patchkit q: why, and a note of mine" in q["edits"][0]["detail"]
    assert "-    # patchkit q: why\n" in q["edits"][0]["detail"]
    for command in ("apply", "revert"):
        r = cli(command, "--target", root, "--patches", patches)
        assert r.returncode == 1 and "modified" in r.stdout, r.stdout
        assert snapshot(root) == before  # no second copy inserted, no patch code left half-removed


def test_an_assumed_version_is_refused_naming_what_it_lacks():
    from patchkit.cli.common import InvalidAssumedVersion, parse_assumed

    assert parse_assumed(("vllm=0.33.0",)) == {"vllm": "0.33.0"}
    for value, version in (("vllm", None), ("=0.33.0", None), ("vllm=", None), ("vllm=banana", "banana")):
        with pytest.raises(InvalidAssumedVersion) as bad:
            parse_assumed((value,))
        assert (bad.value.value, bad.value.version) == (value, version)


def test_assumed_version_that_is_not_a_version_is_exit_2_and_outside_every_range_is_exit_1(tree):
    root, patches = tree
    before = snapshot(root)
    r = cli("apply", "--target", root, "--patches", patches, "--assume-version", "vllm=banana")
    assert r.returncode == 2 and "'banana' is not a version" in r.stderr
    for command in (["apply", "--target"], ["check", "--source"]):
        r = cli(*command, root, "--patches", patches, "--assume-version", "vllm=0.0.1")
        assert r.returncode == 1 and "no patch of the series applies to vllm 0.0.1" in r.stderr, r.stderr
        assert "see `patchkit list` for the ranges" in " ".join(r.stderr.split())
        assert "already applied" not in r.stdout
    assert snapshot(root) == before


def test_json_failure_is_one_object_on_stdout(tree):
    root, patches = tree
    r = cli("apply", "--target", root, "--patches", patches, "--series", "nope", "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout) == {"ok": False, "error": {"exit_code": 2, "kind": "error",
                                                           "message": json.loads(r.stdout)["error"]["message"]}}
    assert "unknown series 'nope'" in json.loads(r.stdout)["error"]["message"]
    r = cli("status", "--target", root / "missing", "--patches", patches, "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["kind"] == "usage"


def test_crlf_and_non_utf8_files_are_named(tree):
    root, patches = tree
    (root / "vllm/m.py").write_bytes(MODEL.replace("\n", "\r\n").encode())
    r = cli("check", "--source", root, "--patches", patches, "--json")
    edit = json.loads(r.stdout)["patches"][0]["edits"][0]
    assert r.returncode == 1 and edit["path"] == "m.py" and "CRLF" in edit["detail"]
    (root / "vllm/m.py").write_bytes(b"\xff\xfe" + MODEL.encode())
    r = cli("check", "--source", root, "--patches", patches)
    assert r.returncode == 1 and "on vllm/m.py: file is not UTF-8" in r.stdout.replace("\n", " ").replace("│", "")


def test_wrong_kind_of_file_is_exit_2_naming_it(tree):
    root, patches = tree
    shutil.rmtree(patches / "q")
    (patches / "q" / "patch.toml").mkdir(parents=True)  # a directory where a file must be
    r = cli("check", "--source", root, "--patches", patches)
    assert r.returncode == 2 and str(patches / "q" / "patch.toml") in r.stderr and "Traceback" not in r.stderr


def test_hostile_deep_json_is_exit_2_not_a_traceback(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    (checkpoint / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    # pinned to exactly these bytes, so the identity check passes and the parser meets the hostile file
    pins = [hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
            for name in ("config.json", "model.safetensors.index.json")]
    # 4p67 has no public pins, so the user's pins stand (lab's published pins would refuse these bytes first)
    r = cli("preflight", checkpoint, "--variant", "4p67", "--pin-config", pins[0], "--pin-index", pins[1])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "config.json" in r.stderr and "nested too deeply" in r.stderr, r.stderr[-2000:]


def test_unexpected_error_is_exit_3_internal_error_with_how_to_report(tree, monkeypatch):
    """The last line of defence, shown by making the planner fail as a bug would (in this process)."""
    from click.testing import CliRunner

    from patchkit.cli.main import main
    from patchkit.patching import planner

    def bug(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(planner, "plan", bug)
    root, patches = tree
    r = CliRunner().invoke(main, ["status", "--target", str(root), "--patches", str(patches), "--json"])
    assert r.exit_code == 3 and "internal error" in r.stderr and "Please report it" in r.stderr
    assert json.loads(r.stdout)["error"] == {"exit_code": 3, "kind": "internal error",
                                             "message": json.loads(r.stdout)["error"]["message"]}


# -- options: the folders every command reads, the cache, --json -------------------------------------


def test_folders_are_options_of_every_command_that_reads_them(tmp_path):
    """--patches and --images name the folders on the command line (no PATCHKIT_* environment needed): a
    --series image name is looked up in --images; each command that reads images takes it."""
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    (images / "a" / "image.toml").write_text(image_toml("a", digest="2" * 64))
    r = cli("mirrors", "ghcr.io/owner", "--images", images, "--patches", REPO_PATCHES)
    assert r.returncode == 0 and r.stdout.split() == ["example.org/base@sha256:" + "2" * 64,
                                                      "ghcr.io/owner/base@sha256:" + "2" * 64], r.stderr
    r = cli("list", "--patches", REPO_PATCHES, "--series", "a", "--images", images, "--json")
    assert r.returncode == 0 and [p["id"] for p in json.loads(r.stdout)["patches"]] == ["nope-mla-pad"], r.stderr
    r = cli("list", "--patches", REPO_PATCHES, "--series", "glm53-flash-nvfp4", "--images", images)
    assert r.returncode == 2 and f"unknown series 'glm53-flash-nvfp4': use 'full' or an image name of {images} (a)" in r.stderr
    for command in (("serve-args", "lab"), ("doctor", "log", "-", "--variant", "lab"), ("preflight", tmp_path, "--variant", "lab"),
                    ("smoke", "lab", "--cpu")):
        r = cli(*command, "--images", images)
        assert r.returncode == 2 and f"no variant.toml under {images}" in r.stderr, (command, r.stderr)
    r = cli("build", "glm53-flash-nvfp4", "--dry-run", "--images", images)
    assert r.returncode == 2 and "unknown image 'glm53-flash-nvfp4'" in r.stderr and f"{images} has: a" in r.stderr


def test_cache_dir_is_a_global_option_with_its_env_twin(tree, tmp_path):
    """`patchkit --cache-dir DIR` (or PATCHKIT_CACHE_DIR, as uv's --cache-dir has UV_CACHE_DIR) is where every
    cache user writes: here the planner's record of patched files known to compile."""
    root, patches = tree
    flag, env = tmp_path / "flag-cache", tmp_path / "env-cache"
    r = cli("--cache-dir", flag, "check", "--source", root, "--patches", patches, env={"PATCHKIT_CACHE_DIR": str(env)})
    assert r.returncode == 0, r.stderr
    assert any((flag / "compiles").rglob("*")) and not env.exists()  # the flag wins over its twin
    r = cli("check", "--source", root, "--patches", patches, env={"PATCHKIT_CACHE_DIR": str(env)})
    assert r.returncode == 0 and any((env / "compiles").rglob("*")), r.stderr
    assert "[env: PATCHKIT_CACHE_DIR" in cli("--help").stdout


def test_json_mode_is_the_option_not_the_word_anywhere(tree):
    """--json is an option: the same word as another option's value does not switch failures to JSON."""
    root, patches = tree
    r = cli("status", "--patches", patches, "--target", "--json")  # "--json" is the target's (missing) path
    assert r.returncode == 2 and r.stdout == "" and "'--json' does not exist" in r.stderr
    r = cli("status", "--patches", patches, "--json", "--target", root / "missing")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["kind"] == "usage"
