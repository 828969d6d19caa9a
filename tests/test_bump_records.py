"""The records `patchkit bump body` reads are the producers' own types, declared once beside the code that
writes them (upstream/bump_records.SCHEMAS): each producer's real code writes a record here (rebase's
`payload`, the kernel census's and the tracked state's `to_dict`, retire's `RetireRecord`, a failed
command's error), and the bump reader must decode it with every field it declares present. A field a
producer renames, or a state it renames, fails here, even where the reader gives it a default for a
record from before the field existed; a record that lacks a field is refused, the field named.

The producers' objects are built from real patches (patches/) and a real plan of a tiny tree on disk;
the full records of a real run on vLLM 0.34.0 are checked the same way by tests/test_bump_workflow.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from builders import write_package, write_patchset
from patchkit.census.kernels import NEEDS, Census, CensusRecord, Row
from patchkit.jsondata import MalformedJson, decode
from patchkit.patching import planner
from patchkit.patching.patchset import load_patchset
from patchkit.patching.plan_record import PlanRecord, plan_record
from patchkit.patching.rebase import (
    Evidence,
    NeedsPerson,
    PatchRebase,
    Proposal,
    ProposalKind,
    Rebase,
    RebaseRecord,
    RebaseState,
    payload,
)
from patchkit.patching.rebase import (
    TestRun as BehaviourTestRun,
)
from patchkit.patching.record import RecordedEdit
from patchkit.sources.directory import DirectorySource
from patchkit.upstream import bump, bump_records
from patchkit.upstream.bump_records import SCHEMAS, BumpRun, load_run
from patchkit.upstream.retire import Evidence as Found
from patchkit.upstream.retire import Kind, Retirement, RetireRecord, Verdict
from patchkit.upstream.run_record import RunRecord
from patchkit.upstream.upstream_state import CloseReason, TrackedState, UpstreamRecord, UpstreamState
from patchkit.verify.matrix_record import MatrixRecord
from record_fields import declared_but_absent

REPO = Path(__file__).resolve().parents[1]


def strict(schema: type, record: dict):
    """The record as bump reads it, every declared field there."""
    data = json.dumps(record).encode()
    decoded = decode(data, schema, "the record")
    assert declared_but_absent(schema, json.loads(data)) == []
    return decoded


@pytest.fixture(scope="module")
def real_patches():
    return {p.id: p for p in load_patchset(REPO / "patches").series()}


def a_rebase(real_patches, tmp_path) -> tuple[Rebase, planner.Plan]:
    """A rebase holding one patch in each state that carries data (proposals, an edit for a person, a
    test run, a failure), and the plan of a tiny tree (the planner's own result objects)."""
    shim, think, topk = real_patches["naming-shim"], real_patches["glm53-always-think"], real_patches["pool-topk-init"]
    edit = shim.edits[0]
    new = RecordedEdit(edit.package, ("models/glm5next/common/model.py",), edit.action, "anchor\n", "text\n",
                       versions=">=0.34")
    proposal = Proposal(edit, ProposalKind.RE_ANCHORED, new, "<0.34", Evidence(edit.candidates[0], new.candidates[0], 0.93,
                                                                    "old", "new", [12, 13], "aligned 93% similar"))
    results = [
        PatchRebase(shim, RebaseState.UNTESTED, proposals=[proposal], new_range=("vllm", "<0.34", "<0.35"),
                    written=True, tests=BehaviourTestRun(shim.id, "tests/patches/test_naming_shim.py", 0, "6 passed")),
        PatchRebase(topk, RebaseState.NEEDS_PERSON, people=[NeedsPerson(topk.edits[0], "a merge conflict",
                                                                         ["sparse_indexer.py line 389: ..."])],
                    new_range=("vllm", "<0.34", "<0.35")),
        PatchRebase(think, RebaseState.UPSTREAMED, detail="its probe fires"),
        PatchRebase(real_patches["quantprobe"], RebaseState.DOES_NOT_APPLY, failure="edit 2: broken"),
    ]
    rebase = Rebase("vllm 0.33.0", "vllm 0.34.0", {"vllm": "0.34.0"}, results, tests_note="--no-tests")
    tree = write_package(tmp_path / "tree", {"a.py": "x = 1\n"}, version="0.34.0")
    tiny = load_patchset(write_patchset(tmp_path / "p", {"tiny": [
        {"file": "a.py", "action": "insert_after", "anchor": "x = 1\n", "text": "y = 2\n"}]}))
    return rebase, planner.plan(tiny.series(), DirectorySource(tree))


def test_the_rebase_record_is_the_type_the_body_reads(real_patches, tmp_path):
    rebase, plan = a_rebase(real_patches, tmp_path)
    run = strict(RebaseRecord, payload(rebase, plan, write=True))
    assert [p.state for p in run.patches] == [r.state for r in rebase.results]  # the producer's enum itself
    assert run.check == {"tiny": planner.State.NOT_APPLIED} and run.exit_code == rebase.exit_code
    assert run.patches[1].needs_person[0].candidates == ["sparse_indexer.py line 389: ..."]
    assert run.not_written == {"pool-topk-init": "edit 1 needs a person",
                               "quantprobe": "its rebased form does not apply on the new release"}


def test_a_state_the_producer_does_not_have_is_refused():
    record = {"ok": True, "to": "x", "versions": {}, "patches": [{"patch": "a", "state": "rebased-ish", "detail": "",
              "range": None, "proposals": [], "needs_person": []}], "check": {}, "tests": [], "tests_note": "",
              "written": False, "from": "y"}
    with pytest.raises(MalformedJson, match="rebased-ish"):
        decode(json.dumps(record).encode(), RebaseRecord, "r")


def test_the_retire_record_is_retires_own_struct():
    verdict = Verdict("a", Retirement.CHECK_BY_HAND, [Found(Kind.RANGE, "outside"), Found(Kind.ANCHORS, "gone", "f.py")],
                      in_range=False)
    record = RetireRecord("0.34.0", "/results", [verdict])
    assert strict(RetireRecord, record.to_dict()) == record


def test_the_census_record_is_the_type_the_body_reads():
    census = Census("vllm-0.34.0.whl", [Row(need, {"sm_120f": 2}, {"sm_120f": 2}) for need in NEEDS], {})
    run = strict(CensusRecord, census.to_dict())
    assert [k.need for k in run.kernels] == [n.name for n in NEEDS] and run.runtime_compiled


def test_the_tracked_state_record_is_the_type_the_body_reads(real_patches):
    """What `patchkit upstream --json` writes reads back as the same state, with the same words in the bump
    body as in the command's table: a state, a GitHub reason, and a reason GitHub added since (kept as text)."""
    patch = next(p for p in real_patches.values() if p.tracked)

    def tracked(state: UpstreamState, reason: CloseReason | str | None, released: str | None = None) -> TrackedState:
        return TrackedState(patch.id, patch.tracked[0], state, reason, "a title", "https://example.invalid/1", None,
                            None, released, "milestone" if released else "", "hand-written")

    states = [tracked(UpstreamState.MERGED, None, "0.34.0"), tracked(UpstreamState.CLOSED, CloseReason.NOT_PLANNED),
              tracked(UpstreamState.CLOSED, "spam_filtered"), tracked(UpstreamState.OPEN, CloseReason.REOPENED)]
    run = strict(UpstreamRecord, UpstreamRecord.of(states).to_dict())
    assert run.tracked[0].released_in == "0.34.0"
    assert [(t.state, t.close_reason) for t in run.tracked] == [(s.state, s.reason) for s in states]
    assert all(isinstance(t.state, UpstreamState) for t in run.tracked)  # the producer's enum itself
    words = [t.words for t in run.tracked]
    assert words == [s.words for s in states] == ["merged", "closed (not planned)", "closed (spam filtered)", "open"]
    text = bump.body(BumpRun("0.34.0", upstream=run))
    assert all(f"| {w} |" in text for w in words), text


def test_a_tracked_state_the_producer_does_not_have_is_refused(real_patches):
    patch = next(p for p in real_patches.values() if p.tracked)
    record = UpstreamRecord.of([TrackedState(patch.id, patch.tracked[0], UpstreamState.CLOSED, CloseReason.COMPLETED,
                                             "t", "u", None, None, None, "", "s")]).to_dict()
    record["tracked"][0]["state"] = "closed (completed)"  # the words, as a record before the reason was apart
    with pytest.raises(MalformedJson, match="closed \\(completed\\)"):
        decode(json.dumps(record).encode(), UpstreamRecord, "r")


def test_the_planners_account_is_one_type_for_check_the_matrix_and_the_body(tmp_path):
    """`patchkit check --json` and the matrix's cells write the planner's account of each edit through
    plan_record's types, and the matrices recorded in tests/data/bump read back through the same ones with
    every field there: a field renamed in that account fails here (the recorded matrices keep the old name)."""
    tree = write_package(tmp_path / "tree", {"a.py": "def f(x, y):\n    return x\n"}, version="0.34.0")
    drifted = load_patchset(write_patchset(tmp_path / "p", {"drifted": [
        {"file": "a.py", "action": "insert_after", "anchor": "def f(x):\n", "text": "    pass\n"}]}))
    run = strict(PlanRecord, plan_record(planner.plan(drifted.series(), DirectorySource(tree))).to_dict())
    edit = run.patches[0].edits[0]
    assert (run.patches[0].state, edit.state, edit.path) == (planner.State.BROKEN, planner.EditState.BROKEN, "a.py")
    assert edit.nearest is not None and edit.nearest.line == 1 and "+def f(x, y):" in edit.nearest.diff
    recorded = sorted((REPO / "tests" / "data" / "bump").glob("run-*/verify.json"))  # run/ predates the companion
    assert recorded
    for path in recorded:
        matrix = strict(MatrixRecord, json.loads(path.read_text()))
        accounts = [e for p in matrix.patches for c in p.cells.values() for e in c.edits + (c.would.edits if c.would else [])]
        assert any(e.nearest for e in accounts), path  # a drifted anchor's nearest match, typed too


def test_a_renamed_field_is_found_even_where_the_reader_defaults_it(real_patches, tmp_path):
    rebase, plan = a_rebase(real_patches, tmp_path)
    record = payload(rebase, plan, write=True)
    record["patches_written"] = record.pop("written_patches")  # the reader defaults it to []
    msgspec.json.decode(json.dumps(record), type=RebaseRecord)  # still decodes ...
    assert declared_but_absent(RebaseRecord, record) == ["$.written_patches"]  # ... and is caught


def test_the_reader_reads_each_record_through_its_producers_own_type():
    """One declaration per record: the reader holds no copy of a producer's struct, nor does the
    what-ran-where merge of the test runs' records (the plugin writes RunRecord itself)."""
    import ran_where

    assert ran_where.RunRecord is RunRecord
    producers = {"rebase": RebaseRecord, "retire": RetireRecord, "verify": MatrixRecord, "kernels": CensusRecord,
                 "upstream": UpstreamRecord, "tests": RunRecord, "necessity": RunRecord}
    assert producers == SCHEMAS
    assert not [name for name, value in vars(bump_records).items()
                if isinstance(value, type) and issubclass(value, msgspec.Struct) and value.__module__ == bump_records.__name__]


def test_a_record_the_writer_wrote_is_read_by_the_bump_reader(real_patches, tmp_path):
    rebase, plan = a_rebase(real_patches, tmp_path)
    written = tmp_path / "rebase.json"
    written.write_text(json.dumps(payload(rebase, plan, write=True), indent=2, sort_keys=True))  # as `emit` writes it
    census = tmp_path / "kernels.json"
    census.write_text(json.dumps(Census("w.whl", [Row(NEEDS[0], {"sm_120f": 1}, {"sm_120f": 1})], {}).to_dict()))
    run = load_run("0.34.0", written, kernels=census)
    assert run.problems == []
    assert run.rebase is not None and [p.state for p in run.rebase.patches] == [r.state for r in rebase.results]
    assert run.rebase.patches[0].proposals[0].kind == ProposalKind.RE_ANCHORED
    assert run.kernels is not None and run.kernels.kernels[0].need == NEEDS[0].name


@pytest.mark.parametrize("drop", ["tests_note", "check", "from"])
def test_a_record_missing_a_field_is_refused_naming_it(real_patches, tmp_path, drop):
    rebase, plan = a_rebase(real_patches, tmp_path)
    record = payload(rebase, plan, write=True)
    del record[drop]
    path = tmp_path / "rebase.json"
    path.write_text(json.dumps(record))
    with pytest.raises(MalformedJson, match=f"missing required field `{drop}`"):
        bump_records.read(path, RebaseRecord, "the rebase record")
    run = load_run("0.34.0", path)  # the body's reader: a line that names the field, not an exit
    assert run.rebase is None and len(run.problems) == 1
    assert run.problems[0][0] == "rebase" and f"missing required field `{drop}`" in run.problems[0][1]


def test_a_failed_commands_record_is_the_type_the_reader_reads(tmp_path):
    out = subprocess.run([sys.executable, "-m", "patchkit", "retire", "--release", "not-a-version", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    path = tmp_path / "retire.json"
    path.write_text(out.stdout)
    run = load_run("0.34.0", None, retire=path)
    assert run.retire is None
    assert run.problem("retire") is not None and "the command failed (exit 2, usage)" in run.problem("retire")
