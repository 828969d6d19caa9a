"""`patchkit rebase` on real history and on crafted drift of real files.

Real history (marked `network`: the index's sdists, downloaded once into the user cache): the patch set
with its 0.31+ edits and paths stripped, rebased from vLLM 0.30.0 onto 0.31.0, must give back the
hand-written edits (the figure per patch is the benchmark's, `nox -s bench -- --only rebase`; here the
facts that must not regress). Crafted drift: a real 0.33.0 file changed the way upstream changes code
(a renamed variable inside an anchor, a duplicated anchor, a changed assert), in directories.
"""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from hostile import assert_refused, run_patchkit
from patchkit.patching import planner
from patchkit.patching import rebase as rb
from patchkit.patching.patchset import load_patchset
from patchkit.sources import DirectorySource, open_source
from rebase_folders import SERIES, one_patch, tree

REPO = Path(__file__).resolve().parents[1]
MODELOPT = "model_executor/layers/quantization/modelopt.py"


@pytest.fixture(scope="module")
def releases():
    return {v: open_source(f"vllm=={v}", progress=False) for v in ("0.30.0", "0.31.0", "0.33.0")}


@pytest.mark.network
def test_stripped_0_31_edits_come_back_from_0_30(tmp_path, releases):
    measured = rb.measure(SERIES, releases["0.30.0"], releases["0.31.0"], tmp_path)
    figures = measured["patches"]
    # Every moved-file edit of the nvidia/ -> common/ layout change is recovered byte for byte.
    for patch_id in ("naming-shim", "kda-fp32-taps", "nope-mla-pad", "packed-modules-4p67", "pool-topk-init"):
        assert figures[patch_id]["identical"] == figures[patch_id]["later_edits"] > 0, figures[patch_id]
    # persistent-topk-cc12's 0.31 fix is three edits in another file: a person's, with the closest site.
    person = figures["persistent-topk-cc12"]
    assert person["recovered"] == 0 and person["state"] == "needs-person"
    assert "not the same code" in person["needs_person"][0]["reason"]
    assert person["needs_person"][0]["candidates"], "the closest candidates are named"
    total = sum(f["later_edits"] for f in figures.values())
    recovered = sum(f["recovered"] for f in figures.values())
    assert recovered / total >= 0.8, (recovered, total)
    # The rebased set applies on 0.31.0 and still on 0.30.0.
    rebased = load_patchset(measured["rebased_dir"])
    for version in ("0.30.0", "0.31.0"):
        plan = planner.plan(rebased.series(), releases[version])
        assert plan.ok, [r.describe() for r in plan.results if not r.ok]


@pytest.mark.network
def test_a_vendor_copy_as_close_is_decided_by_the_patch_sets_directories(tmp_path, releases):
    """0.31 moved the kpool indexer into models/glm5next/nvidia/sparse_indexer.py, beside an amd/ copy that
    shares as many lines: the nvidia/ one is chosen because the patch set targets models/glm5next/ files."""
    stripped = rb.without_later_edits(SERIES, tmp_path / "stripped", releases["0.30.0"])
    result = rb.rebase(stripped.series(), releases["0.30.0"], releases["0.31.0"])
    patch = next(r for r in result.results if r.patch.id == "pool-topk-init")
    assert patch.state == rb.RebaseState.UNTESTED and not patch.people  # placed; no tests ran: never "rebased"
    for proposal in patch.proposals:
        assert proposal.kind == "moved"
        assert proposal.new.candidates == ("model_executor/layers/sparse_attn_indexer_kpool.py",
                                           "models/glm5next/nvidia/sparse_indexer.py")
        assert "models/glm5next/amd/sparse_indexer.py as close by content" in proposal.evidence.why
    # Alone, with no other target under models/glm5next/, the same tie is a person's call.
    (alone,) = rb.rebase([stripped.patch("pool-topk-init")], releases["0.30.0"], releases["0.31.0"]).results
    assert alone.state == rb.RebaseState.NEEDS_PERSON and "as close" in alone.people[0].reason
    assert any("amd/sparse_indexer.py" in c for c in alone.people[0].candidates)


@pytest.mark.network
def test_rebase_write_on_real_history_is_checked_and_atomic(tmp_path, releases):
    stripped = rb.without_later_edits(SERIES, tmp_path / "stripped", releases["0.30.0"])
    before = (stripped.folder / "naming-shim" / "patch.toml").read_bytes()
    out = run_patchkit("rebase", "--from", "0.30.0", "--to", "0.31.0", "--patch", "naming-shim", "--no-tests",
                       "--patches", str(stripped.folder), "--json", timeout=300, address_space=False)
    assert out.code == 0, out.output[-3000:]
    assert (stripped.folder / "naming-shim" / "patch.toml").read_bytes() == before, "nothing written without --write"
    out = run_patchkit("rebase", "--from", "0.30.0", "--to", "0.31.0", "--patch", "naming-shim", "--no-tests",
                       "--write", "--patches", str(stripped.folder), timeout=300, address_space=False)
    assert out.code == 0, out.output[-3000:]
    written = load_patchset(stripped.folder).patch("naming-shim")
    hand = load_patchset(SERIES).patch("naming-shim")
    assert [(e.candidates, e.anchor, e.text, e.count) for e in written.edits] == \
           [(e.candidates, e.anchor, e.text, e.count) for e in hand.edits]
    assert not list((stripped.folder / "naming-shim").glob(".*.part")), "no temporary file left"


def test_a_renamed_variable_inside_a_replaced_anchor_is_merged_three_way(tmp_path):
    """A real 0.33.0 file; the 'new release' renames a name on a line the replace edit keeps."""
    src = open_source("vllm==0.33.0", progress=False)
    old_text = src.read("vllm", "models/glm5next/common/attention.py").decode()
    patches = one_patch(tmp_path / "patches", "nope-mla-pad")
    edit = next(e for e in load_patchset(patches).patch("nope-mla-pad").edits
                if e.anchor.startswith("            self.indexer_rope_emb"))
    assert old_text.count(edit.anchor) == 1
    # upstream changes the line after the one the edit replaces, inside the same two-line anchor
    new_anchor = edit.anchor.replace("                qk_rope_head_dim,\n", "                rope_dim_of(config),\n")
    assert new_anchor != edit.anchor
    old = tree(tmp_path / "old", "0.33.0", {"models/glm5next/common/attention.py": old_text})
    new = tree(tmp_path / "new", "0.34.0", {"models/glm5next/common/attention.py": old_text.replace(edit.anchor, new_anchor)})
    reader = rb.Reader(DirectorySource(old), DirectorySource(new))
    outcome = rb.rebase_edit(edit, reader, "0.34.0", split="<0.34")
    # The edit replaces exactly the line upstream changed: a conflict, never a guess.
    assert isinstance(outcome, rb.NeedsPerson) and "merge conflict" in outcome.reason
    # A rename on the anchor's first line, which the edit keeps, merges: upstream's line, the edit's line.
    lines = old_text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("            self.indexer_rope_emb"))
    lines[at] = lines[at].replace("self.indexer_rope_emb", "self.index_rope")
    new2 = tree(tmp_path / "new2", "0.34.0", {"models/glm5next/common/attention.py": "".join(lines)})
    outcome = rb.rebase_edit(edit, rb.Reader(DirectorySource(old), DirectorySource(new2)), "0.34.0", split="<0.34")
    assert isinstance(outcome, rb.Proposal), outcome
    assert outcome.kind == "re-anchored" and outcome.new.anchor.startswith("            self.index_rope")
    assert "self.index_rope" in outcome.new.text and "patchkit nope-mla-pad" in outcome.new.text
    assert 0.6 <= outcome.evidence.similarity < 1


def test_rebase_cli_splits_the_edit_and_grows_the_range(tmp_path):
    src = open_source("vllm==0.33.0", progress=False)
    old_text = src.read("vllm", MODELOPT).decode()
    patches = one_patch(tmp_path / "patches", "modelopt-mtp-namespace")
    (edit,) = load_patchset(patches).patch("modelopt-mtp-namespace").edits
    drift = old_text.replace(edit.anchor, edit.anchor.replace("return tuple(", "return  tuple("))
    old = tree(tmp_path / "old", "0.33.0", {MODELOPT: old_text})
    new = tree(tmp_path / "new", "0.34.0", {MODELOPT: drift})
    out = run_patchkit("rebase", "--from", str(old), "--to", str(new), "--patches", str(patches), "--no-tests",
                       "--write", "--json", timeout=120)
    assert out.code == 0, out.output[-3000:]
    doc = tomllib.loads((patches / "modelopt-mtp-namespace" / "patch.toml").read_text())
    assert doc["vllm"] == ">=0.30.0,<0.35"
    assert [e.get("versions") for e in doc["edit"]] == ["<0.34", ">=0.34"]
    assert doc["edit"][1]["anchor"] == "        return  tuple(dict.fromkeys(candidates))\n"
    assert doc["edit"][0]["text"] == doc["edit"][1]["text"]
    rebased = load_patchset(patches)
    for root in (old, new):
        plan = planner.plan(rebased.series(), DirectorySource(root))
        assert plan.ok and plan.changes, [r.describe() for r in plan.results]


def test_a_count_is_never_loosened_and_a_changed_assert_is_a_persons_call(tmp_path):
    src = open_source("vllm==0.33.0", progress=False)
    kda = "models/glm5next/common/kda.py"
    old_text = src.read("vllm", kda).decode()
    patches = one_patch(tmp_path / "patches", "kda-fp32-taps")
    first, second = load_patchset(patches).patch("kda-fp32-taps").edits
    old = tree(tmp_path / "old", "0.33.0", {kda: old_text})
    doubled = tree(tmp_path / "doubled", "0.34.0", {kda: old_text + "\n" + first.anchor})
    downcast = tree(tmp_path / "downcast", "0.34.0", {kda: old_text.replace(
        "params_dtype=torch.float32,\n            prefix=f\"{prefix}.q_conv1d\"",
        "params_dtype=torch.bfloat16,\n            prefix=f\"{prefix}.q_conv1d\"")})
    outcome = rb.rebase_edit(first, rb.Reader(DirectorySource(old), DirectorySource(doubled)), "0.34.0", split="<0.34")
    assert isinstance(outcome, rb.NeedsPerson) and "never loosened" in outcome.reason
    outcome = rb.rebase_edit(first, rb.Reader(DirectorySource(old), DirectorySource(downcast)), "0.34.0", split="<0.34")
    assert isinstance(outcome, rb.NeedsPerson) and "assert's code changed" in outcome.reason
    assert any("torch.bfloat16" in c for c in outcome.candidates)
    out = run_patchkit("rebase", "--from", str(old), "--to", str(downcast), "--patches", str(patches),
                       "--no-tests", "--write", timeout=120)
    assert out.code == rb.EXIT_NEEDS_PERSON and "NEEDS A PERSON" in out.output and "Traceback" not in out.output
    assert "nothing written: kda-fp32-taps (edit 1 needs a person)" in " ".join(out.output.split())
    assert "use --write" not in out.output, "--write was given: the text says why nothing was written"
    assert second.anchor in (patches / "kda-fp32-taps" / "patch.toml").read_text()


def test_a_missing_test_environment_is_exit_1_not_a_silent_pass(tmp_path):
    src = open_source("vllm==0.33.0", progress=False)
    old_text = src.read("vllm", MODELOPT).decode()
    patches = one_patch(tmp_path / "patches", "modelopt-mtp-namespace")
    (edit,) = load_patchset(patches).patch("modelopt-mtp-namespace").edits
    old = tree(tmp_path / "old", "0.33.0", {MODELOPT: old_text})
    new = tree(tmp_path / "new", "0.34.0", {MODELOPT: old_text.replace(edit.anchor, "    " + edit.anchor)})
    out = run_patchkit("rebase", "--from", str(old), "--to", str(new), "--patches", str(patches), "--write",
                       env={"PATCHKIT_CACHE_DIR": str(tmp_path / "empty-cache")}, timeout=120)
    assert out.code == 1, out.output[-3000:]
    assert "no test environment for vLLM 0.34.0" in out.output and "nothing written" in out.output


def test_merge3_applies_both_sides_or_refuses():
    base = "a\nb\nc\nd\n"
    assert rb.merge3(base, "a\nB\nc\nd\n", "a\nb\nc\nD\n") == "a\nB\nc\nD\n"
    assert rb.merge3(base, "a\nB\nc\nd\n", "a\nX\nc\nd\n") is None
    assert rb.merge3(base, "a\nB\nc\nd\n", "a\nB\nc\nd\n") == "a\nB\nc\nd\n"
    assert rb.merge3(base, "a\nB\nc\nd\n", "a\nb\nC\nd\n") == "a\nB\nC\nd\n"  # adjacent lines
    assert rb.merge3(base, "a\nb\nX\nc\nd\n", "a\nb\nC\nd\n") is None  # an insertion beside a change


def test_rebase_refuses_bad_input_cleanly(tmp_path):
    assert_refused(run_patchkit("rebase", "--to", str(tmp_path / "nowhere"), "--no-tests"),
                   str(tmp_path / "nowhere"))
    assert_refused(run_patchkit("rebase", "--to", "0.33.0", "--patch", "no-such-patch", "--no-tests"),
                   "no-such-patch")


# ---------------------------------------------------------------------------------------------- per patch

KDA = "models/glm5next/common/kda.py"
FP32_TAP = 'params_dtype=torch.float32,\n            prefix=f"{prefix}.q_conv1d"'


def some_patches(dest: Path, patch_ids: list[str]) -> Path:
    """A patch folder holding these real patches (in the full series' order)."""
    dest.mkdir(parents=True)
    for patch_id in patch_ids:
        shutil.copytree(SERIES / patch_id, dest / patch_id)
    (dest / "series.toml").write_text("series = [" + ", ".join(f'"{i}"' for i in patch_ids) + "]\n")
    return dest


def drifted_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Real 0.33.0 files, and a "0.34.0" that changes two of them as upstream does: modelopt's anchor line
    (re-anchorable: modelopt-mtp-namespace) and the KDA q tap's dtype (an assert's code: a person's)."""
    src = open_source("vllm==0.33.0", progress=False)
    modelopt, kda = src.read("vllm", MODELOPT).decode(), src.read("vllm", KDA).decode()
    patches = some_patches(tmp_path / "patches", ["kda-fp32-taps", "modelopt-mtp-namespace"])
    (edit,) = load_patchset(patches).patch("modelopt-mtp-namespace").edits
    assert modelopt.count(edit.anchor) == 1 and kda.count(FP32_TAP) == 1
    old = tree(tmp_path / "old", "0.33.0", {MODELOPT: modelopt, KDA: kda})
    new = tree(tmp_path / "new", "0.34.0", {
        MODELOPT: modelopt.replace(edit.anchor, edit.anchor.replace("return tuple(", "return  tuple(")),
        KDA: kda.replace(FP32_TAP, FP32_TAP.replace("torch.float32", "torch.bfloat16"))})
    return patches, old, new


def files_of(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_write_is_per_patch_and_a_persons_edit_holds_back_only_its_own_patch(tmp_path):
    patches, old, new = drifted_pair(tmp_path)
    before = files_of(patches)
    args = ("rebase", "--from", str(old), "--to", str(new), "--patches", str(patches), "--no-tests")

    out = run_patchkit(*args, timeout=120)
    text = " ".join(out.output.split())
    assert out.code == rb.EXIT_NEEDS_PERSON, out.output[-3000:]
    assert "nothing written (use --write): would write modelopt-mtp-namespace" in text
    assert "kept as they were: kda-fp32-taps (edit 1 needs a person)" in text
    assert files_of(patches) == before, "nothing written without --write"

    text_run = tmp_path / "text-run"
    shutil.copytree(patches, text_run)
    out = run_patchkit(*args, "--write", "--json", timeout=120)
    assert out.code == rb.EXIT_NEEDS_PERSON, out.output[-3000:]
    doc = json.loads(out.stdout)
    by_id = {p["patch"]: p for p in doc["patches"]}
    assert {k: p["state"] for k, p in by_id.items()} == {"kda-fp32-taps": "needs-person",
                                                         "modelopt-mtp-namespace": "re-anchored, untested"}
    assert doc["written_patches"] == ["modelopt-mtp-namespace"] and doc["exit_code"] == rb.EXIT_NEEDS_PERSON
    assert doc["not_written"] == {"kda-fp32-taps": "edit 1 needs a person"}
    (person,) = by_id["kda-fp32-taps"]["needs_person"]
    assert person["edit"] == 1 and any("torch.bfloat16" in c for c in person["candidates"]), "its candidates listed"
    # Only modelopt-mtp-namespace/patch.toml changed: no other file, no new file, no temporary file left.
    after = files_of(patches)
    assert after.keys() == before.keys()
    assert [p for p in after if after[p] != before[p]] == [patches / "modelopt-mtp-namespace" / "patch.toml"]
    doc_toml = tomllib.loads((patches / "modelopt-mtp-namespace" / "patch.toml").read_text())
    assert doc_toml["vllm"] == ">=0.30.0,<0.35" and [e.get("versions") for e in doc_toml["edit"]] == ["<0.34", ">=0.34"]
    assert tomllib.loads((patches / "kda-fp32-taps" / "patch.toml").read_text())["vllm"] == ">=0.30.0,<0.34"
    plan = planner.plan(load_patchset(patches).series(), DirectorySource(new))
    assert {r.patch.id: r.state for r in plan.results} == {"kda-fp32-taps": planner.State.OUT_OF_RANGE,
                                                          "modelopt-mtp-namespace": planner.State.NOT_APPLIED}

    out = run_patchkit("rebase", "--from", str(old), "--to", str(new), "--patches", str(text_run), "--no-tests",
                       "--write", timeout=120)
    text = " ".join(out.output.split())
    assert out.code == rb.EXIT_NEEDS_PERSON and "Traceback" not in out.output
    assert "patch modelopt-mtp-namespace: re-anchored, untested" in text and "rebased" not in text.replace("rebased series", "")
    assert "written: modelopt-mtp-namespace; kept as they were: kda-fp32-taps (edit 1 needs a person)" in text
    assert "use --write" not in text


def fake_test_environment(cache: Path, version: str) -> None:
    """A nox environment as test_environment() finds one: this interpreter, and the release's dist-info."""
    env = cache / "nox" / "tests"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / "lib" / "python3" / "site-packages" / f"vllm-{version}.dist-info").mkdir(parents=True)


def behaviour_tests(folder: Path, patch_id: str, body: str) -> Path:
    (folder / "patches").mkdir(parents=True)
    (folder / "patches" / f"test_{patch_id.replace('-', '_')}.py").write_text(body)
    return folder


@pytest.mark.parametrize(("body", "state", "code"), [
    ("def test_it():\n    pass\n", rb.RebaseState.REBASED, rb.EXIT_WRITTEN),
    ("def test_it():\n    assert False, 'the edit does not work on the new code'\n", rb.RebaseState.TESTS_FAILED,
     rb.EXIT_FAILED),
])
def test_a_patch_is_rebased_only_when_its_behaviour_tests_passed(tmp_path, body, state, code):
    patches, old, new = drifted_pair(tmp_path)
    cache, tests = tmp_path / "cache", behaviour_tests(tmp_path / "tests", "modelopt-mtp-namespace", body)
    fake_test_environment(cache, "0.34.0")
    result = rb.rebase(load_patchset(patches).series(), DirectorySource(old), DirectorySource(new))
    plan = rb.check(result, patches, DirectorySource(new), tmp_path / "rebased")
    by_id = {r.patch.id: r for r in result.results}
    assert by_id["modelopt-mtp-namespace"].state == rb.RebaseState.UNTESTED and plan.ok
    runs = rb.run_tests(result, tmp_path / "rebased", "0.34.0", run=True, cache=cache, tests_dir=tests)
    assert [t.patch_id for t in runs] == ["modelopt-mtp-namespace"]
    assert by_id["modelopt-mtp-namespace"].state == state
    assert by_id["kda-fp32-taps"].state == rb.RebaseState.NEEDS_PERSON  # never tested, never written
    written = [r.patch.id for r in result.writable]
    assert written == (["modelopt-mtp-namespace"] if state == rb.RebaseState.REBASED else [])
    assert result.exit_code == (rb.EXIT_NEEDS_PERSON if code == rb.EXIT_WRITTEN else code)
    if state == rb.RebaseState.TESTS_FAILED:
        assert result.why_not_written(by_id["modelopt-mtp-namespace"]) == "its behaviour tests failed on the new release"
        assert "the edit does not work on the new code" in by_id["modelopt-mtp-namespace"].failure


def test_untested_is_said_and_written_only_when_tests_were_not_asked_for(tmp_path):
    patches, old, new = drifted_pair(tmp_path)
    for run, code, writable in ((False, rb.EXIT_NEEDS_PERSON, ["modelopt-mtp-namespace"]), (True, rb.EXIT_FAILED, [])):
        result = rb.rebase(load_patchset(patches).series(), DirectorySource(old), DirectorySource(new))
        rb.check(result, patches, DirectorySource(new), tmp_path / f"rebased-{run}")
        rb.run_tests(result, tmp_path / f"rebased-{run}", "0.34.0", run=run, cache=tmp_path / "no-cache",
                     tests_dir=REPO / "tests")
        modelopt = next(r for r in result.results if r.patch.id == "modelopt-mtp-namespace")
        assert modelopt.state == rb.RebaseState.UNTESTED and modelopt.tests is None
        assert (result.exit_code, [r.patch.id for r in result.writable]) == (code, writable)
        assert ("--no-tests" if not run else "no test environment for vLLM 0.34.0") in result.tests_note


@pytest.mark.network
def test_the_real_0_34_0_places_what_it_can_and_names_each_persons_edit(tmp_path, releases):
    """vLLM 0.34.0 as released: KDA's three short-conv taps fused into one parameter (naming-shim's asserts
    8-10, kda-fp32-taps' two), a changed line inside pool-topk-init's first site, and quantprobe's edit 2
    anchor found only inside a longer line with other indentation (a substring search took it: refused)."""
    new = open_source("vllm==0.34.0", progress=False)
    result = rb.rebase(load_patchset(SERIES).series(), releases["0.33.0"], new)
    by_id = {r.patch.id: r for r in result.results}
    people = {i: [n.edit.index for n in r.people] for i, r in by_id.items() if r.state == rb.RebaseState.NEEDS_PERSON}
    assert people == {"naming-shim": [8, 9, 10], "kda-fp32-taps": [1, 2], "pool-topk-init": [1], "quantprobe": [2]}
    assert all(n.candidates for i in people for n in by_id[i].people), "each with its nearest candidates"
    assert by_id["glm53-always-think"].state == rb.RebaseState.UPSTREAMED
    # persistent-topk-cc12's release probe is exact: 0.34.0 is not one of the releases it names
    assert by_id["persistent-topk-cc12"].state == rb.RebaseState.UNTESTED
    plan = rb.check(result, SERIES, new, tmp_path / "rebased")
    assert plan.ok, [r.describe() for r in plan.results if not r.ok]
    assert not {r.patch.id for r in result.writable} & set(people)
    assert all(r.state != rb.RebaseState.REBASED for r in result.results), "no test ran: nothing is 'rebased'"
