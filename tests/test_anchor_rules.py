"""An anchor matches only as it was written, and an [upstreamed] probe only as a whole.

- Anchors are whole lines (patching/anchors.py): one found inside a line with other indentation is not
  a match, on any release. On a real vLLM 0.33.0 file re-indented as upstream re-indents code (a block
  moved one level in), the planner refuses the patch naming the patch, the edit, the file, the expected
  text and the nearest match; where the same text also occurs one block deeper, only the site written
  for is patched.
- Probes (patching/probes.py, the one answer of check, rebase and retire): text that is the prefix of a
  longer number or name does not fire; a probe on the release stamp file is refused as the patch loads;
  a release probe is exact by PEP 440 and reads the source's own release, never an assumed one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostile import run_patchkit
from patchkit.patching import anchors, planner
from patchkit.patching import rebase as rb
from patchkit.patching.patchset import InvalidPatchFile, Probe, load_patchset
from patchkit.patching.probes import find_whole, probe_hit
from patchkit.sources import DirectorySource, open_source
from patchkit.upstream import retire
from rebase_folders import SERIES, one_patch, tree

REPO = Path(__file__).resolve().parents[1]
MODELOPT = "model_executor/layers/quantization/modelopt.py"


@pytest.fixture(scope="module")
def modelopt():
    return open_source("vllm==0.33.0", progress=False).read("vllm", MODELOPT).decode()


def test_matches_begin_a_line():
    text = "def f():\n    foo(1)\n    if x:\n        foo(2)\nfoo(3)\n"
    assert anchors.count(text, "    foo(") == 1 and text.count("    foo(") == 2
    assert anchors.lines(text, "    foo(") == [2] and anchors.inside_lines(text, "    foo(") == [4]
    assert anchors.count(text, "foo(") == 1 and anchors.lines(text, "foo(") == [5]
    assert anchors.replace(text, "    foo(", "    bar(") == text.replace("    foo(1)", "    bar(1)")
    # an anchor that begins with a newline begins at a line's end: it may follow anything on that line
    assert anchors.count(text, "\n    foo(") == 1 and anchors.count(text, "\nfoo(") == 1
    assert anchors.first(text, "    if x:\n") == text.index("    if x:\n") and anchors.first(text, "nothing") == -1


def test_an_anchor_found_only_inside_a_line_is_refused_naming_patch_edit_file_and_nearest_match(tmp_path, modelopt):
    patches = one_patch(tmp_path / "patches", "modelopt-mtp-namespace")
    (edit,) = load_patchset(patches).patch("modelopt-mtp-namespace").edits
    first_line = edit.anchor.splitlines()[0]
    assert first_line.startswith("    ") and anchors.count(modelopt, edit.anchor) == 1
    # the block the anchor was written for, moved one level in: every line of it four spaces deeper
    indented = "".join("    " + line if line.strip() else line for line in edit.anchor.splitlines(keepends=True))
    assert edit.anchor in indented  # a substring search would still find it (and insert there)
    drifted = tree(tmp_path / "drifted", "0.33.0", {MODELOPT: modelopt.replace(edit.anchor, indented)})
    plan = planner.plan(load_patchset(patches).series(), DirectorySource(drifted))
    result = plan.result("modelopt-mtp-namespace")
    assert result.state == planner.State.BROKEN and not plan.changes
    (broken,) = result.edits
    line = modelopt[: modelopt.index(edit.anchor)].count("\n") + 1
    assert broken.found == 0 and broken.nearest is not None and broken.nearest.line == line
    message = result.describe()
    for needle in ("patch modelopt-mtp-namespace: broken", "edit 1 (insert_before)", f"vllm/{MODELOPT}",
                   "anchor expected 1x, found 0x", f"inside a line (not at its start) at line {line}",
                   f"nearest match at line {line}", "-" + first_line, "+    " + first_line):
        assert needle in message, (needle, message)
    out = run_patchkit("check", "--source", str(drifted), "--patches", str(patches), "--json", timeout=120)
    assert out.code == 1 and "Traceback" not in out.output
    (shown,) = [p for p in json.loads(out.stdout)["patches"] if p["id"] == "modelopt-mtp-namespace"]
    assert shown["state"] == "broken" and "inside a line" in shown["edits"][0]["detail"]
    assert shown["edits"][0]["path"] == MODELOPT and shown["edits"][0]["nearest"]["line"] == line


def test_only_the_site_written_for_is_patched_when_the_text_also_occurs_a_block_deeper(tmp_path, modelopt):
    patches = one_patch(tmp_path / "patches", "modelopt-mtp-namespace")
    (edit,) = load_patchset(patches).patch("modelopt-mtp-namespace").edits
    deeper = "".join("    " + line if line.strip() else line for line in edit.anchor.splitlines(keepends=True))
    extra = "\n\ndef _nested(candidates):\n    if candidates:\n        for _ in (0,):\n" + deeper
    text = modelopt + extra
    assert text.count(edit.anchor) == 2 and anchors.count(text, edit.anchor) == 1
    source = DirectorySource(tree(tmp_path / "tree", "0.33.0", {MODELOPT: text}))
    plan = planner.plan(load_patchset(patches).series(), source)
    assert plan.ok, plan.result("modelopt-mtp-namespace").describe()
    (change,) = plan.changes
    patched = change.new.decode()
    assert patched.count(edit.text) == 1 and patched.endswith(extra), "the nested copy is left alone"
    assert anchors.count(patched, edit.applied_form) == 1
    # and it reads back as applied, and reverts to the bytes it came from
    (dest := tmp_path / "applied").mkdir()
    applied = DirectorySource(tree(dest / "t", "0.33.0", {MODELOPT: patched}))
    assert planner.plan(load_patchset(patches).series(), applied).result("modelopt-mtp-namespace").state == \
        planner.State.APPLIED
    reverted = planner.plan(load_patchset(patches).series(), applied, mode="revert")
    assert reverted.changes[0].new.decode() == text


# ---------------------------------------------------------------------------------------------- probes

def test_probe_text_matches_whole_never_a_prefix_of_a_longer_number_or_name():
    assert find_whole("version_tuple = (0, 34, 0)\n", "version_tuple = (0, 3") == -1
    assert find_whole("version_tuple = (0, 3, 1)\n", "version_tuple = (0, 3") == 0
    assert find_whole("X = VLLM_FOO_BAR\nY = VLLM_FOO\n", "VLLM_FOO") == 21
    assert find_whole("MY_VLLM_FOO = 1\n", "VLLM_FOO") == -1
    assert find_whole("    hf_to_vllm_mapper = x\n", "    hf_to_vllm_mapper = ") == 0
    probe = Probe("vllm", ("envs.py",), contains="STAMP = (0, 3")
    texts = {"envs.py": "STAMP = (0, 34)\n"}
    assert probe_hit(probe, texts.get, "0.34.0") is None
    texts["envs.py"] = "a = 1\nSTAMP = (0, 3)\n"
    hit = probe_hit(probe, texts.get, "0.3.0")
    assert hit is not None and (hit.where, hit.line) == ("vllm/envs.py", 2)


def _probe_toml(probe: str):
    def edit(text: str) -> str:
        start = text.index("[upstreamed]\n")
        end = text.index("[[edit]]", start)
        return text[:start] + "[upstreamed]\n" + probe + "\n" + text[end:]
    return edit


@pytest.mark.parametrize(("probe", "problem"), [
    ('file = "_version.py"\ncontains = "version_tuple = (0, 3"\n', "version-probe"),
    ('files = ["envs.py", "_version.py"]\ncontains = "__version__ = "\n', "version-probe"),
    ('release = ">=0.30.0,<0.34"\ncontains = "x"\nfile = "envs.py"\n', "probe-kind"),
    ('release = ">=0.30.0,<0.34"\nfile = "_version.py"\n', "probe-kind"),
    ('file = "envs.py"\n', "probe-kind"),
])
def test_a_probe_on_the_release_stamp_or_of_two_kinds_is_refused_as_the_patch_loads(tmp_path, probe, problem):
    patches = one_patch(tmp_path / "patches", "persistent-topk-cc12", _probe_toml(probe))
    with pytest.raises(InvalidPatchFile) as info:
        load_patchset(patches)
    assert info.value.problem == problem and info.value.at == "[upstreamed]"


@pytest.mark.parametrize(("stamp", "fires"), [
    ('__version__ = version = "0.33.0"\n', True),
    ('__version__ = version = "0.30.0"\n', True),
    ('__version__ = version = "0.34.0"\n', False),  # shares "0.3" (and "(0, 3") with the releases named
    ("__version__ = version = '0.1.dev20051+g487ecf187'\n", False),  # the pinned base's nightly
])
def test_a_release_probe_is_exact_and_one_answer_for_check_rebase_and_retire(tmp_path, stamp, fires):
    """persistent-topk-cc12's probe (`release = ">=0.30.0,<0.34"`) on trees stamped as each release, the
    patch's own files from 0.33.0: check, rebase and retire agree, each through patching.probes."""
    patchset = load_patchset(SERIES)  # the probe as it stood for 0.33.0: 0.34.0 outside it
    patch = patchset.patch("persistent-topk-cc12")
    assert patch.upstreamed is not None and patch.upstreamed.contains is None
    sdist = open_source("vllm==0.33.0", progress=False)
    files = {c: sdist.read("vllm", c).decode() for e in patch.edits for c in e.candidates
             if sdist.read("vllm", c) is not None}
    source = DirectorySource(tree(tmp_path / "tree", "", files, stamp))
    # check, with the layout assumed as an image does for a dev build: the probe still reads the stamp
    checked = planner.plan([patch], source, versions={"vllm": "0.33.0"}).result(patch.id)
    assert (checked.state == planner.State.UPSTREAMED) == fires, checked.describe()
    hit = retire.probe_hit(patch, source)
    assert (hit is not None) == fires
    old = DirectorySource(tree(tmp_path / "old", "0.33.0", files))
    if not source.versions()["vllm"].startswith("0.1.dev"):  # a nightly is no release a rebase moves onto
        (rebased,) = rb.rebase([patch], old, source).results
        assert (rebased.state == rb.RebaseState.UPSTREAMED) == fires, rebased.detail
        if fires:
            assert "the release vllm" in rebased.detail and "<0.34,>=0.30.0" in rebased.detail
