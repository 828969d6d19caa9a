"""What a user copies out of a table, a patch id or an image name, is printed whole at any terminal width:
folded, never cut with "…" (rich ellipsizes a column that may not wrap). The real patches/ and images/
on the supported releases up to the pinned one (the index's sdists through the user cache), rendered as
`patchkit verify` and `patchkit status` print them, at 40, 60 and 80 columns; each column read back
(tests/rendered_tables.py) is the same text as at a width where nothing folds.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from packaging.version import Version
from rich.console import Console
from rich.table import Table

from patchkit import PINNED_VLLM, SUPPORTED_VLLM
from patchkit.images.definitions import every_series
from patchkit.patching.patchset import load_patchset
from rendered_tables import column

REPO = Path(__file__).resolve().parents[1]
RELEASES = tuple(r for r in SUPPORTED_VLLM if Version(r) <= Version(PINNED_VLLM))
WIDTHS = (40, 60, 80)
WIDE = 400  # nothing folds: what each column holds


def printed(renderable, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def headings(table: Table) -> list[str]:
    return [str(c.header) for c in table.columns]


@pytest.fixture(scope="module")
def matrix():
    from patchkit.verify.matrix import compute
    from patchkit.verify.targets import index_targets, parse_versions

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PATCHKIT_INDEX_URL", raising=False)  # the real index, through the user cache
        patchset = load_patchset(REPO / "patches")
        return compute(patchset, index_targets(parse_versions(",".join(RELEASES))),
                       image_series=every_series(REPO / "images", patchset))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_verify_matrix_prints_every_patch_id_and_image_name_whole(matrix, width):
    from patchkit.verify.render import render

    tables = [r for r in render(matrix) if isinstance(r, Table)]
    assert [headings(t)[0] for t in tables] == ["patch", "image"]
    ids, images = [p.id for p in matrix.patches], list(matrix.images)
    assert sorted(ids) == sorted(p.parent.name for p in (REPO / "patches").glob("*/patch.toml"))
    assert sorted(images) == sorted(p.parent.name for p in (REPO / "images").glob("*/image.toml"))
    for table, names in zip(tables, (ids, images), strict=True):
        narrow, wide = printed(table, width), printed(table, WIDE)
        assert "…" not in narrow, narrow
        assert max(len(line) for line in narrow.splitlines()) <= width
        assert column(narrow, headings(table)[0]) == "".join(names), narrow
        for heading in headings(table):  # every cell whole too: a state, a blocker
            assert column(narrow, heading) == column(wide, heading), (heading, narrow)
    everything = "".join(printed(r, width) for r in render(matrix))
    assert "…" not in everything, everything


@pytest.mark.parametrize("width", WIDTHS)
def test_the_plan_table_prints_every_patch_id_whole(width):
    from patchkit.patching import planner
    from patchkit.patching.report import plan_table
    from patchkit.sources import open_source

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PATCHKIT_INDEX_URL", raising=False)
        source = open_source(f"vllm=={PINNED_VLLM}", progress=False)
    patchset = load_patchset(REPO / "patches")
    table = plan_table(planner.plan(patchset.series(), source))
    narrow, wide = printed(table, width), printed(table, WIDE)
    assert "…" not in narrow, narrow
    assert column(narrow, "patch") == "".join(p.id for p in patchset.series()), narrow
    for heading in headings(table):
        assert column(narrow, heading) == column(wide, heading), (heading, narrow)
