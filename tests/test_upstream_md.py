"""UPSTREAM.md is generated from the patches and must match them."""

from pathlib import Path

from patchkit.patching.patchset import load_patchset
from patchkit.upstream.upstream_md import render

REPO = Path(__file__).resolve().parents[1]


def test_upstream_md_is_in_sync_with_the_patches():
    expected = render(load_patchset(REPO / "patches"))
    actual = (REPO / "UPSTREAM.md").read_text()
    assert actual == expected, "UPSTREAM.md is stale: run `patchkit upstream --write`"


def test_every_patch_appears_with_its_provenance():
    patchset = load_patchset(REPO / "patches")
    text = render(patchset)
    for p in patchset.series():
        assert f"## {p.id}" in text and p.origin["license"] in text and p.digest in text
