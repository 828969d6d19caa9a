"""Per-module probe fixtures for the patch behaviour tests (the trees come from tests/conftest.py)."""

from __future__ import annotations

import pytest


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
