"""persistent-topk-cc12: the sparse indexer never takes persistent_topk on compute capability 12.x.

One probe per tree runs vLLM's real top-k dispatcher (`get_indexer_topk`, what GLM's kpool indexer
calls with its configured `sparse_indexer_topk_backend`) with the platform reporting a CUDA device of
compute capability 12.1 (GB10), 12.0, 9.0 and 10.0, for GLM-5.3's select_k (index_topk 2048 / index_kpool
4 = 512) at 8 rows (within cooperative_topk's limit) and 128 rows (past it), under "auto" and an
explicit "persistent". Only the capability query and `is_cuda` are stand-ins; resolution is vLLM's.
"""

from __future__ import annotations

import pytest
from probes import probe_fixtures

pytestmark = pytest.mark.vllm

SELECT_K = 2048 // 4
PROBE = r'''
import json
import torch
from vllm.model_executor.layers import indexer_topk
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability

platform = type(current_platform)
platform.is_cuda = lambda self: True
out = {}
for major, minor in ((12, 1), (12, 0), (9, 0), (10, 0)):
    platform.get_device_capability = classmethod(lambda cls, device_id=0, c=(major, minor): DeviceCapability(*c))
    indexer_topk.get_indexer_topk.cache_clear()
    chosen = {}
    for backend in ("auto", "persistent"):
        for rows in (8, 128):
            logits = torch.zeros(rows, 4096, dtype=torch.float32)
            try:
                chosen[f"{backend}/{rows}"] = indexer_topk.get_indexer_topk(backend).resolve_backend(logits, SELECT_K, rows)
            except RuntimeError as e:
                chosen[f"{backend}/{rows}"] = f"refused: {e}"
    out[f"{major}.{minor}"] = chosen
print(json.dumps(out))
'''.replace("SELECT_K", str(SELECT_K))


stock, patched = probe_fixtures(PROBE)


@pytest.mark.parametrize("capability", ["12.1", "12.0"])
def test_stock_takes_persistent_topk_on_sm12x(stock, capability):
    assert stock[capability] == {
        "auto/8": "persistent", "auto/128": "persistent", "persistent/8": "persistent", "persistent/128": "persistent",
    }


@pytest.mark.parametrize("capability", ["12.1", "12.0"])
def test_patched_never_takes_persistent_topk_on_sm12x(patched, capability):
    chosen = patched[capability]
    assert chosen["auto/8"] == chosen["auto/128"] == "per_row"
    for rows in (8, 128):
        assert chosen[f"persistent/{rows}"] == (
            "refused: sparse_indexer_topk_backend='persistent' was requested, but: "
            "is not supported on the SM12x family (patchkit)"
        )


@pytest.mark.parametrize("capability", ["9.0", "10.0"])
def test_sm90_and_sm100_keep_their_kernels(stock, patched, capability):
    expected = {"auto/8": "cooperative", "auto/128": "persistent", "persistent/8": "persistent", "persistent/128": "persistent"}
    assert stock[capability] == patched[capability] == expected
