"""pool-topk-init: pool_topk entries the top-k kernel does not write read as -1, at both sites.

One probe per tree runs vLLM's real `sparse_attn_indexer_kpool` (0.31.0 on: models/glm5next/nvidia/
sparse_indexer.py; 0.30.0, the default base's layout: model_executor/layers/sparse_attn_indexer_kpool.py) on CPU through its decode path and its prefill path, with real indexer metadata and forward context,
and vLLM's real Triton expansion kernels (`expand_pools_and_append_tail`, `expand_pools_to_tokens`)
executed by Triton's CPU interpreter. Stand-ins, GPU-only: the DeepGEMM MQA-logits kernels, and the
top-k kernels (0.31.0 on: what `get_indexer_topk` returns; 0.30.0: vLLM's `_C.top_k_per_row_*` ops,
which its kpool indexer calls itself), replaced by kernels that write row 0 and nothing else -- the rows a top-k kernel leaves
unwritten (a kernel that fails on the device, as persistent_topk on SM12x). PyTorch's deterministic
mode fills uninitialised integer memory with INT32_MAX, so what `torch.empty` hands back is visible
instead of whatever the allocator last held.
"""

from __future__ import annotations

import pytest

from probes import probe_fixtures

pytestmark = pytest.mark.vllm

# Triton's interpreter needs vLLM to keep Triton enabled without a GPU driver: an empty
# CUDA_VISIBLE_DEVICES is vLLM's "driver not up yet" case, which leaves Triton on.
ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
KPOOL, TOPK, ROWS = 4, 16, 3
INT32_MAX = 2**31 - 1

PROBE = r'''
import json
import torch
torch.use_deterministic_algorithms(True)  # uninitialised ints read INT32_MAX

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
import importlib, inspect
import vllm.models.glm5next  # first: on 0.30.0 the kpool module imported alone is a circular import
import vllm.utils.deep_gemm as deep_gemm
si = importlib.import_module("KPOOL_INDEXER")
from vllm.v1.attention.backends.mla.indexer import (
    DeepseekV32IndexerMetadata, DeepseekV32IndexerPrefillChunkMetadata, DeepseekV32IndexerPrefillMetadata,
    DeepSeekV32IndexerDecodeMetadata)
from vllm.v1.worker.workspace import init_workspace_manager

KPOOL, TOPK, ROWS, HEAD, SEQ = 4, 16, 3, 128, 30   # 7 full pools + a 2-token tail per row
i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
init_workspace_manager(torch.device("cpu"))

def first_row_only(indices, select_k):
    indices[:1] = torch.arange(select_k, dtype=torch.int32)

class DecodeTopk:  # what get_indexer_topk(...) returns, called as the decode path calls it
    def __call__(self, logits, seq_lens, next_n, topk_dst, select_k, max_seq_len):
        first_row_only(topk_dst, select_k)

library = torch.library.Library("_C", "DEF")  # vLLM's CUDA op name, a CPU body
library.define("top_k_per_row_prefill(Tensor logits, Tensor row_starts, Tensor row_ends, Tensor(a!) indices, "
               "int num_rows, int stride0, int stride1, int topk) -> ()")
library.impl("top_k_per_row_prefill", lambda logits, s, e, indices, n, s0, s1, k: first_row_only(indices, k), "CPU")
# 0.30.0's decode path calls this op itself (off CUDA); from 0.31.0 it goes through get_indexer_topk
library.define("top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor(a!) indices, "
               "int num_rows, int stride0, int stride1, int topk) -> ()")
library.impl("top_k_per_row_decode", lambda logits, n, lens, indices, r, s0, s1, k: first_row_only(indices, k), "CPU")
si.get_indexer_topk = lambda backend: DecodeTopk()
paged_logits = lambda q, kv, w, lens, bt, sm, max_model_len, **kw: torch.zeros(
    q[0].shape[0] * q[0].shape[1], max_model_len, dtype=torch.float32)
mqa_logits = lambda q, kv, w, ks, ke, max_seqlen_k=None, **kw: torch.zeros(q[0].shape[0], 8, dtype=torch.float32)
for module in (si, deep_gemm):  # 0.30.0 imports them from deep_gemm inside the function, later releases at the top
    module.fp8_fp4_paged_mqa_logits, module.fp8_fp4_mqa_logits = paged_logits, mqa_logits
# the pool-granular logits width: max_pool_len from 0.31.0, max_model_len in 0.30.0
POOL_LEN = "max_pool_len" if "max_pool_len" in inspect.signature(si.sparse_attn_indexer_kpool).parameters else "max_model_len"

pool_ids = {}
def spy(name):  # records the pool ids each real expansion kernel receives, then runs it
    real = getattr(si.kpool_ops, name)
    def run(ids, *args):
        pool_ids[name] = ids.tolist()
        return real(ids, *args)
    setattr(si.kpool_ops, name, run)
spy("expand_pools_and_append_tail")
spy("expand_pools_to_tokens")

def indexer(meta):
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config), set_forward_context({"layer.k_cache": meta}, config):
        return si.sparse_attn_indexer_kpool(
            hidden_states=torch.zeros(ROWS, 64), k_cache_prefix="layer.k_cache",
            kv_cache=torch.zeros(4, 64, HEAD + 4, dtype=torch.uint8),
            q_quant=torch.zeros(ROWS, 2, HEAD, dtype=torch.float8_e4m3fn), q_scale=None, k=torch.zeros(ROWS, HEAD),
            weights=torch.ones(ROWS, 2), quant_block_size=128, scale_fmt="ue8m0", topk_tokens=TOPK, head_dim=HEAD,
            **{POOL_LEN: 8}, total_seq_lens=ROWS * SEQ, skip_k_cache_insert=True, index_kpool=KPOOL, positions=None,
            topk_indices_buffer=torch.zeros(ROWS, TOPK + KPOOL - 1, dtype=torch.int32)).tolist()

decode = DeepseekV32IndexerMetadata(
    seq_lens=i32(SEQ, SEQ, SEQ), max_seq_len=SEQ, slot_mapping=torch.zeros(ROWS, dtype=torch.int64),
    num_decodes=ROWS, num_decode_tokens=ROWS, num_prefills=0, num_prefill_tokens=0,
    decode=DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.zeros(ROWS, 4, dtype=torch.int32), seq_lens=i32(SEQ, SEQ, SEQ).view(ROWS, 1),
        decode_lens=i32(1, 1, 1), requires_padding=False, schedule_metadata=i32(0)))
chunk_fields = dict(
    block_table=torch.zeros(1, 4, dtype=torch.int32), cu_seqlen_ks=i32(0, 0, 0), cu_seqlen_ke=i32(8, 8, 8),
    cu_seq_lens=i32(0, 32), token_to_seq=i32(0, 0, 0), total_seq_lens=32, max_seqlen_k=8, token_start=0,
    token_end=ROWS, num_reqs=1, skip_kv_gather=True, local_cu_seq_lens=i32(0, 8), local_total_seq_lens=8,
    max_local_total_seq_lens=8)
import dataclasses  # max_seqlen_k exists from 0.31.0 on; 0.30.0's prefill path does not read it
chunk = DeepseekV32IndexerPrefillChunkMetadata(**{f.name: chunk_fields[f.name] for f in
    dataclasses.fields(DeepseekV32IndexerPrefillChunkMetadata) if f.name in chunk_fields})
prefill = DeepseekV32IndexerMetadata(
    seq_lens=i32(32), max_seq_len=32, slot_mapping=torch.zeros(ROWS, dtype=torch.int64), num_decodes=0,
    num_decode_tokens=0, num_prefills=1, num_prefill_tokens=ROWS,
    prefill=DeepseekV32IndexerPrefillMetadata(chunks=[chunk], max_prefill_seq_len=32))
out = {"decode": indexer(decode), "prefill": indexer(prefill), "pool_ids": pool_ids}
print(json.dumps(out))
'''

SELECT_K = TOPK // KPOOL
WRITTEN = list(range(SELECT_K))  # row 0, as the stand-in kernel wrote it
WRITTEN_TOKENS = list(range(TOPK))  # those pools expanded
DECODE_TAIL = [28, 29, -1]  # seq 30: the incomplete pool's two tokens, then padding
PREFILL_TAIL = [-1, -1, -1]  # the prefill expansion appends no tail


stock, patched = probe_fixtures(lambda layout: PROBE.replace("KPOOL_INDEXER", layout.kpool_indexer), ENV)


@pytest.mark.parametrize("site", ["expand_pools_and_append_tail", "expand_pools_to_tokens"])
def test_stock_unwritten_pool_ids_are_uninitialised(stock, site):
    ids = stock["pool_ids"][site]  # decode site feeds the first, prefill site the second
    assert ids[0] == WRITTEN
    assert ids[1:] == [[INT32_MAX] * SELECT_K] * (ROWS - 1)


def test_stock_expands_garbage_into_token_indices(stock):
    # INT32_MAX * kpool wraps to -4..-1 in the int32 kernel: indices that are neither tokens nor -1
    garbage = [-4, -3, -2, -1] * SELECT_K
    assert stock["decode"][1:] == [garbage + DECODE_TAIL] * (ROWS - 1)
    assert stock["prefill"][1:] == [garbage + PREFILL_TAIL] * (ROWS - 1)


@pytest.mark.parametrize("site", ["expand_pools_and_append_tail", "expand_pools_to_tokens"])
def test_patched_unwritten_pool_ids_are_minus_one(patched, site):
    ids = patched["pool_ids"][site]
    assert ids[0] == WRITTEN
    assert ids[1:] == [[-1] * SELECT_K] * (ROWS - 1)


def test_patched_unwritten_rows_select_no_token(patched):
    assert patched["decode"] == [WRITTEN_TOKENS + DECODE_TAIL] + [[-1] * TOPK + DECODE_TAIL] * (ROWS - 1)
    assert patched["prefill"] == [WRITTEN_TOKENS + PREFILL_TAIL] + [[-1] * TOPK + PREFILL_TAIL] * (ROWS - 1)


def test_written_rows_are_the_same(stock, patched):
    assert stock["decode"][0] == patched["decode"][0] and stock["prefill"][0] == patched["prefill"][0]
