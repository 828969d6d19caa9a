"""Per-module probe fixtures for the patch behaviour tests (the trees come from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def probe_fixtures(code: str, env: dict[str, str] | None = None):
    """Module-scoped `stock` and `patched` fixtures: `code` run once in each tree, its JSON result.

    Usage in a patch's test module: `stock, patched = probe_fixtures(PROBE, ENV)`.
    """

    @pytest.fixture(scope="module")
    def stock(stock_vllm):
        return stock_vllm.run(code, env=env)

    @pytest.fixture(scope="module")
    def patched(patched_vllm):
        return patched_vllm.run(code, env=env)

    return stock, patched


# -- assert-only patches: upstream has no bug to show, so prove the guard itself ---------------------------


def guard_in_series(patch_id: str, tree_root):
    """The assert patch is in the series that built the patched tree (honouring PATCHKIT_TEST_EXCLUDE, as
    tests/conftest.py does) and every invariant holds there."""
    import os

    from patchkit.patching import planner
    from patchkit.patching.patchset import load_patchset
    from patchkit.sources.directory import DirectorySource

    excluded = {i for i in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",") if i}
    patchset = load_patchset(REPO / "patches")
    assert patch_id in [p.id for p in patchset.series() if p.id not in excluded], f"{patch_id} left out of the series"
    result = planner.plan([patchset.patch(patch_id)], DirectorySource(tree_root)).result(patch_id)
    assert result.state == planner.State.APPLIED, result.describe()
    assert {e.state for e in result.edits} == {"holds"}


def plan_on_drifted_upstream(patch_id: str, old: str, new: str, tmp_path):
    """The patch planned on the installed vLLM's target files in which upstream changed `old` into `new`."""
    from importlib.metadata import version

    from builders import write_package

    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.patching.patchset import load_patchset
    from patchkit.sources.directory import DirectorySource

    patch = load_patchset(REPO / "patches").patch(patch_id)
    installed = installed_package("vllm")
    files = {c: (installed / c).read_text() for e in patch.edits for c in e.candidates if (installed / c).exists()}
    assert any(old in text for text in files.values()), f"{old!r} is not in the installed vLLM"
    root = write_package(tmp_path / "site", {k: v.replace(old, new) for k, v in files.items()}, version=version("vllm"))
    return planner.plan([patch], DirectorySource(root)).result(patch_id)
