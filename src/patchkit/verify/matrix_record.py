"""The JSON record of the matrix (`patchkit verify --json`), declared once: verify writes it through these
types (render.to_dict) and the bump pull request's body reads it back through the same ones
(upstream/bump_records.py), so a renamed field is renamed for both, and a record written before the rename
stops validating, naming the field.

A cell's state is `states.CellState`, a companion's `sources.companion.How`: a value neither knows is
refused. A cell's edits are the planner's account, typed once for every writer and reader of it
(patching.plan_record.EditResultRecord, as `patchkit check --json` writes them).
The fields with a default are those a record from before they existed lacks (tests/data/bump/run).
"""

from __future__ import annotations

import dataclasses

import msgspec

from patchkit.patching.plan_record import EditResultRecord, patch_result_record
from patchkit.sources.companion import CompanionRecord
from patchkit.verify.matrix import Cell, Matrix
from patchkit.verify.states import CellState


class WouldRecord(msgspec.Struct, kw_only=True):
    state: CellState
    detail: str
    edits: list[EditResultRecord]


class CellRecord(msgspec.Struct, kw_only=True):
    state: CellState
    detail: str
    edits: list[EditResultRecord]
    would: WouldRecord | None  # out of range: what it would do with every range ignored
    companion: str | None = None  # the column's companion finding, on a patch that edits the companion


class ColumnRecord(msgspec.Struct, kw_only=True):
    label: str
    version: str
    source: str
    pinned: bool
    newer: bool
    companion: CompanionRecord | None = None  # a record from before sources.companion has none


class MatrixPatchRecord(msgspec.Struct, kw_only=True):
    id: str
    title: str
    ranges: dict[str, str]
    cells: dict[str, CellRecord]  # column label -> its cell


class BuildRecord(msgspec.Struct, kw_only=True):
    builds: bool
    blockers: list[str]


class ImageRecord(msgspec.Struct, kw_only=True):
    name: str
    series: list[str]
    builds: dict[str, BuildRecord]  # column label -> its verdict


class FindingRecord(msgspec.Struct, kw_only=True):
    patch: str
    column: str
    reason: str


class MatrixRecord(msgspec.Struct, kw_only=True):
    pinned: str
    exit_code: int
    columns: list[ColumnRecord]
    patches: list[MatrixPatchRecord]
    images: list[ImageRecord]
    newest_all_images_build: str | None
    findings: list[FindingRecord]

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


def _cell(cell: Cell) -> CellRecord:
    would = None
    if cell.would is not None and (would_state := cell.would_state) is not None:
        planned = patch_result_record(cell.would)
        would = WouldRecord(state=would_state, detail=planned.detail, edits=planned.edits)
    return CellRecord(state=cell.state, detail=cell.result.detail, edits=patch_result_record(cell.result).edits,
                      would=would, companion=cell.companion)


def matrix_record(matrix: Matrix) -> MatrixRecord:
    """Every cell with the planner's account of its edits, the images, the findings."""
    newest = matrix.newest_for_all
    return MatrixRecord(
        pinned=matrix.pinned, exit_code=matrix.exit_code,
        columns=[ColumnRecord(label=c.label, version=c.version, source=c.source, pinned=c.pinned, newer=c.newer,
                              companion=c.companion.record() if c.companion else None) for c in matrix.columns],
        patches=[MatrixPatchRecord(id=p.id, title=p.title, ranges={k: str(v) for k, v in p.ranges.items()},
                                   cells={c.label: _cell(matrix.cell(p.id, c.label)) for c in matrix.columns})
                 for p in matrix.patches],
        images=[ImageRecord(name=name, series=list(matrix.image_series[name]),
                            builds={c.label: BuildRecord(builds=v.builds, blockers=v.blockers) for c in matrix.columns
                                    for v in [matrix.images[name][c.label]]})
                for name in matrix.images],
        newest_all_images_build=newest.label if newest else None,
        findings=[FindingRecord(**dataclasses.asdict(f)) for f in matrix.findings])
