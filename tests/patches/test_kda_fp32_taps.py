"""kda-fp32-taps: the KDA short-conv taps are fp32 parameters and the real loader keeps what it gets.

The probe builds a tiny real GLM-5.3 text model (two KDA layers) through vLLM's initialize_model on CPU
and loads q/k/v_conv1d taps through the model's real load_weights (into three parameters on 0.30-0.33,
into shards 0/1/2 of the one fused fp32 `conv1d` on 0.34): fp32 taps (the nvidia checkpoint
stores them fp32; values chosen with bits below bf16 precision) must load bit for bit, bf16 taps
(MLX, EXL3, lab exports) must widen exactly. The KDA kernels (Triton/CUDA) do not run on CPU; the
patch's forward assert pins the uncast read of these parameters that feeds them (the merged q|k|v
weight on 0.30-0.33, a view of conv1d on 0.34).

Upstream already does this (the patch is assert-only), so stock and patched trees behave the same;
the probe runs on the patched tree. What makes removing the patch fail is the last test: the series
that built the patched tree must carry the patch and its invariants must hold on that tree.
"""

from __future__ import annotations

import pytest
from packaging.version import Version
from quant_configs import probe_prelude

from probes import guard_in_series, plan_on_drifted_upstream

pytestmark = pytest.mark.vllm

PATCH_ID = "kda-fp32-taps"
# No VLLM_TARGET_DEVICE=cpu: from 0.34 vLLM's CPU platform refuses to start on x86 without triton-cpu
# (platforms/cpu.py:241-243), so the layers are built as Glm5NextOnCpu builds them (device "cpu").
ENV = {"HF_HUB_OFFLINE": "1"}

PROBE = probe_prelude() + r'''
import json, tempfile

import torch
from quant_configs import Glm5NextOnCpu, glm_module

Glm5NextModel = glm_module("model").Glm5NextModel
env = Glm5NextOnCpu(tempfile.mkdtemp())  # torch's default dtype is bf16 from here, as vLLM's loader sets it
env.checkpoint(None)  # a BF16 checkpoint of the real text config (layers 0 and 1 are KDA)
config = env.text_config
PROJ = config.linear_num_heads * config.linear_head_dim
KERNEL = config.linear_conv_kernel_dim

model = env.text_model({0: env.target_layer(0), 1: env.target_layer(1)})
gen = torch.Generator().manual_seed(0)
# fp32 taps with low mantissa bits set, so any rounding through bf16 would show.
fp32_taps = {n: torch.randn(PROJ, 1, KERNEL, generator=gen, dtype=torch.float32) * (1 + 2**-20) for n in "qkv"}
bf16_taps = {n: torch.randn(PROJ, 1, KERNEL, generator=gen, dtype=torch.float32).to(torch.bfloat16) for n in "qkv"}
assert all(not torch.equal(t, t.to(torch.bfloat16).float()) for t in fp32_taps.values())

loaded = Glm5NextModel.load_weights(
    model, [(f"layers.0.self_attn.{n}_conv1d.weight", t) for n, t in fp32_taps.items()]
    + [(f"layers.1.self_attn.{n}_conv1d.weight", t) for n, t in bf16_taps.items()])
out = {"proj": PROJ, "kernel": KERNEL, "loaded": sorted(loaded)}
for layer, taps in ((0, fp32_taps), (1, bf16_taps)):
    attn = model.layers[str(layer)].self_attn
    fused = getattr(attn, "conv1d", None)  # 0.34: one [3C, 1, K] parameter, q|k|v as shards 0/1/2
    out["layout"] = "fused" if fused is not None else "three"
    for i, (n, tap) in enumerate(taps.items()):
        if fused is not None:
            out[f"{layer}.param"] = {"dtype": str(fused.weight.dtype), "shape": list(fused.weight.shape)}
            param = fused.weight[i * PROJ : (i + 1) * PROJ]
        else:
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


def test_the_taps_are_the_parameters_this_release_builds(taps, vllm_release):
    """0.30-0.33: three fp32 parameters q/k/v_conv1d [C, 1, K]; 0.34: one fp32 conv1d [3C, 1, K]
    (kda.py `_fused_qkv_conv1d`), the checkpoint's q/k/v_conv1d its shards 0/1/2."""
    proj, kernel = taps["proj"], taps["kernel"]
    if vllm_release >= Version("0.34"):
        assert taps["layout"] == "fused"
        for layer in (0, 1):
            assert taps[f"{layer}.param"] == {"dtype": "torch.float32", "shape": [3 * proj, 1, kernel]}
        assert taps["loaded"] == [f"layers.{i}.self_attn.conv1d.weight" for i in (0, 1)]
    else:
        assert taps["layout"] == "three"
        assert taps["loaded"] == [f"layers.{i}.self_attn.{n}_conv1d.weight" for i in (0, 1) for n in "kqv"]


def test_fp32_taps_load_bit_exact(taps):
    for name in ("0.q", "0.k", "0.v"):
        assert taps[name] == {"dtype": "torch.float32", "checkpoint_dtype": "torch.float32",
                              "shape": [taps["proj"], 1, taps["kernel"]], "exact": True}, name


def test_bf16_taps_widen_exactly(taps):
    for name in ("1.q", "1.k", "1.v"):
        assert taps[name] == {"dtype": "torch.float32", "checkpoint_dtype": "torch.bfloat16",
                              "shape": [taps["proj"], 1, taps["kernel"]], "exact": True}, name


def test_series_guards_the_taps(patched_vllm):
    guard_in_series(PATCH_ID, patched_vllm.root)


@pytest.mark.vllm
def test_an_upstream_downcast_of_the_taps_fails_loudly(tmp_path):
    result = plan_on_drifted_upstream(PATCH_ID, "params_dtype=torch.float32", "params_dtype=torch.bfloat16", tmp_path)
    assert result.state == "broken"
    broken = [e for e in result.edits if e.state == "broken"]
    assert broken and broken[0].nearest is not None and broken[0].nearest.similarity > 0.9
