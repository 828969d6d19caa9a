"""modelopt-mtp-namespace: the MTP draft's layers resolve against the checkpoint's multimodal entries.

One probe per tree writes lab- and 4p67-shaped checkpoint configs, lets vLLM build its ModelOpt
MIXED_PRECISION config from them, runs `configure_quant_config` in the order vLLM builds the classes
(Glm5NextForConditionalGeneration, Glm5NextForCausalLM, then the draft Glm5NextMTP), and constructs the
real target layer 3 (`language_model.model.layers.3`) and the real MTP block (`model.layers.45`, as
Glm5NextMTP names it). It reports the quant method each routed-expert and shared-expert projection got.
Stand-ins for GPU-only kernel choices: see quant_configs.Glm5NextOnCpu.
"""

from __future__ import annotations

import pytest
from quant_configs import (
    MTP_LAYER,
    lab_quantization_config,
    p4p67_quantization_config,
    probe_prelude,
)

from probes import probe_fixtures

pytestmark = pytest.mark.vllm

ENV = {"HF_HUB_OFFLINE": "1"}

PROBE = probe_prelude() + r'''
import json, tempfile
from quant_configs import *

def experts(layer):
    return describe_quant(layer)["mlp.experts.routed_experts"]

def summary(entry):
    return [entry["method"], entry.get("algo")]

env = Glm5NextOnCpu(tempfile.mkdtemp())
out = {}
for name, config in (("lab", lab_quantization_config()), ("4p67", p4p67_quantization_config())):
    env.checkpoint(config)
    env.target()
    target = env.target_layer(3)
    draft = env.mtp_layer()
    out[name] = {
        "target_experts": summary(experts(target)),
        "mtp_experts": summary(experts(draft)),
        "mtp_shared_down": describe_quant(draft)["mlp.shared_experts.down_proj"],
        # the draft's names under both checkpoint spellings: mapped (shared config) and as stored
        "resolve": {p: env.quant_config._resolve_quant_algo(p) for p in (
            "model.layers.45.mlp.experts", "model.layers.45.self_attn.q_b_proj")},
    }

# Exact entries win: a text-only spelling of the draft next to a different multimodal one.
both = lab_quantization_config()
both["quantized_layers"]["model.layers.45.mlp.experts"] = {"quant_algo": "NVFP4", "group_size": 16}
env.checkpoint(both)
env.target()
out["exact_first"] = summary(experts(env.mtp_layer()))
print(json.dumps(out))
'''


stock, patched = probe_fixtures(PROBE, ENV)


def test_configs_list_the_mtp_experts_in_the_multimodal_spelling():
    # what makes the bug: the checkpoints speak of layer 45 only as model.language_model.layers.45
    for config, algo in ((lab_quantization_config(), "MXFP8"), (p4p67_quantization_config(), "W4A16_NVFP4")):
        entry = config["quantized_layers"][f"model.language_model.layers.{MTP_LAYER}.mlp.experts"]
        assert entry["quant_algo"] == algo
        assert not any(key.startswith("model.layers.") for key in config["quantized_layers"])


def test_stock_mtp_routed_experts_get_no_quant_method(stock):
    # the [quantprobe] algo=None broken-load signature: BF16 experts built for an MXFP8/NVFP4 checkpoint
    assert stock["lab"]["mtp_experts"] == ["UnquantizedFusedMoEMethod", None]
    assert stock["4p67"]["mtp_experts"] == ["UnquantizedFusedMoEMethod", None]
    assert stock["4p67"]["mtp_shared_down"]["method"] == "UnquantizedLinearMethod"
    assert stock["lab"]["resolve"]["model.layers.45.mlp.experts"] is None


def test_patched_mtp_routed_experts_get_the_checkpoint_algorithm(patched):
    assert patched["lab"]["mtp_experts"] == ["ModelOptMxFp8FusedMoE", "MXFP8"]
    assert patched["lab"]["resolve"]["model.layers.45.mlp.experts"] == "MXFP8"
    assert patched["4p67"]["mtp_experts"] == ["ModelOptNvFp4FusedMoE", "W4A16_NVFP4"]
    assert patched["4p67"]["resolve"] == {
        "model.layers.45.mlp.experts": "W4A16_NVFP4",
        "model.layers.45.self_attn.q_b_proj": "MXFP8",
    }


def test_patched_mtp_shared_expert_is_mxfp8_in_4p67(patched):
    shared = patched["4p67"]["mtp_shared_down"]
    assert shared["method"] == "ModelOptLinearMethod"
    assert shared["params"] == {"weight": "float8_e4m3fn", "weight_scale": "uint8"}


def test_target_layers_are_unchanged(stock, patched):
    for name, algo in (("lab", "NVFP4"), ("4p67", "W4A16_NVFP4")):
        assert stock[name]["target_experts"] == patched[name]["target_experts"] == ["ModelOptNvFp4FusedMoE", algo]


def test_an_exact_draft_entry_wins_over_the_multimodal_one(stock, patched):
    assert stock["exact_first"] == patched["exact_first"] == ["ModelOptNvFp4FusedMoE", "NVFP4"]
