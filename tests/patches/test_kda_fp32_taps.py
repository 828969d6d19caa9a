"""kda-fp32-taps: the KDA short-conv taps are fp32 parameters and the real loader keeps what it gets.

The probe builds a tiny real GLM-5.3 text model (two KDA layers) through vLLM's initialize_model on CPU
and loads q/k/v_conv1d taps through the model's real load_weights: fp32 taps (the nvidia checkpoint
stores them fp32; values chosen with bits below bf16 precision) must load bit for bit, bf16 taps
(MLX, EXL3, lab exports) must widen exactly. The KDA kernels (Triton/CUDA) do not run on CPU; the
patch's second assert pins the uncast merge of these parameters that feeds them.

Upstream already does this (the patch is assert-only), so stock and patched trees behave the same;
the probe runs on the patched tree. What makes removing the patch fail is the last test: the series
that built the patched tree must carry the patch and its invariants must hold on that tree.
"""

from __future__ import annotations

import pytest

from probes import CPU_SILU_AND_MUL, guard_in_series, plan_on_drifted_upstream

pytestmark = pytest.mark.vllm

PATCH_ID = "kda-fp32-taps"
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}

PROBE = CPU_SILU_AND_MUL + r'''
import json, os, tempfile

import torch

HEADS, HEAD_DIM, KERNEL = 2, 32, 4
PROJ = HEADS * HEAD_DIM
ckpt = tempfile.mkdtemp()
with open(os.path.join(ckpt, "config.json"), "w") as f:
    json.dump({
        "architectures": ["Glm5NextForCausalLM"], "model_type": "glm5_next_text",
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
        "kv_lora_rank": 512, "qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
        "index_topk": 2048, "index_kpool": 4, "index_n_heads": 4, "index_head_dim": 128,
        "num_hidden_layers": 2, "num_nextn_predict_layers": 0, "mla_use_nope": True,
        "vocab_size": 128, "intermediate_size": 128, "layer_types": ["linear_attention"] * 2,
        "mlp_layer_types": ["dense", "dense"], "mhc": False, "pad_token_id": 0,
        "linear_num_heads": HEADS, "linear_head_dim": HEAD_DIM, "linear_conv_kernel_dim": KERNEL,
        "max_position_embeddings": 8192,
    }, f)

from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config

from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.model_loader.utils import initialize_model

mc = ModelConfig(model=ckpt, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096)
vc = VllmConfig(model_config=mc, cache_config=CacheConfig(enable_prefix_caching=False))
gen = torch.Generator().manual_seed(0)
# fp32 taps with low mantissa bits set, so any rounding through bf16 would show.
fp32_taps = {n: torch.randn(PROJ, 1, KERNEL, generator=gen) * (1 + 2**-20) for n in "qkv"}
bf16_taps = {n: torch.randn(PROJ, 1, KERNEL, generator=gen).to(torch.bfloat16) for n in "qkv"}
assert all(not torch.equal(t, t.to(torch.bfloat16).float()) for t in fp32_taps.values())

with set_current_vllm_config(vc):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{tempfile.mktemp()}")
    initialize_model_parallel(1, 1)
    model = initialize_model(vc)
    model.load_weights([(f"model.layers.0.self_attn.{n}_conv1d.weight", t) for n, t in fp32_taps.items()]
                       + [(f"model.layers.1.self_attn.{n}_conv1d.weight", t) for n, t in bf16_taps.items()])
    out = {}
    for layer, taps in ((0, fp32_taps), (1, bf16_taps)):
        attn = model.model.layers[layer].self_attn
        for n, tap in taps.items():
            param = getattr(attn, f"{n}_conv1d").weight
            out[f"{layer}.{n}"] = {
                "dtype": str(param.dtype), "checkpoint_dtype": str(tap.dtype),
                "shape": list(param.shape),
                # fp32: bit-identical; bf16: equal to the exact widening (every bf16 is an fp32).
                "exact": torch.equal(param.detach(), tap.float()),
            }
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def taps(patched_vllm):
    return patched_vllm.run(PROBE, env=ENV)


def test_fp32_taps_load_bit_exact(taps):
    for name in ("0.q", "0.k", "0.v"):
        assert taps[name] == {"dtype": "torch.float32", "checkpoint_dtype": "torch.float32",
                              "shape": [64, 1, 4], "exact": True}, name


def test_bf16_taps_widen_exactly(taps):
    for name in ("1.q", "1.k", "1.v"):
        assert taps[name] == {"dtype": "torch.float32", "checkpoint_dtype": "torch.bfloat16",
                              "shape": [64, 1, 4], "exact": True}, name


def test_series_guards_the_taps(patched_vllm):
    guard_in_series(PATCH_ID, patched_vllm.root)


@pytest.mark.vllm
def test_an_upstream_downcast_of_the_taps_fails_loudly(tmp_path):
    result = plan_on_drifted_upstream(PATCH_ID, "params_dtype=torch.float32", "params_dtype=torch.bfloat16", tmp_path)
    assert result.state == "broken"
    broken = [e for e in result.edits if e.state == "broken"]
    assert broken and broken[0].nearest is not None and broken[0].nearest.similarity > 0.9
