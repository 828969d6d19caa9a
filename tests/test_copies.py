"""Patched copies are reused only when they are finished copies of the same series of the same original."""

from __future__ import annotations

import pytest

from conftest import REPO, _installed_vllm
from patchkit.patching.copies import STAMP, reuse_or_copy
from patchkit.patching.patchset import load_patchset

pytestmark = pytest.mark.vllm

@pytest.fixture(scope="module")
def series():
    patchset = load_patchset(REPO / "patches")
    return {p.id: p for p in patchset.series()}

def test_a_finished_copy_of_the_same_series_is_reused(tmp_path, series):
    installed = _installed_vllm()
    patches = [series["pool-topk-init"]]
    reuse_or_copy(installed, tmp_path / "site", patches)
    stamp = tmp_path / "site" / STAMP
    before = stamp.stat().st_mtime_ns
    reuse_or_copy(installed, tmp_path / "site", patches)
    assert stamp.stat().st_mtime_ns == before

def test_a_half_made_copy_is_rebuilt_not_trusted(tmp_path, series):
    installed = _installed_vllm()
    site = tmp_path / "site"
    # a copy that died before it was stamped: files present, one of them stale
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('stale copy')\n")
    reuse_or_copy(installed, site, [series["pool-topk-init"]])
    assert (site / "vllm" / "__init__.py").read_bytes() == (installed / "__init__.py").read_bytes()
    assert (site / STAMP).is_file()

def test_a_copy_of_another_series_is_rebuilt(tmp_path, series):
    installed = _installed_vllm()
    site = tmp_path / "site"
    reuse_or_copy(installed, site, [series["pool-topk-init"]])
    first = (site / STAMP).read_text()
    reuse_or_copy(installed, site, [])  # the stock series: nothing patched
    assert (site / STAMP).read_text() != first
    changed = [p for p in (installed).rglob("*.py")
               if (site / "vllm" / p.relative_to(installed)).read_bytes() != p.read_bytes()]
    assert changed == []
