"""packed-modules-4p67: GLM-5.3's fused projections take the checkpoint's per-layer quantization.

One probe per tree writes a 4p67-shaped checkpoint config (ModelOpt MIXED_PRECISION: MXFP8 attention,
indexer and shared experts, W4A16_NVFP4 routed experts), lets vLLM build its quant config, runs
`configure_quant_config` for the target classes, builds the real target layers 0 (KDA) and 3 (MLA +
sparse indexer + MoE) and the real MTP block, and reports the quant method and parameters of every
projection. Then it feeds 4p67-shaped MXFP8 tensors (e4m3 codes, one E8M0 byte per 32 inputs) through
vLLM's real `Glm5NextModel.load_weights` into those layers. Controls: BF16, FP8-block and the nvidia
NVFP4 (`modelopt_fp4`) checkpoints build exactly as on stock vLLM, and BF16 indexer weights still load.
Stand-ins for GPU-only kernel choices: see quant_configs.Glm5NextOnCpu.
"""

from __future__ import annotations

import pytest
from packaging.version import Version
from quant_configs import probe_prelude

from probes import probe_fixtures

pytestmark = pytest.mark.vllm

ENV = {"HF_HUB_OFFLINE": "1"}

PROBE = probe_prelude() + r'''
import json, tempfile
import torch
from quant_configs import *
Glm5NextModel = glm_module("model").Glm5NextModel

env = Glm5NextOnCpu(tempfile.mkdtemp())
generator = torch.Generator().manual_seed(0)

def mxfp8(rows, cols):
    codes = (torch.randn(rows, cols, generator=generator) * 4).to(torch.float8_e4m3fn)
    exponents = torch.randint(118, 131, (rows, cols // 32), generator=generator, dtype=torch.uint8)
    return codes, exponents

def dequant(codes, exponents):  # the MXFP8 definition, written independently of the patch
    return codes.float() * torch.exp2(exponents.float() - 127).repeat_interleave(32, dim=1)

def load(model, tensors):
    try:
        Glm5NextModel.load_weights(model, iter(tensors))
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"

def attention_methods(layer):
    return {k: v for k, v in describe_quant(layer).items() if "self_attn" in k}

out = {}
env.checkpoint(p4p67_quantization_config())
env.target()
kda, mla = env.target_layer(0), env.target_layer(3)
out["kda"], out["mla"] = attention_methods(kda), attention_methods(mla)
out["mtp"] = attention_methods(env.mtp_layer())
model = env.text_model({0: kda, 3: mla})
params = dict(model.named_parameters())
hidden = env.text_config.hidden_size
proj, heads, head_dim = 2 * 128, 2, 128  # linear_num_heads * linear_head_dim

shards = [("q_proj", proj), ("k_proj", proj), ("v_proj", proj), ("b_proj", heads), ("f_a_proj", head_dim), ("g_a_proj", head_dim)]
kda_tensors = {p: mxfp8(rows, hidden) for p, rows in shards}
out["kda_load"] = load(model, [t for p, (w, s) in kda_tensors.items() for t in (
    (f"layers.0.self_attn.{p}.weight", w), (f"layers.0.self_attn.{p}.weight_scale", s))])
if out["kda_load"] == "ok":
    fused = "layers.0.self_attn.in_proj_qkvbfg_a"
    out["kda_codes_equal"] = torch.equal(params[f"{fused}.weight"].view(torch.uint8),
                                         torch.cat([w for w, _ in kda_tensors.values()]).view(torch.uint8))
    out["kda_scales_equal"] = torch.equal(params[f"{fused}.weight_scale"], torch.cat([s for _, s in kda_tensors.values()]))

mla_tensors = {"q_a_proj": mxfp8(128, hidden), "kv_a_proj_with_mqa": mxfp8(64, hidden)}
out["mla_load"] = load(model, [t for p, (w, s) in mla_tensors.items() for t in (
    (f"layers.3.self_attn.{p}.weight", w), (f"layers.3.self_attn.{p}.weight_scale", s))])
if out["mla_load"] == "ok":
    fused = "layers.3.self_attn.fused_qkv_a_proj"
    out["mla_codes_equal"] = torch.equal(params[f"{fused}.weight"].view(torch.uint8),
                                         torch.cat([w for w, _ in mla_tensors.values()]).view(torch.uint8))

index_tensors = {"wk": mxfp8(128, hidden), "weights_proj": mxfp8(2, hidden)}
out["indexer_load"] = load(model, [t for p, (w, s) in index_tensors.items() for t in (
    (f"layers.3.self_attn.indexer.{p}.weight", w), (f"layers.3.self_attn.indexer.{p}.weight_scale", s))])
if out["indexer_load"] == "ok":
    wkw = params["layers.3.self_attn.indexer.wk_weights_proj.weight"]
    out["indexer_dtype"] = str(wkw.dtype).removeprefix("torch.")
    out["indexer_exact"] = torch.equal(wkw.float(), torch.cat([dequant(w, s) for w, s in index_tensors.values()]))

# Controls: checkpoints whose projections stay BF16 build as they always did.
fp8_block = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
for name, config in (("bf16", None), ("fp8_block", fp8_block), ("nvidia", nvidia_quantization_config())):
    env.checkpoint(config)
    env.target()
    out[f"control_{name}"] = [attention_methods(env.target_layer(0)), attention_methods(env.target_layer(3))]

# BF16 indexer weights (every checkpoint but 4p67) still load through the fused BF16 projection.
env.checkpoint(lab_quantization_config())
env.target()
model = env.text_model({3: env.target_layer(3)})
wk, wp = torch.randn(128, hidden, generator=generator), torch.randn(2, hidden, generator=generator)
out["bf16_indexer_load"] = load(model, [("layers.3.self_attn.indexer.wk.weight", wk.bfloat16()),
                                        ("layers.3.self_attn.indexer.weights_proj.weight", wp.bfloat16())])
out["bf16_indexer_equal"] = torch.equal(dict(model.named_parameters())["layers.3.self_attn.indexer.wk_weights_proj.weight"],
                                        torch.cat([wk, wp]).bfloat16())
print(json.dumps(out))
'''

KDA_FUSED = ("self_attn.in_proj_qkvbfg_a", "self_attn.f_b_proj", "self_attn.g_b_proj", "self_attn.o_proj")
MLA_FUSED = ("self_attn.fused_qkv_a_proj", "self_attn.q_b_proj", "self_attn.kv_b_proj", "self_attn.o_proj")
MX = {"weight": "float8_e4m3fn", "weight_scale": "uint8"}


stock, patched = probe_fixtures(PROBE, ENV)


def test_stock_builds_4p67_attention_unquantized(stock):
    for name in KDA_FUSED:
        assert stock["kda"][name]["method"] == "UnquantizedLinearMethod", name
    for name in MLA_FUSED + ("self_attn.indexer.wq_b",):
        assert stock["mla"][name]["method"] == "UnquantizedLinearMethod", name
        assert stock["mtp"][name]["method"] == "UnquantizedLinearMethod", name


def test_stock_load_stops_at_the_recipe_keyerror(stock, vllm_layout):
    # recipe 002: "KeyError in_proj_qkvbfg_a.weight_scale after ~12 min of weight loading"
    assert stock["kda_load"] == "KeyError: 'layers.0.self_attn.in_proj_qkvbfg_a.weight_scale'"
    if vllm_layout.name == "0.30":
        # 0.30.0's `_try_load_fp8_attn_proj` takes only `weight_scale_inv` scales: the MXFP8 q_a scale
        # finds no parameter of the unquantized fused projection
        assert stock["mla_load"] == "KeyError: 'layers.3.self_attn.q_a_proj.weight_scale'"
    else:
        # from 0.31.0 it also takes `.weight_scale` (Quark's name): the FP8-block dequantizer takes the
        # MXFP8 q_a/kv_a pair for block-FP8 and fails on its shape
        assert stock["mla_load"].startswith("RuntimeError: The size of tensor")
    assert stock["indexer_load"] == "KeyError: 'layers.3.self_attn.indexer.wk_weights_proj.weight_scale'"


def test_patched_fused_projections_are_mxfp8(patched):
    for name in KDA_FUSED:
        assert patched["kda"][name] == {"method": "ModelOptLinearMethod", "params": MX}, name
    for name in MLA_FUSED + ("self_attn.indexer.wq_b",):
        assert patched["mla"][name] == {"method": "ModelOptLinearMethod", "params": MX}, name
        assert patched["mtp"][name] == {"method": "ModelOptLinearMethod", "params": MX}, name


def test_patched_conv_taps_and_indexer_gate_stay_unquantized(patched, vllm_release):
    # 0.30-0.33: three short-conv taps; 0.34: one fused fp32 conv1d (kda.py `_fused_qkv_conv1d`), built
    # with no quant config, that the packed mapping never names
    taps = ("conv1d",) if vllm_release >= Version("0.34") else ("q_conv1d", "k_conv1d", "v_conv1d")
    for tap in taps:
        assert patched["kda"][f"self_attn.{tap}"] == {"method": "UnquantizedLinearMethod", "params": {"weight": "float32"}}
    # the indexer reads wk_weights_proj's weights_proj rows as its fp32 head gate: never quantized codes
    for layer in ("mla", "mtp"):
        wk = patched[layer]["self_attn.indexer.wk_weights_proj"]
        assert wk == {"method": "UnquantizedLinearMethod", "params": {"weight": "bfloat16"}}


def test_patched_loads_4p67_tensors_as_stored(patched):
    assert patched["kda_load"] == patched["mla_load"] == patched["indexer_load"] == "ok"
    assert patched["kda_codes_equal"] and patched["kda_scales_equal"]
    assert patched["mla_codes_equal"]
    assert patched["indexer_dtype"] == "bfloat16" and patched["indexer_exact"]


@pytest.mark.parametrize("checkpoint", ["bf16", "fp8_block", "nvidia"])
def test_other_checkpoints_build_as_on_stock(stock, patched, checkpoint):
    key = f"control_{checkpoint}"
    assert patched[key] == stock[key]
    kda, mla = patched[key]
    assert {v["method"] for v in (*kda.values(), *mla.values())} == {"UnquantizedLinearMethod"}


def test_bf16_indexer_weights_still_load(stock, patched):
    for tree in (stock, patched):
        assert tree["bf16_indexer_load"] == "ok" and tree["bf16_indexer_equal"]
