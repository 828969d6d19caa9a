"""mtp-ignore: the --hf-overrides value patchkit derives for nvidia/GLM-5.3-Flash-NVFP4's BF16 MTP layer.

Not a vLLM patch (see src/patchkit/mtp_ignore.py for why), so both halves run on stock vLLM: one probe
writes an nvidia-shaped checkpoint config (plain ModelOpt NVFP4, an ignore list without layer 45) and
lets vLLM build everything from it the way `vllm serve` does -- ModelConfig with the override applied
by vLLM's own `--hf-overrides` handling, the quant config, `configure_quant_config` for the target and
the draft -- then builds the real MTP block and target layer 3 and loads a BF16 expert (the shape the
checkpoint stores) through the MTP experts' real weight loader. Without the override: NVFP4 experts
and a failed load; with it: BF16 experts that load. The target keeps NVFP4 either way.
Stand-ins for GPU-only kernel choices: see quant_configs.Glm5NextOnCpu.
"""

from __future__ import annotations

import pytest
from quant_configs import (
    MTP_LAYER,
    NUM_HIDDEN_LAYERS,
    as_literal,
    nvidia_quantization_config,
    probe_prelude,
)

from patchkit.checkpoint.mtp_ignore import MtpIgnoreRefused, hf_overrides

ENV = {"HF_HUB_OFFLINE": "1"}
SPELLINGS_45 = [
    "model.layers.45.*",
    "model.language_model.layers.45.*",
    "language_model.model.layers.45.*",
    "model.layers.45.mtp_block.*",
]


def nvidia_config_json() -> dict:
    """The parts of nvidia/GLM-5.3-Flash-NVFP4's config.json the derivation reads."""
    return {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "text_config": {"num_hidden_layers": NUM_HIDDEN_LAYERS, "num_nextn_predict_layers": 1},
        "quantization_config": nvidia_quantization_config(),
    }


# ---------------------------------------------------------------- the derivation (no vLLM)


def test_exact_entries_appended_after_the_checkpoints_own():
    config = nvidia_config_json()
    quant = hf_overrides(config)["quantization_config"]
    own = nvidia_quantization_config()
    assert quant["ignore"] == own["ignore"] + SPELLINGS_45
    assert {k: v for k, v in quant.items() if k != "ignore"} == {k: v for k, v in own.items() if k != "ignore"}
    assert config == nvidia_config_json()  # the verified input is not modified


def test_not_applied_when_the_checkpoint_lists_its_mtp_layer():
    config = nvidia_config_json()
    config["quantization_config"]["ignore"] += SPELLINGS_45
    assert hf_overrides(config) is None


def _without(path: str):
    config = nvidia_config_json()
    *parents, key = path.split(".")
    target = config
    for p in parents:
        target = target[p]
    del target[key]
    return config


def _with(path: str, value):
    config = nvidia_config_json()
    *parents, key = path.split(".")
    target = config
    for p in parents:
        target = target[p]
    target[key] = value
    return config


@pytest.mark.parametrize(
    ("config", "field", "expected"),
    [
        ([], "top level", "an object"),
        (_with("quantization_config", "modelopt"), "quantization_config", "an object"),
        (_with("quantization_config.ignore", "lm_head"), "quantization_config.ignore", "a list of strings"),
        (_with("text_config.num_hidden_layers", "45"), "text_config.num_hidden_layers", "a non-negative integer"),
        (_without("quantization_config"), "quantization_config", "a table to exclude the MTP predictor from"),
        (_with("text_config.num_nextn_predict_layers", 0), "num_nextn_predict_layers",
         "1 or more MTP predictor layers to exclude"),
        (_without("text_config.num_nextn_predict_layers"), "num_nextn_predict_layers",
         "1 or more MTP predictor layers to exclude"),
    ],
    ids=["not-an-object", "quant-config-not-object", "ignore-not-list", "layer-count-not-int",
         "no-quantization-config", "zero-predictor-layers", "no-predictor-count"],
)
def test_fails_closed(config, field, expected):
    with pytest.raises(MtpIgnoreRefused) as info:
        hf_overrides(config)
    assert (info.value.field, info.value.expected) == (field, expected)


# ---------------------------------------------------------------- through real vLLM

PROBE = probe_prelude() + r'''
import json, tempfile
import torch
from quant_configs import *

def experts(layer):
    return layer.mlp.experts.routed_experts

def load_bf16_expert(layer):
    """One BF16 gate_proj of expert 0, as the checkpoint stores it, through the real expert loader."""
    routed = experts(layer)
    weight = torch.randn(routed.intermediate_size_per_partition, routed.hidden_size).bfloat16()
    param = routed.w13_weight
    try:
        ok = param.weight_loader(param, weight, "w13_weight", shard_id="w1", expert_id=0, return_success=True)
        return "ok" if ok and torch.equal(param.data[0, : weight.shape[0]], weight) else f"not loaded: {ok}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"

env = Glm5NextOnCpu(tempfile.mkdtemp())
out = {}
hf_spelling_only = nvidia_quantization_config()
hf_spelling_only["ignore"].append("model.language_model.layers.45*")
for case, quant, overrides in (("without", nvidia_quantization_config(), None),
                               ("with", nvidia_quantization_config(), OVERRIDES),
                               ("hf_spelling_only", hf_spelling_only, None)):
    env.checkpoint(quant, hf_overrides=overrides)
    env.target()
    target = env.target_layer(3)
    draft = env.mtp_layer()
    out[case] = {
        "quant_config": type(env.quant_config).__name__,
        "mtp_experts": [type(experts(draft).quant_method).__name__, str(experts(draft).w13_weight.dtype)],
        "mtp_load": load_bf16_expert(draft),
        "mtp_shared_head_excluded": env.quant_config.is_layer_excluded("model.layers.45.shared_head.head"),
        "target_experts": type(experts(target).quant_method).__name__,
    }
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def vllm_result(stock_vllm):
    overrides = hf_overrides(nvidia_config_json())
    return stock_vllm.run(PROBE.replace("OVERRIDES", as_literal(overrides)), env=ENV)


@pytest.mark.vllm
def test_without_the_override_the_bf16_mtp_layer_is_built_nvfp4(vllm_result):
    case = vllm_result["without"]
    assert case["quant_config"] == "ModelOptNvFp4Config"
    assert case["mtp_experts"] == ["ModelOptNvFp4FusedMoE", "torch.uint8"]
    # packed NVFP4 holds two codes per byte: half the width of the BF16 tensor the checkpoint stores
    # (the tiny hidden size 256 here; "512 vs 1024" in the field reports)
    assert case["mtp_load"] == (
        "RuntimeError: The size of tensor a (128) must match the size of tensor b (256) at non-singleton dimension 1"
    )
    assert case["mtp_shared_head_excluded"] is False


@pytest.mark.vllm
def test_with_the_override_the_mtp_layer_is_bf16_and_loads(vllm_result):
    case = vllm_result["with"]
    assert case["quant_config"] == "ModelOptNvFp4Config"
    assert case["mtp_experts"] == ["UnquantizedFusedMoEMethod", "torch.bfloat16"]
    assert case["mtp_load"] == "ok"
    assert case["mtp_shared_head_excluded"] is True


@pytest.mark.vllm
def test_the_override_leaves_the_target_nvfp4(vllm_result):
    assert vllm_result["without"]["target_experts"] == vllm_result["with"]["target_experts"] == "ModelOptNvFp4FusedMoE"


@pytest.mark.vllm
def test_the_checkpoint_spelling_alone_does_not_reach_the_draft(vllm_result):
    # why the override carries the draft's own spellings: an ignore entry in the checkpoint's
    # model.language_model.layers.45 spelling still leaves the draft's model.layers.45 experts NVFP4
    assert vllm_result["hf_spelling_only"]["mtp_experts"] == ["ModelOptNvFp4FusedMoE", "torch.uint8"]
    config = nvidia_config_json()
    config["quantization_config"]["ignore"].append(f"model.language_model.layers.{MTP_LAYER}*")
    added = hf_overrides(config)["quantization_config"]["ignore"][len(config["quantization_config"]["ignore"]):]
    assert added == [s for s in SPELLINGS_45 if s != "model.language_model.layers.45.*"]
