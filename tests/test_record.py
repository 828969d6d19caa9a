"""`patchkit record`: every real patch's own effect recorded from a stock and a patched tree of real vLLM
0.33.0 files, and proven by applying the recording onto the stock tree (byte for byte the patched one),
the same changes the hand-written patch plans. Hostile trees are refused without a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tomllib
import typing
from pathlib import Path

import pytest

from builders import patch_toml
from hostile import assert_refused, run_patchkit
from patchkit.jsondata import decode
from patchkit.patching import planner
from patchkit.patching.patchset import Action, Edit, InvalidPatchFile, load_patch, load_patchset
from patchkit.patching.record import (
    NOT_READ_BACK,
    READ_BACK,
    RecordedEdit,
    RecordingRecord,
    Unrecordable,
    edit_block,
    record,
    split_edits,
    write_recording,
)
from patchkit.sources import DirectorySource, open_source
from record_fields import declared_but_absent

REPO = Path(__file__).resolve().parents[1]
# persistent-topk-cc12's [upstreamed] probe fires on every release (version_tuple = (0, 3...)); its edits
# run on a dev-build base, stamped as the lab base is and taken for 0.33.0 (--assume-version).
DEV_STAMP = "__version__ = version = '0.1.dev20051'\nversion_tuple = (0, 1, 'dev20051')\n"


@pytest.fixture(scope="module")
def stock_files():
    source = open_source("vllm==0.33.0", progress=False)
    paths = {c for p in load_patchset(REPO / "patches").series() for e in p.edits if e.package == "vllm"
             for c in e.candidates} | {"__init__.py", "_version.py"}
    return {path: data for path, data in source.read_many("vllm", sorted(paths)).items() if data is not None}


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for path, data in files.items():
        (root / "vllm" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "vllm" / path).write_bytes(data)
    return root


def series_trees(tmp: Path, files: dict[str, bytes], patch_id: str, assume: dict[str, str]) -> tuple[Path, Path]:
    """ORIGINAL: the stock files with the series before the patch applied; EDITED: with the patch as well."""
    series = load_patchset(REPO / "patches").series()
    at = [p.id for p in series].index(patch_id)
    stock = DirectorySource(write_tree(tmp / "stock", files))
    trees = []
    for name, upto in (("original", at), ("edited", at + 1)):
        plan = planner.plan(series[:upto], stock, versions=assume)
        assert plan.ok, [r.describe() for r in plan.results if not r.ok]
        out = dict(files)
        out.update({c.path: c.new for c in plan.changes})
        trees.append(write_tree(tmp / name, out))
    return trees[0], trees[1]


EFFECTFUL = ["naming-shim", "nope-mla-pad", "modelopt-mtp-namespace", "packed-modules-4p67", "persistent-topk-cc12",
             "pool-topk-init", "quantprobe"]


@pytest.mark.parametrize("patch_id", EFFECTFUL)
def test_recording_a_real_patch_round_trips_byte_for_byte(tmp_path, stock_files, patch_id):
    files, assume = dict(stock_files), {}
    if patch_id == "persistent-topk-cc12":
        files["_version.py"], assume = DEV_STAMP.encode(), {"vllm": "0.33.0"}
    original, edited = series_trees(tmp_path, files, patch_id, assume)
    folder = tmp_path / "patches"
    shutil.copytree(REPO / "patches", folder)
    hand = load_patchset(folder).patch(patch_id)
    recording = record(hand, original, edited, versions=assume)  # proven inside: raises if not byte-exact
    write_recording(hand, recording)
    recorded = load_patchset(folder).patch(patch_id)
    # The same plan as the hand-written patch, on ORIGINAL: the same files, the same new bytes.
    source = DirectorySource(original)
    want = planner.plan([hand], source, versions=assume).changes
    got = planner.plan([recorded], source, versions=assume).changes
    assert [(c.path, c.new) for c in got] == [(c.path, c.new) for c in want] and want
    # Each anchor is unique (count 1) and no longer than the hand-written patch's longest needs.
    assert all(e.count == 1 for e in recorded.edits if e.action != "assert")
    # The hand-written asserts and other releases' edits are kept as they were.
    assert [e.anchor for e in recorded.edits if e.action == "assert"] == [e.anchor for e in hand.edits if e.action == "assert"]
    for name in recording.files:
        assert (folder / patch_id / name).is_file()


def test_long_text_goes_to_a_file_beside_patch_toml(tmp_path, stock_files):
    original, edited = series_trees(tmp_path, stock_files, "nope-mla-pad", {})
    folder = tmp_path / "patches"
    shutil.copytree(REPO / "patches", folder)
    patch = load_patchset(folder).patch("nope-mla-pad")
    recording = record(patch, original, edited)
    assert recording.files, "the config hook and the attention helpers are long"
    write_recording(patch, recording)
    doc = tomllib.loads((folder / "nope-mla-pad" / "patch.toml").read_text())
    named = [e["text_file"] for e in doc["edit"] if "text_file" in e]
    assert set(recording.files) <= set(named)
    # the FlashInfer edits (another package, not in the tree) are kept as written
    assert sum(1 for e in doc["edit"] if e.get("package") == "flashinfer") == 6


def test_an_assert_only_patch_has_nothing_to_record(tmp_path, stock_files):
    original, edited = series_trees(tmp_path, stock_files, "kda-fp32-taps", {})
    patch = load_patchset(REPO / "patches").patch("kda-fp32-taps")
    with pytest.raises(Unrecordable) as info:
        record(patch, original, edited)
    assert (info.value.path, info.value.problem) == (str(edited), "nothing")
    assert info.value.exit_code == 1


def test_record_cli_refuses_what_an_anchor_cannot_say(tmp_path, stock_files):
    original = write_tree(tmp_path / "original", stock_files)
    added = write_tree(tmp_path / "added", {**stock_files, "new_module.py": b"x = 1\n"})
    out = run_patchkit("record", "--patch", "quantprobe", "--from", str(original), "--to", str(added))
    assert out.code == 1 and "vllm/new_module.py" in out.output and "Traceback" not in out.output
    binary = write_tree(tmp_path / "binary", {**stock_files, "__init__.py": b"\xff\xfe\x00"})
    out = run_patchkit("record", "--patch", "quantprobe", "--from", str(original), "--to", str(binary))
    assert out.code == 1 and "not UTF-8" in out.output and "Traceback" not in out.output
    assert_refused(run_patchkit("record", "--patch", "no-such", "--from", str(original), "--to", str(binary)),
                   "no-such")
    assert_refused(run_patchkit("record", "--patch", "quantprobe", "--from", str(original), "--to", str(original)),
                   "same directory")
    fifo = write_tree(tmp_path / "fifo", stock_files)
    os.mkfifo(fifo / "vllm" / "pipe.py")
    assert_refused(run_patchkit("record", "--patch", "quantprobe", "--from", str(original), "--to", str(fifo)),
                   "pipe.py", "not a regular file")
    # nothing was written into the repository's patch folder by any of these
    assert not (REPO / "patches" / "quantprobe" / "base_config.py.txt").exists()


def test_record_cli_writes_only_with_write(tmp_path, stock_files):
    original, edited = series_trees(tmp_path, stock_files, "quantprobe", {})
    folder = tmp_path / "patches"
    shutil.copytree(REPO / "patches", folder)
    before = (folder / "quantprobe" / "patch.toml").read_bytes()
    out = run_patchkit("record", "--patch", "quantprobe", "--from", str(original), "--to", str(edited),
                       "--patches", str(folder), "--json")
    assert out.code == 0, out.output[-2000:]
    assert (folder / "quantprobe" / "patch.toml").read_bytes() == before
    # --json is the command's own RecordingRecord, every field it declares there (a renamed one fails here)
    assert declared_but_absent(RecordingRecord, json.loads(out.stdout)) == []
    recorded = decode(out.stdout.encode(), RecordingRecord, "patchkit record --json")
    assert (recorded.patch, recorded.written, recorded.proven) == ("quantprobe", False, True)
    assert [(e.action, e.file, e.text_file) for e in recorded.edits] == [
        (Action.INSERT_BEFORE, "model_executor/layers/quantization/base_config.py", "base_config.py.txt"),
        (Action.INSERT_AFTER, "model_executor/layers/quantization/base_config.py", None)]
    out = run_patchkit("record", "--patch", "quantprobe", "--from", str(original), "--to", str(edited),
                       "--patches", str(folder), "--write")
    assert out.code == 0, out.output[-2000:]
    said = " ".join(out.stdout.split())  # the console wraps long lines
    assert said.startswith("insert_before on vllm/model_executor/layers/quantization/base_config.py: anchor 1 line(s), "
                           "text 66 line(s) in base_config.py.txt insert_after on ") and "2 edit(s);" in said
    recorded = load_patchset(folder).patch("quantprobe")
    assert dataclasses.astuple(recorded)[0] == "quantprobe"
    plan = planner.plan([recorded], DirectorySource(original))
    assert plan.ok and {c.path for c in plan.changes} == {"model_executor/layers/quantization/base_config.py"}


def test_an_edit_header_not_alone_on_its_line_is_refused_not_paired_with_the_next_tables_text():
    """TOML reads `[[ edit ]]  # note` as an [[edit]] table; patchkit's rewriters split patch.toml on lines
    that are exactly `[[edit]]`, so such a header would merge two tables' chunks (hand-written text)."""
    text = '[packages]\nvllm = ">=0.30"\n\n[[edit]]\nfile = "a.py"\n\n[[ edit ]]  # the second\nfile = "b.py"\n'
    assert len(tomllib.loads(text)["edit"]) == 2
    with pytest.raises(InvalidPatchFile) as err:
        split_edits(text, "patch.toml", 2)
    assert err.value.problem == "edit-header" and err.value.path == "patch.toml"
    _, chunks = split_edits(text.replace("[[ edit ]]  # the second", "[[edit]]"), "patch.toml", 2)
    assert [chunk.splitlines()[1] for chunk in chunks] == ['file = "a.py"', 'file = "b.py"']


def test_a_recorded_edit_has_an_edits_fields_with_an_edits_types():
    """RecordedEdit stays apart from Edit (its docstring says why) by exactly these fields; a field renamed,
    added or retyped in one of them and not the other fails here, not in a rebase's read-back."""
    edit, recorded = typing.get_type_hints(Edit), typing.get_type_hints(RecordedEdit)
    assert set(edit) - set(recorded) == {"index"}  # known once patch.toml is read back
    assert set(recorded) - set(edit) == {"text_file"}  # where a long text is written
    differ = {name for name in set(edit) & set(recorded) if edit[name] != recorded[name]}
    assert differ == {"versions"}  # the range as written, not as SpecifierSet prints it


def test_read_back_compares_every_field_the_two_share():
    """RecordedEdit.reads_back_as (the rebase's read-back) names every field of either model: a field added
    to Edit or RecordedEdit and not compared fails here."""
    edit, recorded = set(typing.get_type_hints(Edit)), set(typing.get_type_hints(RecordedEdit))
    assert set(READ_BACK) == edit & recorded and set(NOT_READ_BACK) == edit ^ recorded
    assert [name for c in CHANGED for name in c] == list(READ_BACK)  # and each is tested below


CHANGED = [{"package": "flashinfer"}, {"action": Action.INSERT_BEFORE}, {"anchor": "x = 2\n"}, {"text": "y = 3\n"},
           {"count": 2}, {"candidates": ("models/other.py",)}, {"versions": ">=0.34"}]  # READ_BACK's order


@pytest.mark.parametrize("changed", CHANGED)
def test_a_written_edit_reads_back_as_itself_and_not_as_another(tmp_path, changed):
    written = RecordedEdit("vllm", ("models/a.py", "models/b.py"), Action.INSERT_AFTER, "x = 1\n", "y = 2\n",
                           versions="<0.34,>=0.31")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "patch.toml").write_text(patch_toml("p", []) + "\n" + edit_block(written))
    [loaded] = load_patch(tmp_path / "p" / "patch.toml").edits
    assert written.reads_back_as(loaded)
    assert dataclasses.replace(written, candidates=("models/b.py",), versions=None).reads_back_as(loaded)  # a subset; unset
    assert not dataclasses.replace(written, **changed).reads_back_as(loaded)
