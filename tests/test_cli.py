"""The command line as a user drives it: exit codes, --json, messages, and the real vLLM round trip."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest
from builders import snapshot, write_package, write_patchset
from test_engine import MODEL

REPO_PATCHES = __import__("pathlib").Path(__file__).resolve().parents[1] / "patches"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "patchkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.fixture
def tree(tmp_path):
    root = write_package(tmp_path / "site", {"m.py": MODEL})
    patches = write_patchset(tmp_path / "patches", {
        "p": [{"file": "m.py", "action": "replace", "anchor": "x + 1", "text": "x + 2"}],
        "q": [{"file": "m.py", "action": "insert_after", "anchor": "    return 2\n", "text": "    # q\n"}],
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
    from patchkit.sources import SdistCache
    from patchkit.sources.index import choose_archive  # noqa: F401  (the index is what open_source uses)
    from patchkit.sources.spec import open_source

    source = open_source("0.33.0", cache=SdistCache(), progress=False)
    archive = SdistCache().lookup("vllm", "0.33.0")
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


def test_serve_args_is_incomplete_without_a_verified_checkpoint():
    r = cli("serve-args", "nvidia-nvfp4")
    assert r.returncode == 1 and "vllm serve nvidia/GLM-5.3-Flash-NVFP4" in r.stdout
    assert "--quantization modelopt_fp4" in r.stdout and "pass --checkpoint" in r.stderr


def test_unknown_variant_and_smoke_mode_are_usage_errors():
    r = cli("serve-args", "no-such-variant")
    assert r.returncode == 2 and "unknown variant 'no-such-variant'" in r.stderr
    r = cli("smoke", "lab")
    assert r.returncode == 2 and "either --cpu or at least one --host" in r.stderr
