"""The gate of vLLM's own tests (patchkit.gate): which tests it selects from the series' edits (on a real
release sdist's tests/), how it reads outcomes (a real pytest run through its plugin), and that it fails a
planted patch that changes what vLLM's tests hold, naming that patch.

The planted patch is real history: the first form of glm47-tool-args-think-end
(tests/data/gate/glm47-tool-args-think-end-first-form.toml, this repository at 8bf9c68), whose
(TOOL_ARGS, THINK_END) transition leaked the reasoning's `</think>` into content and failed 10 tests of
vLLM 0.33.0's tests/parser/engine/test_ufffd_reasoning_transition.py (issue 30).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from patchkit.gate.compare import compare
from patchkit.gate.selection import MODEL_TESTS, SUBSETS, select

REPO = Path(__file__).resolve().parents[1]
FIRST_FORM = REPO / "tests" / "data" / "gate" / "glm47-tool-args-think-end-first-form.toml"


@pytest.fixture(scope="module")
def sdist_033(tmp_path_factory):
    """vLLM 0.33.0's sdist tests/ and pyproject.toml, as the gate lays them out (the verified sdist)."""
    from patchkit.gate.run import prepare
    from patchkit.sources.cache import ArchiveCache

    return prepare(tmp_path_factory.mktemp("gate"), "0.33.0", ArchiveCache()).tests_root


@pytest.mark.network
def test_selection_follows_the_edits(sdist_033):
    """The mirror folder, a top-level module's own test file, every test naming the module, the model's tests;
    another package's edits are counted untested; nothing of the sdist's vllm/ is laid out beside tests/."""
    selection = select(sdist_033, [("vllm", "parser/glm47_moe.py"),
                                   ("vllm", "entrypoints/openai/chat_completion/serving.py"),
                                   ("vllm", "envs.py"), ("flashinfer", "mla/_core.py")])
    paths = selection.paths
    assert "tests/parser" in paths and paths["tests/parser"] == {"vllm/parser/glm47_moe.py"}
    assert "tests/entrypoints/openai/chat_completion" in paths
    assert "tests/reasoning/test_glm4_moe_reasoning_parser.py" in paths  # names vllm.parser.glm47_moe
    assert "tests/test_envs.py" in paths
    assert MODEL_TESTS in paths
    assert not any(p.startswith("tests/parser/") for p in paths)  # run by tests/parser itself
    assert selection.untested == {"flashinfer/mla/_core.py"}
    assert not (sdist_033 / "vllm").exists()
    narrowed = selection.narrowed(SUBSETS["ci"])
    assert sorted(narrowed.paths) == sorted(SUBSETS["ci"])  # each under a selected folder


@pytest.mark.network
def test_a_new_patch_brings_its_area(sdist_033):
    """A file no patch edited before selects its tests by itself; one without tests anywhere selects only the model's."""
    assert "tests/transformers_utils" in select(sdist_033, [("vllm", "transformers_utils/config.py")]).paths
    assert set(select(sdist_033, [("vllm", "no_such_module.py")]).paths) == {MODEL_TESTS}


def test_compare_per_id():
    diff = compare({"a": "passed", "b": "failed", "c": "skipped"}, {"a": "failed", "b": "failed", "d": "passed"})
    assert [(d.test_id, d.stock, d.patched, d.regression) for d in diff.differences] == [
        ("a", "passed", "failed", True), ("c", "skipped", "absent", False), ("d", "absent", "passed", False)]
    assert diff.same == 1
    assert diff.counts("stock")["failed"] == 1


HAND_WRITTEN = '''
import pytest

def test_passes(): pass
def test_fails(): assert False
@pytest.mark.skip
def test_skipped(): pass
@pytest.mark.xfail
def test_xfails(): assert False
@pytest.mark.xfail
def test_xpasses(): pass
@pytest.fixture
def broken(): raise RuntimeError
def test_setup_error(broken): pass
@pytest.mark.parametrize("x", ["a b", "é"])
def test_param(x): pass
'''


@pytest.mark.parametrize("workers", [1, 2])
def test_plugin_records_each_outcome(tmp_path, workers):
    """HAND-WRITTEN tests (no public file holds each outcome at once): every outcome by its exact node id, with
    xdist as without; a collection error is an id of its own; PATCHKIT_GATE_ONLY keeps the listed ids only."""
    (tmp_path / "test_kinds.py").write_text(HAND_WRITTEN)
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n")
    out = tmp_path / "out.json"
    env = {**os.environ, "PATCHKIT_GATE_OUTCOMES": str(out)}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "patchkit.gate.plugin",
            "--continue-on-collection-errors", *(["-n", str(workers)] if workers > 1 else []), "."]
    subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, check=False)
    assert json.loads(out.read_text()) == {
        "test_broken.py": "error", "test_kinds.py::test_fails": "failed", "test_kinds.py::test_param[a b]": "passed",
        "test_kinds.py::test_param[\\xe9]": "passed", "test_kinds.py::test_passes": "passed",
        "test_kinds.py::test_setup_error": "error", "test_kinds.py::test_skipped": "skipped",
        "test_kinds.py::test_xfails": "xfailed", "test_kinds.py::test_xpasses": "xpassed"}
    only = tmp_path / "only"
    only.write_text("test_kinds.py::test_fails\ntest_kinds.py::test_param[a b]\n")
    subprocess.run(args[:-1] + ["test_kinds.py"], cwd=tmp_path, env={**env, "PATCHKIT_GATE_ONLY": str(only)},
                   capture_output=True, check=False)
    assert json.loads(out.read_text()) == {"test_kinds.py::test_fails": "failed", "test_kinds.py::test_param[a b]": "passed"}


FIRST_RANGE = 'vllm = ">=0.30.0,<0.34"'  # the first form's claim: the patch's range on the day it was written


def _first_form_over(patches: Path) -> str:
    """The first form planted with the range the patch claims now: its one edit's anchor, glm47_moe_config's
    (TOOL_ARGS, "TOOL_END") transition, is the same text on every release 0.30.0 - 0.34.0, so the planted
    bug meets each release the series is tested on, not only those of its day (the planner still asserts
    the anchor on the release under test)."""
    first = FIRST_FORM.read_text()
    assert first.count(FIRST_RANGE) == 1
    now = tomllib.loads((patches / "glm47-tool-args-think-end" / "patch.toml").read_text())["vllm"]
    return first.replace(FIRST_RANGE, f"vllm = {json.dumps(now)}")


def _gate(patches: Path, workdir: Path, record: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "patchkit.gate", "--patches", str(patches), "--workdir", str(workdir),
                           "--narrow", "tests/parser/engine/test_ufffd_reasoning_transition.py",
                           "--record", str(record), "--workers", "1"],
                          capture_output=True, text=True, check=False, timeout=1800)


@pytest.mark.vllm
@pytest.mark.network
def test_gate_names_a_planted_patch(tmp_path, vllm_release):
    """With the planted first form in the series: exit 1, each differing id passed on stock, fails patched,
    and is named for glm47-tool-args-think-end (left out, the stock outcome comes back); on every release
    the series claims (the first form's edit, planted with today's range). The series as it is passes first,
    in the same workspace, so the planted run finds the stock outcomes remembered (gate/memo.py) and must
    still catch the patch: its differing ids rerun on both trees fresh."""
    good = _gate(REPO / "patches", tmp_path / "work", tmp_path / "series.json")
    assert good.returncode == 0, good.stderr[-3000:]
    assert json.loads((tmp_path / "series.json").read_text())["stock_remembered_from"] is None
    planted = tmp_path / "patches"
    shutil.copytree(REPO / "patches", planted)
    (planted / "glm47-tool-args-think-end" / "patch.toml").write_text(_first_form_over(REPO / "patches"))
    record = tmp_path / "planted.json"
    bad = _gate(planted, tmp_path / "work", record)
    assert bad.returncode == 1, bad.stderr[-3000:]
    found = json.loads(record.read_text())
    assert found["stock_remembered_from"] is not None and "remembered from the run finished" in bad.stderr
    assert found["stock"] == json.loads((tmp_path / "series.json").read_text())["stock"]
    assert found["differences"], textwrap.shorten(bad.stderr, 2000)
    for d in found["differences"]:
        assert (d["stock"], d["patched"], d["patch"]) == ("passed", "failed", "glm47-tool-args-think-end"), d
    assert "glm47-tool-args-think-end" in bad.stderr


@pytest.mark.vllm
def test_stock_outcomes_are_remembered_only_under_the_same_inputs(tmp_path, monkeypatch):
    """The memo's key moves with the paths, the workers, the sdist and vLLM's settings in the environment (and
    comes back with them); a memo under another key, or a file that is not one, is no memo."""
    from patchkit.gate import memo
    from patchkit.gate.run import Workspace

    ws = Workspace(tmp_path / "ws", "0.33.0")
    ws.tests_root.mkdir(parents=True)
    (ws.tests_root / ".patchkit-sdist").write_text("a" * 64)
    key = memo.stock_key(ws, ["tests/parser/engine"], 6)
    assert memo.recall(ws, key) is None
    memo.remember(ws, key, {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "failed"}, 12)
    kept = memo.recall(ws, key)
    assert kept is not None and kept.outcomes == {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "failed"}
    assert kept.seconds == 12
    assert memo.stock_key(ws, ["tests/parser"], 6) != key
    assert memo.stock_key(ws, ["tests/parser/engine"], 2) != key
    monkeypatch.setenv("VLLM_USE_V2", "0")
    assert memo.stock_key(ws, ["tests/parser/engine"], 6) != key
    monkeypatch.delenv("VLLM_USE_V2")
    (ws.tests_root / ".patchkit-sdist").write_text("b" * 64)
    assert memo.stock_key(ws, ["tests/parser/engine"], 6) != key
    assert memo.recall(ws, memo.stock_key(ws, ["tests/parser/engine"], 6)) is None
    (ws.tests_root / ".patchkit-sdist").write_text("a" * 64)
    assert memo.stock_key(ws, ["tests/parser/engine"], 6) == key
    stored = ws.root / "memo" / "stock.json"
    for bad in (b"", b"{", json.dumps({"key": key, "finished": "x", "seconds": 1, "outcomes": {"t": "maybe"}}).encode(),
                json.dumps({"key": key, "finished": "x", "seconds": 1, "outcomes": {}}).encode(),
                json.dumps({"key": key, "finished": "x", "seconds": 1, "outcomes": {"t": "passed"}, "more": 1}).encode()):
        stored.write_bytes(bad)
        assert memo.recall(ws, key) is None, bad
